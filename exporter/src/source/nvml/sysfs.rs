//! The GPUs bound to the nvidia driver, as sysfs lists them: a cheap per-cycle check
//! that tells when NVML must be initialised again. NVML enumerates GPUs only in
//! `nvmlInit`, so a GPU hot-plugged, returned from passthrough or rebound from
//! `vfio-pci` after the exporter started shows only after a new initialisation; the
//! kernel lists it under `<sysfs>/bus/pci/drivers/nvidia/` the moment it is bound.
//!
//! Only GPUs count (PCI class 0x0300xx VGA or 0x0302xx 3D controller): NVSwitches
//! (0x0680xx) are bound to the same driver on HGX boards but are no NVML devices.

use kube_support::config_file;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The nvidia driver's directory under a sysfs root.
pub fn driver_dir(sysfs: &Path) -> PathBuf {
    sysfs.join("bus/pci/drivers/nvidia")
}

/// A name shaped like a PCI address, `DDDD:BB:DD.F` (hex), as the driver directory
/// names its bound devices (the rest are files such as `bind`, `new_id`, `module`).
fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Whether a `class` file's text (`0x030200`) names a display controller of the VGA
/// (0x0300) or 3D (0x0302) subclass.
fn is_gpu_class(text: &str) -> bool {
    let t = text.trim();
    let hex = t.strip_prefix("0x").unwrap_or(t);
    u32::from_str_radix(hex, 16).is_ok_and(|c| matches!(c >> 8, 0x0300 | 0x0302))
}

/// The GPUs bound to the driver, remembered from one check to the next.
pub struct BoundGpus {
    dir: PathBuf,
    /// Every address-named entry of the last listing → whether it is a GPU. A bound
    /// device's class cannot change while it stays bound, so only new entries' `class`
    /// files are read: the steady state costs one directory listing.
    last: Option<BTreeMap<String, bool>>,
    /// The check is off (no directory) and that was logged.
    off_logged: bool,
    /// Entries whose `class` is no readable attribute (a FIFO, a link to a device, a
    /// file past the limit), already logged: they are read again each check, and
    /// logged again only after they were readable or gone.
    unreadable: BTreeSet<String>,
}

/// What a check found changed: GPU addresses that came and went.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub came: Vec<String>,
    pub went: Vec<String>,
}

impl BoundGpus {
    pub fn new(sysfs: &Path) -> BoundGpus {
        BoundGpus {
            dir: driver_dir(sysfs),
            last: None,
            off_logged: false,
            unreadable: BTreeSet::new(),
        }
    }

    /// The GPU addresses of the last check; `None` while the check is off.
    #[cfg(test)]
    fn gpus(&self) -> Option<BTreeSet<&str>> {
        self.last.as_ref().map(|m| {
            m.iter()
                .filter(|(_, gpu)| **gpu)
                .map(|(a, _)| a.as_str())
                .collect()
        })
    }

