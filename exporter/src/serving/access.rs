//! Who may use the HTTP endpoints, as the web config says: basic authentication against
//! bcrypt hashes, the client-certificate SAN allow-list, exporter-toolkit's rate limit
//! and extra response headers; and reloading all of it, certificates included, when the
//! web config file or a file it names changes.
//!
//! `/healthz` and `/readyz` need no credentials and are not rate limited: kubelet
//! probes cannot send credentials, and a throttled probe restarts the pod. They reveal
//! only that the process runs and whether its GPU data is fresh.

use crate::serving::web_config::{RateLimit, WebConfig};
use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lru::LruCache;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tls_serving::{PeerCertificates, RemoteAddr, TlsConfigHandle};
use tokio::sync::Semaphore;

/// Paths served without credentials and without rate limiting, for kubelet probes.
pub const UNAUTHENTICATED_PATHS: &[&str] = &["/healthz", "/readyz", "/health"];

/// How often the web config file and the certificate, key and CA files it names are
/// compared with what is being served. exporter-toolkit re-reads them on every
/// connection and request; polling keeps file reads off the request path. 2 s is far
/// below the delay with which a rotated Kubernetes Secret reaches a pod (the kubelet
/// syncs mounted Secrets about once a minute), so rotation adds at most 2 s to it, for
/// one read of a few small files every 2 s.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Verified credentials remembered per (user, password) pair: a bcrypt check costs
/// 50–250 ms of CPU at the usual costs, and Prometheus sends the same credentials every
/// scrape. Unlike exporter-toolkit, failures are not remembered, so a flood of wrong
/// passwords cannot evict the real ones and push Prometheus behind the bcrypt queue.
/// A reload keeps the entries of users whose hash it does not change (a certificate
/// rotation rewrites the file with the same users).
const VERDICT_CACHE_ENTRIES: usize = 100;

/// Requests that may wait for the one bcrypt slot, per lane (see [`Lane`]); more are
/// answered 429 at once, so a flood queues at most this many checks, and holds no
/// memory or sockets waiting.
const BCRYPT_QUEUE: usize = 8;

/// How long a client whose password check failed waits in the failing lane: its
/// checks no longer go ahead of those of clients that have not failed. An attacker
/// gets one check in the clean lane per address per this long; a user who mistyped
/// is served in the failing lane meanwhile.
const FAILING_FOR: Duration = Duration::from_secs(600);

/// Failed password checks a client may make at once, and how fast its allowance grows
/// back: 10, then one every 6 s. Past that it is answered 429 with `Retry-After` before
/// any bcrypt work, so one client cannot keep the bcrypt slot busy; its verified
/// credentials (from the cache) still work, so a scraper behind the same address keeps
/// scraping.
const CLIENT_FAILURE_BURST: u32 = 10;
const CLIENT_FAILURE_REFILL: Duration = Duration::from_secs(6);

/// Clients whose failures are tracked: least recently seen forgotten first, so the
/// table stays near 0.5 MiB (about 125 bytes a client with the LRU links and hash
/// slot) whatever the number of addresses. A forgotten client
/// starts again with a full allowance; an attacker needs this many addresses to make
/// that happen, and each of them still gets only its own allowance.
const CLIENT_TABLE_ENTRIES: usize = 4096;

/// Checks one client may have waiting for or holding the bcrypt slot: the shared queue
/// is shared between clients instead of filled by one.
const CLIENT_QUEUE_SHARE: u32 = 1;

/// The bcrypt cost of the decoy check for unknown users when the configured hashes give
/// none (exporter-toolkit's decoy hash is cost 10).
const DEFAULT_DECOY_COST: u32 = 10;

/// The current access policy, swapped whole on reload.
pub struct Guard {
    policy: ArcSwap<Policy>,
    /// One bcrypt check at a time, as exporter-toolkit's mutex: a flood of wrong
    /// passwords costs at most one core, and never an async worker. FIFO.
    bcrypt: Semaphore,
    /// Held by the failing lane's request waiting for or holding `bcrypt`, so at most
    /// one of them is ever in `bcrypt`'s queue: a clean request waits for at most one
    /// failing check, whatever the flood.
    failing_gate: Semaphore,
    /// Requests holding or waiting for `bcrypt`, per lane ([`Lane::index`]).
    bcrypt_queue: [std::sync::atomic::AtomicUsize; 2],
    /// Per client: failed checks and checks in the queue. Kept across reloads, so a
    /// reload does not hand a flooding client a new allowance.
    clients: Mutex<LruCache<IpAddr, ClientState>>,
    /// Logs answers of 429 once per streak, per cause.
    busy_log: tls_serving::RefusalStreak,
    limited_log: tls_serving::RefusalStreak,
}

