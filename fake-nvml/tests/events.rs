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

/// A wait blocks on a condition variable until the set's next XID; a registration made
/// while it waits (here: GPU 1, whose XID is already due) wakes it at once instead of
/// leaving it asleep until its timeout.
/// The shared library handle alone.
fn shared_nvml() -> &'static Nvml {
    &nvml().0
}

#[test]
fn a_registration_during_a_wait_wakes_it() {
    let lib = shared_nvml().lib();
    let mut set: nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { lib.nvmlEventSetCreate(&mut set) }, 0);
    let set_addr = set as usize;
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // "/proc/thread-self" links to "PID/task/TID".
        let me = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        tid_tx.send(me).unwrap();
        // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
        let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
        let start = Instant::now();
        // SAFETY: a live event set (freed only after this thread is joined) and a valid
        // out-struct.
        let rc = unsafe {
            nvml()
                .0
                .lib()
                .nvmlEventSetWait_v2(set_addr as nvmlEventSet_t, &mut data, 10_000)
        };
        (rc, data.eventData, start.elapsed())
    });
    // Register only once the waiter sleeps in the wait on the empty set: state `S` in
    // its /proc stat, held for 100 ms (a lock taken on the way in is held for
    // microseconds), so the registration must wake it.
    let task = std::path::Path::new("/proc").join(tid_rx.recv().unwrap());
    let sleeping = || {
        std::fs::read_to_string(task.join("stat"))
            .unwrap_or_default()
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('S'))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut asleep_since = None;
    while asleep_since.is_none_or(|s: Instant| s.elapsed() < Duration::from_millis(100)) {
        assert!(Instant::now() < deadline, "the waiter never blocked");
        asleep_since = if sleeping() {
            asleep_since.or(Some(Instant::now()))
        } else {
            None
        };
        std::thread::yield_now();
    }
    let gpu = shared_nvml().device_by_index(1).unwrap();
    // SAFETY: a live device handle and event set.
    let rc = unsafe {
        lib.nvmlDeviceRegisterEvents(gpu.handle(), u64::from(nvmlEventTypeXidCriticalError), set)
    };
    assert_eq!(rc, 0);
    let (rc, code, waited) = waiter.join().unwrap();
    assert_eq!(rc, 0, "the wait should deliver GPU 1's XID");
    assert_eq!(code, model().xids_between(-1.0, 0.0)[0].code);
    assert!(
        waited < Duration::from_secs(5),
        "the registration did not wake the wait: {waited:?}"
    );
    // SAFETY: the set is live and no longer waited on.
    assert_eq!(unsafe { lib.nvmlEventSetFree(set) }, 0);
}
