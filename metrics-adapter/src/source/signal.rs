//! Signals without pods: one number per (namespace, name) that exists while a workload
//! has no replica, such as the requests waiting at a gateway or in a queue. They are
//! what scale from zero needs: at zero replicas there is no GPU and no engine to read.
//!
//! Declared with `--signal NAMESPACE/NAME=SOURCE`, SOURCE one of
//! - `URL#SERIES`: the sum of the samples of SERIES (`name` or `name{label="value",...}`,
//!   every given label equal) in the text exposition at URL, e.g. a gateway's `/metrics`;
//! - `promql:QUERY`: an instant query against `--signal-prometheus-url` (default
//!   `--prometheus-url`): the sum of the vector's samples, or the scalar.
//!
//! Each is read every `--signal-interval` (default 250 ms) and published to a watch
//! channel only when a value changes, which wakes the KEDA `StreamIsActive` streams
//! at once: the first request at a gateway reaches KEDA within one interval plus a
//! round trip. A source that fails or has no such series keeps no value (an error at
//! query time, never a 0); an empty PromQL answer is no value either (write
//! `sum(...) or vector(0)` where absence truly means zero).

use super::http_client::{self, Client};
use super::limits::Limits;
use crate::error::Error;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// Where a signal is read.
#[derive(Debug, Clone, PartialEq)]
pub enum SignalSource {
    /// A text exposition, one series family (and label equalities).
    Scrape {
        url: String,
        family: String,
        labels: Vec<(String, String)>,
    },
    /// A PromQL instant query.
    Query(String),
}

/// One declared signal.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalSpec {
    pub namespace: String,
    pub name: String,
    pub source: SignalSource,
}

/// `NAMESPACE/NAME=SOURCE`, as `--signal` takes it.
pub fn parse_spec(text: &str) -> Result<SignalSpec, Error> {
    let bad = |why: &str| Error::Config(format!("--signal {text:?}: {why}"));
    let (key, source) = text
        .split_once('=')
        .ok_or_else(|| bad("expected NAMESPACE/NAME=URL#SERIES or NAMESPACE/NAME=promql:QUERY"))?;
    let (namespace, name) = key
        .trim()
        .split_once('/')
        .ok_or_else(|| bad("expected NAMESPACE/NAME before ="))?;
    let name_ok = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if namespace.is_empty() || !name_ok {
        return Err(bad(
            "the namespace must not be empty and the name must be lower case letters, digits and _",
        ));
    }
    let source = source.trim();
    let source = if let Some(q) = source.strip_prefix("promql:") {
        if q.trim().is_empty() {
            return Err(bad("promql: needs a query"));
        }
        SignalSource::Query(q.trim().to_string())
    } else {
        let (url, series) = source
            .split_once('#')
            .ok_or_else(|| bad("expected URL#SERIES (the series to read at URL)"))?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(bad("the URL must be http:// or https://"));
        }
        let (family, labels) = parse_series(series).map_err(|e| bad(&e))?;
        SignalSource::Scrape {
            url: url.to_string(),
            family,
            labels,
        }
    };
    Ok(SignalSpec {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    })
}

/// `name` or `name{k="v",...}`.
fn parse_series(text: &str) -> Result<(String, Labels), String> {
    let (family, rest) = match text.find('{') {
        Some(i) => (&text[..i], Some(&text[i..])),
        None => (text, None),
    };
    if family.is_empty()
        || !family
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return Err(format!("{family:?} is not a metric name"));
    }
    let labels = match rest {
        None => Vec::new(),
        Some(rest) => {
            let (labels, tail) = parse_labels(rest)?;
            if !tail.trim().is_empty() {
                return Err(format!("unexpected {tail:?} after the labels"));
            }
            labels
        }
    };
    Ok((family.to_string(), labels))
}

/// Label pairs in order.
type Labels = Vec<(String, String)>;

/// `{k="v",...}` at the start of `text`: the labels and what follows.
fn parse_labels(text: &str) -> Result<(Labels, &str), String> {
    let mut rest = text
        .strip_prefix('{')
        .ok_or_else(|| "expected {".to_string())?;
    let mut labels = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("expected label=\"value\" in {text:?}"))?;
        let key = rest[..eq].trim().to_string();
        rest = rest[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("expected a quoted value for {key:?}"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value".into()),
                },
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        };
        labels.push((key, value));
        rest = rest[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// The sum of `family`'s samples carrying every one of `labels` in a text exposition;
/// `None` when there is none.
pub fn sum_series(body: &str, family: &str, labels: &[(String, String)]) -> Option<f64> {
    let mut sum = None;
    for line in body.lines() {
        let line = line.trim_start();
        if line.starts_with('#') || !line.starts_with(family) {
            continue;
        }
        let rest = &line[family.len()..];
        let (have, rest) = if rest.starts_with('{') {
            match parse_labels(rest) {
                Ok(x) => x,
                Err(_) => continue,
            }
        } else if rest.starts_with([' ', '\t']) {
            (Vec::new(), rest)
        } else {
            // Another family sharing the prefix (`queue_total` for `queue`).
            continue;
        };
        if !labels.iter().all(|l| have.contains(l)) {
            continue;
        }
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite())
        else {
            continue;
        };
        *sum.get_or_insert(0.0) += value;
    }
    sum
}

