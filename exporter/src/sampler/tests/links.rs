//! NVLink, thermal-limit and fabric series of the GB200 NVL72 scenario, checked against
//! what gpu-sim says the same instant reports.

use super::*;
use crate::encode::{Format, render_device_families};
use crate::source::simulated::SimulatedSource;

/// Scenario time inside the fault window: GPU 2's link 5 is down, GPU 3's fabric
/// route unhealthy.
const T: f64 = 100.0;

fn node() -> gpu_sim::SimNode {
    let s = gpu_sim::Scenario::builtin("gb200-nvl72").expect("scenario");
    let mut node = gpu_sim::SimNode::new(&s, SystemTime::now());
    node.freeze_at(T);
    node
}

/// The text body of a third cycle (rates have a previous reading by then).
fn render(csv: &str) -> String {
    let (plan, _) = crate::plan::counters::plan(csv, "test.csv").expect("plan");
    let mut s = Sampler::new(
        Box::new(SimulatedSource::new(node(), "gb200")),
        Arc::new(plan),
        SamplerOptions {
            interval: Duration::from_secs(1),
            hostname: Some(("hostname".into(), "tray-1".into())),
            replace_blanks_in_model_name: true,
            process_metrics: false,
            pod_uid: false,
            virtual_gpus: false,
            old_namespace: false,
        },
        "".into(),
    );
    s.cycle();
    std::thread::sleep(Duration::from_millis(5));
    let snap = s.cycle();
    let mut out = Vec::new();
    render_device_families(&snap, Format::Text, &mut out);
    String::from_utf8(out).expect("utf-8")
}

/// The value of the one series of `name` whose labels start with `labels`.
fn value(body: &str, name: &str, labels: &str) -> Option<String> {
    let prefix = format!("{name}{{{labels}");
    let mut found = body.lines().filter(|l| l.starts_with(&prefix));
    let line = found.next()?;
    assert!(found.next().is_none(), "{prefix} matches twice");
    line.rsplit(' ').next().map(str::to_string)
}

#[test]
fn every_link_has_its_state_errors_and_rates_with_dcgms_nvlink_labels() {
    let body = render(
        "DCGM_FI_DEV_NVLINK_GET_STATE, gauge, s\n\
         DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, r\n\
         DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL, counter, v\n\
         DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK, gauge, b\n\
         DCGM_FI_DEV_GPU_TEMP, gauge, t\n\
         DCGM_FI_DRIVER_VERSION, label, d\n",
    );
    let m = node();
    let g = &m.gpus[2];
    // dcgm-exporter's NVLink label set, in its order, then the label fields; the
    // model name keeps its blanks (dcgm never replaces them on NVLink series).
    let expected = format!(
        "DCGM_FI_DEV_NVLINK_GET_STATE{{nvlink=\"5\",gpu=\"2\",gpu_uuid=\"{}\",pci_bus_id=\"{}\",device=\"nvidia2\",model_name=\"NVIDIA GB200\",hostname=\"tray-1\",DCGM_FI_DRIVER_VERSION=\"580.82.07\"}} 0",
        g.uuid, g.pci_bus_id
    );
    assert!(body.lines().any(|l| l == expected), "{expected}\n{body}");
    let count = |name: &str| {
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .count()
    };
    assert_eq!(count("DCGM_FI_DEV_NVLINK_GET_STATE"), 4 * 18);
    assert_eq!(
        count("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL"),
        4 * 18
    );
    assert_eq!(count("DCGM_FI_DEV_GPU_TEMP"), 4);
    for gpu in 0..4u32 {
        for link in 0..18 {
            let labels = format!("nvlink=\"{link}\",gpu=\"{gpu}\",");
            let state = value(&body, "DCGM_FI_DEV_NVLINK_GET_STATE", &labels);
            let active = m.nvlink_active(gpu, link, T);
            assert_eq!(state.as_deref(), Some(if active { "1" } else { "0" }));
            let errors = m.nvlink_link_errors(gpu, link, T);
            let replay = value(
                &body,
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
                &labels,
            );
            assert_eq!(replay, Some(errors[2].to_string()));
            let recovery = value(
                &body,
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL",
                &labels,
            );
            assert_eq!(recovery, Some(errors[3].to_string()));
            // Frozen scenario time: the counters stand still, so every rate is 0.
            let rate = value(&body, "DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK", &labels);
            assert_eq!(rate.as_deref(), Some("0"), "gpu {gpu} link {link}");
        }
    }
    assert_eq!(
        value(
            &body,
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
            "nvlink=\"5\",gpu=\"2\","
        ),
        Some("12".into()),
        "the scenario's errors on the downed link"
    );
    // GPU series keep their own label set (and blanks replaced, as asked).
    assert!(
        body.contains("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\""),
        "{body}"
    );
    assert!(body.contains("modelName=\"NVIDIA-GB200\""));
}

