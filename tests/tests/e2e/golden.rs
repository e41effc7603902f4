//! Golden-file end-to-end test: the real exporter binary on a fixed scenario with a
//! frozen clock; `/metrics` in both formats must equal the checked-in files byte for
//! byte, except the few self-metrics that measure time. `UPDATE_GOLDEN=1` rewrites them.
//! A second test checks the same output against values computed from the scenario, so
//! the golden files cannot silently bless a wrong number; a third gives the checked-in
//! files themselves to promtool and to Prometheus' Python client parser (code
//! independent of this workspace) and compares what it reads with the gpu-sim model.

use e2e_tests::{
    Exporter, assert_promtool_accepts_dcgm_exposition, fixture, get_bytes_with, get_with, gunzip,
    series_values,
};
use gpu_sim::{Scenario, SimNode};
use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

/// Self-metrics whose values depend on timing, not on the scenario.
const VOLATILE: &[&str] = &[
    "gpu_exporter_last_sample_timestamp_seconds ",
    "gpu_exporter_sample_duration_seconds ",
    "gpu_exporter_samples_total ",
    "gpu_exporter_scrape_duration_seconds_bucket{",
    "gpu_exporter_scrape_duration_seconds_sum ",
    "gpu_exporter_scrape_duration_seconds_count ",
];

