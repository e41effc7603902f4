//! `GPU_SIM_DIAL`: utilisation set from a file while the process runs, read through
//! the real nvml-wrapper. (A single test, so nothing else touches the environment.)

mod common;

use common::{set_scenario, try_init};
use std::time::{Duration, Instant};

#[test]
fn the_dial_file_sets_utilisation_while_nvml_runs() {
    let dir = std::env::temp_dir().join(format!("fake-nvml-dial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dial = dir.join("dial");
    std::fs::write(&dial, "*=97\n").unwrap();
    set_scenario("builtin:default", None);
    // SAFETY: single test in this process; see `common::set_scenario`.
    unsafe { std::env::set_var("GPU_SIM_DIAL", &dial) };
    let nvml = try_init().unwrap();
    let util = |i: u32| {
        nvml.device_by_index(i)
            .unwrap()
            .utilization_rates()
            .unwrap()
            .gpu
    };
    let energy = |i: u32| {
        nvml.device_by_index(i)
            .unwrap()
            .total_energy_consumption()
            .unwrap()
    };
    assert_eq!((util(0), util(1)), (97, 97));
    let before = energy(0);

    std::fs::write(&dial, "*=97\n0 = 12\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while util(0) != 12 {
        assert!(Instant::now() < deadline, "GPU 0 never followed the dial");
        std::thread::yield_now();
    }
    assert_eq!(util(1), 97, "GPU 1 still follows *");
    assert!(energy(0) >= before, "energy never goes back");
    std::fs::remove_dir_all(&dir).unwrap();
}