#[test]
fn thermal_limits_pstate_and_fabric_health_per_gpu_and_no_fan_on_an_nvl72_gpu() {
    let body = render(
        "DCGM_FI_DEV_SLOWDOWN_TEMP, gauge, a\n\
         DCGM_FI_DEV_SHUTDOWN_TEMP, gauge, b\n\
         DCGM_FI_DEV_GPU_MAX_OP_TEMP, gauge, c\n\
         DCGM_FI_DEV_MEM_MAX_OP_TEMP, gauge, d\n\
         DCGM_FI_DEV_PSTATE, gauge, e\n\
         DCGM_FI_DEV_FAN_SPEED, gauge, f\n\
         DCGM_FI_DEV_FABRIC_MANAGER_STATUS, gauge, g\n\
         DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE, gauge, k\n\
         DCGM_FI_DEV_FABRIC_CLIQUE_ID, gauge, h\n\
         DCGM_FI_DEV_FABRIC_HEALTH_MASK, gauge, i\n\
         DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY, gauge, j\n",
    );
    let m = node();
    let b = &m.gpus[0].model.board;
    for gpu in 0..4u32 {
        let labels = format!("gpu=\"{gpu}\",");
        let v = |name: &str| value(&body, name, &labels);
        assert_eq!(
            v("DCGM_FI_DEV_SLOWDOWN_TEMP"),
            Some(b.slowdown_temp_c.to_string())
        );
        assert_eq!(
            v("DCGM_FI_DEV_SHUTDOWN_TEMP"),
            Some(b.shutdown_temp_c.to_string())
        );
        assert_eq!(
            v("DCGM_FI_DEV_GPU_MAX_OP_TEMP"),
            Some(b.gpu_max_operating_temp_c.to_string())
        );
        assert_eq!(
            v("DCGM_FI_DEV_MEM_MAX_OP_TEMP"),
            Some(b.memory_max_operating_temp_c.to_string())
        );
        assert_eq!(v("DCGM_FI_DEV_PSTATE").as_deref(), Some("0"));
        let f = m.fabric(gpu, T);
        assert_eq!(v("DCGM_FI_DEV_FABRIC_MANAGER_STATUS").as_deref(), Some("3"));
        assert_eq!(
            v("DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE").as_deref(),
            Some("0")
        );
        assert_eq!(
            v("DCGM_FI_DEV_FABRIC_CLIQUE_ID"),
            Some(f.clique_id.to_string())
        );
        assert_eq!(
            v("DCGM_FI_DEV_FABRIC_HEALTH_MASK"),
            Some(f.health_mask.to_string())
        );
        assert_eq!(
            v("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"),
            Some(f.health_summary.to_string())
        );
    }
    assert_eq!(
        value(&body, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", "gpu=\"3\","),
        Some("2".into()),
        "the scenario's unhealthy route"
    );
    // No fans: the family is absent, not a series of zeros.
    assert!(!body.contains("DCGM_FI_DEV_FAN_SPEED"), "{body}");
}
