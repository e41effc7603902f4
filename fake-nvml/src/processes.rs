//! Running processes and per-process utilisation (two-call protocol).

use crate::ffi::{NOT_SUPPORTED, fill_list};
use crate::state::{Dev, device_call};
use gpu_sim::{Capability, ProcessReading};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};
use std::time::{SystemTime, UNIX_EPOCH};

/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned GPU-/compute-instance ID.
pub const NO_ID: u32 = u32::MAX;

/// The processes of the GPU or MIG instance behind the handle. On a MIG-enabled GPU
/// this is every instance's processes, each with its instance IDs.
fn processes(d: &Dev) -> Result<Vec<ProcessReading>, nvmlReturn_t> {
    d.require(Capability::Processes)?;
    Ok(match d.mig {
        Some(m) => d.node().mig_processes(d.index, m, d.t),
        None => d.node().gpu_processes(d.index, d.t),
    })
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
        d.reading(Capability::Utilization)?
            .gpu_util_percent
            .ok_or(NOT_SUPPORTED)?;
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |w| w.as_micros() as u64);
        let samples: Vec<_> = if now_us > lastSeenTimeStamp {
            processes(d)?
                .iter()
                .map(|p| nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: now_us,
                    smUtil: p.sm_util_percent,
                    memUtil: 0,
                    encUtil: 0,
                    decUtil: 0,
                })
                .collect()
        } else {
            Vec::new()
        };
        // SAFETY: NVML contract: `processSamplesCount` is valid and `utilization` is
        // null or holds `*processSamplesCount` entries.
        unsafe { fill_list(processSamplesCount, utilization, &samples) }
    })
}
