//! The outgoing HTTP client for exporters and Prometheus: http or https, trusting a CA
//! file or the system's roots.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

use axum::body::Bytes;
use http_body_util::Empty;
use rustls_pki_types::ServerName;

pub type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<Bytes>,
>;

/// How to reach the other side over TLS.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM CA bundle; default: the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// The name to verify in the server's certificate instead of the URL's host: the
    /// exporters are scraped by pod IP, their certificate names their Service.
    pub server_name: Option<String>,
}

/// An http-or-https client; idle connections are dropped after `pool_idle`.
pub fn client(tls: &TlsOptions, pool_idle: Option<Duration>) -> Result<Client, Error> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca_file {
        Some(path) => {
            for cert in rustls_pki_types::CertificateDer::pem_file_iter(path)
                .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?
            {
                let cert = cert.map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                // A system certificate rustls cannot parse is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http();
    let builder = match &tls.server_name {
        Some(name) => {
            let name = ServerName::try_from(name.clone())
                .map_err(|e| Error::Tls(format!("{name:?} is not a TLS server name: {e}")))?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    let https = builder.enable_http1().build();
    let mut client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    if let Some(idle) = pool_idle {
        client.pool_idle_timeout(idle);
    }
    Ok(client.build(https))
}
