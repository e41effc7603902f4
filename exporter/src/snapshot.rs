//! The immutable result of one sampling cycle. The sampler publishes a new one
//! atomically; scrapes only ever read one and never touch a GPU source.

use crate::attribution::AttributionStatus;
use crate::plan::counters::ExportPlan;
use crate::source::ProcessSample;
use arc_swap::ArcSwap;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// Render-cache slots per snapshot: one per exposition format the encoder serves, with
/// and without the device families (it checks at compile time that they fit). A count,
/// not the formats themselves, so the snapshot needs nothing from the encoder.
pub(crate) const RENDER_SLOTS: usize = 6;

/// One cached part of a scrape body: everything a snapshot determines (device families
/// and the exporter's own per-snapshot metrics), plain and as one gzip member, each
/// built on the first scrape that asks for it. Only the scrape-duration histogram (and
/// OpenMetrics' `# EOF`) is added per scrape. Reference-counted, so every response
/// body of a snapshot shares the one buffer instead of copying it (issue 27: a copy per
/// response parked under HTTP/2 flow control cost ~100 KB each).
#[derive(Debug, Default)]
pub(crate) struct RenderCache {
    pub(crate) plain: OnceLock<bytes::Bytes>,
    pub(crate) gzip: OnceLock<bytes::Bytes>,
}

/// A label value escaped for the text formats (`\`, `"`, newline); borrowed when there is
/// nothing to escape, as for nearly every value. The one escaper of label values: the
/// sampler's pre-rendered label sets and the encoder's per-series labels both use it.
pub fn escape_label_value(v: &str) -> Cow<'_, str> {
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        return Cow::Borrowed(v);
    }
    let mut out = String::with_capacity(v.len() + 2);
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Append `name="value"` (value escaped) to a label set in text form.
pub fn push_label(out: &mut String, name: &str, value: &str) {
    if !out.is_empty() {
        out.push(',');
    }
    out.push_str(name);
    out.push_str("=\"");
    out.push_str(&escape_label_value(value));
    out.push('"');
}

/// A value in dcgm-exporter's units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// Printed as a decimal integer (`%d`).
    Int(i64),
    /// Printed with six decimals (`%f`).
    Float(f64),
}

/// XIDs seen on one entity since the exporter started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct XidStat {
    pub count: u64,
    pub last_seen: SystemTime,
}

/// One GPU or MIG instance in a snapshot.
#[derive(Debug, Clone)]
pub struct EntitySnapshot {
    /// The label set, pre-rendered once per inventory: `gpu="0",UUID="…",…`.
    pub labels: Arc<str>,
    /// When set, the device series are repeated under each of these label sets instead
    /// of `labels` (one per HPC job; one per pod with `--kubernetes-virtual-gpus`). A
    /// metric split per pod keeps its shares and its remainder on `labels`.
    pub copies: Option<Arc<[Arc<str>]>>,
    /// A physical GPU (not a MIG instance).
    pub is_gpu: bool,
    /// False once the GPU (or its parent) has fallen off the bus.
    pub up: bool,
    /// Last XID seen (dcgm's sticky gauge), if any.
    pub last_xid: Option<u64>,
    /// Per XID code.
    pub xids: BTreeMap<u64, XidStat>,
    pub processes: Vec<ProcessSnapshot>,
    /// Per-pod shares of a shared device: for the split metrics, these series come
    /// first and the entity's own series carries what no pod's processes used.
    pub shares: Vec<PodShare>,
    /// The `DCGM_EXP_*` values of a physical GPU, when the plan has any.
    pub exporter: Option<Box<ExporterValues>>,
}

/// One GPU's values for dcgm-exporter's own collectors.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExporterValues {
    /// XIDs per code in the XID window.
    pub xid_window: BTreeMap<u64, u64>,
    /// Cycles in the clock-events window with each reason of
    /// [`crate::health::CLOCK_EVENTS`] set.
    pub clock_events_window: [u64; crate::health::CLOCK_EVENTS.len()],
    /// The health verdicts, per [`crate::health::WATCHES`].
    pub health: Option<crate::health::Health>,
}

