//! An instant query's answer (`/api/v1/query`), decoded as it is read: sample by
//! sample, each handed to the caller and never the whole document, the labels it does
//! not need skipped, within a round's series budget.

use super::super::limits::{MAX_LABELS_PER_SERIES, Rejection};
use crate::error::Error;
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One sample of an instant vector.
#[derive(Debug, Deserialize)]
pub(super) struct VectorSample {
    pub(super) metric: Metric,
    /// `[evaluation time, "value"]`.
    pub(super) value: (f64, String),
}

/// The labels a round keeps of a sample: the ones that name its pod, as the exporter
/// or Prometheus named them ([`KEPT`]), and how many there were. Decoded without
/// holding the others, so a sample of 140,000 labels costs what one of four does.
#[derive(Debug, Default)]
pub(super) struct Metric {
    pub(super) labels: Vec<(String, String)>,
    pub(super) count: usize,
}

/// What a round keeps of a sample's labels: the pod's, and their Prometheus renames
/// with `honorLabels: false`.
pub(super) const KEPT: [&str; 4] = ["namespace", "pod", "exported_namespace", "exported_pod"];

impl<'de> Deserialize<'de> for Metric {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Metric, D::Error> {
        d.deserialize_map(MetricVisitor)
    }
}

struct MetricVisitor;

impl<'de> serde::de::Visitor<'de> for MetricVisitor {
    type Value = Metric;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a sample's labels")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Metric, A::Error> {
        let mut metric = Metric::default();
        while let Some(name) = map.next_key::<Text<'de>>()? {
            let value = map.next_value::<Text<'de>>()?;
            if name.0 == "__name__" {
                continue;
            }
            metric.count += 1;
            if metric.count > MAX_LABELS_PER_SERIES {
                continue;
            }
            if KEPT.contains(&&*name.0) {
                metric
                    .labels
                    .push((name.0.into_owned(), value.0.into_owned()));
            }
        }
        Ok(metric)
    }
}

/// A JSON string, borrowed from the answer unless it has escapes.
struct Text<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Text<'de>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(v.to_string().into()))
            }
        }
        d.deserialize_str(V)
    }
}

/// An element of an answer's `result`: a vector's sample, or a part of a scalar's
/// `[time, "value"]`.
enum Item {
    Sample(VectorSample),
    Time,
    Text(String),
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Item, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Item;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sample, or a scalar's time or value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
                let de = serde::de::value::MapAccessDeserializer::new(map);
                VectorSample::deserialize(de).map(Item::Sample)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Item, E> {
                Ok(Item::Time)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Item, E> {
                Ok(Item::Time)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Item, E> {
                Ok(Item::Time)
            }
            fn visit_str<E>(self, v: &str) -> Result<Item, E> {
                Ok(Item::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// What an answer's samples are reduced to as they are decoded, one at a time, so
/// a round never holds a whole decoded answer: at most `remaining` samples are taken
/// (shared by a round's queries), the next is an error. A sample with more than
/// [`MAX_LABELS_PER_SERIES`] labels is not taken but counted in `over_labels`.
struct Samples<'a, F> {
    budget: &'a Budget,
    take: F,
}

/// A round's series budget, shared by its queries: `remaining` of `limit` samples may
/// still be taken; samples over the label bound are counted in `over_labels`.
pub(super) struct Budget {
    remaining: AtomicUsize,
    limit: usize,
    pub(super) over_labels: AtomicU64,
}

impl Budget {
    pub(super) fn new(limit: usize) -> Budget {
        Budget {
            remaining: AtomicUsize::new(limit),
            limit,
            over_labels: AtomicU64::new(0),
        }
    }
}

impl<'de, F: FnMut(VectorSample)> serde::de::DeserializeSeed<'de> for Samples<'_, F> {
    /// A scalar's value, when the result is one.
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(VectorSample)> serde::de::Visitor<'de> for Samples<'_, F> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of vector samples")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        mut self,
        mut seq: A,
    ) -> Result<Option<String>, A::Error> {
        let mut scalar = None;
        while let Some(item) = seq.next_element::<Item>()? {
            let sample = match item {
                Item::Sample(sample) => sample,
                Item::Time => continue,
                Item::Text(value) => {
                    scalar = Some(value);
                    continue;
                }
            };
            if sample.metric.count > MAX_LABELS_PER_SERIES {
                self.budget.over_labels.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let taken =
                self.budget
                    .remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if taken.is_err() {
                return Err(serde::de::Error::custom(SeriesLimit(self.budget.limit)));
            }
            (self.take)(sample);
        }
        Ok(scalar)
    }
}

/// The message of a decoding error that is the series limit.
struct SeriesLimit(usize);

impl std::fmt::Display for SeriesLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "more than {} series in one round (--prometheus-max-series)",
            self.0
        )
    }
}

/// `{"status", "data": {"resultType", "result": [...]}, "error"}`, the samples
/// handed to `take` as they are read.
struct Response<'a, F> {
    samples: Samples<'a, F>,
}

