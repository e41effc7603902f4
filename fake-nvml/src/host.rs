//! Answers a real H100 gives (driver 580.159.04, `tests/fixtures/real-gpu/`) for
//! queries the fake once refused: CPU and memory affinity, the clock-frequency and
//! performance-mode strings, detailed ECC counts, the row-remapper histogram, and
//! small board facts (addressing mode, clock offsets, IRQ, PDI, repair status, …).

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, InOut, Out, Ret, in_slice, put_array_str,
    struct_version,
};
use crate::state::{Dev, device_call};
use gpu_sim::Capability;
use gpu_sim::models::ROW_REMAPPER_BANKS;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_int, c_uint, c_ulong, c_ulonglong, c_void};

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

/// No extended (HMM/ATS) addressing: `NVML_DEVICE_ADDRESSING_MODE_NONE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAddressingMode(
    device: nvmlDevice_t,
    mode: *mut nvmlDeviceAddressingMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAddressingMode");
    // SAFETY: NVML contract: null or valid for one struct whose version the caller set.
    let io = unsafe { InOut::new(mode) };
    device_call(device, |_| {
        io.get()?.value = nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE;
        Ok(())
    })
}

/// Chip-to-chip (NVLink-C2C to a Grace CPU) is on only for Grace boards (GB200).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetC2cModeInfoV(
    device: nvmlDevice_t,
    c2cModeInfo: *mut nvmlC2cModeInfo_v1_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetC2cModeInfoV");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(c2cModeInfo) };
    device_call(device, |d| {
        out.set(nvmlC2cModeInfo_v1_t {
            isC2cEnabled: c_uint::from(d.gpu.model.name.contains("GB200")),
        })
    })
}

/// No clock offsets are applied: 0, within a 0..0 range (the real H100's answer).
fn no_offset(device: nvmlDevice_t, offset: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the callers' NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(offset) };
    device_call(device, |_| out.set(0))
}

