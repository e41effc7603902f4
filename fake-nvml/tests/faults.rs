//! Init errors and node-level faults. One test walks through several scenarios in
//! turn: dropping `Nvml` calls `nvmlShutdown`, and the next init reloads the scenario
//! from the environment. (A single test, so nothing else touches the environment.)

mod common;

use common::{scenario_path, set_scenario, try_init};
use nvml_wrapper::error::NvmlError;
use std::time::{Duration, Instant};

fn path(file: &str) -> String {
    scenario_path(file).to_str().unwrap().to_owned()
}

#[test]
fn init_errors_lost_gpus_and_driver_windows() {
    // A scenario that cannot be loaded: NVML_ERROR_UNKNOWN.
    for bad in [
        path("does-not-exist.toml"),
        path("broken.toml"),
        "builtin:nope".into(),
    ] {
        set_scenario(&bad, None);
        assert!(matches!(try_init(), Err(NvmlError::Unknown)), "{bad}");
    }
    set_scenario("builtin:default", None);
    // SAFETY: single test in this process; see `common::set_scenario`.
    unsafe { std::env::set_var("GPU_SIM_FROZEN_AT_S", "soon") };
    assert!(matches!(try_init(), Err(NvmlError::Unknown)));

    // The scenario's init failure: driver not loaded.
    set_scenario(&path("init-failure.toml"), None);
    assert!(matches!(try_init(), Err(NvmlError::DriverNotLoaded)));

    // The default built-in scenario.
    set_scenario("builtin:default", Some(1.0));
    {
        let nvml = try_init().unwrap();
        assert_eq!(nvml.device_count().unwrap(), 8);
    }

    let file = "a100-faults.toml";
    let model = |t| common::model(file, t);

    // t = 10: GPU 1 is lost, the others answer; A100s have no GPM.
    set_scenario(&path(file), Some(10.0));
    {
        let nvml = try_init().unwrap();
        let m = model(10.0);
        assert_eq!(nvml.device_count().unwrap(), 3);
        let lost = nvml.device_by_index(1).unwrap();
        assert!(matches!(lost.uuid(), Err(NvmlError::GpuLost)));
        assert!(matches!(lost.memory_info(), Err(NvmlError::GpuLost)));
        assert!(matches!(lost.power_usage(), Err(NvmlError::GpuLost)));
        assert!(matches!(
            lost.running_compute_processes(),
            Err(NvmlError::GpuLost)
        ));
        for i in [0, 2] {
            let d = nvml.device_by_index(i).unwrap();
            assert_eq!(d.uuid().unwrap(), m.gpus[i as usize].uuid);
            assert_eq!(d.power_usage().unwrap(), m.gpu_reading(i, 10.0).power_mw);
            assert!(matches!(d.gpm_support(), Err(NvmlError::NotSupported)));
            assert!(matches!(d.gpm_sample(), Err(NvmlError::NotSupported)));
        }
        // The XID at 3 s (frozen at 10 s) is due: delivered once, then a blocking timeout.
        let gpu0 = nvml.device_by_index(0).unwrap();
        let set = gpu0
            .register_events(
                nvml_wrapper::bitmasks::event::EventTypes::CRITICAL_XID_ERROR,
                nvml.create_event_set().unwrap(),
            )
            .map_err(|e| e.error)
            .unwrap();
        let ev = set.wait(1_000).unwrap();
        assert_eq!(
            ev.event_data,
            Some(nvml_wrapper::enums::event::XidError::Value(
                m.xids_between(0.0, 10.0)[0].code
            ))
        );
        let start = Instant::now();
        assert!(matches!(set.wait(250), Err(NvmlError::Timeout)));
        assert!(start.elapsed() >= Duration::from_millis(250));
    }

    // t = 25: the driver is unavailable; every call fails with UNKNOWN.
    set_scenario(&path(file), Some(25.0));
    {
        let nvml = try_init().unwrap();
        assert!(matches!(nvml.device_count(), Err(NvmlError::Unknown)));
        assert!(matches!(nvml.device_by_index(0), Err(NvmlError::Unknown)));
    }

    // t = 45: every call takes the scenario's delay.
    set_scenario(&path(file), Some(45.0));
    {
        let nvml = try_init().unwrap();
        let start = Instant::now();
        assert_eq!(nvml.device_count().unwrap(), 3);
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "{:?}",
            start.elapsed()
        );
    }
}
