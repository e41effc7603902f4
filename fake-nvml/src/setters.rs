//! Calls that change device or driver state. The driver refuses them to non-root
//! clients with `NO_PERMISSION`; the fake gives that answer to every client, since it
//! changes no state.

use crate::unsupported::{device_no_permission, system_no_permission};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceClearAccountingPids(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceClearAccountingPids");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceClearCpuAffinity(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceClearCpuAffinity");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceClearEccErrorCounts(
    device: nvmlDevice_t,
    _counterType: nvmlEccCounterType_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceClearEccErrorCounts");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceClearFieldValues(
    device: nvmlDevice_t,
    _valuesCount: c_int,
    _values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceClearFieldValues");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    _profileId: c_uint,
    _gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceCreateGpuInstance");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    _profileId: c_uint,
    _placement: *const nvmlGpuInstancePlacement_t,
    _gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceCreateGpuInstanceWithPlacement");
    device_no_permission(device)
}

/// Changes driver state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceDiscoverGpus(_pciInfo: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceDiscoverGpus");
    system_no_permission()
}

/// Changes driver state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceModifyDrainState(
    _pciInfo: *mut nvmlPciInfo_t,
    _newState: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceModifyDrainState");
    system_no_permission()
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDevicePowerSmoothingActivatePresetProfile(
    device: nvmlDevice_t,
    _profile: *mut nvmlPowerSmoothingProfile_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDevicePowerSmoothingActivatePresetProfile");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDevicePowerSmoothingSetState(
    device: nvmlDevice_t,
    _state: *mut nvmlPowerSmoothingState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDevicePowerSmoothingSetState");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDevicePowerSmoothingUpdatePresetProfileParam(
    device: nvmlDevice_t,
    _profile: *mut nvmlPowerSmoothingProfile_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDevicePowerSmoothingUpdatePresetProfileParam");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceReadWritePRM_v1(
    device: nvmlDevice_t,
    _buffer: *mut nvmlPRMTLV_v1_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceReadWritePRM_v1");
    device_no_permission(device)
}

/// Changes driver state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRemoveGpu(_pciInfo: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceRemoveGpu");
    system_no_permission()
}

