//! NVML calls nvml-wrapper does not wrap (or wraps lossily), made through `nvml.lib()`.
//! Each symbol is looked up at call time; a driver without it answers NOT_SUPPORTED.

use super::map_err;
use crate::source::{GiPlacement, Raw, ReadError};
use nvml_wrapper::Nvml;
use nvml_wrapper::error::nvml_try;
use nvml_wrapper::gpm::GpmSample;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlFieldValue_t, nvmlGpmSample_t,
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGridLicensableFeatures_t, nvmlProcessInfo_t,
    nvmlProcessUtilizationSample_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};
use std::os::raw::c_uint;

/// A symbol this driver does not export.
fn missing<E>(_: E) -> ReadError {
    ReadError::NotSupported
}

/// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a MIG handle.
pub fn instance_ids(nvml: &Nvml, device: nvmlDevice_t) -> Result<(u32, u32), ReadError> {
    let lib = nvml.lib();
    let gi_sym = lib.nvmlDeviceGetGpuInstanceId.as_ref().map_err(missing)?;
    let ci_sym = lib
        .nvmlDeviceGetComputeInstanceId
        .as_ref()
        .map_err(missing)?;
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: `device` is a live handle of this NVML instance; `gi` is a valid out-pointer.
    nvml_try(unsafe { gi_sym(device, &mut gi) }).map_err(map_err)?;
    // SAFETY: as above, for `ci`.
    nvml_try(unsafe { ci_sym(device, &mut ci) }).map_err(map_err)?;
    Ok((gi, ci))
}

/// The profile ID and placement of GPU instance `gpu_instance` of `parent`
/// (`nvmlDeviceGetGpuInstanceById`, then `nvmlGpuInstanceGetInfo`).
pub fn gpu_instance_placement(
    nvml: &Nvml,
    parent: nvmlDevice_t,
    gpu_instance: u32,
) -> Result<GiPlacement, ReadError> {
    let lib = nvml.lib();
    let by_id = lib.nvmlDeviceGetGpuInstanceById.as_ref().map_err(missing)?;
    let get_info = lib.nvmlGpuInstanceGetInfo.as_ref().map_err(missing)?;
    let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `parent` is a live handle of this NVML instance; `handle` is a valid
    // out-pointer.
    nvml_try(unsafe { by_id(parent, gpu_instance, &mut handle) }).map_err(map_err)?;
    // SAFETY: nvmlGpuInstanceInfo_t is plain old data; all-zero is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `handle` was just returned by NVML; `info` is a valid out-pointer.
    nvml_try(unsafe { get_info(handle, &mut info) }).map_err(map_err)?;
    Ok(GiPlacement {
        profile_id: info.profileId,
        start: info.placement.start,
        size: info.placement.size,
    })
}

/// `nvmlShutdown` then `nvmlInit_v2` on the loaded library.
pub fn reinit(nvml: &Nvml) -> Result<(), ReadError> {
    let lib = nvml.lib();
    let init = lib.nvmlInit_v2.as_ref().map_err(missing)?;
    if let Ok(shutdown) = lib.nvmlShutdown.as_ref() {
        // SAFETY: no handle of the previous initialisation is used after this point:
        // the caller rediscovers every device. The result is ignored: a vanished driver
        // may refuse to shut down.
        let _ = unsafe { shutdown() };
    }
    // SAFETY: plain initialisation call with no arguments.
    nvml_try(unsafe { init() })
        .map_err(|e| ReadError::Unavailable(format!("NVML re-initialisation failed: {e}")))
}

/// A field value request: (field ID, scope ID).
pub type FieldRequest = (u32, u32);

