//! XID errors from NVML's event API, on a dedicated thread: `nvmlEventSetWait` blocks,
//! so it must never run on the sampler. Events queue here until the sampler drains them,
//! so each is counted exactly once. Raw calls throughout: nvml-wrapper's
//! `register_events` frees the whole set when one GPU refuses, and its wait drops the
//! MIG instance of an event.

use super::raw;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::nvml_try;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventSet_t};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// `nvmlEventTypeXidCriticalError`.
const XID_CRITICAL_ERROR: u64 = 0x8;
/// How long one wait blocks, so that a stop request is seen promptly.
const WAIT_MS: u32 = 500;

/// An XID as the driver reported it.
#[derive(Debug, Clone, Copy)]
pub struct RawXid {
    /// The device handle, as an address.
    pub device: usize,
    /// GPU-instance ID, or `None` when not attributed to a MIG instance.
    pub gpu_instance: Option<u32>,
    pub code: u64,
    pub at: SystemTime,
}

/// The running watcher; stops its thread when dropped.
pub struct XidWatcher {
    stop: Arc<AtomicBool>,
    queue: Arc<Mutex<Vec<RawXid>>>,
}

/// A device handle that may cross to the watcher thread.
#[derive(Clone, Copy)]
struct Handle(usize);

impl XidWatcher {
    /// Register XID events on every GPU handle given and start waiting for them.
    pub fn start(nvml: &'static Nvml, devices: Vec<nvmlDevice_t>) -> XidWatcher {
        let stop = Arc::new(AtomicBool::new(false));
        let queue = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<Handle> = devices.into_iter().map(|d| Handle(d as usize)).collect();
        let (thread_stop, thread_queue) = (stop.clone(), queue.clone());
        let spawned = std::thread::Builder::new()
            .name("nvml-events".into())
            .spawn(move || watch(nvml, handles, &thread_stop, &thread_queue));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the XID event thread; XIDs will not be counted");
        }
        XidWatcher { stop, queue }
    }

    /// The XIDs reported since the last call.
    pub fn drain(&self) -> Vec<RawXid> {
        self.queue
            .lock()
            .map(|mut q| std::mem::take(&mut *q))
            .unwrap_or_default()
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn watch(nvml: &'static Nvml, devices: Vec<Handle>, stop: &AtomicBool, queue: &Mutex<Vec<RawXid>>) {
    let lib = nvml.lib();
    let (Ok(create), Ok(register), Ok(free)) = (
        lib.nvmlEventSetCreate.as_ref(),
        lib.nvmlDeviceRegisterEvents.as_ref(),
        lib.nvmlEventSetFree.as_ref(),
    ) else {
        tracing::warn!("this NVML has no event API; XIDs will not be counted");
        return;
    };
    let mut set: nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: `set` is a valid out-pointer for the new event set.
    if let Err(e) = nvml_try(unsafe { create(&mut set) }) {
        tracing::warn!(error = %e, "cannot create an NVML event set; XIDs will not be counted");
        return;
    }
    let mut registered = 0;
    for Handle(d) in &devices {
        // SAFETY: `d` is a live device handle of this NVML instance and `set` was just created.
        match nvml_try(unsafe { register(*d as nvmlDevice_t, XID_CRITICAL_ERROR, set) }) {
            Ok(()) => registered += 1,
            Err(e) => tracing::warn!(error = %e, "GPU does not report XID events"),
        }
    }
    if registered > 0 {
        tracing::debug!(gpus = registered, "watching XID events");
        while !stop.load(Ordering::Relaxed) {
            match raw::wait_event(nvml, set, WAIT_MS) {
                Ok(Some(ev)) if ev.event_type & XID_CRITICAL_ERROR != 0 => {
                    if let Ok(mut q) = queue.lock() {
                        q.push(RawXid {
                            device: ev.device,
                            // NVML marks "no instance" with all ones.
                            gpu_instance: (ev.gpu_instance_id != u32::MAX)
                                .then_some(ev.gpu_instance_id),
                            code: ev.data,
                            at: SystemTime::now(),
                        });
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for NVML events failed; stopping the XID watcher");
                    break;
                }
            }
        }
    }
    // SAFETY: `set` is a live event set created above and no longer used.
    let _ = unsafe { free(set) };
}
