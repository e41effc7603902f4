//! Renders a [`Snapshot`] as Prometheus text (0.0.4, the default) or OpenMetrics 1.0.
//!
//! Written by hand on purpose: dcgm-exporter prints counters without `_total` and values
//! in its own formats (`%d`, `%f`), which no Rust client library emits (prometheus-client
//! writes OpenMetrics only). One writer serves both formats so they cannot drift; the
//! golden-file and promtool tests hold it to both specs.
//!
//! The device families are rendered once per snapshot and shared by every scrape; only
//! the few self-metrics about scrapes are rendered per request.

pub mod xid;

use crate::counters::{MetricKind, MetricType};
use crate::snapshot::{Snapshot, Value};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
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

/// Append a label value, escaped; values without special characters are copied as is.
fn escape_into(out: &mut Vec<u8>, v: &str) {
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.extend_from_slice(v.as_bytes());
        return;
    }
    for b in v.bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            b => out.push(b),
        }
    }
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
        escape_into(out, v);
        out.push(b'"');
    }
    out.extend_from_slice(b"} ");
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The device families of a snapshot in `fmt`, rendered once and cached in the snapshot.
pub fn device_families(snap: &Snapshot, fmt: Format) -> &[u8] {
    snap.rendered[fmt.index()].get_or_init(|| {
        let mut out = Vec::with_capacity(256 * snap.values.len().max(16));
        render_device_families(snap, fmt, &mut out);
        out
    })
}

