//! Serving-engine signals, scraped from the inference pods' own `/metrics` (vLLM,
//! SGLang, TGI, Triton), beside the GPU metrics.
//!
//! Each target is one pod's engine endpoint (`--serving-target NAMESPACE/POD=URL`).
//! The engine is recognised from its exposition ([`profiles`]); the user's own
//! mappings ([`mapping`], `--serving-metric`) apply to every target. Targets are
//! followed by the same loop as the exporters ([`super::scrape::run_with`]): the same
//! limits, staleness and failure rules, counted in the `serving_source_*` self-metrics,
//! published into a fleet view of their own, which queries read beside the exporters'.
//!
//! Values are checked where they enter ([`admit`]): a sample that is not a finite
//! number, or out of its family's range ([`profiles::in_range`]: no negative queue,
//! count or latency, a KV-cache usage within 0 to 1), is refused with every sample of
//! its family in that answer, so the signal it feeds has no value from that answer
//! rather than a partial or wrong one; an exact duplicate (same name and labels) is
//! taken once. Each refusal is counted per target and reason
//! (`serving_source_samples_refused_total`). The signals computed from what is left
//! are checked again (a sum that overflows, used blocks over the maximum) the same way.
//!
//! Rates and quantiles need two answers: tokens per second is the counter's increase
//! over the time between them, the time-to-first-token quantiles are over the requests
//! whose first token came between them. A first answer, a counter that fell (the
//! engine restarted), or no new request gives no value for those signals, never 0.

pub mod discovery;
pub mod info;
pub mod mapping;
pub mod profiles;
pub mod text;

use super::derive::Series;
use super::scrape::{Reader, TargetValues};
use super::{SampleRefusal, SourceMetrics};
use crate::error::Error;
use crate::fleet::{GpuMetric, PodKey, PodValues};
use arc_swap::ArcSwap;
use info::TgiInfo;
use mapping::{Aggregation, Mapping};
use profiles::{Engine, Signals, delta, kv_usage, quantile};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What the adapter asks the engines for: their text exposition.
pub const ACCEPT: &str =
    "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1";

/// One `--serving-target`: a pod and its engine's metrics URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingTarget {
    pub pod: PodKey,
    pub url: String,
}

/// Parse `NAMESPACE/POD=URL`.
pub fn parse_target(text: &str) -> Result<ServingTarget, Error> {
    let bad = |why: &str| {
        Error::Config(format!(
            "--serving-target {text:?}: {why} (expected NAMESPACE/POD=URL, e.g. llm/vllm-0=http://10.0.0.7:8000/metrics)"
        ))
    };
    let (pod, url) = text.split_once('=').ok_or_else(|| bad("no `=`"))?;
    let (namespace, name) = pod
        .split_once('/')
        .ok_or_else(|| bad("no `/` in the pod"))?;
    let dns = |s: &str, max: usize| {
        !s.is_empty()
            && s.len() <= max
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !s.starts_with(['-', '.'])
            && !s.ends_with(['-', '.'])
    };
    if !dns(namespace, 63) || namespace.contains('.') {
        return Err(bad("the namespace is not a Kubernetes name"));
    }
    if !dns(name, 253) {
        return Err(bad("the pod is not a Kubernetes name"));
    }
    let parsed: axum::http::Uri = url.parse().map_err(|_| bad("the URL does not parse"))?;
    if !matches!(parsed.scheme_str(), Some("http" | "https")) || parsed.host().is_none() {
        return Err(bad("the URL must be http:// or https:// with a host"));
    }
    Ok(ServingTarget {
        pod: (namespace.to_string(), name.to_string()),
        url: url.to_string(),
    })
}

/// The pod each target URL belongs to: kept current with the targets.
pub type TargetPods = Arc<ArcSwap<HashMap<String, PodKey>>>;

/// What one target's previous answer left for rates.
#[derive(Debug, Clone)]
struct Previous {
    at: Instant,
    tokens_total: Option<f64>,
    ttft: Option<Vec<(f64, f64)>>,
    /// Per `rate` mapping, its sum.
    mapped: BTreeMap<String, f64>,
}

