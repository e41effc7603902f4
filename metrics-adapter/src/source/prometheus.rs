//! The Prometheus-compatible source (`--prometheus-url`): for clusters that already run
//! Prometheus, Thanos or Mimir, the adapter asks it instead of scraping every exporter.
//!
//! Each interval it runs one instant query per family it derives from, plus one for the
//! samples' own timestamps (an instant query reports its evaluation time, not when a
//! sample was scraped, so freshness needs `timestamp()`), and feeds the same per-pod
//! derivation as the direct source. Series older than `--max-staleness` are dropped.
//!
//! Labels: scraped with `honorLabels: true`, series carry the exporter's `pod` and
//! `namespace`. With `honorLabels: false` Prometheus renames them `exported_pod` and
//! `exported_namespace` (its own `pod`/`namespace` then name the exporter pod); those
//! are taken when present.

use super::derive::{FAMILIES, LABELS, Series, pod_values};
use super::limits::{Limits, MAX_LABELS_PER_SERIES, PROMETHEUS_QUERIES, Rejection};
use crate::error::Error;
use crate::fleet::{Fleet, Observed};
use arc_swap::ArcSwap;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A Prometheus-compatible query API and how to be let in: the one query client of
/// the adapter, for the Prometheus source and the `promql:` signals alike.
#[derive(Debug, Clone, Default)]
pub struct Endpoint {
    /// Base URL, e.g. `http://prometheus.monitoring:9090` (the `/api/v1/query` path is
    /// appended; a Mimir or Thanos prefix such as `/prometheus` is kept).
    pub url: String,
    /// Extra headers, e.g. `X-Scope-OrgID: tenant-a`.
    pub headers: Vec<(String, String)>,
    /// A file holding a bearer token, read at every round (rotated tokens work).
    pub bearer_token_file: Option<PathBuf>,
    /// PEM CA bundle for https; default: the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl Endpoint {
    /// The query client (http, or https trusting the CA file); fails on an unreadable
    /// CA file, so startup can say so.
    pub fn client(&self) -> Result<super::http_client::Client, Error> {
        let tls = super::http_client::TlsOptions {
            ca_file: self.ca_file.clone(),
            server_name: None,
        };
        super::http_client::client(&tls, None)
    }

    /// The bearer token, read now (a rotated token applies at the next query).
    fn token(&self) -> Result<Option<String>, Error> {
        let Some(p) = &self.bearer_token_file else {
            return Ok(None);
        };
        let token =
            kube_support::config_file::read_to_string(p, kube_support::config_file::SECRET_LIMIT)
                .map_err(|e| Error::Config(format!("{}: {e}", p.display())))?;
        Ok(Some(token.trim().to_string()))
    }