/// A signal's last reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub value: f64,
    pub at: SystemTime,
    pub seen: Instant,
}

/// Every signal's last reading, by (namespace, name); absent: never read, or the last
/// read failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Signals {
    pub readings: BTreeMap<(String, String), Reading>,
}

/// Where the signals are published; readers `subscribe()` or `borrow()`.
pub type SignalsHandle = Arc<watch::Sender<Signals>>;

pub fn handle() -> SignalsHandle {
    Arc::new(watch::Sender::new(Signals::default()))
}

/// How the signal loop reads its sources.
pub struct SignalOptions {
    pub specs: Vec<SignalSpec>,
    pub prometheus_url: Option<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub limits: Limits,
    pub metrics: super::SourceMetrics,
}

async fn read_one(client: &Client, opts: &SignalOptions, spec: &SignalSpec) -> Result<f64, Error> {
    match &spec.source {
        SignalSource::Scrape {
            url,
            family,
            labels,
        } => {
            let req = axum::http::Request::get(url).header("accept", "text/plain");
            let answer = http_client::get(client, req, &opts.limits, opts.timeout).await?;
            if !answer.status.is_success() {
                return Err(Error::Scrape(format!("HTTP {}", answer.status)));
            }
            let body = std::str::from_utf8(&answer.body)
                .map_err(|_| Error::Decode("the exposition is not UTF-8".into()))?;
            sum_series(body, family, labels)
                .ok_or_else(|| Error::Decode(format!("no {family} series with those labels")))
        }
        SignalSource::Query(q) => {
            let base = opts.prometheus_url.as_deref().ok_or_else(|| {
                Error::Config(
                    "promql: signals need --signal-prometheus-url or --prometheus-url".into(),
                )
            })?;
            let url = format!(
                "{}/api/v1/query?query={}",
                base.trim_end_matches('/'),
                percent_encode(q)
            );
            let answer = http_client::get(
                client,
                axum::http::Request::get(url),
                &opts.limits,
                opts.timeout,
            )
            .await?;
            query_value(&answer.body)
        }
    }
}

fn percent_encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of an instant query's answer: a vector's samples summed, or a scalar.
fn query_value(body: &[u8]) -> Result<f64, Error> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Error::Decode(format!("not a Prometheus API answer: {e}")))?;
    if v["status"] != "success" {
        return Err(Error::Scrape(format!(
            "the query failed: {}",
            v["error"].as_str().unwrap_or("no error given")
        )));
    }
    let number = |s: &serde_json::Value| -> Option<f64> {
        s[1].as_str()?.parse::<f64>().ok().filter(|x| x.is_finite())
    };
    match v["data"]["resultType"].as_str() {
        Some("scalar") => number(&v["data"]["result"])
            .ok_or_else(|| Error::Decode("the scalar is not a number".into())),
        Some("vector") => {
            let samples = v["data"]["result"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            if samples.is_empty() {
                return Err(Error::Decode(
                    "the query answered no series (use `or vector(0)` if none means zero)".into(),
                ));
            }
            samples
                .iter()
                .map(|s| number(&s["value"]))
                .sum::<Option<f64>>()
                .ok_or_else(|| Error::Decode("a sample is not a number".into()))
        }
        other => Err(Error::Decode(format!(
            "expected a vector or a scalar, got {other:?}"
        ))),
    }
}

/// Read every signal every interval, forever, publishing into `signals` whenever a
/// reading's value appears, changes or goes away (a reading that only got newer is
/// updated in place without waking anyone).
pub async fn run(opts: SignalOptions, client: Client, signals: SignalsHandle) {
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing: BTreeMap<(String, String), bool> = BTreeMap::new();
    loop {
        ticker.tick().await;
        let reads = opts.specs.iter().map(|spec| read_one(&client, &opts, spec));
        let results: Vec<Result<f64, Error>> = futures_util::future::join_all(reads)
            .await
            .into_iter()
            .map(|r| r.and_then(finite))
            .collect();
        let (at, seen) = (SystemTime::now(), Instant::now());
        signals.send_if_modified(|s| {
            let mut changed = false;
            for (spec, result) in opts.specs.iter().zip(&results) {
                let key = (spec.namespace.clone(), spec.name.clone());
                opts.metrics
                    .signal_read(&spec.namespace, &spec.name, result.is_ok());
                let was_failing = failing.insert(key.clone(), result.is_err()).unwrap_or(false);
                match result {
                    Ok(value) => {
                        if was_failing {
                            tracing::info!(signal = %spec.name, namespace = %spec.namespace, "signal reads again");
                        }
                        let reading = Reading { value: *value, at, seen };
                        let old = s.readings.insert(key, reading);
                        changed |= old.map(|o| o.value) != Some(*value);
                    }
                    Err(e) => {
                        if !was_failing {
                            tracing::warn!(signal = %spec.name, namespace = %spec.namespace, error = %e, "signal read failed; it has no value until it reads again");
                        }
                        changed |= s.readings.remove(&key).is_some();
                    }
                }
            }
            changed
        });
    }
}

