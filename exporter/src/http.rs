//! The HTTP side: `/metrics` renders the current snapshot, `/healthz` says the process
//! is alive, `/readyz` says whether the GPU data is fresh, `/` links them.

use crate::encode::{self, Format, SCRAPE_BUCKETS, ScrapeStats};
use crate::snapshot::Snapshot;
use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Readings older than this many collect intervals are not served and make `/readyz` fail.
pub const STALE_INTERVALS: u32 = 3;

pub struct AppState {
    pub store: Arc<ArcSwap<Snapshot>>,
    pub interval: Duration,
    pub openmetrics: bool,
    scrapes: AtomicU64,
    scrape_nanos: AtomicU64,
    scrape_buckets: [AtomicU64; SCRAPE_BUCKETS.len()],
}

impl AppState {
    pub fn new(store: Arc<ArcSwap<Snapshot>>, interval: Duration, openmetrics: bool) -> AppState {
        AppState {
            store,
            interval,
            openmetrics,
            scrapes: AtomicU64::new(0),
            scrape_nanos: AtomicU64::new(0),
            scrape_buckets: Default::default(),
        }
    }

    fn scrape_stats(&self) -> ScrapeStats {
        ScrapeStats {
            buckets: std::array::from_fn(|i| self.scrape_buckets[i].load(Ordering::Relaxed)),
            scrapes: self.scrapes.load(Ordering::Relaxed),
            duration_seconds_sum: self.scrape_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    fn observe_scrape(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(i) = SCRAPE_BUCKETS.iter().position(|b| seconds <= *b) {
            self.scrape_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.scrapes.fetch_add(1, Ordering::Relaxed);
        self.scrape_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    fn max_age(&self) -> Duration {
        self.interval * STALE_INTERVALS
    }

    /// Whether the GPU data is fresh, and why not.
    pub fn readiness(&self, now: Instant) -> Result<(), String> {
        let snap = self.store.load();
        match snap.success_age(now) {
            None => Err("no successful GPU sample yet".into()),
            Some(age) if age > self.max_age() => Err(format!(
                "last successful GPU sample is {:.1}s old (limit {:.1}s)",
                age.as_secs_f64(),
                self.max_age().as_secs_f64()
            )),
            Some(_) => Ok(()),
        }
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/", get(index))
        .with_state(state)
}

/// Whether `Accept-Encoding` allows gzip (`gzip` or `*`, with a non-zero quality).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"))
}

async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let started = Instant::now();
    let fmt = if state.openmetrics && wants_openmetrics(&headers) {
        Format::OpenMetrics
    } else {
        Format::Text
    };
    let snap = state.store.load_full();
    let fresh = started.saturating_duration_since(snap.taken) <= state.max_age();
    let stats = state.scrape_stats();
    let gzip = accepts_gzip(&headers);
    let body = encode::render(&snap, stats, fmt, fresh, gzip);
    state.observe_scrape(started.elapsed());
    let mut response = (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(fmt.content_type()),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::VARY,
                HeaderValue::from_static("Accept, Accept-Encoding"),
            ),
        ],
        body,
    )
        .into_response();
    if gzip {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match state.readiness(Instant::now()) {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn index() -> Html<&'static str> {
    Html(concat!(
        "<!doctype html><html><head><title>gpu-exporter</title></head><body>",
        "<h1>gpu-exporter</h1><ul>",
        "<li><a href=\"/metrics\">/metrics</a>: GPU metrics</li>",
        "<li><a href=\"/healthz\">/healthz</a>: the process is alive</li>",
        "<li><a href=\"/readyz\">/readyz</a>: GPU data is fresh</li>",
        "</ul></body></html>\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(v: &str) -> bool {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        accepts_gzip(&h)
    }

    #[test]
    fn gzip_is_used_only_when_accepted() {
        assert!(accepts("gzip"));
        assert!(accepts("identity, GZIP;q=0.5"));
        assert!(accepts("*"));
        assert!(!accepts("deflate, br"));
        assert!(!accepts("gzip;q=0"));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }
}