/// `nvmlDeviceGetFieldValues` with scope IDs (nvml-wrapper never sets `scopeId`, which
/// per-link and all-links NVLink fields need). One result per request, in order.
pub fn field_values(
    nvml: &Nvml,
    device: nvmlDevice_t,
    requests: &[FieldRequest],
) -> Result<Vec<Result<Raw, ReadError>>, ReadError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(missing)?;
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .map(|&(field, scope)| {
            // SAFETY: nvmlFieldValue_t is plain old data; all-zero is a valid value.
            let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = field;
            v.scopeId = scope;
            v
        })
        .collect();
    let count =
        i32::try_from(values.len()).map_err(|_| ReadError::Failed("too many fields".into()))?;
    // SAFETY: `values` holds `count` initialised entries that NVML fills in place.
    nvml_try(unsafe { sym(device, count, values.as_mut_ptr()) }).map_err(map_err)?;
    Ok(values
        .iter()
        .map(|v| {
            nvml_try(v.nvmlReturn).map_err(map_err)?;
            // SAFETY: `valueType` says which union member NVML wrote.
            Ok(unsafe {
                match v.valueType {
                    0 => Raw::F64(v.value.dVal),
                    1 => Raw::U64(u64::from(v.value.uiVal)),
                    2 => Raw::U64(v.value.ulVal),
                    3 => Raw::U64(v.value.ullVal),
                    4 => Raw::U64(v.value.sllVal.max(0) as u64),
                    5 => Raw::U64(v.value.siVal.max(0) as u64),
                    other => return Err(ReadError::Failed(format!("field value type {other}"))),
                }
            })
        })
        .collect())
}

/// One event from `nvmlEventSetWait_v2`, keeping the MIG instance IDs nvml-wrapper drops.
pub struct RawEvent {
    pub device: usize,
    pub event_type: u64,
    pub data: u64,
    pub gpu_instance_id: u32,
}

/// Wait up to `timeout_ms` for an event; `Ok(None)` on timeout.
pub fn wait_event(
    nvml: &Nvml,
    set: nvmlEventSet_t,
    timeout_ms: u32,
) -> Result<Option<RawEvent>, ReadError> {
    let sym = nvml.lib().nvmlEventSetWait_v2.as_ref().map_err(missing)?;
    // SAFETY: nvmlEventData_t is plain old data; all-zero is a valid value.
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live event set of this NVML instance; `data` is a valid out-pointer.
    match nvml_try(unsafe { sym(set, &mut data, timeout_ms) }) {
        Ok(()) => Ok(Some(RawEvent {
            device: data.device as usize,
            event_type: data.eventType,
            data: data.eventData,
            gpu_instance_id: data.gpuInstanceId,
        })),
        Err(nvml_wrapper::error::NvmlError::Timeout) => Ok(None),
        Err(e) => Err(map_err(e)),
    }
}

/// What the driver says of a device's vGPU licensing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VgpuLicence {
    /// Bare metal: no licensing (`NOT_SUPPORTED`, no licensable features, or a driver
    /// without the call). DCGM reports the licence state as 0.
    NotAGuest,
    /// A vGPU guest: whether a licensable feature is licensed.
    Guest { licensed: bool },
}

pub fn vgpu_licence(nvml: &Nvml, device: nvmlDevice_t) -> Result<VgpuLicence, ReadError> {
    let Ok(sym) = nvml.lib().nvmlDeviceGetGridLicensableFeatures_v4.as_ref() else {
        return Ok(VgpuLicence::NotAGuest);
    };
    // SAFETY: plain old data; all-zero is a valid value.
    let mut f: nvmlGridLicensableFeatures_t = unsafe { std::mem::zeroed() };
    // SAFETY: live handle, valid out-pointer.
    let rc = unsafe { sym(device, &mut f) };
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return match map_err(nvml_wrapper::error::NvmlError::from(rc)) {
            ReadError::NotSupported => Ok(VgpuLicence::NotAGuest),
            e => Err(e),
        };
    }
    if f.isGridLicenseSupported == 0 {
        return Ok(VgpuLicence::NotAGuest);
    }
    let n = (f.licensableFeaturesCount as usize).min(f.gridLicensableFeatures.len());
    Ok(VgpuLicence::Guest {
        licensed: f.gridLicensableFeatures[..n]
            .iter()
            .any(|x| x.featureState > 0),
    })
}

