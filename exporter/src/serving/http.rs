//! The HTTP side: `/metrics` renders the current snapshot, `/healthz` says the process
//! is alive, `/readyz` says whether the GPU data is fresh, `/health` is dcgm-exporter's
//! name for the same verdict as `/readyz`, `/` links them.
//!
//! ## Long poll (issue 16)
//!
//! Every `/metrics` answer names its snapshot in [`GENERATION_HEADER`]. A client that
//! sends the token it holds back as `?newer_than=TOKEN` is answered at once if a newer
//! snapshot is published (or the token is from another process), else held until the
//! next publication, at most `wait` (`?wait=1500ms`, default and cap
//! [`MAX_HOLD_INTERVALS`] collect intervals); a hold that ends without a publication
//! answers `304 Not Modified` with no body. So the metrics adapter learns of each
//! sample within a round trip of it being taken instead of up to a scrape interval
//! later, and is sent each snapshot once. Prometheus sends neither parameter and is
//! answered as before.
//!
//! ## Bounds (issue 27)
//!
//! `wait` is Go's duration syntax or whole milliseconds; longer than the cap is the cap,
//! and anything unreadable (negative, `1e308s`, beyond 2^63 ns) is `400 Bad Request`.
//! At most [`AppState::with_max_held`] requests are held at once (half the connection
//! cap): beyond it a request that would be held is answered at once as a plain scrape
//! (the client's own snapshot again, so a follower such as the metrics adapter falls
//! back to polling at its interval), with `Connection: close` on HTTP/1.1 so it leaves
//! its connection slot to probes and scrapers. That is the answer of an exporter that
//! does not hold at all, which followers already handle (the adapter then polls at its
//! interval); a `429`/`503` would make the adapter report a failed target instead. The
//! `wait` cap is Consul's for blocking queries: a longer `wait` is served as the cap,
//! not refused. Every body shares its snapshot's rendered buffer;
//! what a response adds (the ~1 KB per-scrape part) counts against
//! [`MAX_UNSENT_SCRAPE_BYTES`] until it is sent or dropped, and a scrape beyond it is
//! `503` with `Retry-After`, so responses parked under HTTP/2 flow control stay bounded.

use crate::encode::{self, Format, SCRAPE_BUCKETS, ScrapeStats};
use crate::snapshot::SnapshotStore;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{any, get};
use bytes::Bytes;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Readings older than this many collect intervals are not served and make `/readyz` fail.
pub const STALE_INTERVALS: u32 = 3;

/// The response header naming the snapshot an answer carries; clients send it back as
/// `?newer_than=`.
pub const GENERATION_HEADER: &str = "x-snapshot-generation";

/// The longest a `?newer_than=` request is held, in collect intervals: a sampler that
/// has not published for this long is late, and the client should hear so.
pub const MAX_HOLD_INTERVALS: u32 = 2;

/// Requests held at once unless [`AppState::with_max_held`] says otherwise: half the
/// default connection cap.
pub const DEFAULT_MAX_HELD: usize = 256;

/// The per-scrape bytes of responses not yet sent (or dropped) that the exporter keeps
/// at once: ~8,000 parked responses of ~1 KB. Their shared snapshot part is not
/// counted; it exists once however many responses carry it.
pub const MAX_UNSENT_SCRAPE_BYTES: usize = 8 << 20;

/// How often a refused hold or an exhausted response budget is logged at most.
const BOUND_LOG_INTERVAL: Duration = Duration::from_secs(10);

pub struct AppState {
    pub store: Arc<SnapshotStore>,
    pub interval: Duration,
    pub openmetrics: bool,
    scrapes: AtomicU64,
    scrape_nanos: AtomicU64,
    scrape_buckets: [AtomicU64; SCRAPE_BUCKETS.len()],
    /// The listener's refusals, served with each scrape.
    pub listener: Arc<tls_serving::ListenerStats>,
    /// One permit per request that may be held at once.
    holds: Arc<Semaphore>,
    max_held: usize,
    /// Per-scrape bytes of response bodies not yet sent or dropped.
    unsent: Arc<AtomicUsize>,
    unsent_budget: usize,
    /// Milliseconds from `origin` of the last log line of each bound (held requests,
    /// unsent bytes), plus one (0: never).
    held_logged_ms: AtomicU64,
    unsent_logged_ms: AtomicU64,
    origin: Instant,
}

