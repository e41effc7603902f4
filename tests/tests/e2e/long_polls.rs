//! The exporter's long polls (`/metrics?newer_than=…&wait=…`) against a hostile client
//! (issue 27): absurd `wait` values are refused without disturbing the server, HTTP/2
//! responses parked under a zero flow-control window share their snapshot's buffer so
//! the exporter's memory stays bounded, and long polls held beyond their own cap do not
//! take the connection slots that probes and scrapers need. All traffic is loopback.

use e2e_tests::{Exporter, try_get, wait_for};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(20);

/// `HOST:PORT` of a base URL.
fn address(base: &str) -> &str {
    base.split_once("://").map_or(base, |(_, rest)| rest)
}

/// The snapshot token the exporter serves now.
fn current_token(e: &Exporter) -> String {
    let mut tcp = TcpStream::connect(address(&e.base)).expect("connect");
    tcp.set_read_timeout(Some(PATIENCE)).expect("timeout");
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    match read_answer(&mut tcp) {
        Some((200, Some(token), _)) => token,
        other => panic!("/metrics: {other:?}"),
    }
}

#[test]
fn absurd_waits_are_refused_and_the_exporter_keeps_serving() {
    let e = Exporter::start(&["--simulate", "--collect-interval", "500"], &[]);
    let token = current_token(&e);
    for wait in [
        "1e308s",
        "1e20s",
        "18446744073709551616s",
        "-1s",
        "NaN",
        "infs",
    ] {
        for query in [
            format!("newer_than={token}&wait={wait}"),
            format!("wait={wait}"),
        ] {
            // A few times each: one panicking request per connection would otherwise
            // go unnoticed behind a reconnect.
            for _ in 0..3 {
                let answer = try_get(&e.url(&format!("/metrics?{query}")), &[]);
                assert!(
                    matches!(&answer, Ok((400, body)) if body.contains("not a duration")),
                    "{query}: {answer:?}"
                );
            }
        }
    }
    // A long wait is capped, not refused.
    let answer = try_get(&e.url("/metrics?newer_than=x-1&wait=3600000ms"), &[]);
    assert!(matches!(&answer, Ok((200, _))), "{answer:?}");
    assert!(matches!(try_get(&e.url("/healthz"), &[]), Ok((200, _))));
    assert!(e.metrics().contains("DCGM_FI_DEV_GPU_TEMP"));
    let log = e.process.log();
    assert!(!log.contains("panicked"), "{log}");
}

/// A HEADERS frame (END_HEADERS, END_STREAM) for `GET path` on `stream`, in HPACK
/// without the dynamic table: `:method GET`, `:scheme http`, `:path`, `:authority`,
/// and with `gzip` the static table's `accept-encoding: gzip, deflate`.
fn h2_get(stream: u32, path: &str, gzip: bool) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 0x01, b'x']);
    if gzip {
        block.push(0x90);
    }
    let mut frame = (block.len() as u32).to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[0x1, 0x5]);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(&block);
    frame
}

/// The client preface and SETTINGS with INITIAL_WINDOW_SIZE 0: the server may send no
/// response body byte on any stream.
const H2_ZERO_WINDOW_PREFACE: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00";

/// Opens an h2c connection with a zero window, sends `paths` as streams and reads until
/// every one has its response HEADERS (the body then rendered and parked in the
/// exporter) or `PATIENCE` passes; answers SETTINGS and PINGs meanwhile. Returns the
/// connection, kept open by the caller, and the responses' count.
fn park_h2_streams(addr: &str, paths: &[(String, bool)]) -> (TcpStream, usize) {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    let mut out = H2_ZERO_WINDOW_PREFACE.to_vec();
    for (i, (path, gzip)) in paths.iter().enumerate() {
        out.extend_from_slice(&h2_get(1 + 2 * i as u32, path, *gzip));
    }
    tcp.write_all(&out).expect("requests");
    let deadline = Instant::now() + PATIENCE;
    let (mut received, mut buf, mut headers) = (Vec::new(), [0u8; 16384], 0usize);
    while headers < paths.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        tcp.set_read_timeout(Some(left)).expect("timeout");
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(_) => break,
        }
        // Whole frames only; a partial one waits for the next read.
        while received.len() >= 9 {
            let length = u32::from_be_bytes([0, received[0], received[1], received[2]]) as usize;
            if received.len() < 9 + length {
                break;
            }
            let (kind, flags) = (received[3], received[4]);
            match kind {
                // HEADERS: one per response.
                0x1 => headers += 1,
                // SETTINGS without ACK: acknowledge.
                0x4 if flags & 1 == 0 => tcp
                    .write_all(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
                    .expect("settings ack"),
                // PING without ACK: answer.
                0x6 if flags & 1 == 0 => {
                    let mut pong = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
                    pong.extend_from_slice(&received[9..17]);
                    tcp.write_all(&pong).expect("pong");
                }
                _ => {}
            }
            received.drain(..9 + length);
        }
    }
    (tcp, headers)
}

