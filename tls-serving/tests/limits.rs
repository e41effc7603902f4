//! Every connection is bounded (issue 20): idle connections of each kind are closed, a
//! slowloris is cut, a flood at the connection cap still lets the health paths answer,
//! HTTP/2 streams beyond the limit are refused, and an HTTP/2 peer that stops answering
//! pings is dropped. Each test runs the real accept loop on loopback with short limits,
//! and each would hang to its deadline (and fail) without the limit it covers.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::routing::get;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tls_serving::{ClientAuth, Limits, MinTlsVersion, TlsConfigHandle};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// How long any test waits for the server to act before calling it a failure: far
/// beyond every limit the tests set, so only a missing limit reaches it.
const PATIENCE: Duration = Duration::from_secs(10);

/// `/` and `/healthz` answer at once; `/hold` never answers, keeping its request (and,
/// on HTTP/2, its stream) open; `/endless` answers a body that never ends.
fn router() -> axum::Router {
    axum::Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/healthz", get(|| async { "healthy" }))
        .route("/hold", get(std::future::pending::<&'static str>))
        .route("/endless", get(|| async { axum::body::Body::new(Endless) }))
}

/// A response body of 64 KiB chunks, forever.
struct Endless;

impl http_body::Body for Endless {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        static CHUNK: [u8; 64 << 10] = [b'x'; 64 << 10];
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(
            axum::body::Bytes::from_static(&CHUNK),
        ))))
    }
}

async fn start(tls: Option<TlsConfigHandle>, limits: Limits) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(tls_serving::serve(
        listener,
        tls,
        router(),
        limits,
        std::future::pending(),
    ));
    addr
}

/// Limits where only `idle_timeout` is short.
fn idle_after(idle: Duration) -> Limits {
    Limits {
        idle_timeout: idle,
        ..Limits::default()
    }
}

/// Reads until the peer closes (EOF or a reset) and returns what it sent (its first
/// MiB), or `Err` with that if it is still open after `within`.
async fn read_until_closed<R: AsyncRead + Unpin>(
    reader: &mut R,
    within: Duration,
) -> Result<Vec<u8>, Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // Checked here too: a peer that never stops sending keeps `read` ready, and a
        // ready future never lets its timeout fire.
        if Instant::now() >= deadline {
            return Err(received);
        }
        match tokio::time::timeout_at(deadline, reader.read(&mut buf)).await {
            Err(_) => return Err(received),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(received),
            Ok(Ok(n)) if received.len() < 1 << 20 => received.extend_from_slice(&buf[..n]),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_connection_that_never_sends_a_byte_is_closed() {
    let addr = start(None, idle_after(Duration::from_millis(300))).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    let got = read_until_closed(&mut tcp, PATIENCE).await;
    assert_eq!(got, Ok(Vec::new()), "closed without a word");
}

#[tokio::test]
async fn an_http1_keep_alive_connection_idle_after_a_request_is_closed() {
    let addr = start(None, idle_after(Duration::from_millis(300))).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    // The answer comes, then the connection stays open (keep-alive) until it idles out.
    let got = read_until_closed(&mut tcp, PATIENCE)
        .await
        .expect("closed after idling");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("\r\n\r\nok"), "{text}");
}

/// The HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// HTTP/2 frames as (type, flags, stream, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while bytes.len() >= 9 {
        let length = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        if bytes.len() < 9 + length {
            break;
        }
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        frames.push((bytes[3], bytes[4], stream, bytes[9..9 + length].to_vec()));
        bytes = &bytes[9 + length..];
    }
    frames
}

const GOAWAY: u8 = 0x7;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const SETTINGS: u8 = 0x4;
const REFUSED_STREAM: [u8; 4] = [0, 0, 0, 0x7];

#[tokio::test]
async fn http2_after_its_preface_idle_is_closed_with_a_goaway() {
    let addr = start(None, idle_after(Duration::from_millis(300))).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(H2_PREFACE).await.expect("preface");
    let got = read_until_closed(&mut tcp, PATIENCE)
        .await
        .expect("closed after idling");
    let kinds: Vec<u8> = frames(&got).iter().map(|f| f.0).collect();
    assert_eq!(kinds.first(), Some(&SETTINGS), "{kinds:?}");
    assert!(kinds.contains(&GOAWAY), "told to go away: {kinds:?}");
}

fn tls_handle() -> (TlsConfigHandle, CertificateDer<'static>) {
    tls_serving::install_crypto_provider();
    let (chain, key): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) =
        tls_serving::self_signed(&["localhost".to_string()]).expect("pair");
    let trust = chain[0].clone();
    let config = tls_serving::server_config(chain, key, ClientAuth::None, MinTlsVersion::Tls12)
        .expect("server config");
    (Arc::new(ArcSwap::from_pointee(config)), trust)
}

