//! Library lifetime, system queries and device enumeration.

use crate::device::parse_bus_id;
use crate::ffi::{CBuf, INVALID_ARGUMENT, NOT_FOUND, Out, error_text, guard, in_str};
use crate::state::{self, handle, system_call};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};
use std::ffi::{c_char, c_int, c_uint};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    crate::calls::count!("nvmlInit_v2");
    guard(state::init)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    crate::calls::count!("nvmlInit");
    guard(state::init)
}

/// `NVML_INIT_FLAG_NO_GPUS` and `NVML_INIT_FLAG_NO_ATTACH` are accepted and change nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    crate::calls::count!("nvmlInitWithFlags");
    guard(state::init)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    crate::calls::count!("nvmlShutdown");
    guard(state::shutdown)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    crate::calls::count!("nvmlErrorString");
    error_text(result).as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetDriverVersion");
    // SAFETY: NVML contract: `version` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(version, length) };
    system_call(|sim, _| buf.put_str(&sim.node.driver_version))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetNVMLVersion");
    // SAFETY: NVML contract: `version` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(version, length) };
    system_call(|sim, _| buf.put_str(&sim.node.nvml_version))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetCudaDriverVersion");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(cudaDriverVersion) };
    system_call(|sim, _| out.set(sim.node.cuda_driver_version))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetCudaDriverVersion_v2");
    // SAFETY: same contract as the unversioned function.
    unsafe { nvmlSystemGetCudaDriverVersion(cudaDriverVersion) }
}

/// Names of the scenario's processes; any other PID is `NOT_FOUND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetProcessName");
    // SAFETY: NVML contract: `name` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(name, length) };
    system_call(|sim, _| buf.put_str(sim.node.process_name(pid).ok_or(NOT_FOUND)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCount_v2");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(deviceCount) };
    system_call(|sim, _| out.set(sim.node.gpus.len() as c_uint))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCount");
    // SAFETY: same contract as the versioned function.
    unsafe { nvmlDeviceGetCount_v2(deviceCount) }
}

/// Handle lookups succeed for a lost GPU too; every call on the handle then fails with
/// `GPU_IS_LOST`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHandleByIndex_v2");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(device) };
    system_call(|sim, _| {
        if index as usize >= sim.node.gpus.len() {
            return Err(INVALID_ARGUMENT);
        }
        out.set(handle(index, None))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHandleByIndex");
    // SAFETY: same contract as the versioned function.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// Accepts `GPU-…` and `MIG-…` UUIDs (ASCII case-insensitive).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHandleByUUID");
    // SAFETY: NVML contract: `uuid` is null or a NUL-terminated string.
    let uuid = unsafe { in_str(uuid) };
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(device) };
    system_call(|sim, _| {
        let uuid = uuid.ok_or(INVALID_ARGUMENT)?;
        let found = sim.node.gpus.iter().enumerate().find_map(|(i, g)| {
            if g.uuid.eq_ignore_ascii_case(uuid) {
                return Some(handle(i as u32, None));
            }
            let m = g
                .mig
                .iter()
                .position(|m| m.uuid.eq_ignore_ascii_case(uuid))?;
            Some(handle(i as u32, Some(m)))
        });
        out.set(found.ok_or(NOT_FOUND)?)
    })
}

/// Accepts `DDDDDDDD:BB:DD.F`, the legacy `DDDD:BB:DD.F` and `BB:DD.F`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHandleByPciBusId_v2");
    // SAFETY: NVML contract: `pciBusId` is null or a NUL-terminated string.
    let wanted = unsafe { in_str(pciBusId) };
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(device) };
    system_call(|sim, _| {
        let wanted = wanted.and_then(parse_bus_id).ok_or(INVALID_ARGUMENT)?;
        let i = sim
            .node
            .gpus
            .iter()
            .position(|g| parse_bus_id(&g.pci_bus_id) == Some(wanted))
            .ok_or(NOT_FOUND)?;
        out.set(handle(i as u32, None))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHandleByPciBusId");
    // SAFETY: same contract as the versioned function.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device) }
}
