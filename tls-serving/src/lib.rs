//! HTTPS serving for axum routers, shared by the exporter and the metrics adapter.
//!
//! axum's own `serve` speaks plain HTTP only, and neither hyper nor axum hands a
//! connection's TLS client certificate to the request. Both servers need that: the
//! adapter authenticates front-proxy and client certificates per request, exactly as
//! `k8s.io/apiserver` does, and the exporter honours exporter-toolkit's
//! `client_auth_type`. So this crate owns the accept loop:
//!
//! - [`serve`] accepts TCP connections, runs the rustls handshake off the accept loop
//!   (bounded by a timeout), and serves HTTP/1.1 and HTTP/2 (ALPN `h2`, `http/1.1`)
//!   with graceful shutdown. Each request carries the connection's
//!   [`PeerCertificates`] as an extension.
//! - Every connection is bounded ([`Limits`]): an idle timeout from accept to the
//!   first request and between requests (HTTP/1.1 keep-alive, HTTP/2 with no open
//!   stream, after a TLS handshake), a handshake timeout, a cap on connections and one
//!   per client address with a small reserve that answers only the health paths, an
//!   HTTP/2 stream limit and server pings. Refusals are counted ([`ListenerStats`]) and
//!   logged once per streak ([`RefusalStreak`]).
//! - Plain HTTP sent to a TLS port gets Go's answer, a `400` saying so, instead of a
//!   hung or reset connection.
//! - [`ClientAuth`] covers exporter-toolkit's five client-certificate policies plus the
//!   API server's "request, verify per request".
//! - [`TlsConfigHandle`] is swapped atomically by [`watch_files`] when the certificate,
//!   key or CA files change (Kubernetes Secret mounts swap a symlink), so rotation
//!   needs no restart; a broken file keeps the previous configuration and is logged.
//! - [`self_signed`] makes a development pair.
//! - [`bind`] binds the listening socket: `:PORT` is every interface, IPv4 and IPv6.

mod client_auth;
mod listen;
mod pem;
mod refusals;
mod reload;
mod serve;

pub use client_auth::ClientAuth;
pub use listen::{ListenAddress, bind};
pub use pem::{ca_bundle_from_pem, load_ca_bundle, load_cert_chain, load_private_key};
pub use refusals::{ListenerStats, Refusal, RefusalStreak, STREAK_GAP};
pub use reload::{
    ReloadError, TlsConfigHandle, watch_files, watch_files_or_notified, watch_server_config,
};
pub use serve::{Limits, PeerCertificates, RemoteAddr, serve};

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// What can go wrong building a TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Pem { path: PathBuf, what: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientCa(String),
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
}

/// The oldest TLS version a server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinTlsVersion {
    #[default]
    Tls12,
    Tls13,
}

/// The one crypto provider of the workspace (ring), installed as the process default so
/// that every rustls user (kube's client, tonic, this crate) agrees. Idempotent.
pub fn install_crypto_provider() {
    // An Err only says a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A server configuration: the certificate chain and key, the client-certificate
/// policy, the minimum version, and ALPN `h2` then `http/1.1`.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_auth: ClientAuth,
    min_version: MinTlsVersion,
) -> Result<ServerConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match min_version {
        MinTlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        MinTlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let verifier = client_auth.verifier(provider.clone())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// A self-signed certificate and key for `names` (DNS names or IP addresses), valid
/// for a year: for development, where clients skip verification.
pub fn self_signed(
    names: &[String],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let certified = rcgen::generate_simple_self_signed(names.to_vec())?;
    let key = PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    Ok((vec![certified.cert.der().clone()], key))
}