async fn tls_connect(
    addr: &str,
    trust: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = RootCertStore::empty();
    roots.add(trust.clone()).expect("root");
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake")
}

#[tokio::test]
async fn an_idle_tls_connection_after_its_handshake_is_closed() {
    let (handle, trust) = tls_handle();
    let addr = start(Some(handle), idle_after(Duration::from_millis(300))).await;
    for alpn in [&[][..], &[&b"http/1.1"[..]][..], &[&b"h2"[..]][..]] {
        let mut tls = tls_connect(&addr, &trust, alpn).await;
        assert!(
            read_until_closed(&mut tls, PATIENCE).await.is_ok(),
            "ALPN {alpn:?}: closed after idling"
        );
    }
}

#[tokio::test]
async fn a_tls_client_that_stalls_in_the_handshake_is_closed() {
    let (handle, _) = tls_handle();
    let limits = Limits {
        handshake_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let addr = start(Some(handle), limits).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    // The first byte of a ClientHello record, then nothing.
    tcp.write_all(&[0x16]).await.expect("write");
    assert_eq!(read_until_closed(&mut tcp, PATIENCE).await, Ok(Vec::new()));
}

#[tokio::test]
async fn a_slowloris_dripping_headers_is_cut() {
    let idle = Duration::from_millis(500);
    let addr = start(None, idle_after(idle)).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    let request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    // One byte per 100 ms: every byte resets any per-read timer, but the request would
    // take over 10 s to complete.
    let mut sent = 0;
    let mut cut = false;
    for byte in request {
        if tcp.write_all(&[*byte]).await.is_err() {
            cut = true;
            break;
        }
        sent += 1;
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(100), tcp.read(&mut buf)).await {
            Err(_) => {}
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut = true;
                break;
            }
            Ok(Ok(n)) => panic!(
                "answered a request never finished: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
        }
    }
    assert!(
        cut,
        "still open after the whole request was dripped ({sent} bytes)"
    );
    assert!(sent < request.len(), "cut before the headers completed");
}

#[tokio::test]
async fn a_client_that_stops_reading_its_answer_is_dropped() {
    let idle = Duration::from_millis(300);
    let addr = start(None, idle_after(idle)).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    // The behaviour under test: the client reads nothing for a while, so the server's
    // writes wait on full buffers for longer than the idle timeout.
    tokio::time::sleep(idle * 3).await;
    // Dropped, the server sent what its buffers held and then closed; still open, it
    // would stream forever now that the client reads.
    assert!(
        read_until_closed(&mut tcp, PATIENCE).await.is_ok(),
        "the stalled answer was dropped"
    );
}