impl AppState {
    pub fn new(store: Arc<SnapshotStore>, interval: Duration, openmetrics: bool) -> AppState {
        AppState {
            store,
            interval,
            openmetrics,
            scrapes: AtomicU64::new(0),
            scrape_nanos: AtomicU64::new(0),
            scrape_buckets: Default::default(),
            listener: Arc::default(),
            holds: Arc::new(Semaphore::new(DEFAULT_MAX_HELD)),
            max_held: DEFAULT_MAX_HELD,
            unsent: Arc::new(AtomicUsize::new(0)),
            unsent_budget: MAX_UNSENT_SCRAPE_BYTES,
            held_logged_ms: AtomicU64::new(0),
            unsent_logged_ms: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    /// At most `max` requests held at once (at least one); beyond, a request that would
    /// be held is answered at once.
    pub fn with_max_held(mut self, max: usize) -> AppState {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        self.holds = Arc::new(Semaphore::new(max));
        self.max_held = max;
        self
    }

    /// At most `bytes` of per-scrape response bytes unsent at once.
    pub fn with_unsent_budget(mut self, bytes: usize) -> AppState {
        self.unsent_budget = bytes;
        self
    }

    /// Whether a bound's log line is due (at most one per [`BOUND_LOG_INTERVAL`]);
    /// `logged` is when that bound was last logged.
    fn log_due(&self, logged: &AtomicU64) -> bool {
        let now = u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = logged.load(Ordering::Relaxed);
        let interval = u64::try_from(BOUND_LOG_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        (last == 0 || now.saturating_sub(last) >= interval)
            && logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Counts `bytes` against the unsent budget, or `None` when they do not fit.
    fn reserve_unsent(&self, bytes: usize) -> Option<UnsentGuard> {
        let mut current = self.unsent.load(Ordering::Relaxed);
        loop {
            let next = current.checked_add(bytes)?;
            if next > self.unsent_budget {
                return None;
            }
            match self.unsent.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(UnsentGuard {
                        unsent: self.unsent.clone(),
                        bytes,
                    });
                }
                Err(seen) => current = seen,
            }
        }
    }

    fn scrape_stats(&self) -> ScrapeStats {
        ScrapeStats {
            buckets: std::array::from_fn(|i| self.scrape_buckets[i].load(Ordering::Relaxed)),
            scrapes: self.scrapes.load(Ordering::Relaxed),
            duration_seconds_sum: self.scrape_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            connections_refused: self.listener.refused_counts(),
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

    /// Whether the GPU data is fresh and covers at least one device, and why not: the
    /// one verdict behind `/readyz` and `/health`.
    pub fn readiness(&self, now: Instant) -> Result<(), NotReady> {
        let snap = self.store.load();
        if snap.source_hung {
            return Err(NotReady::DriverHung);
        }
        match snap.success_age(now) {
            None => Err(NotReady::NoSampleYet),
            Some(age) if age > self.max_age() => Err(NotReady::Stale {
                age,
                limit: self.max_age(),
            }),
            // The driver answers but lists no GPU (or --devices selects none): nothing to
            // serve; the sampler keeps enumerating and the node turns ready when GPUs
            // appear. While the driver is down the snapshot lists no device either;
            // staleness, above, says so after its grace.
            Some(_) if snap.source_up && snap.entities.is_empty() => Err(NotReady::NoGpu),
            Some(_) if snap.source_up && !snap.entities.iter().any(|e| e.up) => {
                Err(NotReady::AllGpusLost)
            }
            Some(_) => Ok(()),
        }
    }
}

/// Why the exporter is not ready: the text `/readyz` and `/health` answer with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotReady {
    #[error("an NVML call has not returned (the driver is hung)")]
    DriverHung,
    #[error("no successful GPU sample yet")]
    NoSampleYet,
    #[error(
        "last successful GPU sample is {:.1}s old (limit {:.1}s)",
        age.as_secs_f64(),
        limit.as_secs_f64()
    )]
    Stale { age: Duration, limit: Duration },
    #[error("no GPU to report: the GPU driver answers but lists no GPU, or --devices selects none")]
    NoGpu,
    #[error("every GPU is lost (fallen off the bus)")]
    AllGpusLost,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        // dcgm-exporter's probe path (its Helm chart and the GPU Operator probe it), any
        // method as there; unlike dcgm-exporter's it fails while /readyz does.
        .route("/health", any(health))
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

/// How strongly `Accept` asks for each format we can serve.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Qualities {
    /// The delimited `io.prometheus.client.MetricFamily` stream (`proto=` and
    /// `encoding=delimited` required; a wildcard does not select it).
    protobuf: f32,
    /// `application/openmetrics-text`, any version (counted only when enabled).
    openmetrics: f32,
    /// The text format: `text/plain`, `text/*` or `*/*`.
    text: f32,
}

/// The highest quality `Accept` gives each format. Parameters other than `q`, `proto`
/// and `encoding` (`version`, Prometheus 3's `escaping`) do not change what is served:
/// every name the exporter writes is a legacy Prometheus name, which each escaping
/// scheme leaves as it is.
fn accept_qualities(headers: &HeaderMap, openmetrics: bool) -> Qualities {
    let mut best = Qualities::default();
    let items = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for item in items {
        let mut parts = item.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let (mut q, mut proto, mut delimited) = (1.0f32, false, false);
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                // An unreadable quality refuses the item rather than preferring it.
                "q" => q = value.parse::<f32>().unwrap_or(0.0).clamp(0.0, 1.0),
                "proto" => proto = value == "io.prometheus.client.MetricFamily",
                "encoding" => delimited = value == "delimited",
                _ => {}
            }
        }
        match media.as_str() {
            "application/vnd.google.protobuf" if proto && delimited => {
                best.protobuf = best.protobuf.max(q);
            }
            "text/plain" | "text/*" | "*/*" => best.text = best.text.max(q),
            "application/openmetrics-text" if openmetrics => {
                best.openmetrics = best.openmetrics.max(q);
            }
            _ => {}
        }
    }
    best
}

