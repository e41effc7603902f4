//! An R550 driver predates `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: the field answers
//! NOT_SUPPORTED while the older remap field still answers.

mod common;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::*;

#[test]
fn the_recovery_action_is_not_supported_before_r570() {
    let nvml = &common::shared("health-signals-r550.toml", Some(100.0)).0;
    let d = nvml.device_by_index(1).unwrap();
    let got = d
        .field_values_for(&[
            FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
            FieldId(NVML_FI_DEV_REMAPPED_PENDING),
        ])
        .unwrap();
    let action = got[0].as_ref().unwrap();
    assert!(matches!(action.value, Err(NvmlError::NotSupported)));
    assert!(got[1].as_ref().unwrap().value.is_ok());
}
