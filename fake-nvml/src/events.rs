//! Event sets: the scenario's XIDs, each delivered once per set, in time order, once
//! scenario time has reached it.

use crate::ffi::{INVALID_ARGUMENT, NOT_SUPPORTED, Out, TIMEOUT};
use crate::processes::NO_ID;
use crate::state::{Sim, device_call, handle, system_call};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

/// The only event type the model produces.
pub const XID_EVENT: u64 = nvmlEventTypeXidCriticalError as u64;
/// How often a blocked wait looks for newly due events.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// One event set: what is registered on it and which XIDs it has delivered.
#[derive(Default)]
pub(crate) struct EventSet {
    /// `(gpu, MIG instance, event mask)` per registered handle.
    registered: Vec<(u32, Option<usize>, u64)>,
    /// Indices into [`Sim::xids`] already delivered through this set.
    delivered: Vec<usize>,
}

impl EventSet {
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
            .find_map(|(i, x)| {
                let g = &sim.node.gpus[x.gpu as usize];
                self.registered.iter().find_map(|&(gpu, mig, mask)| {
                    let fits = gpu == x.gpu
                        && mask & XID_EVENT != 0
                        && mig.is_none_or(|m| x.gpu_instance == Some(g.mig[m].gpu_instance_id));
                    fits.then_some((i, x, mig))
                })
            })?;
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
            .ok_or(INVALID_ARGUMENT)
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

/// Deliver the next due XID at once; otherwise block, polling every
/// [`POLL_INTERVAL`], until one falls due or `timeoutms` has passed (`TIMEOUT`).
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
        loop {
            let t = sim.now();
            let next = sim
                .event_sets
                .with(set as usize, |s| s.take_next(sim, t))
                .ok_or(INVALID_ARGUMENT)?;
            if let Some(event) = next {
                return out.set(event);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TIMEOUT);
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
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
            .map(drop)
            .ok_or(INVALID_ARGUMENT)
    })
}
