//! The direct source: scrape every exporter concurrently each interval, keep the
//! latest per-pod values with when they were taken, and publish them atomically.
//!
//! A failed or slow exporter keeps its last values with their old timestamp, so they
//! age out of answers after `--max-staleness` instead of vanishing at the first blip.

use super::derive::{Series, pod_values};
use crate::error::Error;
use crate::fleet::{Fleet, Observed, PodKey, PodValues};
use arc_swap::ArcSwap;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The most exporters scraped at once.
const CONCURRENCY: usize = 256;
/// Largest scrape body accepted (a big node's full scrape is ~200 KB).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Turns a scrape body into series.
pub type Decoder = fn(content_type: &str, body: &[u8]) -> Result<Vec<Series>, Error>;

/// How to scrape.
#[derive(Debug, Clone)]
pub struct ScrapeOptions {
    /// The exporters' `/metrics` URLs, read at the start of every round (static from
    /// `--exporter-url`, or kept current by EndpointSlice discovery).
    pub targets: Arc<ArcSwap<Vec<String>>>,
    pub interval: Duration,
    pub timeout: Duration,
    /// The `Accept` header to send.
    pub accept: &'static str,
    /// TLS and basic auth for exporters that require them (`--web-config-file`).
    pub auth: ExporterAuth,
    /// Where scrape results and round durations are counted.
    pub metrics: super::SourceMetrics,
}

/// How the exporters want to be asked.
#[derive(Debug, Clone, Default)]
pub struct ExporterAuth {
    pub tls: super::http_client::TlsOptions,
    /// User name and the file with the password, read every round so a rotated Secret
    /// applies without a restart.
    pub basic_auth: Option<(String, std::path::PathBuf)>,
}

impl ExporterAuth {
    /// The `Authorization` header to send, if any.
    fn authorization(&self) -> Result<Option<axum::http::HeaderValue>, Error> {
        use base64::Engine;
        let Some((user, file)) = &self.basic_auth else {
            return Ok(None);
        };
        let password = std::fs::read_to_string(file).map_err(|e| {
            Error::Config(format!(
                "reading the exporter password {}: {e}",
                file.display()
            ))
        })?;
        // A trailing newline from `echo` or `kubectl create secret --from-file` is not
        // part of the password, as Prometheus's password_file reads it.
        let password = password.trim_end_matches(['\r', '\n']);
        let credentials =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        axum::http::HeaderValue::from_str(&format!("Basic {credentials}"))
            .map(Some)
            .map_err(|e| Error::Config(format!("exporter credentials: {e}")))
    }
}

pub type Client = super::http_client::Client;

/// One exporter's pods, and when its answer arrived.
type Scraped = (HashMap<PodKey, PodValues>, SystemTime, Instant);

/// Fetch one exporter, then decode and derive its pods on the blocking pool, one body at
/// a time (`decoding`): the CPU work of a round stays within one core and never queues
/// in front of API requests on the async workers, and only one decoded body is alive at
/// once instead of a whole round's.
async fn scrape_one(
    client: &Client,
    url: &str,
    opts: &ScrapeOptions,
    authorization: Option<&axum::http::HeaderValue>,
    decode: Decoder,
    decoding: &Arc<tokio::sync::Semaphore>,
) -> Result<Scraped, Error> {
    let mut request = axum::http::Request::get(url).header(axum::http::header::ACCEPT, opts.accept);
    if let Some(value) = authorization {
        request = request.header(axum::http::header::AUTHORIZATION, value);
    }
    let answer = super::http_client::get(client, request, MAX_BODY_BYTES, opts.timeout).await?;
    let (at, seen) = (SystemTime::now(), Instant::now());
    if !answer.status.is_success() {
        return Err(Error::Scrape(format!("HTTP {}", answer.status)));
    }
    let (content_type, body) = (answer.content_type, answer.body);
    let _permit = decoding
        .acquire()
        .await
        .map_err(|_| Error::Scrape("shutting down".into()))?;
    let pods = tokio::task::spawn_blocking(move || {
        decode(&content_type, &body).map(|series| pod_values(&series))
    })
    .await
    .map_err(|e| Error::Scrape(format!("decoding failed: {e}")))??;
    Ok((pods, at, seen))
}

/// The scrape client for `opts` (http, or https with its TLS options); fails on an
/// unreadable CA file or a bad server name, so startup can say so.
pub fn client(opts: &ScrapeOptions) -> Result<Client, Error> {
    super::http_client::client(&opts.auth.tls, Some(opts.interval * 4))
}

/// Scrape forever with `client` (from [`client`]), publishing into `store` after every
/// round.
pub async fn run(opts: ScrapeOptions, client: Client, decode: Decoder, store: Arc<ArcSwap<Fleet>>) {
    // Per target: its pods and when, kept across rounds so a failure ages them out.
    let mut per_target: HashMap<String, (HashMap<PodKey, PodValues>, SystemTime, Instant)> =
        HashMap::new();
    let mut failing: HashMap<String, String> = HashMap::new();
    let mut credentials_error: Option<String> = None;
    let mut last_answer = None;
    let decoding = Arc::new(tokio::sync::Semaphore::new(1));
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let targets = opts.targets.load_full();
        // Exporters that left (pod deleted, node drained) take their pods with them.
        let current: std::collections::HashSet<&str> = targets.iter().map(String::as_str).collect();
        per_target.retain(|url, _| current.contains(url.as_str()));
        failing.retain(|url, _| current.contains(url.as_str()));
        let authorization = match opts.auth.authorization() {
            Ok(value) => {
                credentials_error = None;
                value
            }
            Err(e) => {
                // Without credentials every exporter would answer 401: say why once,
                // and let the values age out.
                let e = e.to_string();
                if credentials_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "cannot scrape the exporters");
                    credentials_error = Some(e);
                }
                continue;
            }
        };
        let authorization = authorization.as_ref();
        let round_started = Instant::now();
        let results: Vec<(String, Result<Scraped, Error>)> =
            futures_util::stream::iter(targets.iter().cloned())
                .map(|url| {
                    let client = &client;
                    let opts = &opts;
                    let decoding = &decoding;
                    async move {
                        let r =
                            scrape_one(client, &url, opts, authorization, decode, decoding).await;
                        (url, r)
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
        opts.metrics.round_took(round_started.elapsed());
        let mut answered = 0;
        for (url, result) in results {
            opts.metrics.scraped(result.is_ok());
            match result {
                Ok(scraped) => {
                    answered += 1;
                    if failing.remove(&url).is_some() {
                        tracing::info!(target = %url, "exporter answers again");
                    }
                    per_target.insert(url, scraped);
                }
                Err(e) => {
                    if !failing.contains_key(&url) {
                        tracing::warn!(target = %url, error = %e, "exporter scrape failed; its pods' values age out after the staleness limit");
                    }
                    failing.insert(url, e.to_string());
                }
            }
        }
        if answered > 0 {
            last_answer = Some(Instant::now());
        }
        let mut pods = HashMap::new();
        for (values, at, seen) in per_target.values() {
            for (pod, v) in values {
                pods.insert(
                    pod.clone(),
                    Observed {
                        values: v.clone(),
                        at: *at,
                        seen: *seen,
                    },
                );
            }
        }
        store.store(Arc::new(Fleet {
            pods,
            targets: targets.len(),
            answered,
            last_answer,
        }));
    }
}
