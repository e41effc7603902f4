//! The accept loop: TCP, optional TLS, HTTP/1.1 and HTTP/2, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::CertificateDer;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::TlsConfigHandle;

/// The client's certificate chain on a TLS connection, leaf first; empty when it sent
/// none or the connection is plain. Every request carries one as an extension.
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(pub Arc<[CertificateDer<'static>]>);

/// The client's address, as a request extension.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

/// A client must finish the TLS handshake within this, so idle sockets cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// And send a request's headers within this (HTTP/1.1).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// On shutdown, in-flight requests get this long to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Serves `router` on `listener` until `shutdown` completes, over TLS when `tls` is
/// given (each connection takes the configuration current at its accept), else plain.
/// HTTP/1.1 and HTTP/2 (by ALPN, or by prior knowledge on plain connections, which gRPC
/// clients use) are both served; a TLS configuration whose ALPN list lacks `h2` gets
/// HTTP/1.1 only. Errors of one connection end only that connection.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsConfigHandle>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    // For TLS configurations that do not offer h2 by ALPN (exporter-toolkit's
    // `http2: false`): HTTP/1.1 only, so h2 by prior knowledge is refused too, as Go's
    // server refuses it without h2 in its TLSNextProto.
    let http1_only = Arc::new(builder.clone().http1_only());
    let builder = Arc::new(builder);
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
        let _ = stream.set_nodelay(true);
        let tls = tls.as_ref().map(|handle| handle.load_full());
        let router = router.clone();
        let builder = match &tls {
            Some(config) if !config.alpn_protocols.iter().any(|p| p == b"h2") => {
                Protocols::Http1Only(http1_only.clone())
            }
            _ => Protocols::Auto(builder.clone()),
        };
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            match tls {
                None => {
                    let service = with_extensions(router, PeerCertificates::default(), remote);
                    serve_connection(&builder, watcher, stream, service).await;
                }
                Some(config) => {
                    let Some(stream) = handshake(stream, config, remote).await else {
                        return;
                    };
                    let peer: Arc<[CertificateDer<'static>]> = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
                        .unwrap_or_default();
                    let service = with_extensions(router, PeerCertificates(peer), remote);
                    serve_connection(&builder, watcher, stream, service).await;
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain timeout; closing them");
    }
    Ok(())
}

/// Which HTTP versions a connection may speak.
enum Protocols {
    /// HTTP/1.1 or h2, whichever the client starts (with upgrades).
    Auto(Arc<auto::Builder<TokioExecutor>>),
    /// A builder made with `http1_only()`.
    Http1Only(Arc<auto::Builder<TokioExecutor>>),
}

/// One connection, HTTP/1.1 or h2, until it closes or the drain ends it.
async fn serve_connection<I, S>(
    protocols: &Protocols,
    watcher: hyper_util::server::graceful::Watcher,
    io: I,
    service: S,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<
            axum::extract::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let io = TokioIo::new(io);
    let service = TowerToHyperService::new(service);
    // A connection's error (a reset, a malformed request) ends only that connection.
    match protocols {
        Protocols::Auto(builder) => {
            let connection = builder.serve_connection_with_upgrades(io, service);
            let _ = watcher.watch(connection.into_owned()).await;
        }
        // `serve_connection`, because `serve_connection_with_upgrades` sniffs the
        // version itself and ignores `http1_only` (hyper-util 0.1.21).
        Protocols::Http1Only(builder) => {
            let connection = builder.serve_connection(io, service);
            let _ = watcher.watch(connection.into_owned()).await;
        }
    }
}

fn with_extensions(
    router: Router,
    peer: PeerCertificates,
    remote: SocketAddr,
) -> impl tower::Service<
    axum::extract::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    router.map_request(
        move |mut request: axum::extract::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(peer.clone());
            request.extensions_mut().insert(RemoteAddr(remote));
            request
        },
    )
}

/// The TLS handshake, or `None` after answering a plain HTTP request with Go's `400`
/// or giving up on a client that fails or stalls.
async fn handshake(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    remote: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
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
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%remote, "TLS handshake timed out");
            None
        }
    }
}
