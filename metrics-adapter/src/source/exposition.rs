//! Decoding exporter scrapes: the Prometheus protobuf exposition (length-delimited
//! `io.prometheus.client.MetricFamily` messages), which the gpu-exporter serves when
//! asked. Binary and length-prefixed, it needs no text parsing and no escaping rules.
//! It is walked field by field rather than decoded into prost's generated types, so
//! that nothing the adapter does not keep is ever copied (issue 27).

use super::derive::{Decoded, FAMILIES, LABELS, Series};
use super::limits::{MAX_LABELS_PER_SERIES, Rejection};
use crate::error::Error;

/// The `io.prometheus.client` types.
pub use kube_support::proto::prometheus as proto;

/// What the adapter asks the exporters for.
pub const ACCEPT: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";

/// The series of the wanted families in a scrape body, at most `max_series` of them.
///
/// The body is walked field by field, whatever order the fields come in, and only
/// what a series needs is copied out: a family's name, and of each wanted metric its
/// value and the labels the derivation reads ([`LABELS`]). Help texts, unwanted
/// families, exemplars and every other field are skipped where they lie, so a family
/// whose 15 MiB of metrics come before its name costs nothing more than one whose name
/// comes first. A metric with more than [`MAX_LABELS_PER_SERIES`] labels is refused and
/// counted in [`Decoded::over_labels`]; the rest of the answer is kept.
pub fn decode(content_type: &str, body: &[u8], max_series: usize) -> Result<Decoded, Error> {
    if !content_type.starts_with("application/vnd.google.protobuf") {
        return Err(Error::Decode(format!(
            "the exporter answered {content_type:?}, not the protobuf exposition (is it a gpu-exporter?)"
        )));
    }
    let mut buf = body;
    let mut out = Decoded::default();
    while !buf.is_empty() {
        let len = prost::encoding::decode_varint(&mut buf).map_err(malformed)?;
        let message = take(&mut buf, len, "a message runs past the body")?;
        // Most families are not wanted (6 of the default 25): skipped by name, their
        // metrics never decoded. Following each exporter sample by sample, decoding is
        // most of the adapter's CPU.
        match family_name(message)? {
            Some(name) if FAMILIES.contains(&name) => {
                decode_metrics(name, message, max_series, &mut out)?
            }
            _ => {}
        }
    }
    Ok(out)
}

fn malformed(e: prost::DecodeError) -> Error {
    Error::Decode(format!("malformed protobuf exposition: {e}"))
}

/// The next `len` bytes of `buf`, which it must hold.
fn take<'a>(buf: &mut &'a [u8], len: u64, what: &str) -> Result<&'a [u8], Error> {
    let len = usize::try_from(len)
        .ok()
        .filter(|len| *len <= buf.len())
        .ok_or_else(|| Error::Decode(format!("malformed protobuf exposition: {what}")))?;
    let (field, rest) = buf.split_at(len);
    *buf = rest;
    Ok(field)
}

/// One field of an encoded message: its number, and its bytes when length-delimited,
/// or its value when a 64-bit one; other wire types are skipped (`Other`).
enum Field<'a> {
    Bytes(u32, &'a [u8]),
    Fixed64(u32, u64),
    Other,
}

/// The fields of an encoded message, one at a time, nothing copied.
fn next_field<'a>(message: &mut &'a [u8]) -> Result<Option<Field<'a>>, Error> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    if message.is_empty() {
        return Ok(None);
    }
    let (tag, wire_type) = decode_key(message).map_err(malformed)?;
    Ok(Some(match wire_type {
        WireType::LengthDelimited => {
            let len = decode_varint(message).map_err(malformed)?;
            Field::Bytes(tag, take(message, len, "a field runs past its message")?)
        }
        WireType::SixtyFourBit => {
            let bytes = take(message, 8, "a field runs past its message")?;
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            Field::Fixed64(tag, u64::from_le_bytes(word))
        }
        _ => {
            skip_field(wire_type, tag, message, DecodeContext::default()).map_err(malformed)?;
            Field::Other
        }
    }))
}

