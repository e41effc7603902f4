//! The Prometheus protobuf exposition format: `io.prometheus.client.MetricFamily`
//! messages ([`proto`], from `proto/prometheus/client_model/metrics.proto`), each
//! preceded by its length as a varint, as Prometheus, Go's `protodelim` and prost's
//! `decode_length_delimited` read them.
//!
//! The families are the ones the text format carries, from the same walk over the
//! snapshot (`encode::Sink`): same names (dcgm's counters without `_total`), HELP,
//! types, label sets in the same order, and values (`Sample::as_f64`). Label
//! values are raw strings: the text format's escaping does not apply.
//!
//! The wire format is written directly instead of building the prost structs and
//! encoding them, which would allocate two strings per label of every series: each
//! label set of the snapshot is parsed back from its pre-rendered text and encoded once
//! per render, then copied into every series that carries it. Fields go out in the order
//! prost writes them, so a body is byte for byte what prost makes of its own decoding
//! (the tests check exactly that).

use super::{Sample, Sink};
use crate::plan::counters::MetricType;
use prost::Message;
use prost::encoding::{WireType, encoded_len_varint};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// What `/metrics` answers with in this format (and what Prometheus asks for).
pub const CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// `google.protobuf.Timestamp`, as [`proto`]'s exemplars and created timestamps use it.
pub use kube_support::proto::Timestamp;
/// The message types of the format (`io.prometheus.client`), to decode a body.
pub use kube_support::proto::prometheus as proto;

/// Field numbers of `metrics.proto` that the encoder writes: the wire contract.
mod field {
    pub const FAMILY_NAME: u32 = 1;
    pub const FAMILY_HELP: u32 = 2;
    pub const FAMILY_TYPE: u32 = 3;
    pub const FAMILY_METRIC: u32 = 4;
    pub const METRIC_LABEL: u32 = 1;
    pub const METRIC_GAUGE: u32 = 2;
    pub const METRIC_COUNTER: u32 = 3;
    pub const METRIC_HISTOGRAM: u32 = 7;
    pub const LABEL_NAME: u32 = 1;
    pub const LABEL_VALUE: u32 = 2;
    /// `Gauge.value` and `Counter.value`.
    pub const VALUE: u32 = 1;
    pub const HISTOGRAM_SAMPLE_COUNT: u32 = 1;
    pub const HISTOGRAM_SAMPLE_SUM: u32 = 2;
    pub const HISTOGRAM_BUCKET: u32 = 3;
    pub const BUCKET_CUMULATIVE_COUNT: u32 = 1;
    pub const BUCKET_UPPER_BOUND: u32 = 2;
}

/// Bytes of a `Gauge` or `Counter` field holding one double: key, length 9, then the
/// value's key and 8 bytes (all keys of field numbers below 16 take one byte).
const VALUE_FIELD_LEN: usize = 1 + 1 + 1 + 8;

/// Decode a body of this format into its families (for tests and tools: the inverse
/// of the encoder, through the generated types).
pub fn decode(mut body: &[u8]) -> Result<Vec<proto::MetricFamily>, prost::DecodeError> {
    let mut families = Vec::new();
    while !body.is_empty() {
        families.push(proto::MetricFamily::decode_length_delimited(&mut body)?);
    }
    Ok(families)
}

/// The samples `families` denote, as `(series, value)` with the series written as the
/// text format writes it (`name{a="escaped",…}`, no braces without labels) and classic
/// histograms expanded as Prometheus expands them (`_bucket{le}`, an implicit `+Inf`
/// bucket from the count, `_sum`, `_count`). Comparing this with the sample lines of a
/// text scrape shows that both formats carry the same series in the same order.
pub fn series_text(families: &[proto::MetricFamily]) -> Vec<(String, f64)> {
    fn series(name: &str, labels: &[(&str, &str)]) -> String {
        let mut s = name.to_string();
        if !labels.is_empty() {
            s.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(k);
                s.push_str("=\"");
                s.push_str(&crate::snapshot::escape_label_value(v));
                s.push('"');
            }
            s.push('}');
        }
        s
    }
    let mut out = Vec::new();
    for f in families {
        for m in &f.metric {
            let labels: Vec<(&str, &str)> = m.label.iter().map(|l| (l.name(), l.value())).collect();
            if let Some(h) = &m.histogram {
                let with_le = |le: &str| {
                    let mut l = labels.clone();
                    l.push(("le", le));
                    series(&format!("{}_bucket", f.name()), &l)
                };
                for b in &h.bucket {
                    let le = if b.upper_bound() == f64::INFINITY {
                        "+Inf".to_string()
                    } else {
                        b.upper_bound().to_string()
                    };
                    out.push((with_le(&le), b.cumulative_count() as f64));
                }
                if h.bucket
                    .last()
                    .is_none_or(|b| b.upper_bound() != f64::INFINITY)
                {
                    out.push((with_le("+Inf"), h.sample_count() as f64));
                }
                out.push((
                    series(&format!("{}_sum", f.name()), &labels),
                    h.sample_sum(),
                ));
                out.push((
                    series(&format!("{}_count", f.name()), &labels),
                    h.sample_count() as f64,
                ));
            } else {
                let v = (m.gauge.as_ref().map(|g| g.value()))
                    .or(m.counter.as_ref().map(|c| c.value()))
                    .or(m.untyped.as_ref().map(|u| u.value()))
                    .unwrap_or(f64::NAN);
                out.push((series(f.name(), &labels), v));
            }
        }
    }
    out
}

