//! The soak driver (`tests/soak`, issue 20) in a short, fast-churning run on the debug
//! binaries: every pod of the node is replaced about twice, with scrapes and adapter
//! queries every 500 ms. The goals are the long run's: no errors, no series of a
//! deleted pod once its grace has passed, every live pod served, RSS within ±5 %.

use e2e_tests::{fake_nvml, scratch_dir, target_profile_dir};
use std::process::Command;

#[test]
fn a_short_soak_meets_the_goals() {
    let out = scratch_dir("soak");
    let run = Command::new(env!("CARGO_BIN_EXE_soak"))
        .env("SOAK_DURATION_S", "30")
        .env("SOAK_CHURN_PER_HOUR", "7200")
        .env("SOAK_SCRAPE_INTERVAL_MS", "500")
        .env("SOAK_QUERY_INTERVAL_MS", "500")
        .env("SOAK_BIN_DIR", target_profile_dir())
        .env("SOAK_NVML_LIB", fake_nvml())
        .env("SOAK_OUT", &out)
        .output()
        .expect("run the soak driver");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).expect("summary.json"),
    )
    .expect("summary JSON");
    let count = |key: &str| {
        summary[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {summary}"))
    };
    // A churn every 0.5 s for 30 s, over every pod at least once.
    assert!(
        count("churns") >= 55 && count("churns") >= count("pods"),
        "{summary}"
    );
    assert!(
        count("scrapes") >= 50 && count("queries") >= 100,
        "{summary}"
    );
    for key in [
        "scrape_errors",
        "query_errors",
        "exporter_violations",
        "adapter_violations",
        "live_missing",
    ] {
        assert_eq!(count(key), 0, "{key}: {summary}");
    }
    for process in ["exporter", "adapter"] {
        let drift = summary[process]["rss_drift_pct"]
            .as_f64()
            .unwrap_or_else(|| panic!("{process} drift in {summary}"));
        assert!(drift.abs() <= 5.0, "{process}: {summary}");
    }
}