/// Reads serving engines' answers into per-pod values.
pub struct ServingReader {
    pods: TargetPods,
    mappings: Vec<Mapping>,
    /// The mapped metrics' names, leaked once at startup ([`GpuMetric::Mapped`]).
    names: Vec<&'static str>,
    previous: Mutex<HashMap<String, Previous>>,
    /// TGI's KV-cache capacities ([`info`]).
    info: Arc<TgiInfo>,
    /// Where refused samples are counted.
    metrics: SourceMetrics,
}

/// The samples of one answer that may be used: every sample of a family with a sample
/// that is not finite or out of range left out (exact duplicates were already dropped
/// by the decoder, the one place that sees every label). Returns them with the
/// refusals by reason (each bad sample counted once; the good samples of a refused
/// family are not counted).
pub fn admit(mut series: Vec<Series>) -> (Vec<Series>, BTreeMap<SampleRefusal, u64>) {
    let mut refused: BTreeMap<SampleRefusal, u64> = BTreeMap::new();
    // Labels in name order, so that a series is the same whatever order they came in.
    for s in &mut series {
        s.labels.sort_unstable();
    }
    let mut bad_families: BTreeSet<&str> = BTreeSet::new();
    for s in &series {
        let why = if !s.value.is_finite() {
            SampleRefusal::NotFinite
        } else if !profiles::in_range(s) {
            SampleRefusal::OutOfRange
        } else {
            continue;
        };
        *refused.entry(why).or_default() += 1;
        bad_families.insert(s.name.as_str());
    }
    let bad: HashSet<String> = bad_families.into_iter().map(str::to_string).collect();
    series.retain(|s| !bad.contains(&s.name));
    (series, refused)
}

/// Whether a signal's value is in its range: every built-in serving signal is at
/// least 0 and the KV-cache usage at most 1; a mapped one may be any finite number.
fn signal_refusal(metric: GpuMetric, v: f64) -> Option<SampleRefusal> {
    if !v.is_finite() {
        return Some(SampleRefusal::NotFinite);
    }
    let in_range = match metric {
        GpuMetric::Mapped(_) => true,
        GpuMetric::ServingKvCacheUsage => (0.0..=1.0).contains(&v),
        _ => v >= 0.0,
    };
    (!in_range).then_some(SampleRefusal::OutOfRange)
}

impl ServingReader {
    pub fn new(
        pods: TargetPods,
        mappings: Vec<Mapping>,
        names: Vec<&'static str>,
    ) -> ServingReader {
        ServingReader {
            pods,
            mappings,
            names,
            previous: Mutex::new(HashMap::new()),
            info: Arc::new(TgiInfo::new(None)),
            metrics: SourceMetrics::default(),
        }
    }

    /// Count refused samples in `metrics` (by default in a registry of its own).
    pub fn with_metrics(mut self, metrics: SourceMetrics) -> ServingReader {
        self.metrics = metrics;
        self
    }

    /// Read TGI targets' KV-cache capacity through `info` (by default none is fetched).
    pub fn with_info(mut self, info: Arc<TgiInfo>) -> ServingReader {
        self.info = info;
        self
    }

    /// As the scrape loop's [`Reader`].
    pub fn into_reader(self) -> Reader {
        let me = Arc::new(self);
        Arc::new(move |target, content_type, body, max_series| {
            me.read_counting(target, content_type, body, max_series, Instant::now())
        })
    }

    /// One answer of `target`, taken at `now`.
    pub fn read(
        &self,
        target: &str,
        content_type: &str,
        body: &[u8],
        max_series: usize,
        now: Instant,
    ) -> Result<HashMap<PodKey, PodValues>, Error> {
        self.read_counting(target, content_type, body, max_series, now)
            .map(|(pods, _)| pods)
    }