/// A label set keyed by address. Every label set the walk passes lives in the
/// snapshot for the whole walk (`'a`), so equal address and length mean equal text,
/// and hashing two words beats hashing a few hundred bytes per series.
#[derive(Clone, Copy)]
struct ByAddr<'a>(&'a str);

impl PartialEq for ByAddr<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for ByAddr<'_> {}

impl Hash for ByAddr<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_usize(self.0.as_ptr() as usize);
        state.write_usize(self.0.len());
    }
}

/// FxHash-style hashing for [`ByAddr`]: one rotate, xor and multiply per word. SipHash
/// resists hash flooding, which addresses of our own allocations cannot mount, and it
/// would be a good part of the cost per series.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_usize(usize::from(*b));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// Room kept for a family's length while it is written: 3 bytes of varint hold
/// lengths up to 2 MiB. A family over 16 KiB (a big node's usual) then stays in place;
/// a smaller one moves back a byte or two, at most 16 KiB; one over 2 MiB moves forward.
/// Guessing from the previous family instead measured slower: families alternate
/// between GPU-only and per-MIG-instance sizes, and every wrong guess moves one.
const LEN_ROOM: usize = 3;

/// The protobuf writer: each family goes straight to `out`, behind room for its length.
pub(crate) struct ProtoSink<'a, 'o> {
    out: &'o mut Vec<u8>,
    /// Where the open family starts (its length prefix), if one is open.
    family_at: Option<usize>,
    /// Metrics in the open family so far: a family without any is left out, as client
    /// libraries do (the text format still prints its HELP and TYPE).
    metrics: usize,
    /// The `Metric` field holding the current family's values: gauge or counter.
    value_field: u32,
    /// Each label set seen, as the encoded `label` fields of a `Metric`.
    labels: HashMap<ByAddr<'a>, Vec<u8>, BuildHasherDefault<AddrHasher>>,
}

impl<'a, 'o> ProtoSink<'a, 'o> {
    pub(crate) fn new(out: &'o mut Vec<u8>) -> ProtoSink<'a, 'o> {
        ProtoSink {
            out,
            family_at: None,
            metrics: 0,
            value_field: field::METRIC_GAUGE,
            labels: HashMap::default(),
        }
    }

    /// Close the last family.
    pub(crate) fn finish(mut self) {
        self.end_family();
    }

    /// Write the open family's length in front of it, or drop it if it has no metrics.
    fn end_family(&mut self) {
        let Some(at) = self.family_at.take() else {
            return;
        };
        if self.metrics == 0 {
            self.out.truncate(at);
            return;
        }
        let body = at + LEN_ROOM;
        let len = self.out.len() - body;
        let n = encoded_len_varint(len as u64);
        match n.cmp(&LEN_ROOM) {
            Ordering::Less => {
                self.out.copy_within(body.., at + n);
                self.out.truncate(at + n + len);
            }
            Ordering::Greater => {
                self.out
                    .splice(at..at, std::iter::repeat_n(0, n - LEN_ROOM));
            }
            Ordering::Equal => {}
        }
        let (prefix, written) = varint(len as u64);
        debug_assert_eq!(written, n);
        self.out[at..at + n].copy_from_slice(&prefix[..n]);
        self.metrics = 0;
    }

    fn start_family(&mut self, name: &str, help: &str, ty: proto::MetricType) {
        self.end_family();
        self.family_at = Some(self.out.len());
        let out = &mut *self.out;
        out.extend_from_slice(&[0; LEN_ROOM]);
        put_bytes(out, field::FAMILY_NAME, name.as_bytes());
        put_bytes(out, field::FAMILY_HELP, help.as_bytes());
        put_key(out, field::FAMILY_TYPE, WireType::Varint);
        put_varint(out, ty as i32 as u64);
    }
}

