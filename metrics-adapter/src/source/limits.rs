//! What bounds the sources' memory: the configuration, never the peers (issue 20).
//!
//! An exporter or Prometheus can answer with anything: a 200 MB body, 140,000 series in
//! a valid 15 MiB protobuf, a body that drips forever. Each answer is read with a
//! running limit and refused as soon as it passes `--max-response-size` (at once when
//! its `Content-Length` says so); the bytes of every answer being read or decoded, over
//! all targets, come out of one `--max-in-flight-size` budget (an answer waits for room,
//! within its timeout); decoding stops at `--max-series-per-target`; an exporter's pods
//! are capped by `--max-pods-per-target`, and the pods held over the whole fleet by
//! `--max-pods`. A target past any of them is refused like a failed scrape (its earlier
//! values age out after `--max-staleness`, as a down exporter's do), counted in
//! `gpu_metrics_adapter_source_target_rejected_total{reason}`, and logged once when
//! it starts failing.
//!
//! The defaults fit the Deployment's 256 MiB memory limit (deploy/base/adapter): the
//! adapter peaks at ~160 MiB with 10,000 GPUs (its fleet view, pod index and
//! caches); 32 MiB of answers in flight plus one decoded answer (one exporter body
//! decoded at a time; Prometheus queries at most [`PROMETHEUS_QUERIES`] at once, each a
//! few times its JSON size once decoded) stay within the ~96 MiB left. A 10,000-GPU
//! answer from Prometheus is ~3 MB per query, an exporter's ~200 KB: the 16 MiB response
//! limit is five times the largest. Measured against 200 MB answers and a 15 MiB
//! protobuf, the defaults peak 47 to 82 MB above the adapter's idle 24 MB (BENCHMARKS.md,
//! issue 20). Raise the memory limit with these flags.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Prometheus queries in flight at once in one round (each family and its timestamps
/// are two): bounds the decoded answers alive together.
pub const PROMETHEUS_QUERIES: usize = 2;

/// Labels one series may carry (a gpu-exporter's have 10 to 14, a Prometheus
/// series a few more); one with more is refused and counted, the rest of its answer
/// kept. Every decoder applies it: the protobuf exposition, Prometheus answers and the
/// serving engines' text.
pub const MAX_LABELS_PER_SERIES: usize = 128;

/// Why a target's answer was refused, the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// The answer passed `--max-response-size`.
    TooLarge,
    /// The answer held more than `--max-series-per-target` series of the wanted families.
    SeriesLimit,
    /// The exporter reported more than `--max-pods-per-target` pods.
    PodLimit,
    /// Taking the answer would hold more than `--max-pods` pods over the fleet.
    PodBudget,
}

impl Rejection {
    pub fn label(self) -> &'static str {
        match self {
            Rejection::TooLarge => "too_large",
            Rejection::SeriesLimit => "series_limit",
            Rejection::PodLimit => "pod_limit",
            Rejection::PodBudget => "pod_budget",
        }
    }
}

/// The limits, from the flags, and the shared in-flight budget.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_response_bytes: usize,
    pub max_series_per_target: usize,
    pub max_pods_per_target: usize,
    pub max_pods: usize,
    /// Bytes of answers being read or decoded, over every target; one permit a byte.
    in_flight: Arc<Semaphore>,
    pub max_in_flight_bytes: usize,
}

impl Limits {
    /// `max_response_bytes` must fit in `max_in_flight_bytes`, or a maximal answer
    /// could never be read (checked at startup).
    pub fn new(
        max_response_bytes: usize,
        max_in_flight_bytes: usize,
        max_series_per_target: usize,
        max_pods_per_target: usize,
        max_pods: usize,
    ) -> Result<Limits, String> {
        if max_response_bytes > max_in_flight_bytes {
            return Err(format!(
                "--max-response-size ({max_response_bytes} bytes) is larger than --max-in-flight-size ({max_in_flight_bytes} bytes): such an answer could never be read"
            ));
        }
        if max_in_flight_bytes > u32::MAX as usize || max_in_flight_bytes > Semaphore::MAX_PERMITS {
            return Err(format!(
                "--max-in-flight-size ({max_in_flight_bytes} bytes) is over 4 GiB"
            ));
        }
        Ok(Limits {
            max_response_bytes,
            max_series_per_target,
            max_pods_per_target,
            max_pods,
            in_flight: Arc::new(Semaphore::new(max_in_flight_bytes)),
            max_in_flight_bytes,
        })
    }

    /// Room for `bytes` more bytes in flight, waiting for it; `bytes` is at most
    /// `max_response_bytes`, so it always comes.
    pub async fn reserve(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let bytes = u32::try_from(bytes).ok()?;
        self.in_flight.clone().acquire_many_owned(bytes).await.ok()
    }

    /// Bytes in flight now (tests).
    pub fn in_flight_bytes(&self) -> usize {
        self.max_in_flight_bytes - self.in_flight.available_permits()
    }
}

impl Default for Limits {
    /// The flags' defaults.
    fn default() -> Limits {
        let max_in_flight_bytes = 32 << 20;
        Limits {
            max_response_bytes: 16 << 20,
            max_series_per_target: 20_000,
            max_pods_per_target: 1_000,
            max_pods: 100_000,
            in_flight: Arc::new(Semaphore::new(max_in_flight_bytes)),
            max_in_flight_bytes,
        }
    }
}