/// A GPM sample allocated once through `nvmlGpmSampleAlloc` and reused every cycle
/// (nvml-wrapper only allocates a fresh sample per reading). The wrapper frees it on drop.
pub fn gpm_sample_alloc(nvml: &'static Nvml) -> Result<GpmSample<'static>, ReadError> {
    let sym = nvml.lib().nvmlGpmSampleAlloc.as_ref().map_err(missing)?;
    let mut sample: nvmlGpmSample_t = std::ptr::null_mut();
    // SAFETY: `sample` is a valid out-pointer for the new sample's handle.
    nvml_try(unsafe { sym(&mut sample) }).map_err(map_err)?;
    // SAFETY: just allocated by this library and owned by nothing else; the wrapper
    // becomes its only owner and frees it once.
    Ok(unsafe { GpmSample::from_handle(nvml, sample) })
}

/// Fill `sample` with the GPU's counters now (`nvmlGpmSampleGet`), or a MIG instance's
/// (`nvmlGpmMigSampleGet` on the physical GPU with its GPU-instance ID).
pub fn gpm_sample_get(
    nvml: &Nvml,
    gpu: nvmlDevice_t,
    gpu_instance: Option<u32>,
    sample: &GpmSample<'_>,
) -> Result<(), ReadError> {
    let lib = nvml.lib();
    // SAFETY: borrowed only for this call; `sample` keeps owning it.
    let handle = unsafe { sample.handle() };
    let rc = match gpu_instance {
        None => {
            let sym = lib.nvmlGpmSampleGet.as_ref().map_err(missing)?;
            // SAFETY: `gpu` is a live handle of this NVML instance and `handle` a live sample.
            unsafe { sym(gpu, handle) }
        }
        Some(gi) => {
            let sym = lib.nvmlGpmMigSampleGet.as_ref().map_err(missing)?;
            // SAFETY: as above; `gi` is a GPU-instance ID of `gpu`.
            unsafe { sym(gpu, gi, handle) }
        }
    };
    nvml_try(rc).map_err(map_err)
}

/// Call a `(device, count, buffer)` list getter once with `buffer` (kept across cycles,
/// so normally large enough), and again only when NVML says it is too small: nvml-wrapper
/// always makes two calls, the count and then the list. Returns how many entries of
/// `buffer` NVML filled; the buffer keeps its size for the next cycle.
fn list_into<T: Copy>(
    buffer: &mut Vec<T>,
    zero: T,
    mut call: impl FnMut(&mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<usize, ReadError> {
    if buffer.is_empty() {
        buffer.resize(8, zero);
    }
    for _ in 0..3 {
        let mut count = c_uint::try_from(buffer.len()).unwrap_or(c_uint::MAX);
        let rc = call(&mut count, buffer.as_mut_ptr());
        if rc == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE {
            // Room for a few more entries that appear before the next call.
            buffer.resize(count as usize + 8, zero);
            continue;
        }
        if rc == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
            // Process utilisation: no sample since the last seen timestamp.
            return Ok(0);
        }
        nvml_try(rc).map_err(map_err)?;
        return Ok((count as usize).min(buffer.len()));
    }
    Err(ReadError::Failed("the list keeps growing".into()))
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` into `buffer`, in one call when it fits.
pub fn compute_processes(
    nvml: &Nvml,
    device: nvmlDevice_t,
    buffer: &mut Vec<nvmlProcessInfo_t>,
) -> Result<usize, ReadError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetComputeRunningProcesses_v3
        .as_ref()
        .map_err(missing)?;
    // SAFETY: plain old data; all-zero is a valid value.
    let zero: nvmlProcessInfo_t = unsafe { std::mem::zeroed() };
    list_into(buffer, zero, |count, infos| {
        // SAFETY: `device` is a live handle of this NVML instance; `infos` holds `*count`
        // entries (`list_into` passes its buffer's length).
        unsafe { sym(device, count, infos) }
    })
}

/// `nvmlDeviceGetProcessUtilization` since `last_seen` (µs) into `buffer`, in one call
/// when it fits; no sample since then is an empty list.
pub fn process_utilization(
    nvml: &Nvml,
    device: nvmlDevice_t,
    last_seen: u64,
    buffer: &mut Vec<nvmlProcessUtilizationSample_t>,
) -> Result<usize, ReadError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetProcessUtilization
        .as_ref()
        .map_err(missing)?;
    // SAFETY: plain old data; all-zero is a valid value.
    let zero: nvmlProcessUtilizationSample_t = unsafe { std::mem::zeroed() };
    list_into(buffer, zero, |count, samples| {
        // SAFETY: as in `compute_processes`.
        unsafe { sym(device, samples, count, last_seen) }
    })
}

/// `nvmlDeviceGetFanSpeed`: the first fan's speed, percent, as DCGM reads
/// `DCGM_FI_DEV_FAN_SPEED` (nvml-wrapper only wraps the per-fan `_v2`).
pub fn fan_speed(nvml: &Nvml, device: nvmlDevice_t) -> Result<u32, ReadError> {
    let sym = nvml.lib().nvmlDeviceGetFanSpeed.as_ref().map_err(missing)?;
    let mut speed: c_uint = 0;
    // SAFETY: `device` is a live handle of this NVML instance; `speed` is a valid out-pointer.
    nvml_try(unsafe { sym(device, &mut speed) }).map_err(map_err)?;
    Ok(speed)
}

/// What `nvmlDeviceGetGpuFabricInfoV` says of a GPU's fabric registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricInfo {
    /// `nvmlGpuFabricState_t`.
    pub state: u8,
    /// `nvmlReturn_t` of a completed registration.
    pub status: u32,
    pub clique_id: u32,
    pub health_mask: u32,
    /// Only from a v3 struct (drivers that know it).
    pub health_summary: Option<u8>,
}

/// Why there is no fabric information.
#[derive(Debug, Clone, PartialEq)]
pub enum FabricError {
    /// A driver without the call: DCGM reports the fabric manager status as "NVML too old".
    NoSymbol,
    Read(ReadError),
}

/// `nvmlDeviceGetGpuFabricInfoV` with a v3 struct, then v2 where the driver refuses v3
/// (as DCGM does).
pub fn fabric_info(nvml: &Nvml, device: nvmlDevice_t) -> Result<FabricInfo, FabricError> {
    use nvml_wrapper_sys::bindings::{
        nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfoV_t,
        nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    };
    let sym = nvml
        .lib()
        .nvmlDeviceGetGpuFabricInfoV
        .as_ref()
        .map_err(|_| FabricError::NoSymbol)?;
    let version = |size: usize, v: u32| size as u32 | v << 24;
    // SAFETY: a plain C struct, for which all-zero bytes are valid.
    let mut info: nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
    info.version = version(std::mem::size_of::<nvmlGpuFabricInfoV_t>(), 3);
    // SAFETY: `device` is a live handle; `info` is a valid v3 struct with its version set.
    let mut rc = unsafe { sym(device, &mut info) };
    let mut v3 = true;
    if rc == nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH {
        v3 = false;
        // SAFETY: as above; a v2 struct is a prefix of the v3 one.
        info = unsafe { std::mem::zeroed() };
        info.version = version(std::mem::size_of::<nvmlGpuFabricInfo_v2_t>(), 2);
        // SAFETY: as above.
        rc = unsafe { sym(device, &mut info) };
    }
    nvml_try(rc).map_err(|e| FabricError::Read(map_err(e)))?;
    Ok(FabricInfo {
        state: info.state,
        status: info.status,
        clique_id: info.cliqueId,
        health_mask: info.healthMask,
        health_summary: v3.then_some(info.healthSummary),
    })
}
