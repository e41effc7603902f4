//! Fans: passively cooled boards (every SXM and data-centre PCIe model) report 0 fans
//! and answer `nvmlDeviceGetFanSpeed` `NOT_SUPPORTED` and the getters that name a fan
//! `INVALID_ARGUMENT` (no such fan); actively cooled ones report each fan's
//! speed from the model's fan curve. A fan index past the last fan is
//! `INVALID_ARGUMENT`.

use crate::board::board;
use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, InOut, NOT_SUPPORTED, Out, Ret, struct_version,
};
use crate::state::{Dev, device_call};
use gpu_sim::fans::{FAN_MAX_PERCENT, FAN_MIN_PERCENT};
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_uint;

/// Speed of `fan`, percent.
fn speed(d: &Dev, fan: c_uint) -> Result<c_uint, Ret> {
    let fans = board(d)?.fans;
    if fans == 0 {
        return Err(NOT_SUPPORTED);
    }
    d.node()
        .fan_speed_percent(d.index, fan, d.t)
        .ok_or(INVALID_ARGUMENT)
}

/// Speed of `fan` for the getters that name a fan (and `nvmlDeviceGetMinMaxFanSpeed`):
/// on a fanless board every index is past the last fan, so `INVALID_ARGUMENT`, as the
/// real driver answers (H100, 580.159.04); only the index-less `nvmlDeviceGetFanSpeed`
/// is `NOT_SUPPORTED`.
fn indexed_speed(d: &Dev, fan: c_uint) -> Result<c_uint, Ret> {
    if board(d)?.fans == 0 {
        return Err(INVALID_ARGUMENT);
    }
    speed(d, fan)
}

/// The board's fans (0 when passively cooled).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(
    device: nvmlDevice_t,
    numFans: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNumFans");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(numFans) };
    device_call(device, |d| out.set(board(d)?.fans))
}

/// The first fan's speed, percent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(
    device: nvmlDevice_t,
    speed_: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetFanSpeed");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(speed_) };
    device_call(device, |d| out.set(speed(d, 0)?))
}

/// One fan's speed, percent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: nvmlDevice_t,
    fan: c_uint,
    speed_: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetFanSpeed_v2");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(speed_) };
    device_call(device, |d| out.set(indexed_speed(d, fan)?))
}

/// The speed the fan is driven to: the curve's, reached at once in the model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTargetFanSpeed(
    device: nvmlDevice_t,
    fan: c_uint,
    targetSpeed: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTargetFanSpeed");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(targetSpeed) };
    device_call(device, |d| out.set(indexed_speed(d, fan)?))
}

/// The fan curve's range, percent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinMaxFanSpeed(
    device: nvmlDevice_t,
    minSpeed: *mut c_uint,
    maxSpeed: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMinMaxFanSpeed");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (lo, hi) = unsafe { (Out::new(minSpeed), Out::new(maxSpeed)) };
    device_call(device, |d| {
        indexed_speed(d, 0)?;
        if lo.is_null() || hi.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        lo.set(FAN_MIN_PERCENT)?;
        hi.set(FAN_MAX_PERCENT)
    })
}

/// One fan's speed in RPM; the caller names the fan in the versioned struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeedRPM(
    device: nvmlDevice_t,
    fanSpeed: *mut nvmlFanSpeedInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetFanSpeedRPM");
    // SAFETY: NVML contract: `fanSpeed` is null or valid for one struct the caller set.
    let io = unsafe { InOut::new(fanSpeed) };
    device_call(device, |d| {
        let info = io.get()?;
        if info.version != struct_version::<nvmlFanSpeedInfo_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        indexed_speed(d, info.fan)?;
        info.speed = d
            .node()
            .fan_speed_rpm(d.index, info.fan, d.t)
            .ok_or(INVALID_ARGUMENT)?;
        Ok(())
    })
}

/// Every fan follows the temperature curve (`NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanControlPolicy_v2(
    device: nvmlDevice_t,
    fan: c_uint,
    policy: *mut nvmlFanControlPolicy_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetFanControlPolicy_v2");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(policy) };
    device_call(device, |d| {
        indexed_speed(d, fan)?;
        out.set(NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW)
    })
}
