//! Decoding exporter scrapes: the Prometheus protobuf exposition (length-delimited
//! `io.prometheus.client.MetricFamily` messages), which the gpu-exporter serves when
//! asked. Binary and length-prefixed, it needs no text parsing and no escaping rules,
//! and prost decodes it with generated code.

use super::derive::{FAMILIES, Series};
use super::limits::Rejection;
use crate::error::Error;
use prost::Message;

/// The `io.prometheus.client` types.
pub use kube_support::proto::prometheus as proto;

/// What the adapter asks the exporters for.
pub const ACCEPT: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";

/// The series of the wanted families in a scrape body, at most `max_series` of them.
///
/// Each family's metrics are decoded one by one, straight into series, so a family
/// of 140,000 series costs at most `max_series` series before it is refused, never a
/// whole decoded family next to its bytes.
pub fn decode(content_type: &str, body: &[u8], max_series: usize) -> Result<Vec<Series>, Error> {
    if !content_type.starts_with("application/vnd.google.protobuf") {
        return Err(Error::Decode(format!(
            "the exporter answered {content_type:?}, not the protobuf exposition (is it a gpu-exporter?)"
        )));
    }
    let mut buf = body;
    let mut out = Vec::new();
    while !buf.is_empty() {
        let len = prost::encoding::decode_varint(&mut buf).map_err(malformed)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|len| *len <= buf.len())
            .ok_or_else(|| {
                Error::Decode("malformed protobuf exposition: a message runs past the body".into())
            })?;
        let (message, rest) = buf.split_at(len);
        buf = rest;
        // Most families are not wanted (6 of the default 25): skip them by name,
        // without decoding their series. Following each exporter sample by sample,
        // decoding is most of the adapter's CPU.
        match leading_name(message) {
            Some(name) if !FAMILIES.contains(&name) => {}
            Some(name) => decode_metrics(name, message, max_series, &mut out)?,
            None => {
                // The name is not the first field (no encoder in use does this): the
                // family is decoded whole, still bounded by the body's size.
                let family = proto::MetricFamily::decode(message).map_err(malformed)?;
                let name = family.name.unwrap_or_default();
                if !FAMILIES.contains(&name.as_str()) {
                    continue;
                }
                for m in family.metric {
                    push_series(&name, m, max_series, &mut out)?;
                }
            }
        }
    }
    Ok(out)
}

fn malformed(e: prost::DecodeError) -> Error {
    Error::Decode(format!("malformed protobuf exposition: {e}"))
}

/// Every `metric` field (4) of an encoded `MetricFamily`, one at a time, into `out`.
fn decode_metrics(
    name: &str,
    mut message: &[u8],
    max_series: usize,
    out: &mut Vec<Series>,
) -> Result<(), Error> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    while !message.is_empty() {
        let (tag, wire_type) = decode_key(&mut message).map_err(malformed)?;
        if tag != 4 || wire_type != WireType::LengthDelimited {
            skip_field(wire_type, tag, &mut message, DecodeContext::default())
                .map_err(malformed)?;
            continue;
        }
        let len = usize::try_from(decode_varint(&mut message).map_err(malformed)?)
            .ok()
            .filter(|len| *len <= message.len())
            .ok_or_else(|| {
                Error::Decode("malformed protobuf exposition: a metric runs past its family".into())
            })?;
        let (metric, rest) = message.split_at(len);
        message = rest;
        let metric = proto::Metric::decode(metric).map_err(malformed)?;
        push_series(name, metric, max_series, out)?;
    }
    Ok(())
}

/// One metric as a series, unless it has no value; refused past `max_series`.
fn push_series(
    name: &str,
    m: proto::Metric,
    max_series: usize,
    out: &mut Vec<Series>,
) -> Result<(), Error> {
    let value = m
        .gauge
        .and_then(|g| g.value)
        .or_else(|| m.counter.and_then(|c| c.value))
        .or_else(|| m.untyped.and_then(|u| u.value));
    let Some(value) = value else { return Ok(()) };
    if out.len() >= max_series {
        return Err(Error::OverLimit {
            reason: Rejection::SeriesLimit,
            message: format!(
                "the exporter reports more than {max_series} series of the served families (--max-series-per-target)"
            ),
        });
    }
    out.push(Series {
        name: name.to_string(),
        labels: m
            .label
            .into_iter()
            .map(|l| (l.name.unwrap_or_default(), l.value.unwrap_or_default()))
            .collect(),
        value,
    });
    Ok(())
}

/// The family name of an encoded `MetricFamily` when it is the message's first field,
/// as every encoder writes it (fields in number order; `name` is field 1).
fn leading_name(mut message: &[u8]) -> Option<&str> {
    // Field 1, wire type 2 (length-delimited).
    if prost::encoding::decode_varint(&mut message).ok()? != (1 << 3) | 2 {
        return None;
    }
    let len = usize::try_from(prost::encoding::decode_varint(&mut message).ok()?).ok()?;
    std::str::from_utf8(message.get(..len)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let series = decode(exposition_type(), &body, usize::MAX).unwrap();
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
        assert_eq!(decode(exposition_type(), &body, 10).unwrap().len(), 10);
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

    fn exposition_type() -> &'static str {
        "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
    }
}