/// One HTTP/1.1 GET on a new connection: the status code, or `None` when the
/// connection was closed without an answer.
async fn status_of(addr: &str, path: &str) -> Option<u16> {
    let mut tcp = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.ok()?;
    let got = read_until_closed(&mut tcp, PATIENCE).await.ok()?;
    let text = String::from_utf8_lossy(&got);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[tokio::test]
async fn a_flood_at_the_connection_cap_still_gets_health_answered() {
    let limits = Limits {
        max_connections: 4,
        health_reserve: 2,
        health_paths: vec!["/healthz".to_string()],
        // Nothing times out during the test: only the cap, the reserve and its
        // eviction decide.
        health_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let addr = start(None, limits).await;
    // The flood: idle connections, twice what the cap and reserve hold.
    let mut flood = Vec::new();
    for _ in 0..12 {
        flood.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    // The first four take the cap; each later one took the reserve place of the
    // oldest idle reserve connection, which was closed; the last two hold the reserve.
    for (i, tcp) in flood.iter_mut().enumerate().skip(4).take(6) {
        assert!(
            read_until_closed(tcp, PATIENCE).await.is_ok(),
            "flood connection {i} evicted from the reserve"
        );
    }
    for (i, tcp) in flood.iter_mut().enumerate().take(4) {
        assert!(
            read_until_closed(tcp, Duration::from_millis(100))
                .await
                .is_err(),
            "flood connection {i} keeps its slot"
        );
    }
    // A probe takes a reserve place from the idle flood and is answered at once.
    assert_eq!(status_of(&addr, "/healthz").await, Some(200));
    // Other paths are not served while the cap is reached.
    assert_eq!(status_of(&addr, "/").await, Some(503));

    // Once the flood goes, everything is served again.
    drop(flood);
    let deadline = Instant::now() + PATIENCE;
    let mut after = None;
    while Instant::now() < deadline {
        after = status_of(&addr, "/").await;
        if after == Some(200) {
            break;
        }
        // The server notices the flood's closes on its own time: try again shortly.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(after, Some(200), "served again after the flood");
}

/// A TCP connection from the loopback address `from` (every 127.0.0.0/8 address reaches
/// a listener on 127.0.0.1 on Linux, each a different client to it).
async fn connect_from(from: [u8; 4], addr: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((from, 0)))
        .expect("bind a loopback address");
    socket
        .connect(addr.parse().expect("address"))
        .await
        .expect("connect")
}

/// [`status_of`] from the loopback address `from`.
async fn status_from(from: [u8; 4], addr: &str, path: &str) -> Option<u16> {
    let mut tcp = connect_from(from, addr).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.ok()?;
    let got = read_until_closed(&mut tcp, PATIENCE).await.ok()?;
    let text = String::from_utf8_lossy(&got);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// One client address holds at most its share of the listener: its idle connections
/// beyond it get only the health reserve, other addresses are served as usual, the
/// refusals are counted, and a closed connection gives its place back.
#[tokio::test]
async fn one_address_holds_at_most_its_cap() {
    let limits = Limits {
        max_connections: 16,
        max_connections_per_address: 3,
        health_reserve: 2,
        health_paths: vec!["/healthz".to_string()],
        health_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let stats = limits.stats.clone();
    let addr = start(None, limits).await;
    const FLOODER: [u8; 4] = [127, 0, 0, 2];
    // Twice what the cap and the reserve hold, from one address: beyond its 3 they
    // get the reserve (and evict one another from it), the listener keeps room.
    let mut flood = Vec::new();
    for _ in 0..10 {
        flood.push(connect_from(FLOODER, &addr).await);
    }
    let deadline = Instant::now() + PATIENCE;
    while stats.refused(tls_serving::Refusal::PerAddress) < 7 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stats.refused(tls_serving::Refusal::PerAddress), 7);
    for _ in 0..5 {
        assert_eq!(status_from([127, 0, 0, 3], &addr, "/").await, Some(200));
    }
    // The flooder's next connection is over its cap: health only.
    assert_eq!(status_from(FLOODER, &addr, "/").await, Some(503));
    assert_eq!(status_from(FLOODER, &addr, "/healthz").await, Some(200));
    assert_eq!(stats.refused(tls_serving::Refusal::MaxConnections), 0);

    // One of its three regular connections closes: its place is given back.
    drop(flood.remove(0));
    let deadline = Instant::now() + PATIENCE;
    let mut after = None;
    while Instant::now() < deadline {
        after = status_from(FLOODER, &addr, "/").await;
        if after == Some(200) {
            break;
        }
        // The server notices the close on its own time: try again shortly.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        after,
        Some(200),
        "a closed connection frees its address's slot"
    );
}

/// The adapter's probes are HTTPS: the reserve's connection does its handshake too.
#[tokio::test]
async fn a_flood_at_the_cap_still_gets_health_answered_over_tls() {
    let (handle, trust) = tls_handle();
    let limits = Limits {
        max_connections: 2,
        health_reserve: 1,
        health_paths: vec!["/healthz".to_string()],
        health_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        handshake_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let addr = start(Some(handle), limits).await;
    // Idle TCP connections that never start their handshake.
    let mut flood = Vec::new();
    for _ in 0..6 {
        flood.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    let mut probe = tls_connect(&addr, &trust, &[b"http/1.1"]).await;
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request");
    let answer = read_until_closed(&mut probe, PATIENCE)
        .await
        .expect("one request, then closed");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("healthy"), "{text}");
    drop(flood);
}

/// Issue 27: answers parked by HTTP/2 clients that never open their window (or held
/// requests) count against one bound over all connections; beyond it a request is
/// refused at once, except the health paths.
#[tokio::test]
async fn requests_in_progress_are_bounded_over_all_connections() {
    let limits = Limits {
        max_requests_in_flight: 2,
        health_paths: vec!["/healthz".to_string()],
        idle_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let addr = start(None, limits).await;
    // Two requests held, on two connections.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(&addr).await.expect("connect");
        tcp.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("request");
        held.push(tcp);
    }
    // Their requests reach the server in their own time: wait for the refusal.
    let deadline = Instant::now() + PATIENCE;
    let mut third = None;
    while Instant::now() < deadline {
        third = status_of(&addr, "/").await;
        if third == Some(503) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(third, Some(503), "a third request is refused");
    assert_eq!(
        status_of(&addr, "/healthz").await,
        Some(200),
        "probes exempt"
    );
    // A held request that ends gives its place back.
    drop(held.pop());
    let deadline = Instant::now() + PATIENCE;
    let mut after = None;
    while Instant::now() < deadline {
        after = status_of(&addr, "/").await;
        if after == Some(200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(after, Some(200), "served once a place is free");
}

/// Issue 27: a reserve connection whose request is not a probe's is refused at once,
/// but an HTTP/2 one stays open after its 503, and it used to hold its reserve place as
/// "serving" for the whole health timeout, keeping probes out. Only a health path now
/// holds a place; the flood's connection is evicted for the probe.
#[tokio::test]
async fn a_flood_request_on_the_reserve_does_not_keep_probes_out() {
    const HEADERS: u8 = 0x1;
    let limits = Limits {
        max_connections: 1,
        health_reserve: 1,
        health_paths: vec!["/healthz".to_string()],
        health_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let addr = start(None, limits).await;
    let _slot = TcpStream::connect(&addr).await.expect("connect");
    // The reserve's one place: HTTP/2, a request for a path it does not serve.
    let mut flood = TcpStream::connect(&addr).await.expect("connect");
    flood.write_all(H2_PREFACE).await.expect("preface");
    flood.write_all(&h2_get(1, "/")).await.expect("request");
    let (answered, seen) =
        read_frames_until(&mut flood, PATIENCE, |f| f.0 == HEADERS && f.2 == 1).await;
    assert!(answered, "the flood's request answered (503): {seen:?}");
    assert_eq!(status_of(&addr, "/healthz").await, Some(200));
    assert!(
        read_until_closed(&mut flood, PATIENCE).await.is_ok(),
        "the flood's connection was evicted"
    );
}

/// A HEADERS frame (END_HEADERS, END_STREAM) for `GET path` on `stream`, its header
/// block in HPACK without touching the dynamic table: indexed `:method GET` and
/// `:scheme http`, literal `:path` and `:authority` with indexed names.
fn h2_get(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 0x01, b'x']);
    let mut frame = (block.len() as u32).to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[0x1, 0x5]);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(&block);
    frame
}

/// Reads frames until `wanted` matches one, or the deadline passes; all frames read.
async fn read_frames_until<R: AsyncRead + AsyncWrite + Unpin>(
    io: &mut R,
    within: Duration,
    mut wanted: impl FnMut(&(u8, u8, u32, Vec<u8>)) -> bool,
) -> (bool, Vec<(u8, u8, u32, Vec<u8>)>) {
    let deadline = Instant::now() + within;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let all = frames(&received);
        if all.iter().any(&mut wanted) {
            return (true, all);
        }
        match tokio::time::timeout_at(deadline, io.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => received.extend_from_slice(&buf[..n]),
            _ => return (false, all),
        }
    }
}

#[tokio::test]
async fn http2_streams_beyond_the_limit_are_refused() {
    let limits = Limits {
        http2_max_concurrent_streams: 2,
        ..Limits::default()
    };
    let addr = start(None, limits).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(H2_PREFACE).await.expect("preface");
    let (got, _) = read_frames_until(&mut tcp, PATIENCE, |f| f.0 == SETTINGS && f.1 == 0).await;
    assert!(got, "the server's SETTINGS");
    // Acknowledge them, so the limit they announce is in force.
    tcp.write_all(&[0, 0, 0, SETTINGS, 0x1, 0, 0, 0, 0])
        .await
        .expect("ack");
    let mut requests = Vec::new();
    for stream in [1, 3, 5] {
        requests.extend(h2_get(stream, "/hold"));
    }
    tcp.write_all(&requests).await.expect("requests");
    let (refused, seen) = read_frames_until(&mut tcp, PATIENCE, |f| {
        f.0 == RST_STREAM && f.2 == 5 && f.3 == REFUSED_STREAM
    })
    .await;
    assert!(refused, "the third stream refused; frames: {seen:?}");
    assert!(
        !seen.iter().any(|f| f.0 == RST_STREAM && f.2 != 5),
        "the first two are held: {seen:?}"
    );
}

#[tokio::test]
async fn an_http2_peer_that_stops_answering_pings_is_dropped() {
    let limits = Limits {
        http2_keep_alive_interval: Duration::from_millis(200),
        http2_keep_alive_timeout: Duration::from_millis(200),
        // Idle closing is not what closes it: a request stays in progress throughout.
        idle_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let addr = start(None, limits).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(H2_PREFACE).await.expect("preface");
    tcp.write_all(&h2_get(1, "/hold")).await.expect("request");
    let got = read_until_closed(&mut tcp, PATIENCE)
        .await
        .expect("dropped after an unanswered ping");
    let kinds: Vec<u8> = frames(&got).iter().map(|f| f.0).collect();
    assert!(kinds.contains(&PING), "pinged first: {kinds:?}");
}
