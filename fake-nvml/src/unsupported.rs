//! Queries a bare-metal H100 SXM answers with `NOT_SUPPORTED` (fans on a fanless board,
//! Windows-only, Blackwell-only, deprecated NVLink utilisation counters, …), a few the
//! model has no data for (SRAM ECC status, clock monitor, …: documented one by one), and
//! the shared answers the topic modules use for objects that do not exist on this node.

use crate::ffi::{INVALID_ARGUMENT, NO_PERMISSION, NOT_SUPPORTED, Ret};
use crate::state::{device_call, system_call};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong, c_void};

/// `NOT_SUPPORTED` for a valid handle (after the usual handle and fault checks).
pub(crate) fn device_unsupported(device: nvmlDevice_t) -> Ret {
    device_call(device, |_| Err(NOT_SUPPORTED))
}

/// `NO_PERMISSION` for a valid handle: the driver refuses state changes to non-root
/// clients, and the fake changes no state.
pub(crate) fn device_no_permission(device: nvmlDevice_t) -> Ret {
    device_call(device, |_| Err(NO_PERMISSION))
}

pub(crate) fn system_unsupported() -> Ret {
    system_call(|_, _| Err(NOT_SUPPORTED))
}

pub(crate) fn system_no_permission() -> Ret {
    system_call(|_, _| Err(NO_PERMISSION))
}

/// For calls on a GPU-instance handle that change or enumerate MIG configuration:
/// `NO_PERMISSION` on one of ours (the MIG configuration capability is root's),
/// `INVALID_ARGUMENT` on anything else.
pub(crate) fn gpu_instance_no_permission(gpu_instance: nvmlGpuInstance_t) -> Ret {
    system_call(|sim, _| match sim.decode_gpu_instance(gpu_instance) {
        Some(_) => Err(NO_PERMISSION),
        None => Err(INVALID_ARGUMENT),
    })
}

/// For calls on a handle of an object this node never hands out (units, vGPU
/// instances and types, GPU and compute instance handles).
pub(crate) fn no_such_handle() -> Ret {
    system_call(|_, _| Err(INVALID_ARGUMENT))
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceFreezeNvLinkUtilizationCounter(
    device: nvmlDevice_t,
    _link: c_uint,
    _counter: c_uint,
    _freeze: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceFreezeNvLinkUtilizationCounter");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAdaptiveTgpModeInfo_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAdaptiveTgpModeInfo_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    _attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAttributes");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAutoBoostedClocksEnabled(
    device: nvmlDevice_t,
    _isEnabled: *mut nvmlEnableState_t,
    _defaultIsEnabled: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAutoBoostedClocksEnabled");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBBXTimeData_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBBXTimeData_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBankRemapperStatus_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBankRemapperStatus_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBridgeChipInfo(
    device: nvmlDevice_t,
    _bridgeHierarchy: *mut nvmlBridgeChipHierarchy_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBridgeChipInfo");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCapabilities(
    device: nvmlDevice_t,
    _caps: *mut nvmlDeviceCapabilities_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCapabilities");
    device_unsupported(device)
}

/// Not modelled (the scenario has no clock monitor faults): `NOT_SUPPORTED`, where a real H100
/// answers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClkMonStatus(
    device: nvmlDevice_t,
    _status: *mut nvmlClkMonStatus_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetClkMonStatus");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockOffsets(
    device: nvmlDevice_t,
    _info: *mut nvmlClockOffset_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetClockOffsets");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeGpuAttestationReport(
    device: nvmlDevice_t,
    _gpuAtstReport: *mut nvmlConfComputeGpuAttestationReport_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetConfComputeGpuAttestationReport");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeGpuCertificate(
    device: nvmlDevice_t,
    _gpuCert: *mut nvmlConfComputeGpuCertificate_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetConfComputeGpuCertificate");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCoolerInfo(
    device: nvmlDevice_t,
    _coolerInfo: *mut nvmlCoolerInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCoolerInfo");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDramEncryptionMode(
    device: nvmlDevice_t,
    _current: *mut nvmlDramEncryptionInfo_t,
    _pending: *mut nvmlDramEncryptionInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDramEncryptionMode");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel(
    device: nvmlDevice_t,
    _current: *mut nvmlDriverModel_t,
    _pending: *mut nvmlDriverModel_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDriverModel");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel_v2(
    device: nvmlDevice_t,
    _current: *mut nvmlDriverModel_t,
    _pending: *mut nvmlDriverModel_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDriverModel_v2");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo_v4(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuFabricInfo_v4");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuOperationMode(
    device: nvmlDevice_t,
    _current: *mut nvmlGpuOperationMode_t,
    _pending: *mut nvmlGpuOperationMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuOperationMode");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHostname_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetHostname_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemoryLimits_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkInfo(
    device: nvmlDevice_t,
    _info: *mut nvmlNvLinkInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkInfo");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkTelemetrySamples_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkTelemetrySamples_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkUtilizationControl(
    device: nvmlDevice_t,
    _link: c_uint,
    _counter: c_uint,
    _control: *mut nvmlNvLinkUtilizationControl_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkUtilizationControl");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkUtilizationCounter(
    device: nvmlDevice_t,
    _link: c_uint,
    _counter: c_uint,
    _rxcounter: *mut c_ulonglong,
    _txcounter: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkUtilizationCounter");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvlinkBwMode(
    device: nvmlDevice_t,
    _getBwMode: *mut nvmlNvlinkGetBwMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvlinkBwMode");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvlinkSupportedBwModes(
    device: nvmlDevice_t,
    _supportedBwMode: *mut nvmlNvlinkSupportedBwModes_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvlinkSupportedBwModes");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPlatformInfo(
    device: nvmlDevice_t,
    _platformInfo: *mut nvmlPlatformInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPlatformInfo");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerMizerMode_v1(
    device: nvmlDevice_t,
    _powerMizerMode: *mut nvmlDevicePowerMizerModes_v1_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerMizerMode_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows_v2(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRemappedRows_v2");
    device_unsupported(device)
}

/// Not modelled (the scenario has no SRAM ECC thresholds): `NOT_SUPPORTED`, where a real H100
/// answers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSramEccErrorStatus(
    device: nvmlDevice_t,
    _status: *mut nvmlEccSramErrorStatus_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSramEccErrorStatus");
    device_unsupported(device)
}

