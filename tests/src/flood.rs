//! Floods of clients against one listener: each client from its own loopback address
//! (any 127.0.0.0/8 address reaches a listener on 127.0.0.1 on Linux, and each is a
//! different client to it), with or without the right password.

use crate::Exporter;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

/// A runtime for the tests that need many sockets, each bound to its own loopback
/// address.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `Authorization: Basic …`.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let encoded =
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}").as_bytes());
    format!("Basic {encoded}")
}

/// The exporter on simulated GPUs, serving with the web config file `web` (TLS and/or
/// basic auth); `base` is `http://…` whatever the config says.
pub fn exporter_with_web_config(web: &Path) -> Exporter {
    Exporter::start(
        &[
            "--simulate=builtin:default",
            "-c",
            "500",
            "--web-config-file",
            web.to_str().expect("utf-8 path"),
        ],
        &[],
    )
}

/// One plain-HTTP/1.1 `GET path` from the local address `from`: the status and the
/// `Retry-After` header.
pub async fn get_from(
    from: Ipv4Addr,
    to: SocketAddr,
    path: &str,
    authorization: &str,
) -> std::io::Result<(u16, Option<u64>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    let mut stream = socket.connect(to).await?;
    stream
        .write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {to}\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    let head = answer.split("\r\n\r\n").next().unwrap_or_default();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    let retry_after = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().parse().ok())
            .flatten()
    });
    Ok((status, retry_after))
}
