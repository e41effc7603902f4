//! GPU and compute instances as MIG management objects. Enumerating or creating them
//! needs the MIG configuration capability (root), so device-level calls are
//! `NO_PERMISSION`; no instance handle is ever handed out, so calls on one are
//! `INVALID_ARGUMENT`. (MIG *device* handles, which need no privilege, are in `mig.rs`.)

use crate::unsupported::{device_no_permission, no_such_handle};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_void};

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(
    _computeInstance: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlComputeInstanceDestroy");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    _computeInstance: nvmlComputeInstance_t,
    _info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlComputeInstanceGetInfo");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    _computeInstance: nvmlComputeInstance_t,
    _info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlComputeInstanceGetInfo_v2");
    no_such_handle()
}

/// Needs the MIG configuration capability: `NO_PERMISSION`, as for a non-root client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    _id: c_uint,
    _gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstanceById");
    device_no_permission(device)
}

/// Needs the MIG configuration capability: `NO_PERMISSION`, as for a non-root client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements(
    device: nvmlDevice_t,
    _profileId: c_uint,
    _placements: *mut nvmlGpuInstancePlacement_t,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstancePossiblePlacements");
    device_no_permission(device)
}

/// Needs the MIG configuration capability: `NO_PERMISSION`, as for a non-root client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    _profileId: c_uint,
    _placements: *mut nvmlGpuInstancePlacement_t,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    device_no_permission(device)
}

/// Needs the MIG configuration capability: `NO_PERMISSION`, as for a non-root client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    _profileId: c_uint,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstanceRemainingCapacity");
    device_no_permission(device)
}

/// Needs the MIG configuration capability: `NO_PERMISSION`, as for a non-root client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    _profileId: c_uint,
    _gpuInstances: *mut nvmlGpuInstance_t,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstances");
    device_no_permission(device)
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    _gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceCreateComputeInstance");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    _gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _placement: *const nvmlComputeInstancePlacement_t,
    _computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceCreateComputeInstanceWithPlacement");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(_gpuInstance: nvmlGpuInstance_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceDestroy");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetActiveVgpus(
    _gpuInstance: nvmlGpuInstance_t,
    _pVgpuInstanceInfo: *mut nvmlActiveVgpuInstanceInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetActiveVgpus");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    _gpuInstance: nvmlGpuInstance_t,
    _id: c_uint,
    _computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceById");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    _gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _placements: *mut nvmlComputeInstancePlacement_t,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstancePossiblePlacements");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    _gpuInstance: nvmlGpuInstance_t,
    _profile: c_uint,
    _engProfile: c_uint,
    _info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    _gpuInstance: nvmlGpuInstance_t,
    _profile: c_uint,
    _engProfile: c_uint,
    _info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceProfileInfoV");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    _gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceRemainingCapacity");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    _gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _computeInstances: *mut nvmlComputeInstance_t,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstances");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetCreatableVgpus(
    _gpuInstance: nvmlGpuInstance_t,
    _pVgpus: *mut nvmlVgpuTypeIdInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetCreatableVgpus");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    _gpuInstance: nvmlGpuInstance_t,
    _info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetInfo");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuHeterogeneousMode(
    _gpuInstance: nvmlGpuInstance_t,
    _pHeterogeneousMode: *mut nvmlVgpuHeterogeneousMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuHeterogeneousMode");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerLog(
    _gpuInstance: nvmlGpuInstance_t,
    _pSchedulerLogInfo: *mut nvmlVgpuSchedulerLogInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerLog");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerLog_v2(
    _gpuInstance: nvmlGpuInstance_t,
    _log: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerLog_v2");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerState(
    _gpuInstance: nvmlGpuInstance_t,
    _pSchedulerStateInfo: *mut nvmlVgpuSchedulerStateInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerState");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerState_v2(
    _gpuInstance: nvmlGpuInstance_t,
    _state: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerState_v2");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuTypeCreatablePlacements(
    _gpuInstance: nvmlGpuInstance_t,
    _pCreatablePlacementInfo: *mut nvmlVgpuCreatablePlacementInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuTypeCreatablePlacements");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceSetVgpuHeterogeneousMode(
    _gpuInstance: nvmlGpuInstance_t,
    _pHeterogeneousMode: *const nvmlVgpuHeterogeneousMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceSetVgpuHeterogeneousMode");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceSetVgpuSchedulerState(
    _gpuInstance: nvmlGpuInstance_t,
    _pScheduler: *mut nvmlVgpuSchedulerState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceSetVgpuSchedulerState");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceSetVgpuSchedulerState_v2(
    _gpuInstance: nvmlGpuInstance_t,
    _state: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceSetVgpuSchedulerState_v2");
    no_such_handle()
}
