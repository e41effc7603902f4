//! Running processes and per-process utilisation (two-call protocol).

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, InOut, NOT_FOUND, NOT_SUPPORTED, Ret, fill_list,
    struct_version,
};
use crate::state::{Dev, device_call};
use gpu_sim::{Capability, ProcessReading};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};
use std::time::{SystemTime, UNIX_EPOCH};

/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned GPU-/compute-instance ID.
pub const NO_ID: u32 = u32::MAX;

/// `nvmlProcessDetailList_t.mode` values (`NVML_PROCESS_MODE_*`, not in the bindings).
pub const NVML_PROCESS_MODE_COMPUTE: u32 = 0;
pub const NVML_PROCESS_MODE_GRAPHICS: u32 = 1;
pub const NVML_PROCESS_MODE_MPS: u32 = 2;

/// The processes of the GPU or MIG instance behind the handle. On a MIG-enabled GPU
/// this is every instance's processes, each with its instance IDs.
fn processes(d: &Dev) -> Result<Vec<ProcessReading>, nvmlReturn_t> {
    d.require(Capability::Processes)?;
    Ok(match d.mig {
        Some(m) => d.node().mig_processes(d.index, m, d.t),
        None => d.node().gpu_processes(d.index, d.t),
    })
}

fn detail(p: &ProcessReading) -> nvmlProcessDetail_v1_t {
    nvmlProcessDetail_v1_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory_bytes,
        gpuInstanceId: p.gpu_instance_id.unwrap_or(NO_ID),
        computeInstanceId: p.compute_instance_id.unwrap_or(NO_ID),
        usedGpuCcProtectedMemory: 0,
    }
}

/// Per-process utilisation samples newer than `last_seen` (µs): one per process of a
/// whole, non-MIG GPU, stamped with the real wall clock.
fn utilization_samples(
    d: &Dev,
    last_seen: u64,
) -> Result<Vec<nvmlProcessUtilizationSample_t>, Ret> {
    d.reading(Capability::Utilization)?
        .gpu_util_percent
        .ok_or(NOT_SUPPORTED)?;
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |w| w.as_micros() as u64);
    if now_us <= last_seen {
        return Err(NOT_FOUND);
    }
    let samples: Vec<_> = processes(d)?
        .iter()
        .map(|p| nvmlProcessUtilizationSample_t {
            pid: p.pid,
            timeStamp: now_us,
            smUtil: p.sm_util_percent,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
        })
        .collect();
    // No sample since `last_seen` (no process, or none newer) is `NOT_FOUND`, not an
    // empty list: the real driver's answer (H100, 580.159.04, no process running).
    if samples.is_empty() {
        return Err(NOT_FOUND);
    }
    Ok(samples)
}

fn info(p: &ProcessReading) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory_bytes,
        gpuInstanceId: p.gpu_instance_id.unwrap_or(NO_ID),
        computeInstanceId: p.compute_instance_id.unwrap_or(NO_ID),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetComputeRunningProcesses_v3");
    device_call(device, |d| {
        let list: Vec<_> = processes(d)?.iter().map(info).collect();
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds
        // `*infoCount` entries.
        unsafe { fill_list(infoCount, infos, &list) }
    })
}

/// Same struct as `_v3` (`nvmlProcessInfo_v2_t`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetComputeRunningProcesses_v2");
    // SAFETY: same contract and struct as `_v3`.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, infoCount, infos) }
}

/// The original call: `nvmlProcessInfo_v1_t` (pid and memory only).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetComputeRunningProcesses");
    device_call(device, |d| {
        let list: Vec<_> = processes(d)?
            .iter()
            .map(|p| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory_bytes,
            })
            .collect();
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds
        // `*infoCount` entries.
        unsafe { fill_list(infoCount, infos, &list) }
    })
}

/// One sample per process of a whole, non-MIG GPU: `smUtil` is the process's share of
/// the GPU's utilisation; memory, encoder and decoder shares are not modelled (0).
/// Sample timestamps are the real wall clock (µs), so a client passing its last seen
/// timestamp keeps getting samples even when scenario time is frozen.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    processSamplesCount: *mut c_uint,
    lastSeenTimeStamp: c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetProcessUtilization");
    device_call(device, |d| {
        let samples = utilization_samples(d, lastSeenTimeStamp)?;
        // SAFETY: NVML contract: `processSamplesCount` is valid and `utilization` is
        // null or holds `*processSamplesCount` entries.
        unsafe { fill_list(processSamplesCount, utilization, &samples) }
    })
}