    /// List the driver's devices again; the GPUs that came and went since the last
    /// check, if any did. A directory that cannot be read turns the check off (logged
    /// once at debug) and is no change; one that becomes readable starts a new
    /// reference, also no change.
    pub fn check(&mut self) -> Option<Change> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                if !self.off_logged {
                    tracing::debug!(dir = %self.dir.display(), error = %e,
                        "no GPUs bound to the nvidia driver are visible in sysfs; the hot-add check is off");
                    self.off_logged = true;
                }
                self.last = None;
                return None;
            }
        };
        let previous = self.last.take();
        let mut now = BTreeMap::new();
        let mut unreadable = BTreeSet::new();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !is_pci_address(&name) {
                continue;
            }
            if let Some(gpu) = previous.as_ref().and_then(|p| p.get(&name).copied()) {
                now.insert(name, gpu);
                continue;
            }
            // Through the symlink to the device. Bounded, and never waiting on a FIFO:
            // this runs on the sampler's thread, and a read that blocks or grows
            // would silence every GPU.
            let class = entry.path().join("class");
            match config_file::read_attribute(&class, config_file::ATTRIBUTE_LIMIT) {
                Ok(text) => {
                    now.insert(name, is_gpu_class(&text));
                }
                // No GPU now, and not remembered: read again next time (a device going
                // as it is listed has no class; one that is no attribute is logged).
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::NotFound && !self.unreadable.contains(&name)
                    {
                        tracing::warn!(path = %class.display(), error = %e,
                            "a device bound to the nvidia driver has an unreadable PCI class; not counted as a GPU");
                    }
                    unreadable.insert(name);
                }
            }
        }
        self.unreadable = unreadable;
        self.last = Some(now);
        let previous = previous?;
        let gpus = |m: &BTreeMap<String, bool>| -> BTreeSet<String> {
            m.iter()
                .filter(|(_, gpu)| **gpu)
                .map(|(a, _)| a.clone())
                .collect()
        };
        let (before, after) = (gpus(&previous), gpus(self.last.as_ref()?));
        let change = Change {
            came: after.difference(&before).cloned().collect(),
            went: before.difference(&after).cloned().collect(),
        };
        (!change.came.is_empty() || !change.went.is_empty()).then_some(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs root with the nvidia driver directory; `bind` adds a device with
    /// its `class` file, as the kernel's symlink to the device directory.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str) -> Tree {
            let root = std::env::temp_dir()
                .join(format!("gpu-exporter-sysfs-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(driver_dir(&root)).expect("driver dir");
            // What the real directory holds besides devices.
            for f in ["bind", "unbind", "new_id", "remove_id", "uevent"] {
                std::fs::write(driver_dir(&root).join(f), "").expect("file");
            }
            Tree(root)
        }

        fn bind(&self, address: &str, class: &str) {
            let dev = self.0.join("devices/pci0000:00").join(address);
            std::fs::create_dir_all(&dev).expect("device dir");
            std::fs::write(dev.join("class"), format!("{class}\n")).expect("class");
            std::os::unix::fs::symlink(&dev, driver_dir(&self.0).join(address)).expect("link");
        }

        fn unbind(&self, address: &str) {
            std::fs::remove_file(driver_dir(&self.0).join(address)).expect("unlink");
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn set<'a>(a: &[&'a str]) -> Option<BTreeSet<&'a str>> {
        Some(a.iter().copied().collect())
    }

    #[test]
    fn gpus_of_both_display_classes_count_and_nvswitches_and_other_entries_do_not() {
        let t = Tree::new("classes");
        t.bind("0000:18:00.0", "0x030200"); // 3D controller (H100)
        t.bind("0000:2a:00.0", "0x030000"); // VGA controller
        t.bind("0000:05:00.0", "0x068000"); // NVSwitch
        // A directory that is no PCI address (the kernel's `module` link).
        std::fs::create_dir_all(driver_dir(&t.0).join("module")).expect("module");
        let mut b = BoundGpus::new(&t.0);
        assert_eq!(b.check(), None, "the first check is the reference");
        assert_eq!(b.gpus(), set(&["0000:18:00.0", "0000:2a:00.0"]));
    }

    #[test]
    fn gpus_that_come_and_go_are_a_change_once_and_an_nvswitch_never() {
        let t = Tree::new("changes");
        t.bind("0000:18:00.0", "0x030200");
        let mut b = BoundGpus::new(&t.0);
        assert_eq!(b.check(), None);
        t.bind("0000:2a:00.0", "0x030200");
        assert_eq!(
            b.check(),
            Some(Change {
                came: vec!["0000:2a:00.0".into()],
                went: vec![],
            })
        );
        assert_eq!(b.check(), None, "a standing set is no change");
        t.bind("0000:05:00.0", "0x068000");
        assert_eq!(b.check(), None, "an NVSwitch is no GPU");
        t.unbind("0000:18:00.0");
        assert_eq!(
            b.check(),
            Some(Change {
                came: vec![],
                went: vec!["0000:18:00.0".into()],
            })
        );
        assert_eq!(b.gpus(), set(&["0000:2a:00.0"]));
    }

    /// A `class` that is a FIFO, a link to /dev/zero or a page past the limit is no GPU
    /// and costs nothing: the check returns at once (it used to block on the FIFO for
    /// good, or read /dev/zero until memory ran out) and the good GPUs stay.
    #[test]
    fn a_class_that_is_no_attribute_is_no_gpu_and_never_blocks() {
        let t = Tree::new("hostile");
        t.bind("0000:18:00.0", "0x030200");
        let mut bad = Vec::new();
        for (address, make) in [
            ("0000:2a:00.0", "fifo"),
            ("0000:3b:00.0", "zero"),
            ("0000:4c:00.0", "huge"),
        ] {
            let dev = t.0.join("devices/pci0000:00").join(address);
            std::fs::create_dir_all(&dev).expect("device dir");
            let class = dev.join("class");
            match make {
                "fifo" => assert!(
                    std::process::Command::new("mkfifo")
                        .arg(&class)
                        .status()
                        .expect("mkfifo")
                        .success()
                ),
                "zero" => std::os::unix::fs::symlink("/dev/zero", &class).expect("link"),
                _ => std::fs::write(&class, "0x030200\n".repeat(1000)).expect("class"),
            }
            std::os::unix::fs::symlink(&dev, driver_dir(&t.0).join(address)).expect("link");
            bad.push(address);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let root = t.0.clone();
        std::thread::spawn(move || {
            let mut b = BoundGpus::new(&root);
            let first = b.check();
            let second = b.check();
            let gpus: Option<Vec<String>> =
                b.gpus().map(|g| g.into_iter().map(String::from).collect());
            let _ = tx.send((first, second, gpus, b.unreadable.clone()));
        });
        let (first, second, gpus, unreadable) = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the check returned within 5 s");
        assert_eq!((first, second), (None, None));
        assert_eq!(gpus, Some(vec!["0000:18:00.0".to_string()]));
        assert_eq!(unreadable, bad.into_iter().map(String::from).collect());
    }

    #[test]
    fn a_missing_driver_directory_turns_the_check_off() {
        let root =
            std::env::temp_dir().join(format!("gpu-exporter-sysfs-none-{}", std::process::id()));
        let mut b = BoundGpus::new(&root);
        assert_eq!(b.check(), None);
        assert_eq!(b.gpus(), None);
        // The driver loaded later: a new reference, not a change.
        let t = Tree(root);
        std::fs::create_dir_all(driver_dir(&t.0)).expect("driver dir");
        t.bind("0000:18:00.0", "0x030200");
        assert_eq!(b.check(), None);
        assert_eq!(b.gpus(), set(&["0000:18:00.0"]));
    }

    /// The cost of one steady-state check on a real sysfs (docs/exporter/devices.md, "Devices that come
    /// and go"): `SYSFS_CHECK_ROOT=/sys cargo test -p gpu-exporter --lib check_cost --
    /// --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement on the host's sysfs, not a check"]
    fn check_cost() {
        let root = std::env::var_os("SYSFS_CHECK_ROOT").unwrap_or_else(|| "/sys".into());
        let mut b = BoundGpus::new(Path::new(&root));
        b.check();
        let entries = std::fs::read_dir(driver_dir(Path::new(&root)))
            .map(|d| d.count())
            .unwrap_or(0);
        let n = 20_000;
        let start = std::time::Instant::now();
        for _ in 0..n {
            assert_eq!(b.check(), None);
        }
        let took = start.elapsed() / n;
        println!(
            "sysfs check: {took:?} per check, {entries} entries, GPUs {:?}",
            b.gpus()
        );
    }

    #[test]
    fn addresses_are_recognised_by_shape() {
        assert!(is_pci_address("0000:18:00.0"));
        assert!(is_pci_address("0001:ab:1f.7"));
        for n in [
            "bind",
            "module",
            "0000:18:00",
            "0000-18:00.0",
            "0000:18:00.0x",
            "000g:18:00.0",
        ] {
            assert!(!is_pci_address(n), "{n}");
        }
        assert!(is_gpu_class("0x030200\n") && is_gpu_class("0x030000"));
        assert!(!is_gpu_class("0x068000") && !is_gpu_class("0x030100") && !is_gpu_class(""));
    }
}
