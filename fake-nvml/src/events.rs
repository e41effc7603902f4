//! Event sets: the scenario's XIDs, each delivered once per set, in time order, once
//! scenario time has reached it.

use crate::ffi::{INVALID_ARGUMENT, NOT_SUPPORTED, Out, TIMEOUT};
use crate::processes::NO_ID;
use crate::state::{Sim, device_call, handle, system_call};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The only event type the model produces.
pub const XID_EVENT: u64 = nvmlEventTypeXidCriticalError as u64;
/// Shortest sleep of a blocked wait, so float rounding at an XID's instant cannot spin.
pub const MIN_WAIT: Duration = Duration::from_millis(1);

/// Bumped (and waiters woken) whenever a registration or a set changes, since that can
/// make an XID deliverable before a waiter's computed wake-up time.
static CHANGES: (Mutex<u64>, Condvar) = (Mutex::new(0), Condvar::new());

fn changes() -> std::sync::MutexGuard<'static, u64> {
    CHANGES.0.lock().unwrap_or_else(|e| e.into_inner())
}

fn announce_change() {
    *changes() += 1;
    CHANGES.1.notify_all();
}

/// One event set: what is registered on it and which XIDs it has delivered.
#[derive(Default)]
pub(crate) struct EventSet {
    /// `(gpu, MIG instance, event mask)` per registered handle.
    registered: Vec<(u32, Option<usize>, u64)>,
    /// Indices into [`Sim::xids`] already delivered through this set.
    delivered: Vec<usize>,
}

impl EventSet {
    /// The registration (its MIG instance, if any) through which `x` reaches this set.
    fn registration_for(&self, sim: &Sim, x: &gpu_sim::XidEvent) -> Option<Option<usize>> {
        let g = &sim.node.gpus[x.gpu as usize];
        self.registered.iter().find_map(|&(gpu, mig, mask)| {
            let fits = gpu == x.gpu
                && mask & XID_EVENT != 0
                && mig.is_none_or(|m| x.gpu_instance == Some(g.mig[m].gpu_instance_id));
            fits.then_some(mig)
        })
    }

    /// Scenario instant of the first XID after `t` that this set will deliver.
    fn next_due_after(&self, sim: &Sim, t: f64) -> Option<f64> {
        sim.xids
            .iter()
            .filter(|x| x.at_s > t)
            .find(|x| self.registration_for(sim, x).is_some())
            .map(|x| x.at_s)
    }