fn normalise(body: &str) -> String {
    body.lines()
        .map(|l| {
            match (
                VOLATILE.iter().any(|v| l.starts_with(*v)),
                l.rsplit_once(' '),
            ) {
                (true, Some((series, _))) => format!("{series} <volatile>"),
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn start() -> Exporter {
    Exporter::start(
        &[
            "--simulate=tests/fixtures/golden-node.toml",
            "-f",
            "tests/fixtures/all-fields.csv",
            "--process-metrics",
            "--openmetrics",
            "-c",
            "100",
        ],
        &[("NODE_NAME", "golden-node")],
    )
}

fn check_golden(name: &str, actual: &str) {
    let path = fixture(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from /metrics at line {}:\n expected: {:?}\n   actual: {:?}",
            path.display(),
            first + 1,
            expected.lines().nth(first),
            actual.lines().nth(first)
        );
    }
}

#[test]
fn metrics_match_the_golden_files_in_both_formats() {
    let exporter = start();
    // Three cycles: rate fields need two readings.
    let text = exporter.metrics_after_samples(3);
    check_golden("golden.prom", &normalise(&text));
    let (status, om) = get_with(
        &exporter.url("/metrics"),
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )],
    );
    assert_eq!(status, 200);
    assert!(om.ends_with("# EOF\n"), "OpenMetrics must end with # EOF");
    check_golden("golden.openmetrics", &normalise(&om));
}

#[test]
fn gzip_responses_carry_the_same_metrics_in_both_formats() {
    let exporter = start();
    let plain = normalise(&exporter.metrics_after_samples(3));
    let (status, body, encoding) =
        get_bytes_with(&exporter.url("/metrics"), &[("Accept-Encoding", "gzip")]);
    assert_eq!((status, encoding.as_deref()), (200, Some("gzip")));
    assert!(
        body.len() * 5 < plain.len(),
        "compressed {} vs {} bytes",
        body.len(),
        plain.len()
    );
    assert_eq!(normalise(&gunzip(&body)), plain);
    let (_, om, encoding) = get_bytes_with(
        &exporter.url("/metrics"),
        &[
            ("Accept-Encoding", "gzip, deflate"),
            ("Accept", "application/openmetrics-text;version=1.0.0"),
        ],
    );
    assert_eq!(encoding.as_deref(), Some("gzip"));
    let om = gunzip(&om);
    assert!(om.ends_with("# EOF\n"));
    check_golden("golden.openmetrics", &normalise(&om));
    // Without Accept-Encoding the body is plain.
    let (_, _, encoding) = get_bytes_with(&exporter.url("/metrics"), &[]);
    assert_eq!(encoding, None);
}

#[test]
fn exported_values_are_the_scenarios_values() {
    let scenario = Scenario::load(&fixture("golden-node.toml")).expect("scenario");
    let node = SimNode::new(&scenario, UNIX_EPOCH);
    let t = 60.0;
    let exporter = start();
    let body = exporter.metrics_after_samples(2);
    for gpu in 0..4u32 {
        let g = gpu.to_string();
        let r = node.gpu_reading(gpu, t);
        let labels = [("gpu", g.as_str())];
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_POWER_USAGE", &labels),
            vec![f64::from(r.power_mw) / 1000.0],
            "power of GPU {gpu}"
        );
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", &labels),
            vec![r.energy_mj as f64],
            "energy of GPU {gpu}"
        );
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_FB_USED", &labels),
            vec![(r.memory.used >> 20) as f64],
            "memory of GPU {gpu}"
        );
        let util: Vec<f64> = r.gpu_util_percent.map(f64::from).into_iter().collect();
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_GPU_UTIL", &labels),
            util,
            "util of GPU {gpu}"
        );
        let gpm: Vec<f64> = r.gpm.map(|g| g.graphics_util / 100.0).into_iter().collect();
        let got = series_values(&body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", &labels);
        assert_eq!(got.len(), gpm.len(), "GPM presence on GPU {gpu}");
        for (a, b) in got.iter().zip(&gpm) {
            assert!((a - b).abs() < 1e-6, "GR engine of GPU {gpu}: {a} vs {b}");
        }
    }
    // The MIG instances: their own memory and engine activity, no device-wide fields.
    let g2 = &node.gpus[2];
    for (m, mig) in g2.mig.iter().enumerate() {
        let gi = mig.gpu_instance_id.to_string();
        let labels = [
            ("gpu", "2"),
            ("GPU_I_ID", gi.as_str()),
            ("GPU_I_PROFILE", mig.profile.name),
        ];
        let r = node.mig_reading(2, m, t);
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_FB_USED", &labels),
            vec![(r.memory.used >> 20) as f64]
        );
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_POWER_USAGE", &labels),
            Vec::<f64>::new()
        );
        let gr = series_values(&body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", &labels);
        assert!((gr[0] - r.gpm.expect("H100 GPM").graphics_util / 100.0).abs() < 1e-6);
    }
    // Thermal limits and NVLinks of every GPU that answers: the board's thresholds, one
    // link series per NVLink with dcgm-exporter's NVLink labels, none for the L4.
    for gpu in 0..4u32 {
        let g = &node.gpus[gpu as usize];
        let idx = gpu.to_string();
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_SLOWDOWN_TEMP", &[("gpu", idx.as_str())]),
            vec![f64::from(g.model.board.slowdown_temp_c)]
        );
        let uuid = g.uuid.as_str();
        let states = series_values(
            &body,
            "DCGM_FI_DEV_NVLINK_GET_STATE",
            &[("gpu", idx.as_str()), ("gpu_uuid", uuid)],
        );
        assert_eq!(
            states.len() as u32,
            g.model.nvlink_links,
            "links of GPU {gpu}"
        );
        assert!(states.iter().all(|s| *s == 1.0), "all links up: {states:?}");
    }
    assert!(series_values(&body, "DCGM_FI_DEV_NVLINK_GET_STATE", &[("gpu", "4")]).is_empty());
    // Unsupported on the A100: memory temperature; GPU 4 is lost: only gpu_up says so.
    assert!(series_values(&body, "DCGM_FI_DEV_MEMORY_TEMP", &[("gpu", "3")]).is_empty());
    assert!(series_values(&body, "DCGM_FI_DEV_GPU_TEMP", &[("gpu", "4")]).is_empty());
    assert_eq!(
        series_values(&body, "gpu_exporter_gpu_up", &[("gpu", "4")]),
        vec![0.0]
    );
    assert_eq!(
        series_values(&body, "gpu_exporter_gpu_up", &[("gpu", "0")]),
        vec![1.0]
    );
    // XIDs: two of code 31 on GPU 0, one of code 13 on MIG instance 1 of GPU 2.
    assert_eq!(
        series_values(
            &body,
            "gpu_exporter_xid_errors_total",
            &[("gpu", "0"), ("xid", "31")]
        ),
        vec![2.0]
    );
    assert_eq!(
        series_values(
            &body,
            "gpu_exporter_xid_last_seen_timestamp_seconds",
            &[("gpu", "0"), ("xid", "31")]
        ),
        vec![1_700_000_020.0]
    );
    assert_eq!(
        series_values(
            &body,
            "gpu_exporter_xid_errors_total",
            &[("gpu", "2"), ("GPU_I_ID", "1"), ("xid", "13")]
        ),
        vec![1.0]
    );
    assert_eq!(
        series_values(
            &body,
            "DCGM_FI_DEV_XID_ERRORS",
            &[("gpu", "0"), ("err_code", "31")]
        ),
        vec![31.0]
    );
    // ECC and remapped rows from the faults.
    assert_eq!(
        series_values(&body, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &[("gpu", "1")]),
        vec![1.0]
    );
    assert_eq!(
        series_values(
            &body,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            &[("gpu", "1")]
        ),
        vec![1.0]
    );
    // Per-process shares on a whole GPU sum to the device utilisation.
    let util0 = series_values(&body, "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")])[0];
    let shares: f64 = series_values(
        &body,
        "gpu_exporter_process_sm_utilization_percent",
        &[("gpu", "0")],
    )
    .iter()
    .sum();
    assert_eq!(shares, util0);
}

/// A golden file with its `<volatile>` placeholders set to 0 (a valid value for every
/// one of them: an all-zero histogram is consistent).
fn golden_with_values(name: &str) -> String {
    std::fs::read_to_string(fixture(name))
        .expect("golden file")
        .replace(" <volatile>", " 0")
}

