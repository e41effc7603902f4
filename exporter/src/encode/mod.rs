//! Renders a [`Snapshot`] as Prometheus text (0.0.4, the default), OpenMetrics 1.0 or
//! the Prometheus protobuf format (delimited `io.prometheus.client.MetricFamily`).
//!
//! Written by hand on purpose: dcgm-exporter prints counters without `_total` and values
//! in its own formats (`%d`, `%f`), which no Rust client library emits (prometheus-client
//! writes OpenMetrics only). One walk over the snapshot (the `Sink` trait) feeds every format,
//! so they cannot drift: the text writer serves text and OpenMetrics, [`protobuf`] the
//! binary format; the golden-file and promtool tests hold the text to both specs, and
//! the protobuf tests hold it to the text.
//!
//! Everything a snapshot determines is rendered once per snapshot and format (and
//! gzip-compressed once, when asked for) and shared by every scrape; only the
//! scrape-duration histogram is rendered per request, and with gzip it travels as a
//! second, stored gzip member, so no scrape compresses anything ([`render`]).

pub mod protobuf;
pub mod xid;

use crate::plan::catalog::ExporterField;
use crate::plan::counters::{MetricField, MetricKind, MetricType};
use crate::snapshot::{RENDER_SLOTS, Snapshot, Value, escape_label_value};
use bytes::Bytes;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    OpenMetrics,
    /// Length-delimited `io.prometheus.client.MetricFamily` messages.
    Protobuf,
}

/// How many [`Format`]s there are; each has its slot in a snapshot's render caches.
const FORMATS: usize = 3;
const _: () = assert!(FORMATS * 2 == RENDER_SLOTS && Format::Protobuf as usize + 1 == FORMATS);

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Protobuf => protobuf::CONTENT_TYPE,
        }
    }

    /// A short name, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::OpenMetrics => "openmetrics",
            Format::Protobuf => "protobuf",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Prefix of every metric this exporter adds to dcgm-exporter's set.
pub const PREFIX: &str = "gpu_exporter_";

/// Upper bounds (seconds) of the scrape-duration histogram buckets, `+Inf` aside.
pub const SCRAPE_BUCKETS: [f64; 10] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1,
];

/// Scrape durations, kept by the HTTP layer: a histogram with [`SCRAPE_BUCKETS`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScrapeStats {
    /// Scrapes per bucket (not cumulative): `buckets[i]` took at most `SCRAPE_BUCKETS[i]`
    /// and more than the bucket before.
    pub buckets: [u64; SCRAPE_BUCKETS.len()],
    pub scrapes: u64,
    pub duration_seconds_sum: f64,
    /// The listener's refused connections, per [`tls_serving::Refusal::ALL`] reason.
    pub connections_refused: [u64; 2],
}

fn write_help(out: &mut Vec<u8>, name: &str, help: &str) {
    out.extend_from_slice(b"# HELP ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    for b in help.bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b => out.push(b),
        }
    }
    out.push(b'\n');
}

/// HELP and TYPE for a family. `name` is the sample name in text format; in OpenMetrics a
/// counter's family drops a trailing `_total` and its samples gain one.
fn write_header(out: &mut Vec<u8>, fmt: Format, name: &str, ty: MetricType, help: &str) {
    let family = match (fmt, ty) {
        (Format::OpenMetrics, MetricType::Counter) => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    write_help(out, family, help);
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(family.as_bytes());
    out.extend_from_slice(match ty {
        MetricType::Gauge => b" gauge\n",
        MetricType::Counter => b" counter\n",
    });
}

/// The sample name of a family in `fmt`.
fn sample_name(fmt: Format, name: &str, ty: MetricType) -> std::borrow::Cow<'_, str> {
    match (fmt, ty) {
        (Format::OpenMetrics, MetricType::Counter) if !name.ends_with("_total") => {
            format!("{name}_total").into()
        }
        _ => name.into(),
    }
}

/// `%f`: fixed six decimals, as dcgm-exporter prints floats; fast path without `fmt`.
pub fn write_fixed6(out: &mut Vec<u8>, v: f64) {
    if !v.is_finite() || v.abs() >= 9.0e12 {
        // Outside the fast path's exact range (and never produced by real readings).
        let _ = write!(out, "{}", FloatText(v, true));
        return;
    }
    let scaled = (v.abs() * 1e6).round() as u64;
    if v.is_sign_negative() && scaled != 0 {
        out.push(b'-');
    }
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(scaled / 1_000_000).as_bytes());
    out.push(b'.');
    let frac = scaled % 1_000_000;
    let digits = buf.format(frac);
    out.extend(std::iter::repeat_n(b'0', 6 - digits.len()));
    out.extend_from_slice(digits.as_bytes());
}

