//! GPU and compute instances as MIG management objects. Enumerating or creating them
//! needs the MIG configuration capability (root), so device-level calls are
//! `NO_PERMISSION`; calls on a compute-instance handle are `INVALID_ARGUMENT`, as none
//! is handed out. (MIG *device* handles, and reading one existing GPU instance by ID,
//! which the monitoring capability allows, are in `mig.rs`.)

use crate::unsupported::{device_no_permission, gpu_instance_no_permission, no_such_handle};
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

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceCreateComputeInstance");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _placement: *const nvmlComputeInstancePlacement_t,
    _computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceCreateComputeInstanceWithPlacement");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpuInstance: nvmlGpuInstance_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceDestroy");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetActiveVgpus(
    gpuInstance: nvmlGpuInstance_t,
    _pVgpuInstanceInfo: *mut nvmlActiveVgpuInstanceInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetActiveVgpus");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpuInstance: nvmlGpuInstance_t,
    _id: c_uint,
    _computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceById");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _placements: *mut nvmlComputeInstancePlacement_t,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstancePossiblePlacements");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpuInstance: nvmlGpuInstance_t,
    _profile: c_uint,
    _engProfile: c_uint,
    _info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpuInstance: nvmlGpuInstance_t,
    _profile: c_uint,
    _engProfile: c_uint,
    _info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceProfileInfoV");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstanceRemainingCapacity");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpuInstance: nvmlGpuInstance_t,
    _profileId: c_uint,
    _computeInstances: *mut nvmlComputeInstance_t,
    _count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetComputeInstances");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetCreatableVgpus(
    gpuInstance: nvmlGpuInstance_t,
    _pVgpus: *mut nvmlVgpuTypeIdInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetCreatableVgpus");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuHeterogeneousMode(
    gpuInstance: nvmlGpuInstance_t,
    _pHeterogeneousMode: *mut nvmlVgpuHeterogeneousMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuHeterogeneousMode");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerLog(
    gpuInstance: nvmlGpuInstance_t,
    _pSchedulerLogInfo: *mut nvmlVgpuSchedulerLogInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerLog");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerLog_v2(
    gpuInstance: nvmlGpuInstance_t,
    _log: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerLog_v2");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerState(
    gpuInstance: nvmlGpuInstance_t,
    _pSchedulerStateInfo: *mut nvmlVgpuSchedulerStateInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerState");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuSchedulerState_v2(
    gpuInstance: nvmlGpuInstance_t,
    _state: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuSchedulerState_v2");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetVgpuTypeCreatablePlacements(
    gpuInstance: nvmlGpuInstance_t,
    _pCreatablePlacementInfo: *mut nvmlVgpuCreatablePlacementInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetVgpuTypeCreatablePlacements");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceSetVgpuHeterogeneousMode(
    gpuInstance: nvmlGpuInstance_t,
    _pHeterogeneousMode: *const nvmlVgpuHeterogeneousMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceSetVgpuHeterogeneousMode");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceSetVgpuSchedulerState(
    gpuInstance: nvmlGpuInstance_t,
    _pScheduler: *mut nvmlVgpuSchedulerState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceSetVgpuSchedulerState");
    gpu_instance_no_permission(gpuInstance)
}

/// On one of the node's GPU instances, needs the MIG configuration capability:
/// `NO_PERMISSION`, as for a non-root client (`INVALID_ARGUMENT` for any other handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceSetVgpuSchedulerState_v2(
    gpuInstance: nvmlGpuInstance_t,
    _state: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceSetVgpuSchedulerState_v2");
    gpu_instance_no_permission(gpuInstance)
}