/// Changes driver state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRemoveGpu_v2(
    _pciInfo: *mut nvmlPciInfo_t,
    _gpuState: nvmlDetachGpuState_t,
    _linkState: nvmlPcieLinkState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceRemoveGpu_v2");
    system_no_permission()
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetApplicationsClocks(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceResetApplicationsClocks");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetGpuLockedClocks(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceResetGpuLockedClocks");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetMemoryLockedClocks(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceResetMemoryLockedClocks");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetNvLinkErrorCounters(
    device: nvmlDevice_t,
    _link: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceResetNvLinkErrorCounters");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetAPIRestriction(
    device: nvmlDevice_t,
    _apiType: nvmlRestrictedAPI_t,
    _isRestricted: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetAPIRestriction");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetAccountingMode(
    device: nvmlDevice_t,
    _mode: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetAccountingMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetAdaptiveTgpMode_v1(
    device: nvmlDevice_t,
    _mode: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetAdaptiveTgpMode_v1");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetApplicationsClocks(
    device: nvmlDevice_t,
    _memClockMHz: c_uint,
    _graphicsClockMHz: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetApplicationsClocks");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetAutoBoostedClocksEnabled(
    device: nvmlDevice_t,
    _enabled: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetAutoBoostedClocksEnabled");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetClockOffsets(
    device: nvmlDevice_t,
    _info: *mut nvmlClockOffset_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetClockOffsets");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(
    device: nvmlDevice_t,
    _mode: nvmlComputeMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetComputeMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetConfComputeUnprotectedMemSize(
    device: nvmlDevice_t,
    _sizeKiB: c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetConfComputeUnprotectedMemSize");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetCpuAffinity(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetCpuAffinity");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetDefaultAutoBoostedClocksEnabled(
    device: nvmlDevice_t,
    _enabled: nvmlEnableState_t,
    _flags: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetDefaultAutoBoostedClocksEnabled");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetDramEncryptionMode(
    device: nvmlDevice_t,
    _dramEncryption: *const nvmlDramEncryptionInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetDramEncryptionMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetDriverModel(
    device: nvmlDevice_t,
    _driverModel: nvmlDriverModel_t,
    _flags: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetDriverModel");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetEccMode(
    device: nvmlDevice_t,
    _ecc: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetEccMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetGpcClkVfOffset(
    device: nvmlDevice_t,
    _offset: c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetGpcClkVfOffset");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetGpuLockedClocks(
    device: nvmlDevice_t,
    _minGpuClockMHz: c_uint,
    _maxGpuClockMHz: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetGpuLockedClocks");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetGpuOperationMode(
    device: nvmlDevice_t,
    _mode: nvmlGpuOperationMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetGpuOperationMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetHostname_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetHostname_v1");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemClkVfOffset(
    device: nvmlDevice_t,
    _offset: c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetMemClkVfOffset");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetMemoryLimits_v1");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLockedClocks(
    device: nvmlDevice_t,
    _minMemClockMHz: c_uint,
    _maxMemClockMHz: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetMemoryLockedClocks");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    _mode: c_uint,
    _activationStatus: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetMigMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetNvLinkDeviceLowPowerThreshold(
    device: nvmlDevice_t,
    _info: *mut nvmlNvLinkPowerThres_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetNvLinkDeviceLowPowerThreshold");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(
    device: nvmlDevice_t,
    _mode: nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetPersistenceMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPowerManagementLimit(
    device: nvmlDevice_t,
    _limit: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetPowerManagementLimit");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPowerManagementLimit_v2(
    device: nvmlDevice_t,
    _powerValue: *mut nvmlPowerValue_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetPowerManagementLimit_v2");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPowerMizerMode_v1(
    device: nvmlDevice_t,
    _powerMizerMode: *mut nvmlDevicePowerMizerModes_v1_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetPowerMizerMode_v1");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetRusdSettings_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetRusdSettings_v1");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetTemperatureThreshold(
    device: nvmlDevice_t,
    _thresholdType: nvmlTemperatureThresholds_t,
    _temp: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetTemperatureThreshold");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetVirtualizationMode(
    device: nvmlDevice_t,
    _virtualMode: nvmlGpuVirtualizationMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceSetVirtualizationMode");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceWorkloadPowerProfileClearRequestedProfiles(
    device: nvmlDevice_t,
    _requestedProfiles: *mut nvmlWorkloadPowerProfileRequestedProfiles_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceWorkloadPowerProfileClearRequestedProfiles");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceWorkloadPowerProfileSetRequestedProfiles(
    device: nvmlDevice_t,
    _requestedProfiles: *mut nvmlWorkloadPowerProfileRequestedProfiles_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceWorkloadPowerProfileSetRequestedProfiles");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceWorkloadPowerProfileUpdateProfiles_v1(
    device: nvmlDevice_t,
    _data: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceWorkloadPowerProfileUpdateProfiles_v1");
    device_no_permission(device)
}

/// Changes device state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSetStreamingEnabled(
    device: nvmlDevice_t,
    _state: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmSetStreamingEnabled");
    device_no_permission(device)
}

/// Changes driver state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemSetConfComputeGpusReadyState(
    _isAcceptingWork: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemSetConfComputeGpusReadyState");
    system_no_permission()
}

/// Changes driver state: `NO_PERMISSION`, as for a non-root client (the fake changes nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemSetConfComputeKeyRotationThresholdInfo(
    _pKeyRotationThrInfo: *mut nvmlConfComputeSetKeyRotationThresholdInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlSystemSetConfComputeKeyRotationThresholdInfo");
    system_no_permission()
}
