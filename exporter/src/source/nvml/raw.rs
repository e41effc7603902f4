//! NVML calls nvml-wrapper does not wrap (or wraps lossily), made through `nvml.lib()`.
//! Each symbol is looked up at call time; a driver without it answers NOT_SUPPORTED.

use super::map_err;
use crate::source::{Raw, ReadError};
use nvml_wrapper::Nvml;
use nvml_wrapper::error::nvml_try;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlFieldValue_t, nvmlGridLicensableFeatures_t,
    nvmlReturn_enum_NVML_SUCCESS,
};

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

/// vGPU guest licence state: 1 when a licensable feature is licensed, 0 on bare metal
/// (no vGPU licensing, or a driver without the call), as DCGM reports it.
pub fn vgpu_licensed(nvml: &Nvml, device: nvmlDevice_t) -> Result<u64, ReadError> {
    let Ok(sym) = nvml.lib().nvmlDeviceGetGridLicensableFeatures_v4.as_ref() else {
        return Ok(0);
    };
    // SAFETY: plain old data; all-zero is a valid value.
    let mut f: nvmlGridLicensableFeatures_t = unsafe { std::mem::zeroed() };
    // SAFETY: live handle, valid out-pointer.
    let rc = unsafe { sym(device, &mut f) };
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return match map_err(nvml_wrapper::error::NvmlError::from(rc)) {
            ReadError::NotSupported => Ok(0),
            e => Err(e),
        };
    }
    let n = (f.licensableFeaturesCount as usize).min(f.gridLicensableFeatures.len());
    Ok(u64::from(
        f.isGridLicenseSupported != 0
            && f.gridLicensableFeatures[..n]
                .iter()
                .any(|x| x.featureState > 0),
    ))
}
