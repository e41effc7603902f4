//! Answers a real H100 gives (driver 580.159.04, `tests/fixtures/real-gpu/`) for
//! queries the fake once refused: CPU and memory affinity, the clock-frequency and
//! performance-mode strings, detailed ECC counts and the row-remapper histogram.

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, InOut, Out, Ret, in_slice, put_array_str,
    struct_version,
};
use crate::state::{Dev, device_call};
use gpu_sim::Capability;
use gpu_sim::models::ROW_REMAPPER_BANKS;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulong};

/// Bits in one word of an affinity mask.
const WORD_BITS: usize = c_ulong::BITS as usize;

/// The CPUs the fake runs on, as the GPU's (single NUMA node) affinity: a scenario has
/// no CPU topology, and a passthrough VM (the real capture) puts every vCPU on node 0.
fn cpu_mask(words: &mut [c_ulong]) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    words.fill(0);
    for cpu in 0..cpus.min(words.len() * WORD_BITS) {
        words[cpu / WORD_BITS] |= 1 << (cpu % WORD_BITS);
    }
}

/// Fill a client's mask of `size` words with `fill`, after the usual handle checks.
///
/// # Safety
/// `mask` is null or valid for `size` `c_ulong` writes.
unsafe fn affinity(
    device: nvmlDevice_t,
    size: c_uint,
    mask: *mut c_ulong,
    fill: fn(&mut [c_ulong]),
) -> nvmlReturn_t {
    // SAFETY: per this function's contract.
    let words = unsafe { in_slice(mask, size as usize) };
    device_call(device, |d| {
        d.whole_gpu()?;
        let words = words.filter(|w| !w.is_empty()).ok_or(INVALID_ARGUMENT)?;
        fill(words);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: nvmlDevice_t,
    cpuSetSize: c_uint,
    cpuSet: *mut c_ulong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCpuAffinity");
    // SAFETY: NVML contract: `cpuSet` is null or holds `cpuSetSize` words.
    unsafe { affinity(device, cpuSetSize, cpuSet, cpu_mask) }
}

/// Node and socket scope give the same mask on a one-node machine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: nvmlDevice_t,
    cpuSetSize: c_uint,
    cpuSet: *mut c_ulong,
    _scope: nvmlAffinityScope_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCpuAffinityWithinScope");
    // SAFETY: NVML contract: `cpuSet` is null or holds `cpuSetSize` words.
    unsafe { affinity(device, cpuSetSize, cpuSet, cpu_mask) }
}

/// NUMA node 0 (mask 1), as on the real one-node machine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: nvmlDevice_t,
    nodeSetSize: c_uint,
    nodeSet: *mut c_ulong,
    _scope: nvmlAffinityScope_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemoryAffinity");
    // SAFETY: NVML contract: `nodeSet` is null or holds `nodeSetSize` words.
    unsafe {
        affinity(device, nodeSetSize, nodeSet, |w| {
            w.fill(0);
            w[0] = 1;
        })
    }
}

/// One performance level's clocks in the driver's `key=value, …` form.
fn level(nvclock: u32, nvmin: u32, nvmax: u32, mem: u32) -> String {
    let rate = mem * 2;
    format!(
        "nvclock={nvclock}, nvclockmin={nvmin}, nvclockmax={nvmax}, nvclockeditable=0, \
         memclock={mem}, memclockmin={mem}, memclockmax={mem}, memclockeditable=0, \
         memTransferRate={rate}, memTransferRatemin={rate}, memTransferRatemax={rate}, \
         memTransferRateeditable=0"
    )
}

fn current_level(d: &Dev) -> Result<String, Ret> {
    let r = d.reading(Capability::Clocks)?;
    let m = d.gpu.model;
    Ok(level(
        r.sm_clock_mhz,
        m.idle_sm_clock_mhz,
        m.max_sm_clock_mhz,
        r.mem_clock_mhz,
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClockFreqs(
    device: nvmlDevice_t,
    currentClockFreqs: *mut nvmlDeviceCurrentClockFreqs_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCurrentClockFreqs");
    // SAFETY: NVML contract: null or valid for one struct whose version the caller set.
    let io = unsafe { InOut::new(currentClockFreqs) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlDeviceCurrentClockFreqs_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        put_array_str(&mut v.str_, &current_level(d)?);
        Ok(())
    })
}

/// One level, `perf=0`, at the model's one memory clock (the real H100 lists a second,
/// lower memory clock the model does not have).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceModes(
    device: nvmlDevice_t,
    perfModes: *mut nvmlDevicePerfModes_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPerformanceModes");
    // SAFETY: NVML contract: null or valid for one struct whose version the caller set.
    let io = unsafe { InOut::new(perfModes) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlDevicePerfModes_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        put_array_str(&mut v.str_, &format!("perf=0, {}", current_level(d)?));
        Ok(())
    })
}

/// The deprecated per-location ECC counts: the model's totals are device memory's;
/// caches and register file count none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDetailedEccErrors(
    device: nvmlDevice_t,
    errorType: nvmlMemoryErrorType_t,
    counterType: nvmlEccCounterType_t,
    eccCounts: *mut nvmlEccErrorCounts_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDetailedEccErrors");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(eccCounts) };
    device_call(device, |d| {
        let r = d.reading(Capability::Ecc)?;
        let device_memory = match (errorType, counterType) {
            (0, 0) => r.ecc_corrected_volatile,
            (1, 0) => r.ecc_uncorrected_volatile,
            (0, 1) => r.ecc_corrected_aggregate,
            (1, 1) => r.ecc_uncorrected_aggregate,
            _ => return Err(INVALID_ARGUMENT),
        };
        out.set(nvmlEccErrorCounts_t {
            l1Cache: 0,
            l2Cache: 0,
            deviceMemory: device_memory,
            registerFile: 0,
        })
    })
}

/// Banks by remaining remap capacity: each remapped row takes one bank from `max` to
/// `high` (the model does not place rows in banks).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRowRemapperHistogram(
    device: nvmlDevice_t,
    values: *mut nvmlRowRemapperHistogramValues_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRowRemapperHistogram");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(values) };
    device_call(device, |d| {
        let r = d.reading(Capability::RemappedRows)?;
        let rows = r.remapped_correctable + r.remapped_uncorrectable;
        let high = rows.min(u64::from(ROW_REMAPPER_BANKS)) as c_uint;
        out.set(nvmlRowRemapperHistogramValues_t {
            max: ROW_REMAPPER_BANKS - high,
            high,
            partial: 0,
            low: 0,
            none: 0,
        })
    })
}
