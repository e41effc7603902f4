//! Fans through the real nvml-wrapper (and the raw calls it leaves unwrapped): an
//! actively cooled board reports its fan's speed from the model's curve, a passively
//! cooled one reports no fans: `NOT_SUPPORTED` unindexed, `INVALID_ARGUMENT` for fan 0.

mod common;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;

const FILE: &str = "fans.toml";
const T: f64 = 15.0;

#[test]
fn fan_speeds_follow_the_model_and_fanless_boards_have_no_fan() {
    let (nvml, _) = common::shared(FILE, Some(T));
    let m = common::model(FILE, T);
    let ada = nvml.device_by_index(0).unwrap();
    let h100 = nvml.device_by_index(1).unwrap();
    let want = m.fan_speed_percent(0, 0, T).expect("the Ada board's fan");
    assert_eq!(ada.num_fans().unwrap(), 1);
    assert_eq!(ada.fan_speed(0).unwrap(), want);
    assert_eq!(
        ada.fan_speed_rpm(0).unwrap(),
        m.fan_speed_rpm(0, 0, T).unwrap()
    );
    assert!(matches!(ada.fan_speed(1), Err(NvmlError::InvalidArg)));
    // The first fan through the unversioned call, as DCGM reads DCGM_FI_DEV_FAN_SPEED.
    let mut speed = 0;
    // SAFETY: a live handle and a valid out-pointer.
    let rc = unsafe { nvml.lib().nvmlDeviceGetFanSpeed(ada.handle(), &mut speed) };
    assert_eq!((rc, speed), (nvmlReturn_enum_NVML_SUCCESS, want));
    let (mut lo, mut hi) = (0, 0);
    // SAFETY: as above.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetMinMaxFanSpeed(ada.handle(), &mut lo, &mut hi)
    };
    assert_eq!(rc, nvmlReturn_enum_NVML_SUCCESS);
    assert!(lo <= want && want <= hi, "{lo} <= {want} <= {hi}");

    assert_eq!(h100.num_fans().unwrap(), 0);
    // A named fan on a fanless board does not exist (the real H100's INVALID_ARGUMENT);
    // only the unindexed call says NOT_SUPPORTED.
    assert!(matches!(h100.fan_speed(0), Err(NvmlError::InvalidArg)));
    assert!(matches!(h100.fan_speed_rpm(0), Err(NvmlError::InvalidArg)));
    // SAFETY: as above.
    let rc = unsafe { nvml.lib().nvmlDeviceGetFanSpeed(h100.handle(), &mut speed) };
    assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
}