impl<'a> Sink<'a> for ProtoSink<'a, '_> {
    fn family(&mut self, name: &str, ty: MetricType, help: &str) {
        let (ty, value_field) = match ty {
            MetricType::Gauge => (proto::MetricType::Gauge, field::METRIC_GAUGE),
            MetricType::Counter => (proto::MetricType::Counter, field::METRIC_COUNTER),
        };
        self.start_family(name, help, ty);
        self.value_field = value_field;
    }

    fn sample(&mut self, labels: &'a str, extra: &[(&str, &str)], value: Sample) {
        let encoded: &[u8] = if labels.is_empty() {
            &[]
        } else {
            self.labels
                .entry(ByAddr(labels))
                .or_insert_with(|| encode_label_text(labels))
        };
        let extra_len: usize = extra.iter().map(|(k, v)| label_field_len(k, v)).sum();
        let len = encoded.len() + extra_len + VALUE_FIELD_LEN;
        let out = &mut *self.out;
        out.reserve(len + 4);
        put_key(out, field::FAMILY_METRIC, WireType::LengthDelimited);
        put_varint(out, len as u64);
        out.extend_from_slice(encoded);
        for (k, v) in extra {
            put_label(out, k, v);
        }
        put_key(out, self.value_field, WireType::LengthDelimited);
        put_varint(out, (VALUE_FIELD_LEN - 2) as u64);
        put_double(out, field::VALUE, value.as_f64());
        self.metrics += 1;
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
        self.start_family(name, help, proto::MetricType::Histogram);
        // Histogram: count, sum, then the classic buckets, cumulative; the +Inf bucket
        // is left implicit (it is `sample_count`), as client_golang does.
        let mut h = Vec::with_capacity(16 * bounds.len() + 32);
        put_key(&mut h, field::HISTOGRAM_SAMPLE_COUNT, WireType::Varint);
        put_varint(&mut h, count);
        put_double(&mut h, field::HISTOGRAM_SAMPLE_SUM, sum);
        let mut cumulative = 0;
        let mut bucket = Vec::with_capacity(16);
        for (bound, n) in bounds.iter().zip(buckets) {
            cumulative += n;
            bucket.clear();
            put_key(
                &mut bucket,
                field::BUCKET_CUMULATIVE_COUNT,
                WireType::Varint,
            );
            put_varint(&mut bucket, cumulative);
            put_double(&mut bucket, field::BUCKET_UPPER_BOUND, *bound);
            put_bytes(&mut h, field::HISTOGRAM_BUCKET, &bucket);
        }
        let mut metric = Vec::with_capacity(h.len() + 8);
        put_bytes(&mut metric, field::METRIC_HISTOGRAM, &h);
        put_bytes(self.out, field::FAMILY_METRIC, &metric);
        self.metrics += 1;
    }
}

/// The same format the obvious way: a prost `MetricFamily` per family, then
/// `encode_length_delimited`. Not served: the `protobuf_encoders` bench measures
/// [`ProtoSink`] against it, and the tests hold both to the same bytes.
pub(crate) struct ProstSink<'a, 'o> {
    out: &'o mut Vec<u8>,
    family: Option<proto::MetricFamily>,
    /// Each label set seen, parsed once into pairs (cloned into every series).
    labels: HashMap<ByAddr<'a>, Vec<proto::LabelPair>, BuildHasherDefault<AddrHasher>>,
}

impl<'a, 'o> ProstSink<'a, 'o> {
    pub(crate) fn new(out: &'o mut Vec<u8>) -> ProstSink<'a, 'o> {
        ProstSink {
            out,
            family: None,
            labels: HashMap::default(),
        }
    }

    /// Encode the last family.
    pub(crate) fn finish(mut self) {
        self.end_family();
    }

    fn end_family(&mut self) {
        // As the hand-written writer: a family without metrics is left out.
        if let Some(f) = self.family.take().filter(|f| !f.metric.is_empty()) {
            // Encoding into a Vec cannot run out of room.
            let _ = f.encode_length_delimited(&mut *self.out);
        }
    }

    fn start_family(&mut self, name: &str, help: &str, ty: proto::MetricType) {
        self.end_family();
        self.family = Some(proto::MetricFamily {
            name: Some(name.into()),
            help: Some(help.into()),
            r#type: Some(ty as i32),
            ..Default::default()
        });
    }

    fn push(&mut self, metric: proto::Metric) {
        if let Some(f) = &mut self.family {
            f.metric.push(metric);
        }
    }
}

fn label_pair(name: &str, value: &str) -> proto::LabelPair {
    proto::LabelPair {
        name: Some(name.into()),
        value: Some(value.into()),
    }
}