/// One client's standing with the password check.
struct ClientState {
    /// Failed checks allowed; one is taken per failure.
    failures: TokenBucket,
    /// Its requests waiting for or holding the bcrypt slot.
    queued: u32,
    /// When its last check failed.
    failed_at: Option<Instant>,
}

/// Which queue a bcrypt check waits in. Clients that have not failed a check for
/// [`FAILING_FOR`] go ahead of those that have, so a flood of wrong passwords, once
/// each of its addresses has failed, cannot keep a credential not yet verified (a
/// restarted Prometheus, a new user) waiting: the clean lane waits for at most one
/// failing check (see `Guard::failing_gate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Clean,
    Failing,
}

impl Lane {
    fn index(self) -> usize {
        match self {
            Lane::Clean => 0,
            Lane::Failing => 1,
        }
    }
}

/// The key a client is tracked by: its IPv4 address, or the /64 of its IPv6 address (one
/// host usually holds a whole /64). IPv4-mapped IPv6 addresses count as IPv4.
fn client_key(remote: Option<&RemoteAddr>) -> IpAddr {
    match remote.map(|r| r.0.ip()) {
        None => IpAddr::from([0, 0, 0, 0]),
        Some(IpAddr::V4(v4)) => IpAddr::V4(v4),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

/// What authentication decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Denied,
    /// The bcrypt queue, or this client's share of it, is full: try again later.
    Busy,
    /// This client has used up its failed attempts: try again after this long.
    Limited(Duration),
}

struct Policy {
    users: BTreeMap<String, String>,
    /// Unknown users cost one bcrypt at this cost (the highest configured), so response
    /// time does not tell which user names exist.
    decoy_cost: u32,
    verdicts: Mutex<LruCache<(String, Vec<u8>), bool>>,
    headers: Vec<(HeaderName, HeaderValue)>,
    allowed_sans: Option<Vec<String>>,
    limiter: Option<Mutex<TokenBucket>>,
}

impl Policy {
    /// The policy of `config`, keeping `previous`'s verified credentials of the users
    /// whose hash is unchanged.
    fn with_verdicts_of(config: &WebConfig, previous: &Policy) -> Policy {
        let policy = Policy::new(config);
        if let (Ok(old), Ok(mut new)) = (previous.verdicts.lock(), policy.verdicts.lock()) {
            // Least recently used first, so the order carries over.
            for ((user, password), verdict) in old.iter().rev() {
                let same_hash = previous
                    .users
                    .get(user)
                    .is_some_and(|hash| policy.users.get(user) == Some(hash));
                if same_hash {
                    new.put((user.clone(), password.clone()), *verdict);
                }
            }
        }
        policy
    }

    fn new(config: &WebConfig) -> Policy {
        Policy {
            users: config.users.clone(),
            decoy_cost: config
                .users
                .values()
                .filter_map(|h| crate::serving::web_config::bcrypt_cost(h))
                .max()
                .unwrap_or(DEFAULT_DECOY_COST),
            verdicts: Mutex::new(LruCache::new(
                NonZeroUsize::new(VERDICT_CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN),
            )),
            headers: config.headers.clone(),
            allowed_sans: config
                .tls
                .as_ref()
                .and_then(|t| t.client_allowed_sans.clone()),
            limiter: config
                .rate_limit
                .map(|r| Mutex::new(TokenBucket::new(r, Instant::now()))),
        }
    }

    /// Whether these credentials were verified under this configuration.
    fn verified(&self, key: &(String, Vec<u8>)) -> bool {
        self.verdicts
            .lock()
            .is_ok_and(|mut cache| cache.get(key) == Some(&true))
    }

    /// Remember credentials that passed; failures are never cached (see
    /// `VERDICT_CACHE_ENTRIES`).
    fn remember(&self, key: (String, Vec<u8>), verdict: bool) {
        if verdict && let Ok(mut cache) = self.verdicts.lock() {
            cache.put(key, true);
        }
    }

    /// The bcrypt check; blocking, tens to hundreds of milliseconds.
    fn verify(&self, user: &str, password: &[u8]) -> bool {
        match self.users.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                // The same work as a real check, for a user that does not exist.
                let _ = bcrypt::hash_with_salt(password, self.decoy_cost, [0x5a; 16]);
                false
            }
        }
    }

    fn allow_rate(&self, now: Instant) -> bool {
        match &self.limiter {
            None => true,
            Some(bucket) => bucket.lock().map(|mut b| b.take(now)).unwrap_or(true),
        }
    }

    fn san_allowed(&self, peer: Option<&PeerCertificates>) -> bool {
        let Some(allowed) = &self.allowed_sans else {
            return true;
        };
        let Some(leaf) = peer.and_then(|p| p.0.first()) else {
            return false;
        };
        certificate_sans(leaf)
            .iter()
            .any(|san| allowed.contains(san))
    }
}