    /// [`Self::read`], with the number of series refused for their labels.
    fn read_counting(
        &self,
        target: &str,
        content_type: &str,
        body: &[u8],
        max_series: usize,
        now: Instant,
    ) -> Result<TargetValues, Error> {
        let pod = self
            .pods
            .load()
            .get(target)
            .cloned()
            .ok_or_else(|| Error::Scrape("no longer a serving target".into()))?;
        if !text::is_text(content_type) {
            return Err(Error::Decode(format!(
                "the engine answered {content_type:?}, not the Prometheus text exposition"
            )));
        }
        let mut engines: Vec<Engine> = Vec::new();
        let wanted = |name: &str| {
            let engine = Engine::of_family(name);
            if let Some(e) = engine
                && !engines.contains(&e)
            {
                engines.push(e);
            }
            engine.is_some_and(|e| e.wants(name)) || self.mappings.iter().any(|m| m.family == name)
        };
        // Only the labels the profiles and the mappings read are kept.
        let keep = |label: &str| {
            profiles::LABELS.contains(&label)
                || self
                    .mappings
                    .iter()
                    .any(|m| m.matchers.iter().any(|x| x.label == label))
        };
        let decoded = text::parse(body, max_series, wanted, keep)?;
        let (series, mut refused) = admit(decoded.series);
        // Exact duplicates were dropped by the decoder, which saw every label.
        if decoded.duplicates > 0 {
            *refused.entry(SampleRefusal::Duplicate).or_default() += decoded.duplicates;
        }
        let mut signals = match engines.as_slice() {
            [engine] => Some((*engine, engine.signals(&series))),
            [] => None,
            several => {
                let names: Vec<&str> = several.iter().map(|e| e.name()).collect();
                return Err(Error::Decode(format!(
                    "the exposition holds the families of several engines ({}): one pod, one engine",
                    names.join(", ")
                )));
            }
        };
        let mut previous = self
            .previous
            .lock()
            .map_err(|_| Error::Scrape("a reader panicked".into()))?;
        let before = previous.get(target);
        let mut values = BTreeMap::new();
        let mut current = Previous {
            at: now,
            tokens_total: None,
            ttft: None,
            mapped: BTreeMap::new(),
        };
        if let Some((engine, s)) = &mut signals {
            if *engine == Engine::Tgi {
                // A counter that fell: a new server, whose capacity may differ.
                let restarted = s
                    .tokens_total
                    .zip(before.and_then(|b| b.tokens_total))
                    .is_some_and(|(n, b)| n < b);
                let capacity = self.info.capacity(target, restarted, now);
                s.kv_cache = kv_usage(s.kv_cache_tokens, capacity);
            }
            signal_values(s, before, now, &mut values);
            current.tokens_total = s.tokens_total;
            current.ttft = s.ttft.clone();
        }
        for (m, name) in self.mappings.iter().zip(&self.names) {
            let Some(v) = m.evaluate(&series) else {
                continue;
            };
            if m.aggregation == Aggregation::Rate {
                current.mapped.insert(m.name.clone(), v);
                if let Some(rate) =
                    before.and_then(|b| rate(b.mapped.get(&m.name).copied()?, v, b.at, now))
                {
                    values.insert(GpuMetric::Mapped(name), rate);
                }
            } else {
                values.insert(GpuMetric::Mapped(name), v);
            }
        }
        // What the arithmetic made of admitted samples (a sum that overflows, Triton's
        // used blocks over the maximum) is checked too.
        values.retain(|metric, v| match signal_refusal(*metric, *v) {
            None => true,
            Some(why) => {
                *refused.entry(why).or_default() += 1;
                false
            }
        });
        for (why, count) in refused {
            self.metrics.refused_samples(target, why, count);
        }
        if signals.is_none() && values.is_empty() && current.mapped.is_empty() {
            return Err(Error::Decode(
                "no serving engine recognised (no vllm:, sglang:, tgi_ or nv_inference_ families) and no --serving-metric matches".into(),
            ));
        }
        previous.insert(target.to_string(), current);
        let pods = HashMap::from([(pod, PodValues { values })]);
        Ok((pods, decoded.over_labels))
    }

    /// Forget targets that left (their rates start over if they come back).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        if let Ok(mut p) = self.previous.lock() {
            p.retain(|url, _| keep(url));
        }
        self.info.retain(keep);
    }
}

/// The per-second increase of a counter, None if it fell or no time passed.
fn rate(before: f64, now: f64, then: Instant, at: Instant) -> Option<f64> {
    let secs = at.saturating_duration_since(then).as_secs_f64();
    (now >= before && secs > 0.0).then(|| (now - before) / secs)
}

