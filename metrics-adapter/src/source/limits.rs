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
//! The Deployment's memory limit and the defaults of these flags come from one table,
//! [`BUDGET`]: the limit (deploy/base/adapter and the Helm chart, held to
//! it by the e2e test `adapter_memory`) is its sum, each flag's default is derived from
//! its row, and that test runs the hostile shapes at the default flags (exporters
//! whose families put their help before their name, 100 exporters of 999 pods, a
//! Prometheus sample of 140,000 labels, a 15 MiB `promql:` signal answer) and holds
//! the adapter's peak RSS under the limit. Raise the memory limit with these flags.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// MiB.
const MIB: usize = 1 << 20;

/// One row of the memory budget: what it pays for, MiB.
#[derive(Clone, Copy, Debug)]
pub struct Share {
    pub what: &'static str,
    pub mib: usize,
}

/// Where the Deployment's memory goes at the default flags.
pub const BUDGET: [Share; 5] = [
    Share {
        what: "the process at rest (runtime, clients, TLS, its own metrics: 24 MiB measured), the pod index, and one connection per exporter (~32 KiB each: ~40 MiB for 1,250 exporters)",
        mib: 64,
    },
    Share {
        what: "answers being read or decoded, over every target: --max-in-flight-size (--max-response-size is half)",
        mib: 32,
    },
    Share {
        what: "one answer decoded: an exporter's --max-series-per-target series (~6 MiB), or a Prometheus round's --prometheus-max-series samples (one per pod and query), each reduced to the pod's labels (~480 B)",
        mib: 80,
    },
    Share {
        what: "the pods held, --max-pods: each pod's values as its exporter last sent them and in the published view, a third copy while a new view replaces the old, and the allocator's slack over them (~3.5 KiB a pod measured, 4 KiB counted)",
        mib: 64,
    },
    Share {
        what: "headroom: the allocator's arenas, TLS handshakes, API answers being written",
        mib: 16,
    },
];

/// The Deployment's memory limit, MiB: the sum of [`BUDGET`].
pub const MEMORY_LIMIT_MIB: usize = {
    let mut sum = 0;
    let mut i = 0;
    while i < BUDGET.len() {
        sum += BUDGET[i].mib;
        i += 1;
    }
    sum
};

/// `--max-in-flight-size`'s default: its row.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = BUDGET[1].mib * MIB;
/// `--max-response-size`'s default: half the in-flight budget, so two answers of the
/// largest size can be read at once.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = DEFAULT_MAX_IN_FLIGHT_BYTES / 2;
/// A decoded Prometheus sample as a round keeps it, bytes, counted.
pub const PROMETHEUS_SERIES_BYTES: usize = 480;
/// `--prometheus-max-series`'s default: its row, rounded down to 10,000s (a round
/// keeps one sample per pod and query: 96,000 at the default `--max-pods`).
pub const DEFAULT_PROMETHEUS_MAX_SERIES: usize =
    BUDGET[2].mib * MIB / PROMETHEUS_SERIES_BYTES / 10_000 * 10_000;
/// A pod held, bytes, counted.
pub const POD_BYTES: usize = 4 << 10;
/// `--max-pods`'s default: its row, rounded down to 1,000s (the scale target is
/// 10,000 GPUs).
pub const DEFAULT_MAX_PODS: usize = BUDGET[3].mib * MIB / POD_BYTES / 1_000 * 1_000;
/// `--max-series-per-target`'s default (a node with 8 GPUs split 7 ways reports
/// ~1,000; decoded, 20,000 are ~6 MiB).
pub const DEFAULT_MAX_SERIES_PER_TARGET: usize = 20_000;
/// `--max-pods-per-target`'s default.
pub const DEFAULT_MAX_PODS_PER_TARGET: usize = 1_000;

/// Prometheus queries in flight at once in one round: bounds the answers being read
/// together.
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

/// Memory limit flags that contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadLimits {
    #[error(
        "--max-response-size ({response} bytes) is larger than --max-in-flight-size ({in_flight} bytes): such an answer could never be read"
    )]
    ResponseOverInFlight { response: usize, in_flight: usize },
    #[error("--max-in-flight-size ({0} bytes) is over 4 GiB")]
    InFlightOver4GiB(usize),
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
    ) -> Result<Limits, BadLimits> {
        if max_response_bytes > max_in_flight_bytes {
            return Err(BadLimits::ResponseOverInFlight {
                response: max_response_bytes,
                in_flight: max_in_flight_bytes,
            });
        }
        if max_in_flight_bytes > u32::MAX as usize || max_in_flight_bytes > Semaphore::MAX_PERMITS {
            return Err(BadLimits::InFlightOver4GiB(max_in_flight_bytes));
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
        let max_in_flight_bytes = DEFAULT_MAX_IN_FLIGHT_BYTES;
        Limits {
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_series_per_target: DEFAULT_MAX_SERIES_PER_TARGET,
            max_pods_per_target: DEFAULT_MAX_PODS_PER_TARGET,
            max_pods: DEFAULT_MAX_PODS,
            in_flight: Arc::new(Semaphore::new(max_in_flight_bytes)),
            max_in_flight_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived defaults are what the flags' help and the docs say they are.
    #[test]
    fn the_defaults_come_from_the_budget() {
        assert_eq!(MEMORY_LIMIT_MIB, 256);
        assert_eq!(DEFAULT_MAX_IN_FLIGHT_BYTES, 32 * MIB);
        assert_eq!(DEFAULT_MAX_RESPONSE_BYTES, 16 * MIB);
        assert_eq!(DEFAULT_PROMETHEUS_MAX_SERIES, 170_000);
        assert_eq!(DEFAULT_MAX_PODS, 16_000);
    }
}