impl Guard {
    pub fn new(config: &WebConfig) -> Guard {
        Guard {
            policy: ArcSwap::from_pointee(Policy::new(config)),
            bcrypt: Semaphore::new(1),
            failing_gate: Semaphore::new(1),
            bcrypt_queue: Default::default(),
            clients: Mutex::new(LruCache::new(
                NonZeroUsize::new(CLIENT_TABLE_ENTRIES).unwrap_or(NonZeroUsize::MIN),
            )),
            busy_log: tls_serving::RefusalStreak::new(tls_serving::STREAK_GAP),
            limited_log: tls_serving::RefusalStreak::new(tls_serving::STREAK_GAP),
        }
    }

    /// Before a bcrypt check: whether `client` may make one now, and if so its place in
    /// its share of the queue (released by [`Guard::leave_client_queue`]) and its lane.
    fn enter_client_queue(&self, client: IpAddr, now: Instant) -> Result<Lane, Verdict> {
        let Ok(mut clients) = self.clients.lock() else {
            return Ok(Lane::Failing);
        };
        let state = clients.get_or_insert_mut(client, || ClientState {
            failures: TokenBucket::new(
                RateLimit {
                    interval: CLIENT_FAILURE_REFILL,
                    burst: CLIENT_FAILURE_BURST,
                },
                now,
            ),
            queued: 0,
            failed_at: None,
        });
        if let Some(wait) = state.failures.wait_for_token(now) {
            return Err(Verdict::Limited(wait));
        }
        if state.queued >= CLIENT_QUEUE_SHARE {
            return Err(Verdict::Busy);
        }
        state.queued += 1;
        let failing = state
            .failed_at
            .is_some_and(|at| now.saturating_duration_since(at) < FAILING_FOR);
        Ok(if failing { Lane::Failing } else { Lane::Clean })
    }

    /// After a bcrypt check (or a request that gave up waiting): the client leaves its
    /// share of the queue, and a failure takes one of its allowed attempts.
    fn leave_client_queue(&self, client: IpAddr, failed: bool, now: Instant) {
        if let Ok(mut clients) = self.clients.lock()
            && let Some(state) = clients.get_mut(&client)
        {
            state.queued = state.queued.saturating_sub(1);
            if failed {
                state.failures.take(now);
                state.failed_at = Some(now);
            }
        }
    }

    /// Apply a reloaded configuration (users, headers, SANs, rate limit). Credentials
    /// verified under the previous one stay verified while their user's hash is the same.
    pub fn update(&self, config: &WebConfig) {
        let previous = self.policy.load_full();
        self.policy
            .store(Arc::new(Policy::with_verdicts_of(config, &previous)));
    }

    /// Verified credentials pass at once. Anything else needs a bcrypt check: first the
    /// client's own limits (its failed attempts, its share of the queue), then its
    /// lane's bounded queue for the one bcrypt slot.
    async fn authenticate(
        &self,
        policy: Arc<Policy>,
        client: IpAddr,
        user: String,
        password: Vec<u8>,
    ) -> Verdict {
        use std::sync::atomic::Ordering;
        let key = (user, password);
        if policy.verified(&key) {
            return Verdict::Allowed;
        }
        let lane = match self.enter_client_queue(client, Instant::now()) {
            Ok(lane) => lane,
            Err(verdict) => return verdict,
        };
        // Leaves the client's share and its lane's queue however this future ends (a
        // client that hangs up drops it); a failed check counts against the client.
        struct Leave<'a> {
            guard: &'a Guard,
            client: IpAddr,
            in_queue: Option<Lane>,
            failed: bool,
        }
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if let Some(lane) = self.in_queue {
                    self.guard.bcrypt_queue[lane.index()].fetch_sub(1, Ordering::AcqRel);
                }
                self.guard
                    .leave_client_queue(self.client, self.failed, Instant::now());
            }
        }
        let mut leave = Leave {
            guard: self,
            client,
            in_queue: None,
            failed: false,
        };
        let queue = &self.bcrypt_queue[lane.index()];
        if queue.fetch_add(1, Ordering::AcqRel) >= BCRYPT_QUEUE {
            queue.fetch_sub(1, Ordering::AcqRel);
            return Verdict::Busy;
        }
        leave.in_queue = Some(lane);
        // Held until the check is done (dropped after `_permit`).
        let _gate = match lane {
            Lane::Clean => None,
            Lane::Failing => match self.failing_gate.acquire().await {
                Ok(gate) => Some(gate),
                Err(_) => return Verdict::Denied,
            },
        };
        let Ok(_permit) = self.bcrypt.acquire().await else {
            return Verdict::Denied;
        };
        // Another request with the same credentials may have verified them meanwhile.
        if policy.verified(&key) {
            return Verdict::Allowed;
        }
        let allowed = tokio::task::spawn_blocking(move || {
            let verdict = policy.verify(&key.0, &key.1);
            policy.remember(key, verdict);
            verdict
        })
        .await
        .unwrap_or(false);
        leave.failed = !allowed;
        if allowed {
            Verdict::Allowed
        } else {
            Verdict::Denied
        }
    }
}

