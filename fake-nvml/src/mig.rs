//! MIG: mode, instance handles, instance IDs, GPU-instance profiles, and reading an
//! existing GPU instance's profile and placement.
//!
//! A MIG-enabled GPU has its instances in slots 0..n of its seven MIG device slots;
//! slots n..7 are empty (`NOT_FOUND`). Each instance has one compute instance. The
//! instances are those of the scenario that exist now (`devices.rs`), in its order.

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, GPU_IS_LOST, INVALID_ARGUMENT, InOut, NOT_FOUND, NOT_SUPPORTED, Out,
    put_array_str, struct_version,
};
use crate::state::{Dev, SLOTS_PER_GPU, device_call, gpu_instance_handle, handle, system_call};
use gpu_sim::models::MigProfile;
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_uint;

/// MIG device slots of a GPU.
pub const MAX_MIG_DEVICES: u32 = (SLOTS_PER_GPU - 1) as u32;

/// Whole GPU whose model offers MIG, else `NOT_SUPPORTED`.
fn mig_capable(d: &Dev) -> Result<(), nvmlReturn_t> {
    d.whole_gpu()?;
    if d.gpu.model.mig_profiles.is_empty() {
        return Err(NOT_SUPPORTED);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMigMode");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (cur, pend) = unsafe { (Out::new(currentMode), Out::new(pendingMode)) };
    device_call(device, |d| {
        mig_capable(d)?;
        if cur.is_null() || pend.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mode = c_uint::from(!d.gpu.mig.is_empty());
        cur.set(mode)?;
        pend.set(mode)
    })
}

/// Seven on a MIG-enabled GPU, zero when MIG is disabled.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMaxMigDeviceCount");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(count) };
    device_call(device, |d| {
        mig_capable(d)?;
        out.set(if d.gpu.mig.is_empty() {
            0
        } else {
            MAX_MIG_DEVICES
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMigDeviceHandleByIndex");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(migDevice) };
    device_call(device, |d| {
        mig_capable(d)?;
        if index >= MAX_MIG_DEVICES {
            return Err(INVALID_ARGUMENT);
        }
        let position = crate::devices::with(|set| {
            (0..d.gpu.mig.len())
                .filter(|&m| set.mig_exists(d.index, m))
                .nth(index as usize)
        })
        .ok_or(NOT_FOUND)?;
        out.set(handle(d.index, Some(position)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    migDevice: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(device) };
    device_call(migDevice, |d| {
        d.mig.ok_or(INVALID_ARGUMENT)?;
        out.set(handle(d.index, None))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceIsMigDeviceHandle");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(isMigDevice) };
    device_call(device, |d| out.set(c_uint::from(d.mig.is_some())))
}

/// `INVALID_ARGUMENT` on a handle that is not a MIG device, as the real driver answers
/// (H100, 580.159.04).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstanceId");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(id) };
    device_call(device, |d| {
        out.set(d.mig_instance().ok_or(INVALID_ARGUMENT)?.gpu_instance_id)
    })
}

/// `INVALID_ARGUMENT` on a handle that is not a MIG device, as the real driver answers
/// (H100, 580.159.04).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetComputeInstanceId");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(id) };
    device_call(device, |d| {
        out.set(
            d.mig_instance()
                .ok_or(INVALID_ARGUMENT)?
                .compute_instance_id,
        )
    })
}

/// The model's profile with this `NVML_GPU_INSTANCE_PROFILE_*` index.
fn profile(d: &Dev, index: c_uint) -> Result<&'static MigProfile, nvmlReturn_t> {
    mig_capable(d)?;
    d.gpu
        .model
        .mig_profiles
        .iter()
        .find(|p| p.profile_id == index)
        .ok_or(NOT_SUPPORTED)
}

/// The model's profile with this unique profile ID (`nvmlGpuInstanceProfileInfo_t.id`).
fn profile_by_id(d: &Dev, id: c_uint) -> Result<&'static MigProfile, nvmlReturn_t> {
    mig_capable(d)?;
    d.gpu
        .model
        .mig_profiles
        .iter()
        .find(|p| p.id == id)
        .ok_or(NOT_SUPPORTED)
}

/// Profile facts: slices and memory from the model; SMs (16 per slice on Hopper, 14
/// otherwise), copy engines and decoders per slice; one JPEG/OFA on a full-GPU profile.
fn profile_info(d: &Dev, p: &MigProfile) -> nvmlGpuInstanceProfileInfo_t {
    let sms_per_slice = if d.gpu.model.architecture == 9 {
        16
    } else {
        14
    };
    let full = c_uint::from(p.slices == 7);
    nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.slices,
        instanceCount: 7 / p.slices,
        multiprocessorCount: p.slices * sms_per_slice,
        copyEngineCount: p.slices,
        decoderCount: p.slices,
        encoderCount: 0,
        jpegCount: full,
        ofaCount: full,
        memorySizeMB: p.memory_mib,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile_id: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstanceProfileInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(info) };
    device_call(device, |d| {
        out.set(profile_info(d, profile(d, profile_id)?))
    })
}

/// Fill a `nvmlGpuInstanceProfileInfo_v2_t` (whose version word must be
/// `nvmlGpuInstanceProfileInfo_v2`) for the profile with this ID.
fn profile_info_v2(
    d: &Dev,
    p: Result<&'static MigProfile, nvmlReturn_t>,
    io: InOut<nvmlGpuInstanceProfileInfo_v2_t>,
) -> Result<(), nvmlReturn_t> {
    let v = io.get()?;
    if v.version != struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2) {
        return Err(ARGUMENT_VERSION_MISMATCH);
    }
    let p = p?;
    let i = profile_info(d, p);
    v.id = i.id;
    v.isP2pSupported = i.isP2pSupported;
    v.sliceCount = i.sliceCount;
    v.instanceCount = i.instanceCount;
    v.multiprocessorCount = i.multiprocessorCount;
    v.copyEngineCount = i.copyEngineCount;
    v.decoderCount = i.decoderCount;
    v.encoderCount = i.encoderCount;
    v.jpegCount = i.jpegCount;
    v.ofaCount = i.ofaCount;
    v.memorySizeMB = i.memorySizeMB;
    put_array_str(&mut v.name, &format!("MIG {}", p.name));
    Ok(())
}

/// The version word must be `nvmlGpuInstanceProfileInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile_id: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstanceProfileInfoV");
    // SAFETY: NVML contract: `info` is null or a valid struct whose version the caller set.
    let io = unsafe { InOut::new(info) };
    device_call(device, |d| profile_info_v2(d, profile(d, profile_id), io))
}

/// By the profile's unique ID (19 for `1g.10gb` on an H100), not its
/// `NVML_GPU_INSTANCE_PROFILE_*` index.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    device: nvmlDevice_t,
    profileId: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstanceProfileInfoByIdV");
    // SAFETY: NVML contract: `info` is null or a valid struct whose version the caller set.
    let io = unsafe { InOut::new(info) };
    device_call(device, |d| {
        profile_info_v2(d, profile_by_id(d, profileId), io)
    })
}

/// An existing GPU instance by its ID. Reading one needs only the MIG monitoring
/// capability, which also lets clients see MIG devices at all, so the fake answers;
/// `NOT_FOUND` when the GPU has no instance with this ID.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuInstanceById");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(gpuInstance) };
    device_call(device, |d| {
        mig_capable(d)?;
        if out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let slot = d
            .gpu
            .mig
            .iter()
            .position(|m| m.gpu_instance_id == id)
            .ok_or(NOT_FOUND)?;
        out.set(gpu_instance_handle(d.index, slot))
    })
}

