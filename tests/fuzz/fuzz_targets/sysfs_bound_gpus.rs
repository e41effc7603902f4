//! The sysfs hot-add check (`BoundGpus`) against a driver directory the input writes:
//! entries bound and unbound, named like PCI addresses or not, with any `class` text.
//! Invariants: a check never panics; the GPUs it reports coming and going, applied to
//! the first listing, are exactly the entries an independent reading of the tree
//! calls GPUs (PCI-address-shaped names whose class is a VGA or 3D controller); and a
//! check with nothing changed reports nothing.
#![no_main]

use gpu_exporter::source::nvml::sysfs::BoundGpus;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Names the input picks from: PCI addresses (GPUs or not, by their class), and
/// entries the driver directory also holds that are no devices.
const NAMES: [&str; 8] = [
    "0000:17:00.0",
    "0000:3a:00.0",
    "0000:ab:00.1",
    "0001:00:1f.7",
    "bind",
    "new_id",
    "0000:17:00",
    "0000:zz:00.0",
];

/// Class texts: VGA and 3D controllers (GPUs), an NVSwitch bridge, and junk.
const CLASSES: [&str; 8] = [
    "0x030200\n",
    "0x030000\n",
    "0x068000\n",
    "0x0302",
    "030200",
    "",
    "0xzz\n",
    "0x03020000000000000000\n",
];

/// The oracle, written apart from the exporter: `DDDD:BB:DD.F` in hex, and a class
/// whose hex value's upper 16 bits are 0x0300 or 0x0302.
fn oracle(dir: &Path) -> BTreeSet<String> {
    let mut gpus = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("list").flatten() {
        let name = entry.file_name().into_string().expect("utf-8 name");
        let shaped = name.len() == 12
            && name.char_indices().all(|(i, c)| match i {
                4 | 7 => c == ':',
                10 => c == '.',
                _ => c.is_ascii_hexdigit(),
            });
        let class = std::fs::read_to_string(entry.path().join("class")).unwrap_or_default();
        let text = class.trim();
        let hex = text.strip_prefix("0x").unwrap_or(text);
        let gpu = u32::from_str_radix(hex, 16).is_ok_and(|c| c >> 8 == 0x0300 || c >> 8 == 0x0302);
        if shaped && gpu {
            gpus.insert(name);
        }
    }
    gpus
}

fn scratch() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "fuzz-sysfs-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fuzz_target!(|ops: &[u8]| {
    let root = scratch();
    let dir = root.join("bus/pci/drivers/nvidia");
    std::fs::create_dir_all(&dir).expect("driver dir");
    let mut check = BoundGpus::new(&root);
    // The first listing is the reference: no change.
    assert!(check.check().is_none(), "a first listing is no change");
    let mut seen = oracle(&dir);
    for op in ops.chunks(2).take(32) {
        let name = NAMES[usize::from(op[0] & 7)];
        let entry = dir.join(name);
        if op[0] & 0x80 != 0 {
            let _ = std::fs::remove_dir_all(&entry);
        } else if !entry.exists() {
            std::fs::create_dir_all(&entry).expect("entry");
            let class = CLASSES[usize::from(op.get(1).copied().unwrap_or(0) & 7)];
            std::fs::write(entry.join("class"), class).expect("class");
        }
        let change = check.check();
        let want = oracle(&dir);
        match change {
            Some(c) => {
                assert!(!c.came.is_empty() || !c.went.is_empty(), "an empty change");
                for a in &c.went {
                    assert!(seen.remove(a), "{a} went but was not there: {seen:?}");
                }
                for a in c.came {
                    assert!(seen.insert(a.clone()), "{a} came twice");
                }
            }
            None => {}
        }
        assert_eq!(seen, want, "after {op:?}");
        // Nothing changed since: nothing to report.
        assert!(check.check().is_none(), "a repeated check reports a change");
    }
    let _ = std::fs::remove_dir_all(&root);
});
