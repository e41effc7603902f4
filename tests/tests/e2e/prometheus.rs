//! A real Prometheus on loopback scrapes the simulated exporter (`builtin:default`: eight
//! GPUs, no pods), once in the default text format and once in OpenMetrics, and its
//! query API shows every GPU with dcgm-exporter's labels.

use e2e_tests::{Exporter, Prometheus, wait_for};
use std::collections::BTreeSet;
use std::time::Duration;

fn host_port(e: &Exporter) -> String {
    e.base.trim_start_matches("http://").to_string()
}

#[test]
fn prometheus_scrapes_all_eight_gpus_with_dcgm_labels() {
    let text = Exporter::start(&["--simulate=builtin:default", "-c", "500"], &[]);
    let om = Exporter::start(
        &["--simulate=builtin:default", "--openmetrics", "-c", "500"],
        &[],
    );
    let prom = Prometheus::start(&[
        ("text", &host_port(&text), ""),
        ("openmetrics", &host_port(&om), ""),
    ]);

    let series = wait_for(
        "8 GPU_UTIL series from the text job",
        Duration::from_secs(60),
        || {
            let r = prom.query("DCGM_FI_DEV_GPU_UTIL{job=\"text\"}");
            (r.len() == 8).then_some(r)
        },
    );
    let mut gpus = BTreeSet::new();
    for s in &series {
        let m = &s["metric"];
        let gpu = m["gpu"].as_str().expect("gpu label");
        gpus.insert(gpu.to_string());
        assert!(
            m["UUID"]
                .as_str()
                .is_some_and(|u| u.starts_with("GPU-") && u.len() == 40),
            "{m}"
        );
        assert_eq!(m["device"], format!("nvidia{gpu}"), "{m}");
        assert_eq!(m["modelName"], "NVIDIA H100 80GB HBM3", "{m}");
        assert_eq!(m["Hostname"], "e2e-node", "{m}");
        assert_eq!(m["DCGM_FI_DRIVER_VERSION"], "580.82.07", "{m}");
        assert!(
            m["pci_bus_id"]
                .as_str()
                .is_some_and(|p| p.starts_with("00000000:")),
            "{m}"
        );
        let v: f64 = s["value"][1]
            .as_str()
            .expect("value")
            .parse()
            .expect("number");
        assert!((0.0..=100.0).contains(&v), "{v}");
    }
    assert_eq!(gpus, (0..8).map(|i| i.to_string()).collect());

    // OpenMetrics: Prometheus negotiated it and sees counters with _total.
    let energy = wait_for(
        "OpenMetrics energy counters",
        Duration::from_secs(60),
        || {
            let r = prom.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total{job=\"openmetrics\"}");
            (r.len() == 8).then_some(r)
        },
    );
    assert_eq!(energy.len(), 8);
    // The text job keeps dcgm-exporter's counter name.
    assert_eq!(
        prom.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{job=\"text\"}")
            .len(),
        8
    );
    let up = prom.query("up");
    assert!(up.iter().all(|s| s["value"][1] == "1"), "{up:?}");
}