/// What the top level said besides the samples.
#[derive(Default)]
struct Outcome {
    status: Option<String>,
    error: Option<String>,
    result_type: Option<String>,
    has_result: bool,
    /// A scalar result's value.
    scalar: Option<String>,
}

impl<'de, F: FnMut(VectorSample)> serde::de::DeserializeSeed<'de> for Response<'_, F> {
    type Value = Outcome;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Outcome, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(VectorSample)> serde::de::Visitor<'de> for Response<'_, F> {
    type Value = Outcome;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Prometheus API answer")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Outcome, A::Error> {
        let mut outcome = Outcome::default();
        let mut samples = Some(self.samples);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "status" => outcome.status = Some(map.next_value()?),
                "error" => outcome.error = map.next_value()?,
                "data" => match samples.take() {
                    Some(samples) => {
                        let data = map.next_value_seed(Data { samples })?;
                        outcome.result_type = data.result_type;
                        outcome.has_result = data.has_result;
                        outcome.scalar = data.scalar;
                    }
                    None => return Err(serde::de::Error::duplicate_field("data")),
                },
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(outcome)
    }
}

struct Data<'a, F> {
    samples: Samples<'a, F>,
}

impl<'de, F: FnMut(VectorSample)> serde::de::DeserializeSeed<'de> for Data<'_, F> {
    type Value = Outcome;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Outcome, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(VectorSample)> serde::de::Visitor<'de> for Data<'_, F> {
    type Value = Outcome;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("the data of a Prometheus API answer")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Outcome, A::Error> {
        let mut outcome = Outcome::default();
        let mut samples = Some(self.samples);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "resultType" => outcome.result_type = Some(map.next_value()?),
                "result" => match samples.take() {
                    Some(samples) => {
                        outcome.scalar = map.next_value_seed(samples)?;
                        outcome.has_result = true;
                    }
                    None => return Err(serde::de::Error::duplicate_field("result")),
                },
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(outcome)
    }
}

/// Decode one vector answer, handing each sample to `take`, within the round's
/// `budget`.
pub(super) fn decode_answer(
    status: axum::http::StatusCode,
    body: &[u8],
    budget: &Budget,
    take: impl FnMut(VectorSample),
) -> Result<(), Error> {
    let outcome = decode_outcome(status, body, budget, take)?;
    match outcome.result_type.as_deref() {
        Some("vector") if outcome.has_result => Ok(()),
        Some("vector") | None => Err(Error::Decode("no data in the answer".into())),
        Some(other) => Err(Error::Decode(format!("expected a vector, got {other}"))),
    }
}

/// The value of an instant query's answer: a vector's samples summed, or a scalar.
/// Decoded as [`decode_answer`] does, sample by sample, their labels skipped.
pub(crate) fn query_value(status: axum::http::StatusCode, body: &[u8]) -> Result<f64, Error> {
    let number = |s: &str| s.parse::<f64>().ok().filter(|x| x.is_finite());
    let budget = Budget::new(usize::MAX);
    let (mut sum, mut samples, mut not_numbers) = (0.0, 0usize, 0usize);
    let outcome = decode_outcome(status, body, &budget, |s| {
        samples += 1;
        match number(&s.value.1) {
            Some(v) => sum += v,
            None => not_numbers += 1,
        }
    })?;
    match outcome.result_type.as_deref() {
        Some("scalar") => outcome
            .scalar
            .as_deref()
            .and_then(number)
            .ok_or_else(|| Error::Decode("the scalar is not a number".into())),
        Some("vector") => {
            if budget.over_labels.into_inner() > 0 {
                return Err(Error::Decode(format!(
                    "a sample has more than {MAX_LABELS_PER_SERIES} labels"
                )));
            }
            if samples == 0 {
                return Err(Error::Decode(
                    "the query answered no series (use `or vector(0)` if none means zero)".into(),
                ));
            }
            if not_numbers > 0 {
                return Err(Error::Decode("a sample is not a number".into()));
            }
            // Finite samples can still sum past the largest f64 (1e308 + 1e308).
            Some(sum)
                .filter(|s: &f64| s.is_finite())
                .ok_or_else(|| Error::Decode("the samples' sum is not a finite number".into()))
        }
        other => Err(Error::Decode(format!(
            "expected a vector or a scalar, got {other:?}"
        ))),
    }
}

