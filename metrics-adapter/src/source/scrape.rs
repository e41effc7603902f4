//! The direct source: follow every exporter, keep the latest per-pod values with when
//! they arrived, and publish them atomically in batches.
//!
//! A failed or slow exporter keeps its last values with their old timestamp, so they
//! age out of answers after `--max-staleness` instead of vanishing at the first blip.
//!
//! ## Following each exporter (issue 16)
//!
//! Each target has its own task. A gpu-exporter names the snapshot it serves in the
//! `X-Snapshot-Generation` response header; the task sends that token back as
//! `?newer_than=TOKEN&wait=…`, and the exporter holds the request until it publishes a
//! newer snapshot (or answers `304 Not Modified` once `wait` passes), so every sample
//! reaches the adapter one round trip after the exporter takes it, and each snapshot is
//! fetched and decoded once. A target that sends no token (an older exporter,
//! dcgm-exporter, a plain file server) or answers the same snapshot again without
//! holding is scraped every `--scrape-interval`, as before.
//!
//! Answers are decoded on the blocking pool one at a time and reported to the
//! publisher, which rebuilds the fleet view at most once per [`COALESCE`]: with
//! 1,250 exporters sampling once a second that is ~5 rebuilds a second instead of
//! 1,250, at the cost of at most [`COALESCE`] of extra latency. An answer after a quiet
//! spell is published at once.

use super::derive::{Decoded, pod_values};
use super::limits::{Limits, Rejection};
use crate::error::Error;
use crate::fleet::{Fleet, Observed, PodKey, PodValues};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;

/// The response header in which a gpu-exporter names its snapshot.
pub const GENERATION_HEADER: &str = "x-snapshot-generation";

/// The longest the publisher waits after an answer for more to batch with it.
pub const COALESCE: Duration = Duration::from_millis(200);

/// The least time between the starts of two requests to one exporter, whatever it
/// answers: a target that answers long polls at once cannot make its task spin.
pub const MIN_GAP: Duration = Duration::from_millis(100);

/// Turns a scrape body into series, refusing more than `max_series`.
pub type Decoder = fn(content_type: &str, body: &[u8], max_series: usize) -> Result<Decoded, Error>;

/// One target's answer read: its pods' values, and how many of its series were refused
/// for passing [`super::limits::MAX_LABELS_PER_SERIES`].
pub type TargetValues = (HashMap<PodKey, PodValues>, u64);

/// Turns one target's answer into per-pod values, refusing more than `max_series`
/// series: the exporters' reader is a [`Decoder`] then [`pod_values`]; the serving
/// engines' knows each target's pod and keeps counters across
/// answers for rates. Run on the blocking pool, one answer at a time.
pub type Reader =
    Arc<dyn Fn(&str, &str, &[u8], usize) -> Result<TargetValues, Error> + Send + Sync>;

