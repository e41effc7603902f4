//! `promtool check metrics` (Prometheus's own parser and linter) on real exporter output.
//!
//! dcgm-exporter's names are the compatibility contract: camelCase/uppercase identity
//! labels (`UUID`, `modelName`, `Hostname`, `GPU_I_*`, `DCGM_FI_*` label fields) and
//! counters without `_total` (one even named `..._COUNTER`). promtool's linter flags
//! exactly those; the test allows them only where a dcgm name causes them, and no
//! other finding at all.

use e2e_tests::{Exporter, promtool_check_metrics};

const LABEL_CASE: &str = " label names should be written in 'snake_case' not 'camelCase'";
const COUNTER_TOTAL: &str = " counter metrics should have \"_total\" suffix";
/// dcgm's `DCGM_FI_DEV_PCIE_REPLAY_COUNTER` names its type.
const NAMES_TYPE: &str = " metric name should not include type 'counter'";

fn check(args: &[&str]) {
    let exporter = Exporter::start(args, &[]);
    let body = exporter.metrics_after_samples(2);
    let (code, findings) = promtool_check_metrics(&body);
    assert!(
        code == 0 || code == 3,
        "promtool failed to parse (exit {code}):\n{findings}"
    );
    for f in findings.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(metric) = f.strip_suffix(LABEL_CASE) {
            // Only series that carry dcgm's identity labels may trip the case lint.
            let carries_dcgm_labels = body.lines().any(|l| {
                l.starts_with(metric) && l.contains("UUID=\"") && l.contains("modelName=\"")
            });
            assert!(carries_dcgm_labels, "unexpected label-case finding: {f}");
        } else if let Some(metric) = f
            .strip_suffix(COUNTER_TOTAL)
            .or_else(|| f.strip_suffix(NAMES_TYPE))
        {
            assert!(
                metric.starts_with("DCGM_"),
                "our own metric breaks a naming rule: {f}"
            );
        } else {
            panic!("unexpected promtool finding: {f}\nall findings:\n{findings}");
        }
    }

    // Our own families without dcgm labels must be spotless.
    let own: String = body
        .split_inclusive('\n')
        .filter(|l| l.contains("gpu_exporter_") && !l.contains("UUID=\""))
        .collect();
    let (code, findings) = promtool_check_metrics(&own);
    assert_eq!((code, findings.trim()), (0, ""), "self-metrics:\n{own}");
}

#[test]
fn big_node_with_every_field_and_processes_parses_cleanly() {
    check(&[
        "--simulate=builtin:big-node",
        "-f",
        "tests/fixtures/all-fields.csv",
        "--process-metrics",
        "-c",
        "100",
    ]);
}

#[test]
fn golden_node_with_faults_parses_cleanly() {
    check(&["--simulate=tests/fixtures/golden-node.toml", "-c", "100"]);
}