/// Decode one answer's top level, handing each vector sample to `take`.
fn decode_outcome(
    status: axum::http::StatusCode,
    body: &[u8],
    budget: &Budget,
    take: impl FnMut(VectorSample),
) -> Result<Outcome, Error> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_slice(body);
    let seed = Response {
        samples: Samples { budget, take },
    };
    let limit = budget.limit;
    let parsed = seed.deserialize(&mut de).and_then(|o| de.end().map(|()| o));
    let outcome = match parsed {
        Ok(outcome) => outcome,
        Err(e) if e.to_string().starts_with(&SeriesLimit(limit).to_string()) => {
            return Err(Error::OverLimit {
                reason: Rejection::SeriesLimit,
                message: format!("HTTP {status}: {}", SeriesLimit(limit)),
            });
        }
        Err(e) => {
            return Err(Error::Decode(format!(
                "HTTP {status}: not a Prometheus API answer ({e})"
            )));
        }
    };
    if outcome.status.as_deref() != Some("success") {
        return Err(Error::Scrape(format!(
            "HTTP {status}: {}",
            outcome.error.unwrap_or_else(|| "query failed".into())
        )));
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: &[u8], limit: usize) -> (Result<(), Error>, Vec<String>, usize) {
        let budget = Budget::new(limit);
        let mut pods = Vec::new();
        let ok = axum::http::StatusCode::OK;
        let result = decode_answer(ok, body, &budget, |s| {
            let pod = s.metric.labels.iter().find(|(k, _)| k == "pod");
            pods.push(pod.map(|(_, v)| v.clone()).unwrap_or_default())
        });
        (result, pods, budget.remaining.into_inner())
    }

    /// Issue 27: one sample of 140,000 labels was decoded whole (359 MB). A sample
    /// over the bound is refused and counted, the others kept; the labels the round
    /// does not read are never held.
    #[test]
    fn samples_over_the_label_bound_are_refused_and_counted() {
        let labels = |n: usize| {
            (0..n)
                .map(|i| format!(r#""l{i}":"v""#))
                .collect::<Vec<_>>()
                .join(",")
        };
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"pod":"wide",{}}},"value":[1,"1"]}},{{"metric":{{"__name__":"x","pod":"a",{}}},"value":[1,"2"]}}]}}}}"#,
            labels(MAX_LABELS_PER_SERIES),
            labels(MAX_LABELS_PER_SERIES - 1)
        );
        let budget = Budget::new(10);
        let mut kept = Vec::new();
        let ok = axum::http::StatusCode::OK;
        decode_answer(ok, body.as_bytes(), &budget, |s| kept.push(s.metric)).unwrap();
        assert_eq!(budget.over_labels.into_inner(), 1);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].labels, [("pod".to_string(), "a".to_string())]);
    }

    /// The `promql:` signals' reading: a vector summed, a scalar read, whatever the
    /// order of `result` and `resultType`; nothing, or no number, is no value.
    #[test]
    fn query_values_are_summed_or_read_and_empty_ones_refused() {
        let value = |body: &str| query_value(axum::http::StatusCode::OK, body.as_bytes());
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2.5"]},{"metric":{"a":"b"},"value":[1,"4"]}]}}"#;
        assert_eq!(value(vector).unwrap(), 6.5);
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1,"7"]}}"#;
        assert_eq!(value(scalar).unwrap(), 7.0);
        let late_type = r#"{"data":{"result":[1.5,"8"],"resultType":"scalar"},"status":"success"}"#;
        assert_eq!(value(late_type).unwrap(), 8.0);
        for (body, says) in [
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
                "or vector(0)",
            ),
            (r#"{"status":"error","error":"parse error"}"#, "parse error"),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#,
                "not a number",
            ),
            (
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"NaN"]}}"#,
                "not a number",
            ),
            (
                r#"{"status":"success","data":{"resultType":"string","result":[1,"s"]}}"#,
                "expected a vector or a scalar",
            ),
            (
                r#"{"status":"success","data":"#,
                "not a Prometheus API answer",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1e308"]},{"metric":{},"value":[1,"1e308"]}]}}"#,
                "not a finite number",
            ),
        ] {
            let e = value(body).unwrap_err().to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    fn answer(pods: usize) -> String {
        let samples: Vec<String> = (0..pods)
            .map(|i| format!(r#"{{"metric":{{"pod":"p{i}"}},"value":[1.5,"{i}"]}}"#))
            .collect();
        format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            samples.join(",")
        )
    }

    /// Samples are handed over one by one and counted against the round's budget; one
    /// past it fails the answer as over the limit.
    #[test]
    fn answers_are_decoded_sample_by_sample_within_the_series_budget() {
        let body = answer(5);
        let (result, pods, remaining) = decode(body.as_bytes(), 5);
        result.unwrap();
        assert_eq!(pods, ["p0", "p1", "p2", "p3", "p4"]);
        assert_eq!(remaining, 0);
        let (result, pods, _) = decode(body.as_bytes(), 4);
        let Err(e) = result else {
            panic!("5 series over a budget of 4 must fail")
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
        assert!(e.to_string().contains("more than 4 series"), "{e}");
        assert_eq!(pods.len(), 4, "decoding stops at the budget");
    }

    #[test]
    fn answers_that_are_not_vectors_or_not_json_are_decode_errors() {
        for (body, says) in [
            (&b"\x8f\x00garbage"[..], "not a Prometheus API answer"),
            (
                br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                "expected a vector, got matrix",
            ),
            (br#"{"status":"success"}"#, "no data"),
            (
                br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
                "parse error",
            ),
            (
                br#"{"status":"success","data":{"resultType":"vector","result":[]}} trailing"#,
                "not a Prometheus API answer",
            ),
        ] {
            let (result, _, _) = decode(body, 10);
            let e = result.unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
    }
}