/// A process on a GPU or MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSnapshot {
    pub sample: ProcessSample,
    /// The pod the process runs in, where its cgroup names a pod the watch knows and
    /// the device's own labels do not already name one (devices held whole do): shared
    /// devices, and devices no pod was allocated (a pod using a GPU it never requested).
    pub pod: Option<PodRef>,
}

/// A pod by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: Arc<str>,
    pub pod: Arc<str>,
}

/// One pod's part of a shared GPU or MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct PodShare {
    /// The entity's labels plus the pod's.
    pub labels: Arc<str>,
    /// (plan metric index, value) for the metrics split per pod.
    pub values: Vec<(usize, Value)>,
}

/// One NVLink of a GPU in a snapshot.
#[derive(Debug, Clone)]
pub struct LinkSnapshot {
    /// dcgm-exporter's NVLink-entity label set: `nvlink="3",gpu="0",gpu_uuid="…",…`.
    pub labels: Arc<str>,
}

/// Everything a scrape renders.
#[derive(Debug)]
pub struct Snapshot {
    pub plan: Arc<ExportPlan>,
    /// Monotonic time the cycle finished, for readiness and staleness.
    pub taken: Instant,
    /// Wall time the cycle finished.
    pub taken_at: SystemTime,
    /// When the last cycle that reached the driver finished.
    pub last_success: Option<(Instant, SystemTime)>,
    pub sample_duration: Duration,
    /// The last cycle reached the driver.
    pub source_up: bool,
    /// A GPU call has not returned for several intervals.
    pub source_hung: bool,
    pub entities: Vec<EntitySnapshot>,
    /// Entity-major values: `values[entity * plan.metrics.len() + metric]`.
    pub values: Vec<Option<Value>>,
    /// NVLinks of the GPUs that are up, when link-scoped fields are planned.
    pub links: Vec<LinkSnapshot>,
    /// Link-major values: `link_values[link * plan.metrics.len() + metric]`.
    pub link_values: Vec<Option<Value>>,
    /// Cumulative read errors per metric (name, count), only those with errors.
    pub field_errors: Vec<(&'static str, u64)>,
    pub samples_total: u64,
    pub sample_failures_total: u64,
    /// Export per-process series.
    pub process_metrics: bool,
    /// Label sets of `gpu_exporter_pod_gpu_allocation`: one per (device, container).
    pub allocations: Vec<Arc<str>>,
    /// Pod attribution inputs, when `--kubernetes` is on.
    pub attribution: Option<AttributionStatus>,
    /// Version and source for `gpu_exporter_build_info`.
    pub build_labels: Arc<str>,
    /// How the last counters reload went, when reloading is on.
    pub config_reload: Option<crate::plan::reload::ReloadStatus>,
    /// The `window_size_in_ms` of `DCGM_EXP_XID_ERRORS_COUNT` and
    /// `DCGM_EXP_CLOCK_EVENTS_COUNT`.
    pub xid_window_ms: u64,
    pub clock_events_window_ms: u64,
    /// The cached part of the body, once per format and with or without the device
    /// families (see `encode::cached_part`).
    pub(crate) rendered: [RenderCache; RENDER_SLOTS],
}

impl Snapshot {
    /// A snapshot with nothing sampled yet.
    pub fn empty(plan: Arc<ExportPlan>, build_labels: Arc<str>) -> Snapshot {
        let now = Instant::now();
        Snapshot {
            plan,
            taken: now,
            taken_at: SystemTime::now(),
            last_success: None,
            sample_duration: Duration::ZERO,
            source_up: false,
            source_hung: false,
            entities: Vec::new(),
            values: Vec::new(),
            links: Vec::new(),
            link_values: Vec::new(),
            field_errors: Vec::new(),
            samples_total: 0,
            sample_failures_total: 0,
            process_metrics: false,
            allocations: Vec::new(),
            attribution: None,
            build_labels,
            config_reload: None,
            xid_window_ms: 0,
            clock_events_window_ms: 0,
            rendered: Default::default(),
        }
    }

