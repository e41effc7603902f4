//! Library lifetime, system queries and device enumeration.

use crate::device::parse_bus_id;
use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, CBuf, INSUFFICIENT_SIZE, INVALID_ARGUMENT, InOut, NOT_FOUND, Out,
    error_text, fill_list, guard, in_str, put_array_str, struct_version,
};
use crate::state::{self, handle, system_call};
use nvml_wrapper_sys::bindings::*;
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
    system_call(|sim, _| out.set(sim.gpu_count as c_uint))
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
        if index >= sim.gpu_count {
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

/// The handle of the GPU or MIG device with this UUID (ASCII case-insensitive).
fn by_uuid(sim: &state::Sim, uuid: &str) -> Option<nvmlDevice_t> {
    let listed = &sim.node.gpus[..sim.gpu_count as usize];
    listed.iter().enumerate().find_map(|(i, g)| {
        if g.uuid.eq_ignore_ascii_case(uuid) {
            return Some(handle(i as u32, None));
        }
        let m = g
            .mig
            .iter()
            .position(|m| m.uuid.eq_ignore_ascii_case(uuid))?;
        crate::devices::with(|d| d.mig_exists(i as u32, m)).then(|| handle(i as u32, Some(m)))
    })
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
        out.set(by_uuid(sim, uuid).ok_or(NOT_FOUND)?)
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
        let i = sim.node.gpus[..sim.gpu_count as usize]
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

/// The GPU with this board serial.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHandleBySerial");
    // SAFETY: NVML contract: `serial` is null or a NUL-terminated string.
    let wanted = unsafe { in_str(serial) };
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(device) };
    system_call(|sim, _| {
        let wanted = wanted.ok_or(INVALID_ARGUMENT)?;
        let i = sim.node.gpus[..sim.gpu_count as usize]
            .iter()
            .position(|g| g.serial == wanted)
            .ok_or(NOT_FOUND)?;
        out.set(handle(i as u32, None))
    })
}

/// No GPU is excluded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetExcludedDeviceCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    crate::calls::count!("nvmlGetExcludedDeviceCount");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(deviceCount) };
    system_call(|_, _| out.set(0))
}

/// No GPU is excluded, so every index is out of range.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetExcludedDeviceInfoByIndex(
    _index: c_uint,
    _info: *mut nvmlExcludedDeviceInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGetExcludedDeviceInfoByIndex");
    system_call(|_, _| Err(INVALID_ARGUMENT))
}

/// The CPU has no confidential-computing support; the GPUs (Hopper) are capable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetConfComputeCapabilities(
    capabilities: *mut nvmlConfComputeSystemCaps_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetConfComputeCapabilities");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(capabilities) };
    system_call(|_, _| {
        out.set(nvmlConfComputeSystemCaps_t {
            cpuCaps: NVML_CC_SYSTEM_CPU_CAPS_NONE,
            gpusCaps: NVML_CC_SYSTEM_GPUS_CC_CAPABLE,
        })
    })
}

/// Confidential computing off: the ready state is not set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetConfComputeGpusReadyState(
    isAcceptingWork: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetConfComputeGpusReadyState");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(isAcceptingWork) };
    system_call(|_, _| out.set(NVML_CC_ACCEPTING_CLIENT_REQUESTS_FALSE))
}

/// Confidential computing off; the version word must be `nvmlSystemConfComputeSettings_v1`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetConfComputeSettings(
    settings: *mut nvmlSystemConfComputeSettings_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetConfComputeSettings");
    // SAFETY: NVML contract: `settings` is null or valid for one struct whose version word the caller set.
    let io = unsafe { InOut::new(settings) };
    system_call(|_, _| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlSystemConfComputeSettings_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        v.environment = NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE;
        v.ccFeature = NVML_CC_SYSTEM_FEATURE_DISABLED;
        v.devToolsMode = NVML_CC_SYSTEM_DEVTOOLS_MODE_OFF;
        v.multiGpuMode = NVML_CC_SYSTEM_MULTIGPU_NONE;
        Ok(())
    })
}

/// Confidential computing off.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetConfComputeState(
    state: *mut nvmlConfComputeSystemState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetConfComputeState");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(state) };
    system_call(|_, _| {
        out.set(nvmlConfComputeSystemState_t {
            environment: NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE,
            ccFeature: NVML_CC_SYSTEM_FEATURE_DISABLED,
            devToolsMode: NVML_CC_SYSTEM_DEVTOOLS_MODE_OFF,
        })
    })
}

/// The branch of the driver version (`r580_00` for 580.x).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverBranch(
    branchInfo: *mut nvmlSystemDriverBranchInfo_t,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetDriverBranch");
    // SAFETY: NVML contract: `branchInfo` is null or valid for one struct.
    let io = unsafe { InOut::new(branchInfo) };
    system_call(|sim, _| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlSystemDriverBranchInfo_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        if (length as usize) < v.branch.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        let major = sim
            .node
            .driver_version
            .split('.')
            .next()
            .unwrap_or_default();
        put_array_str(&mut v.branch, &format!("r{major}_00"));
        Ok(())
    })
}

/// No host interface cards on an HGX node.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetHicVersion(
    hwbcCount: *mut c_uint,
    hwbcEntries: *mut nvmlHwbcEntry_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetHicVersion");
    system_call(|_, _| {
        // SAFETY: NVML contract: `hwbcCount` is valid and `hwbcEntries` is null or holds `*hwbcCount` entries.
        unsafe { fill_list::<nvmlHwbcEntry_t>(hwbcCount, hwbcEntries, &[]) }
    })
}

/// ASCII (`GPU-…`, `MIG-…`) and binary (16 bytes of a GPU UUID) forms; the version word
/// must be `nvmlUUID_v1`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUIDV(
    uuid: *const nvmlUUID_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHandleByUUIDV");
    // SAFETY: NVML contract: `uuid` is null or points to an initialised struct.
    let wanted = unsafe { uuid.as_ref() };
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(device) };
    system_call(|sim, _| {
        let wanted = wanted.ok_or(INVALID_ARGUMENT)?;
        if wanted.version != struct_version::<nvmlUUID_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let text = match wanted.type_ {
            nvmlUUIDType_t_NVML_UUID_TYPE_ASCII => {
                // SAFETY: the caller set the ASCII member, as its type says.
                let s = unsafe { wanted.value.str_ };
                let bytes: Vec<u8> = s
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8(bytes).map_err(|_| INVALID_ARGUMENT)?
            }
            nvmlUUIDType_t_NVML_UUID_TYPE_BINARY => {
                // SAFETY: the caller set the binary member, as its type says.
                let b = unsafe { wanted.value.bytes };
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                format!(
                    "GPU-{}-{}-{}-{}-{}",
                    &hex[..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..]
                )
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        out.set(by_uuid(sim, &text).ok_or(NOT_FOUND)?)
    })
}
