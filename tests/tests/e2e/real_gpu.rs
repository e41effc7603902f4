//! The exporter's scrapes of a real GPU, kept as fixtures, checked against an independent
//! client: pynvml read the same driver just before and just after each scrape
//! (`exporter/benches/real-gpu.sh`). A fact must equal pynvml's; a live quantity must
//! lie between the two readings, widened by how far it can move in the one collect
//! interval that may separate the exporter's sample from the scrape.
//!
//! The fixtures are the ground truth the fake library is modelled on; these checks say
//! they are a right reading of the driver, not a copy of what the exporter printed.

use crate::nvml_fidelity::{
    Conv, Findings, GPU_FIELDS, Reading, Sample, compare_labels, compare_processes, convert,
    gpu_series, parse_exposition, reading,
};
use e2e_tests::fixture;
use gpu_exporter::plan::catalog::Quantity;
use gpu_exporter::sampler::cadence::default_period;
use serde_json::Value;

/// Each real GPU the captures were taken on (one H100, one H200; both driver 580.159.04).
const DIRS: &[&str] = &[
    "real-gpu/h100-80gb-hbm3-580.159.04",
    "real-gpu/h200-141gb-hbm3e-580.159.04",
];
/// The capture the "check can fail" test edits.
const DIR: &str = DIRS[0];
/// real-gpu.sh's captures: default counters on an idle GPU, then every field with
/// processes while a matrix-multiply load ran.
const CAPTURES: &[&str] = &["real-gpu", "real-gpu-all-fields"];
/// The capture's `-c`: the exporter's sample is at most this old at the scrape.
const INTERVAL_S: f64 = 1.0;

/// How far a quantity may move between the exporter's sample and pynvml's readings.
#[derive(Clone, Copy, Debug)]
enum Slack {
    /// A fact of the board or a counter that does not move in a second: equal.
    None,
    /// Plus or minus this much, in the metric's unit.
    Abs(f64),
    /// Plus or minus this share of the reading.
    Rel(f64),
    /// Energy (mJ): up to the counter's read period (or one interval, if longer) at the
    /// power limit before the first reading: a field not read in a cycle serves its last
    /// reading, never older than its period (docs/exporter/cadence.md). The H200's
    /// all-fields capture, under load, served a reading 1.4 s at 700 W old; the H100's
    /// predate read periods.
    Energy,
    /// Two different windows on the same traffic (the exporter: GPM over the interval;
    /// pynvml: the getter's 20 ms): within a factor of 4, or 2 MB/s apart.
    Traffic,
}

fn slack(metric: &str) -> Slack {
    match metric {
        "DCGM_FI_DEV_POWER_USAGE" => Slack::Rel(0.15),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => Slack::Energy,
        "DCGM_FI_DEV_GPU_UTIL" | "DCGM_FI_DEV_MEM_COPY_UTIL" => Slack::Abs(15.0),
        "DCGM_FI_DEV_GPU_TEMP" | "DCGM_FI_DEV_MEMORY_TEMP" => Slack::Abs(3.0),
        "DCGM_FI_DEV_SM_CLOCK" => Slack::Rel(0.25),
        "DCGM_FI_DEV_FB_USED" | "DCGM_FI_DEV_FB_FREE" => Slack::Abs(64.0),
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" | "DCGM_FI_DEV_PCIE_RX_THROUGHPUT" => Slack::Traffic,
        _ => Slack::None,
    }
}

fn within(value: f64, lo: f64, hi: f64, slack: Slack, power_limit_w: f64) -> bool {
    match slack {
        Slack::None => value == lo && value == hi,
        Slack::Abs(d) => value >= lo - d && value <= hi + d,
        Slack::Rel(r) => value >= lo * (1.0 - r) && value <= hi * (1.0 + r),
        Slack::Energy => value >= lo - energy_age_s() * power_limit_w * 1000.0 && value <= hi,
        Slack::Traffic => {
            (value >= lo / 4.0 && value <= hi * 4.0)
                || (value - lo).abs() < 2000.0
                || (value - hi).abs() < 2000.0
        }
    }
}

/// How old a served energy reading may be: its default read period, at least an interval.
fn energy_age_s() -> f64 {
    default_period(Quantity::TotalEnergy)
        .as_secs_f64()
        .max(INTERVAL_S)
}

