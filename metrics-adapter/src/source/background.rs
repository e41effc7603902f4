//! CPU-bound source work (decoding a Prometheus round's answers: at 50,000 pods six
//! answers of about 8 MB, hundreds of milliseconds of parsing a round, and freeing the
//! last round's view) runs on one thread of lower CPU priority than the ones that
//! answer API requests, so a request arriving mid-round is not queued behind it.
//!
//! One thread, so a round's decoding never takes more than one core; niced, it runs in
//! what the answers leave, and a round, which takes seconds anyway, is barely longer.
//! Measured at 100,000 GPUs through Thanos on 2 cores (docs/benchmarks/fleet-scale.md),
//! the metric API's p99 under 1,000 HPAs was lower in each of three alternating pairs
//! than on the tokio blocking pool (12-16 ms against 14-19 ms): a small part of the
//! tail, most of which is the shared machine's.

use crate::error::Error;
use std::sync::OnceLock;
use std::sync::mpsc;

/// How much the decoding thread is niced below the request workers: at 0 they get
/// about ten times its share of a busy core, and it still gets seven times an engine
/// run at the lowest priority (19) on the same node.
pub const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The one background thread's queue, started at first use.
fn queue() -> Result<&'static mpsc::Sender<Job>, Error> {
    static QUEUE: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    if let Some(q) = QUEUE.get() {
        return Ok(q);
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("source-decode".into())
        .spawn(move || {
            lower_priority();
            for job in rx {
                job();
            }
        })
        .map_err(|e| Error::Scrape(format!("starting the decoding thread: {e}")))?;
    // A second caller racing this one may have set it first; its thread then serves,
    // and this one ends when its unused sender is dropped.
    Ok(QUEUE.get_or_init(|| tx))
}

/// Nice this thread by [`NICE`] more than it was started with (Linux's nice is per
/// thread); where that fails the work still runs, at the workers' priority.
fn lower_priority() {
    let tid = Some(rustix::thread::gettid());
    let lowered = rustix::process::getpriority_process(tid)
        .and_then(|now| rustix::process::setpriority_process(tid, (now + NICE).min(19)));
    if let Err(e) = lowered {
        tracing::debug!(error = %e, "could not lower the decoding thread's priority");
    }
}

/// Run `work` on the background thread and wait for its result. A panic in `work` is
/// this call's error; the thread goes on.
pub async fn run<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
            .unwrap_or_else(|_| Err(Error::Scrape("decoding a round's answer panicked".into())));
        let _ = tx.send(result);
    });
    queue()?
        .send(job)
        .map_err(|_| Error::Scrape("the decoding thread has stopped".into()))?;
    rx.await
        .map_err(|_| Error::Scrape("the decoding thread has stopped".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's nice value, from /proc (field 19 of its stat).
    fn nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    /// The work runs on another thread than the caller's, niced by NICE more, and
    /// gives its result back.
    #[tokio::test]
    async fn work_runs_niced_on_the_background_thread() {
        let caller = (std::thread::current().id(), nice());
        let (id, niced) = run(|| Ok((std::thread::current().id(), nice())))
            .await
            .unwrap();
        assert_ne!(id, caller.0);
        assert_eq!(
            niced,
            (caller.1 + NICE).min(19),
            "caller's nice {}",
            caller.1
        );
    }

    /// A panicking job is its caller's error, and the thread serves the next one.
    #[tokio::test]
    async fn a_panic_is_an_error_and_the_thread_goes_on() {
        let e = run::<()>(|| panic!("garbage")).await.unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert_eq!(run(|| Ok(7)).await.unwrap(), 7);
    }
}