/// A GPU instance's parent device, ID, unique profile ID and placement.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpuInstance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpuInstanceGetInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(info) };
    system_call(|sim, t| {
        let (gpu, slot) = sim
            .decode_gpu_instance(gpuInstance)
            .ok_or(INVALID_ARGUMENT)?;
        if sim.node.gpu_lost(gpu, t) {
            return Err(GPU_IS_LOST);
        }
        let m = &sim.node.gpus[gpu as usize].mig[slot];
        out.set(nvmlGpuInstanceInfo_t {
            device: handle(gpu, None),
            id: m.gpu_instance_id,
            profileId: m.profile.id,
            placement: nvmlGpuInstancePlacement_t {
                start: m.placement_start,
                size: m.profile.memory_slices,
            },
        })
    })
}

/// Attributes of a device: for a MIG instance, its profile's slices, SMs and memory
/// (how clients name the instance's profile); for a whole GPU in MIG mode, all seven
/// slices; for a GPU with MIG off, `NOT_SUPPORTED` (H100, 580.159.04).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAttributes_v2");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(attributes) };
    device_call(device, |d| {
        let (info, memory_mib) = match d.mig_instance() {
            Some(m) => (profile_info(d, &m.profile), m.profile.memory_mib),
            None if d.gpu.mig.is_empty() => return Err(NOT_SUPPORTED),
            None => {
                let full = MigProfile {
                    name: "full",
                    profile_id: 0,
                    id: 0,
                    slices: 7,
                    memory_mib: d.gpu.model.memory_total_mib,
                    memory_slices: 8,
                };
                (profile_info(d, &full), full.memory_mib)
            }
        };
        out.set(nvmlDeviceAttributes_t {
            multiprocessorCount: info.multiprocessorCount,
            sharedCopyEngineCount: info.copyEngineCount,
            sharedDecoderCount: info.decoderCount,
            sharedEncoderCount: info.encoderCount,
            sharedJpegCount: info.jpegCount,
            sharedOfaCount: info.ofaCount,
            gpuInstanceSliceCount: info.sliceCount,
            computeInstanceSliceCount: info.sliceCount,
            memorySizeMB: memory_mib,
        })
    })
}