fn json(dir: &str, name: &str) -> Value {
    let path = fixture(&format!("{dir}/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// GPU 0's power limit as the capture serves it (W); 1,000 W where it serves none.
fn power_limit_w(samples: &[Sample]) -> f64 {
    gpu_series(samples, "DCGM_FI_DEV_POWER_MGMT_LIMIT", 0)
        .first()
        .map_or(1000.0, |s| s.value)
}

/// Every finding of one capture against its two readings. `every_field`: the capture
/// asked for every field, so a value pynvml reads must be served; otherwise only what
/// it serves is checked.
fn check_capture(body: &str, before: &Value, after: &Value, every_field: bool) -> Findings {
    let mut f = Findings::default();
    let samples = parse_exposition(body);
    let driver = before["driver_version"].as_str().unwrap_or_default();
    let (b, a) = (&before["gpus"][0], &after["gpus"][0]);
    compare_labels(&mut f, &samples, 0, b, driver);
    compare_processes(
        &mut f,
        "GPU 0",
        &gpu_series(&samples, "gpu_exporter_process_memory_used_bytes", 0),
        &a["processes"],
    );
    let power_limit_w = power_limit_w(&samples);
    for (metric, path, conv) in GPU_FIELDS {
        let series = gpu_series(&samples, metric, 0);
        let value = |r: Reading, conv: Conv| match r {
            Reading::Value(v) => convert(&v, conv)
                .map(Some)
                .ok_or(format!("{v} is no number")),
            Reading::NotSupported => Ok(None),
            Reading::Error(e) => Err(e),
        };
        let readings = (
            value(reading(b, path), *conv),
            value(reading(a, path), *conv),
        );
        match (readings, series.as_slice()) {
            ((Ok(None), Ok(None)), []) => {}
            ((Ok(None), Ok(None)), [s, ..]) => f.fail(format!(
                "{metric}: pynvml says NOT_SUPPORTED, the exporter serves {}",
                s.line
            )),
            ((Ok(Some(x)), Ok(Some(y))), [s]) => {
                let (lo, hi) = (x.min(y), x.max(y));
                let slack = slack(metric);
                if !within(s.value, lo, hi, slack, power_limit_w) {
                    f.fail(format!(
                        "{metric}: exporter {} outside pynvml's {lo}..{hi} ({slack:?})",
                        s.value
                    ));
                }
            }
            ((Ok(Some(x)), Ok(Some(_))), []) => {
                if every_field {
                    f.fail(format!("{metric}: missing from /metrics; pynvml reads {x}"));
                }
            }
            (readings, series) => f.fail(format!(
                "{metric}: pynvml {readings:?}, exporter {:?}",
                series.iter().map(|s| s.value).collect::<Vec<_>>()
            )),
        }
    }
    f
}

#[test]
fn real_gpu_scrapes_agree_with_pynvml_around_them() {
    for dir in DIRS {
        for capture in CAPTURES {
            let path = fixture(&format!("{dir}/{capture}.prom"));
            let body = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let before = json(dir, &format!("{capture}.pynvml-before"));
            let after = json(dir, &format!("{capture}.pynvml-after"));
            let f = check_capture(&body, &before, &after, capture.contains("all-fields"));
            assert!(
                f.failures.is_empty(),
                "{dir}/{capture}: the real scrape disagrees with pynvml:\n- {}",
                f.failures.join("\n- ")
            );
        }
    }
}

/// The check above can fail: a fact off by one, a live value in the wrong unit, a
/// threshold read in T.Limit terms (the bug these fixtures found), a series pynvml says
/// is unsupported.
#[test]
fn the_real_gpu_check_catches_wrong_units_and_values() {
    let capture = "real-gpu-all-fields";
    let body = std::fs::read_to_string(fixture(&format!("{DIR}/{capture}.prom")))
        .expect("the all-fields capture");
    let before = json(DIR, &format!("{capture}.pynvml-before"));
    let after = json(DIR, &format!("{capture}.pynvml-after"));
    assert!(
        check_capture(&body, &before, &after, true)
            .failures
            .is_empty()
    );
    let power_limit_w = power_limit_w(&parse_exposition(&body));
    let edit = |metric: &str, to: &dyn Fn(f64) -> f64| -> String {
        let mut hit = false;
        let out = body
            .lines()
            .map(|l| {
                if l.starts_with(&format!("{metric}{{")) {
                    hit = true;
                    let (head, v) = l.rsplit_once(' ').expect("a sample line");
                    format!("{head} {}", to(v.parse().expect("a number")))
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert!(hit, "{metric} is in the capture");
        out
    };
    for (metric, to) in [
        (
            "DCGM_FI_DEV_SLOWDOWN_TEMP",
            &(|_| 0.0) as &dyn Fn(f64) -> f64,
        ),
        ("DCGM_FI_DEV_FB_RESERVED", &|v| v + 1.0),
        ("DCGM_FI_DEV_POWER_USAGE", &|v| v * 1000.0),
        // Energy in µJ, and a reading older than its read period.
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", &|v| v * 1000.0),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", &|v| {
            v - (energy_age_s() + 1.0) * power_limit_w * 1000.0
        }),
        ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", &|v| v * 1000.0 + 1e7),
        ("DCGM_FI_DEV_GPU_TEMP", &|v| v + 10.0),
    ] {
        let f = check_capture(&edit(metric, to), &before, &after, true);
        assert!(
            f.failures.iter().any(|m| m.contains(metric)),
            "a wrong {metric} must be caught; findings: {:?}",
            f.failures
        );
    }
    // Every field asked for: one the exporter drops is caught.
    let without: String = body
        .lines()
        .filter(|l| !l.starts_with("DCGM_FI_DEV_SLOWDOWN_TEMP{"))
        .map(|l| format!("{l}\n"))
        .collect();
    let f = check_capture(&without, &before, &after, true);
    assert!(
        f.failures
            .iter()
            .any(|m| m.contains("DCGM_FI_DEV_SLOWDOWN_TEMP: missing")),
        "{:?}",
        f.failures
    );
    // A series the driver does not support (this H100 has no fan) must not be served.
    let with_fan = format!("{body}\nDCGM_FI_DEV_FAN_SPEED{{gpu=\"0\"}} 30\n");
    let f = check_capture(&with_fan, &before, &after, true);
    assert!(
        f.failures
            .iter()
            .any(|m| m.contains("DCGM_FI_DEV_FAN_SPEED")),
        "{:?}",
        f.failures
    );
}
