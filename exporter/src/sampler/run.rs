//! The sampling thread: one cycle per interval, and a hung driver reported, not waited on.

use super::Sampler;
use crate::snapshot::{Snapshot, SnapshotStore};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

/// A cycle that has not finished after this many intervals counts as hung.
pub const HUNG_INTERVALS: u32 = 3;

/// Run the sampler until `stop` receives or disconnects, publishing into `store`.
///
/// Cycles run on a worker thread so that a GPU call that never returns cannot silence
/// the exporter: after [`HUNG_INTERVALS`] intervals without a result this thread
/// publishes a snapshot that says the source is hung (no device data, `source_up` 0,
/// `source_hung` 1), and keeps doing so until the worker comes back.
pub fn run(sampler: Sampler, store: Arc<SnapshotStore>, stop: Receiver<()>) {
    let interval = sampler.opts.interval;
    let budget = interval * HUNG_INTERVALS;
    let (tick_tx, tick_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<Snapshot>(1);
    let mut sampler = sampler;
    let worker = std::thread::Builder::new()
        .name("sampler-worker".into())
        .spawn(move || {
            while tick_rx.recv().is_ok() {
                if done_tx.send(sampler.cycle()).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = worker {
        tracing::error!(error = %e, "cannot start the sampling thread");
        return;
    }
    let mut next = Instant::now();
    loop {
        if tick_tx.send(()).is_err() {
            return;
        }
        let started = Instant::now();
        let mut hung = false;
        loop {
            match done_rx.recv_timeout(budget.min(interval)) {
                Ok(snap) => {
                    if hung {
                        tracing::info!(after = ?started.elapsed(), "GPU source answers again");
                    }
                    store.store(Arc::new(snap));
                    break;
                }
                Err(RecvTimeoutError::Timeout) if started.elapsed() >= budget => {
                    if !hung {
                        tracing::error!(budget = ?budget, "a GPU call has not returned; reporting the source as hung");
                    }
                    hung = true;
                    store.store(Arc::new(Snapshot::hung(&store.load())));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            match stop.try_recv() {
                Ok(()) | Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
            }
        }
        next += interval;
        let now = Instant::now();
        if next < now {
            // A cycle overran the interval: start the next one now, without a burst.
            next = now;
        }
        match stop.recv_timeout(next - now) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
