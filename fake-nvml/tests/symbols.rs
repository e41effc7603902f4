//! Guards on the built library: it exports exactly the functions whose signatures
//! `src/sigcheck.rs` checks (and every `#[no_mangle]` function in `src/` is on that
//! list), imports no `nvml*` symbol, and carries the SONAME `libnvidia-ml.so.1`.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

fn run(tool: &str, args: &[&str]) -> String {
    let lib = common::lib_path();
    let out = Command::new(tool)
        .args(args)
        .arg(&lib)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool} (binutils): {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The names listed in `check_signatures!` in `src/sigcheck.rs`.
fn export_list() -> BTreeSet<String> {
    let text = include_str!("../src/sigcheck.rs");
    let start =
        text.find("check_signatures!(lib:").expect("list start") + "check_signatures!(lib:".len();
    let end = start + text[start..].find(");").expect("list end");
    text[start..end]
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .chain(newer_than_bindings())
        .collect()
}

/// The names in `NEWER_THAN_BINDINGS` in `src/sigcheck.rs` (exports without a
/// compile-time signature check).
fn newer_than_bindings() -> Vec<String> {
    let text = include_str!("../src/sigcheck.rs");
    let start = text
        .find("NEWER_THAN_BINDINGS: &[&str] = &[")
        .expect("newer list");
    let end = start + text[start..].find("];").expect("newer list end");
    text[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every `pub unsafe extern "C" fn` in the crate's sources.
fn exported_in_sources() -> BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            if let Some(rest) = line.trim().strip_prefix("pub unsafe extern \"C\" fn ") {
                names.insert(rest.split('(').next().unwrap().to_owned());
            }
        }
    }
    names
}

fn symbols(kind: &str) -> BTreeSet<String> {
    run("nm", &["-D", kind])
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .collect()
}

#[test]
fn every_export_is_signature_checked_and_present() {
    let list = export_list();
    assert!(list.len() > 400, "{list:?}");
    assert_eq!(exported_in_sources(), list, "sources vs. sigcheck list");
    let defined = symbols("--defined-only");
    let missing: Vec<_> = list.iter().filter(|n| !defined.contains(*n)).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    let extra: Vec<_> = defined
        .iter()
        .filter(|n| n.starts_with("nvml") && !list.contains(*n))
        .collect();
    assert!(
        extra.is_empty(),
        "exported but not signature-checked: {extra:?}"
    );
}

#[test]
fn no_undefined_nvml_imports() {
    let undefined: Vec<_> = symbols("--undefined-only")
        .into_iter()
        .filter(|s| s.to_ascii_lowercase().contains("nvml"))
        .collect();
    assert!(
        undefined.is_empty(),
        "undefined NVML imports: {undefined:?}"
    );
}

#[test]
fn soname_is_the_driver_library() {
    let dynamic = run("readelf", &["-d"]);
    assert!(
        dynamic.contains("Library soname: [libnvidia-ml.so.1]"),
        "{dynamic}"
    );
}
