//! The image build (`--no-default-features`) carries no test doubles: without the `demo`
//! feature the exporter's normal dependency tree has neither the simulators nor
//! tempfile, and with it (the default) it does, so the feature is what gates them.

use e2e_tests::workspace;
use std::collections::BTreeSet;
use std::process::Command;

/// The package names in `gpu-exporter`'s normal dependency tree, with `features` flags.
fn normal_dependencies(features: &[&str]) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace())
        .args([
            "tree",
            "-p",
            "gpu-exporter",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(features)
        .output()
        .expect("run cargo tree");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

const TEST_DOUBLES: [&str; 3] = ["kube-sim", "gpu-sim", "tempfile"];

#[test]
fn the_image_build_has_no_test_doubles() {
    let shipped = normal_dependencies(&["--no-default-features"]);
    assert!(shipped.contains("nvml-wrapper"), "{shipped:?}");
    for name in TEST_DOUBLES {
        assert!(!shipped.contains(name), "{name} in the image build");
    }
    let demo = normal_dependencies(&[]);
    for name in TEST_DOUBLES {
        assert!(demo.contains(name), "{name} missing from the demo build");
    }
}