/// The format to answer with: the one `Accept` rates highest among those we serve
/// (OpenMetrics only when enabled), ties going to protobuf, then OpenMetrics (the
/// richer formats, which Prometheus lists first); text when nothing else is wanted.
/// Prometheus 3 orders its `scrape_protocols` by quality, so a job that lists
/// `PrometheusText1.0.0` before `OpenMetricsText1.0.0` gets the text format.
fn negotiate(headers: &HeaderMap, openmetrics: bool) -> Format {
    let q = accept_qualities(headers, openmetrics);
    if q.protobuf > 0.0 && q.protobuf >= q.openmetrics && q.protobuf >= q.text {
        Format::Protobuf
    } else if q.openmetrics > 0.0 && q.openmetrics >= q.text {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// What a long-poll request asks: the token it holds and how long it may be held.
#[derive(Debug, PartialEq)]
struct Hold<'q> {
    newer_than: &'q str,
    wait: Duration,
}

/// A `wait` that is no duration: the request is refused with `400`.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("wait={0:?} is not a duration (Go's syntax such as 1500ms or 2s, or whole milliseconds)")]
pub struct BadWait(String);

/// `newer_than` and `wait` from the query string; `Ok(None)` for an ordinary scrape. A
/// `wait` longer than `cap` is `cap`, so no request is held longer; an unreadable one is
/// an error, whether or not `newer_than` is given.
fn hold_request(query: Option<&str>, cap: Duration) -> Result<Option<Hold<'_>>, BadWait> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut newer_than = None;
    let mut wait = cap;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("newer_than", token)) if !token.is_empty() => newer_than = Some(token),
            Some(("wait", w)) => wait = parse_wait(w)?.min(cap),
            _ => {}
        }
    }
    Ok(newer_than.map(|newer_than| Hold { newer_than, wait }))
}

/// `wait`: Go's duration syntax (`1500ms`, `2s`, `0.5s`, the one grammar of
/// [`kube_support::duration`]) or whole milliseconds (`250`). Every value it returns is
/// a valid `Duration`; overflow, negatives and floats' spellings (`1e308s`, `NaN`) are
/// refused rather than converted.
fn parse_wait(text: &str) -> Result<Duration, BadWait> {
    let bad = || BadWait(text.chars().take(64).collect());
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| bad())
    } else {
        kube_support::duration::parse(text).map_err(|_| bad())
    }
}

/// Reads a `/metrics` query as the handler does, for the fuzz target: `Ok(Some(wait))`
/// for a long poll, `Ok(None)` for a plain scrape, `Err` for a `400`. Never panics.
#[doc(hidden)]
pub fn read_hold_query(query: &str, cap: Duration) -> Result<Option<Duration>, BadWait> {
    hold_request(Some(query), cap).map(|hold| hold.map(|h| h.wait))
}

