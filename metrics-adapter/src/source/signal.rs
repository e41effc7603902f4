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
use super::prometheus::Endpoint;
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
        let (family, labels) = parse_series(series).map_err(|e| bad(&e.to_string()))?;
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

/// `name` or `name{k="v",...}`, the label pairs read by the text exposition's parser.
fn parse_series(text: &str) -> Result<(String, Labels), SeriesSyntax> {
    let (family, rest) = match text.find('{') {
        Some(i) => (&text[..i], Some(&text[i + 1..])),
        None => (text, None),
    };
    if family.is_empty()
        || !family
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return Err(SeriesSyntax::NotAName(family.to_string()));
    }
    let mut labels = Vec::new();
    if let Some(rest) = rest {
        let (tail, count) =
            super::serving::text::parse_labels(rest, &mut labels, |_| true, &mut 0)?;
        if count > super::limits::MAX_LABELS_PER_SERIES {
            return Err(SeriesSyntax::TooManyLabels(count));
        }
        if !tail.trim().is_empty() {
            return Err(SeriesSyntax::Trailing(tail.to_string()));
        }
    }
    Ok((family.to_string(), labels))
}

/// Label pairs in order.
type Labels = Vec<(String, String)>;

/// Why the series after `#` is not `name` or `name{k="v",...}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum SeriesSyntax {
    #[error("{0:?} is not a metric name")]
    NotAName(String),
    #[error(transparent)]
    Labels(#[from] super::serving::text::LabelSyntax),
    #[error("{0} labels (at most {max})", max = super::limits::MAX_LABELS_PER_SERIES)]
    TooManyLabels(usize),
    #[error("unexpected {0:?} after the labels")]
    Trailing(String),
}

/// The sum of `family`'s samples carrying every one of `labels` in a text exposition,
/// read by the serving engines' text decoder (its bounds: at most `max_series`
/// samples of the family, [`super::limits::MAX_LABELS_PER_SERIES`] labels a sample);
/// `None` when there is none.
pub fn sum_series(
    body: &[u8],
    family: &str,
    labels: &[(String, String)],
    max_series: usize,
) -> Result<Option<f64>, Error> {
    let keep = |name: &str| labels.iter().any(|(k, _)| k == name);
    let decoded = super::serving::text::parse(body, max_series, |n| n == family, keep)?;
    let mut sum = None;
    for s in decoded.series {
        if !labels.iter().all(|l| s.labels.contains(l)) || !s.value.is_finite() {
            continue;
        }
        *sum.get_or_insert(0.0) += s.value;
    }
    Ok(sum)
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
    /// Where `promql:` signals are asked: the adapter's one Prometheus query client.
    pub prometheus: Option<Endpoint>,
    pub interval: Duration,
    pub timeout: Duration,
    pub limits: Limits,
    pub metrics: super::SourceMetrics,
}

/// The clients the signal loop reads with: the text scrapes', and the Prometheus
/// endpoint's when a signal is a query.
pub struct Clients {
    scrape: Client,
    query: Option<Client>,
}

async fn read_one(
    clients: &Clients,
    opts: &SignalOptions,
    spec: &SignalSpec,
) -> Result<f64, Error> {
    match &spec.source {
        SignalSource::Scrape {
            url,
            family,
            labels,
        } => {
            let req = axum::http::Request::get(url).header("accept", "text/plain");
            let answer = http_client::get(&clients.scrape, req, &opts.limits, opts.timeout).await?;
            if !answer.status.is_success() {
                return Err(Error::Scrape(format!("HTTP {}", answer.status)));
            }
            let max_series = opts.limits.max_series_per_target;
            sum_series(&answer.body, family, labels, max_series)?
                .ok_or_else(|| Error::Decode(format!("no {family} series with those labels")))
        }
        SignalSource::Query(q) => {
            let (Some(endpoint), Some(client)) = (&opts.prometheus, &clients.query) else {
                return Err(Error::Config(
                    "promql: signals need --signal-prometheus-url or --prometheus-url".into(),
                ));
            };
            endpoint.value(client, q, &opts.limits, opts.timeout).await
        }
    }
}

/// Read every signal every interval, forever, publishing into `signals` whenever a
/// reading's value appears, changes or goes away (a reading that only got newer is
/// updated in place without waking anyone).
pub async fn run(opts: SignalOptions, clients: Clients, signals: SignalsHandle) {
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing: BTreeMap<(String, String), bool> = BTreeMap::new();
    loop {
        ticker.tick().await;
        let reads = opts
            .specs
            .iter()
            .map(|spec| read_one(&clients, &opts, spec));
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

/// The clients for `opts`' sources; fails on an unreadable CA file.
pub fn clients(opts: &SignalOptions) -> Result<Clients, Error> {
    let scrape = http_client::client(
        &http_client::TlsOptions::default(),
        Some(Duration::from_secs(30)),
    )?;
    let query = opts.prometheus.as_ref().map(Endpoint::client).transpose()?;
    Ok(Clients { scrape, query })
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
            ("ns/q=http://x#y{a=b}", "not in quotes"),
            // The exposition's own label syntax: pairs are separated by commas.
            (
                "ns/q=http://x#y{a=\"1\" b=\"2\"}",
                "not separated by commas",
            ),
            ("ns/q=http://x#y{a=\"1\"} z", "after the labels"),
            ("ns/q", "expected"),
        ] {
            let e = parse_spec(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--signal {bad:?}")), "{e}");
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_series_is_summed_over_matching_samples_only() {
        let body = b"# HELP queue waiting\n# TYPE queue gauge\nqueue{route=\"a\",zone=\"x\"} 3\nqueue{route=\"b\"} 4\nqueue_total 100\nqueue 2 1700000000\n";
        let sum = |family: &str, labels: &[(String, String)]| {
            sum_series(body, family, labels, 100).unwrap()
        };
        assert_eq!(sum("queue", &[]), Some(9.0));
        assert_eq!(sum("queue", &[("route".into(), "a".into())]), Some(3.0));
        assert_eq!(
            sum("queue", &[("route".into(), "c".into())]),
            None,
            "no sample is no value, not 0"
        );
        assert_eq!(sum("queue_total", &[]), Some(100.0));
        // The text decoder's bounds: a sample over the label bound is not summed, a
        // family past the series bound is refused.
        let wide = format!(
            "queue{{{}}} 5\nqueue 1\n",
            (0..=crate::source::limits::MAX_LABELS_PER_SERIES)
                .map(|i| format!("l{i}=\"v\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            sum_series(wide.as_bytes(), "queue", &[], 100).unwrap(),
            Some(1.0)
        );
        assert!(sum_series(body, "queue", &[], 2).is_err());
    }

    /// Two samples at 1e308 overflow their sum; the read fails rather than keep +Inf.
    #[test]
    fn a_sum_that_overflows_is_a_failed_read() {
        let body = b"queue{a=\"1\"} 1e308\nqueue{a=\"2\"} 1e308\n";
        let sum = sum_series(body, "queue", &[], 100).unwrap().unwrap();
        assert!(finite(sum).is_err(), "{sum:?}");
        let e = finite(f64::INFINITY).unwrap_err();
        assert!(e.to_string().contains("not a finite number"), "{e}");
        assert_eq!(finite(-3.5).unwrap(), -3.5);
    }
}
