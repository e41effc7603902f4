//! The accept loop: TCP, optional TLS, HTTP/1.1 and HTTP/2, every connection bounded in
//! time and number, graceful shutdown.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::CertificateDer;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::TlsConfigHandle;
use crate::refusals::{ListenerStats, Refusal};

/// The client's certificate chain on a TLS connection, leaf first; empty when it sent
/// none or the connection is plain. Every request carries one as an extension.
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(pub Arc<[CertificateDer<'static>]>);

/// The client's address, as a request extension.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

/// How long and how many connections a listener holds. Every field has a default that
/// suits a metrics endpoint; each binary exposes the ones worth tuning as flags.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A TLS client must send its first byte and finish the handshake within this.
    pub handshake_timeout: Duration,
    /// How long a connection may go without a request in progress: from accept (or the
    /// end of the TLS handshake) to its first request, and between requests (HTTP/1.1
    /// keep-alive, HTTP/2 with no open stream). For HTTP/1.1 this is also the header-read
    /// timeout, so request headers dripped slower than this are cut (slowloris).
    pub idle_timeout: Duration,
    /// Connections served at once on this listener; more are accepted and closed at
    /// once (beyond the health reserve).
    pub max_connections: usize,
    /// Connections served at once from one client address (IPv4-mapped IPv6 counts as
    /// IPv4), so one client cannot take every slot; its further connections get only
    /// the health reserve. Counted within `max_connections`.
    pub max_connections_per_address: usize,
    /// Extra connections, beyond `max_connections`, that answer only `health_paths`:
    /// liveness and readiness probes still get through a flood. Each lives at most
    /// `health_timeout` and serves one request.
    pub health_reserve: usize,
    /// The paths the reserve answers; empty: no reserve.
    pub health_paths: Vec<String>,
    /// The whole life of a reserve connection: handshake, one request, its answer.
    pub health_timeout: Duration,
    /// Streams one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub http2_max_concurrent_streams: u32,
    /// Requests in progress at once over all connections, each until its answer is sent
    /// or dropped: an HTTP/2 client with a zero flow-control window parks every answer
    /// it asks for, `max_connections` × `http2_max_concurrent_streams` of them (128,000
    /// by default, a few KB each). Beyond it a request is answered `503` with
    /// `Retry-After` at once; the health paths are exempt, so probes still pass.
    pub max_requests_in_flight: usize,
    /// The largest header block an HTTP/2 client may send (SETTINGS_MAX_HEADER_LIST_SIZE).
    pub http2_max_header_list_size: u32,
    /// The server pings each HTTP/2 connection this often, and closes it when a ping is
    /// not answered within `http2_keep_alive_timeout`: a vanished peer (a node gone, a
    /// NAT that dropped the flow) is noticed even while a request is in progress.
    pub http2_keep_alive_interval: Duration,
    pub http2_keep_alive_timeout: Duration,
    /// On shutdown, in-flight requests get this long to finish.
    pub drain_timeout: Duration,
    /// Where refusals are counted; keep a clone to read them.
    pub stats: Arc<ListenerStats>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake_timeout: Duration::from_secs(10),
            // hyper's own header-read default, and what this server always had.
            idle_timeout: Duration::from_secs(30),
            max_connections: 512,
            // An eighth of the default cap: Prometheus, the adapter or an API server
            // hold a few connections each, and one client can take no more than this.
            max_connections_per_address: 64,
            health_reserve: 8,
            health_paths: Vec::new(),
            health_timeout: Duration::from_secs(2),
            // Go's net/http2 default.
            http2_max_concurrent_streams: 250,
            // Far above what a metrics endpoint serves at once; ~16 MB of parked
            // answers at the few KB each costs.
            max_requests_in_flight: 4096,
            // hyper's default, as an explicit bound.
            http2_max_header_list_size: 16 << 10,
            // gRPC's keepalive timeout is 20 s; pinging every 30 s finds a dead peer
            // within 50 s, while idle connections are closed sooner by `idle_timeout`.
            http2_keep_alive_interval: Duration::from_secs(30),
            http2_keep_alive_timeout: Duration::from_secs(20),
            drain_timeout: Duration::from_secs(10),
            stats: Arc::default(),
        }
    }
}

/// HTTP/2 flow-control windows: how much request body a client may send before the
/// handler reads it. Every request these servers take is a GET or a small gRPC message,
/// so hyper's 1 MiB defaults would only let a client park a megabyte per connection.
const HTTP2_STREAM_WINDOW: u32 = 64 << 10;
const HTTP2_CONNECTION_WINDOW: u32 = 256 << 10;

