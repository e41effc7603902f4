//! Every listener of the real binaries is bounded (issue 20): idle connections of each
//! kind are closed on the exporter's port and on the adapter's HTTP and gRPC ports, and a
//! connection flood at the exporter's cap still lets `/healthz` answer. The limits are
//! set short by flag; `tls-serving/tests/limits.rs` covers each limit in isolation (TLS,
//! slowloris, HTTP/2 streams, pings).

use e2e_tests::{Adapter, Exporter, KubeNode, attributed_exporter, try_get, wait_for};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Far beyond the idle timeouts set here: only a connection never closed reaches it.
const PATIENCE: Duration = Duration::from_secs(10);

/// The HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// `HOST:PORT` of a base URL.
fn address(base: &str) -> &str {
    base.split_once("://").map_or(base, |(_, rest)| rest)
}

/// Reads until the peer closes (EOF or a reset): `Ok` with what it sent, or `Err` with
/// what it sent when it is still open after `within`.
fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Result<Vec<u8>, Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(received);
        }
        stream.set_read_timeout(Some(left)).expect("read timeout");
        match stream.read(&mut buf) {
            Ok(0) => return Ok(received),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(received);
            }
            Err(_) => return Ok(received),
        }
    }
}

/// The frame types of an HTTP/2 byte stream.
fn h2_frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let length = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        types.push(bytes[3]);
        bytes = bytes.get(9 + length..).unwrap_or_default();
    }
    types
}

const GOAWAY: u8 = 0x7;

/// The idle timeout of the tests below: long enough that a connection observed open
/// for half of it is not an accident of scheduling.
const IDLE: Duration = Duration::from_secs(2);
const IDLE_FLAG: &str = "2s";

/// What `stream` has sent so far, or a panic when it is already closed: checked at
/// once, without waiting, before `IDLE` has passed since `opened`.
fn still_open(stream: &mut TcpStream, opened: Instant, what: &str) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    stream.set_nonblocking(true).expect("non-blocking");
    loop {
        match stream.read(&mut buf) {
            Ok(0) => panic!(
                "{what}: closed within {:?} of opening, before half the idle timeout ({:?}) \
                 could pass, after {received:?}",
                opened.elapsed(),
                IDLE / 2
            ),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{what}: reset within {:?}: {e}", opened.elapsed()),
        }
    }
    stream.set_nonblocking(false).expect("blocking");
    assert!(
        opened.elapsed() < IDLE,
        "{what}: checked too late to tell ({:?})",
        opened.elapsed()
    );
    received
}

/// Waits until half of `IDLE` has passed since `opened`, on `stream`: a panic when it
/// closes before.
fn open_at_half(stream: &mut TcpStream, opened: Instant, what: &str) -> Vec<u8> {
    let left = (opened + IDLE / 2).saturating_duration_since(Instant::now());
    let mut received = read_until_closed(stream, left).err().unwrap_or_else(|| {
        panic!(
            "{what}: closed within {:?}, before half the idle timeout ({:?})",
            opened.elapsed(),
            IDLE / 2
        )
    });
    received.extend(still_open(stream, opened, what));
    received
}

/// A connection that sends nothing, one idle after an HTTP/1.1 keep-alive request, and
/// HTTP/2 after its preface: each is still open at half the idle timeout (`IDLE`,
/// counted from before the connection opened, so the server's own clock is later),
/// and closed after it.
fn assert_idle_connections_closed(addr: &str, what: &str) {
    let opened = Instant::now();
    let mut silent = TcpStream::connect(addr).expect("connect");
    let mut keep_alive = TcpStream::connect(addr).expect("connect");
    keep_alive
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    let mut h2 = TcpStream::connect(addr).expect("connect");
    h2.write_all(H2_PREFACE).expect("preface");

    assert_eq!(
        open_at_half(&mut silent, opened, &format!("{what}: silent")),
        Vec::<u8>::new()
    );
    let mut answered = still_open(&mut keep_alive, opened, &format!("{what}: keep-alive"));
    let mut frames = still_open(&mut h2, opened, &format!("{what}: HTTP/2"));

    assert_eq!(
        read_until_closed(&mut silent, PATIENCE),
        Ok(Vec::new()),
        "{what}: a connection that sends nothing is closed"
    );
    answered.extend(
        read_until_closed(&mut keep_alive, PATIENCE)
            .unwrap_or_else(|got| panic!("{what}: keep-alive still open after {got:?}")),
    );
    assert!(
        answered.starts_with(b"HTTP/1.1 200"),
        "{what}: {}",
        String::from_utf8_lossy(&answered)
    );
    frames.extend(
        read_until_closed(&mut h2, PATIENCE)
            .unwrap_or_else(|got| panic!("{what}: HTTP/2 still open after {got:?}")),
    );
    assert!(
        h2_frame_types(&frames).contains(&GOAWAY),
        "{what}: HTTP/2 told to go away: {:?}",
        h2_frame_types(&frames)
    );
}

