//! Issue 17's health signals end to end: the exporter on the fake libnvidia-ml (real
//! NVML ABI) serving a scenario with a pending row remap, a recovery action, thermal
//! slowdown, XIDs and a pending ECC mode change; a real Prometheus scrapes it, evaluates
//! the shipped alert rules, and its query API shows every new series with dcgm-exporter's
//! labels and the values the scenario model holds.

use e2e_tests::{Exporter, Prometheus, fake_nvml, query_value, scratch_dir, wait_for};
use gpu_sim::{Scenario, SimNode};
use std::time::{Duration, SystemTime};

const SCENARIO: &str = "tests/fixtures/health-signals.toml";

/// The model's reading of each GPU once every fault has begun (all start by 1 s and
/// hold): the oracle for the gauges.
fn model() -> SimNode {
    let s = Scenario::load(std::path::Path::new(&e2e_tests::workspace().join(SCENARIO)))
        .expect("scenario");
    SimNode::new(&s, SystemTime::UNIX_EPOCH)
}

/// One model value of a GPU reading.
type Getter = fn(&gpu_sim::GpuReading) -> u64;

/// `promql`'s series by their `gpu` label, once there are `n`.
fn by_gpu(prom: &Prometheus, promql: &str, n: usize) -> Vec<(String, serde_json::Value)> {
    let r = wait_for(promql, Duration::from_secs(60), || {
        let r = prom.query(promql);
        (r.len() == n).then_some(r)
    });
    let mut v: Vec<(String, serde_json::Value)> = r
        .into_iter()
        .map(|s| (s["metric"]["gpu"].as_str().unwrap_or("").to_string(), s))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn health_signals_reach_prometheus_and_fire_the_shipped_alerts() {
    let lib = fake_nvml();
    let exporter = Exporter::start(
        &[
            "--nvml-lib",
            lib.to_str().expect("utf-8"),
            "-f",
            "tests/fixtures/health-signals.csv",
            "-c",
            "200",
            "-x",
            "60000",
            "--clock-events-count-window-size",
            "30000",
        ],
        &[("GPU_SIM_SCENARIO", SCENARIO)],
    );
    let dir = scratch_dir("health-signals-prometheus");
    let rules = super::dashboards::write_rule_file(&dir);
    let target = exporter.base.trim_start_matches("http://");
    let prom = Prometheus::start_with_config(
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: gpu-exporter\n    honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        ),
        &[],
    );
    let m = model();
    let t = 5.0;

    // The gauges, against the model.
    let gauges: [(&str, Getter); 4] = [
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", |r| {
            u64::from(r.remap_pending)
        }),
        ("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", |r| {
            u64::from(r.recovery_action)
        }),
        ("DCGM_FI_DEV_ECC_CURRENT", |r| u64::from(r.ecc_mode_current)),
        ("DCGM_FI_DEV_ECC_PENDING", |r| u64::from(r.ecc_mode_pending)),
    ];
    for (field, of) in gauges {
        let series = by_gpu(&prom, field, 3);
        for (gpu, s) in &series {
            let want = of(&m.gpu_reading(gpu.parse().unwrap(), t));
            assert_eq!(query_value(s), want as f64, "{field} GPU {gpu}: {s}");
        }
    }
    // The model itself says what the scenario means (an oracle for the oracle).
    assert_eq!(m.gpu_reading(0, t).recovery_action, 2);
    assert!(m.gpu_reading(0, t).remap_pending && !m.gpu_reading(2, t).ecc_mode_pending);

    // Windowed XID counts: three XIDs 13 on GPU 1, the XID 154 the recovery action
    // raised on GPU 0, and GPU 2's empty window as one zero series without `xid`.
    let xids = by_gpu(&prom, "DCGM_EXP_XID_ERRORS_COUNT", 3);
    let labels = |s: &serde_json::Value, k: &str| s["metric"][k].as_str().map(str::to_string);
    assert_eq!(
        labels(&xids[0].1, "xid").as_deref(),
        Some("154"),
        "{xids:?}"
    );
    assert_eq!(query_value(&xids[0].1), 1.0);
    assert_eq!(labels(&xids[1].1, "xid").as_deref(), Some("13"));
    assert_eq!(query_value(&xids[1].1), 3.0);
    assert_eq!(labels(&xids[2].1, "xid"), None);
    assert_eq!(query_value(&xids[2].1), 0.0);
    assert!(
        xids.iter()
            .all(|(_, s)| labels(s, "window_size_in_ms").as_deref() == Some("60000")),
        "{xids:?}"
    );
    // They agree with the true counter.
    let total = prom.query("sum(gpu_exporter_xid_errors_total)");
    assert_eq!(total.len(), 1);
    assert_eq!(query_value(&total[0]), 4.0);

    // Clock events: GPU 1's HW thermal slowdown counts cycles and keeps counting.
    let thermal = "DCGM_EXP_CLOCK_EVENTS_COUNT{gpu=\"1\",clock_event=\"hw_thermal\",window_size_in_ms=\"30000\"}";
    let first = query_value(&by_gpu(&prom, thermal, 1)[0].1);
    wait_for("hw_thermal cycles to grow", Duration::from_secs(30), || {
        let r = prom.query(thermal);
        r.first()
            .is_some_and(|s| query_value(s) > first)
            .then_some(())
    });

    // Health: worst finding per watch, DCGM's values and codes.
    let health = |gpu: &str, watch: &str| {
        let r = prom.query(&format!(
            "DCGM_EXP_GPU_HEALTH_STATUS{{gpu=\"{gpu}\",health_watch=\"{watch}\"}}"
        ));
        assert_eq!(r.len(), 1, "GPU {gpu} {watch}: {r:?}");
        (
            query_value(&r[0]),
            labels(&r[0], "health_error_code").unwrap_or_default(),
        )
    };
    by_gpu(&prom, "DCGM_EXP_GPU_HEALTH_STATUS{health_watch=\"ALL\"}", 3);
    assert_eq!(
        health("0", "ALL"),
        (20.0, "DCGM_FR_GPU_RECOVERY_REBOOT".into())
    );
    assert_eq!(
        health("0", "MEM"),
        (10.0, "DCGM_FR_PENDING_ROW_REMAP".into())
    );
    assert_eq!(
        health("1", "THERMAL"),
        (10.0, "DCGM_FR_CLOCK_THROTTLE_THERMAL".into())
    );
    let quiet = prom.query("DCGM_EXP_GPU_HEALTH_STATUS{gpu=\"2\"}");
    assert_eq!(quiet.len(), 6, "{quiet:?}");
    assert!(quiet.iter().all(|s| query_value(s) == 0.0), "{quiet:?}");

    // The shipped rules fire on what the exporter serves.
    wait_for(
        "GPURecoveryActionRequired firing for GPU 0",
        Duration::from_secs(60),
        || {
            let r = prom.query(
                "ALERTS{alertname=\"GPURecoveryActionRequired\",alertstate=\"firing\",gpu=\"0\"}",
            );
            (r.len() == 1).then_some(())
        },
    );
    // Four XIDs in the window are not a burst.
    assert!(prom.query("ALERTS{alertname=\"GPUXidBurst\"}").is_empty());
    // Pending with its `for`, on the GPU it names and no other.
    let pending = wait_for(
        "GPURowRemapPending pending",
        Duration::from_secs(30),
        || {
            let r = prom.query("ALERTS{alertname=\"GPURowRemapPending\"}");
            (!r.is_empty()).then_some(r)
        },
    );
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["metric"]["gpu"], "0");
    assert_eq!(pending[0]["metric"]["alertstate"], "pending");
}