/// After an idle connection is told to close (HTTP/2: a GOAWAY), it gets this long to
/// go, unless a request raced in.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long admission to the health reserve waits for evicted connections to close.
const EVICTED_CLOSE_WAIT: Duration = Duration::from_millis(250);

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Serves `router` on `listener` until `shutdown` completes, over TLS when `tls` is
/// given (each connection takes the configuration current at its accept), else plain.
/// HTTP/1.1 and HTTP/2 (by ALPN, or by prior knowledge on plain connections, which gRPC
/// clients use) are both served; a TLS configuration whose ALPN list lacks `h2` gets
/// HTTP/1.1 only. Errors of one connection end only that connection. `limits` bounds
/// every connection's idle time and their number, in all and per client address, and
/// counts what it refuses in `limits.stats`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsConfigHandle>,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let limits = Arc::new(limits);
    let (protocols, health_protocols) = protocol_sets(&limits);
    let (protocols, health_protocols) = (Arc::new(protocols), Arc::new(health_protocols));
    let mut places = Places::new(&limits);
    let (closing, closing_rx) = watch::channel(false);
    let requests = Arc::new(Semaphore::new(
        limits.max_requests_in_flight.min(Semaphore::MAX_PERMITS),
    ));
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than
                    // spin, as hyper's and Go's servers do.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(place) = places.take(remote, &limits).await else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let tls = tls.as_ref().map(|handle| handle.load_full());
        let protocols = if place.health.is_some() {
            health_protocols.clone()
        } else {
            protocols.clone()
        };
        let connection = Connection {
            router: router.clone(),
            requests: requests.clone(),
            health: place.health.clone(),
            limits: limits.clone(),
            closing: closing_rx.clone(),
            remote,
        };
        tokio::spawn(async move {
            let _permit = place.permit;
            let _address = place.address;
            let served = connection.run(stream, tls, &protocols);
            match place.health {
                None => served.await,
                Some(ticket) => {
                    let deadline = tokio::time::sleep(ticket.deadline);
                    tokio::select! {
                        () = served => {}
                        () = deadline => {}
                        () = ticket.evict.notified() => {}
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = closing.send(true);
    places.drain(&limits).await;
    Ok(())
}

/// The protocol builders for regular connections and for health-reserve ones, with
/// every per-connection bound of `limits` set.
fn protocol_sets(limits: &Limits) -> (ProtocolSet, ProtocolSet) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's header-read timer runs from the moment the connection waits for a
    // request head, so it is HTTP/1.1's keep-alive idle timeout and slowloris bound in
    // one. It does not cover the wait before the first byte (hyper-util's version sniff
    // reads with no timer); the idle watch (`watch_connection`) does.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(limits.http2_max_header_list_size)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .keep_alive_interval(limits.http2_keep_alive_interval)
        .keep_alive_timeout(limits.http2_keep_alive_timeout);
    let mut health_builder = builder.clone();
    // A reserve connection serves one request.
    health_builder.http1().keep_alive(false);
    (ProtocolSet::new(builder), ProtocolSet::new(health_builder))
}

/// Where accepted connections may go: a regular slot, or the health reserve.
///
/// Beyond the cap (and the health reserve) a connection is accepted and closed at once
/// rather than left in the kernel's backlog: a full backlog drops every SYN, probes'
/// included, and holds the same; accepting keeps the queue moving so the reserve can
/// take a probe, and the client learns at once instead of timing out. The cap keeps
/// descriptors under `nofile`, so accept itself never fails.
struct Places {
    slots: Arc<Semaphore>,
    addresses: Arc<AddressSlots>,
    reserve: HealthReserve,
}

/// The place a connection holds until it ends.
struct Place {
    permit: OwnedSemaphorePermit,
    /// Its place under the client's address cap; `None` in the health reserve.
    address: Option<AddressSlot>,
    /// Its health-reserve ticket; `None` in a regular slot.
    health: Option<Arc<ReserveTicket>>,
}

impl Places {
    fn new(limits: &Limits) -> Self {
        Places {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            addresses: Arc::new(AddressSlots::new(limits.max_connections_per_address)),
            reserve: HealthReserve::new(if limits.health_paths.is_empty() {
                0
            } else {
                limits.health_reserve
            }),
        }
    }

    /// A place for a connection from `remote`, or `None` when it is to be closed.
    async fn take(&mut self, remote: SocketAddr, limits: &Limits) -> Option<Place> {
        // A regular slot needs room on the listener and under the client's address
        // cap; a connection denied one is counted, and may still ask the health paths.
        let regular = match self.addresses.try_take(remote.ip()) {
            None => Err((Refusal::PerAddress, limits.max_connections_per_address)),
            Some(address) => match self.slots.clone().try_acquire_owned() {
                Ok(permit) => Ok((permit, address)),
                Err(_) => Err((Refusal::MaxConnections, limits.max_connections)),
            },
        };
        match regular {
            Ok((permit, address)) => Some(Place {
                permit,
                address: Some(address),
                health: None,
            }),
            Err((reason, limit)) => {
                limits.stats.refuse(reason, remote, limit);
                let (permit, ticket) = self.reserve.admit(limits.health_timeout).await?;
                Some(Place {
                    permit,
                    address: None,
                    health: Some(ticket),
                })
            }
        }
    }

    /// Wait, up to `limits.drain_timeout`, for every connection to end.
    async fn drain(&self, limits: &Limits) {
        // Every connection holds a permit until it ends: holding them all means drained.
        let drained = async {
            let _all = self
                .slots
                .acquire_many(permits(limits.max_connections))
                .await;
            let _all = self
                .reserve
                .alive
                .acquire_many(permits(self.reserve.alive_max))
                .await;
        };
        if tokio::time::timeout(limits.drain_timeout, drained)
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the drain timeout; closing them");
        }
    }
}

fn permits(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The health reserve: connections beyond the cap that may only ask the health paths.
/// A flood fills it too, so when it is full a new connection takes the place of the
/// oldest one that has not begun a request (a probe sends its request at once; a
/// flood's connection idles), and only when every reserve connection is serving is a
/// new one refused. Hand-written: hyper has no notion of connection admission.
/// Not a loopback-only reserve, because the kubelet probes from the node's address,
/// and not a separate health port, so the shipped probes keep working unchanged.
struct HealthReserve {
    size: usize,
    /// Admitted connections, oldest first; a ticket only this holds has ended.
    tickets: std::collections::VecDeque<Arc<ReserveTicket>>,
    /// Reserve connections alive, evicted ones included until they have closed, so
    /// descriptors stay bounded however fast connections arrive.
    alive: Arc<Semaphore>,
    alive_max: usize,
}

/// One reserve connection, as the accept loop and the connection share it.
struct ReserveTicket {
    /// Set when its request begins; from then on it is not evicted.
    serving: std::sync::atomic::AtomicBool,
    /// Told to close, for a newer connection.
    evict: Notify,
    /// Its whole life: handshake, one request, the answer.
    deadline: Duration,
}

impl HealthReserve {
    fn new(size: usize) -> Self {
        let alive_max = size * 2;
        HealthReserve {
            size,
            tickets: std::collections::VecDeque::with_capacity(size),
            alive: Arc::new(Semaphore::new(alive_max)),
            alive_max,
        }
    }

    /// A place for a new connection, evicting the oldest idle one when full; `None`
    /// when there is no reserve, all of it is serving, or too many evicted connections
    /// have yet to close.
    async fn admit(
        &mut self,
        deadline: Duration,
    ) -> Option<(OwnedSemaphorePermit, Arc<ReserveTicket>)> {
        if self.size == 0 {
            return None;
        }
        self.tickets.retain(|ticket| Arc::strong_count(ticket) > 1);
        let has_place = self.tickets.len() < self.size
            || self
                .tickets
                .iter()
                .any(|ticket| !ticket.serving.load(Ordering::Acquire));
        if !has_place {
            return None;
        }
        let permit = match self.alive.clone().try_acquire_owned() {
            Ok(permit) => permit,
            // Connections evicted a moment ago have yet to run and close (a burst
            // evicts faster than a busy runtime schedules): wait for them briefly.
            Err(_) => tokio::time::timeout(EVICTED_CLOSE_WAIT, self.alive.clone().acquire_owned())
                .await
                .ok()?
                .ok()?,
        };
        self.tickets.retain(|ticket| Arc::strong_count(ticket) > 1);
        if self.tickets.len() >= self.size {
            let idle = self
                .tickets
                .iter()
                .position(|ticket| !ticket.serving.load(Ordering::Acquire))?;
            if let Some(evicted) = self.tickets.remove(idle) {
                evicted.evict.notify_one();
            }
        }
        let ticket = Arc::new(ReserveTicket {
            serving: std::sync::atomic::AtomicBool::new(false),
            evict: Notify::new(),
            deadline,
        });
        self.tickets.push_back(ticket.clone());
        Some((permit, ticket))
    }
}

/// Regular connections per client address, for [`Limits::max_connections_per_address`].
/// An address is forgotten when its last connection closes, so the table holds at most
/// `max_connections` entries.
struct AddressSlots {
    cap: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One regular connection's place under its address's cap, given back on drop.
struct AddressSlot {
    slots: Arc<AddressSlots>,
    ip: IpAddr,
}

impl AddressSlots {
    fn new(cap: usize) -> Self {
        AddressSlots {
            cap,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// A place for one more connection from `ip`, or `None` when it holds the cap.
    fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let ip = ip.to_canonical();
        // Nothing panics while the table is held, so a poisoned lock has a sound table.
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(ip).or_insert(0);
        if *n >= self.cap {
            if *n == 0 {
                held.remove(&ip);
            }
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            slots: self.clone(),
            ip,
        })
    }

    #[cfg(test)]
    fn held(&self, ip: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&ip.to_canonical()).copied().unwrap_or(0)
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// The HTTP builders a connection may use.
struct ProtocolSet {
    /// HTTP/1.1 or h2, whichever the client starts (with upgrades).
    auto: auto::Builder<TokioExecutor>,
    /// For TLS configurations that do not offer h2 by ALPN (exporter-toolkit's
    /// `http2: false`): HTTP/1.1 only, so h2 by prior knowledge is refused too, as Go's
    /// server refuses it without h2 in its TLSNextProto.
    http1_only: auto::Builder<TokioExecutor>,
}

impl ProtocolSet {
    fn new(builder: auto::Builder<TokioExecutor>) -> Self {
        ProtocolSet {
            http1_only: builder.clone().http1_only(),
            auto: builder,
        }
    }
}

/// One accepted connection and what it needs to be served.
struct Connection {
    router: Router,
    /// One permit per request in progress on any connection.
    requests: Arc<Semaphore>,
    /// A health-reserve connection: only the health paths are served, others get 503.
    health: Option<Arc<ReserveTicket>>,
    limits: Arc<Limits>,
    closing: watch::Receiver<bool>,
    remote: SocketAddr,
}

impl Connection {
    async fn run(
        self,
        stream: TcpStream,
        tls: Option<Arc<rustls::ServerConfig>>,
        protocols: &ProtocolSet,
    ) {
        match tls {
            None => {
                self.serve_http(stream, PeerCertificates::default(), &protocols.auto)
                    .await
            }
            Some(config) => {
                let http1_only = !config.alpn_protocols.iter().any(|p| p == b"h2");
                let Some(stream) =
                    handshake(stream, config, self.remote, self.limits.handshake_timeout).await
                else {
                    return;
                };
                let peer: Arc<[CertificateDer<'static>]> = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default();
                let builder = if http1_only {
                    &protocols.http1_only
                } else {
                    &protocols.auto
                };
                self.serve_http(stream, PeerCertificates(peer), builder)
                    .await
            }
        }
    }

    /// HTTP/1.1 or h2 until the connection closes, idles out or the drain ends it.
    async fn serve_http<I>(
        self,
        io: I,
        peer: PeerCertificates,
        builder: &auto::Builder<TokioExecutor>,
    ) where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new());
        let only = self.health.map(|ticket| HealthOnly {
            paths: Arc::from(self.limits.health_paths.as_slice()),
            ticket,
        });
        let service = TowerToHyperService::new(tracked_service(
            self.router,
            Arc::from(self.limits.health_paths.as_slice()),
            self.requests,
            only,
            peer,
            self.remote,
            activity.clone(),
        ));
        let io = TokioIo::new(WatchedIo {
            io,
            activity: activity.clone(),
        });
        if builder.is_http2_available() {
            let connection = builder.serve_connection_with_upgrades(io, service);
            watch_connection(connection, &activity, &self.limits, self.closing).await;
        } else {
            // `serve_connection`, because `serve_connection_with_upgrades` sniffs the
            // version itself and ignores `http1_only` (hyper-util 0.1.21).
            let connection = builder.serve_connection(io, service);
            watch_connection(connection, &activity, &self.limits, self.closing).await;
        }
    }
}

/// Drives `connection` until it ends, closing it gracefully when it has had no request
/// in progress for the idle timeout or the server shuts down, and at once when the
/// client has read nothing of an answer for the idle timeout. Written here because
/// hyper has no idle timeout for HTTP/2 connections, none for the wait before a
/// connection's first byte, and no write timeout; its HTTP/1.1 header-read timeout
/// covers keep-alive.
async fn watch_connection<C>(
    connection: C,
    activity: &Activity,
    limits: &Limits,
    mut closing: watch::Receiver<bool>,
) where
    C: GracefulConnection,
{
    tokio::pin!(connection);
    let grace = tokio::select! {
        // A connection's error (a reset, a malformed request) ends only that connection.
        _ = connection.as_mut() => return,
        () = activity.idle_for(limits.idle_timeout) => CLOSE_GRACE,
        // An error means the server is gone: close as well.
        _ = closing.wait_for(|closing| *closing) => limits.drain_timeout,
        // A client that stopped reading holds its answer (and slot) forever; nothing
        // graceful can be sent to it.
        () = activity.write_stalled_for(limits.idle_timeout) => return,
    };
    connection.as_mut().graceful_shutdown();
    // Requests in progress may finish (up to the drain timeout); an idle connection goes
    // after `grace` even if the client never reads its GOAWAY.
    activity.restart_idle_clock();
    let closed = async {
        tokio::select! {
            _ = connection.as_mut() => {}
            () = activity.idle_for(grace) => {}
        }
    };
    let _ = tokio::time::timeout(limits.drain_timeout, closed).await;
}

/// Requests in progress on one connection, and since when it has had none.
struct Activity {
    in_flight: AtomicUsize,
    /// Milliseconds from `origin` to when a write last found the client's window or
    /// the socket buffer full; [`NOT_BLOCKED`] while writes go through.
    write_blocked_since_ms: AtomicU64,
    /// Milliseconds from `origin` to when the last request ended (or the start).
    idle_since_ms: AtomicU64,
    origin: Instant,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            write_blocked_since_ms: AtomicU64::new(NOT_BLOCKED),
            idle_since_ms: AtomicU64::new(0),
            origin: Instant::now(),
            changed: Notify::new(),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        InFlight(self.clone())
    }

    fn restart_idle_clock(&self) {
        self.idle_since_ms
            .store(self.elapsed_ms(), Ordering::Release);
        self.changed.notify_one();
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Completes once one write has waited `timeout` for the client to read.
    async fn write_stalled_for(&self, timeout: Duration) {
        loop {
            let since = self.write_blocked_since_ms.load(Ordering::Acquire);
            let wait = if since == NOT_BLOCKED {
                timeout
            } else {
                let deadline = self.origin + Duration::from_millis(since) + timeout;
                let now = Instant::now();
                if now >= deadline {
                    return;
                }
                deadline - now
            };
            tokio::time::sleep(wait).await;
        }
    }

    fn write_blocked(&self) {
        let _ = self.write_blocked_since_ms.compare_exchange(
            NOT_BLOCKED,
            self.elapsed_ms(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    fn write_unblocked(&self) {
        self.write_blocked_since_ms
            .store(NOT_BLOCKED, Ordering::Release);
    }

    /// Completes once no request has been in progress for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            // `notify_one` leaves a permit when nobody waits, so a change between the
            // check and the wait is not lost.
            let changed = self.changed.notified();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
                let deadline = self.origin + since + timeout;
                if Instant::now() >= deadline {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

/// [`Activity::write_blocked_since_ms`] while no write waits.
const NOT_BLOCKED: u64 = u64::MAX;

/// The connection's transport, noting on its [`Activity`] when writes wait for the
/// client to read.
struct WatchedIo<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I> WatchedIo<I> {
    fn note<T>(&self, poll: Poll<T>) -> Poll<T> {
        match poll {
            Poll::Pending => self.activity.write_blocked(),
            Poll::Ready(_) => self.activity.write_unblocked(),
        }
        poll
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WatchedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WatchedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.note(poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A request in progress: from its head's arrival until its response body is sent or
/// dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // The idle clock first, so a watcher that sees zero reads the new time.
        self.0
            .idle_since_ms
            .store(self.0.elapsed_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// A response body that keeps its request counted as in progress until it is done.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
    /// Its place among the requests in progress on all connections (none for the
    /// health paths).
    _request: Option<OwnedSemaphorePermit>,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A reserve connection's restriction: these paths only, and its ticket to mark once a
/// request begins.
#[derive(Clone)]
struct HealthOnly {
    paths: Arc<[String]>,
    ticket: Arc<ReserveTicket>,
}

/// `router` with the connection's extensions on each request, counting requests in
/// progress on `activity` and in `requests` (all connections; `health_paths` exempt,
/// a 503 when none is left); with `only`, paths not in it get a 503 instead.
fn tracked_service(
    router: Router,
    health_paths: Arc<[String]>,
    requests: Arc<Semaphore>,
    only: Option<HealthOnly>,
    peer: PeerCertificates,
    remote: SocketAddr,
    activity: Arc<Activity>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response,
    Error = Infallible,
    Future = impl Future<Output = Result<Response, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |mut request: Request<Incoming>| {
        let in_flight = activity.begin();
        request.extensions_mut().insert(peer.clone());
        request.extensions_mut().insert(RemoteAddr(remote));
        let allowed = only.as_ref().is_none_or(|only| {
            let health = only.paths.iter().any(|p| p == request.uri().path());
            // Only a probe's request holds its reserve place: a flood's request is
            // refused at once, and its connection may be evicted for the next one
            // rather than keep a probe out while it closes (issue 27).
            if health {
                only.ticket.serving.store(true, Ordering::Release);
            }
            health
        });
        let exempt = health_paths.iter().any(|p| p == request.uri().path());
        let permit = (allowed && !exempt).then(|| requests.clone().try_acquire_owned());
        let call = match &permit {
            Some(Err(_)) => None,
            _ => allowed.then(|| router.clone().oneshot(request)),
        };
        async move {
            let response = match (call, &permit) {
                (Some(call), _) => call.await?,
                (None, Some(Err(_))) => (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [(axum::http::header::RETRY_AFTER, "1")],
                    "too many requests in progress\n",
                )
                    .into_response(),
                (None, _) => (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [(axum::http::header::CONNECTION, "close")],
                    "too many connections\n",
                )
                    .into_response(),
            };
            Ok(response.map(|body| {
                Body::new(TrackedBody {
                    body,
                    _in_flight: in_flight,
                    _request: permit.and_then(Result::ok),
                })
            }))
        }
    })
}

/// The TLS handshake, or `None` after answering a plain HTTP request with Go's `400`
/// or giving up on a client that fails or stalls. The first byte and the handshake
/// share one deadline.
async fn handshake(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    remote: SocketAddr,
    timeout: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let handshake = async {
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(1) => {}
            _ => return None,
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            if first[0].is_ascii_uppercase() {
                tracing::debug!(%remote, "plain HTTP request on the TLS port");
                let mut stream = stream;
                let _ = stream
                    .write_all(
                        b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n",
                    )
                    .await;
                let _ = stream.shutdown().await;
            }
            return None;
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        match acceptor.accept(stream).await {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::debug!(%remote, error = %e, "TLS handshake failed");
                None
            }
        }
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(stream) => stream,
        Err(_) => {
            tracing::debug!(%remote, "TLS handshake timed out");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    #[test]
    fn an_address_holds_at_most_its_cap_and_a_closed_connection_frees_its_slot() {
        let slots = Arc::new(AddressSlots::new(2));
        let a = ip("10.0.0.1");
        let first = slots.try_take(a).expect("first");
        let second = slots.try_take(a).expect("second");
        assert!(slots.try_take(a).is_none(), "a third is over the cap");
        // Another address has its own cap.
        let other = slots.try_take(ip("10.0.0.2")).expect("another address");
        assert_eq!(slots.held(a), 2);
        drop(first);
        assert_eq!(slots.held(a), 1);
        let third = slots.try_take(a).expect("room again after a close");
        drop((second, third, other));
        assert_eq!(slots.held(a), 0);
        let empty = slots.held.lock().expect("table").is_empty();
        assert!(empty, "an address with no connection is forgotten");
    }

    #[test]
    fn ipv4_mapped_ipv6_counts_as_its_ipv4_address() {
        let slots = Arc::new(AddressSlots::new(1));
        let _held = slots.try_take(ip("192.0.2.7")).expect("first");
        assert!(slots.try_take(ip("::ffff:192.0.2.7")).is_none());
        // A different IPv6 address in the same /64 is a different client.
        let _v6 = slots.try_take(ip("2001:db8::1")).expect("v6");
        assert!(slots.try_take(ip("2001:db8::2")).is_some());
    }
}
