//! The Prometheus-compatible source (`--prometheus-url`): for clusters that already run
//! Prometheus, Thanos or Mimir, the adapter asks it instead of scraping every exporter.
//!
//! Each interval it runs a fixed set of instant queries, all evaluated at the same time
//! with `--max-staleness` as their lookback, that aggregate per pod in the engine
//! ([`pushdown`]): one per built-in metric and one for the pods' oldest sample times.
//! With `--prometheus-queries=recorded` each query instead selects the per-pod series
//! the engine's recording rules keep, the same aggregations evaluated in each shard.
//! So a round's answers hold one sample per pod whatever the fleet's GPUs, and the
//! engine's load is the same for one HPA or a thousand. Answers are decoded sample by
//! sample as they are read ([`answer`]).

mod answer;
pub mod pushdown;

use super::limits::{Limits, PROMETHEUS_QUERIES};
use crate::error::Error;
use crate::fleet::Fleet;
pub(crate) use answer::query_value;
use answer::{Budget, decode_answer};
use arc_swap::ArcSwap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
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

    /// One instant query, evaluated at `at` (Unix seconds and the engine's lookback;
    /// default: the engine's now and its own lookback), its answer read within
    /// `limits` and `timeout`.
    async fn instant(
        &self,
        client: &super::http_client::Client,
        token: Option<&str>,
        query: &str,
        at: Option<(f64, &str)>,
        limits: &Limits,
        timeout: Duration,
    ) -> Result<super::http_client::Answer, Error> {
        let mut url = format!(
            "{}/api/v1/query?query={}",
            self.url.trim_end_matches('/'),
            encode_query(query)
        );
        if let Some((t, lookback)) = at {
            url.push_str(&format!("&time={t:.3}&lookback_delta={lookback}"));
        }
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
            .instant(client, token.as_deref(), query, None, limits, timeout)
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
    /// What bounds the answers' memory; the series limit counts every sample a round
    /// keeps (`--prometheus-max-series`: about the pods times the queries), the pod
    /// budget the pods it serves.
    pub limits: Limits,
    pub max_series: usize,
    /// Aggregate per pod in each query, or read the recording rules' per-pod series.
    pub queries: pushdown::Queries,
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

/// One instant query at `time` with the staleness as its lookback, decoded into the
/// round's pods as `answers`. At most [`PROMETHEUS_QUERIES`] run at once (`slots`);
/// the answer's bytes stay in the in-flight budget until decoded.
///
/// Decoding runs on the low-priority [`background`](super::background) thread, not on
/// the workers that answer API requests: at 50,000 pods an answer is about 8 MB, tens
/// of milliseconds of parsing, which on a worker would put requests queued behind it.
#[allow(clippy::too_many_arguments)]
async fn instant_query(
    client: &super::http_client::Client,
    opts: &PrometheusOptions,
    token: Option<&str>,
    query: &pushdown::PodQuery,
    time: f64,
    slots: &tokio::sync::Semaphore,
    budget: &Arc<Budget>,
    gathered: &Arc<Mutex<pushdown::Gathered>>,
) -> Result<(), Error> {
    let _slot = slots
        .acquire()
        .await
        .map_err(|_| Error::Scrape("shutting down".into()))?;
    let answer = opts
        .endpoint
        .instant(
            client,
            token,
            &query.promql,
            Some((time, &pushdown::lookback_delta(opts.staleness))),
            &opts.limits,
            opts.timeout,
        )
        .await?;
    let (budget, gathered, answers) = (budget.clone(), gathered.clone(), query.answers);
    super::background::run(move || {
        let mut gathered = gathered
            .lock()
            .map_err(|_| Error::Scrape("a round's decoding panicked".into()))?;
        decode_into(answer.status, &answer.body, &budget, answers, &mut gathered)
    })
    .await
}

/// Decode one answer into the round's pods; the first refusal (the pod budget) ends it.
fn decode_into(
    status: axum::http::StatusCode,
    body: &[u8],
    budget: &Budget,
    answers: pushdown::Answer,
    gathered: &mut pushdown::Gathered,
) -> Result<(), Error> {
    let mut refused = None;
    decode_answer(status, body, budget, |s| {
        if refused.is_none()
            && let Err(e) = gathered.take(answers, pushdown::row(s))
        {
            refused = Some(e);
        }
    })?;
    refused.map_or(Ok(()), Err)
}

/// One round: the per-pod queries, all evaluated at the same instant so that their
/// answers describe one moment, into the fleet.
async fn round(
    client: &super::http_client::Client,
    opts: &PrometheusOptions,
) -> Result<Fleet, Error> {
    let token = opts.endpoint.token()?;
    let token = token.as_deref();
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let slots = tokio::sync::Semaphore::new(PROMETHEUS_QUERIES);
    let budget = Arc::new(Budget::new(opts.max_series));
    let gathered = Arc::new(Mutex::new(pushdown::Gathered::new(
        now_unix,
        opts.limits.max_pods,
    )));
    let (slots, budget_ref, gathered_ref) = (&slots, &budget, &gathered);
    let queries = pushdown::queries_for(opts.queries);
    let answered = futures_util::future::try_join_all(queries.iter().map(|q| async move {
        instant_query(
            client,
            opts,
            token,
            q,
            now_unix,
            slots,
            budget_ref,
            gathered_ref,
        )
        .await
    }))
    .await;
    opts.metrics
        .series_over_labels(budget.over_labels.load(Ordering::Relaxed));
    answered?;
    let gathered = Arc::try_unwrap(gathered)
        .map_err(|_| Error::Scrape("a round's answers are still being decoded".into()))?
        .into_inner()
        .map_err(|_| Error::Scrape("a round's decoding panicked".into()))?;
    let staleness = opts.staleness;
    super::background::run(move || Ok(pushdown::assemble(gathered, staleness))).await
}

/// A round's answers, given as bodies (one per query of [`pushdown::queries`], in
/// order; missing ones answer no sample), decoded and assembled as a round does (for
/// the fuzz target).
pub fn decode_round(
    bodies: &[&[u8]],
    now_unix: f64,
    staleness: Duration,
    max_series: usize,
    max_pods: usize,
) -> Result<Fleet, Error> {
    let budget = Budget::new(max_series);
    let ok = axum::http::StatusCode::OK;
    let mut gathered = pushdown::Gathered::new(now_unix, max_pods);
    for (q, body) in pushdown::queries().iter().zip(bodies) {
        decode_into(ok, body, &budget, q.answers, &mut gathered)?;
    }
    Ok(pushdown::assemble(gathered, staleness))
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
                if opts.queries == pushdown::Queries::Recorded && fleet.pods.is_empty() {
                    warn_nothing_recorded();
                }
                if failing {
                    tracing::info!(url = %opts.endpoint.url, "Prometheus answers again");
                    failing = false;
                }
                // The last view's pods (tens of thousands of records) are freed on
                // the background thread too, not on the worker that swaps.
                let last = store.swap(Arc::new(fleet));
                let _ = super::background::run(move || {
                    drop(last);
                    Ok(())
                })
                .await;
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

/// Says once per process that a round of recorded queries found no pod: the usual
/// cause is rules not loaded into the engine, which nothing else would show.
fn warn_nothing_recorded() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "--prometheus-queries=recorded: the engine answered no per-pod series; \
             are the recording rules loaded (gpu-metrics-adapter --print-recording-rules)?"
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode_query("timestamp({__name__=~\"A|B\"})"),
            "timestamp%28%7B__name__%3D~%22A%7CB%22%7D%29"
        );
    }
}
