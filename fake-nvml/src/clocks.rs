//! Clocks of every type and ID, applications and customer-boost clocks, supported
//! clocks and performance states. Graphics and SM clocks are the model's SM clock; the
//! video clock scales with it up to the board's highest video clock.

use crate::ffi::{
    INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, Out, Ret, fill_list,
};
use crate::state::{Dev, device_call};
use gpu_sim::Capability;
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_uint;

/// The performance state a data-centre board in persistence mode stays in.
pub const PERFORMANCE_STATE: nvmlPstates_t = nvmlPStates_enum_NVML_PSTATE_0;
/// Step between supported graphics clocks, MHz.
pub const GRAPHICS_CLOCK_STEP_MHZ: u32 = 15;

/// The current clock of a type.
pub(crate) fn current_clock(d: &Dev, type_: nvmlClockType_t) -> Result<c_uint, Ret> {
    let r = d.reading(Capability::Clocks)?;
    let m = d.gpu.model;
    Ok(match type_ {
        nvmlClockType_enum_NVML_CLOCK_GRAPHICS | nvmlClockType_enum_NVML_CLOCK_SM => r.sm_clock_mhz,
        nvmlClockType_enum_NVML_CLOCK_MEM => r.mem_clock_mhz,
        nvmlClockType_enum_NVML_CLOCK_VIDEO => {
            (u64::from(m.board.max_video_clock_mhz) * u64::from(r.sm_clock_mhz)
                / u64::from(m.max_sm_clock_mhz.max(1))) as c_uint
        }
        _ => return Err(INVALID_ARGUMENT),
    })
}

/// The highest clock of a type (also the applications, default applications and
/// customer-boost clocks).
pub(crate) fn max_clock(d: &Dev, type_: nvmlClockType_t) -> Result<c_uint, Ret> {
    d.whole_gpu()?;
    d.require(Capability::Clocks)?;
    let m = d.gpu.model;
    Ok(match type_ {
        nvmlClockType_enum_NVML_CLOCK_GRAPHICS | nvmlClockType_enum_NVML_CLOCK_SM => {
            m.max_sm_clock_mhz
        }
        nvmlClockType_enum_NVML_CLOCK_MEM => m.mem_clock_mhz,
        nvmlClockType_enum_NVML_CLOCK_VIDEO => m.board.max_video_clock_mhz,
        _ => return Err(INVALID_ARGUMENT),
    })
}

/// Application clocks (target and default): graphics, SM and memory only. The real
/// driver (H100, 580.159.04) answers `NOT_SUPPORTED` for the video clock.
pub(crate) fn applications_clock(d: &Dev, type_: nvmlClockType_t) -> Result<c_uint, Ret> {
    match type_ {
        nvmlClockType_enum_NVML_CLOCK_VIDEO => {
            max_clock(d, type_)?;
            Err(NOT_SUPPORTED)
        }
        _ => max_clock(d, type_),
    }
}

/// The customer boost clock exists for graphics and SM only; memory and video answer
/// `NOT_SUPPORTED` on the real driver (H100, 580.159.04).
pub(crate) fn customer_boost_clock(d: &Dev, type_: nvmlClockType_t) -> Result<c_uint, Ret> {
    match type_ {
        nvmlClockType_enum_NVML_CLOCK_MEM | nvmlClockType_enum_NVML_CLOCK_VIDEO => {
            max_clock(d, type_)?;
            Err(NOT_SUPPORTED)
        }
        _ => max_clock(d, type_),
    }
}

/// The lowest clock of a type in P0: the idle clock (HBM runs at one clock).
fn min_clock(d: &Dev, type_: nvmlClockType_t) -> Result<c_uint, Ret> {
    let m = d.gpu.model;
    Ok(match type_ {
        nvmlClockType_enum_NVML_CLOCK_GRAPHICS | nvmlClockType_enum_NVML_CLOCK_SM => {
            m.idle_sm_clock_mhz
        }
        nvmlClockType_enum_NVML_CLOCK_VIDEO => {
            (u64::from(m.board.max_video_clock_mhz) * u64::from(m.idle_sm_clock_mhz)
                / u64::from(m.max_sm_clock_mhz.max(1))) as c_uint
        }
        other => max_clock(d, other)?,
    })
}

/// Graphics clocks from the highest down to the idle clock.
fn supported_graphics_clocks(d: &Dev) -> Vec<c_uint> {
    let m = d.gpu.model;
    (m.idle_sm_clock_mhz..=m.max_sm_clock_mhz)
        .rev()
        .step_by(GRAPHICS_CLOCK_STEP_MHZ as usize)
        .collect()
}

/// Adaptive clocking is on, as on every Hopper board.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAdaptiveClockInfoStatus(
    device: nvmlDevice_t,
    adaptiveClockStatus: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAdaptiveClockInfoStatus");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(adaptiveClockStatus) };
    device_call(device, |d| {
        out.set({
            d.reading(Capability::Clocks)?;
            NVML_ADAPTIVE_CLOCKING_INFO_STATUS_ENABLED
        })
    })
}