/// Not modelled (the scenario has no SRAM ECC errors): `NOT_SUPPORTED`, where a real H100
/// answers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts(
    device: nvmlDevice_t,
    _errorCounts: *mut nvmlEccSramUniqueUncorrectedErrorCounts_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetThermalSettings(
    device: nvmlDevice_t,
    _sensorIndex: c_uint,
    _pThermalSettings: *mut nvmlGpuThermalSettings_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetThermalSettings");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDevicePerfMetricsGetSamples_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDevicePerfMetricsGetSamples_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceQueryDrainState(
    _pciInfo: *mut nvmlPciInfo_t,
    _currentState: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceQueryDrainState");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceReadPRMCounters_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceReadPRMCounters_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetNvLinkUtilizationCounter(
    device: nvmlDevice_t,
    _link: c_uint,
    _counter: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceResetNvLinkUtilizationCounter");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetDefaultFanSpeed_v2(
    device: nvmlDevice_t,
    _fan: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetDefaultFanSpeed_v2");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetFanControlPolicy(
    device: nvmlDevice_t,
    _fan: c_uint,
    _policy: nvmlFanControlPolicy_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetFanControlPolicy");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetFanSpeed_v2(
    device: nvmlDevice_t,
    _fan: c_uint,
    _speed: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetFanSpeed_v2");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetNvLinkUtilizationControl(
    device: nvmlDevice_t,
    _link: c_uint,
    _counter: c_uint,
    _control: *mut nvmlNvLinkUtilizationControl_t,
    _reset: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetNvLinkUtilizationControl");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetNvlinkBwMode(
    device: nvmlDevice_t,
    _setBwMode: *mut nvmlNvlinkSetBwMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetNvlinkBwMode");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetNvlinkBwModeAsync_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetNvlinkBwModeAsync_v1");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceWorkloadPowerProfileGetCurrentProfiles(
    device: nvmlDevice_t,
    _currentProfiles: *mut nvmlWorkloadPowerProfileCurrentProfiles_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceWorkloadPowerProfileGetCurrentProfiles");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceWorkloadPowerProfileGetProfilesInfo(
    device: nvmlDevice_t,
    _profilesInfo: *mut nvmlWorkloadPowerProfileProfilesInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceWorkloadPowerProfileGetProfilesInfo");
    device_unsupported(device)
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemEventSetCreate(
    _request: *mut nvmlSystemEventSetCreateRequest_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemEventSetCreate");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemEventSetFree(
    _request: *mut nvmlSystemEventSetFreeRequest_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemEventSetFree");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemEventSetWait(
    _request: *mut nvmlSystemEventSetWaitRequest_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemEventSetWait");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCPER_v1(_cper: *mut c_void) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetCPER_v1");
    system_unsupported()
}

/// Not modelled (the scenario has no CPU placement): `NOT_SUPPORTED`, where a real H100
/// answers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetTopologyGpuSet(
    _cpuNumber: c_uint,
    _count: *mut c_uint,
    _deviceArray: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemGetTopologyGpuSet");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemRegisterEvents(
    _request: *mut nvmlSystemRegisterEventRequest_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemRegisterEvents");
    system_unsupported()
}

/// `NOT_SUPPORTED`, as on a bare-metal H100 SXM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemSetNvlinkBwMode(_nvlinkBwMode: c_uint) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemSetNvlinkBwMode");
    system_unsupported()
}
