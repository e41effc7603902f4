//! Answers modelled on the real H100 (driver 580.159.04) that the fake once refused,
//! checked against the model: detailed ECC counts, the row-remapper histogram, ECC
//! locations, CPU and memory affinity, and NOT_FOUND for per-process utilisation on a
//! GPU with no process.

mod common;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;

const FILE: &str = "telemetry.toml";
const T: f64 = 100.0;

#[test]
fn ecc_remapping_affinity_and_process_samples_follow_the_model() {
    let (nvml, _) = common::shared(FILE, Some(T));
    let m = common::model(FILE, T);
    let lib = nvml.lib();

    // GPU 0 (H100) has ECC errors: the detailed counts put them all in device memory.
    let gpu0 = nvml.device_by_index(0).unwrap();
    let r0 = m.gpu_reading(0, T);
    assert!(r0.ecc_corrected_volatile > 0, "the scenario's ECC fault");
    // SAFETY: plain old data; all-zero is valid.
    let mut counts: nvmlEccErrorCounts_t = unsafe { std::mem::zeroed() };
    // SAFETY: a live handle and a valid out-pointer.
    let rc = unsafe { lib.nvmlDeviceGetDetailedEccErrors(gpu0.handle(), 0, 0, &mut counts) };
    assert_eq!(rc, 0);
    assert_eq!(
        (
            counts.deviceMemory,
            counts.l1Cache,
            counts.l2Cache,
            counts.registerFile
        ),
        (r0.ecc_corrected_volatile, 0, 0, 0)
    );
    // Hopper counts ECC errors in DRAM and SRAM only.
    for (location, supported) in [(0, false), (1, false), (2, true), (3, false), (7, true)] {
        let mut n = 0;
        // SAFETY: as above.
        let rc =
            unsafe { lib.nvmlDeviceGetMemoryErrorCounter(gpu0.handle(), 0, 0, location, &mut n) };
        let want = if supported {
            0
        } else {
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        };
        assert_eq!(rc, want, "location {location}");
    }

    // GPU 1 has remapped rows: each takes one bank out of the `max` bin.
    let gpu1 = nvml.device_by_index(1).unwrap();
    let r1 = m.gpu_reading(1, T);
    let rows = (r1.remapped_correctable + r1.remapped_uncorrectable) as u32;
    assert!(rows > 0, "the scenario's row-remap fault");
    // SAFETY: plain old data; all-zero is valid.
    let mut h: nvmlRowRemapperHistogramValues_t = unsafe { std::mem::zeroed() };
    // SAFETY: a live handle and a valid out-pointer.
    let rc = unsafe { lib.nvmlDeviceGetRowRemapperHistogram(gpu1.handle(), &mut h) };
    assert_eq!(rc, 0);
    assert_eq!(
        (h.max, h.high, h.partial, h.low, h.none),
        (gpu_sim::models::ROW_REMAPPER_BANKS - rows, rows, 0, 0, 0)
    );

    // One NUMA node holding every CPU the process may run on.
    let cpus = std::thread::available_parallelism().unwrap().get().min(64);
    let mask = gpu0.cpu_affinity(1).unwrap();
    assert_eq!(mask[0].count_ones() as usize, cpus, "{mask:?}");

    // The L4 (GPU 2) runs no process: no utilisation sample, which NVML says NOT_FOUND.
    assert!(m.gpu_processes(2, T).is_empty());
    let l4 = nvml.device_by_index(2).unwrap();
    assert!(matches!(
        l4.process_utilization_stats(None),
        Err(NvmlError::NotFound)
    ));
    assert!(!gpu0.process_utilization_stats(None).unwrap().is_empty());
}