/// The number [`write_fixed6`]'s text denotes, bit for bit what a parser of it reads,
/// without formatting: the protobuf format carries dcgm's six-decimal values too, so a
/// series reads the same whichever format a scraper picks.
///
/// In the fast path's range `(|v| * 1e6).round()` is an integer the text prints exactly,
/// and one IEEE division by the exact `1e6` rounds it to the nearest `f64`, as a correct
/// parser does. Outside it `{:.6}` differs from `v` by less than half an ulp, so `v` is
/// what parsing gives back.
pub(crate) fn fixed6_value(v: f64) -> f64 {
    if !v.is_finite() || v.abs() >= 9.0e12 {
        return v;
    }
    let scaled = (v.abs() * 1e6).round();
    if scaled == 0.0 {
        // The text prints no sign for zero.
        return 0.0;
    }
    let abs = scaled / 1e6;
    if v.is_sign_negative() { -abs } else { abs }
}

/// A float as Prometheus expects it (`NaN`, `+Inf`, `-Inf`, else shortest or `%f`).
struct FloatText(f64, bool);

impl std::fmt::Display for FloatText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        if v.is_nan() {
            f.write_str("NaN")
        } else if v.is_infinite() {
            f.write_str(if v > 0.0 { "+Inf" } else { "-Inf" })
        } else if self.1 {
            write!(f, "{v:.6}")
        } else {
            write!(f, "{v}")
        }
    }
}

fn write_value(out: &mut Vec<u8>, v: Value) {
    match v {
        Value::Int(i) => out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes()),
        Value::Float(f) => write_fixed6(out, f),
    }
}

fn write_f64(out: &mut Vec<u8>, v: f64) {
    let _ = write!(out, "{}", FloatText(v, false));
}

/// `name{labels,extra} ` — the start of a sample line.
fn write_series_start(out: &mut Vec<u8>, name: &str, labels: &str, extra: &[(&str, &str)]) {
    out.extend_from_slice(name.as_bytes());
    out.push(b'{');
    out.extend_from_slice(labels.as_bytes());
    let mut first = labels.is_empty();
    for (k, v) in extra {
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b"=\"");
        out.extend_from_slice(escape_label_value(v).as_bytes());
        out.push(b'"');
    }
    out.extend_from_slice(b"} ");
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A sample's value as the family walk hands it over. Each kind keeps the text form it
/// always had (dcgm's `%d`/`%f`, plain integers, shortest floats); the protobuf format
/// carries the `f64` that text denotes ([`Sample::as_f64`]), so both hold one number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Sample {
    /// A device reading in dcgm-exporter's units and print format.
    Dcgm(Value),
    /// A count or flag, printed as an integer.
    Uint(u64),
    /// Printed shortest-round-trip (`NaN`, `+Inf` as Prometheus spells them).
    Float(f64),
}

impl Sample {
    /// The number a parser of the text form reads.
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Sample::Dcgm(Value::Int(i)) => i as f64,
            Sample::Dcgm(Value::Float(f)) => fixed6_value(f),
            Sample::Uint(u) => u as f64,
            Sample::Float(f) => f,
        }
    }
}

/// Where the family walks ([`walk_device_families`], [`walk_snapshot_metrics`],
/// [`walk_scrape_metrics`]) write: one
/// implementation per wire format, so all formats carry the same families, series, label
/// order and values by construction. `'a` is the snapshot's lifetime: label sets live
/// as long as the walk, so a writer may cache work per label set.
pub(crate) trait Sink<'a> {
    /// Start a family; the samples that follow belong to it. `name` is the text-format
    /// sample name (dcgm's counters keep theirs without `_total`), `help` unescaped.
    fn family(&mut self, name: &str, ty: MetricType, help: &str);

    /// One series of the current family. `labels` is a label set pre-rendered in text
    /// form (escaped, possibly empty) from the snapshot; `extra` are raw pairs after it.
    fn sample(&mut self, labels: &'a str, extra: &[(&str, &str)], value: Sample);

    /// A whole histogram family of one unlabelled series: `buckets[i]` observations (not
    /// cumulative) fell in `(bounds[i-1], bounds[i]]`; `count` is all of them, `+Inf`
    /// included, and `sum` their total.
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        bounds: &[f64],
        buckets: &[u64],
        count: u64,
        sum: f64,
    );
}

