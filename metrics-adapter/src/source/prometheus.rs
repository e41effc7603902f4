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

use super::derive::{FAMILIES, Series, pod_values};
use crate::error::Error;
use crate::fleet::{Fleet, Observed};
use arc_swap::ArcSwap;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Largest query answer accepted.
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

/// How to reach the Prometheus-compatible API.
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    /// Base URL, e.g. `http://prometheus.monitoring:9090` (the `/api/v1/query` path is
    /// appended; a Mimir or Thanos prefix such as `/prometheus` is kept).
    pub url: String,
    /// Extra headers, e.g. `X-Scope-OrgID: tenant-a`.
    pub headers: Vec<(String, String)>,
    /// A file holding a bearer token, read at every round (rotated tokens work).
    pub bearer_token_file: Option<PathBuf>,
    /// PEM CA bundle for https; default: the system's roots.
    pub ca_file: Option<PathBuf>,
    pub interval: Duration,
    pub timeout: Duration,
    pub staleness: Duration,
    /// Where query rounds and their durations are counted.
    pub metrics: super::SourceMetrics,
}

#[derive(Debug, Deserialize)]
struct QueryResponse {
    status: String,
    #[serde(default)]
    data: Option<QueryData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueryData {
    result_type: String,
    result: Vec<VectorSample>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct VectorSample {
    metric: HashMap<String, String>,
    /// `[evaluation time, "value"]`.
    value: (f64, String),
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

async fn instant_query(
    client: &super::http_client::Client,
    opts: &PrometheusOptions,
    token: Option<&str>,
    query: &str,
) -> Result<Vec<VectorSample>, Error> {
    let url = format!(
        "{}/api/v1/query?query={}",
        opts.url.trim_end_matches('/'),
        encode_query(query)
    );
    let mut req = axum::http::Request::get(&url);
    for (k, v) in &opts.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    if let Some(t) = token {
        req = req.header(axum::http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let answer = super::http_client::get(client, req, MAX_BODY_BYTES, opts.timeout).await?;
    decode_answer(answer.status, &answer.body)
}

/// The vector of an instant-query answer (`status` is the HTTP status, for messages).
pub(crate) fn decode_answer(
    status: impl std::fmt::Display,
    body: &[u8],
) -> Result<Vec<VectorSample>, Error> {
    let parsed: QueryResponse = serde_json::from_slice(body)
        .map_err(|e| Error::Decode(format!("HTTP {status}: not a Prometheus API answer ({e})")))?;
    if parsed.status != "success" {
        return Err(Error::Scrape(format!(
            "HTTP {status}: {}",
            parsed.error.unwrap_or_else(|| "query failed".into())
        )));
    }
    let data = parsed
        .data
        .ok_or_else(|| Error::Decode("no data in the answer".into()))?;
    if data.result_type != "vector" {
        return Err(Error::Decode(format!(
            "expected a vector, got {}",
            data.result_type
        )));
    }
    Ok(data.result)
}

/// A series' labels without the name, sorted: the key joining a family's samples with
/// their `timestamp()`.
fn identity(metric: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = metric
        .iter()
        .filter(|(k, _)| k.as_str() != "__name__")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    v.sort();
    v
}

/// The workload labels of a series as the exporter wrote them.
fn exporter_labels(metric: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = Vec::with_capacity(metric.len());
    for (k, v) in metric {
        match k.as_str() {
            "__name__" => {}
            "pod" | "namespace" | "container" if metric.contains_key(&format!("exported_{k}")) => {}
            _ => match k.strip_prefix("exported_") {
                Some(base @ ("pod" | "namespace" | "container")) => {
                    labels.push((base.to_string(), v.clone()))
                }
                _ => labels.push((k.clone(), v.clone())),
            },
        }
    }
    labels
}

/// One round: every family and its samples' timestamps, then per-pod values.
async fn round(
    client: &super::http_client::Client,
    opts: &PrometheusOptions,
) -> Result<Fleet, Error> {
    let token = match &opts.bearer_token_file {
        Some(p) => Some(
            kube_support::config_file::read_to_string(p, kube_support::config_file::SECRET_LIMIT)
                .map_err(|e| Error::Config(format!("{}: {e}", p.display())))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    // Per family: its samples, and their scrape times (`timestamp()` drops the name,
    // so it is asked per family: over several families it would collide).
    let token = token.as_deref();
    let answers = futures_util::future::join_all(FAMILIES.iter().map(|f| async move {
        let stamps_query = format!("timestamp({f})");
        let (values, stamps) = tokio::join!(
            instant_query(client, opts, token, f),
            instant_query(client, opts, token, &stamps_query)
        );
        (*f, values, stamps)
    }))
    .await;
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    assemble(answers, now_unix, opts.staleness)
}

/// Per family: its name, the answer to its query and the answer to `timestamp()` of it.
pub(crate) type FamilyAnswers = (
    &'static str,
    Result<Vec<VectorSample>, Error>,
    Result<Vec<VectorSample>, Error>,
);

/// One round's answers, as of `now_unix`, into the fleet.
pub(crate) fn assemble(
    answers: Vec<FamilyAnswers>,
    now_unix: f64,
    staleness: Duration,
) -> Result<Fleet, Error> {
    let mut series = Vec::new();
    // Per pod: the oldest sample time among its series.
    let mut oldest: HashMap<(String, String), f64> = HashMap::new();
    for (family, values, stamps) in answers {
        let stamps: HashMap<Vec<(String, String)>, f64> = stamps?
            .into_iter()
            .filter_map(|s| {
                let at = s.value.1.parse::<f64>().ok().filter(|t| t.is_finite())?;
                Some((identity(&s.metric), at))
            })
            .collect();
        for s in values? {
            // A scrape time in the future (clock skew, or a garbage answer such as
            // `+Inf` or `1e300`) counts as now: no sample is fresher than the answer,
            // and such times do not fit a SystemTime (they panicked the source).
            let Some(at) = stamps.get(&identity(&s.metric)).map(|at| at.min(now_unix)) else {
                continue;
            };
            if now_unix - at > staleness.as_secs_f64() {
                continue;
            }
            let Ok(value) = s.value.1.parse::<f64>() else {
                continue;
            };
            let labels = exporter_labels(&s.metric);
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
    let now = Instant::now();
    let pods = pod_values(&series)
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

/// Query forever, publishing into `store` after every successful round. A failed round
/// keeps the previous view, whose values then age out.
pub async fn run(opts: PrometheusOptions, store: Arc<ArcSwap<Fleet>>) {
    let tls = super::http_client::TlsOptions {
        ca_file: opts.ca_file.clone(),
        server_name: None,
    };
    let client = match super::http_client::client(&tls, None) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up the Prometheus client");
            return;
        }
    };
    let mut failing = false;
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let round_started = Instant::now();
        let result = round(&client, &opts).await;
        opts.metrics.round_took(round_started.elapsed());
        opts.metrics.scraped(result.is_ok());
        match result {
            Ok(fleet) => {
                if failing {
                    tracing::info!(url = %opts.url, "Prometheus answers again");
                    failing = false;
                }
                store.store(Arc::new(fleet));
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(url = %opts.url, error = %e, "Prometheus query failed; values age out after the staleness limit");
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
        let m: HashMap<String, String> = [
            ("__name__", "DCGM_FI_DEV_GPU_UTIL"),
            ("pod", "gpu-exporter-x7k2p"),
            ("namespace", "gpu-monitoring"),
            ("exported_pod", "resnet-0"),
            ("exported_namespace", "inference"),
            ("UUID", "GPU-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut l = exporter_labels(&m);
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
            let round = vec![(
                "DCGM_FI_DEV_GPU_UTIL",
                decode_answer(200, values.as_bytes()),
                decode_answer(200, stamps.as_bytes()),
            )];
            let fleet = assemble(round, now_unix, Duration::from_secs(60)).unwrap();
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

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode_query("timestamp({__name__=~\"A|B\"})"),
            "timestamp%28%7B__name__%3D~%22A%7CB%22%7D%29"
        );
    }
}