#[test]
fn the_exporter_closes_idle_connections() {
    let e = Exporter::start(&["--simulate", "--http-idle-timeout", IDLE_FLAG], &[]);
    assert_idle_connections_closed(address(&e.base), "exporter");
}

#[test]
fn the_adapter_closes_idle_connections_on_both_ports() {
    let node = KubeNode::start("tests/fixtures/pods-node.toml", "node-a");
    let e = attributed_exporter(&node, "tests/fixtures/pods-node.toml");
    let url = e.url("/metrics");
    let kubeconfig = node.kubeconfig().display().to_string();
    let a = Adapter::start(&[
        "--exporter-url",
        &url,
        "--kubeconfig",
        &kubeconfig,
        "--http-idle-timeout",
        IDLE_FLAG,
    ]);
    assert_idle_connections_closed(address(&a.base), "adapter API");
    // KEDA's gRPC port: HTTP/2 by prior knowledge, idle after its preface; open at half
    // the timeout, closed after it.
    let grpc = a.grpc_address();
    let opened = Instant::now();
    let mut h2 = TcpStream::connect(address(&grpc)).expect("connect");
    h2.write_all(H2_PREFACE).expect("preface");
    let mut frames = open_at_half(&mut h2, opened, "gRPC");
    frames.extend(
        read_until_closed(&mut h2, PATIENCE)
            .unwrap_or_else(|got| panic!("gRPC: HTTP/2 still open after {got:?}")),
    );
    assert!(h2_frame_types(&frames).contains(&GOAWAY), "{frames:?}");
}

#[test]
fn the_exporter_answers_healthz_through_a_connection_flood() {
    let e = Exporter::start(
        &[
            "--simulate",
            "--max-connections",
            "8",
            // The flood keeps its slots for the whole test.
            "--http-idle-timeout",
            "1m",
        ],
        &[],
    );
    // Healthy before the flood, so a 200 below can only come from the health reserve.
    wait_for("/health 200", PATIENCE, || {
        try_get(&e.url("/health"), &[])
            .ok()
            .filter(|(status, _)| *status == 200)
    });
    let addr = address(&e.base).to_string();
    // Five times what the cap holds, all idle.
    let flood: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    // The server accepts in order, so the probes below come after the whole flood. A
    // probe takes a reserve place from the idle flood and is answered at once, as
    // often as the kubelet asks.
    for _ in 0..5 {
        let probe = try_get(&e.url("/healthz"), &[]);
        assert!(matches!(&probe, Ok((200, _))), "/healthz: {probe:?}");
        let probe = try_get(&e.url("/readyz"), &[]);
        assert!(matches!(&probe, Ok((200 | 503, _))), "/readyz: {probe:?}");
        // dcgm-exporter's probe path has the same reserve.
        let probe = try_get(&e.url("/health"), &[]);
        assert!(matches!(&probe, Ok((200, _))), "/health: {probe:?}");
    }
    // /metrics is not served while the cap is reached.
    let metrics = try_get(&e.url("/metrics"), &[]);
    assert!(
        matches!(&metrics, Ok((503, _))),
        "/metrics at the cap: {metrics:?}"
    );
    drop(flood);
    wait_for("/metrics served after the flood", PATIENCE, || {
        try_get(&e.url("/metrics"), &[])
            .ok()
            .filter(|(status, _)| *status == 200)
    });
}