    /// One instant query, its answer read within `limits` and `timeout`.
    async fn instant(
        &self,
        client: &super::http_client::Client,
        token: Option<&str>,
        query: &str,
        limits: &Limits,
        timeout: Duration,
    ) -> Result<super::http_client::Answer, Error> {
        let url = format!(
            "{}/api/v1/query?query={}",
            self.url.trim_end_matches('/'),
            encode_query(query)
        );
        let mut req = axum::http::Request::get(&url);
        for (k, v) in &self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        if let Some(t) = token {
            req = req.header(axum::http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        super::http_client::get(client, req, limits, timeout).await
    }

    /// The value of `query` now: its vector's samples summed, or its scalar (the
    /// `promql:` signals). The answer is read within `limits` and decoded as it is
    /// read back, sample by sample, like the source's, never into a whole document.
    pub async fn value(
        &self,
        client: &super::http_client::Client,
        query: &str,
        limits: &Limits,
        timeout: Duration,
    ) -> Result<f64, Error> {
        let token = self.token()?;
        let answer = self
            .instant(client, token.as_deref(), query, limits, timeout)
            .await?;
        query_value(answer.status, &answer.body)
    }
}

/// How the Prometheus source queries.
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    pub endpoint: Endpoint,
    pub interval: Duration,
    pub timeout: Duration,
    pub staleness: Duration,
    /// Where query rounds and their durations are counted.
    pub metrics: super::SourceMetrics,
    /// What bounds the answers' memory; the series limit counts every series a round
    /// keeps (`--prometheus-max-series`), the pod budget the pods it derives.
    pub limits: Limits,
    pub max_series: usize,
}

/// One sample of an instant vector.
#[derive(Debug, Deserialize)]
struct VectorSample {
    metric: Metric,
    /// `[evaluation time, "value"]`.
    value: (f64, String),
}

/// The labels a round keeps of a sample: the ones the derivation reads, as the
/// exporter or Prometheus named them ([`KEPT`]); an identity over all of them but the
/// name; and how many there were. Decoded without holding the others, so a sample
/// of 140,000 labels costs what one of four does.
#[derive(Debug, Default)]
struct Metric {
    identity: u64,
    labels: Vec<(String, String)>,
    count: usize,
}

/// What a round keeps of a sample's labels: [`LABELS`], and the two Prometheus renames
/// with `honorLabels: false`.
const KEPT: [&str; 6] = [
    LABELS[0],
    LABELS[1],
    LABELS[2],
    LABELS[3],
    "exported_namespace",
    "exported_pod",
];

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
        use std::hash::{Hash, Hasher};
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
            // Summed per label, so the identity does not depend on the labels' order.
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (&*name.0, &*value.0).hash(&mut hasher);
            metric.identity = metric.identity.wrapping_add(hasher.finish());
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
struct Budget {
    remaining: AtomicUsize,
    limit: usize,
    over_labels: AtomicU64,
}

impl Budget {
    fn new(limit: usize) -> Budget {
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
fn decode_answer(
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

/// Percent-encode a PromQL query for a URL query string.
fn encode_query(q: &str) -> String {
    let mut out = String::with_capacity(q.len() * 3);
    for b in q.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// One instant query, each sample handed to `take` as it is decoded. At most
/// [`PROMETHEUS_QUERIES`] run at once (`slots`); the answer's bytes stay in the
/// in-flight budget until decoded.
async fn instant_query(
    client: &super::http_client::Client,
    opts: &PrometheusOptions,
    token: Option<&str>,
    query: &str,
    slots: &tokio::sync::Semaphore,
    budget: &Budget,
    take: impl FnMut(VectorSample),
) -> Result<(), Error> {
    let _slot = slots
        .acquire()
        .await
        .map_err(|_| Error::Scrape("shutting down".into()))?;
    let answer = opts
        .endpoint
        .instant(client, token, query, &opts.limits, opts.timeout)
        .await?;
    decode_answer(answer.status, &answer.body, budget, take)
}

/// The workload labels of a series as the exporter wrote them: with
/// `honorLabels: false` Prometheus's own `pod` and `namespace` give way to the
/// exporter's, renamed `exported_pod` and `exported_namespace`.
fn exporter_labels(mut labels: Vec<(String, String)>) -> Vec<(String, String)> {
    let exported: Vec<String> = labels
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("exported_").map(str::to_string))
        .collect();
    labels.retain(|(k, _)| !exported.contains(k));
    for (k, _) in &mut labels {
        if let Some(base) = k.strip_prefix("exported_") {
            *k = base.to_string();
        }
    }
    labels
}

/// A sample as a round keeps it: its identity, the exporter's labels, its value text.
type Kept = (u64, Vec<(String, String)>, String);

/// One round: every family and its samples' timestamps, then per-pod values.
async fn round(
    client: &super::http_client::Client,
    opts: &PrometheusOptions,
) -> Result<Fleet, Error> {
    let token = opts.endpoint.token()?;
    // Per family: its samples, and their scrape times (`timestamp()` drops the name,
    // so it is asked per family: over several families it would collide). Each sample
    // is reduced as it is decoded: timestamps to a hash and a time, values to a series.
    let token = token.as_deref();
    let slots = tokio::sync::Semaphore::new(PROMETHEUS_QUERIES);
    let budget = Budget::new(opts.max_series);
    let (slots, budget) = (&slots, &budget);
    let answers = futures_util::future::join_all(FAMILIES.iter().map(|f| async move {
        let stamps_query = format!("timestamp({f})");
        let mut values: Vec<Kept> = Vec::new();
        let mut stamps: HashMap<u64, f64> = HashMap::new();
        let (got_values, got_stamps) = tokio::join!(
            instant_query(client, opts, token, f, slots, budget, |s| {
                values.push(FamilyAnswer::kept(s))
            }),
            instant_query(client, opts, token, &stamps_query, slots, budget, |s| {
                FamilyAnswer::stamped(&mut stamps, s)
            })
        );
        got_values
            .and(got_stamps)
            .map(|()| (*f, FamilyAnswer { values, stamps }))
    }))
    .await;
    opts.metrics
        .series_over_labels(budget.over_labels.load(Ordering::Relaxed));
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    assemble(answers, now_unix, opts.staleness, opts.limits.max_pods)
}

/// One family's answers as a round keeps them: its samples, and their scrape times by
/// identity.
#[derive(Default)]
pub(crate) struct FamilyAnswer {
    values: Vec<Kept>,
    stamps: HashMap<u64, f64>,
}

impl FamilyAnswer {
    /// A sample of the family's query as kept.
    fn kept(s: VectorSample) -> Kept {
        (
            s.metric.identity,
            exporter_labels(s.metric.labels),
            s.value.1,
        )
    }

    /// A sample of the family's `timestamp()` query into `stamps`.
    fn stamped(stamps: &mut HashMap<u64, f64>, s: VectorSample) {
        // A time that is no number (`NaN`, `+Inf`) names no scrape; the sample is
        // left out rather than dated.
        if let Some(at) = s.value.1.parse::<f64>().ok().filter(|t| t.is_finite()) {
            stamps.insert(s.metric.identity, at);
        }
    }

    /// The family's answers decoded from the two bodies, within a series budget (for
    /// the fuzz target: the same decoding as a round's).
    pub(crate) fn decode(values: &[u8], stamps: &[u8], max_series: usize) -> Result<Self, Error> {
        let budget = Budget::new(max_series);
        let mut family = FamilyAnswer::default();
        let ok = axum::http::StatusCode::OK;
        decode_answer(ok, values, &budget, |s| family.values.push(Self::kept(s)))?;
        decode_answer(ok, stamps, &budget, |s| {
            Self::stamped(&mut family.stamps, s)
        })?;
        Ok(family)
    }
}

/// One round's answers, as of `now_unix`, into the fleet; more than `max_pods` pods is
/// the pod budget's refusal.
pub(crate) fn assemble(
    answers: Vec<Result<(&'static str, FamilyAnswer), Error>>,
    now_unix: f64,
    staleness: Duration,
    max_pods: usize,
) -> Result<Fleet, Error> {
    let mut series = Vec::new();
    // Per pod: the oldest sample time among its series.
    let mut oldest: HashMap<(String, String), f64> = HashMap::new();
    for answer in answers {
        let (family, FamilyAnswer { values, stamps }) = answer?;
        for (id, labels, value) in values {
            // A scrape time in the future (clock skew, or a garbage answer such as
            // `1e300`) counts as now: no sample is fresher than the answer, and such
            // times do not fit a SystemTime (they panicked the source; found by fuzzing).
            let Some(at) = stamps.get(&id).map(|at| at.min(now_unix)) else {
                continue;
            };
            if now_unix - at > staleness.as_secs_f64() {
                continue;
            }
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            if let (Some(ns), Some(pod)) = (get("namespace"), get("pod")) {
                let slot = oldest.entry((ns, pod)).or_insert(at);
                *slot = slot.min(at);
            }
            series.push(Series {
                name: family.to_string(),
                labels,
                value,
            });
        }
    }
    let values = pod_values(&series);
    drop(series);
    if values.len() > max_pods {
        return Err(Error::OverLimit {
            reason: Rejection::PodBudget,
            message: format!(
                "the answers name {} pods, more than the {} allowed (--max-pods)",
                values.len(),
                max_pods
            ),
        });
    }
    let now = Instant::now();
    let pods = values
        .into_iter()
        .map(|(pod, values)| {
            let at = oldest.get(&pod).copied().unwrap_or(now_unix);
            let age = Duration::from_secs_f64((now_unix - at).max(0.0));
            let observed = Observed {
                values,
                at: UNIX_EPOCH + Duration::from_secs_f64(at.max(0.0)),
                seen: now.checked_sub(age).unwrap_or(now),
            };
            (pod, observed)
        })
        .collect();
    Ok(Fleet {
        pods,
        targets: 1,
        answered: 1,
        last_answer: Some(now),
    })
}

/// The query client for `opts` (see [`Endpoint::client`]).
pub fn client(opts: &PrometheusOptions) -> Result<super::http_client::Client, Error> {
    opts.endpoint.client()
}

/// Query forever with `client` (from [`client`]), publishing into `store` after every
/// successful round. A failed round keeps the previous view, whose values then age out.
pub async fn run(
    opts: PrometheusOptions,
    client: super::http_client::Client,
    store: Arc<ArcSwap<Fleet>>,
) {
    let mut failing = false;
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let round_started = Instant::now();
        let result = round(&client, &opts).await;
        opts.metrics.round_took(round_started.elapsed());
        opts.metrics.scraped(result.is_ok());
        if let Err(Error::OverLimit { reason, .. }) = &result {
            opts.metrics.rejected(*reason);
        }
        match result {
            Ok(fleet) => {
                if failing {
                    tracing::info!(url = %opts.endpoint.url, "Prometheus answers again");
                    failing = false;
                }
                store.store(Arc::new(fleet));
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(url = %opts.endpoint.url, error = %e, "Prometheus query failed; values age out after the staleness limit");
                    failing = true;
                }
                let last = store.load_full();
                store.store(Arc::new(Fleet {
                    answered: 0,
                    ..Fleet::clone(&last)
                }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_labels_win_over_prometheus_target_labels() {
        let m: Vec<(String, String)> = [
            ("pod", "gpu-exporter-x7k2p"),
            ("namespace", "gpu-monitoring"),
            ("exported_pod", "resnet-0"),
            ("exported_namespace", "inference"),
            ("UUID", "GPU-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut l = exporter_labels(m);
        l.sort();
        assert_eq!(
            l,
            vec![
                ("UUID".to_string(), "GPU-1".to_string()),
                ("namespace".to_string(), "inference".to_string()),
                ("pod".to_string(), "resnet-0".to_string()),
            ]
        );
    }

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
    /// does not read are never held, and the identity joining a family's samples with
    /// their times does not depend on the labels' order.
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
        let identity = |json: &str| serde_json::from_str::<Metric>(json).unwrap().identity;
        assert_eq!(
            identity(r#"{"a":"1","b":"2","__name__":"x"}"#),
            identity(r#"{"b":"2","a":"1"}"#)
        );
        assert_ne!(
            identity(r#"{"a":"1","b":"2"}"#),
            identity(r#"{"a":"2","b":"1"}"#)
        );
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

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode_query("timestamp({__name__=~\"A|B\"})"),
            "timestamp%28%7B__name__%3D~%22A%7CB%22%7D%29"
        );
    }

    /// Found by the `prometheus_json` fuzz target: a `timestamp()` answer of `+Inf` or
    /// `1e300` panicked the round (`Duration::from_secs_f64`), which ended the source.
    #[test]
    fn scrape_times_past_now_or_not_finite_do_not_panic_and_count_as_now() {
        let answer = |value: &str| {
            format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-1","namespace":"ml","pod":"train-0"}},"value":[1795620455.754,"{value}"]}}]}}}}"#
            )
        };
        let now_unix = 1_795_620_500.0;
        let values = answer("80");
        for stamp in ["+Inf", "1e300", "2e19", "1795620600", "NaN"] {
            let stamps = answer(stamp);
            let family = FamilyAnswer::decode(values.as_bytes(), stamps.as_bytes(), 10).unwrap();
            let round = vec![Ok(("DCGM_FI_DEV_GPU_UTIL", family))];
            let fleet = assemble(round, now_unix, Duration::from_secs(60), 10).unwrap();
            let pod = ("ml".to_string(), "train-0".to_string());
            match fleet.pods.get(&pod) {
                // A time that is not a finite number joins nothing: the sample is
                // left out.
                None => assert!(["+Inf", "NaN"].contains(&stamp), "{stamp}"),
                Some(observed) => {
                    let at = observed.at.duration_since(UNIX_EPOCH).unwrap();
                    assert_eq!(at.as_secs_f64(), now_unix, "{stamp}");
                }
            }
        }
    }
}