/// A reading that is a finite number; a sum of finite samples that overflows (two
/// at 1e308) is a failed read, so the signal has no value, never ±Inf.
fn finite(value: f64) -> Result<f64, Error> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(Error::Decode(format!(
            "the samples sum to {value}, not a finite number"
        )))
    }
}

/// A client for the signal sources.
pub fn client() -> Result<Client, Error> {
    http_client::client(
        &http_client::TlsOptions::default(),
        Some(Duration::from_secs(30)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_errors_name_the_flag() {
        let s = parse_spec(r#"inference/gateway_queue=http://gw:9100/metrics#envoy_queue{cluster="vllm",zone="a\"b"}"#)
            .unwrap();
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str()),
            ("inference", "gateway_queue")
        );
        assert_eq!(
            s.source,
            SignalSource::Scrape {
                url: "http://gw:9100/metrics".into(),
                family: "envoy_queue".into(),
                labels: vec![
                    ("cluster".into(), "vllm".into()),
                    ("zone".into(), "a\"b".into())
                ],
            }
        );
        let q = parse_spec("ml/waiting=promql:sum(queue_depth{app=\"llm\"})").unwrap();
        assert_eq!(
            q.source,
            SignalSource::Query("sum(queue_depth{app=\"llm\"})".into())
        );
        for (bad, says) in [
            ("gateway_queue=http://x#y", "NAMESPACE/NAME"),
            ("ns/Queue=http://x#y", "lower case"),
            ("ns/q=http://x", "URL#SERIES"),
            ("ns/q=ftp://x#y", "http://"),
            ("ns/q=promql:", "needs a query"),
            ("ns/q=http://x#y{a=b}", "quoted"),
            ("ns/q", "expected"),
        ] {
            let e = parse_spec(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--signal {bad:?}")), "{e}");
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_series_is_summed_over_matching_samples_only() {
        let body = "# HELP queue waiting\n# TYPE queue gauge\nqueue{route=\"a\",zone=\"x\"} 3\nqueue{route=\"b\"} 4\nqueue_total 100\nqueue 2 1700000000\n";
        assert_eq!(sum_series(body, "queue", &[]), Some(9.0));
        assert_eq!(
            sum_series(body, "queue", &[("route".into(), "a".into())]),
            Some(3.0)
        );
        assert_eq!(
            sum_series(body, "queue", &[("route".into(), "c".into())]),
            None,
            "no sample is no value, not 0"
        );
        assert_eq!(sum_series(body, "queue_total", &[]), Some(100.0));
    }

    /// Issue 27: two samples at 1e308 overflow their sum; the read fails rather than
    /// keep +Inf.
    #[test]
    fn a_sum_that_overflows_is_a_failed_read() {
        let body = "queue{a=\"1\"} 1e308\nqueue{a=\"2\"} 1e308\n";
        let sum = sum_series(body, "queue", &[]);
        assert!(finite(sum.unwrap()).is_err(), "{sum:?}");
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1e308"]},{"metric":{"a":"b"},"value":[1,"1e308"]}]}}"#;
        let e = query_value(vector).and_then(finite).unwrap_err();
        assert!(e.to_string().contains("not a finite number"), "{e}");
        assert_eq!(finite(-3.5).unwrap(), -3.5);
    }

    #[test]
    fn query_answers_are_summed_and_empty_ones_refused() {
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2.5"]},{"metric":{"a":"b"},"value":[1,"4"]}]}}"#;
        assert_eq!(query_value(vector).unwrap(), 6.5);
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"7"]}}"#;
        assert_eq!(query_value(scalar).unwrap(), 7.0);
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(
            query_value(empty)
                .unwrap_err()
                .to_string()
                .contains("or vector(0)")
        );
        let failed = br#"{"status":"error","error":"parse error"}"#;
        assert!(
            query_value(failed)
                .unwrap_err()
                .to_string()
                .contains("parse error")
        );
    }
}