/// Per-scrape bytes counted against [`AppState`]'s unsent budget until dropped.
struct UnsentGuard {
    unsent: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for UnsentGuard {
    fn drop(&mut self) {
        self.unsent.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A `/metrics` body: the snapshot's shared part, then this scrape's own, with its
/// length known (`Content-Length`). Holds its per-scrape bytes against the budget
/// until sent or dropped.
struct MetricsBody {
    cached: Option<Bytes>,
    scrape: Option<Bytes>,
    _unsent: Option<UnsentGuard>,
}

impl MetricsBody {
    fn new(rendered: encode::Rendered, unsent: UnsentGuard) -> MetricsBody {
        let non_empty = |b: Bytes| (!b.is_empty()).then_some(b);
        MetricsBody {
            cached: non_empty(rendered.cached),
            scrape: non_empty(Bytes::from(rendered.scrape)),
            _unsent: Some(unsent),
        }
    }
}

impl http_body::Body for MetricsBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let next = self.cached.take().or_else(|| self.scrape.take());
        if self.cached.is_none() && self.scrape.is_none() {
            // Sent in full (hyper holds at most this last chunk): the budget is free.
            self._unsent = None;
        }
        Poll::Ready(next.map(|data| Ok(http_body::Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.cached.is_none() && self.scrape.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let len =
            self.cached.as_ref().map_or(0, Bytes::len) + self.scrape.as_ref().map_or(0, Bytes::len);
        http_body::SizeHint::with_exact(len as u64)
    }
}

async fn metrics(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    version: axum::http::Version,
    headers: HeaderMap,
) -> Response {
    let hold = match hold_request(query.as_deref(), state.interval * MAX_HOLD_INTERVALS) {
        Ok(hold) => hold,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    // Subscribe before loading, so a publication between the two still wakes the hold.
    let mut published = state.store.subscribe();
    let mut current = state.store.load_published();
    let mut held = false;
    // Beyond the cap on held requests: answered at once, and the slot given back.
    let mut release_connection = false;
    if let Some(hold) = hold {
        if hold.newer_than == state.store.token(current.generation) {
            match state.holds.clone().try_acquire_owned() {
                Ok(_permit) => {
                    held = true;
                    let woke = tokio::time::timeout(hold.wait, published.changed()).await;
                    current = state.store.load_published();
                    if !matches!(woke, Ok(Ok(()))) {
                        // Nothing new within the wait: say so without a body.
                        return (
                            StatusCode::NOT_MODIFIED,
                            [(GENERATION_HEADER, state.store.token(current.generation))],
                        )
                            .into_response();
                    }
                }
                Err(_) => {
                    release_connection = version <= axum::http::Version::HTTP_11;
                    if state.log_due(&state.held_logged_ms) {
                        tracing::warn!(
                            max_held = state.max_held,
                            "long-poll limit reached; answering further long polls at once"
                        );
                    }
                }
            }
        }
    }
    // The scrape-duration histogram measures building the answer, not the hold.
    let started = Instant::now();
    let fmt = negotiate(&headers, state.openmetrics);
    let snap = &current.snapshot;
    let fresh = started.saturating_duration_since(snap.taken) <= state.max_age();
    let stats = state.scrape_stats();
    let gzip = accepts_gzip(&headers);
    let rendered = encode::render_parts(snap, stats, fmt, fresh, gzip);
    let Some(unsent) = state.reserve_unsent(rendered.scrape.len()) else {
        if state.log_due(&state.unsent_logged_ms) {
            tracing::warn!(
                budget_bytes = state.unsent_budget,
                "too many /metrics responses not yet read by their clients; answering 503"
            );
        }
        let retry = state.interval.as_secs().max(1).to_string();
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, retry)],
            "too many responses in flight\n",
        )
            .into_response();
    };
    state.observe_scrape(started.elapsed());
    tracing::debug!(
        format = fmt.name(),
        gzip,
        held,
        generation = current.generation,
        bytes = rendered.len(),
        "served /metrics"
    );
    let token = HeaderValue::from_str(&state.store.token(current.generation))
        .unwrap_or_else(|_| HeaderValue::from_static("0"));
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
        axum::body::Body::new(MetricsBody::new(rendered, unsent)),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(GENERATION_HEADER, token);
    if gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if release_connection {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
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

/// dcgm-exporter's `/health`: `200 OK` in plain text when healthy, else `503` and why.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let (status, body) = match state.readiness(Instant::now()) {
        Ok(()) => (StatusCode::OK, "OK".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not healthy: {why}\n"),
        ),
    };
    super::access::plain_text(status, body)
}

async fn index() -> Html<&'static str> {
    Html(concat!(
        "<!doctype html><html><head><title>gpu-exporter</title></head><body>",
        "<h1>gpu-exporter</h1><ul>",
        "<li><a href=\"/metrics\">/metrics</a>: GPU metrics</li>",
        "<li><a href=\"/healthz\">/healthz</a>: the process is alive</li>",
        "<li><a href=\"/readyz\">/readyz</a>: GPU data is fresh</li>",
        "<li><a href=\"/health\">/health</a>: dcgm-exporter's probe, as /readyz</li>",
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

    fn format_for(accept: &str, openmetrics: bool) -> Format {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        negotiate(&h, openmetrics)
    }

    #[test]
    fn protobuf_is_served_when_preferred() {
        // Prometheus 2.42 with --enable-feature=native-histograms, as captured.
        let prometheus = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(format_for(prometheus, false), Format::Protobuf);
        assert_eq!(format_for(prometheus, true), Format::Protobuf);
        // Protobuf with a lower quality that still beats every text format.
        let weighted = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(format_for(weighted, true), Format::Protobuf);
        // Quoted parameters and case in names.
        let quoted = r#"Application/Vnd.Google.Protobuf; Proto="io.prometheus.client.MetricFamily"; Encoding=delimited"#;
        assert_eq!(format_for(quoted, false), Format::Protobuf);
        // A tie goes to protobuf: the client rates them equal and it is cheaper.
        let tie = "text/plain;q=0.5,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5";
        assert_eq!(format_for(tie, false), Format::Protobuf);
    }

    #[test]
    fn text_stays_the_default() {
        for (accept, openmetrics, want) in [
            ("*/*", false, Format::Text),
            ("", false, Format::Text),
            ("text/plain;version=0.0.4", true, Format::Text),
            // Prometheus without native histograms.
            (
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                true,
                Format::OpenMetrics,
            ),
            // Text preferred over protobuf.
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.2,text/plain;q=0.9",
                false,
                Format::Text,
            ),
            // OpenMetrics preferred, and enabled.
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,application/openmetrics-text;version=1.0.0",
                true,
                Format::OpenMetrics,
            ),
            // A wildcard alone beats a less wanted protobuf.
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,*/*",
                false,
                Format::Text,
            ),
            // Not the delimited MetricFamily stream: not something we write.
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text",
                false,
                Format::Text,
            ),
            (
                "application/vnd.google.protobuf;proto=other.Message;encoding=delimited",
                false,
                Format::Text,
            ),
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0",
                false,
                Format::Text,
            ),
        ] {
            assert_eq!(format_for(accept, openmetrics), want, "{accept}");
        }
    }

    /// Prometheus 3.16's `Accept` for each `scrape_protocols` list and escaping scheme,
    /// as captured from the real server: the format each job must get.
    #[test]
    fn prometheus_3_scrape_protocols_get_their_first_choice() {
        const DEFAULT: &str = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.7,application/openmetrics-text;version=0.0.1;q=0.6,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.3";
        const NATIVE_HISTOGRAMS: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        const TEXT_THEN_OPENMETRICS: &str = "text/plain;version=1.0.0;escaping=underscores;q=0.7,application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.6,*/*;q=0.5";
        const OPENMETRICS_ONLY: &str =
            "application/openmetrics-text;version=1.0.0;escaping=dots;q=0.7,*/*;q=0.6";
        const PROTOBUF_ONLY: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,*/*;q=0.6";
        for (accept, openmetrics, want) in [
            (DEFAULT, true, Format::OpenMetrics),
            (DEFAULT, false, Format::Text),
            (NATIVE_HISTOGRAMS, true, Format::Protobuf),
            (NATIVE_HISTOGRAMS, false, Format::Protobuf),
            // The job prefers text: OpenMetrics, though enabled and listed, is not it.
            (TEXT_THEN_OPENMETRICS, true, Format::Text),
            (TEXT_THEN_OPENMETRICS, false, Format::Text),
            (OPENMETRICS_ONLY, true, Format::OpenMetrics),
            (OPENMETRICS_ONLY, false, Format::Text),
            (PROTOBUF_ONLY, true, Format::Protobuf),
        ] {
            assert_eq!(format_for(accept, openmetrics), want, "{accept}");
        }
        // A refused or less wanted OpenMetrics is not served either.
        for accept in [
            "application/openmetrics-text;q=0,text/plain",
            "application/openmetrics-text;version=1.0.0;q=0.1,*/*",
        ] {
            assert_eq!(format_for(accept, true), Format::Text, "{accept}");
        }
    }

    fn store() -> Arc<SnapshotStore> {
        let (plan, _) =
            crate::plan::counters::plan(crate::plan::counters::DEFAULT_COUNTERS, "default")
                .unwrap();
        let empty = || crate::snapshot::Snapshot::empty(Arc::new(plan.clone()), "".into());
        let store = Arc::new(SnapshotStore::new(empty()));
        store.store(Arc::new(empty()));
        store
    }

    const INTERVAL: Duration = Duration::from_secs(1);

    /// GET `uri` on a router over `store`; (status, generation header, when answered).
    async fn get(
        store: &Arc<SnapshotStore>,
        uri: &str,
    ) -> (StatusCode, String, tokio::time::Instant) {
        use tower::ServiceExt;
        let app = router(Arc::new(AppState::new(store.clone(), INTERVAL, false)));
        let request = axum::http::Request::get(uri)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        let token = response.headers()[GENERATION_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        (response.status(), token, tokio::time::Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_without_the_current_snapshot_is_answered_at_once() {
        let store = store();
        let start = tokio::time::Instant::now();
        let (status, first, at) = get(&store, "/metrics").await;
        assert_eq!((status, at), (StatusCode::OK, start));
        assert_eq!(first, store.token(1));
        store.store(store.load());
        // An older token, and one from another process, are answered at once with the
        // newest snapshot.
        let other_boot = format!("0-{:x}", 2);
        for held in [first.as_str(), other_boot.as_str()] {
            let (status, token, at) = get(&store, &format!("/metrics?newer_than={held}")).await;
            assert_eq!((status, at), (StatusCode::OK, start), "{held}");
            assert_eq!(token, store.token(2));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_with_the_current_snapshot_is_held_until_the_next_one() {
        let store = store();
        let start = tokio::time::Instant::now();
        let held = store.token(1);
        let request = tokio::spawn({
            let store = store.clone();
            async move { get(&store, &format!("/metrics?newer_than={held}&wait=1500ms")).await }
        });
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            !request.is_finished(),
            "held while nothing new is published"
        );
        store.store(store.load());
        let (status, token, at) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(token, store.token(2));
        assert_eq!(
            at - start,
            Duration::from_millis(700),
            "answered on publication"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_is_bounded_and_ends_without_a_body() {
        let store = store();
        let held = store.token(1);
        for (query, want) in [
            // As asked.
            (
                format!("newer_than={held}&wait=300ms"),
                Duration::from_millis(300),
            ),
            (
                format!("newer_than={held}&wait=0.5s"),
                Duration::from_millis(500),
            ),
            // Never longer than the cap, whatever the client asks.
            (
                format!("newer_than={held}&wait=60s"),
                INTERVAL * MAX_HOLD_INTERVALS,
            ),
            (format!("newer_than={held}"), INTERVAL * MAX_HOLD_INTERVALS),
            // Whole milliseconds as large as they come: still the cap.
            (
                format!("newer_than={held}&wait=18446744073709551615"),
                INTERVAL * MAX_HOLD_INTERVALS,
            ),
        ] {
            let start = tokio::time::Instant::now();
            let (status, token, at) = get(&store, &format!("/metrics?{query}")).await;
            assert_eq!(status, StatusCode::NOT_MODIFIED, "{query}");
            assert_eq!(token, held, "{query}");
            assert_eq!(at - start, want, "{query}");
        }
    }

    #[test]
    fn hold_requests_are_read_from_the_query() {
        let cap = Duration::from_secs(2);
        assert_eq!(hold_request(None, cap), Ok(None));
        assert_eq!(hold_request(Some("wait=1s"), cap), Ok(None));
        assert_eq!(hold_request(Some("newer_than="), cap), Ok(None));
        assert_eq!(
            hold_request(Some("x=1&newer_than=ab-3&wait=250"), cap),
            Ok(Some(Hold {
                newer_than: "ab-3",
                wait: Duration::from_millis(250)
            }))
        );
        assert_eq!(
            hold_request(Some("newer_than=ab-3&wait=1m30s"), cap),
            Ok(Some(Hold {
                newer_than: "ab-3",
                wait: cap
            }))
        );
    }

    /// Issue 27: `wait=1e308s` panicked the handler (`Duration::from_secs_f64`), as did
    /// every value past `Duration::MAX`. Each such value is refused or capped, never a
    /// panic, with or without `newer_than`.
    #[test]
    fn absurd_waits_are_refused_or_capped_never_a_panic() {
        let cap = Duration::from_secs(2);
        for wait in [
            "1e308s",
            "1e20s",
            "18446744073709551616s",
            "18446744073709551616",
            "99999999999999999999ms",
            "9223372036854775808ns",
            "-1s",
            "-0.5s",
            "NaN",
            "nans",
            "infs",
            "inf",
            "-inf",
            "0x10s",
            "1.5",
            "",
            "soon",
        ] {
            for query in [
                format!("newer_than=a-1&wait={wait}"),
                format!("wait={wait}"),
            ] {
                let read = std::panic::catch_unwind(|| read_hold_query(&query, cap))
                    .unwrap_or_else(|_| panic!("{query} panicked"));
                assert_eq!(read, Err(BadWait(wait.to_string())), "{query}");
            }
        }
        // Readable, however long: the cap.
        for wait in [
            "18446744073709551615",
            "2562047h47m16.854775807s",
            "3600000ms",
            "9223372036s",
        ] {
            let query = format!("newer_than=a-1&wait={wait}");
            assert_eq!(read_hold_query(&query, cap), Ok(Some(cap)), "{query}");
        }
    }

    proptest::proptest! {
        /// The fuzz target's invariants (tests/fuzz/fuzz_targets/long_poll_query.rs) on
        /// queries built from the grammar's pieces: never a panic, never held past the
        /// cap, held only with a token, refused only for a `wait`.
        #[test]
        fn any_query_is_read_within_its_bounds(
            query in "((newer_than|wait|x)=([0-9]{0,22}|[0-9.e+-]{1,8})(ns|us|ms|s|m|h|)(&|)){0,4}"
        ) {
            let cap = Duration::from_secs(2);
            let has_token = query
                .split('&')
                .any(|pair| pair.strip_prefix("newer_than=").is_some_and(|t| !t.is_empty()));
            match read_hold_query(&query, cap) {
                Ok(Some(wait)) => proptest::prop_assert!(wait <= cap && has_token),
                Ok(None) => proptest::prop_assert!(!has_token),
                Err(_) => proptest::prop_assert!(query.split('&').any(|p| p.starts_with("wait="))),
            }
        }
    }

    #[tokio::test]
    async fn an_unreadable_wait_is_a_bad_request() {
        use tower::ServiceExt;
        let store = store();
        let app = router(Arc::new(AppState::new(store.clone(), INTERVAL, false)));
        let held = store.token(1);
        for query in [
            format!("newer_than={held}&wait=1e308s"),
            format!("newer_than={held}&wait=18446744073709551616s"),
            "wait=1e20s".to_string(),
        ] {
            let request = axum::http::Request::get(format!("/metrics?{query}"))
                .body(axum::body::Body::empty())
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
        }
    }

    /// GET `uri` on `app`.
    async fn call(app: &Router, uri: &str) -> Response {
        use tower::ServiceExt;
        let request = axum::http::Request::get(uri)
            .body(axum::body::Body::empty())
            .unwrap();
        app.clone().oneshot(request).await.unwrap()
    }

    /// Issue 27: beyond the cap on held requests a long poll is answered at once with
    /// the client's snapshot, and told to close its HTTP/1.1 connection.
    #[tokio::test(start_paused = true)]
    async fn long_polls_beyond_the_cap_are_answered_at_once() {
        let store = store();
        let app = router(Arc::new(
            AppState::new(store.clone(), INTERVAL, false).with_max_held(1),
        ));
        let uri = format!("/metrics?newer_than={}", store.token(1));
        let first = tokio::spawn({
            let (app, uri) = (app.clone(), uri.clone());
            async move { call(&app, &uri).await }
        });
        tokio::task::yield_now().await;
        let start = tokio::time::Instant::now();
        let second = call(&app, &uri).await;
        assert_eq!(tokio::time::Instant::now(), start, "not held");
        assert_eq!(second.status(), StatusCode::OK);
        assert_eq!(second.headers()[GENERATION_HEADER], store.token(1).as_str());
        assert_eq!(second.headers()[header::CONNECTION], "close");
        assert!(!first.is_finished(), "the first is still held");
        // The held one ends on publication, and its permit goes back.
        store.store(store.load());
        let first = first.await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        assert!(first.headers().get(header::CONNECTION).is_none());
        let third = tokio::spawn({
            let app = app.clone();
            let uri = format!("/metrics?newer_than={}", store.token(2));
            async move { call(&app, &uri).await }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "held again once the cap allows");
    }

    /// Issue 27 (HTTP/2 long polls parking ~2,000 bodies): every body of a snapshot
    /// shares its one rendered buffer, and the bytes each response adds are bounded in
    /// total while unsent.
    #[tokio::test]
    async fn bodies_share_the_snapshot_and_unsent_bytes_are_bounded() {
        use http_body_util::BodyExt;
        let store = store();
        let per_scrape = encode::render_parts(
            &store.load(),
            ScrapeStats::default(),
            Format::Text,
            false,
            false,
        )
        .scrape
        .len();
        let app = router(Arc::new(
            AppState::new(store.clone(), INTERVAL, false)
                .with_unsent_budget(per_scrape * 2 + per_scrape / 2),
        ));
        let mut parked = Vec::new();
        for _ in 0..2 {
            let response = call(&app, "/metrics").await;
            assert_eq!(response.status(), StatusCode::OK);
            parked.push(response.into_body());
        }
        let mut first_chunks = Vec::new();
        for body in &mut parked {
            let frame = body.frame().await.unwrap().unwrap();
            first_chunks.push(frame.into_data().unwrap());
        }
        assert_eq!(
            first_chunks[0].as_ptr(),
            first_chunks[1].as_ptr(),
            "one buffer, not a copy per response"
        );
        let refused = call(&app, "/metrics").await;
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        // Sent in full or dropped, a response gives its bytes back.
        let sent = parked.pop().unwrap().collect().await.unwrap().to_bytes();
        assert!(sent.ends_with(b"\n"));
        assert_eq!(call(&app, "/metrics").await.status(), StatusCode::OK);
        drop(parked);
        for _ in 0..2 {
            let _kept = call(&app, "/metrics").await;
        }
        assert_eq!(call(&app, "/metrics").await.status(), StatusCode::OK);
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

#[cfg(test)]
mod health_tests {
    use super::*;
    use crate::snapshot::{EntitySnapshot, Snapshot};

    fn state_with(edit: impl FnOnce(&mut Snapshot)) -> AppState {
        let plan = Arc::new(
            crate::plan::counters::plan(crate::plan::counters::DEFAULT_COUNTERS, "test")
                .expect("default plan")
                .0,
        );
        let mut snap = Snapshot::empty(plan, Arc::from(""));
        snap.source_up = true;
        snap.last_success = Some((Instant::now(), std::time::SystemTime::now()));
        edit(&mut snap);
        let store = Arc::new(SnapshotStore::new(snap));
        AppState::new(store, Duration::from_secs(1), false)
    }

    fn device(up: bool) -> EntitySnapshot {
        EntitySnapshot {
            labels: Arc::from("gpu=\"0\""),
            copies: None,
            is_gpu: true,
            up,
            last_xid: None,
            xids: Default::default(),
            processes: Vec::new(),
            shares: Vec::new(),
            exporter: None,
        }
    }

    #[test]
    fn health_needs_fresh_data_from_a_served_device() {
        let now = Instant::now();
        let ok = state_with(|s| s.entities = vec![device(false), device(true)]);
        assert_eq!(ok.readiness(now), Ok(()));
        for (state, says) in [
            (state_with(|_| {}), "no GPU to report"),
            (
                state_with(|s| s.entities = vec![device(false)]),
                "every GPU is lost",
            ),
            (
                state_with(|s| {
                    s.entities = vec![device(true)];
                    s.source_hung = true;
                }),
                "the driver is hung",
            ),
            (
                state_with(|s| {
                    s.entities = vec![device(true)];
                    s.last_success = None;
                }),
                "no successful GPU sample yet",
            ),
        ] {
            let why = state.readiness(now).expect_err(says).to_string();
            assert!(why.contains(says), "{why}");
        }
        // A driver that stopped answering a moment ago lists no device: within the
        // staleness grace that is not "no GPU".
        let down = state_with(|s| s.source_up = false);
        assert_eq!(down.readiness(now), Ok(()));
        let stale = down
            .readiness(now + Duration::from_secs(4))
            .unwrap_err()
            .to_string();
        assert!(stale.contains("old"), "{stale}");
    }
}
