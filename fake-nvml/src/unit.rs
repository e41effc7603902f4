//! S-class units: an HGX node has none.

use crate::ffi::Out;
use crate::state::system_call;
use crate::unsupported::no_such_handle;
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_uint;

/// No S-class units.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetCount(unitCount: *mut c_uint) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetCount");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(unitCount) };
    system_call(|_, _| out.set(0))
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetDevices(
    _unit: nvmlUnit_t,
    _deviceCount: *mut c_uint,
    _devices: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetDevices");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetFanSpeedInfo(
    _unit: nvmlUnit_t,
    _fanSpeeds: *mut nvmlUnitFanSpeeds_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetFanSpeedInfo");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetHandleByIndex(
    _index: c_uint,
    _unit: *mut nvmlUnit_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetHandleByIndex");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetLedState(
    _unit: nvmlUnit_t,
    _state: *mut nvmlLedState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetLedState");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetPsuInfo(
    _unit: nvmlUnit_t,
    _psu: *mut nvmlPSUInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetPsuInfo");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetTemperature(
    _unit: nvmlUnit_t,
    _type_: c_uint,
    _temp: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetTemperature");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetUnitInfo(
    _unit: nvmlUnit_t,
    _info: *mut nvmlUnitInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitGetUnitInfo");
    no_such_handle()
}

/// No such object exists on this node, so no handle for it is valid: `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitSetLedState(
    _unit: nvmlUnit_t,
    _color: nvmlLedColor_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlUnitSetLedState");
    no_such_handle()
}