fn no_offset_range(device: nvmlDevice_t, min: *mut c_int, max: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the callers' NVML contract: both out-pointers are null or valid for writes.
    let (lo, hi) = unsafe { (Out::new(min), Out::new(max)) };
    device_call(device, |_| {
        if lo.is_null() || hi.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        lo.set(0)?;
        hi.set(0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpcClkVfOffset(
    device: nvmlDevice_t,
    offset: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpcClkVfOffset");
    no_offset(device, offset)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemClkVfOffset(
    device: nvmlDevice_t,
    offset: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemClkVfOffset");
    no_offset(device, offset)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpcClkMinMaxVfOffset(
    device: nvmlDevice_t,
    minOffset: *mut c_int,
    maxOffset: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpcClkMinMaxVfOffset");
    no_offset_range(device, minOffset, maxOffset)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemClkMinMaxVfOffset(
    device: nvmlDevice_t,
    minOffset: *mut c_int,
    maxOffset: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemClkMinMaxVfOffset");
    no_offset_range(device, minOffset, maxOffset)
}

/// The GPU's interrupt line: a made-up but stable number per GPU (the host assigns it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIrqNum(
    device: nvmlDevice_t,
    irqNum: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetIrqNum");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(irqNum) };
    device_call(device, |d| {
        d.whole_gpu()?;
        out.set(IRQ_BASE + d.index)
    })
}

/// First interrupt line of the simulated GPUs (the real H100 VM's GPU had 41).
const IRQ_BASE: c_uint = 41;

/// The per-GPU identifier: a hash of the GPU's UUID, stable across runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPdi(
    device: nvmlDevice_t,
    pdi: *mut nvmlPdi_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPdi");
    // SAFETY: NVML contract: null or valid for one struct whose version the caller set.
    let io = unsafe { InOut::new(pdi) };
    device_call(device, |d| {
        d.whole_gpu()?;
        // FNV-1a: stable across runs and Rust versions, unlike `DefaultHasher`.
        let hash = d.gpu.uuid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        io.get()?.value = hash;
        Ok(())
    })
}

/// Data-centre boards run on AC (`NVML_POWER_SOURCE_AC`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerSource(
    device: nvmlDevice_t,
    powerSource: *mut nvmlPowerSource_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerSource");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(powerSource) };
    device_call(device, |d| {
        d.whole_gpu()?;
        out.set(0)
    })
}

/// No channel or TPC repair pending (the model has no repair events).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRepairStatus(
    device: nvmlDevice_t,
    repairStatus: *mut nvmlRepairStatus_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRepairStatus");
    // SAFETY: NVML contract: null or valid for one struct whose version the caller set.
    let io = unsafe { InOut::new(repairStatus) };
    device_call(device, |d| {
        d.whole_gpu()?;
        let v = io.get()?;
        v.bChannelRepairPending = 0;
        v.bTpcRepairPending = 0;
        Ok(())
    })
}

/// `nvmlUnrepairableMemoryStatus_v1_t` (one `unsigned int`), not in the bindings.
#[repr(C)]
pub struct UnrepairableMemoryStatusV1 {
    b_unrepairable_memory: c_uint,
}

/// No unrepairable memory (the model has no such fault).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUnrepairableMemoryFlag_v1(
    device: nvmlDevice_t,
    data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetUnrepairableMemoryFlag_v1");
    // SAFETY: NVML contract: `data` is null or valid for one
    // `nvmlUnrepairableMemoryStatus_v1_t`.
    let out = unsafe { Out::new(data.cast::<UnrepairableMemoryStatusV1>()) };
    device_call(device, |d| {
        d.whole_gpu()?;
        out.set(UnrepairableMemoryStatusV1 {
            b_unrepairable_memory: 0,
        })
    })
}

/// The black-box recorder has not flushed yet on a freshly loaded driver: `NOT_READY`,
/// the real H100's answer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetLastBBXFlushTime(
    device: nvmlDevice_t,
    _timestamp: *mut c_ulonglong,
    _durationUs: *mut c_ulong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetLastBBXFlushTime");
    device_call(device, |_| Err(nvmlReturn_enum_NVML_ERROR_NOT_READY))
}

/// No licensable (vGPU/vWS) feature: the struct zeroed, `isGridLicenseSupported` 0,
/// as a GPU without a vGPU licence answers.
///
/// # Safety
/// `features` is null or valid for one `nvmlGridLicensableFeatures_t`.
unsafe fn no_licensable_features(
    device: nvmlDevice_t,
    features: *mut nvmlGridLicensableFeatures_t,
) -> nvmlReturn_t {
    // SAFETY: per this function's contract.
    let out = unsafe { Out::new(features) };
    device_call(device, |d| {
        d.whole_gpu()?;
        // SAFETY: a plain C struct of integers and character arrays: all-zero is valid.
        unsafe { out.set_zeroed(|_| {}) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGridLicensableFeatures(
    device: nvmlDevice_t,
    pGridLicensableFeatures: *mut nvmlGridLicensableFeatures_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGridLicensableFeatures");
    // SAFETY: NVML contract: null or valid for one struct.
    unsafe { no_licensable_features(device, pGridLicensableFeatures) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGridLicensableFeatures_v2(
    device: nvmlDevice_t,
    pGridLicensableFeatures: *mut nvmlGridLicensableFeatures_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGridLicensableFeatures_v2");
    // SAFETY: NVML contract: null or valid for one struct.
    unsafe { no_licensable_features(device, pGridLicensableFeatures) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGridLicensableFeatures_v3(
    device: nvmlDevice_t,
    pGridLicensableFeatures: *mut nvmlGridLicensableFeatures_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGridLicensableFeatures_v3");
    // SAFETY: NVML contract: null or valid for one struct.
    unsafe { no_licensable_features(device, pGridLicensableFeatures) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGridLicensableFeatures_v4(
    device: nvmlDevice_t,
    pGridLicensableFeatures: *mut nvmlGridLicensableFeatures_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGridLicensableFeatures_v4");
    // SAFETY: NVML contract: null or valid for one struct.
    unsafe { no_licensable_features(device, pGridLicensableFeatures) }
}

/// The vGPU guest-driver versions this host driver could serve: the real 580.159.04's
/// range, 0x120001 to 0x1A0001 (any driver answers, vGPU manager or not).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetVgpuVersion(
    supported: *mut nvmlVgpuVersion_t,
    current: *mut nvmlVgpuVersion_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGetVgpuVersion");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (s, c) = unsafe { (Out::new(supported), Out::new(current)) };
    crate::state::system_call(|_, _| {
        let range = nvmlVgpuVersion_t {
            minVersion: 0x12_0001,
            maxVersion: 0x1A_0001,
        };
        s.set(range)?;
        c.set(range)
    })
}

/// The confidential-computing key-rotation threshold: attacker advantage 60, the real
/// driver's default (answered with confidential computing off).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetConfComputeKeyRotationThresholdInfo(
    pKeyRotationThrInfo: *mut nvmlConfComputeGetKeyRotationThresholdInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetConfComputeKeyRotationThresholdInfo");
    // SAFETY: NVML contract: null or valid for one struct whose version the caller set.
    let io = unsafe { InOut::new(pKeyRotationThrInfo) };
    crate::state::system_call(|_, _| {
        io.get()?.attackerAdvantage = 60;
        Ok(())
    })
}

/// NVLink bandwidth mode 0 (full), which the driver reports with or without links.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNvlinkBwMode(nvlinkBwMode: *mut c_uint) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetNvlinkBwMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(nvlinkBwMode) };
    crate::state::system_call(|_, _| out.set(0))
}
