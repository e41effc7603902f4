//! TGI's KV-cache capacity, read from its `GET /info` (`max_batch_total_tokens`, the
//! paged KV cache's size in tokens, fixed for the server's life): TGI's `/metrics`
//! only says how many tokens the running batches hold (`tgi_batch_current_max_tokens`),
//! so the usage ratio needs both.
//!
//! The capacity is fetched once per target when first seen, again after a failure
//! (backing off from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`]), when the engine restarted
//! (its tokens counter fell: the cached value is dropped, it may have changed), and at
//! most every [`REFRESH`]: never once per scrape. The fetch runs as a task on the
//! runtime with the scrape loop's client, timeout and in-flight budget, and a body cap
//! of [`BODY_LIMIT`]; the synchronous reader only reads the cache. Until a capacity is
//! known the pod has no KV-cache usage, never an invented 0. A failed refresh keeps
//! the capacity already read from the same server life.

use super::super::SourceMetrics;
use super::super::http_client::{self, Client};
use super::super::limits::Limits;
use crate::error::Error;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest a known capacity is trusted without asking again.
pub const REFRESH: Duration = Duration::from_secs(600);
/// The wait after a first failure, doubled per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// `/info` is a small JSON object; anything larger is not TGI's.
pub const BODY_LIMIT: usize = 64 * 1024;

/// One target's capacity and when to ask for it.
#[derive(Debug, Default)]
struct Entry {
    capacity: Option<f64>,
    in_flight: bool,
    /// None: ask at the next answer.
    due: Option<Instant>,
    /// Failures in a row (one warning per streak).
    failures: u32,
}

/// How to fetch `/info`: the scrape loop's client and limits, on its runtime.
pub struct Fetcher {
    pub client: Client,
    pub timeout: Duration,
    pub limits: Limits,
    pub runtime: tokio::runtime::Handle,
    pub metrics: SourceMetrics,
}

/// The capacities of the TGI targets, shared by the reader and the fetch tasks.
#[derive(Default)]
pub struct TgiInfo {
    entries: Mutex<HashMap<String, Entry>>,
    /// None: nothing is fetched (tests set capacities with [`TgiInfo::finish`]).
    fetcher: Option<Fetcher>,
}

/// `url` with its path (and query) replaced by `/info`.
pub fn info_url(url: &str) -> Result<String, Error> {
    let uri: axum::http::Uri = url
        .parse()
        .map_err(|e| Error::Scrape(format!("{url:?}: {e}")))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(Error::Scrape(format!("{url:?} has no scheme or host")));
    };
    Ok(format!("{scheme}://{authority}/info"))
}

/// `max_batch_total_tokens` from an `/info` body.
pub fn parse_capacity(body: &[u8]) -> Result<f64, Error> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Error::Decode(format!("/info is not JSON: {e}")))?;
    match v.get("max_batch_total_tokens").and_then(|t| t.as_u64()) {
        Some(n) if n > 0 => Ok(n as f64),
        _ => Err(Error::Decode(
            "/info has no positive max_batch_total_tokens".into(),
        )),
    }
}

impl TgiInfo {
    pub fn new(fetcher: Option<Fetcher>) -> TgiInfo {
        TgiInfo {
            entries: Mutex::new(HashMap::new()),
            fetcher,
        }
    }

    /// The capacity known for `target`, starting a fetch when one is due; `restarted`
    /// (the engine's counters fell) drops the old one and asks again.
    pub fn capacity(self: &Arc<Self>, target: &str, restarted: bool, now: Instant) -> Option<f64> {
        let mut entries = self.entries.lock().ok()?;
        let entry = entries.entry(target.to_string()).or_default();
        if restarted {
            entry.capacity = None;
            entry.due = None;
        }
        let due = entry.due.is_none_or(|at| now >= at);
        if due
            && !entry.in_flight
            && let Some(f) = &self.fetcher
        {
            entry.in_flight = true;
            let (me, target) = (self.clone(), target.to_string());
            f.runtime.spawn(async move {
                let result = me.fetch(&target).await;
                me.finish(&target, result, Instant::now());
            });
        }
        entry.capacity
    }

    async fn fetch(&self, target: &str) -> Result<f64, Error> {
        let Some(f) = &self.fetcher else {
            return Err(Error::Scrape("no fetcher".into()));
        };
        let url = info_url(target)?;
        let mut limits = f.limits.clone();
        limits.max_response_bytes = limits.max_response_bytes.min(BODY_LIMIT);
        let request = axum::http::Request::get(url.as_str())
            .header(axum::http::header::ACCEPT, "application/json");
        let answer = http_client::get(&f.client, request, &limits, f.timeout).await?;
        if !answer.status.is_success() {
            return Err(Error::Scrape(format!("/info: HTTP {}", answer.status)));
        }
        parse_capacity(&answer.body)
    }

