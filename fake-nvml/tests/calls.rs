//! `GPU_SIM_CALL_COUNTS`: per-function call counts written to a file while a client
//! runs. (A single test, so nothing else touches the environment.)

mod common;

use common::{set_scenario, try_init};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

fn read_counts(path: &Path) -> BTreeMap<String, u64> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .map(|l| {
            let (count, name) = l.split_once(' ').expect("COUNT NAME");
            (name.to_owned(), count.parse().expect("a count"))
        })
        .collect()
}

/// Every export counts its calls under its own symbol name, as its first statement.
#[test]
fn every_export_counts_under_its_own_name() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            let Some(rest) = line.trim().strip_prefix("pub unsafe extern \"C\" fn ") else {
                continue;
            };
            let name = rest.split('(').next().unwrap();
            if !line.trim_end().ends_with('{') {
                lines.by_ref().find(|l| l.trim_end().ends_with('{'));
            }
            let first = lines.next().unwrap_or_default();
            assert_eq!(
                first.trim(),
                format!("crate::calls::count!(\"{name}\");"),
                "{}: {name} must count its calls first",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} exports found");
}

#[test]
fn counts_reach_the_file_while_the_client_runs() {
    let dir = std::env::temp_dir().join(format!("fake-nvml-calls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("counts");
    set_scenario("builtin:default", Some(10.0));
    // SAFETY: the only test in this process that touches the environment, and it does
    // so before loading the library.
    unsafe { std::env::set_var(fake_nvml_calls_env(), &file) };
    let nvml = try_init().unwrap();
    for _ in 0..3 {
        let d = nvml.device_by_index(1).unwrap();
        d.name().unwrap();
    }
    nvml.device_count().unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let counts = loop {
        let counts = read_counts(&file);
        if counts.get("nvmlDeviceGetName") == Some(&3) {
            break counts;
        }
        assert!(
            Instant::now() < deadline,
            "counts never reached {file:?}: {counts:?}"
        );
        std::thread::yield_now();
    };
    assert_eq!(counts.get("nvmlDeviceGetHandleByIndex_v2"), Some(&3));
    assert_eq!(counts.get("nvmlDeviceGetCount_v2"), Some(&1));
    assert_eq!(counts.get("nvmlInit_v2"), Some(&1));
    assert!(!counts.contains_key("nvmlDeviceGetUUID"), "{counts:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fake_nvml_calls_env() -> &'static str {
    nvidia_ml::CALL_COUNTS_ENV
}
