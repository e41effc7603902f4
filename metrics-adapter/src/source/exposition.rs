//! Decoding exporter scrapes: the Prometheus protobuf exposition (length-delimited
//! `io.prometheus.client.MetricFamily` messages), which the gpu-exporter serves when
//! asked. Binary and length-prefixed, it needs no text parsing and no escaping rules,
//! and prost decodes it with generated code.

use super::derive::{FAMILIES, Series};
use crate::error::Error;
use prost::Message;

/// The `io.prometheus.client` types.
pub use kube_support::proto::prometheus as proto;

/// What the adapter asks the exporters for.
pub const ACCEPT: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";

/// The series of the wanted families in a scrape body.
pub fn decode(content_type: &str, body: &[u8]) -> Result<Vec<Series>, Error> {
    if !content_type.starts_with("application/vnd.google.protobuf") {
        return Err(Error::Decode(format!(
            "the exporter answered {content_type:?}, not the protobuf exposition (is it a gpu-exporter?)"
        )));
    }
    let malformed =
        |e: prost::DecodeError| Error::Decode(format!("malformed protobuf exposition: {e}"));
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
        if leading_name(message).is_some_and(|name| !FAMILIES.contains(&name)) {
            continue;
        }
        let family = proto::MetricFamily::decode(message).map_err(malformed)?;
        let name = family.name.unwrap_or_default();
        if !FAMILIES.contains(&name.as_str()) {
            continue;
        }
        for m in family.metric {
            let value = m
                .gauge
                .and_then(|g| g.value)
                .or_else(|| m.counter.and_then(|c| c.value))
                .or_else(|| m.untyped.and_then(|u| u.value));
            let Some(value) = value else { continue };
            out.push(Series {
                name: name.clone(),
                labels: m
                    .label
                    .into_iter()
                    .map(|l| (l.name.unwrap_or_default(), l.value.unwrap_or_default()))
                    .collect(),
                value,
            });
        }
    }
    Ok(out)
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
        let series = decode(exposition_type(), &body).unwrap();
        let got: Vec<(&str, f64)> = series.iter().map(|s| (s.name.as_str(), s.value)).collect();
        assert_eq!(
            got,
            [
                ("DCGM_FI_DEV_GPU_UTIL", 2.0),
                ("DCGM_FI_DEV_FB_USED", 4.0),
                ("DCGM_FI_DEV_POWER_USAGE", 5.0)
            ]
        );
        assert!(decode(exposition_type(), &body[..body.len() - 1]).is_err());
    }

    fn exposition_type() -> &'static str {
        "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
    }
}