impl<'a> Sink<'a> for ProstSink<'a, '_> {
    fn family(&mut self, name: &str, ty: MetricType, help: &str) {
        let ty = match ty {
            MetricType::Gauge => proto::MetricType::Gauge,
            MetricType::Counter => proto::MetricType::Counter,
        };
        self.start_family(name, help, ty);
    }

    fn sample(&mut self, labels: &'a str, extra: &[(&str, &str)], value: Sample) {
        let counter =
            self.family.as_ref().and_then(|f| f.r#type) == Some(proto::MetricType::Counter as i32);
        let mut label = self
            .labels
            .entry(ByAddr(labels))
            .or_insert_with(|| {
                let mut pairs = Vec::new();
                let mut rest = labels;
                while let Some((name, value, after)) = next_label(rest) {
                    pairs.push(label_pair(name, &value));
                    rest = after.strip_prefix(',').unwrap_or(after);
                }
                pairs
            })
            .clone();
        label.extend(extra.iter().map(|(k, v)| label_pair(k, v)));
        let value = Some(value.as_f64());
        self.push(proto::Metric {
            label,
            gauge: (!counter).then_some(proto::Gauge { value }),
            counter: counter.then(|| proto::Counter {
                value,
                ..Default::default()
            }),
            ..Default::default()
        });
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
        self.start_family(name, help, proto::MetricType::Histogram);
        let mut cumulative = 0;
        let bucket = bounds
            .iter()
            .zip(buckets)
            .map(|(bound, n)| {
                cumulative += n;
                proto::Bucket {
                    cumulative_count: Some(cumulative),
                    upper_bound: Some(*bound),
                    ..Default::default()
                }
            })
            .collect();
        self.push(proto::Metric {
            histogram: Some(proto::Histogram {
                sample_count: Some(count),
                sample_sum: Some(sum),
                bucket,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
}

/// A field's key. Every field the encoder writes has a number below 16, so its key is
/// one byte (`field << 3 | wire type`).
#[inline]
fn put_key(buf: &mut Vec<u8>, tag: u32, wire_type: WireType) {
    debug_assert!(tag < 16, "field {tag} needs a longer key");
    buf.push((tag as u8) << 3 | wire_type as u8);
}

/// `v` as a varint: its bytes, and how many there are.
#[inline]
fn varint(mut v: u64) -> ([u8; 10], usize) {
    let mut bytes = [0; 10];
    let mut n = 0;
    while v >= 0x80 {
        bytes[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    bytes[n] = v as u8;
    (bytes, n + 1)
}

#[inline]
fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// A length-delimited field.
fn put_bytes(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    put_key(buf, tag, WireType::LengthDelimited);
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

fn put_double(buf: &mut Vec<u8>, tag: u32, v: f64) {
    put_key(buf, tag, WireType::SixtyFourBit);
    buf.extend_from_slice(&v.to_le_bytes());
}

/// Bytes of a length-delimited field of `len` bytes (its key is one byte).
fn bytes_field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

fn label_pair_len(name: &str, value: &str) -> usize {
    bytes_field_len(name.len()) + bytes_field_len(value.len())
}

/// Bytes of one `Metric.label` field.
fn label_field_len(name: &str, value: &str) -> usize {
    bytes_field_len(label_pair_len(name, value))
}

/// One `Metric.label` field: a `LabelPair` of raw strings.
fn put_label(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.reserve(label_field_len(name, value));
    put_key(buf, field::METRIC_LABEL, WireType::LengthDelimited);
    put_varint(buf, label_pair_len(name, value) as u64);
    put_bytes(buf, field::LABEL_NAME, name.as_bytes());
    put_bytes(buf, field::LABEL_VALUE, value.as_bytes());
}

/// The `Metric.label` fields of a label set pre-rendered in text form
/// (`a="x",b="q\"uote"`), values unescaped. The sets come from the sampler's own
/// escaping, so they are well formed; were one not, the pairs before the fault are
/// kept and debug builds stop.
fn encode_label_text(text: &str) -> Vec<u8> {
    let mut buf = Vec::with_capacity(text.len() + 64);
    let mut rest = text;
    while !rest.is_empty() {
        let Some((name, value, after)) = next_label(rest) else {
            debug_assert!(false, "malformed pre-rendered label set: {text:?}");
            break;
        };
        put_label(&mut buf, name, &value);
        rest = after.strip_prefix(',').unwrap_or(after);
    }
    buf
}

/// The first `name="value"` of `text`: name, unescaped value, and what follows the
/// closing quote. Escapes are the text format's: `\\`, `\"` and `\n`.
fn next_label(text: &str) -> Option<(&str, Cow<'_, str>, &str)> {
    // Label names hold neither `=` nor `"`; names are short, so a plain scan is the
    // fastest search.
    let eq = text.bytes().position(|b| b == b'=')?;
    let (name, quoted) = (&text[..eq], text[eq + 1..].strip_prefix('"')?);
    let bytes = quoted.as_bytes();
    let mut value: Option<String> = None;
    let (mut i, mut copied) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let value = match value {
                    None => Cow::Borrowed(&quoted[..i]),
                    Some(mut v) => {
                        v.push_str(&quoted[copied..i]);
                        Cow::Owned(v)
                    }
                };
                return Some((name, value, &quoted[i + 1..]));
            }
            b'\\' => {
                let unescaped = match bytes.get(i + 1) {
                    Some(b'\\') => '\\',
                    Some(b'"') => '"',
                    Some(b'n') => '\n',
                    _ => return None,
                };
                let v = value.get_or_insert_with(String::new);
                v.push_str(&quoted[copied..i]);
                v.push(unescaped);
                i += 2;
                copied = i;
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_text_is_unescaped() {
        let text = r#"gpu="0",process_name="python3 \"eval\"",path="C:\\x\ny",empty="""#;
        let metric = proto::Metric::decode(encode_label_text(text).as_slice()).expect("decodes");
        let pairs: Vec<(&str, &str)> = metric.label.iter().map(|l| (l.name(), l.value())).collect();
        assert_eq!(
            pairs,
            [
                ("gpu", "0"),
                ("process_name", "python3 \"eval\""),
                ("path", "C:\\x\ny"),
                ("empty", ""),
            ]
        );
    }

    #[test]
    fn malformed_label_text_is_refused() {
        assert!(next_label(r#"a="unterminated"#).is_none());
        assert!(next_label(r#"a="bad \q escape""#).is_none());
        assert!(next_label("no_equals").is_none());
    }

    use crate::attribution::AttributionStatus;
    use crate::encode::{self, Format, SCRAPE_BUCKETS, ScrapeStats};
    use crate::plan::counters;
    use crate::sampler::{Sampler, SamplerOptions};
    use crate::snapshot::{PodShare, Snapshot, Value};
    use crate::source::simulated::SimulatedSource;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    /// The golden-file node (whole and MIG GPUs, a lost GPU, XIDs, processes named
    /// `python3 "eval"`), every field, plus what only pods bring: a shared GPU's
    /// per-pod series, an allocation, attribution status; label values with quotes,
    /// backslashes and newlines in every kind of label set.
    fn rich_snapshot() -> Snapshot {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
        let scenario =
            gpu_sim::Scenario::load(std::path::Path::new(&format!("{dir}/golden-node.toml")))
                .expect("scenario");
        let node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
        let csv = std::fs::read_to_string(format!("{dir}/all-fields.csv")).expect("csv");
        let (plan, _) = counters::plan(&csv, "all-fields").expect("plan");
        let mut sampler = Sampler::new(
            Box::new(SimulatedSource::new(node, "golden")),
            Arc::new(plan),
            SamplerOptions {
                interval: Duration::from_secs(1),
                hostname: Some(("Hostname".into(), "node \"7\" \\ x\ny".into())),
                replace_blanks_in_model_name: false,
                process_metrics: true,
                pod_uid: false,
                virtual_gpus: false,
                old_namespace: false,
            },
            Arc::from(r#"version="0.1.0",source="C:\\sim \"golden\"\nnode""#),
        );
        sampler.cycle();
        sampler.cycle();
        let mut snap = sampler.cycle();
        let base = snap.entities[0].labels.clone();
        let split: Vec<usize> = (0..snap.plan.metrics.len())
            .filter(|&m| snap.value(0, m).is_some())
            .take(4)
            .collect();
        snap.entities[0].shares = vec![
            PodShare {
                labels: format!(r#"{base},pod="web-\"0\"",namespace="a\\b""#).into(),
                values: split
                    .iter()
                    .map(|&m| (m, Value::Float(0.123_456_7)))
                    .collect(),
            },
            PodShare {
                labels: format!(r#"{base},pod="batch\n1",namespace="ml""#).into(),
                values: split.iter().map(|&m| (m, Value::Int(-3))).collect(),
            },
        ];
        snap.allocations = vec![format!(r#"{base},pod="web-\"0\"",namespace="a\\b""#).into()];
        snap.attribution = Some(AttributionStatus {
            kubelet_up: true,
            kubelet_failures_total: 2,
            kubelet_list_duration_seconds: 0.012_5,
            pod_watch: true,
            pod_watch_up: true,
            pod_watch_synced: true,
            unmapped_devices: 1,
            unparsed_devices: 0,
            duration_seconds: 0.000_3,
        });
        snap.field_errors = vec![
            ("DCGM_FI_DEV_FAN_SPEED", 7),
            ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", 1),
        ];
        snap
    }

    fn stats() -> ScrapeStats {
        let mut buckets = [0; SCRAPE_BUCKETS.len()];
        buckets[0] = 3;
        buckets[4] = 2;
        buckets[9] = 1;
        ScrapeStats {
            buckets,
            scrapes: 7,
            duration_seconds_sum: 0.061_25,
            connections_refused: [2, 5],
        }
    }

    /// The sample lines of a text body as (series, value).
    fn text_series(body: &str) -> Vec<(String, f64)> {
        body.lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (series, v) = l.rsplit_once(' ').expect("series and value");
                let v = match v {
                    "+Inf" => f64::INFINITY,
                    "-Inf" => f64::NEG_INFINITY,
                    v => v.parse().unwrap_or_else(|e| panic!("{l}: {e}")),
                };
                (series.to_string(), v)
            })
            .collect()
    }

    /// (name, help, type) of the text body's families that have samples.
    fn text_headers(body: &str) -> Vec<(String, String, String)> {
        let series = text_series(body);
        let mut out: Vec<(String, String, String)> = Vec::new();
        for l in body.lines() {
            if let Some(rest) = l.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("help");
                let help = help.replace("\\n", "\n").replace("\\\\", "\\");
                out.push((name.to_string(), help, String::new()));
            } else if let Some(rest) = l.strip_prefix("# TYPE ") {
                let (_, ty) = rest.split_once(' ').expect("type");
                out.last_mut().expect("HELP before TYPE").2 = ty.to_string();
            }
        }
        out.retain(|(name, _, _)| {
            series.iter().any(|(s, _)| {
                s.strip_prefix(name.as_str())
                    .is_some_and(|r| r.is_empty() || r.starts_with(['{', '_']))
            })
        });
        out
    }

    fn assert_same_series(text: &str, families: &[proto::MetricFamily]) {
        let want = text_series(text);
        let got = series_text(families);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w.0, g.0, "series {i}");
            assert!(
                w.1.to_bits() == g.1.to_bits() || (w.1.is_nan() && g.1.is_nan()),
                "{}: text {} vs protobuf {}",
                w.0,
                w.1,
                g.1
            );
        }
        assert_eq!(want.len(), got.len(), "series count");
        let headers: Vec<(String, String, String)> = families
            .iter()
            .map(|f| {
                let ty = match f.r#type() {
                    proto::MetricType::Gauge => "gauge",
                    proto::MetricType::Counter => "counter",
                    proto::MetricType::Histogram => "histogram",
                    other => panic!("unexpected type {other:?}"),
                };
                (f.name().to_string(), f.help().to_string(), ty.to_string())
            })
            .collect();
        assert_eq!(text_headers(text), headers);
    }

    #[test]
    fn protobuf_carries_the_text_series_labels_and_values() {
        let snap = rich_snapshot();
        let text = String::from_utf8(encode::render(&snap, stats(), Format::Text, true, false))
            .expect("utf-8");
        // Make sure the snapshot is as rich as promised, or the comparison proves little.
        for needle in [
            "gpu_exporter_process_memory_used_bytes{",
            r#"process_name="python3 \"eval\"""#,
            "gpu_exporter_xid_errors_total{",
            "DCGM_FI_DEV_XID_ERRORS{",
            "err_msg=",
            r#"pod="batch\n1""#,
            "gpu_exporter_pod_gpu_allocation{",
            "gpu_exporter_pod_watch_up ",
            "gpu_exporter_field_errors_total{",
            "gpu_exporter_gpu_up{",
            "GPU_I_ID=",
            "} 0.123457\n",
        ] {
            assert!(text.contains(needle), "{needle} missing from the text body");
        }
        let body = encode::render(&snap, stats(), Format::Protobuf, true, false);
        let families = decode(&body).expect("decodes");
        assert_same_series(&text, &families);

        // Raw values, not text escapes, in the labels.
        let labels_of = |name: &str| -> Vec<Vec<(String, String)>> {
            families
                .iter()
                .filter(|f| f.name() == name)
                .flat_map(|f| &f.metric)
                .map(|m| {
                    m.label
                        .iter()
                        .map(|l| (l.name().to_string(), l.value().to_string()))
                        .collect()
                })
                .collect()
        };
        let processes = labels_of("gpu_exporter_process_memory_used_bytes");
        assert!(
            processes
                .iter()
                .any(|ls| ls.contains(&("process_name".into(), "python3 \"eval\"".into())))
        );
        assert!(
            processes
                .iter()
                .all(|ls| ls.contains(&("Hostname".into(), "node \"7\" \\ x\ny".into())))
        );
        let allocation = labels_of("gpu_exporter_pod_gpu_allocation");
        assert!(allocation[0].ends_with(&[
            ("pod".into(), "web-\"0\"".into()),
            ("namespace".into(), "a\\b".into())
        ]));
        let info = labels_of("gpu_exporter_build_info");
        assert_eq!(
            info[0][1],
            ("source".into(), "C:\\sim \"golden\"\nnode".into())
        );

        // Types: dcgm counters keep their names; our counters are counters.
        let family = |name: &str| families.iter().find(|f| f.name() == name).expect(name);
        assert_eq!(
            family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").r#type(),
            proto::MetricType::Counter
        );
        assert!(
            family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").metric[0]
                .counter
                .is_some()
        );
        assert_eq!(
            family("gpu_exporter_samples_total").r#type(),
            proto::MetricType::Counter
        );
        let h = family("gpu_exporter_scrape_duration_seconds").metric[0]
            .histogram
            .as_ref()
            .expect("histogram");
        assert_eq!((h.sample_count(), h.sample_sum()), (7, 0.061_25));
        let cumulative: Vec<u64> = h.bucket.iter().map(|b| b.cumulative_count()).collect();
        assert_eq!(cumulative, [3, 3, 3, 3, 5, 5, 5, 5, 5, 6]);
        assert_eq!(h.bucket[0].upper_bound(), SCRAPE_BUCKETS[0]);
    }

    #[test]
    fn bodies_are_exactly_what_prost_writes() {
        let snap = rich_snapshot();
        let body = encode::render(&snap, stats(), Format::Protobuf, true, false);
        let families = decode(&body).expect("decodes");
        let mut again = Vec::new();
        for f in &families {
            f.encode_length_delimited(&mut again).expect("Vec grows");
        }
        assert_eq!(again, body);
    }

    /// The benchmark's prost path builds its structs from the snapshot itself, not from
    /// a decoding: both writers must give the same bytes for the comparison to hold.
    #[test]
    fn the_prost_built_families_are_the_same_bytes() {
        let snap = rich_snapshot();
        let mut hand = Vec::new();
        encode::render_device_families(&snap, Format::Protobuf, &mut hand);
        let mut prost = Vec::new();
        encode::render_device_families_prost(&snap, &mut prost);
        assert!(decode(&hand).expect("decodes").len() > 10);
        assert_eq!(prost, hand);
        let mut hist = Vec::new();
        let mut sink = ProstSink::new(&mut hist);
        sink.histogram("h", "help", &SCRAPE_BUCKETS, &[1; 10], 12, 0.5);
        sink.finish();
        let mut hist_hand = Vec::new();
        let mut sink = ProtoSink::new(&mut hist_hand);
        sink.histogram("h", "help", &SCRAPE_BUCKETS, &[1; 10], 12, 0.5);
        sink.finish();
        assert_eq!(hist, hist_hand);
    }

    #[test]
    fn empty_and_stale_snapshots_encode_too() {
        let empty = Snapshot::empty(rich_snapshot().plan.clone(), Arc::from(""));
        for include_devices in [true, false] {
            let body = encode::render(
                &empty,
                ScrapeStats::default(),
                Format::Protobuf,
                include_devices,
                false,
            );
            let families = decode(&body).expect("decodes");
            let text = encode::render(
                &empty,
                ScrapeStats::default(),
                Format::Text,
                include_devices,
                false,
            );
            assert_same_series(&String::from_utf8(text).expect("utf-8"), &families);
            // No GPUs: `gpu_up` has no series, and an empty family is left out.
            assert!(families.iter().all(|f| !f.metric.is_empty()));
            assert!(families.iter().all(|f| f.name() != "gpu_exporter_gpu_up"));
        }
    }

    #[test]
    fn the_cached_part_is_rendered_once_per_format_and_variant() {
        let snap = rich_snapshot();
        let first = encode::cached_part(&snap, Format::Protobuf, true).as_ptr();
        assert_eq!(
            encode::cached_part(&snap, Format::Protobuf, true).as_ptr(),
            first
        );
        assert_ne!(
            encode::cached_part(&snap, Format::Text, true).as_ptr(),
            first
        );
        assert_ne!(
            encode::cached_part(&snap, Format::Protobuf, false).as_ptr(),
            first
        );
    }

    fn gunzip_all(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(body), &mut out)
            .expect("a valid gzip stream");
        out
    }

    /// Every format, with and without devices: the gzip body is the snapshot's cached
    /// member, untouched, then a per-scrape member, and a standard multi-member reader
    /// reads exactly the plain body out of it, whatever the scrape statistics.
    #[test]
    fn a_gzip_body_is_the_cached_member_then_a_per_scrape_member() {
        let snap = rich_snapshot();
        let mut later = stats();
        later.scrapes += 5;
        later.buckets[2] += 5;
        later.duration_seconds_sum += 0.25;
        for fmt in [Format::Text, Format::OpenMetrics, Format::Protobuf] {
            for include_devices in [true, false] {
                let cached = encode::cached_part_gzip(&snap, fmt, include_devices);
                let mut bodies = Vec::new();
                for stats in [stats(), later] {
                    let plain = encode::render(&snap, stats, fmt, include_devices, false);
                    let zipped = encode::render(&snap, stats, fmt, include_devices, true);
                    assert_eq!(gunzip_all(&zipped), plain, "{fmt:?} {include_devices}");
                    assert!(
                        zipped.starts_with(cached),
                        "{fmt:?}: the snapshot's member leads the body"
                    );
                    // The same bytes, not a new compression of them.
                    assert_eq!(
                        encode::cached_part_gzip(&snap, fmt, include_devices).as_ptr(),
                        cached.as_ptr()
                    );
                    assert_eq!(
                        gunzip_all(cached),
                        &encode::cached_part(&snap, fmt, include_devices)[..]
                    );
                    if fmt == Format::OpenMetrics {
                        assert!(plain.ends_with(b"# EOF\n"));
                        assert_eq!(
                            plain.windows(6).filter(|w| w == b"# EOF\n").count(),
                            1,
                            "one # EOF, at the end"
                        );
                    }
                    bodies.push(plain);
                }
                assert_ne!(bodies[0], bodies[1], "the histogram is per scrape");
                if include_devices {
                    assert!(
                        cached.len() * 4 < bodies[0].len(),
                        "{fmt:?}: {} vs {}",
                        cached.len(),
                        bodies[0].len()
                    );
                }
            }
        }
    }

    /// The hand-framed stored member, at the sizes where its block framing changes, read
    /// by flate2's single-member reader.
    #[test]
    fn a_stored_gzip_member_reads_back_exactly() {
        for len in [0usize, 1, 700, 65_535, 65_536, 140_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut member = b"prefix".to_vec();
            encode::gzip_stored(&data, &mut member);
            let mut back = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&member[6..]), &mut back)
                .expect("valid gzip");
            assert_eq!(back, data, "{len} bytes");
        }
    }

    #[test]
    fn framing_round_trips_and_truncation_is_an_error() {
        let snap = rich_snapshot();
        let body = encode::render(&snap, stats(), Format::Protobuf, true, false);
        // Families over 127 bytes take multi-byte length prefixes.
        let mut rest = body.as_slice();
        let mut sizes = Vec::new();
        while !rest.is_empty() {
            let len = prost::encoding::decode_varint(&mut rest).expect("length") as usize;
            sizes.push(len);
            rest = &rest[len..];
        }
        assert!(sizes.iter().any(|&n| n > 127) && sizes.iter().any(|&n| n < 16384));
        assert_eq!(sizes.len(), decode(&body).expect("decodes").len());
        assert!(decode(&body[..body.len() - 1]).is_err());
    }

    #[test]
    fn length_prefixes_of_every_size() {
        // Families whose length prefix takes 1, 2, 3 and 4 bytes: written in place,
        // moved back, and moved forward; an empty one in between is left out.
        let labels = format!(r#"gpu="0",big="{}""#, "x".repeat(1000));
        let mut out = Vec::new();
        let mut sink = ProtoSink::new(&mut out);
        for (i, series) in [0usize, 1, 3, 40, 0, 2500].into_iter().enumerate() {
            sink.family(&format!("f{i}"), MetricType::Gauge, "h");
            for s in 0..series {
                let s = s.to_string();
                let text: &str = if i == 1 { "" } else { &labels };
                sink.sample(text, &[("s", &s)], Sample::Uint(7));
            }
        }
        sink.finish();
        let families = decode(&out).expect("decodes");
        let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["f1", "f2", "f3", "f5"]);
        assert_eq!(families[3].metric.len(), 2500);
        assert!(families[3].encoded_len() > 1 << 21, "a 4-byte prefix");
        let mut again = Vec::new();
        for f in &families {
            f.encode_length_delimited(&mut again).expect("Vec grows");
        }
        assert_eq!(again, out);
    }

    #[test]
    fn field_lengths_match_prost() {
        let pair = proto::LabelPair {
            name: Some("UUID".into()),
            value: Some("x".repeat(200)),
        };
        assert_eq!(label_pair_len("UUID", &"x".repeat(200)), pair.encoded_len());
        let gauge = proto::Gauge { value: Some(1.5) };
        assert_eq!(VALUE_FIELD_LEN, 2 + gauge.encoded_len());
    }
}