/// `router` behind the guard: every route and the fallback (so an unknown path asks for
/// credentials too, as exporter-toolkit's handler does).
pub fn protect(router: Router, guard: Arc<Guard>) -> Router {
    router
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn_with_state(guard, check))
}

async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let policy = guard.policy.load_full();
    let open = UNAUTHENTICATED_PATHS.contains(&request.uri().path());
    let mut response = if !open && !policy.allow_rate(Instant::now()) {
        plain_text(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n")
    } else if !policy.san_allowed(request.extensions().get::<PeerCertificates>()) {
        tracing::debug!("client certificate has none of the allowed SANs");
        plain_text(
            StatusCode::FORBIDDEN,
            "Forbidden: the client certificate has none of the allowed SANs\n",
        )
    } else if open || policy.users.is_empty() {
        next.run(request).await
    } else {
        let client = client_key(request.extensions().get::<RemoteAddr>());
        let verdict = match basic_credentials(request.headers()) {
            Some((user, password)) => {
                guard
                    .authenticate(policy.clone(), client, user, password)
                    .await
            }
            None => Verdict::Denied,
        };
        match verdict {
            Verdict::Allowed => next.run(request).await,
            Verdict::Busy => {
                if guard.busy_log.begins(Instant::now()) {
                    tracing::warn!(
                        %client,
                        queue = BCRYPT_QUEUE,
                        "password checks refused with 429: the bcrypt queue is full (a flood of credentials not verified yet?); logged once per streak"
                    );
                }
                too_many_requests(Duration::from_secs(1))
            }
            Verdict::Limited(wait) => {
                if guard.limited_log.begins(Instant::now()) {
                    tracing::warn!(
                        %client,
                        allowed_failures = CLIENT_FAILURE_BURST,
                        "password checks refused with 429: a client used up its failed attempts; logged once per streak"
                    );
                }
                too_many_requests(wait)
            }
            Verdict::Denied => {
                let mut r = plain_text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
                r
            }
        }
    };
    // As exporter-toolkit: the configured headers go on every answer, unless the
    // handler set that header itself.
    for (name, value) in &policy.headers {
        if !response.headers().contains_key(name) {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
}

/// 429 with `Retry-After` in whole seconds (at least 1).
fn too_many_requests(wait: Duration) -> Response {
    let mut r = plain_text(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n");
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    r
}

/// A plain-text answer (`nosniff`: never read as anything else), shared by every
/// answer of the listener that is not an exposition.
pub(super) fn plain_text(status: StatusCode, body: impl IntoResponse) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

/// `Authorization: Basic base64(user:password)`, as Go's `Request.BasicAuth` reads it.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, Vec<u8>)> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let prefix = b"basic ";
    if value.len() < prefix.len() || !value[..prefix.len()].eq_ignore_ascii_case(prefix) {
        return None;
    }
    let decoded = base64_decode(&value[prefix.len()..])?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

/// Standard base64 with padding (Go's `base64.StdEncoding`, which `Request.BasicAuth`
/// uses).
fn base64_decode(input: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(input).ok()
}

/// A certificate's subject alternative names as Go prints them: DNS names, e-mail
/// addresses, IP addresses and URIs.
fn certificate_sans(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                Some((*s).to_string())
            }
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes)
                    .ok()
                    .map(|b| std::net::Ipv4Addr::from(b).to_string()),
                16 => <[u8; 16]>::try_from(*bytes)
                    .ok()
                    .map(|b| std::net::Ipv6Addr::from(b).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Go's `rate.Limiter`: starts full with `burst` tokens, one more every `interval`.
struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_second: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(limit: RateLimit, now: Instant) -> TokenBucket {
        TokenBucket {
            tokens: f64::from(limit.burst),
            burst: f64::from(limit.burst),
            per_second: 1.0 / limit.interval.as_secs_f64(),
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
    }

    /// `None` when a token is there now; else how long until one is.
    fn wait_for_token(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        (self.tokens < 1.0).then(|| Duration::from_secs_f64((1.0 - self.tokens) / self.per_second))
    }

    fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Poll the web config file and the files it names every [`RELOAD_INTERVAL`]; when any
/// changes, reload it: new connections get the new certificate (through `tls`), and
/// requests the new users, headers, SANs and rate limit (a new configuration starts
/// with a full token bucket and an empty verdict cache). A file that does not load
/// keeps the previous configuration, logged once per distinct error. Switching between
/// HTTP and HTTPS needs a restart (the listener's mode is fixed). The task ends with the
/// runtime.
pub fn watch(initial: &WebConfig, tls: Option<TlsConfigHandle>, guard: Arc<Guard>) {
    let path = initial.path.clone();
    tls_serving::watch_files("web config", initial.files(), RELOAD_INTERVAL, move || {
        reload(&path, tls.as_ref(), &guard)
    });
}

/// A reloaded web config that switches the listener's mode, which only a restart can.
#[derive(Debug, thiserror::Error)]
enum NeedsRestart {
    #[error("{}: no longer configures TLS; switching a running exporter from HTTPS to HTTP needs a restart", .0.display())]
    ToHttp(PathBuf),
    #[error("{}: now configures TLS; switching a running exporter from HTTP to HTTPS needs a restart", .0.display())]
    ToHttps(PathBuf),
}

/// Reload and apply; the files to watch from now on, or why not (with the files the new
/// config names, when it parses).
fn reload(
    path: &Path,
    tls: Option<&TlsConfigHandle>,
    guard: &Guard,
) -> Result<Vec<PathBuf>, tls_serving::ReloadError> {
    use tls_serving::ReloadError;
    let config = WebConfig::load(path).map_err(ReloadError::new)?;
    let files = config.files();
    let server = config
        .server_config()
        .map_err(|e| ReloadError::with_files(e, files.clone()))?;
    match (tls, server) {
        (Some(handle), Some(server)) => handle.store(Arc::new(server)),
        (None, None) => {}
        (Some(_), None) => {
            return Err(ReloadError::with_files(
                NeedsRestart::ToHttp(path.to_owned()),
                files,
            ));
        }
        (None, Some(_)) => {
            return Err(ReloadError::with_files(
                NeedsRestart::ToHttps(path.to_owned()),
                files,
            ));
        }
    }
    guard.update(&config);
    warn_if_insecure(&config);
    Ok(files)
}

/// exporter-toolkit allows basic auth over plain HTTP; so do we, loudly.
pub fn warn_if_insecure(config: &WebConfig) {
    if config.tls.is_none() && !config.users.is_empty() {
        tracing::warn!(file = %config.path.display(), "basic authentication without TLS: passwords cross the network in clear text");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[tokio::test]
    async fn a_client_failing_too_often_is_limited_but_keeps_its_verified_credentials() {
        let guard = guard_for("prom", "secret");
        let policy = guard.policy.load_full();
        let attacker = IpAddr::from([10, 0, 0, 66]);
        let check = |client: IpAddr, pw: &str| {
            guard.authenticate(policy.clone(), client, "prom".to_string(), pw.into())
        };
        // The scraper behind the same address verified its password first.
        assert_eq!(check(attacker, "secret").await, Verdict::Allowed);
        for i in 0..CLIENT_FAILURE_BURST {
            assert_eq!(
                check(attacker, &format!("guess-{i}")).await,
                Verdict::Denied
            );
        }
        let queue_before = guard.queued();
        match check(attacker, "one-more-guess").await {
            Verdict::Limited(wait) => assert!(
                wait > Duration::ZERO && wait <= CLIENT_FAILURE_REFILL,
                "{wait:?}"
            ),
            other => panic!("not limited: {other:?}"),
        }
        assert_eq!(
            guard.queued(),
            queue_before,
            "a limited client never reaches the bcrypt queue"
        );
        // Verified credentials need no bcrypt and still pass; other clients are not
        // limited.
        assert_eq!(check(attacker, "secret").await, Verdict::Allowed);
        assert_eq!(
            check(IpAddr::from([10, 0, 0, 67]), "wrong").await,
            Verdict::Denied
        );
    }

    #[test]
    fn a_limited_client_gets_an_attempt_back_after_the_refill_interval() {
        let guard = guard_for("prom", "secret");
        let client = IpAddr::from([192, 0, 2, 1]);
        let t0 = Instant::now();
        for _ in 0..CLIENT_FAILURE_BURST {
            guard.enter_client_queue(client, t0).expect("allowed");
            guard.leave_client_queue(client, true, t0);
        }
        let Err(Verdict::Limited(wait)) = guard.enter_client_queue(client, t0) else {
            panic!("not limited after {CLIENT_FAILURE_BURST} failures");
        };
        assert_eq!(wait, CLIENT_FAILURE_REFILL);
        let almost = t0 + CLIENT_FAILURE_REFILL - Duration::from_millis(100);
        assert!(matches!(
            guard.enter_client_queue(client, almost),
            Err(Verdict::Limited(_))
        ));
        let after = t0 + CLIENT_FAILURE_REFILL;
        guard
            .enter_client_queue(client, after)
            .expect("one attempt back");
        // A success takes nothing: the client may try again at once.
        guard.leave_client_queue(client, false, after);
        guard
            .enter_client_queue(client, after)
            .expect("still allowed");
        guard.leave_client_queue(client, true, after);
        assert!(matches!(
            guard.enter_client_queue(client, after),
            Err(Verdict::Limited(_))
        ));
    }

    #[test]
    fn one_client_holds_at_most_its_share_of_the_bcrypt_queue() {
        let guard = guard_for("prom", "secret");
        let now = Instant::now();
        let (a, b) = (IpAddr::from([10, 1, 0, 1]), IpAddr::from([10, 1, 0, 2]));
        for _ in 0..CLIENT_QUEUE_SHARE {
            guard.enter_client_queue(a, now).expect("a's share");
        }
        assert!(matches!(
            guard.enter_client_queue(a, now),
            Err(Verdict::Busy)
        ));
        guard
            .enter_client_queue(b, now)
            .expect("b is not held back by a");
        guard.leave_client_queue(a, false, now);
        guard
            .enter_client_queue(a, now)
            .expect("room again after leaving");
    }

    #[test]
    fn the_client_table_is_bounded() {
        let guard = guard_for("prom", "secret");
        let now = Instant::now();
        for i in 0..(CLIENT_TABLE_ENTRIES as u32 + 500) {
            let client = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            guard.enter_client_queue(client, now).expect("fresh client");
            guard.leave_client_queue(client, true, now);
        }
        assert_eq!(
            guard.clients.lock().expect("clients").len(),
            CLIENT_TABLE_ENTRIES
        );
    }

    #[test]
    fn clients_are_keyed_by_ipv4_address_or_ipv6_slash_64() {
        let key = |addr: &str| client_key(Some(&RemoteAddr(addr.parse().expect("addr"))));
        assert_eq!(key("192.0.2.7:5000"), key("192.0.2.7:6000"));
        assert_ne!(key("192.0.2.7:5000"), key("192.0.2.8:5000"));
        assert_eq!(
            key("[2001:db8:1:2::1]:80"),
            key("[2001:db8:1:2:ffff::9]:81")
        );
        assert_ne!(key("[2001:db8:1:2::1]:80"), key("[2001:db8:1:3::1]:80"));
        assert_eq!(key("[::ffff:192.0.2.7]:1"), key("192.0.2.7:2"));
        assert_eq!(client_key(None), IpAddr::from([0, 0, 0, 0]));
    }

    #[test]
    fn too_many_requests_says_when_to_retry() {
        let r = too_many_requests(Duration::from_millis(5_200));
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "6");
        let r = too_many_requests(Duration::from_millis(10));
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    /// Lets the other tasks run until `condition` holds; panics after 10 s.
    async fn until(condition: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !condition() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the condition within 10 s");
    }

    impl Guard {
        /// Requests waiting for or holding the bcrypt slot, both lanes.
        fn queued(&self) -> usize {
            self.bcrypt_queue
                .iter()
                .map(|q| q.load(std::sync::atomic::Ordering::Acquire))
                .sum()
        }
    }

    fn header_map(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(value).expect("header"),
        );
        h
    }

    fn guard_for(user: &str, password: &str) -> Guard {
        let hash = bcrypt::hash(password, 4).expect("hash");
        let yaml = format!("basic_auth_users:\n  {user}: {hash}\n");
        let config = WebConfig::parse(&yaml, std::path::Path::new("/web.yml")).expect("config");
        Guard::new(&config)
    }

    #[tokio::test]
    async fn wrong_passwords_cannot_evict_verified_credentials() {
        let guard = guard_for("prom", "secret");
        let policy = guard.policy.load_full();
        let right = ("prom".to_string(), b"secret".to_vec());
        // Each guess from its own address, so the per-client limit does not step in.
        let check = |client: u32, user: &str, pw: &[u8]| {
            guard.authenticate(
                policy.clone(),
                IpAddr::from(client.to_be_bytes()),
                user.to_string(),
                pw.to_vec(),
            )
        };
        assert_eq!(check(1, "prom", b"secret").await, Verdict::Allowed);
        assert!(policy.verified(&right));
        for i in 0..(VERDICT_CACHE_ENTRIES + 20) {
            let wrong = format!("guess-{i}");
            assert_eq!(
                check(100 + i as u32, "prom", wrong.as_bytes()).await,
                Verdict::Denied
            );
        }
        assert!(
            policy.verified(&right),
            "a flood of failures evicted the real password"
        );
        assert!(!policy.verified(&("prom".to_string(), b"guess-0".to_vec())));
    }

    #[tokio::test]
    async fn a_full_bcrypt_queue_answers_busy_at_once() {
        use std::sync::atomic::Ordering;
        let guard = guard_for("prom", "secret");
        let policy = guard.policy.load_full();
        let clean = &guard.bcrypt_queue[Lane::Clean.index()];
        // Fill the queue as waiting requests would: the next one is turned away without
        // a bcrypt check, and one leaving makes room again.
        clean.store(BCRYPT_QUEUE, Ordering::Release);
        let busy = guard
            .authenticate(policy.clone(), LOCAL, "prom".into(), b"secret".to_vec())
            .await;
        assert_eq!(busy, Verdict::Busy);
        clean.store(BCRYPT_QUEUE - 1, Ordering::Release);
        let ok = guard
            .authenticate(policy.clone(), LOCAL, "prom".into(), b"secret".to_vec())
            .await;
        assert_eq!(ok, Verdict::Allowed);
        assert_eq!(
            clean.load(Ordering::Acquire),
            BCRYPT_QUEUE - 1,
            "the check left the queue"
        );
    }

    /// Issue 27: a flood whose every address has failed fills the failing lane; a
    /// client that has not failed still gets its check, ahead of the flood's.
    #[tokio::test]
    async fn a_full_failing_lane_does_not_hold_back_a_client_that_has_not_failed() {
        use std::sync::atomic::Ordering;
        let guard = guard_for("prom", "secret");
        let policy = guard.policy.load_full();
        let attacker = IpAddr::from([10, 9, 0, 1]);
        let check = |client: IpAddr, pw: &str| {
            guard.authenticate(policy.clone(), client, "prom".to_string(), pw.into())
        };
        assert_eq!(check(attacker, "guess").await, Verdict::Denied);
        guard.bcrypt_queue[Lane::Failing.index()].store(BCRYPT_QUEUE, Ordering::Release);
        assert_eq!(
            check(attacker, "another").await,
            Verdict::Busy,
            "a client that failed waits in the failing lane"
        );
        assert_eq!(
            check(IpAddr::from([10, 9, 0, 2]), "secret").await,
            Verdict::Allowed,
            "a client that has not failed is not behind the flood"
        );
    }

    /// A clean check waits for at most one failing check, however many are queued.
    #[tokio::test]
    async fn a_clean_check_goes_ahead_of_queued_failing_checks() {
        let guard = Arc::new(guard_for("prom", "secret"));
        let policy = guard.policy.load_full();
        let t0 = Instant::now();
        for i in 1..=4u8 {
            let client = IpAddr::from([10, 8, 0, i]);
            guard.enter_client_queue(client, t0).expect("allowed");
            guard.leave_client_queue(client, true, t0);
        }
        // The slot is busy; four failing checks queue for it.
        let slot = guard.bcrypt.acquire().await.expect("slot");
        let mut failing = Vec::new();
        for i in 1..=4u8 {
            let (guard, policy) = (guard.clone(), policy.clone());
            failing.push(tokio::spawn(async move {
                let client = IpAddr::from([10, 8, 0, i]);
                guard
                    .authenticate(policy, client, "prom".into(), b"wrong".to_vec())
                    .await
            }));
        }
        // Each failing check entered its lane before the clean one arrives.
        let queued = |lane: Lane| {
            guard.bcrypt_queue[lane.index()].load(std::sync::atomic::Ordering::Acquire)
        };
        until(|| queued(Lane::Failing) == 4).await;
        let clean = {
            let (guard, policy) = (guard.clone(), policy.clone());
            tokio::spawn(async move {
                let verdict = guard
                    .authenticate(
                        policy,
                        IpAddr::from([10, 8, 1, 1]),
                        "prom".into(),
                        b"secret".to_vec(),
                    )
                    .await;
                let done = guard.bcrypt_queue[Lane::Failing.index()]
                    .load(std::sync::atomic::Ordering::Acquire);
                (verdict, done)
            })
        };
        until(|| queued(Lane::Clean) == 1).await;
        drop(slot);
        let (verdict, failing_left) = clean.await.expect("clean check");
        assert_eq!(verdict, Verdict::Allowed);
        assert!(
            failing_left >= 3,
            "the clean check waited behind {} failing checks",
            4 - failing_left
        );
        for f in failing {
            assert_eq!(f.await.expect("failing check"), Verdict::Denied);
        }
    }

    #[test]
    fn base64_decodes_like_go() {
        assert_eq!(
            base64_decode(b"dXNlcjpwYXNz").as_deref(),
            Some(&b"user:pass"[..])
        );
        assert_eq!(base64_decode(b"YQ==").as_deref(), Some(&b"a"[..]));
        assert_eq!(base64_decode(b"YWI=").as_deref(), Some(&b"ab"[..]));
        assert_eq!(base64_decode(b"").as_deref(), Some(&b""[..]));
        assert_eq!(base64_decode(b"YQ"), None, "padding is required");
        assert_eq!(base64_decode(b"YQ==YQ=="), None);
        assert_eq!(base64_decode(b"Y!=="), None);
    }

    #[test]
    fn basic_credentials_are_read_like_go() {
        assert_eq!(
            basic_credentials(&header_map("Basic dXNlcjpwYTpzcw==")),
            Some(("user".into(), b"pa:ss".to_vec()))
        );
        assert_eq!(
            basic_credentials(&header_map("basic dXNlcjo=")),
            Some(("user".into(), Vec::new()))
        );
        assert_eq!(basic_credentials(&header_map("Bearer abc")), None);
        assert_eq!(basic_credentials(&header_map("Basic dXNlcg==")), None);
        assert_eq!(basic_credentials(&HeaderMap::new()), None);
    }

    #[test]
    fn token_bucket_starts_full_and_refills() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                interval: Duration::from_secs(1),
                burst: 2,
            },
            t0,
        );
        assert!(b.take(t0));
        assert!(b.take(t0));
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_millis(500)));
        assert!(b.take(t0 + Duration::from_millis(1001)));
        assert!(!b.take(t0 + Duration::from_millis(1002)));
        // Never more than the burst.
        assert!(b.take(t0 + Duration::from_secs(100)));
        assert!(b.take(t0 + Duration::from_secs(100)));
        assert!(!b.take(t0 + Duration::from_secs(100)));
    }

    #[test]
    fn sans_are_read_from_the_leaf() {
        let mut params =
            rcgen::CertificateParams::new(vec!["client.example".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(std::net::IpAddr::from([
                10, 0, 0, 7,
            ])));
        params.subject_alt_names.push(rcgen::SanType::Rfc822Name(
            "me@example.com".try_into().expect("email"),
        ));
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://cluster/ns/monitoring/sa/prometheus"
                .try_into()
                .expect("uri"),
        ));
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(
            certificate_sans(cert.der()),
            vec![
                "client.example",
                "10.0.0.7",
                "me@example.com",
                "spiffe://cluster/ns/monitoring/sa/prometheus"
            ]
        );
        assert!(certificate_sans(b"junk").is_empty());
    }

    #[tokio::test]
    async fn passwords_are_checked_and_remembered() {
        let hash = bcrypt::hash_with_salt("secret", 4, [7; 16])
            .expect("hash")
            .to_string();
        let config = WebConfig::parse(
            &format!("basic_auth_users:\n  alice: '{hash}'\n"),
            Path::new("web.yml"),
        )
        .expect("config");
        let guard = Guard::new(&config);
        let policy = guard.policy.load_full();
        assert_eq!(policy.decoy_cost, 4);
        let check = |user: &str, pw: &[u8]| {
            guard.authenticate(policy.clone(), LOCAL, user.to_string(), pw.to_vec())
        };
        assert_eq!(check("alice", b"secret").await, Verdict::Allowed);
        assert_eq!(check("alice", b"wrong").await, Verdict::Denied);
        assert_eq!(check("bob", b"secret").await, Verdict::Denied);
        assert!(policy.verified(&("alice".into(), b"secret".to_vec())));
        assert!(!policy.verified(&("alice".into(), b"wrong".to_vec())));
        // A reload with the same hash (a certificate rotation) keeps it verified.
        guard.update(&config);
        assert!(
            guard
                .policy
                .load()
                .verified(&("alice".into(), b"secret".to_vec()))
        );
    }

    #[test]
    fn a_reload_keeps_verified_credentials_only_while_their_hash_is_unchanged() {
        let config = |alice: &str, bob: &str| {
            let hash = |pw: &str| {
                bcrypt::hash_with_salt(pw, 4, [7; 16])
                    .expect("hash")
                    .to_string()
            };
            WebConfig::parse(
                &format!(
                    "basic_auth_users:\n  alice: '{}'\n  bob: '{}'\n",
                    hash(alice),
                    hash(bob)
                ),
                Path::new("web.yml"),
            )
            .expect("config")
        };
        let guard = Guard::new(&config("a-secret", "b-secret"));
        let alice = ("alice".to_string(), b"a-secret".to_vec());
        let bob = ("bob".to_string(), b"b-secret".to_vec());
        let policy = guard.policy.load_full();
        policy.remember(alice.clone(), true);
        policy.remember(bob.clone(), true);
        // The same users and hashes, reloaded (a rotated certificate): both kept.
        guard.update(&config("a-secret", "b-secret"));
        assert!(guard.policy.load().verified(&alice));
        assert!(guard.policy.load().verified(&bob));
        // Bob's password changes: only his verdict goes.
        guard.update(&config("a-secret", "b-new"));
        assert!(guard.policy.load().verified(&alice));
        assert!(!guard.policy.load().verified(&bob));
        // A user removed and added back with the same hash is not verified in between,
        // so nothing carries over.
        let only_bob = WebConfig::parse(
            &format!(
                "basic_auth_users:\n  bob: '{}'\n",
                bcrypt::hash_with_salt("b-new", 4, [7; 16]).expect("hash")
            ),
            Path::new("web.yml"),
        )
        .expect("config");
        guard.update(&only_bob);
        guard.update(&config("a-secret", "b-new"));
        assert!(!guard.policy.load().verified(&alice));
    }
}
