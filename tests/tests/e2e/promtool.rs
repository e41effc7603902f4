//! `promtool check metrics` (Prometheus's own parser and linter) on real exporter output.
//!
//! dcgm-exporter's names are the compatibility contract: camelCase/uppercase identity
//! labels (`UUID`, `modelName`, `Hostname`, `GPU_I_*`, `DCGM_FI_*` label fields) and
//! counters without `_total` (one even named `..._COUNTER`). promtool's linter flags
//! exactly those; the test allows them only where a dcgm name causes them, and no
//! other finding at all.

use e2e_tests::{Exporter, assert_promtool_accepts_dcgm_exposition, promtool_check_metrics};

fn check(args: &[&str]) {
    let exporter = Exporter::start(args, &[]);
    let body = exporter.metrics_after_samples(2);
    assert_promtool_accepts_dcgm_exposition(&body);

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