/// The exporters' reader: `decode`'s series, then each pod's GPU values.
pub fn exporter_reader(decode: Decoder) -> Reader {
    Arc::new(move |_target, content_type, body, max_series| {
        decode(content_type, body, max_series)
            .map(|decoded| (pod_values(&decoded.series), decoded.over_labels))
    })
}

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
    /// What bounds the answers' memory.
    pub limits: Limits,
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
        let password = kube_support::config_file::read_to_string(
            file,
            kube_support::config_file::SECRET_LIMIT,
        )
        .map_err(|e| {
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

/// What one request to an exporter brought.
enum Fetched {
    /// A body, decoded, and the exporter's snapshot token if it sent one.
    Body(Scraped, Option<String>),
    /// A long poll that ended without a newer snapshot.
    Unchanged,
}

/// The exporters' credentials as last read: the `Authorization` header to send (none
/// without basic auth), or unreadable, when no exporter is scraped.
enum Credentials {
    Ready(Option<axum::http::HeaderValue>),
    Unreadable,
}

/// What the per-target tasks share.
struct Follow {
    client: Client,
    opts: ScrapeOptions,
    read: Reader,
    /// One body decoded at a time, on the blocking pool: the CPU work stays within one
    /// core and never queues in front of API requests on the async workers, and only
    /// one decoded body is alive at once.
    decoding: tokio::sync::Semaphore,
    /// The `Authorization` to send, re-read every interval (a rotated Secret applies
    /// without a restart), or why there is none.
    credentials: ArcSwap<Credentials>,
}

/// A token fit to send back in a query string, else none (then the target is polled).
fn usable_token(answer: &super::http_client::Answer) -> Option<String> {
    let token = answer.headers.get(GENERATION_HEADER)?.to_str().ok()?;
    let ok = !token.is_empty()
        && token.len() <= 64
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    ok.then(|| token.to_string())
}

/// One request to `url`: a long poll when `held` names the snapshot we have.
async fn fetch(
    follow: &Follow,
    url: &str,
    held: Option<&str>,
    authorization: Option<&axum::http::HeaderValue>,
) -> Result<Fetched, Error> {
    let opts = &follow.opts;
    let (uri, timeout) = match held {
        Some(token) => {
            let join = if url.contains('?') { '&' } else { '?' };
            // The exporter holds up to `wait`; the timeout covers the hold and a scrape.
            let wait = opts.interval;
            (
                format!("{url}{join}newer_than={token}&wait={}ms", wait.as_millis()),
                wait + opts.timeout,
            )
        }
        None => (url.to_string(), opts.timeout),
    };
    let mut request =
        axum::http::Request::get(uri.as_str()).header(axum::http::header::ACCEPT, opts.accept);
    if let Some(value) = authorization {
        request = request.header(axum::http::header::AUTHORIZATION, value);
    }
    let answer = super::http_client::get(&follow.client, request, &opts.limits, timeout).await?;
    let (at, seen) = (SystemTime::now(), Instant::now());
    if held.is_some() && answer.status == axum::http::StatusCode::NOT_MODIFIED {
        return Ok(Fetched::Unchanged);
    }
    if !answer.status.is_success() {
        return Err(Error::Scrape(format!("HTTP {}", answer.status)));
    }
    let token = usable_token(&answer);
    // The body stays in the in-flight budget until it is decoded.
    let (content_type, body, _budget) = (answer.content_type, answer.body, answer.budget);
    let _permit = follow
        .decoding
        .acquire()
        .await
        .map_err(|_| Error::Scrape("shutting down".into()))?;
    let read = follow.read.clone();
    let (max_series, max_pods) = (
        opts.limits.max_series_per_target,
        opts.limits.max_pods_per_target,
    );
    let target = url.to_string();
    let (pods, over_labels) =
        tokio::task::spawn_blocking(move || read(&target, &content_type, &body, max_series))
            .await
            .map_err(|e| Error::Scrape(format!("decoding failed: {e}")))??;
    opts.metrics.series_over_labels(over_labels);
    if pods.len() > max_pods {
        return Err(Error::OverLimit {
            reason: Rejection::PodLimit,
            message: format!(
                "the exporter reports {} pods, more than the {max_pods} allowed (--max-pods-per-target)",
                pods.len()
            ),
        });
    }
    Ok(Fetched::Body((pods, at, seen), token))
}

/// Follow one exporter until the task is aborted, reporting every answer or failure.
async fn follow_target(
    url: String,
    follow: Arc<Follow>,
    reports: mpsc::UnboundedSender<(String, Result<Scraped, Error>)>,
) {
    let interval = follow.opts.interval;
    let mut held: Option<String> = None;
    loop {
        let started = tokio::time::Instant::now();
        let credentials = follow.credentials.load_full();
        let Credentials::Ready(authorization) = credentials.as_ref() else {
            // The publisher says why once; the values age out meanwhile.
            tokio::time::sleep_until(started + interval).await;
            continue;
        };
        let next = match fetch(&follow, &url, held.as_deref(), authorization.as_ref()).await {
            Ok(Fetched::Unchanged) => {
                follow.opts.metrics.scraped_unchanged();
                started + MIN_GAP
            }
            Ok(Fetched::Body(scraped, token)) => {
                // A new snapshot: ask for the next one straight away. No token, or the
                // same one again unasked-for held: this target is polled.
                let newer = token.is_some() && token != held;
                held = token;
                if reports.send((url.clone(), Ok(scraped))).is_err() {
                    return;
                }
                if newer {
                    started + MIN_GAP
                } else {
                    started + interval
                }
            }
            Err(e) => {
                held = None;
                if reports.send((url.clone(), Err(e))).is_err() {
                    return;
                }
                started + interval
            }
        };
        tokio::time::sleep_until(next).await;
    }
}

/// The scrape client for `opts` (http, or https with its TLS options); fails on an
/// unreadable CA file or a bad server name, so startup can say so.
pub fn client(opts: &ScrapeOptions) -> Result<Client, Error> {
    super::http_client::client(&opts.auth.tls, Some(opts.interval * 4))
}

/// Follow every exporter with `client` (from [`client`]), publishing into `store` in
/// batches; the targets and credentials are re-read every interval.
pub async fn run(opts: ScrapeOptions, client: Client, decode: Decoder, store: Arc<ArcSwap<Fleet>>) {
    run_with(opts, client, exporter_reader(decode), store).await
}

/// [`run`] with any [`Reader`]: the same following, limits, staleness and
/// self-metrics for every kind of target.
pub async fn run_with(
    opts: ScrapeOptions,
    client: Client,
    read: Reader,
    store: Arc<ArcSwap<Fleet>>,
) {
    // Per target: its pods and when, kept across answers so a failure ages them out.
    let mut per_target: HashMap<String, Scraped> = HashMap::new();
    // Failing targets, with the limit they passed if that is why: logged again only
    // when that changes.
    let mut failing: HashMap<String, Option<Rejection>> = HashMap::new();
    let mut credentials_error: Option<String> = None;
    let mut last_answer = None;
    let mut tasks: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let (reports_tx, mut reports) = mpsc::unbounded_channel();
    let follow = Arc::new(Follow {
        client,
        opts: opts.clone(),
        read,
        decoding: tokio::sync::Semaphore::new(1),
        credentials: ArcSwap::from_pointee(Credentials::Ready(None)),
    });
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut targets = opts.targets.load_full();
    // When the oldest unpublished answer arrived, if any.
    let mut pending: Option<tokio::time::Instant> = None;
    let mut last_publish = tokio::time::Instant::now() - COALESCE;
    loop {
        let publish_at = pending.map(|_| last_publish + COALESCE);
        tokio::select! {
            _ = ticker.tick() => {
                let credentials = match opts.auth.authorization() {
                    Ok(header) => {
                        credentials_error = None;
                        Credentials::Ready(header)
                    }
                    Err(e) => {
                        // Without credentials every exporter would answer 401: say why
                        // once, and let the values age out.
                        let e = e.to_string();
                        if credentials_error.as_ref() != Some(&e) {
                            tracing::warn!(error = %e, "cannot scrape the exporters");
                            credentials_error = Some(e);
                        }
                        Credentials::Unreadable
                    }
                };
                follow.credentials.store(Arc::new(credentials));
                targets = opts.targets.load_full();
                // Exporters that left (pod deleted, node drained) take their pods with them.
                let current: std::collections::HashSet<&str> =
                    targets.iter().map(String::as_str).collect();
                tasks.retain(|url, task| {
                    let keep = current.contains(url.as_str());
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                for url in targets.iter() {
                    if !tasks.contains_key(url) {
                        let task = tokio::spawn(follow_target(
                            url.clone(),
                            follow.clone(),
                            reports_tx.clone(),
                        ));
                        tasks.insert(url.clone(), task);
                    }
                }
                let before = per_target.len() + failing.len();
                per_target.retain(|url, _| current.contains(url.as_str()));
                failing.retain(|url, _| current.contains(url.as_str()));
                if per_target.len() + failing.len() != before || store.load().targets != targets.len() {
                    pending.get_or_insert_with(tokio::time::Instant::now);
                }
                continue;
            }
            report = reports.recv() => {
                let Some((url, result)) = report else { return };
                // An answer from a target that has just left is dropped.
                if tasks.contains_key(&url) {
                    record(&opts, &mut per_target, &mut failing, &mut last_answer, url, result);
                    pending.get_or_insert_with(tokio::time::Instant::now);
                }
                if publish_at.is_none_or(|at| tokio::time::Instant::now() < at) {
                    continue;
                }
            }
            _ = async {
                match publish_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        let first = pending.take();
        last_publish = tokio::time::Instant::now();
        publish(&store, &per_target, &failing, targets.len(), last_answer);
        if let Some(first) = first {
            opts.metrics.round_took(last_publish - first);
        }
    }
}

/// Note one target's answer or failure.
fn record(
    opts: &ScrapeOptions,
    per_target: &mut HashMap<String, Scraped>,
    failing: &mut HashMap<String, Option<Rejection>>,
    last_answer: &mut Option<Instant>,
    url: String,
    result: Result<Scraped, Error>,
) {
    // The fleet-wide pod budget: the pods every other target holds, plus these.
    let result = result.and_then(|scraped| {
        let others: usize = per_target
            .iter()
            .filter(|(u, _)| **u != url)
            .map(|(_, (pods, _, _))| pods.len())
            .sum();
        if others + scraped.0.len() > opts.limits.max_pods {
            return Err(Error::OverLimit {
                reason: Rejection::PodBudget,
                message: format!(
                    "its {} pods would hold more than the {} pods allowed over all exporters (--max-pods)",
                    scraped.0.len(),
                    opts.limits.max_pods
                ),
            });
        }
        Ok(scraped)
    });
    opts.metrics.scraped(result.is_ok());
    if let Err(Error::OverLimit { reason, .. }) = &result {
        opts.metrics.rejected(*reason);
    }
    match result {
        Ok(scraped) => {
            *last_answer = Some(scraped.2);
            if failing.remove(&url).is_some() {
                tracing::info!(target = %url, "exporter answers again");
            }
            per_target.insert(url, scraped);
        }
        Err(e) => {
            let over = match &e {
                Error::OverLimit { reason, .. } => Some(*reason),
                _ => None,
            };
            if failing.get(&url) != Some(&over) {
                match over {
                    Some(reason) => {
                        tracing::warn!(target = %url, reason = reason.label(), error = %e, "exporter answer refused: over a memory limit; its pods' values age out after the staleness limit")
                    }
                    None => {
                        tracing::warn!(target = %url, error = %e, "exporter scrape failed; its pods' values age out after the staleness limit")
                    }
                }
            }
            failing.insert(url, over);
        }
    }
}

/// Swap in a new fleet view built from every target's latest answer.
fn publish(
    store: &ArcSwap<Fleet>,
    per_target: &HashMap<String, Scraped>,
    failing: &HashMap<String, Option<Rejection>>,
    targets: usize,
    last_answer: Option<Instant>,
) {
    // Gathered, then built at once: the map is bulk-built from the sorted entries in
    // nodes of its final size, never grown insert by insert (a map growing its way up
    // to 100,000 pods leaves the sizes it passed through to the allocator, at every
    // publication).
    let mut entries = Vec::with_capacity(per_target.values().map(|(v, _, _)| v.len()).sum());
    for (values, at, seen) in per_target.values() {
        for (pod, v) in values {
            entries.push((
                pod.clone(),
                Observed {
                    values: v.clone(),
                    at: *at,
                    seen: *seen,
                },
            ));
        }
    }
    let pods = entries.into_iter().collect();
    let answered = per_target
        .keys()
        .filter(|u| !failing.contains_key(*u))
        .count();
    store.store(Arc::new(Fleet {
        pods,
        targets,
        answered,
        last_answer,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::GpuMetric;
    use crate::source::derive::Series;
    use axum::extract::{RawQuery, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use std::sync::Mutex;

    /// A test exporter: one pod's GPU utilisation, published as numbered generations.
    #[derive(Default)]
    struct Exporter {
        /// (generation, utilisation)
        current: Mutex<(u64, u64)>,
        published: tokio::sync::Notify,
        /// How it answers: with tokens and holds, tokens without holds, or plain.
        tokens: bool,
        holds: bool,
        /// Query strings of every request.
        queries: Mutex<Vec<String>>,
    }

    impl Exporter {
        fn publish(&self, util: u64) {
            let mut current = self.current.lock().unwrap();
            *current = (current.0 + 1, util);
            self.published.notify_waiters();
        }

        fn requests(&self) -> Vec<String> {
            self.queries.lock().unwrap().clone()
        }
    }

    async fn serve(State(ex): State<Arc<Exporter>>, RawQuery(query): RawQuery) -> Response {
        let query = query.unwrap_or_default();
        ex.queries.lock().unwrap().push(query.clone());
        let held = query
            .split('&')
            .find_map(|p| p.strip_prefix("newer_than="))
            .map(str::to_string);
        if ex.holds && held == Some(ex.current.lock().unwrap().0.to_string()) {
            let woke = ex.published.notified();
            if tokio::time::timeout(Duration::from_secs(5), woke)
                .await
                .is_err()
            {
                return StatusCode::NOT_MODIFIED.into_response();
            }
        }
        let (generation, util) = *ex.current.lock().unwrap();
        let mut response = util.to_string().into_response();
        if ex.tokens {
            response
                .headers_mut()
                .insert(GENERATION_HEADER, generation.to_string().parse().unwrap());
        }
        response
    }

    /// The body is the utilisation of GPU-0, held by pod ml/a.
    fn decode(_: &str, body: &[u8], _: usize) -> Result<Decoded, Error> {
        let value = std::str::from_utf8(body).unwrap().parse().unwrap();
        let series = vec![Series {
            name: "DCGM_FI_DEV_GPU_UTIL".into(),
            labels: [("UUID", "GPU-0"), ("namespace", "ml"), ("pod", "a")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            value,
        }];
        Ok(Decoded {
            series,
            over_labels: 0,
            duplicates: 0,
        })
    }

    /// An exporter answering as `ex` says, followed by the real loop at `interval`.
    async fn follow(ex: Arc<Exporter>, interval: Duration) -> Arc<ArcSwap<Fleet>> {
        follow_within(ex, interval, Limits::default(), Default::default()).await
    }

    /// [`follow`] within `limits`, counting into `metrics`.
    async fn follow_within(
        ex: Arc<Exporter>,
        interval: Duration,
        limits: Limits,
        metrics: crate::source::SourceMetrics,
    ) -> Arc<ArcSwap<Fleet>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/metrics", axum::routing::get(serve))
            .with_state(ex);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let opts = ScrapeOptions {
            targets: Arc::new(ArcSwap::from_pointee(vec![url])),
            interval,
            timeout: Duration::from_secs(5),
            accept: "*/*",
            auth: ExporterAuth::default(),
            metrics,
            limits,
        };
        let fleet = Arc::new(ArcSwap::from_pointee(Fleet::default()));
        let client = client(&opts).unwrap();
        tokio::spawn(run(opts, client, decode, fleet.clone()));
        fleet
    }

    fn utilization(fleet: &ArcSwap<Fleet>) -> Option<f64> {
        let key = ("ml".to_string(), "a".to_string());
        fleet
            .load()
            .pods
            .get(&key)?
            .values
            .values
            .get(&GpuMetric::Utilization)
            .copied()
    }

    async fn until_utilization(fleet: &ArcSwap<Fleet>, want: f64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while utilization(fleet) != Some(want) {
            assert!(tokio::time::Instant::now() < deadline, "never saw {want}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// With an hour between polls, only the long poll can bring new samples in: each
    /// publication reaches the fleet view, and each request names the snapshot held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_polling_exporter_delivers_every_publication() {
        let ex = Arc::new(Exporter {
            tokens: true,
            holds: true,
            ..Exporter::default()
        });
        ex.publish(10);
        let fleet = follow(ex.clone(), Duration::from_secs(3600)).await;
        until_utilization(&fleet, 10.0).await;
        for util in 11..16 {
            // Publish only once the adapter's request for the next snapshot is held.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            let generation = ex.current.lock().unwrap().0;
            while !ex
                .requests()
                .iter()
                .any(|q| q.starts_with(&format!("newer_than={generation}&")))
            {
                assert!(tokio::time::Instant::now() < deadline, "no held request");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            ex.publish(util);
            until_utilization(&fleet, util as f64).await;
        }
        let requests = ex.requests();
        assert_eq!(requests[0], "", "the first request is a plain scrape");
        assert!(
            requests[1..].iter().all(|q| q.contains("&wait=3600000ms")),
            "{requests:?}"
        );
    }

    /// Exporters without the protocol are scraped every interval and never sent a token;
    /// one that sends tokens but answers at once is not asked again before the interval.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exporters_without_long_polls_are_scraped_every_interval() {
        for tokens in [false, true] {
            let ex = Arc::new(Exporter {
                tokens,
                holds: false,
                ..Exporter::default()
            });
            ex.publish(20);
            let interval = Duration::from_millis(200);
            let started = tokio::time::Instant::now();
            let fleet = follow(ex.clone(), interval).await;
            until_utilization(&fleet, 20.0).await;
            ex.publish(21);
            until_utilization(&fleet, 21.0).await;
            ex.publish(22);
            until_utilization(&fleet, 22.0).await;
            let requests = ex.requests();
            let bound = (started.elapsed().as_secs_f64() / interval.as_secs_f64()) as usize + 2;
            assert!(
                requests.len() <= bound,
                "tokens {tokens}: {} requests in {:?}",
                requests.len(),
                started.elapsed()
            );
            if !tokens {
                assert!(requests.iter().all(String::is_empty), "{requests:?}");
            }
        }
    }

    /// An exporter reporting more pods than --max-pods-per-target is refused, counted
    /// by reason, and never reaches the fleet view; within the limit it does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_exporter_over_the_pod_limit_is_refused_and_counted() {
        for (max_pods_per_target, served) in [(0, false), (1, true)] {
            let ex = Arc::new(Exporter::default());
            ex.publish(30);
            let metrics = crate::source::SourceMetrics::default();
            let limits = Limits::new(1 << 20, 1 << 20, 100, max_pods_per_target, 100).unwrap();
            let fleet =
                follow_within(ex, Duration::from_millis(100), limits, metrics.clone()).await;
            if served {
                until_utilization(&fleet, 30.0).await;
                assert_eq!(metrics.rejections(Rejection::PodLimit), 0);
            } else {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                while metrics.rejections(Rejection::PodLimit) < 2 {
                    assert!(tokio::time::Instant::now() < deadline, "never refused");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                assert_eq!(utilization(&fleet), None);
            }
        }
    }

    fn pods(names: &[&str]) -> Scraped {
        let pods = names
            .iter()
            .map(|n| (("ml".to_string(), n.to_string()), PodValues::default()))
            .collect();
        (pods, SystemTime::now(), Instant::now())
    }

    /// The fleet-wide pod budget counts every other target's pods, not the target's own
    /// earlier answer: an answer that would pass it is refused, the earlier one kept
    /// (to age out), and it is logged again only when the reason changes.
    #[test]
    fn an_answer_past_the_fleet_pod_budget_is_refused() {
        let metrics = crate::source::SourceMetrics::default();
        let opts = ScrapeOptions {
            targets: Arc::new(ArcSwap::from_pointee(vec![])),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            accept: "*/*",
            auth: ExporterAuth::default(),
            metrics: metrics.clone(),
            limits: Limits::new(1 << 20, 1 << 20, 100, 100, 3).unwrap(),
        };
        let (mut per_target, mut failing, mut last) = (HashMap::new(), HashMap::new(), None);
        let mut record = |url: &str, scraped: Scraped| {
            record(
                &opts,
                &mut per_target,
                &mut failing,
                &mut last,
                url.into(),
                Ok(scraped),
            );
            (per_target.clone(), failing.clone())
        };
        record("a", pods(&["a1", "a2"]));
        // b's own earlier answer does not count against it.
        record("b", pods(&["b1"]));
        let (held, failing_now) = record("b", pods(&["b1"]));
        assert_eq!(held.values().map(|p| p.0.len()).sum::<usize>(), 3);
        assert!(failing_now.is_empty());
        let (held, failing_now) = record("b", pods(&["b1", "b2"]));
        assert_eq!(
            held["b"].0.len(),
            1,
            "the earlier answer is kept to age out"
        );
        assert_eq!(failing_now.get("b"), Some(&Some(Rejection::PodBudget)));
        assert_eq!(metrics.rejections(Rejection::PodBudget), 1);
    }
}