/// The device families gzip-compressed, once per snapshot and format. A response is
/// this gzip member followed by a small per-scrape member: concatenated gzip members
/// are one valid gzip stream (RFC 1952 §2.2), which Prometheus and curl read whole.
pub fn device_families_gzip(snap: &Snapshot, fmt: Format) -> &[u8] {
    snap.rendered_gzip[fmt.index()].get_or_init(|| gzip(device_families(snap, fmt)))
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

/// Render the device families without caching (benchmarks use this directly).
pub fn render_device_families(snap: &Snapshot, fmt: Format, out: &mut Vec<u8>) {
    let metrics = &snap.plan.metrics;
    for (m, field) in metrics.iter().enumerate() {
        if !(0..snap.entities.len()).any(|e| snap.value(e, m).is_some()) {
            continue;
        }
        write_header(out, fmt, field.name, field.metric_type, &field.help);
        let name = sample_name(fmt, field.name, field.metric_type);
        for (e, entity) in snap.entities.iter().enumerate() {
            let Some(v) = snap.value(e, m) else { continue };
            // A shared device's pods first; the entity's own series then carries the
            // remainder, so the series of one device sum to its value.
            for share in &entity.shares {
                if let Some((_, pv)) = share.values.iter().find(|(i, _)| *i == m) {
                    write_series_start(out, &name, &share.labels, &[]);
                    write_value(out, *pv);
                    out.push(b'\n');
                }
            }
            match (field.kind, entity.last_xid) {
                (MetricKind::LastXid, Some(code)) if code != 0 => {
                    let code_text = code.to_string();
                    write_series_start(
                        out,
                        &name,
                        &entity.labels,
                        &[("err_code", &code_text), ("err_msg", xid::message(code))],
                    );
                }
                _ => write_series_start(out, &name, &entity.labels, &[]),
            }
            write_value(out, v);
            out.push(b'\n');
        }
    }

    // gpu_exporter_gpu_up: one per physical GPU, lost ones included.
    let up = format!("{PREFIX}gpu_up");
    write_header(
        out,
        fmt,
        &up,
        MetricType::Gauge,
        "1 while the GPU answers, 0 once it has fallen off the bus (its other series are then absent).",
    );
    for e in snap.entities.iter().filter(|e| e.is_gpu) {
        write_series_start(out, &up, &e.labels, &[]);
        out.push(if e.up { b'1' } else { b'0' });
        out.push(b'\n');
    }

    if !snap.allocations.is_empty() {
        let name = format!("{PREFIX}pod_gpu_allocation");
        write_header(
            out,
            fmt,
            &name,
            MetricType::Gauge,
            "1 for each GPU or MIG instance allocated to a container, with the device's and the pod's labels; join on UUID and GPU_I_ID to attribute any series.",
        );
        for labels in &snap.allocations {
            write_series_start(out, &name, labels, &[]);
            out.extend_from_slice(b"1\n");
        }
    }

    if snap.entities.iter().any(|e| !e.xids.is_empty()) {
        let total = format!("{PREFIX}xid_errors_total");
        write_header(
            out,
            fmt,
            &total,
            MetricType::Counter,
            "XID errors reported by the driver since the exporter started, by XID code.",
        );
        let total_sample = sample_name(fmt, &total, MetricType::Counter);
        for e in &snap.entities {
            for (code, stat) in &e.xids {
                write_series_start(out, &total_sample, &e.labels, &[("xid", &code.to_string())]);
                out.extend_from_slice(itoa::Buffer::new().format(stat.count).as_bytes());
                out.push(b'\n');
            }
        }
        let last = format!("{PREFIX}xid_last_seen_timestamp_seconds");
        write_header(
            out,
            fmt,
            &last,
            MetricType::Gauge,
            "Unix time the last XID error of this code was reported.",
        );
        for e in &snap.entities {
            for (code, stat) in &e.xids {
                write_series_start(out, &last, &e.labels, &[("xid", &code.to_string())]);
                write_f64(out, unix_seconds(stat.last_seen));
                out.push(b'\n');
            }
        }
    }

    if snap.process_metrics && snap.entities.iter().any(|e| !e.processes.is_empty()) {
        process_family(
            snap,
            fmt,
            out,
            "process_memory_used_bytes",
            "GPU memory used by a process, bytes.",
            |p| p.used_memory_bytes,
        );
        process_family(
            snap,
            fmt,
            out,
            "process_sm_utilization_percent",
            "Share of the device's SM utilisation used by a process, percent; shares sum to the device value.",
            |p| p.sm_util_percent.map(u64::from),
        );
    }
}

/// One per-process family: a series per process that reports `value`.
fn process_family(
    snap: &Snapshot,
    fmt: Format,
    out: &mut Vec<u8>,
    name: &str,
    help: &str,
    value: impl Fn(&crate::source::ProcessSample) -> Option<u64>,
) {
    let name = format!("{PREFIX}{name}");
    write_header(out, fmt, &name, MetricType::Gauge, help);
    let mut pid = itoa::Buffer::new();
    let mut v = itoa::Buffer::new();
    for e in &snap.entities {
        for p in &e.processes {
            if let Some(x) = value(p) {
                write_series_start(
                    out,
                    &name,
                    &e.labels,
                    &[("pid", pid.format(p.pid)), ("process_name", &p.name)],
                );
                out.extend_from_slice(v.format(x).as_bytes());
                out.push(b'\n');
            }
        }
    }
}

/// The exporter's own metrics, rendered per scrape.
pub fn self_metrics(snap: &Snapshot, stats: ScrapeStats, fmt: Format, out: &mut Vec<u8>) {
    // One unlabelled sample of our own: `name` without the prefix.
    let scalar = |out: &mut Vec<u8>, ty: MetricType, name: &str, help: &str, v: f64| {
        let name = format!("{PREFIX}{name}");
        write_header(out, fmt, &name, ty, help);
        out.extend_from_slice(sample_name(fmt, &name, ty).as_bytes());
        out.push(b' ');
        write_f64(out, v);
        out.push(b'\n');
    };
    let info = format!("{PREFIX}build_info");
    write_header(
        out,
        fmt,
        &info,
        MetricType::Gauge,
        "Version and GPU source of this exporter; always 1.",
    );
    write_series_start(out, &info, &snap.build_labels, &[]);
    out.extend_from_slice(b"1\n");
    scalar(
        out,
        MetricType::Gauge,
        "source_up",
        "1 if the last sampling cycle reached the GPU driver, else 0.",
        if snap.source_up { 1.0 } else { 0.0 },
    );
    scalar(
        out,
        MetricType::Gauge,
        "source_hung",
        "1 while a GPU call has not returned for several collect intervals, else 0.",
        if snap.source_hung { 1.0 } else { 0.0 },
    );
    if let Some((_, wall)) = snap.last_success {
        scalar(
            out,
            MetricType::Gauge,
            "last_sample_timestamp_seconds",
            "Unix time of the last sampling cycle that reached the GPU driver.",
            unix_seconds(wall),
        );
    }
    scalar(
        out,
        MetricType::Gauge,
        "sample_duration_seconds",
        "Duration of the last sampling cycle.",
        snap.sample_duration.as_secs_f64(),
    );
    scalar(
        out,
        MetricType::Counter,
        "samples_total",
        "Sampling cycles run.",
        snap.samples_total as f64,
    );
    scalar(
        out,
        MetricType::Counter,
        "sample_failures_total",
        "Sampling cycles in which the GPU driver did not answer.",
        snap.sample_failures_total as f64,
    );
    if let Some(a) = &snap.attribution {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        scalar(
            out,
            MetricType::Gauge,
            "kubelet_up",
            "1 if the last kubelet PodResources list succeeded, else 0 (series then carry no pod labels).",
            flag(a.kubelet_up),
        );
        scalar(
            out,
            MetricType::Counter,
            "kubelet_list_failures_total",
            "kubelet PodResources lists that failed or timed out.",
            a.kubelet_failures_total as f64,
        );
        scalar(
            out,
            MetricType::Gauge,
            "kubelet_list_duration_seconds",
            "Duration of the last kubelet PodResources list.",
            a.kubelet_list_duration_seconds,
        );
        if a.pod_watch {
            scalar(
                out,
                MetricType::Gauge,
                "pod_watch_up",
                "1 while the API server's pod watch for this node is connected and synced, else 0 (the last known pods stay in use).",
                flag(a.pod_watch_up && a.pod_watch_synced),
            );
        }
        scalar(
            out,
            MetricType::Gauge,
            "pod_devices_unmapped",
            "kubelet GPU device IDs that name no device of this node, or match no known form.",
            (a.unmapped_devices + a.unparsed_devices) as f64,
        );
        scalar(
            out,
            MetricType::Gauge,
            "attribution_duration_seconds",
            "Time the last sampling cycle spent attributing devices and shares to pods.",
            a.duration_seconds,
        );
    }
    if !snap.field_errors.is_empty() {
        let name = format!("{PREFIX}field_errors_total");
        write_header(
            out,
            fmt,
            &name,
            MetricType::Counter,
            "Failed reads per field (not-supported answers are not errors).",
        );
        let sample = sample_name(fmt, &name, MetricType::Counter);
        for (field, n) in &snap.field_errors {
            write_series_start(out, &sample, "", &[("field", field)]);
            out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes());
            out.push(b'\n');
        }
    }
    let scrape = format!("{PREFIX}scrape_duration_seconds");
    write_help(
        out,
        &scrape,
        "Time to build the /metrics response, excluding this scrape.",
    );
    let _ = writeln!(out, "# TYPE {scrape} histogram");
    let mut cumulative = 0;
    for (bound, n) in SCRAPE_BUCKETS.iter().zip(stats.buckets) {
        cumulative += n;
        let _ = writeln!(out, "{scrape}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{scrape}_bucket{{le=\"+Inf\"}} {}", stats.scrapes);
    let _ = writeln!(
        out,
        "{scrape}_sum {}",
        FloatText(stats.duration_seconds_sum, false)
    );
    let _ = writeln!(out, "{scrape}_count {}", stats.scrapes);
}

/// A whole scrape body. `include_devices` is false when the snapshot is too old to
/// be trusted (a hung source), so stale readings are never served as current. With
/// `gzip`, the body is gzip-compressed (the device part compressed once per snapshot).
pub fn render(
    snap: &Snapshot,
    stats: ScrapeStats,
    fmt: Format,
    include_devices: bool,
    gzip_body: bool,
) -> Vec<u8> {
    let mut tail = Vec::with_capacity(2048);
    self_metrics(snap, stats, fmt, &mut tail);
    if fmt == Format::OpenMetrics {
        tail.extend_from_slice(b"# EOF\n");
    }
    let devices: &[u8] = match (include_devices, gzip_body) {
        (false, _) => &[],
        (true, false) => device_families(snap, fmt),
        (true, true) => device_families_gzip(snap, fmt),
    };
    let tail = if gzip_body { gzip(&tail) } else { tail };
    let mut out = Vec::with_capacity(devices.len() + tail.len());
    out.extend_from_slice(devices);
    out.extend_from_slice(&tail);
    out
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
