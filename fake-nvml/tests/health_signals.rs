//! Issue 17's health signals through the NVML ABI: pending row remaps, the pending ECC
//! mode and the GPU recovery action, as fields and getters, against gpu-sim's model.

mod common;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::*;
use nvml_wrapper::{Device, Nvml};

const SCENARIO: &str = "health-signals.toml";
const T: f64 = 100.0;

fn nvml() -> &'static Nvml {
    &common::shared(SCENARIO, Some(T)).0
}

fn dev(i: u32) -> Device<'static> {
    nvml().device_by_index(i).expect("device by index")
}

/// Each field's value, or its own error.
fn fields(i: u32, ids: &[u32]) -> Vec<Result<u64, NvmlError>> {
    let ids: Vec<FieldId> = ids.iter().map(|&id| FieldId(id)).collect();
    dev(i)
        .field_values_for(&ids)
        .unwrap()
        .into_iter()
        .map(|s| {
            let s = s?;
            Ok(match s.value? {
                nvml_wrapper::enums::device::SampleValue::U32(v) => u64::from(v),
                nvml_wrapper::enums::device::SampleValue::U64(v) => v,
                other => panic!("unexpected type {other:?}"),
            })
        })
        .collect()
}

#[test]
fn the_fields_answer_what_the_model_holds_at_the_instant() {
    let m = common::model(SCENARIO, T);
    let ids = [
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_ECC_CURRENT,
        NVML_FI_DEV_ECC_PENDING,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    ];
    for i in 0..2u32 {
        let r = m.gpu_reading(i, T);
        let got = fields(i, &ids);
        let want = [
            u64::from(r.remap_pending),
            u64::from(r.ecc_mode_current),
            u64::from(r.ecc_mode_pending),
            u64::from(r.recovery_action),
        ];
        for (k, w) in want.iter().enumerate() {
            assert_eq!(got[k].as_ref().ok(), Some(w), "GPU {i} field {}", ids[k]);
        }
    }
    // The faults before T show, the one after does not: an independent oracle for the
    // model itself.
    let (r0, r1) = (m.gpu_reading(0, T), m.gpu_reading(1, T));
    assert!(r0.remap_pending && !r1.remap_pending);
    assert_eq!((r0.recovery_action, r1.recovery_action), (0, 2));
    assert!(r0.ecc_mode_current && !r0.ecc_mode_pending && r1.ecc_mode_pending);
    // The L4 lists ECC and row remapping as unsupported; the recovery action it has.
    let l4 = fields(2, &ids);
    assert!(matches!(l4[0], Err(NvmlError::NotSupported)), "{l4:?}");
    assert!(matches!(l4[1], Err(NvmlError::NotSupported)), "{l4:?}");
    assert!(matches!(l4[3], Ok(0)), "{l4:?}");
}

#[test]
fn the_getters_agree_with_the_fields() {
    let d = dev(0);
    let ecc = d.is_ecc_enabled().unwrap();
    assert!(ecc.currently_enabled && !ecc.pending_enabled);
    let (mut cor, mut unc, mut pend, mut fail) = (0, 0, 0, 0);
    // SAFETY: valid handle and out-pointers.
    let rc = unsafe {
        nvml()
            .lib()
            .nvmlDeviceGetRemappedRows(d.handle(), &mut cor, &mut unc, &mut pend, &mut fail)
    };
    assert_eq!((rc, unc, pend, fail), (0, 1, 1, 0));
    assert!(matches!(
        dev(2).is_ecc_enabled(),
        Err(NvmlError::NotSupported)
    ));
}