/// The served signals of one answer, given the target's previous one.
fn signal_values(
    s: &Signals,
    before: Option<&Previous>,
    now: Instant,
    values: &mut BTreeMap<GpuMetric, f64>,
) {
    let gauges = [
        (GpuMetric::ServingRequestsWaiting, s.waiting),
        (GpuMetric::ServingRequestsRunning, s.running),
        (GpuMetric::ServingKvCacheUsage, s.kv_cache),
    ];
    for (metric, v) in gauges {
        if let Some(v) = v {
            values.insert(metric, v);
        }
    }
    let Some(before) = before else { return };
    if let Some(r) = s
        .tokens_total
        .zip(before.tokens_total)
        .and_then(|(n, b)| rate(b, n, before.at, now))
    {
        values.insert(GpuMetric::ServingGenerationTokensPerSecond, r);
    }
    if let Some(window) = s
        .ttft
        .as_deref()
        .zip(before.ttft.as_deref())
        .and_then(|(n, b)| delta(n, b))
    {
        for (metric, q) in [
            (GpuMetric::ServingTimeToFirstTokenP50, 0.5),
            (GpuMetric::ServingTimeToFirstTokenP95, 0.95),
            (GpuMetric::ServingTimeToFirstTokenP99, 0.99),
        ] {
            if let Some(v) = quantile(q, &window) {
                values.insert(metric, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reader(mappings: &[&str]) -> (ServingReader, &'static str) {
        let url = "http://10.0.0.7:8000/metrics";
        let pods = Arc::new(ArcSwap::from_pointee(HashMap::from([(
            url.to_string(),
            ("llm".to_string(), "vllm-0".to_string()),
        )])));
        let mappings: Vec<Mapping> = mappings
            .iter()
            .map(|m| mapping::parse(m, &[]).unwrap())
            .collect();
        let names = mappings.iter().map(|m| &*m.name.clone().leak()).collect();
        (ServingReader::new(pods, mappings, names), url)
    }

    fn vllm(waiting: f64, tokens: f64, ttft_buckets: [f64; 3]) -> String {
        format!(
            "vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n\
             vllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.5\n\
             vllm:generation_tokens_total{{model_name=\"m\"}} {tokens}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"0.1\",model_name=\"m\"}} {}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"1.0\",model_name=\"m\"}} {}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\",model_name=\"m\"}} {}\n\
             my_queue{{model_name=\"m\"}} 11\n",
            ttft_buckets[0], ttft_buckets[1], ttft_buckets[2]
        )
    }

    #[test]
    fn rates_and_quantiles_come_from_two_answers() {
        let (r, url) = reader(&[
            "my_rate=vllm:generation_tokens_total:rate",
            "my_q=my_queue:max",
        ]);
        let t0 = Instant::now();
        let pod = ("llm".to_string(), "vllm-0".to_string());
        let first = r
            .read(
                url,
                "text/plain; version=0.0.4",
                vllm(4.0, 1000.0, [0.0, 0.0, 0.0]).as_bytes(),
                100,
                t0,
            )
            .unwrap();
        let v = &first[&pod].values;
        assert_eq!(v.get(&GpuMetric::ServingRequestsWaiting), Some(&4.0));
        assert_eq!(v.get(&GpuMetric::ServingKvCacheUsage), Some(&0.5));
        assert_eq!(v.get(&GpuMetric::Mapped("my_q")), Some(&11.0));
        assert!(
            !v.contains_key(&GpuMetric::ServingGenerationTokensPerSecond),
            "one answer: no rate"
        );
        assert!(!v.contains_key(&GpuMetric::Mapped("my_rate")));
        // 2 s later: 500 more tokens; 10 first tokens, 8 within 0.1 s, 2 within 1 s.
        let t1 = t0 + Duration::from_secs(2);
        let second = r
            .read(
                url,
                "",
                vllm(6.0, 1500.0, [8.0, 10.0, 10.0]).as_bytes(),
                100,
                t1,
            )
            .unwrap();
        let v = &second[&pod].values;
        assert_eq!(
            v.get(&GpuMetric::ServingGenerationTokensPerSecond),
            Some(&250.0)
        );
        assert_eq!(v.get(&GpuMetric::Mapped("my_rate")), Some(&250.0));
        // p50: rank 5 of 8 in (0, 0.1]; p95: rank 9.5, half-way through (0.1, 1].
        let p50 = v[&GpuMetric::ServingTimeToFirstTokenP50];
        assert!((p50 - 0.1 * 5.0 / 8.0).abs() < 1e-12, "{p50}");
        let p95 = v[&GpuMetric::ServingTimeToFirstTokenP95];
        assert!((p95 - (0.1 + 0.9 * 1.5 / 2.0)).abs() < 1e-12, "{p95}");
        // The engine restarted: counters fell, so no rate and no quantiles, but the
        // gauges still.
        let t2 = t1 + Duration::from_secs(2);
        let third = r
            .read(
                url,
                "",
                vllm(1.0, 10.0, [0.0, 0.0, 0.0]).as_bytes(),
                100,
                t2,
            )
            .unwrap();
        let v = &third[&pod].values;
        assert_eq!(v.get(&GpuMetric::ServingRequestsWaiting), Some(&1.0));
        assert!(!v.contains_key(&GpuMetric::ServingGenerationTokensPerSecond));
        assert!(!v.contains_key(&GpuMetric::ServingTimeToFirstTokenP50));
    }

    /// A TGI pod's KV-cache usage is its held tokens over /info's capacity: absent
    /// until the capacity is known, and again once the engine restarted.
    #[test]
    fn tgi_kv_cache_usage_needs_the_info_capacity() {
        let (r, url) = reader(&[]);
        let info = Arc::new(TgiInfo::new(None));
        let r = r.with_info(info.clone());
        let pod = ("llm".to_string(), "vllm-0".to_string());
        let tgi = |held: f64, tokens: f64| {
            format!(
                "tgi_queue_size 1\ntgi_batch_current_max_tokens {held}\ntgi_request_generated_tokens_sum {tokens}\n"
            )
        };
        let kv = |body: String, at| {
            r.read(url, "", body.as_bytes(), 100, at).unwrap()[&pod]
                .values
                .get(&GpuMetric::ServingKvCacheUsage)
                .copied()
        };
        let t0 = Instant::now();
        assert_eq!(kv(tgi(2048.0, 100.0), t0), None, "no capacity yet");
        info.finish(url, Ok(16384.0), t0);
        assert_eq!(kv(tgi(4096.0, 200.0), t0), Some(0.25));
        // The tokens counter fell: a new server, its capacity unknown until asked.
        assert_eq!(kv(tgi(4096.0, 10.0), t0), None);
    }

    /// Issue 27: out-of-range and non-finite samples are refused with their family
    /// (the signal has no value from that answer), counted per target and reason;
    /// duplicates count once; the answer's other signals are served.
    #[test]
    fn out_of_range_samples_are_refused_and_counted_and_duplicates_count_once() {
        let (r, url) = reader(&["depth=my_depth:sum"]);
        let metrics = SourceMetrics::default();
        let r = r.with_metrics(metrics.clone());
        let pod = ("llm".to_string(), "vllm-0".to_string());
        let read = |body: &str| r.read(url, "", body.as_bytes(), 100, Instant::now());
        let count = |why| metrics.samples_refused(url, why);
        let running = "vllm:num_requests_running{model_name=\"m\"} 2\n";
        let (mut not_finite, mut out_of_range) = (0, 0);
        for (bad, metric, why) in [
            (
                "vllm:kv_cache_usage_perc{engine=\"0\"} -3\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.5\n",
                GpuMetric::ServingKvCacheUsage,
                SampleRefusal::OutOfRange,
            ),
            (
                "vllm:kv_cache_usage_perc 1e308\n",
                GpuMetric::ServingKvCacheUsage,
                SampleRefusal::OutOfRange,
            ),
            (
                "vllm:num_requests_waiting{engine=\"0\"} -4\nvllm:num_requests_waiting{engine=\"1\"} 9\n",
                GpuMetric::ServingRequestsWaiting,
                SampleRefusal::OutOfRange,
            ),
            (
                "vllm:num_requests_waiting NaN\n",
                GpuMetric::ServingRequestsWaiting,
                SampleRefusal::NotFinite,
            ),
            // Each in range, their sum is not.
            (
                "vllm:num_requests_waiting{engine=\"0\"} 1e308\nvllm:num_requests_waiting{engine=\"1\"} 1e308\n",
                GpuMetric::ServingRequestsWaiting,
                SampleRefusal::NotFinite,
            ),
            (
                "my_depth{a=\"1\"} 1e308\nmy_depth{a=\"2\"} 1e308\n",
                GpuMetric::Mapped("depth"),
                SampleRefusal::NotFinite,
            ),
        ] {
            let v = read(&format!("{bad}{running}")).unwrap();
            let v = &v[&pod].values;
            assert!(!v.contains_key(&metric), "{bad}: {v:?}");
            assert_eq!(
                v.get(&GpuMetric::ServingRequestsRunning),
                Some(&2.0),
                "{bad}: the other signals stay"
            );
            match why {
                SampleRefusal::NotFinite => not_finite += 1,
                _ => out_of_range += 1,
            }
            assert_eq!(count(SampleRefusal::NotFinite), not_finite, "{bad}");
            assert_eq!(count(SampleRefusal::OutOfRange), out_of_range, "{bad}");
        }
        // A negative latency bound: no time-to-first-token quantile from it.
        let ttft = |le: &str, n: f64| {
            format!(
                "vllm:time_to_first_token_seconds_bucket{{le=\"{le}\"}} {n}\n\
                 vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {n}\n{running}"
            )
        };
        read(&ttft("-5", 0.0)).unwrap();
        let v = read(&ttft("-5", 10.0)).unwrap();
        assert!(
            !v[&pod]
                .values
                .contains_key(&GpuMetric::ServingTimeToFirstTokenP95)
        );
        assert_eq!(count(SampleRefusal::OutOfRange), out_of_range + 2);
        // The same series twice (labels in another order) is one engine, not two.
        let v = read(
            "vllm:num_requests_waiting{a=\"1\",b=\"2\"} 5\nvllm:num_requests_waiting{b=\"2\",a=\"1\"} 5\nvllm:num_requests_waiting{a=\"2\",b=\"2\"} 1\n",
        )
        .unwrap();
        assert_eq!(
            v[&pod].values.get(&GpuMetric::ServingRequestsWaiting),
            Some(&6.0)
        );
        assert_eq!(count(SampleRefusal::Duplicate), 1);
    }

    #[test]
    fn unknown_expositions_and_targets_are_errors() {
        let (r, url) = reader(&[]);
        let now = Instant::now();
        let e = r
            .read(url, "text/plain", b"something_else 1\n", 100, now)
            .unwrap_err();
        assert!(
            e.to_string().contains("no serving engine recognised"),
            "{e}"
        );
        let e = r
            .read(
                url,
                "text/plain",
                b"vllm:num_requests_waiting 1\nsglang:num_queue_reqs 2\n",
                100,
                now,
            )
            .unwrap_err();
        assert!(e.to_string().contains("several engines"), "{e}");
        let e = r
            .read(url, "application/vnd.google.protobuf", b"", 100, now)
            .unwrap_err();
        assert!(e.to_string().contains("not the Prometheus text"), "{e}");
        let e = r
            .read(
                "http://elsewhere/metrics",
                "",
                b"vllm:num_requests_waiting 1",
                100,
                now,
            )
            .unwrap_err();
        assert!(e.to_string().contains("no longer a serving target"), "{e}");
        // A user mapping alone makes an unknown engine usable.
        let (r, url) = reader(&["depth=something_else:sum"]);
        let v = r.read(url, "", b"something_else 3\n", 100, now).unwrap();
        assert_eq!(
            v.values()
                .next()
                .unwrap()
                .values
                .get(&GpuMetric::Mapped("depth")),
            Some(&3.0)
        );
    }

    #[test]
    fn serving_targets_parse_and_refuse_what_is_not_one() {
        let t = parse_target("llm/vllm-0=http://10.0.0.7:8000/metrics").unwrap();
        assert_eq!(t.pod, ("llm".to_string(), "vllm-0".to_string()));
        assert_eq!(t.url, "http://10.0.0.7:8000/metrics");
        for (bad, why) in [
            ("llm/vllm-0", "no `=`"),
            ("vllm-0=http://x/metrics", "no `/` in the pod"),
            (
                "LLM/vllm-0=http://x/metrics",
                "the namespace is not a Kubernetes name",
            ),
            (
                "a.b/vllm-0=http://x/metrics",
                "the namespace is not a Kubernetes name",
            ),
            ("llm/=http://x/metrics", "the pod is not a Kubernetes name"),
            (
                "llm/vllm-0=ftp://x/metrics",
                "the URL must be http:// or https:// with a host",
            ),
            ("llm/vllm-0=not a url", "the URL does not parse"),
        ] {
            let e = parse_target(bad).map(|t| t.url).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("--serving-target {bad:?}: {why} (expected")),
                "{bad}: {e}"
            );
        }
    }
}