/// The model runs compute work only, outside MPS: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGraphicsRunningProcesses");
    device_call(device, |d| {
        processes(d)?;
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds `*infoCount` entries.
        unsafe { fill_list::<nvmlProcessInfo_v1_t>(infoCount, infos, &[]) }
    })
}

/// The model runs compute work only, outside MPS: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGraphicsRunningProcesses_v2");
    device_call(device, |d| {
        processes(d)?;
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds `*infoCount` entries.
        unsafe { fill_list::<nvmlProcessInfo_v2_t>(infoCount, infos, &[]) }
    })
}

/// The model runs compute work only, outside MPS: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGraphicsRunningProcesses_v3");
    device_call(device, |d| {
        processes(d)?;
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds `*infoCount` entries.
        unsafe { fill_list::<nvmlProcessInfo_t>(infoCount, infos, &[]) }
    })
}

/// The model runs compute work only, outside MPS: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMPSComputeRunningProcesses");
    device_call(device, |d| {
        processes(d)?;
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds `*infoCount` entries.
        unsafe { fill_list::<nvmlProcessInfo_v1_t>(infoCount, infos, &[]) }
    })
}

/// The model runs compute work only, outside MPS: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMPSComputeRunningProcesses_v2");
    device_call(device, |d| {
        processes(d)?;
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds `*infoCount` entries.
        unsafe { fill_list::<nvmlProcessInfo_v2_t>(infoCount, infos, &[]) }
    })
}

/// The model runs compute work only, outside MPS: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMPSComputeRunningProcesses_v3");
    device_call(device, |d| {
        processes(d)?;
        // SAFETY: NVML contract: `infoCount` is valid and `infos` is null or holds `*infoCount` entries.
        unsafe { fill_list::<nvmlProcessInfo_t>(infoCount, infos, &[]) }
    })
}

/// The samples of `nvmlDeviceGetProcessUtilization` in the versioned struct (which
/// must be `nvmlProcessesUtilizationInfo_v1`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(
    device: nvmlDevice_t,
    procesesUtilInfo: *mut nvmlProcessesUtilizationInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetProcessesUtilizationInfo");
    // SAFETY: NVML contract: `procesesUtilInfo` is null or valid for one struct whose version,
    // count, timestamp and array the caller set.
    let io = unsafe { InOut::new(procesesUtilInfo) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlProcessesUtilizationInfo_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let list: Vec<nvmlProcessUtilizationInfo_v1_t> =
            utilization_samples(d, v.lastSeenTimeStamp)?
                .into_iter()
                .map(|s| nvmlProcessUtilizationInfo_v1_t {
                    timeStamp: s.timeStamp,
                    pid: s.pid,
                    smUtil: s.smUtil,
                    memUtil: s.memUtil,
                    encUtil: s.encUtil,
                    decUtil: s.decUtil,
                    jpgUtil: 0,
                    ofaUtil: 0,
                })
                .collect();
        // SAFETY: NVML contract: `procUtilArray` is null or holds `processSamplesCount` entries.
        unsafe { fill_list(&mut v.processSamplesCount, v.procUtilArray, &list) }
    })
}

/// Compute processes (with instance IDs) for `NVML_PROCESS_MODE_COMPUTE`; none for
/// graphics and MPS. Two-call protocol on `numProcArrayEntries`; the version word must
/// be `nvmlProcessDetailList_v1`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    device: nvmlDevice_t,
    plist: *mut nvmlProcessDetailList_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRunningProcessDetailList");
    // SAFETY: NVML contract: `plist` is null or valid for one struct whose version, mode,
    // count and array the caller set.
    let io = unsafe { InOut::new(plist) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlProcessDetailList_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let all = processes(d)?;
        let list: Vec<nvmlProcessDetail_v1_t> = match v.mode {
            NVML_PROCESS_MODE_COMPUTE => all.iter().map(detail).collect(),
            NVML_PROCESS_MODE_GRAPHICS | NVML_PROCESS_MODE_MPS => Vec::new(),
            _ => return Err(INVALID_ARGUMENT),
        };
        // SAFETY: NVML contract: `procArray` is null or holds `numProcArrayEntries` entries.
        unsafe { fill_list(&mut v.numProcArrayEntries, v.procArray, &list) }
    })
}