    /// The next due XID this set has not delivered, marking it delivered. A set
    /// registered on a GPU gets the XIDs of the GPU and all its MIG instances (reported
    /// on the GPU handle); one registered on a MIG handle gets that instance's only.
    fn take_next(&mut self, sim: &Sim, t: f64) -> Option<nvmlEventData_t> {
        let (i, x, mig) = sim
            .xids
            .iter()
            .enumerate()
            .take_while(|(_, x)| x.at_s <= t)
            .filter(|(i, _)| !self.delivered.contains(i))
            .find_map(|(i, x)| self.registration_for(sim, x).map(|mig| (i, x, mig)))?;
        self.delivered.push(i);
        let instance = x.gpu_instance.and_then(|gi| {
            sim.node.gpus[x.gpu as usize]
                .mig
                .iter()
                .find(|m| m.gpu_instance_id == gi)
        });
        Some(nvmlEventData_t {
            device: handle(x.gpu, mig),
            eventType: XID_EVENT,
            eventData: x.code,
            gpuInstanceId: x.gpu_instance.unwrap_or(NO_ID),
            computeInstanceId: instance.map_or(NO_ID, |m| m.compute_instance_id),
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetCreate");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(set) };
    system_call(|sim, _| {
        if out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let key = sim.event_sets.insert(EventSet::default());
        out.set(key as nvmlEventSet_t)
    })
}

/// Only `nvmlEventTypeXidCriticalError` is supported; asking for more is `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceRegisterEvents");
    device_call(device, |d| {
        if eventTypes & !XID_EVENT != 0 {
            return Err(NOT_SUPPORTED);
        }
        d.sim
            .event_sets
            .with(set as usize, |s| {
                match s
                    .registered
                    .iter_mut()
                    .find(|(g, m, _)| (*g, *m) == (d.index, d.mig))
                {
                    Some(r) => r.2 |= eventTypes,
                    None => s.registered.push((d.index, d.mig, eventTypes)),
                }
            })
            .ok_or(INVALID_ARGUMENT)?;
        announce_change();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSupportedEventTypes");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(eventTypes) };
    device_call(device, |_| out.set(XID_EVENT))
}

/// Deliver the next due XID at once; otherwise block, as the driver does, until one
/// falls due or `timeoutms` has passed (`TIMEOUT`). The wait sleeps on a condition
/// variable until the wall-clock instant of the set's next XID (never, with scenario
/// time frozen) or the timeout, whichever is first; registrations wake it early.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetWait_v2");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(data) };
    system_call(|sim, _| {
        if out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let deadline = Instant::now() + Duration::from_millis(timeoutms.into());
        let clock = sim.node.clock();
        loop {
            let seen = *changes();
            let t = sim.now();
            let (next, due) = sim
                .event_sets
                .with(set as usize, |s| {
                    (s.take_next(sim, t), s.next_due_after(sim, t))
                })
                .ok_or(INVALID_ARGUMENT)?;
            if let Some(event) = next {
                return out.set(event);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TIMEOUT);
            }
            let mut wait = deadline - now;
            if let Some(at) = due.filter(|_| !clock.is_frozen()) {
                let until_due = clock
                    .wall_time(at)
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                wait = wait.min(until_due.max(MIN_WAIT));
            }
            let guard = changes();
            drop(
                CHANGES
                    .1
                    .wait_timeout_while(guard, wait, |c| *c == seen)
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetWait");
    // SAFETY: same contract as `_v2`.
    unsafe { nvmlEventSetWait_v2(set, data, timeoutms) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetFree");
    system_call(|sim, _| {
        sim.event_sets
            .remove(set as usize)
            .ok_or(INVALID_ARGUMENT)?;
        announce_change();
        Ok(())
    })
}

/// The newer event interfaces: the set must exist; the model has no operational events
/// to give them.
fn operational_events_unsupported(set: nvmlEventSet_t) -> nvmlReturn_t {
    system_call(|sim, _| {
        sim.event_sets
            .with(set as usize, |_| ())
            .ok_or(INVALID_ARGUMENT)?;
        Err(NOT_SUPPORTED)
    })
}

/// Newer event interfaces: the set must exist; the model has no operational events to give them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetGetContextCount_v1(
    set: nvmlEventSet_t,
    _params: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetGetContextCount_v1");
    operational_events_unsupported(set)
}

/// Newer event interfaces: the set must exist; the model has no operational events to give them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetGetContextData_v1(
    set: nvmlEventSet_t,
    _params: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetGetContextData_v1");
    operational_events_unsupported(set)
}

/// Newer event interfaces: the set must exist; the model has no operational events to give them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetGetContextInfo_v1(
    set: nvmlEventSet_t,
    _params: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetGetContextInfo_v1");
    operational_events_unsupported(set)
}

/// Newer event interfaces: the set must exist; the model has no operational events to give them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1(
    set: nvmlEventSet_t,
    _params: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1");
    operational_events_unsupported(set)
}

/// Newer event interfaces: the set must exist; the model has no operational events to give them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetRegisterGpuOperationalEvents_v1(
    set: nvmlEventSet_t,
    _config: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetRegisterGpuOperationalEvents_v1");
    operational_events_unsupported(set)
}

/// Newer event interfaces: the set must exist; the model has no operational events to give them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v3(
    set: nvmlEventSet_t,
    _params: *mut c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlEventSetWait_v3");
    operational_events_unsupported(set)
}
