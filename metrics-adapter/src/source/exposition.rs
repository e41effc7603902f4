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
    let mut buf = body;
    let mut out = Vec::new();
    while !buf.is_empty() {
        let family = proto::MetricFamily::decode_length_delimited(&mut buf)
            .map_err(|e| Error::Decode(format!("malformed protobuf exposition: {e}")))?;
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