/// The exporter's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Issue 27: 8 h2c connections with a zero receive window and 250 requests each park
/// 2,000 rendered bodies; each used to be its own ~100 KB copy (RSS 12.7 → 223 MB in a
/// release build). Bodies now share their snapshot's buffer: the 2,000 parked answers
/// must cost well under what 2,000 copies would.
#[test]
fn parked_http2_responses_share_their_snapshot() {
    let e = Exporter::start(&["--simulate", "--collect-interval", "500"], &[]);
    let body_len = e.metrics_after_samples(2).len() as u64;
    assert!(body_len > 50_000, "the simulated node's body: {body_len} B");
    let token = current_token(&e);
    let addr = address(&e.base).to_string();
    let pid = e.process.pid();
    let before = rss_kib(pid);
    const CONNECTIONS: usize = 8;
    const STREAMS: usize = 250;
    let parked: Vec<(TcpStream, usize)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..CONNECTIONS)
            .map(|c| {
                let (addr, token) = (&addr, &token);
                s.spawn(move || {
                    // Plain scrapes and long polls, text and gzip.
                    let paths: Vec<(String, bool)> = (0..STREAMS)
                        .map(|i| match (c + i) % 4 {
                            0 => ("/metrics".to_string(), false),
                            1 => ("/metrics".to_string(), true),
                            2 => (format!("/metrics?newer_than={token}"), false),
                            _ => (format!("/metrics?newer_than={token}&wait=1s"), true),
                        })
                        .collect();
                    park_h2_streams(addr, &paths)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("client"))
            .collect()
    });
    let answered: usize = parked.iter().map(|(_, n)| n).sum();
    assert_eq!(answered, CONNECTIONS * STREAMS, "every stream answered");
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!(
        "RSS {before} KiB before, grew {grown} KiB with {answered} parked answers of {body_len} B"
    );
    // 2,000 copies of the body would be `2000 * body_len`; allow a fifth of that
    // (hyper's and h2's per-stream state and the per-scrape parts are a few KB each).
    let copies_kib = (CONNECTIONS * STREAMS) as u64 * body_len / 1024;
    assert!(
        grown < copies_kib / 5,
        "RSS grew {grown} KiB with {answered} parked answers of {body_len} B \
         ({copies_kib} KiB if each were a copy)"
    );
    // Still serving.
    assert!(matches!(try_get(&e.url("/healthz"), &[]), Ok((200, _))));
    drop(parked);
    wait_for("/metrics after the parked streams", PATIENCE, || {
        try_get(&e.url("/metrics"), &[])
            .ok()
            .filter(|(status, _)| *status == 200)
    });
}

/// One HTTP/1.1 answer read off `tcp`: status, the generation token, and whether the
/// server closes the connection. Reads the body by Content-Length.
fn read_answer(tcp: &mut TcpStream) -> Option<(u16, Option<String>, bool)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tcp.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status = head.get(9..12)?.parse().ok()?;
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
    };
    let length: usize = if status == 304 {
        0
    } else {
        header("content-length").and_then(|v| v.parse().ok())?
    };
    let mut body = vec![0u8; length];
    tcp.read_exact(&mut body).ok()?;
    let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    Some((status, header("x-snapshot-generation"), close))
}

/// A client that follows the exporter as the metrics adapter does: it sends back the
/// token it holds, asks again at once for a new snapshot, and waits an interval when
/// answered without one (its own snapshot again, or an error); it reconnects when its
/// connection closes.
fn follow(addr: &str, interval: Duration, stop: &AtomicBool, answered: &AtomicUsize) {
    let mut token = "none".to_string();
    let mut counted = false;
    let mut connection: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let tcp = match connection.as_mut() {
            Some(tcp) => tcp,
            None => match TcpStream::connect(addr) {
                Ok(tcp) => {
                    let _ = tcp.set_read_timeout(Some(PATIENCE));
                    connection.insert(tcp)
                }
                Err(_) => {
                    std::thread::sleep(interval);
                    continue;
                }
            },
        };
        let request =
            format!("GET /metrics?newer_than={token}&wait=10s HTTP/1.1\r\nHost: x\r\n\r\n");
        let answer = tcp
            .write_all(request.as_bytes())
            .ok()
            .and_then(|()| read_answer(tcp));
        let Some((status, got, close)) = answer else {
            connection = None;
            std::thread::sleep(interval);
            continue;
        };
        if close {
            connection = None;
        }
        if status == 200 && !counted {
            counted = true;
            answered.fetch_add(1, Ordering::Relaxed);
        }
        let newer = status == 200 && got.as_deref().is_some_and(|t| t != token);
        if let Some(got) = got.filter(|_| status == 200 || status == 304) {
            token = got;
        }
        if !newer && status != 304 {
            std::thread::sleep(interval);
        }
    }
}

/// Issue 27: long polls held by more clients than the connection cap took every slot,
/// and fresh probes went unanswered. Long polls are now held at most for half the cap;
/// beyond it they are answered at once and their connection is released, so a fresh
/// `/healthz` and `/metrics` still answer.
#[test]
fn held_long_polls_leave_room_for_probes_and_scrapes() {
    let interval = Duration::from_millis(1000);
    let e = Exporter::start(
        &[
            "--simulate",
            "--collect-interval",
            "1000",
            "--max-connections",
            "16",
        ],
        &[],
    );
    let addr = address(&e.base).to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    // More followers than the cap holds connections.
    let followers: Vec<_> = (0..24)
        .map(|_| {
            let (addr, stop, answered) = (addr.clone(), stop.clone(), answered.clone());
            std::thread::spawn(move || follow(&addr, interval, &stop, &answered))
        })
        .collect();
    // A first answer (their token "none" is not current) takes each follower to a long
    // poll: once the cap's worth have one, their polls hold the slots.
    wait_for("the followers' first answers", PATIENCE, || {
        (answered.load(Ordering::Relaxed) >= 16).then_some(())
    });
    let mut failures = Vec::new();
    for _ in 0..10 {
        for path in ["/healthz", "/metrics"] {
            match try_get(&e.url(path), &[]) {
                Ok((200, _)) => {}
                other => failures.push(format!("{path}: {other:?}")),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in followers {
        f.join().expect("follower");
    }
    assert!(failures.is_empty(), "fresh probes failed: {failures:?}");
    let log = e.process.log();
    assert!(log.contains("long-poll limit reached"), "{log}");
}