/// The board's highest clock of the type: H100 SXM boards ship with applications clocks at the maximum.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(
    device: nvmlDevice_t,
    clockType: nvmlClockType_t,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetApplicationsClock");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(clockMHz) };
    device_call(device, |d| out.set(applications_clock(d, clockType)?))
}

/// Current, applications (target and default) and customer-boost clocks of every type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    device: nvmlDevice_t,
    clockType: nvmlClockType_t,
    clockId: nvmlClockId_t,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetClock");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(clockMHz) };
    device_call(device, |d| {
        out.set(match clockId {
            nvmlClockId_enum_NVML_CLOCK_ID_CURRENT => current_clock(d, clockType)?,
            nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_TARGET
            | nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_DEFAULT => applications_clock(d, clockType)?,
            nvmlClockId_enum_NVML_CLOCK_ID_CUSTOMER_BOOST_MAX => {
                customer_boost_clock(d, clockType)?
            }
            _ => return Err(INVALID_ARGUMENT),
        })
    })
}

/// The board's highest clock of the type: H100 SXM boards ship with applications clocks at the maximum.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(
    device: nvmlDevice_t,
    clockType: nvmlClockType_t,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDefaultApplicationsClock");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(clockMHz) };
    device_call(device, |d| out.set(applications_clock(d, clockType)?))
}

/// The board's highest clock of the type: H100 SXM boards ship with applications clocks at the maximum.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxCustomerBoostClock(
    device: nvmlDevice_t,
    clockType: nvmlClockType_t,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMaxCustomerBoostClock");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(clockMHz) };
    device_call(device, |d| out.set(customer_boost_clock(d, clockType)?))
}

/// P0 spans the idle to the highest clock of the type; other states are `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinMaxClockOfPState(
    device: nvmlDevice_t,
    type_: nvmlClockType_t,
    pstate: nvmlPstates_t,
    minClockMHz: *mut c_uint,
    maxClockMHz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMinMaxClockOfPState");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (a, b) = unsafe { (Out::new(minClockMHz), Out::new(maxClockMHz)) };
    device_call(device, |d| {
        if pstate != PERFORMANCE_STATE {
            return Err(NOT_SUPPORTED);
        }
        let max = max_clock(d, type_)?;
        let min = min_clock(d, type_)?;
        if a.is_null() || b.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        a.set(min)?;
        b.set(max)
    })
}

/// P0: a data-centre board in persistence mode stays in P0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    pState: *mut nvmlPstates_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPerformanceState");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pState) };
    device_call(device, |d| {
        out.set({
            d.reading(Capability::Clocks)?;
            PERFORMANCE_STATE
        })
    })
}

/// Same as the performance state (the older name of the call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerState(
    device: nvmlDevice_t,
    pState: *mut nvmlPstates_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerState");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pState) };
    device_call(device, |d| {
        out.set({
            d.reading(Capability::Clocks)?;
            PERFORMANCE_STATE
        })
    })
}

/// Graphics clocks from the maximum down to the idle clock in 15 MHz steps, for the
/// supported memory clock; any other memory clock is `NOT_FOUND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedGraphicsClocks(
    device: nvmlDevice_t,
    memoryClockMHz: c_uint,
    count: *mut c_uint,
    clocksMHz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSupportedGraphicsClocks");
    device_call(device, |d| {
        if memoryClockMHz != max_clock(d, nvmlClockType_enum_NVML_CLOCK_MEM)? {
            return Err(NOT_FOUND);
        }
        let list = supported_graphics_clocks(d);
        // SAFETY: NVML contract: `count` is valid and `clocksMHz` is null or holds `*count` entries.
        unsafe { fill_list(count, clocksMHz, &list) }
    })
}

/// The one memory clock of an HBM board.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedMemoryClocks(
    device: nvmlDevice_t,
    count: *mut c_uint,
    clocksMHz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSupportedMemoryClocks");
    device_call(device, |d| {
        let m = max_clock(d, nvmlClockType_enum_NVML_CLOCK_MEM)?;
        // SAFETY: NVML contract: `count` is valid and `clocksMHz` is null or holds `*count` entries.
        unsafe { fill_list(count, clocksMHz, &[m]) }
    })
}

/// P0 only; the rest of the array is `NVML_PSTATE_UNKNOWN`. `size` is in bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedPerformanceStates(
    device: nvmlDevice_t,
    pstates: *mut nvmlPstates_t,
    size: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSupportedPerformanceStates");
    // SAFETY: NVML contract: `pstates` is null or valid for `size` bytes.
    let states = unsafe {
        crate::ffi::in_slice(
            pstates,
            size as usize / std::mem::size_of::<nvmlPstates_t>(),
        )
    };
    device_call(device, |d| {
        d.reading(Capability::Clocks)?;
        let states = states.ok_or(INVALID_ARGUMENT)?;
        let (first, rest) = states.split_first_mut().ok_or(INSUFFICIENT_SIZE)?;
        *first = PERFORMANCE_STATE;
        rest.fill(nvmlPStates_enum_NVML_PSTATE_UNKNOWN);
        Ok(())
    })
}
