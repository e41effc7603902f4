//! Where the adapter's data comes from, upstream of the [`crate::fleet`] snapshot:
//!
//! - [`scrape`]: the direct source, every exporter followed sample by sample through
//!   its long poll (or scraped every interval when it has none) over the Prometheus
//!   protobuf exposition ([`exposition`]), the exporters found by [`discovery`]
//!   (EndpointSlices) or given as URLs;
//! - [`prometheus`]: the Prometheus-compatible source, instant queries;
//! - [`derive`]: from series to per-pod values, shared by both;
//! - [`pods`]: every pod's labels and owning workloads, from a pod watch;
//! - [`serving`]: the serving engines' own signals (vLLM, SGLang, TGI, Triton), per pod;
//! - [`http_client`]: the HTTP(S) client both sources scrape with;
//! - [`signal`]: signals without pods (a gateway's queue), for scale from zero;
//! - [`background`]: the low-priority thread a Prometheus round's answers decode on.
//!
//! Each source records its own self-metrics in [`SourceMetrics`].

pub mod background;
pub mod derive;
pub mod discovery;
pub mod exposition;
pub mod http_client;
pub mod limits;
pub mod pods;
pub mod prometheus;
pub mod scrape;
pub mod serving;
pub mod signal;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// A signal read's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub namespace: String,
    pub signal: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Why a sample was refused ([`serving`]), the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SampleRefusal {
    /// NaN or ±Inf, or a value whose arithmetic overflowed.
    NotFinite,
    /// Outside what the metric means: a negative queue, count or latency, a KV-cache
    /// usage outside 0 to 1.
    OutOfRange,
    /// The same series (name and labels) again in one answer.
    Duplicate,
}

impl SampleRefusal {
    pub fn label(self) -> &'static str {
        match self {
            SampleRefusal::NotFinite => "not_finite",
            SampleRefusal::OutOfRange => "out_of_range",
            SampleRefusal::Duplicate => "duplicate",
        }
    }
}

/// A refused sample's labels: the target (its URL) and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub target: String,
    pub reason: &'static str,
}

/// What the source loops record: one count per exporter scrape (per query round with the
/// Prometheus source) by result, and how long each round took (with the direct source,
/// which follows each exporter on its own, each publication batch: from its first
/// answer to the fleet view carrying it).
#[derive(Clone, Debug)]
pub struct SourceMetrics {
    scrapes: Family<ResultLabel, Counter>,
    rejections: Family<ReasonLabel, Counter>,
    over_labels: Counter,
    round_duration: Histogram,
    signal_reads: Family<SignalLabels, Counter>,
    info_fetches: Family<ResultLabel, Counter>,
    samples_refused: Family<RefusalLabels, Counter>,
}

impl Default for SourceMetrics {
    fn default() -> SourceMetrics {
        SourceMetrics {
            scrapes: Family::default(),
            rejections: Family::default(),
            over_labels: Counter::default(),
            // 10 ms to ~3 min, factor 3: a Prometheus source's round through Thanos
            // took 30-40 s at 100,000 GPUs (docs/benchmarks/fleet-scale.md).
            round_duration: Histogram::new(exponential_buckets(0.01, 3.0, 10)),
            signal_reads: Family::default(),
            info_fetches: Family::default(),
            samples_refused: Family::default(),
        }
    }
}

impl SourceMetrics {
    pub fn scraped(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.scrapes.get_or_create(&ResultLabel { result }).inc();
    }

    /// A long poll the exporter ended without a newer snapshot (no body).
    pub fn scraped_unchanged(&self) {
        let result = "unchanged";
        self.scrapes.get_or_create(&ResultLabel { result }).inc();
    }

