//! XID events on the real scenario clock: each XID is delivered once per event set, a
//! wait with nothing due blocks for its whole timeout, and an XID that falls due during
//! a wait is delivered promptly.

mod common;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;
use std::time::{Duration, Instant};

const SCENARIO: &str = "events.toml";

fn nvml() -> &'static (Nvml, Instant) {
    common::shared(SCENARIO, None)
}

fn model() -> gpu_sim::SimNode {
    common::model(SCENARIO, 0.0)
}

#[test]
fn xid_is_delivered_once_then_the_wait_blocks_and_times_out() {
    let (nvml, _) = nvml();
    let m = model();
    let gpu = nvml.device_by_index(1).unwrap();
    assert_eq!(
        gpu.supported_event_types().unwrap(),
        EventTypes::CRITICAL_XID_ERROR
    );
    let set = gpu
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .map_err(|e| e.error)
        .unwrap();

    let start = Instant::now();
    let ev = set.wait(5_000).expect("the XID due at second 0");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "a due event returns at once"
    );
    assert_eq!(ev.event_type, EventTypes::CRITICAL_XID_ERROR);
    assert_eq!(
        ev.event_data,
        Some(XidError::Value(m.xids_between(-1.0, 0.0)[0].code))
    );
    assert_eq!(ev.device.uuid().unwrap(), m.gpus[1].uuid);

    // Delivered exactly once: the next wait blocks for the whole timeout.
    let start = Instant::now();
    assert!(matches!(set.wait(400), Err(NvmlError::Timeout)));
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_mig_xid_arriving_mid_wait_is_delivered_promptly_with_instance_ids() {
    let (nvml, init) = nvml();
    let m = model();
    let xid = m.xids_between(0.0, 10.0)[0];
    let inst = m.gpus[0]
        .mig
        .iter()
        .find(|i| Some(i.gpu_instance_id) == xid.gpu_instance)
        .unwrap();
    let gpu = nvml.device_by_index(0).unwrap();
    let set = gpu
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .map_err(|e| e.error)
        .unwrap();

    // Raw wait, to read the GPU-/compute-instance IDs nvml-wrapper drops.
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: a live event set and a valid out-struct.
    let rc = unsafe {
        nvml.lib()
            .nvmlEventSetWait_v2(set.handle(), &mut data, 10_000)
    };
    let since_init = init.elapsed();
    assert_eq!(rc, 0);
    let due = Duration::from_secs_f64(xid.at_s);
    assert!(
        since_init >= due - Duration::from_millis(100),
        "{since_init:?}"
    );
    assert!(
        since_init < due + Duration::from_secs(2),
        "not delivered promptly: {since_init:?}"
    );
    assert_eq!(data.eventType, u64::from(nvmlEventTypeXidCriticalError));
    assert_eq!(data.eventData, xid.code);
    assert_eq!(data.gpuInstanceId, inst.gpu_instance_id);
    assert_eq!(data.computeInstanceId, inst.compute_instance_id);
    // SAFETY: raw handles are only compared.
    assert_eq!(data.device, unsafe { gpu.handle() });

    // Not again, and the whole-GPU XID of GPU 1 is not for this set.
    let start = Instant::now();
    assert!(matches!(set.wait(300), Err(NvmlError::Timeout)));
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[test]
fn non_mig_xids_carry_no_instance_ids_and_unsupported_types_are_refused() {
    let (nvml, _) = nvml();
    let gpu = nvml.device_by_index(1).unwrap();
    let set = nvml.create_event_set().unwrap();
    // SAFETY: a live set and device handle.
    let rc = unsafe {
        nvml.lib().nvmlDeviceRegisterEvents(
            gpu.handle(),
            u64::from(nvmlEventTypeClock),
            set.handle(),
        )
    };
    assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
    let set = gpu
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .map_err(|e| e.error)
        .unwrap();
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: a live event set and a valid out-struct.
    let rc = unsafe {
        nvml.lib()
            .nvmlEventSetWait_v2(set.handle(), &mut data, 5_000)
    };
    assert_eq!(rc, 0);
    assert_eq!(
        (data.gpuInstanceId, data.computeInstanceId),
        (u32::MAX, u32::MAX)
    );
}