    /// What to publish while a cycle is stuck in a GPU call: the counters of `last`,
    /// no device data, and the source marked down and hung.
    pub fn hung(last: &Snapshot) -> Snapshot {
        let mut s = Snapshot::empty(last.plan.clone(), last.build_labels.clone());
        s.last_success = last.last_success;
        s.sample_duration = last.sample_duration;
        s.field_errors = last.field_errors.clone();
        s.samples_total = last.samples_total;
        s.sample_failures_total = last.sample_failures_total;
        s.process_metrics = last.process_metrics;
        s.attribution = last.attribution.clone();
        s.config_reload = last.config_reload;
        s.source_hung = true;
        s
    }

    /// The value of metric `m` on entity `e`.
    pub fn value(&self, e: usize, m: usize) -> Option<Value> {
        self.values
            .get(e * self.plan.metrics.len() + m)
            .copied()
            .flatten()
    }

    /// The value of metric `m` on link `l` (an index into `links`).
    pub fn link_value(&self, l: usize, m: usize) -> Option<Value> {
        self.link_values
            .get(l * self.plan.metrics.len() + m)
            .copied()
            .flatten()
    }

    /// Age of the last successful sample, if there was one.
    pub fn success_age(&self, now: Instant) -> Option<Duration> {
        self.last_success
            .map(|(i, _)| now.saturating_duration_since(i))
    }
}

/// The published snapshot and its generation: the sampler stores, scrapes load, and a
/// scrape that asks for a snapshot newer than the one its client holds (the metrics
/// adapter's long poll, see `http`) waits for the next publication.
#[derive(Debug)]
pub struct SnapshotStore {
    current: ArcSwap<Published>,
    /// Bumped after every publication; held requests wait on it.
    published: tokio::sync::watch::Sender<u64>,
    /// Tells this process's generations from an earlier one's, so a client holding a
    /// generation from before a restart is answered at once.
    boot: u64,
}

/// One publication.
#[derive(Debug)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    /// 1 for the first publication of this process, then counting up.
    pub generation: u64,
}

impl SnapshotStore {
    pub fn new(first: Snapshot) -> SnapshotStore {
        let boot = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        SnapshotStore {
            current: ArcSwap::from_pointee(Published {
                snapshot: Arc::new(first),
                generation: 0,
            }),
            published: tokio::sync::watch::Sender::new(0),
            boot,
        }
    }

    /// Publish `snap` as the current snapshot, waking held requests.
    pub fn store(&self, snap: Arc<Snapshot>) {
        // Only the sampler publishes, so reading then writing the generation is not a race.
        let generation = self.current.load().generation + 1;
        self.current.store(Arc::new(Published {
            snapshot: snap,
            generation,
        }));
        self.published.send_replace(generation);
    }

    /// The current snapshot.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load().snapshot.clone()
    }

    /// The current snapshot with its generation.
    pub fn load_published(&self) -> Arc<Published> {
        self.current.load_full()
    }

    /// A receiver that sees every publication after this call.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.published.subscribe()
    }

    /// The opaque token clients hold for `generation`: `BOOT-GENERATION` in hex.
    pub fn token(&self, generation: u64) -> String {
        format!("{:x}-{generation:x}", self.boot)
    }
}

#[cfg(test)]
mod label_tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
        assert!(matches!(
            escape_label_value("plain"),
            Cow::Borrowed("plain")
        ));
        let mut s = String::new();
        push_label(&mut s, "a", "x\"y");
        push_label(&mut s, "b", "z");
        assert_eq!(s, r#"a="x\"y",b="z""#);
    }
}