/// One sample as an independent parser read it.
#[derive(Debug)]
struct ParsedSample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Samples of `text` as prometheus_client's parser reads them (`openmetrics`: its strict
/// OpenMetrics parser; else its text-format parser). It rejects malformed input.
fn parse_with_prometheus_client(text: &str, openmetrics: bool) -> Vec<ParsedSample> {
    const SCRIPT: &str = r#"
import json, sys
if sys.argv[1] == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append([s.name, s.labels, repr(float(s.value))])
json.dump(out, sys.stdout)
"#;
    use std::io::Write;
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            SCRIPT,
            if openmetrics { "openmetrics" } else { "text" },
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (tests/setup.sh installs prometheus-client)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to the parser");
    let out = child.wait_with_output().expect("parser output");
    assert!(
        out.status.success(),
        "prometheus_client rejects the file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<(String, BTreeMap<String, String>, String)> =
        serde_json::from_slice(&out.stdout).expect("parser JSON");
    rows.into_iter()
        .map(|(name, labels, value)| ParsedSample {
            name,
            labels,
            value: match value.as_str() {
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" => f64::NAN,
                v => v.parse().expect("float"),
            },
        })
        .collect()
}

fn parsed_values(samples: &[ParsedSample], name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let want_mig = labels.iter().any(|(k, _)| *k == "GPU_I_ID");
    samples
        .iter()
        // The parser names a counter's sample `<name>_total` whether or not the file does.
        .filter(|s| s.name == name || s.name.strip_suffix("_total") == Some(name))
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .filter(|s| want_mig || !s.labels.contains_key("GPU_I_ID"))
        .map(|s| s.value)
        .collect()
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1.0))
}

#[test]
fn the_golden_files_parse_independently_and_carry_the_scenarios_values() {
    let scenario = Scenario::load(&fixture("golden-node.toml")).expect("scenario");
    let node = SimNode::new(&scenario, UNIX_EPOCH);
    let t = scenario.clock.frozen_at_s.expect("a frozen clock");
    for (name, openmetrics) in [("golden.prom", false), ("golden.openmetrics", true)] {
        let text = golden_with_values(name);
        // promtool reads the Prometheus text format only (OpenMetrics' `_total` samples
        // read as families without help); the OpenMetrics file goes to the strict
        // OpenMetrics parser below.
        if !openmetrics {
            assert_promtool_accepts_dcgm_exposition(&text);
        }
        let samples = parse_with_prometheus_client(&text, openmetrics);
        // Every sample line was read (OpenMetrics adds `_created` samples of its own).
        let lines = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
        assert_eq!(
            samples
                .iter()
                .filter(|s| !s.name.ends_with("_created"))
                .count(),
            lines,
            "{name}: samples read"
        );
        for gpu in 0..4u32 {
            let g = gpu.to_string();
            let labels = [("gpu", g.as_str())];
            let r = node.gpu_reading(gpu, t);
            let expect = |metric: &str, want: Vec<f64>| {
                let got = parsed_values(&samples, metric, &labels);
                assert!(
                    close(&got, &want),
                    "{name}: {metric} of GPU {gpu}: {got:?} vs {want:?}"
                );
            };
            expect(
                "DCGM_FI_DEV_POWER_USAGE",
                vec![f64::from(r.power_mw) / 1000.0],
            );
            expect(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                vec![r.energy_mj as f64],
            );
            expect("DCGM_FI_DEV_FB_USED", vec![(r.memory.used >> 20) as f64]);
            expect("DCGM_FI_DEV_GPU_TEMP", vec![f64::from(r.gpu_temp_c)]);
            expect("DCGM_FI_DEV_SM_CLOCK", vec![f64::from(r.sm_clock_mhz)]);
            expect(
                "DCGM_FI_DEV_GPU_UTIL",
                r.gpu_util_percent.map(f64::from).into_iter().collect(),
            );
            expect(
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                r.gpm.map(|m| m.graphics_util / 100.0).into_iter().collect(),
            );
        }
        for (m, mig) in node.gpus[2].mig.iter().enumerate() {
            let gi = mig.gpu_instance_id.to_string();
            let labels = [("gpu", "2"), ("GPU_I_ID", gi.as_str())];
            let r = node.mig_reading(2, m, t);
            let got = parsed_values(&samples, "DCGM_FI_DEV_FB_USED", &labels);
            assert!(
                close(&got, &[(r.memory.used >> 20) as f64]),
                "{name}: memory of MIG 2/{gi}: {got:?}"
            );
        }
        // The XID counters: as often as the scenario raises each XID by time t.
        let mut xids: BTreeMap<(u32, Option<u32>, u64), f64> = BTreeMap::new();
        for x in node.xids_between(f64::NEG_INFINITY, t) {
            *xids.entry((x.gpu, x.gpu_instance, x.code)).or_default() += 1.0;
        }
        assert!(!xids.is_empty(), "the golden scenario raises XIDs");
        for ((gpu, instance, code), count) in xids {
            let (g, c) = (gpu.to_string(), code.to_string());
            let i = instance.map(|i| i.to_string());
            let mut labels = vec![("gpu", g.as_str()), ("xid", c.as_str())];
            if let Some(i) = &i {
                labels.push(("GPU_I_ID", i.as_str()));
            }
            assert_eq!(
                parsed_values(&samples, "gpu_exporter_xid_errors_total", &labels),
                vec![count],
                "{name}: XID {code} on GPU {gpu}/{instance:?}"
            );
        }
    }
}