    /// Note a fetch's result for `target`, taken at `now`.
    pub fn finish(&self, target: &str, result: Result<f64, Error>, now: Instant) {
        if let Some(f) = &self.fetcher {
            f.metrics.info_fetched(result.is_ok());
        }
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        // A target that left meanwhile is not brought back.
        let Some(entry) = entries.get_mut(target) else {
            return;
        };
        entry.in_flight = false;
        match result {
            Ok(capacity) => {
                if entry.failures > 0 {
                    tracing::info!(target = %target, capacity, "TGI /info answers again");
                }
                entry.capacity = Some(capacity);
                entry.failures = 0;
                entry.due = Some(now + REFRESH);
            }
            Err(e) => {
                if entry.failures == 0 {
                    tracing::warn!(target = %target, error = %e, "TGI /info failed: the pod has no serving_kv_cache_usage until it answers");
                }
                entry.failures = entry.failures.saturating_add(1);
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << (entry.failures - 1).min(16))
                    .min(MAX_BACKOFF);
                entry.due = Some(now + backoff);
            }
        }
    }

    /// Forget targets that left.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        if let Ok(mut e) = self.entries.lock() {
            e.retain(|url, _| keep(url));
        }
    }

    /// When the next fetch for `target` is due, if any is planned (tests).
    #[cfg(test)]
    fn due(&self, target: &str) -> Option<Option<Instant>> {
        self.entries.lock().ok()?.get(target).map(|e| e.due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_info_url_replaces_the_metrics_path() {
        assert_eq!(
            info_url("http://10.0.0.7:8080/metrics").unwrap(),
            "http://10.0.0.7:8080/info"
        );
        assert_eq!(
            info_url("https://tgi.llm:443/x/metrics?a=b").unwrap(),
            "https://tgi.llm:443/info"
        );
    }

    #[test]
    fn the_capacity_is_max_batch_total_tokens() {
        let body = br#"{"model_id":"m","max_batch_total_tokens":16384,"max_input_tokens":4095}"#;
        assert_eq!(parse_capacity(body).unwrap(), 16384.0);
        for (bad, why) in [
            (
                &br#"{"model_id":"m"}"#[..],
                "/info has no positive max_batch_total_tokens",
            ),
            (
                br#"{"max_batch_total_tokens":0}"#,
                "/info has no positive max_batch_total_tokens",
            ),
            (
                br#"{"max_batch_total_tokens":"many"}"#,
                "/info has no positive max_batch_total_tokens",
            ),
            (
                b"<html>",
                "/info is not JSON: expected value at line 1 column 1",
            ),
        ] {
            let e = parse_capacity(bad).expect_err(&String::from_utf8_lossy(bad));
            assert!(
                matches!(e, Error::Decode(_)) && e.to_string() == why,
                "{:?}: {e}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Without a fetcher the cache alone answers: nothing until a capacity arrives, a
    /// failure backs off (doubling, bounded) and keeps a value already known, a
    /// success is trusted for REFRESH, a restart drops the value.
    #[test]
    fn capacities_are_cached_refreshed_and_dropped_on_restart() {
        let info = Arc::new(TgiInfo::new(None));
        let (t, now) = ("http://tgi/metrics", Instant::now());
        assert_eq!(
            info.capacity(t, false, now),
            None,
            "never an invented value"
        );
        info.finish(t, Err(Error::Scrape("HTTP 500".into())), now);
        assert_eq!(info.due(t), Some(Some(now + FIRST_BACKOFF)));
        info.finish(t, Err(Error::Scrape("HTTP 500".into())), now);
        assert_eq!(info.due(t), Some(Some(now + FIRST_BACKOFF * 2)));
        for _ in 0..20 {
            info.finish(t, Err(Error::Scrape("HTTP 500".into())), now);
        }
        assert_eq!(info.due(t), Some(Some(now + MAX_BACKOFF)));
        assert_eq!(info.capacity(t, false, now), None);
        info.finish(t, Ok(1000.0), now);
        assert_eq!(info.capacity(t, false, now), Some(1000.0));
        assert_eq!(info.due(t), Some(Some(now + REFRESH)));
        info.finish(t, Err(Error::Scrape("HTTP 500".into())), now);
        assert_eq!(
            info.capacity(t, false, now),
            Some(1000.0),
            "same server life"
        );
        assert_eq!(info.capacity(t, true, now), None, "restarted");
        assert_eq!(info.due(t), Some(None), "asked again at once");
        info.retain(|_| false);
        info.finish(t, Ok(1000.0), now);
        assert_eq!(info.due(t), None, "a target that left stays gone");
    }
}
