//! Who may use the HTTP endpoints, as the web config says: basic authentication against
//! bcrypt hashes, the client-certificate SAN allow-list, exporter-toolkit's rate limit
//! and extra response headers; and reloading all of it, certificates included, when the
//! web config file or a file it names changes.
//!
//! `/healthz` and `/readyz` need no credentials and are not rate limited: kubelet
//! probes cannot send credentials, and a throttled probe restarts the pod. They reveal
//! only that the process runs and whether its GPU data is fresh.

use crate::web_config::{RateLimit, WebConfig};
use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lru::LruCache;
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tls_serving::{PeerCertificates, TlsConfigHandle};
use tokio::sync::Semaphore;

/// Paths served without credentials and without rate limiting, for kubelet probes.
pub const UNAUTHENTICATED_PATHS: &[&str] = &["/healthz", "/readyz"];

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
/// The cache is per configuration: a reload starts a new one.
const VERDICT_CACHE_ENTRIES: usize = 100;

/// Requests that may wait for the one bcrypt slot; more are answered 429 at once, so a
/// flood of unknown credentials queues at most this many checks (about a second at
/// cost 10) ahead of a first-time legitimate client, and holds no memory or sockets
/// waiting.
const BCRYPT_QUEUE: usize = 8;

/// The bcrypt cost of the decoy check for unknown users when the configured hashes give
/// none (exporter-toolkit's decoy hash is cost 10).
const DEFAULT_DECOY_COST: u32 = 10;

/// The current access policy, swapped whole on reload.
pub struct Guard {
    policy: ArcSwap<Policy>,
    /// One bcrypt check at a time, as exporter-toolkit's mutex: a flood of wrong
    /// passwords costs at most one core, and never an async worker.
    bcrypt: Semaphore,
    /// Requests holding or waiting for `bcrypt`.
    bcrypt_queue: std::sync::atomic::AtomicUsize,
}

/// What authentication decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Denied,
    /// The bcrypt queue is full: try again later.
    Busy,
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
    fn new(config: &WebConfig) -> Policy {
        Policy {
            users: config.users.clone(),
            decoy_cost: config
                .users
                .values()
                .filter_map(|h| crate::web_config::bcrypt_cost(h))
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
            bcrypt_queue: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Apply a reloaded configuration (users, headers, SANs, rate limit).
    pub fn update(&self, config: &WebConfig) {
        self.policy.store(Arc::new(Policy::new(config)));
    }

    async fn authenticate(&self, policy: Arc<Policy>, user: String, password: Vec<u8>) -> Verdict {
        use std::sync::atomic::Ordering;
        let key = (user, password);
        if policy.verified(&key) {
            return Verdict::Allowed;
        }
        if self.bcrypt_queue.fetch_add(1, Ordering::AcqRel) >= BCRYPT_QUEUE {
            self.bcrypt_queue.fetch_sub(1, Ordering::AcqRel);
            return Verdict::Busy;
        }
        // Leaves the queue however this future ends (a client that hangs up drops it).
        struct Leave<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _leave = Leave(&self.bcrypt_queue);
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
        text(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n")
    } else if !policy.san_allowed(request.extensions().get::<PeerCertificates>()) {
        tracing::debug!("client certificate has none of the allowed SANs");
        text(
            StatusCode::FORBIDDEN,
            "Forbidden: the client certificate has none of the allowed SANs\n",
        )
    } else if open || policy.users.is_empty() {
        next.run(request).await
    } else {
        let verdict = match basic_credentials(request.headers()) {
            Some((user, password)) => guard.authenticate(policy.clone(), user, password).await,
            None => Verdict::Denied,
        };
        if verdict == Verdict::Allowed {
            next.run(request).await
        } else if verdict == Verdict::Busy {
            text(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n")
        } else {
            let mut r = text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
            r
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

fn text(status: StatusCode, body: &'static str) -> Response {
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

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
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

/// Reload and apply; the files to watch from now on, or why not (with the files the new
/// config names, when it parses).
fn reload(
    path: &Path,
    tls: Option<&TlsConfigHandle>,
    guard: &Guard,
) -> Result<Vec<PathBuf>, (String, Option<Vec<PathBuf>>)> {
    let config = WebConfig::load(path).map_err(|e| (e.to_string(), None))?;
    let files = config.files();
    let server = config
        .server_config()
        .map_err(|e| (e.to_string(), Some(files.clone())))?;
    match (tls, server) {
        (Some(handle), Some(server)) => handle.store(Arc::new(server)),
        (None, None) => {}
        (Some(_), None) => {
            return Err((
                format!(
                    "{}: no longer configures TLS; switching a running exporter from HTTPS to HTTP needs a restart",
                    path.display()
                ),
                Some(files),
            ));
        }
        (None, Some(_)) => {
            return Err((
                format!(
                    "{}: now configures TLS; switching a running exporter from HTTP to HTTPS needs a restart",
                    path.display()
                ),
                Some(files),
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
        let check = |user: &str, pw: &[u8]| {
            guard.authenticate(policy.clone(), user.to_string(), pw.to_vec())
        };
        assert_eq!(check("prom", b"secret").await, Verdict::Allowed);
        assert!(policy.verified(&right));
        for i in 0..(VERDICT_CACHE_ENTRIES + 20) {
            let wrong = format!("guess-{i}");
            assert_eq!(check("prom", wrong.as_bytes()).await, Verdict::Denied);
        }
        assert!(
            policy.verified(&right),
            "a flood of failures evicted the real password"
        );
        assert!(!policy.verified(&("prom".to_string(), b"guess-0".to_vec())));
    }

    #[tokio::test]
    async fn a_full_bcrypt_queue_answers_busy_at_once() {
        let guard = guard_for("prom", "secret");
        let policy = guard.policy.load_full();
        // Fill the queue as waiting requests would: the next one is turned away without
        // a bcrypt check, and one leaving makes room again.
        guard
            .bcrypt_queue
            .store(BCRYPT_QUEUE, std::sync::atomic::Ordering::Release);
        let busy = guard
            .authenticate(policy.clone(), "prom".into(), b"secret".to_vec())
            .await;
        assert_eq!(busy, Verdict::Busy);
        guard
            .bcrypt_queue
            .store(BCRYPT_QUEUE - 1, std::sync::atomic::Ordering::Release);
        let ok = guard
            .authenticate(policy.clone(), "prom".into(), b"secret".to_vec())
            .await;
        assert_eq!(ok, Verdict::Allowed);
        assert_eq!(
            guard
                .bcrypt_queue
                .load(std::sync::atomic::Ordering::Acquire),
            BCRYPT_QUEUE - 1,
            "the check left the queue"
        );
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
            guard.authenticate(policy.clone(), user.to_string(), pw.to_vec())
        };
        assert_eq!(check("alice", b"secret").await, Verdict::Allowed);
        assert_eq!(check("alice", b"wrong").await, Verdict::Denied);
        assert_eq!(check("bob", b"secret").await, Verdict::Denied);
        assert!(policy.verified(&("alice".into(), b"secret".to_vec())));
        assert!(!policy.verified(&("alice".into(), b"wrong".to_vec())));
        // A reload starts afresh.
        guard.update(&config);
        assert!(
            !guard
                .policy
                .load()
                .verified(&("alice".into(), b"secret".to_vec()))
        );
    }
}