/// The text and OpenMetrics writer.
struct TextSink<'o> {
    out: &'o mut Vec<u8>,
    fmt: Format,
    /// Sample name of the current family (OpenMetrics counters gain `_total`).
    name: String,
}

impl<'o> TextSink<'o> {
    fn new(out: &'o mut Vec<u8>, fmt: Format) -> TextSink<'o> {
        TextSink {
            out,
            fmt,
            name: String::new(),
        }
    }
}

impl Sink<'_> for TextSink<'_> {
    fn family(&mut self, name: &str, ty: MetricType, help: &str) {
        write_header(self.out, self.fmt, name, ty, help);
        self.name.clear();
        self.name.push_str(&sample_name(self.fmt, name, ty));
    }

    fn sample(&mut self, labels: &str, extra: &[(&str, &str)], value: Sample) {
        if labels.is_empty() && extra.is_empty() {
            self.out.extend_from_slice(self.name.as_bytes());
            self.out.push(b' ');
        } else {
            write_series_start(self.out, &self.name, labels, extra);
        }
        match value {
            Sample::Dcgm(v) => write_value(self.out, v),
            Sample::Uint(u) => self
                .out
                .extend_from_slice(itoa::Buffer::new().format(u).as_bytes()),
            Sample::Float(f) => write_f64(self.out, f),
        }
        self.out.push(b'\n');
    }

    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        bounds: &[f64],
        buckets: &[u64],
        count: u64,
        sum: f64,
    ) {
        let out = &mut *self.out;
        write_help(out, name, help);
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, n) in bounds.iter().zip(buckets) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", FloatText(sum, false));
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// The part of a scrape body that the snapshot alone determines, in `fmt`: the device
/// families (when `with_devices`) and then the exporter's per-snapshot self-metrics.
/// Rendered once per snapshot, format and variant, and shared by every scrape; a body
/// is this followed by [`scrape_part`].
pub fn cached_part(snap: &Snapshot, fmt: Format, with_devices: bool) -> &Bytes {
    snap.rendered[cache_slot(fmt, with_devices)]
        .plain
        .get_or_init(|| {
            let mut out = Vec::with_capacity(if with_devices {
                256 * snap.values.len().max(16)
            } else {
                2048
            });
            if with_devices {
                render_device_families(snap, fmt, &mut out);
            }
            match fmt {
                Format::Text | Format::OpenMetrics => {
                    walk_snapshot_metrics(snap, &mut TextSink::new(&mut out, fmt));
                }
                Format::Protobuf => {
                    let mut sink = protobuf::ProtoSink::new(&mut out);
                    walk_snapshot_metrics(snap, &mut sink);
                    sink.finish();
                }
            }
            Bytes::from(out)
        })
}

/// [`cached_part`] as one gzip member, compressed once per snapshot, format and
/// variant. A gzip body is this member followed by a small per-scrape member
/// ([`gzip_stored`]): concatenated members are one valid gzip stream (RFC 1952 §2.2),
/// which Prometheus (Go's `gzip.Reader`), curl and every multi-member reader decode to
/// the plain body. So no scrape compresses the snapshot again.
pub fn cached_part_gzip(snap: &Snapshot, fmt: Format, with_devices: bool) -> &Bytes {
    snap.rendered[cache_slot(fmt, with_devices)]
        .gzip
        .get_or_init(|| Bytes::from(gzip(cached_part(snap, fmt, with_devices))))
}

fn cache_slot(fmt: Format, with_devices: bool) -> usize {
    fmt.index() * 2 + usize::from(with_devices)
}

/// One gzip member of `data`, at the fast level: scrape bodies compress ~25x even so.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 8 + 64),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// One gzip member holding `data` in stored (uncompressed) deflate blocks, RFC 1951
/// §3.2.4, appended to `out`. For the per-scrape part of a body (~1 KB of histogram):
/// a deflate compressor allocates and clears a few hundred KB of window and hash
/// tables before its first byte, which cost 3-4 times the rest of a cached scrape;
/// a stored block costs one CRC-32 and a copy, and the ~700 bytes it leaves
/// uncompressed are noise next to the device part.
pub fn gzip_stored(data: &[u8], out: &mut Vec<u8>) {
    // ID1 ID2, CM = deflate, no flags, MTIME 0, XFL 0, OS unknown (RFC 1952 §2.3).
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    let mut blocks = data.chunks(usize::from(u16::MAX)).peekable();
    if blocks.peek().is_none() {
        // Even an empty member needs one final block.
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        let last = blocks.peek().is_none();
        // `chunks` keeps every block within u16.
        let len = block.len() as u16;
        out.push(u8::from(last)); // BFINAL, BTYPE 00 (stored), then byte-aligned
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    // ISIZE is the length modulo 2^32.
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
}

/// Render the device families without caching (benchmarks use this directly).
pub fn render_device_families(snap: &Snapshot, fmt: Format, out: &mut Vec<u8>) {
    match fmt {
        Format::Text | Format::OpenMetrics => {
            walk_device_families(snap, &mut TextSink::new(out, fmt));
        }
        Format::Protobuf => {
            let mut sink = protobuf::ProtoSink::new(out);
            walk_device_families(snap, &mut sink);
            sink.finish();
        }
    }
}

/// [`render_device_families`] in the protobuf format through prost's generated types
/// instead of the hand-written writer: for the encoder benchmark, not served.
#[doc(hidden)]
pub fn render_device_families_prost(snap: &Snapshot, out: &mut Vec<u8>) {
    let mut sink = protobuf::ProstSink::new(out);
    walk_device_families(snap, &mut sink);
    sink.finish();
}

/// The device families, in order, into `sink`.
pub(crate) fn walk_device_families<'a, S: Sink<'a>>(snap: &'a Snapshot, sink: &mut S) {
    let metrics = &snap.plan.metrics;
    for (m, field) in metrics.iter().enumerate() {
        if let MetricKind::Exporter(x) = field.kind {
            exporter_family(snap, sink, field, x);
            continue;
        }
        if !(0..snap.entities.len()).any(|e| snap.value(e, m).is_some())
            && !(0..snap.links.len()).any(|l| snap.link_value(l, m).is_some())
        {
            continue;
        }
        sink.family(field.name, field.metric_type, &field.help);
        for (e, entity) in snap.entities.iter().enumerate() {
            let Some(v) = snap.value(e, m) else { continue };
            // A shared device's pods first; the entity's own series then carries the
            // remainder, so the series of one device sum to its value.
            for share in &entity.shares {
                if let Some((_, pv)) = share.values.iter().find(|(i, _)| *i == m) {
                    sink.sample(&share.labels, &[], Sample::Dcgm(*pv));
                }
            }
            let split = entity
                .shares
                .iter()
                .any(|s| s.values.iter().any(|(i, _)| *i == m));
            let label_sets = match &entity.copies {
                Some(copies) if !split => copies,
                _ => std::slice::from_ref(&entity.labels),
            };
            for labels in label_sets {
                match (field.kind, entity.last_xid) {
                    (MetricKind::LastXid, Some(code)) if code != 0 => {
                        let code_text = code.to_string();
                        sink.sample(
                            labels,
                            &[("err_code", &code_text), ("err_msg", xid::message(code))],
                            Sample::Dcgm(v),
                        );
                    }
                    _ => sink.sample(labels, &[], Sample::Dcgm(v)),
                }
            }
        }
        // Link-scoped fields: one series per NVLink, with its own label set.
        for (l, link) in snap.links.iter().enumerate() {
            if let Some(v) = snap.link_value(l, m) {
                sink.sample(&link.labels, &[], Sample::Dcgm(v));
            }
        }
    }

    // gpu_exporter_gpu_up: one per physical GPU, lost ones included.
    sink.family(
        &format!("{PREFIX}gpu_up"),
        MetricType::Gauge,
        "1 while the GPU answers, 0 once it has fallen off the bus (its other series are then absent).",
    );
    for e in snap.entities.iter().filter(|e| e.is_gpu) {
        sink.sample(&e.labels, &[], Sample::Uint(u64::from(e.up)));
    }

    if !snap.allocations.is_empty() {
        sink.family(
            &format!("{PREFIX}pod_gpu_allocation"),
            MetricType::Gauge,
            "1 for each GPU or MIG instance allocated to a container, with the device's and the pod's labels; join on UUID and GPU_I_ID to attribute any series.",
        );
        for labels in &snap.allocations {
            sink.sample(labels, &[], Sample::Uint(1));
        }
    }

    if snap.entities.iter().any(|e| !e.xids.is_empty()) {
        sink.family(
            &format!("{PREFIX}xid_errors_total"),
            MetricType::Counter,
            "XID errors reported by the driver since the exporter started, by XID code.",
        );
        for e in &snap.entities {
            for (code, stat) in &e.xids {
                let code = code.to_string();
                sink.sample(&e.labels, &[("xid", &code)], Sample::Uint(stat.count));
            }
        }
        sink.family(
            &format!("{PREFIX}xid_last_seen_timestamp_seconds"),
            MetricType::Gauge,
            "Unix time the last XID error of this code was reported.",
        );
        for e in &snap.entities {
            for (code, stat) in &e.xids {
                let code = code.to_string();
                let seen = unix_seconds(stat.last_seen);
                sink.sample(&e.labels, &[("xid", &code)], Sample::Float(seen));
            }
        }
    }

    if snap.process_metrics && snap.entities.iter().any(|e| !e.processes.is_empty()) {
        process_family(
            snap,
            sink,
            "process_memory_used_bytes",
            "GPU memory used by a process, bytes.",
            |p| p.used_memory_bytes,
        );
        process_family(
            snap,
            sink,
            "process_sm_utilization_percent",
            "Share of the device's SM utilisation used by a process, percent; shares sum to the device value.",
            |p| p.sm_util_percent.map(u64::from),
        );
    }
}

/// A `DCGM_EXP_*` family, with dcgm-exporter's extra labels (byte-sorted, after the
/// entity's): windowed counts on GPUs that answer, the health status on every GPU (a
/// lost one fails `ALL`).
fn exporter_family<'a, S: Sink<'a>>(
    snap: &'a Snapshot,
    sink: &mut S,
    field: &MetricField,
    x: ExporterField,
) {
    let shown = |e: &&crate::snapshot::EntitySnapshot| {
        e.exporter.is_some() && (e.up || x == ExporterField::HealthStatus)
    };
    if !snap.entities.iter().any(|e| shown(&e)) {
        return;
    }
    sink.family(field.name, field.metric_type, &field.help);
    let count = |n: u64| Sample::Dcgm(Value::Int(i64::try_from(n).unwrap_or(i64::MAX)));
    for e in snap.entities.iter().filter(shown) {
        let Some(v) = e.exporter.as_deref() else {
            continue;
        };
        match x {
            ExporterField::XidWindowCount => {
                let window = snap.xid_window_ms.to_string();
                if v.xid_window.is_empty() {
                    sink.sample(&e.labels, &[("window_size_in_ms", &window)], count(0));
                }
                for (code, n) in &v.xid_window {
                    let code = code.to_string();
                    sink.sample(
                        &e.labels,
                        &[("window_size_in_ms", &window), ("xid", &code)],
                        count(*n),
                    );
                }
            }
            ExporterField::ClockEventWindowCount => {
                let window = snap.clock_events_window_ms.to_string();
                let mut any = false;
                for ((_, name), n) in crate::health::CLOCK_EVENTS
                    .iter()
                    .zip(v.clock_events_window)
                    .filter(|(_, n)| *n > 0)
                {
                    any = true;
                    sink.sample(
                        &e.labels,
                        &[("clock_event", name), ("window_size_in_ms", &window)],
                        count(n),
                    );
                }
                if !any {
                    sink.sample(&e.labels, &[("window_size_in_ms", &window)], count(0));
                }
            }
            ExporterField::HealthStatus => {
                let Some(h) = &v.health else { continue };
                for (watch, verdict) in crate::health::WATCHES.iter().zip(h) {
                    if !e.up && *watch != "ALL" {
                        continue;
                    }
                    sink.sample(
                        &e.labels,
                        &[("health_error_code", verdict.code), ("health_watch", watch)],
                        count(verdict.result as u64),
                    );
                }
            }
        }
    }
}

/// One per-process family: a series per process that reports `value`.
fn process_family<'a, S: Sink<'a>>(
    snap: &'a Snapshot,
    sink: &mut S,
    name: &str,
    help: &str,
    value: impl Fn(&crate::source::ProcessSample) -> Option<u64>,
) {
    sink.family(&format!("{PREFIX}{name}"), MetricType::Gauge, help);
    let mut pid = itoa::Buffer::new();
    for e in &snap.entities {
        for p in &e.processes {
            let Some(x) = value(&p.sample) else {
                continue;
            };
            let pid = pid.format(p.sample.pid);
            let name = ("process_name", p.sample.name.as_str());
            match &p.pod {
                Some(pod) => sink.sample(
                    &e.labels,
                    &[
                        ("pid", pid),
                        name,
                        ("namespace", &pod.namespace),
                        ("pod", &pod.pod),
                    ],
                    Sample::Uint(x),
                ),
                None => sink.sample(&e.labels, &[("pid", pid), name], Sample::Uint(x)),
            }
        }
    }
}

/// The per-scrape part of a body, appended to `out`: the scrape-duration histogram,
/// and in OpenMetrics the closing `# EOF`, which must come last.
pub fn scrape_part(stats: ScrapeStats, fmt: Format, out: &mut Vec<u8>) {
    match fmt {
        Format::Text | Format::OpenMetrics => {
            walk_scrape_metrics(stats, &mut TextSink::new(out, fmt));
        }
        Format::Protobuf => {
            let mut sink = protobuf::ProtoSink::new(out);
            walk_scrape_metrics(stats, &mut sink);
            sink.finish();
        }
    }
    if fmt == Format::OpenMetrics {
        out.extend_from_slice(b"# EOF\n");
    }
}

/// The exporter's own families that change only with the snapshot, in order, into
/// `sink`; [`walk_scrape_metrics`] follows them.
pub(crate) fn walk_snapshot_metrics<'a, S: Sink<'a>>(snap: &'a Snapshot, sink: &mut S) {
    sink.family(
        &format!("{PREFIX}build_info"),
        MetricType::Gauge,
        "Version and GPU source of this exporter; always 1.",
    );
    sink.sample(&snap.build_labels, &[], Sample::Uint(1));
    walk_sampling_metrics(snap, sink);
    if let Some(r) = &snap.config_reload {
        walk_config_reload_metrics(r, sink);
    }
    if let Some(a) = &snap.attribution {
        walk_attribution_metrics(a, sink);
    }
    if !snap.field_errors.is_empty() {
        sink.family(
            &format!("{PREFIX}field_errors_total"),
            MetricType::Counter,
            "Failed reads per field (not-supported answers are not errors).",
        );
        for (field, n) in &snap.field_errors {
            sink.sample("", &[("field", field)], Sample::Uint(*n));
        }
    }
}

/// One unlabelled sample of our own: `name` without the prefix.
fn scalar<'a, S: Sink<'a>>(sink: &mut S, ty: MetricType, name: &str, help: &str, v: f64) {
    sink.family(&format!("{PREFIX}{name}"), ty, help);
    sink.sample("", &[], Sample::Float(v));
}

/// How the sampler is doing: whether it reaches the driver, and its cycles.
fn walk_sampling_metrics<'a, S: Sink<'a>>(snap: &Snapshot, sink: &mut S) {
    scalar(
        sink,
        MetricType::Gauge,
        "source_up",
        "1 if the last sampling cycle reached the GPU driver, else 0.",
        if snap.source_up { 1.0 } else { 0.0 },
    );
    scalar(
        sink,
        MetricType::Gauge,
        "source_hung",
        "1 while a GPU call has not returned for several collect intervals, else 0.",
        if snap.source_hung { 1.0 } else { 0.0 },
    );
    if let Some((_, wall)) = snap.last_success {
        scalar(
            sink,
            MetricType::Gauge,
            "last_sample_timestamp_seconds",
            "Unix time of the last sampling cycle that reached the GPU driver.",
            unix_seconds(wall),
        );
    }
    scalar(
        sink,
        MetricType::Gauge,
        "sample_duration_seconds",
        "Duration of the last sampling cycle.",
        snap.sample_duration.as_secs_f64(),
    );
    scalar(
        sink,
        MetricType::Counter,
        "samples_total",
        "Sampling cycles run.",
        snap.samples_total as f64,
    );
    scalar(
        sink,
        MetricType::Counter,
        "sample_failures_total",
        "Sampling cycles in which the GPU driver did not answer.",
        snap.sample_failures_total as f64,
    );
}

/// The outcome of the last load of the counters CSV.
fn walk_config_reload_metrics<'a, S: Sink<'a>>(
    status: &crate::plan::reload::ReloadStatus,
    sink: &mut S,
) {
    scalar(
        sink,
        MetricType::Gauge,
        "config_last_reload_successful",
        "1 if the last load of the counters CSV succeeded, else 0 (the previous counters are still served).",
        if status.successful { 1.0 } else { 0.0 },
    );
    scalar(
        sink,
        MetricType::Gauge,
        "config_last_reload_success_timestamp_seconds",
        "Unix time of the last successful load of the counters CSV.",
        unix_seconds(status.last_success),
    );
}

/// The health of pod attribution: the kubelet list, the pod watch, unmapped devices.
fn walk_attribution_metrics<'a, S: Sink<'a>>(
    a: &crate::attribution::AttributionStatus,
    sink: &mut S,
) {
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    scalar(
        sink,
        MetricType::Gauge,
        "kubelet_up",
        "1 if the last kubelet PodResources list succeeded, else 0 (series then carry no pod labels).",
        flag(a.kubelet_up),
    );
    scalar(
        sink,
        MetricType::Counter,
        "kubelet_list_failures_total",
        "kubelet PodResources lists that failed or timed out.",
        a.kubelet_failures_total as f64,
    );
    scalar(
        sink,
        MetricType::Gauge,
        "kubelet_list_duration_seconds",
        "Duration of the last kubelet PodResources list.",
        a.kubelet_list_duration_seconds,
    );
    if a.pod_watch {
        scalar(
            sink,
            MetricType::Gauge,
            "pod_watch_up",
            "1 while the API server's pod watch for this node is connected and synced, else 0 (the last known pods stay in use).",
            flag(a.pod_watch_up && a.pod_watch_synced),
        );
    }
    scalar(
        sink,
        MetricType::Gauge,
        "pod_devices_unmapped",
        "kubelet GPU device IDs that name no device of this node, or match no known form.",
        (a.unmapped_devices + a.unparsed_devices) as f64,
    );
    scalar(
        sink,
        MetricType::Gauge,
        "attribution_duration_seconds",
        "Time the last sampling cycle spent attributing devices and shares to pods.",
        a.duration_seconds,
    );
}

/// The exporter's own families that change with every scrape, into `sink`.
pub(crate) fn walk_scrape_metrics<'a, S: Sink<'a>>(stats: ScrapeStats, sink: &mut S) {
    sink.histogram(
        &format!("{PREFIX}scrape_duration_seconds"),
        "Time to build the /metrics response, excluding this scrape.",
        &SCRAPE_BUCKETS,
        &stats.buckets,
        stats.scrapes,
        stats.duration_seconds_sum,
    );
    sink.family(
        &format!("{PREFIX}http_connections_refused_total"),
        MetricType::Counter,
        "Connections denied a regular place on the listener, by reason: per_address (the client's address held --max-connections-per-address) or max_connections (the listener held --max-connections). They may ask only the health paths.",
    );
    for (reason, n) in tls_serving::Refusal::ALL
        .iter()
        .zip(stats.connections_refused)
    {
        sink.sample("", &[("reason", reason.reason())], Sample::Uint(n));
    }
}

/// A whole scrape body. `include_devices` is false when the snapshot is too old to
/// be trusted (a hung source), so stale readings are never served as current.
///
/// The body is [`cached_part`] then [`scrape_part`]. With `gzip_body` it is the cached
/// gzip member ([`cached_part_gzip`]) then the per-scrape part as a stored member
/// ([`gzip_stored`]), so a scrape compresses nothing. In protobuf both parts are runs of
/// delimited messages, so their concatenation is one; in OpenMetrics `# EOF` ends the
/// per-scrape part, so it stays last.
pub fn render(
    snap: &Snapshot,
    stats: ScrapeStats,
    fmt: Format,
    include_devices: bool,
    gzip_body: bool,
) -> Vec<u8> {
    let parts = render_parts(snap, stats, fmt, include_devices, gzip_body);
    let mut out = Vec::with_capacity(parts.len());
    out.extend_from_slice(&parts.cached);
    out.extend_from_slice(&parts.scrape);
    out
}

/// A scrape body in its two parts, as [`render`] joins them: the snapshot's cached part,
/// shared (a reference, not a copy), then this scrape's own bytes.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// [`cached_part`] or [`cached_part_gzip`]: the one buffer all scrapes of the
    /// snapshot share.
    pub cached: Bytes,
    /// [`scrape_part`], as a stored gzip member when gzipped: ~1 KB.
    pub scrape: Vec<u8>,
}

impl Rendered {
    /// The whole body's length.
    pub fn len(&self) -> usize {
        self.cached.len() + self.scrape.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`render`] without joining: what the HTTP side serves, so a response costs its
/// ~1 KB per-scrape part and no copy of the snapshot's.
pub fn render_parts(
    snap: &Snapshot,
    stats: ScrapeStats,
    fmt: Format,
    include_devices: bool,
    gzip_body: bool,
) -> Rendered {
    let mut tail = Vec::with_capacity(1024);
    scrape_part(stats, fmt, &mut tail);
    if gzip_body {
        let cached = cached_part_gzip(snap, fmt, include_devices).clone();
        // Header, block header, CRC and size: 26 bytes of framing per stored block.
        let mut scrape = Vec::with_capacity(tail.len() + 32);
        gzip_stored(&tail, &mut scrape);
        Rendered { cached, scrape }
    } else {
        let cached = cached_part(snap, fmt, include_devices).clone();
        Rendered {
            cached,
            scrape: tail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(v: f64) -> String {
        let mut out = Vec::new();
        write_fixed6(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn fixed6_matches_printf() {
        for v in [
            0.0,
            287.415,
            1.0,
            -3.25,
            0.000_000_4,
            0.000_000_6,
            123_456.789_012_345,
            1e13,
            -0.0,
        ] {
            assert_eq!(
                fixed(v),
                format!("{v:.6}").replace("-0.000000", "0.000000"),
                "{v}"
            );
        }
        assert_eq!(fixed(f64::NAN), "NaN");
        assert_eq!(fixed(f64::INFINITY), "+Inf");
    }

    proptest::proptest! {
        /// Protobuf values are, bit for bit, what a parser reads from the text.
        #[test]
        fn fixed6_value_is_what_the_text_parses_to(
            v in proptest::prop_oneof![
                proptest::num::f64::ANY,
                -1e4..1e4f64,
                -1e-5..1e-5f64,
                -1e13..1e13f64,
            ]
        ) {
            let text = fixed(v);
            let parsed = match text.as_str() {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                t => t.parse::<f64>().expect("a number"),
            };
            let got = fixed6_value(v);
            proptest::prop_assert!(
                got.to_bits() == parsed.to_bits() || (got.is_nan() && parsed.is_nan()),
                "{v}: text {text} parses to {parsed}, fixed6_value gives {got}"
            );
        }
    }

    #[test]
    fn the_listener_refusals_are_served_with_every_scrape_by_reason() {
        let stats = ScrapeStats {
            connections_refused: [3, 0],
            ..ScrapeStats::default()
        };
        let mut out = Vec::new();
        scrape_part(stats, Format::Text, &mut out);
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.contains(concat!(
                "# TYPE gpu_exporter_http_connections_refused_total counter\n",
                "gpu_exporter_http_connections_refused_total{reason=\"per_address\"} 3\n",
                "gpu_exporter_http_connections_refused_total{reason=\"max_connections\"} 0\n",
            )),
            "{text}"
        );
    }

    #[test]
    fn openmetrics_counters_gain_total_and_families_lose_it() {
        let mut out = Vec::new();
        write_header(
            &mut out,
            Format::OpenMetrics,
            "gpu_exporter_samples_total",
            MetricType::Counter,
            "h",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "# HELP gpu_exporter_samples h\n# TYPE gpu_exporter_samples counter\n"
        );
        assert_eq!(
            sample_name(
                Format::OpenMetrics,
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                MetricType::Counter
            ),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"
        );
        assert_eq!(
            sample_name(
                Format::Text,
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                MetricType::Counter
            ),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
        );
    }

    #[test]
    fn help_text_is_escaped() {
        let mut out = Vec::new();
        write_help(&mut out, "m", "a\\b\nc");
        assert_eq!(String::from_utf8(out).unwrap(), "# HELP m a\\\\b\\nc\n");
    }
}
