//! vGPU: a bare-metal node runs no vGPU host driver, so device-level vGPU queries are
//! `NOT_SUPPORTED` and no vGPU instance or type handle is valid.

use crate::unsupported::{device_unsupported, no_such_handle, system_unsupported};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

/// A vGPU instance ID on a node without vGPUs: 0 is never a valid ID
/// (`INVALID_ARGUMENT`); any other is simply not found (`NOT_FOUND`), as the real driver
/// answers (H100, 580.159.04).
fn no_such_vgpu_instance(id: nvmlVgpuInstance_t) -> nvmlReturn_t {
    crate::state::system_call(|_, _| {
        Err(if id == 0 {
            crate::ffi::INVALID_ARGUMENT
        } else {
            crate::ffi::NOT_FOUND
        })
    })
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetActiveVgpus(
    device: nvmlDevice_t,
    _vgpuCount: *mut c_uint,
    _vgpuInstances: *mut nvmlVgpuInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetActiveVgpus");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCreatableVgpus(
    device: nvmlDevice_t,
    _vgpuCount: *mut c_uint,
    _vgpuTypeIds: *mut nvmlVgpuTypeId_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCreatableVgpus");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHostVgpuMode(
    device: nvmlDevice_t,
    _pHostVgpuMode: *mut nvmlHostVgpuMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHostVgpuMode");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPgpuMetadataString(
    device: nvmlDevice_t,
    _pgpuMetadata: *mut c_char,
    _bufferSize: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPgpuMetadataString");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedVgpus(
    device: nvmlDevice_t,
    _vgpuCount: *mut c_uint,
    _vgpuTypeIds: *mut nvmlVgpuTypeId_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSupportedVgpus");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuCapabilities(
    device: nvmlDevice_t,
    _capability: nvmlDeviceVgpuCapability_t,
    _capResult: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuCapabilities");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuHeterogeneousMode(
    device: nvmlDevice_t,
    _pHeterogeneousMode: *mut nvmlVgpuHeterogeneousMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuHeterogeneousMode");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuInstancesUtilizationInfo(
    device: nvmlDevice_t,
    _vgpuUtilInfo: *mut nvmlVgpuInstancesUtilizationInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuInstancesUtilizationInfo");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuMetadata(
    device: nvmlDevice_t,
    _pgpuMetadata: *mut nvmlVgpuPgpuMetadata_t,
    _bufferSize: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuMetadata");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuProcessUtilization(
    device: nvmlDevice_t,
    _lastSeenTimeStamp: c_ulonglong,
    _vgpuProcessSamplesCount: *mut c_uint,
    _utilizationSamples: *mut nvmlVgpuProcessUtilizationSample_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuProcessUtilization");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuProcessesUtilizationInfo(
    device: nvmlDevice_t,
    _vgpuProcUtilInfo: *mut nvmlVgpuProcessesUtilizationInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuProcessesUtilizationInfo");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuSchedulerCapabilities(
    device: nvmlDevice_t,
    _pCapabilities: *mut nvmlVgpuSchedulerCapabilities_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuSchedulerCapabilities");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuSchedulerLog(
    device: nvmlDevice_t,
    _pSchedulerLog: *mut nvmlVgpuSchedulerLog_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuSchedulerLog");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuSchedulerLog_v2(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuSchedulerLog_v2");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuSchedulerState(
    device: nvmlDevice_t,
    _pSchedulerState: *mut nvmlVgpuSchedulerGetState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuSchedulerState");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuSchedulerState_v2(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuSchedulerState_v2");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuTypeCreatablePlacements(
    device: nvmlDevice_t,
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _pPlacementList: *mut nvmlVgpuPlacementList_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuTypeCreatablePlacements");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuTypeSupportedPlacements(
    device: nvmlDevice_t,
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _pPlacementList: *mut nvmlVgpuPlacementList_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuTypeSupportedPlacements");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuUtilization(
    device: nvmlDevice_t,
    _lastSeenTimeStamp: c_ulonglong,
    _sampleValType: *mut nvmlValueType_t,
    _vgpuInstanceSamplesCount: *mut c_uint,
    _utilizationSamples: *mut nvmlVgpuInstanceUtilizationSample_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVgpuUtilization");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetVgpuCapabilities(
    device: nvmlDevice_t,
    _capability: nvmlDeviceVgpuCapability_t,
    _state: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetVgpuCapabilities");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetVgpuHeterogeneousMode(
    device: nvmlDevice_t,
    _pHeterogeneousMode: *const nvmlVgpuHeterogeneousMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetVgpuHeterogeneousMode");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetVgpuSchedulerState(
    device: nvmlDevice_t,
    _pSchedulerState: *mut nvmlVgpuSchedulerSetState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetVgpuSchedulerState");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetVgpuSchedulerState_v2(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetVgpuSchedulerState_v2");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceVgpuForceGspUnload(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceVgpuForceGspUnload");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetVgpuCompatibility(
    _vgpuMetadata: *mut nvmlVgpuMetadata_t,
    _pgpuMetadata: *mut nvmlVgpuPgpuMetadata_t,
    _compatibilityInfo: *mut nvmlVgpuPgpuCompatibility_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGetVgpuCompatibility");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetVgpuDriverCapabilities(
    _capability: nvmlVgpuDriverCapability_t,
    _capResult: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGetVgpuDriverCapabilities");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSetVgpuVersion(_vgpuVersion: *mut nvmlVgpuVersion_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlSetVgpuVersion");
    system_unsupported()
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceClearAccountingPids(
    vgpuInstance: nvmlVgpuInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceClearAccountingPids");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetAccountingMode(
    vgpuInstance: nvmlVgpuInstance_t,
    _mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetAccountingMode");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetAccountingPids(
    vgpuInstance: nvmlVgpuInstance_t,
    _count: *mut c_uint,
    _pids: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetAccountingPids");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetAccountingStats(
    vgpuInstance: nvmlVgpuInstance_t,
    _pid: c_uint,
    _stats: *mut nvmlAccountingStats_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetAccountingStats");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetEccMode(
    vgpuInstance: nvmlVgpuInstance_t,
    _eccMode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetEccMode");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetEncoderCapacity(
    vgpuInstance: nvmlVgpuInstance_t,
    _encoderCapacity: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetEncoderCapacity");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetEncoderSessions(
    vgpuInstance: nvmlVgpuInstance_t,
    _sessionCount: *mut c_uint,
    _sessionInfo: *mut nvmlEncoderSessionInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetEncoderSessions");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetEncoderStats(
    vgpuInstance: nvmlVgpuInstance_t,
    _sessionCount: *mut c_uint,
    _averageFps: *mut c_uint,
    _averageLatency: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetEncoderStats");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetFBCSessions(
    vgpuInstance: nvmlVgpuInstance_t,
    _sessionCount: *mut c_uint,
    _sessionInfo: *mut nvmlFBCSessionInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetFBCSessions");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetFBCStats(
    vgpuInstance: nvmlVgpuInstance_t,
    _fbcStats: *mut nvmlFBCStats_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetFBCStats");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetFbUsage(
    vgpuInstance: nvmlVgpuInstance_t,
    _fbUsage: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetFbUsage");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetFrameRateLimit(
    vgpuInstance: nvmlVgpuInstance_t,
    _frameRateLimit: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetFrameRateLimit");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetGpuInstanceId(
    vgpuInstance: nvmlVgpuInstance_t,
    _gpuInstanceId: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetGpuInstanceId");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetGpuPciId(
    vgpuInstance: nvmlVgpuInstance_t,
    _vgpuPciId: *mut c_char,
    _length: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetGpuPciId");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetLicenseInfo(
    vgpuInstance: nvmlVgpuInstance_t,
    _licenseInfo: *mut nvmlVgpuLicenseInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetLicenseInfo");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetLicenseInfo_v2(
    vgpuInstance: nvmlVgpuInstance_t,
    _licenseInfo: *mut nvmlVgpuLicenseInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetLicenseInfo_v2");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetLicenseStatus(
    vgpuInstance: nvmlVgpuInstance_t,
    _licensed: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetLicenseStatus");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetMdevUUID(
    vgpuInstance: nvmlVgpuInstance_t,
    _mdevUuid: *mut c_char,
    _size: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetMdevUUID");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetMetadata(
    vgpuInstance: nvmlVgpuInstance_t,
    _vgpuMetadata: *mut nvmlVgpuMetadata_t,
    _bufferSize: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetMetadata");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetPlacementId(
    vgpuInstance: nvmlVgpuInstance_t,
    _pPlacement: *mut nvmlVgpuPlacementId_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetPlacementId");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetRuntimeStateSize(
    vgpuInstance: nvmlVgpuInstance_t,
    _pState: *mut nvmlVgpuRuntimeState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetRuntimeStateSize");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetType(
    vgpuInstance: nvmlVgpuInstance_t,
    _vgpuTypeId: *mut nvmlVgpuTypeId_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetType");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetUUID(
    vgpuInstance: nvmlVgpuInstance_t,
    _uuid: *mut c_char,
    _size: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetUUID");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetVmDriverVersion(
    vgpuInstance: nvmlVgpuInstance_t,
    _version: *mut c_char,
    _length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetVmDriverVersion");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceGetVmID(
    vgpuInstance: nvmlVgpuInstance_t,
    _vmId: *mut c_char,
    _size: c_uint,
    _vmIdType: *mut nvmlVgpuVmIdType_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceGetVmID");
    no_such_vgpu_instance(vgpuInstance)
}

/// No vGPU instance exists on this node: see [`no_such_vgpu_instance`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuInstanceSetEncoderCapacity(
    vgpuInstance: nvmlVgpuInstance_t,
    _encoderCapacity: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuInstanceSetEncoderCapacity");
    no_such_vgpu_instance(vgpuInstance)
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetBAR1Info(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _bar1Info: *mut nvmlVgpuTypeBar1Info_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetBAR1Info");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetCapabilities(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _capability: nvmlVgpuCapability_t,
    _capResult: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetCapabilities");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetClass(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _vgpuTypeClass: *mut c_char,
    _size: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetClass");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetDeviceID(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _deviceID: *mut c_ulonglong,
    _subsystemID: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetDeviceID");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetFbReservation(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _fbReservation: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetFbReservation");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetFrameRateLimit(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _frameRateLimit: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetFrameRateLimit");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetFramebufferSize(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _fbSize: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetFramebufferSize");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetGpuInstanceProfileId(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _gpuInstanceProfileId: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetGpuInstanceProfileId");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetGspHeapSize(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _gspHeapSize: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetGspHeapSize");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetLicense(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _vgpuTypeLicenseString: *mut c_char,
    _size: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetLicense");
    no_such_handle()
}

/// Asked of a GPU that runs no vGPU host driver: `NOT_SUPPORTED` for any type, as the
/// real driver answers (H100, 580.159.04).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetMaxInstances(
    device: nvmlDevice_t,
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _vgpuInstanceCount: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetMaxInstances");
    device_unsupported(device)
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetMaxInstancesPerGpuInstance(
    _pMaxInstance: *mut nvmlVgpuTypeMaxInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetMaxInstancesPerGpuInstance");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetMaxInstancesPerVm(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _vgpuInstanceCountPerVm: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetMaxInstancesPerVm");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetName(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _vgpuTypeName: *mut c_char,
    _size: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetName");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetNumDisplayHeads(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _numDisplayHeads: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetNumDisplayHeads");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetResolution(
    _vgpuTypeId: nvmlVgpuTypeId_t,
    _displayIndex: c_uint,
    _xdim: *mut c_uint,
    _ydim: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlVgpuTypeGetResolution");
    no_such_handle()
}