/// A `string` field's text.
fn text(bytes: &[u8]) -> Result<&str, Error> {
    std::str::from_utf8(bytes)
        .map_err(|_| Error::Decode("malformed protobuf exposition: a string is not UTF-8".into()))
}

/// The name (field 1) of an encoded `MetricFamily`, wherever it is among the fields
/// (the last one, as protobuf merges a repeated scalar).
fn family_name(mut message: &[u8]) -> Result<Option<&str>, Error> {
    let mut name = None;
    while let Some(field) = next_field(&mut message)? {
        if let Field::Bytes(1, bytes) = field {
            name = Some(text(bytes)?);
        }
    }
    Ok(name)
}

/// Every `metric` field (4) of an encoded `MetricFamily`, one at a time, into `out`.
fn decode_metrics(
    name: &str,
    mut message: &[u8],
    max_series: usize,
    out: &mut Decoded,
) -> Result<(), Error> {
    while let Some(field) = next_field(&mut message)? {
        let Field::Bytes(4, metric) = field else {
            continue;
        };
        let Some((labels, value)) = decode_metric(metric, out)? else {
            continue;
        };
        if out.series.len() >= max_series {
            return Err(Error::OverLimit {
                reason: Rejection::SeriesLimit,
                message: format!(
                    "the exporter reports more than {max_series} series of the served families (--max-series-per-target)"
                ),
            });
        }
        out.series.push(Series {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(())
}

/// Label pairs, as a series holds them.
type Labels = Vec<(String, String)>;

/// One `Metric`: the labels the derivation reads and its value (a gauge's, else a
/// counter's, else an untyped one's); `None` when it has no value or more than
/// [`MAX_LABELS_PER_SERIES`] labels (then counted in `out`).
fn decode_metric(mut metric: &[u8], out: &mut Decoded) -> Result<Option<(Labels, f64)>, Error> {
    let mut labels = Vec::new();
    let mut count = 0usize;
    // gauge (2), counter (3), untyped (5): each a message whose field 1 is the value.
    let mut values: [Option<f64>; 3] = [None; 3];
    while let Some(field) = next_field(&mut metric)? {
        let Field::Bytes(tag, mut bytes) = field else {
            continue;
        };
        match tag {
            1 => {
                count += 1;
                if count > MAX_LABELS_PER_SERIES {
                    continue;
                }
                let (mut label, mut value) = ("", "");
                while let Some(field) = next_field(&mut bytes)? {
                    match field {
                        Field::Bytes(1, b) => label = text(b)?,
                        Field::Bytes(2, b) => value = text(b)?,
                        _ => {}
                    }
                }
                if LABELS.contains(&label) {
                    labels.push((label.to_string(), value.to_string()));
                }
            }
            2 | 3 | 5 => {
                let slot = &mut values[usize::from(tag != 2) + usize::from(tag == 5)];
                while let Some(field) = next_field(&mut bytes)? {
                    if let Field::Fixed64(1, bits) = field {
                        *slot = Some(f64::from_bits(bits));
                    }
                }
            }
            _ => {}
        }
    }
    if count > MAX_LABELS_PER_SERIES {
        out.over_labels += 1;
        return Ok(None);
    }
    Ok(values.into_iter().flatten().next().map(|v| (labels, v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn family(name: &str, value: f64) -> proto::MetricFamily {
        proto::MetricFamily {
            name: Some(name.into()),
            r#type: Some(proto::MetricType::Gauge as i32),
            metric: vec![proto::Metric {
                label: vec![proto::LabelPair {
                    name: Some("UUID".into()),
                    value: Some("GPU-0".into()),
                }],
                gauge: Some(proto::Gauge { value: Some(value) }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// Skipping by name keeps exactly the wanted families, and a family whose name is not
    /// its first field is still read whole.
    #[test]
    fn unwanted_families_are_skipped_and_wanted_ones_read() {
        let mut body = Vec::new();
        for (name, v) in [
            ("DCGM_FI_DEV_SM_CLOCK", 1.0),
            ("DCGM_FI_DEV_GPU_UTIL", 2.0),
            ("DCGM_FI_DEV_GPU_TEMP", 3.0),
            ("DCGM_FI_DEV_FB_USED", 4.0),
        ] {
            family(name, v).encode_length_delimited(&mut body).unwrap();
        }
        // The help field first, then the name: not the usual order.
        let mut reordered = Vec::new();
        let mut fields = Vec::new();
        proto::MetricFamily {
            help: Some("h".into()),
            ..Default::default()
        }
        .encode(&mut fields)
        .unwrap();
        let mut rest = Vec::new();
        family("DCGM_FI_DEV_POWER_USAGE", 5.0)
            .encode(&mut rest)
            .unwrap();
        fields.extend_from_slice(&rest);
        prost::encoding::encode_varint(fields.len() as u64, &mut reordered);
        reordered.extend_from_slice(&fields);
        body.extend_from_slice(&reordered);
        let series = decode(exposition_type(), &body, usize::MAX).unwrap().series;
        let got: Vec<(&str, f64)> = series.iter().map(|s| (s.name.as_str(), s.value)).collect();
        assert_eq!(
            got,
            [
                ("DCGM_FI_DEV_GPU_UTIL", 2.0),
                ("DCGM_FI_DEV_FB_USED", 4.0),
                ("DCGM_FI_DEV_POWER_USAGE", 5.0)
            ]
        );
        assert!(decode(exposition_type(), &body[..body.len() - 1], usize::MAX).is_err());
    }

    /// A family's metrics are counted one by one against the series limit, and the
    /// unwanted families' series do not count.
    #[test]
    fn series_past_the_limit_refuse_the_answer() {
        let mut wanted = family("DCGM_FI_DEV_GPU_UTIL", 1.0);
        wanted.metric = (0..10).map(|_| wanted.metric[0].clone()).collect();
        let mut body = Vec::new();
        family("DCGM_FI_DEV_SM_CLOCK", 1.0)
            .encode_length_delimited(&mut body)
            .unwrap();
        wanted.encode_length_delimited(&mut body).unwrap();
        assert_eq!(
            decode(exposition_type(), &body, 10).unwrap().series.len(),
            10
        );
        let Err(e) = decode(exposition_type(), &body, 9) else {
            panic!("10 series over a limit of 9 must be refused");
        };
        assert!(
            matches!(
                e,
                Error::OverLimit {
                    reason: Rejection::SeriesLimit,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// A family encoded with its fields in the order given (field bytes as prost
    /// writes each), length-delimited.
    fn reordered(fields: &[Vec<u8>]) -> Vec<u8> {
        let fields = fields.concat();
        let mut body = Vec::new();
        prost::encoding::encode_varint(fields.len() as u64, &mut body);
        body.extend_from_slice(&fields);
        body
    }

    fn field_bytes(family: proto::MetricFamily) -> Vec<u8> {
        family.encode_to_vec()
    }

    /// Issue 27: with its help (and metrics) before its name, a family was decoded
    /// whole before any limit applied. Now the order makes no difference: an unwanted
    /// family's metrics and any help, however long, are skipped where they lie, and a
    /// wanted family's metrics still count against the series limit one by one.
    #[test]
    fn field_order_makes_no_difference_to_what_is_kept_or_refused() {
        let help = proto::MetricFamily {
            help: Some("h".repeat(4 << 20)),
            ..Default::default()
        };
        let mut many = family("DCGM_FI_DEV_SM_CLOCK", 1.0);
        many.metric = (0..1000).map(|_| many.metric[0].clone()).collect();
        let metrics_only = |f: &proto::MetricFamily| proto::MetricFamily {
            metric: f.metric.clone(),
            ..Default::default()
        };
        let name_only = |n: &str| proto::MetricFamily {
            name: Some(n.into()),
            ..Default::default()
        };
        // Unwanted: metrics, then help, then the name; skipped whole.
        let mut body = reordered(&[
            field_bytes(metrics_only(&many)),
            field_bytes(help.clone()),
            field_bytes(name_only("DCGM_FI_DEV_SM_CLOCK")),
        ]);
        // Wanted: help, metrics, then the name.
        let mut wanted = family("DCGM_FI_DEV_GPU_UTIL", 7.0);
        wanted.metric = (0..10).map(|_| wanted.metric[0].clone()).collect();
        body.extend(reordered(&[
            field_bytes(help),
            field_bytes(metrics_only(&wanted)),
            field_bytes(name_only("DCGM_FI_DEV_GPU_UTIL")),
        ]));
        // A help that is not even text, before an unwanted family's name and a wanted
        // one's: skipped, never decoded (decoding the families whole failed here).
        let not_text = vec![0x12, 2, 0xff, 0xfe];
        body.extend(reordered(&[
            not_text.clone(),
            field_bytes(name_only("DCGM_FI_DEV_SM_CLOCK")),
        ]));
        body.extend(reordered(&[
            not_text,
            field_bytes(name_only("DCGM_FI_DEV_FB_FREE")),
        ]));
        let decoded = decode(exposition_type(), &body, 10).unwrap();
        assert_eq!(decoded.series.len(), 10);
        assert!(decoded.series.iter().all(|s| s.value == 7.0));
        let Err(e) = decode(exposition_type(), &body, 9) else {
            panic!("10 series over a limit of 9 must be refused, name last or not");
        };
        assert!(
            matches!(
                e,
                Error::OverLimit {
                    reason: Rejection::SeriesLimit,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// A metric with more labels than the bound is refused and counted, the others of
    /// the answer kept; only the labels the derivation reads are copied out.
    #[test]
    fn a_series_over_the_label_bound_is_refused_and_counted() {
        let label = |name: String| proto::LabelPair {
            name: Some(name),
            value: Some("v".into()),
        };
        let mut f = family("DCGM_FI_DEV_GPU_UTIL", 1.0);
        let mut wide = f.metric[0].clone();
        wide.label
            .extend((0..MAX_LABELS_PER_SERIES).map(|i| label(format!("l{i}"))));
        let mut widest_kept = f.metric[0].clone();
        widest_kept
            .label
            .extend((1..MAX_LABELS_PER_SERIES).map(|i| label(format!("l{i}"))));
        f.metric = vec![wide, widest_kept, f.metric[0].clone()];
        let body = f.encode_length_delimited_to_vec();
        let decoded = decode(exposition_type(), &body, 100).unwrap();
        assert_eq!(decoded.over_labels, 1);
        assert_eq!(decoded.series.len(), 2);
        for s in &decoded.series {
            assert_eq!(s.labels, [("UUID".to_string(), "GPU-0".to_string())]);
        }
    }

    /// Counters and untyped metrics carry values as gauges do; a gauge wins.
    #[test]
    fn gauge_counter_and_untyped_values_are_read() {
        let mut f = family("DCGM_FI_DEV_GPU_UTIL", 1.0);
        let base = f.metric[0].clone();
        f.metric = vec![
            proto::Metric {
                gauge: None,
                counter: Some(proto::Counter {
                    value: Some(2.0),
                    ..Default::default()
                }),
                ..base.clone()
            },
            proto::Metric {
                gauge: None,
                untyped: Some(proto::Untyped { value: Some(3.0) }),
                ..base.clone()
            },
            proto::Metric {
                untyped: Some(proto::Untyped { value: Some(4.0) }),
                ..base.clone()
            },
            proto::Metric {
                gauge: None,
                ..base
            },
        ];
        let body = f.encode_length_delimited_to_vec();
        let got: Vec<f64> = decode(exposition_type(), &body, 100)
            .unwrap()
            .series
            .iter()
            .map(|s| s.value)
            .collect();
        assert_eq!(got, [2.0, 3.0, 1.0]);
    }

    fn exposition_type() -> &'static str {
        "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
    }
}