    /// An answer refused for passing a memory limit ([`limits`]).
    pub fn rejected(&self, reason: limits::Rejection) {
        let reason = reason.label();
        self.rejections.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Answers refused so far for `reason` (tests).
    pub fn rejections(&self, reason: limits::Rejection) -> u64 {
        let reason = reason.label();
        self.rejections.get_or_create(&ReasonLabel { reason }).get()
    }

    /// Series refused for carrying more than [`limits::MAX_LABELS_PER_SERIES`] labels.
    pub fn series_over_labels(&self, n: u64) {
        self.over_labels.inc_by(n);
    }

    /// Series refused so far for their labels (tests).
    pub fn over_labels(&self) -> u64 {
        self.over_labels.get()
    }

    /// One read of a `--signal`'s source.
    pub fn signal_read(&self, namespace: &str, signal: &str, ok: bool) {
        let labels = SignalLabels {
            namespace: namespace.to_string(),
            signal: signal.to_string(),
            result: if ok { "success" } else { "failure" },
        };
        self.signal_reads.get_or_create(&labels).inc();
    }

    /// One fetch of a TGI engine's `/info` (its KV-cache capacity).
    pub fn info_fetched(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.info_fetches
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// `/info` fetches so far with `ok`'s result (tests).
    pub fn info_fetches(&self, ok: bool) -> u64 {
        let result = if ok { "success" } else { "failure" };
        self.info_fetches
            .get_or_create(&ResultLabel { result })
            .get()
    }

    /// `count` samples of `target`'s answer refused for `reason`.
    pub fn refused_samples(&self, target: &str, reason: SampleRefusal, count: u64) {
        if count == 0 {
            return;
        }
        let labels = RefusalLabels {
            target: target.to_string(),
            reason: reason.label(),
        };
        self.samples_refused.get_or_create(&labels).inc_by(count);
    }

    /// Samples of `target` refused so far for `reason` (tests).
    pub fn samples_refused(&self, target: &str, reason: SampleRefusal) -> u64 {
        let labels = RefusalLabels {
            target: target.to_string(),
            reason: reason.label(),
        };
        self.samples_refused.get_or_create(&labels).get()
    }

    pub fn round_took(&self, took: Duration) {
        self.round_duration.observe(took.as_secs_f64());
    }

    /// Registers the source's metrics (prefixed by the registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "source_scrapes",
            "Exporter scrapes (Prometheus query rounds with --prometheus-url), by result: success, failure, or unchanged (a long poll the exporter ended without a newer snapshot)",
            self.scrapes.clone(),
        );
        registry.register(
            "source_target_rejected",
            "Answers refused for passing a memory limit, by reason: too_large (--max-response-size), series_limit (--max-series-per-target), pod_limit (--max-pods-per-target), pod_budget (--max-pods); the target's earlier values age out",
            self.rejections.clone(),
        );
        registry.register(
            "source_series_over_label_limit",
            "Series refused for carrying more labels than the adapter keeps for one series (128); the rest of their answer is kept",
            self.over_labels.clone(),
        );
        registry.register(
            "signal_reads",
            "Reads of each --signal's source (a gateway's /metrics or a PromQL query), by result: success, or failure (the signal then has no value until it reads again)",
            self.signal_reads.clone(),
        );
        registry.register(
            "source_info_fetches",
            "Fetches of serving engines' /info (TGI's KV-cache capacity), by result: success, or failure (the pod then has no serving_kv_cache_usage until one succeeds); none for the exporters",
            self.info_fetches.clone(),
        );
        registry.register(
            "source_samples_refused",
            "Samples of a target's answers refused, by target and reason: not_finite (NaN, ±Inf, or a value whose arithmetic overflowed), out_of_range (a negative queue, count or latency, a KV-cache usage outside 0 to 1), duplicate (the same series twice in one answer, counted once); the signal a refused sample feeds has no value from that answer. Serving engines only (serving_source_samples_refused)",
            self.samples_refused.clone(),
        );
        registry.register_with_unit(
            "source_round_duration",
            "Time one source round took: with --prometheus-url one query round; scraping the exporters, one publication batch, from its first answer to the fleet view carrying it",
            Unit::Seconds,
            self.round_duration.clone(),
        );
    }
}
