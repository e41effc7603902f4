//! NVLink link state, per-link error counters and fabric registration of the GB200
//! NVL72 scenario, read through the real nvml-wrapper (and raw calls where it has no
//! wrapper), against what gpu-sim says. One test: it re-initialises NVML at two
//! scenario times, which goes through the environment.

mod common;

use common::{set_scenario, try_init};
use gpu_sim::{Scenario, SimNode};
use nvml_wrapper::enum_wrappers::device::TemperatureThreshold;
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;
use std::time::SystemTime;

const SCENARIO: &str = "builtin:gb200-nvl72";

fn model(t: f64) -> SimNode {
    let s = Scenario::builtin("gb200-nvl72").expect("built-in scenario");
    let mut node = SimNode::new(&s, SystemTime::now());
    node.freeze_at(t);
    node
}

/// `nvmlDeviceGetGpuFabricInfoV` with a v3 struct.
fn fabric_v3(nvml: &nvml_wrapper::Nvml, index: u32) -> nvmlGpuFabricInfoV_t {
    let dev = nvml.device_by_index(index).expect("device");
    // SAFETY: a plain C struct, for which all-zero bytes are valid.
    let mut info: nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
    info.version = std::mem::size_of::<nvmlGpuFabricInfoV_t>() as u32 | 3 << 24;
    // SAFETY: a live handle and a valid out-struct with its version set.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuFabricInfoV(dev.handle(), &mut info)
    };
    assert_eq!(rc, nvmlReturn_enum_NVML_SUCCESS);
    info
}

/// `nvmlDeviceGetFieldValues` for one field and scope: (return code, uint value).
fn field(nvml: &nvml_wrapper::Nvml, index: u32, id: u32, scope: u32) -> (u32, u64) {
    let dev = nvml.device_by_index(index).expect("device");
    // SAFETY: a plain C struct, for which all-zero bytes are valid.
    let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
    v.fieldId = id;
    v.scopeId = scope;
    // SAFETY: a live handle and one valid field-value struct.
    let rc = unsafe { nvml.lib().nvmlDeviceGetFieldValues(dev.handle(), 1, &mut v) };
    assert_eq!(rc, nvmlReturn_enum_NVML_SUCCESS);
    // SAFETY: every value type the fake writes fits the 64-bit member read whole.
    (v.nvmlReturn, unsafe { v.value.ullVal })
}

#[test]
fn links_go_down_errors_count_per_link_and_the_fabric_reports_its_health() {
    // Inside the fault window (60–180 s): GPU 2's link 5 is down, GPU 3's route is unhealthy.
    for t in [100.0, 10.0] {
        set_scenario(SCENARIO, Some(t));
        let nvml = try_init().expect("nvmlInit");
        let m = model(t);
        assert_eq!(nvml.device_count().unwrap(), 4);
        for (i, g) in m.gpus.iter().enumerate() {
            let i = i as u32;
            let dev = nvml.device_by_index(i).unwrap();
            assert_eq!(dev.name().unwrap(), "NVIDIA GB200");
            for link in 0..g.model.nvlink_links {
                let active = m.nvlink_active(i, link, t);
                let l = dev.link_wrapper_for(link);
                assert_eq!(l.is_active().unwrap(), active, "gpu {i} link {link} at {t}");
                let (rc, state) = field(&nvml, i, field_id::NVML_FI_DEV_NVLINK_GET_STATE, link);
                assert_eq!((rc, state), (0, u64::from(active)));
                let errors = m.nvlink_link_errors(i, link, t);
                assert_eq!(l.error_counter(ErrorCounter::DlReplay).unwrap(), errors[2]);
                assert_eq!(
                    l.error_counter(ErrorCounter::DlRecovery).unwrap(),
                    errors[3]
                );
                // A down link carries no traffic.
                let (_, tx) = field(
                    &nvml,
                    i,
                    field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                    link,
                );
                if !active {
                    assert_eq!(tx, 0);
                }
            }
            // The per-link counters add up to the all-link field.
            let (_, replay_total) = field(
                &nvml,
                i,
                field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
                0,
            );
            let sum: u64 = (0..18).map(|l| m.nvlink_link_errors(i, l, t)[2]).sum();
            assert_eq!(replay_total, sum);
            let f = m.fabric(i, t);
            let info = fabric_v3(&nvml, i);
            assert_eq!(info.state, f.state.nvml());
            assert_eq!(info.status, f.status);
            assert_eq!(info.cliqueId, f.clique_id);
            assert_eq!(info.clusterUuid, f.cluster_uuid);
            assert_eq!(info.healthMask, f.health_mask);
            assert_eq!(u32::from(info.healthSummary), f.health_summary);
            // Board facts: thresholds answer, an NVL72 GPU has no fans.
            assert_eq!(
                dev.temperature_threshold(TemperatureThreshold::Slowdown)
                    .unwrap(),
                g.model.board.slowdown_temp_c
            );
            assert!(matches!(dev.fan_speed(0), Err(NvmlError::InvalidArg)));
            assert_eq!(dev.num_fans().unwrap(), 0);
        }
        if t == 100.0 {
            assert!(!m.nvlink_active(2, 5, t), "the scenario's link fault");
            assert_eq!(fabric_v3(&nvml, 3).healthSummary, 2);
            assert_eq!(fabric_v3(&nvml, 0).healthSummary, 1);
            assert_eq!(fabric_v3(&nvml, 0).cliqueId, 32766);
        } else {
            assert!(m.nvlink_active(2, 5, t));
        }
        drop(nvml);
    }
}
