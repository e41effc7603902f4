//! An HTTPS client for tests: trusts one CA, optionally presents a client certificate,
//! and returns status and body, or the error (a refused handshake, say) as text.

use crate::pki::Leaf;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use std::time::Duration;

type Body = Empty<hyper::body::Bytes>;

pub struct HttpsClient {
    runtime: tokio::runtime::Runtime,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Body>,
}

/// rustls' client configuration trusting `ca_pem`, with `identity` as the client
/// certificate when given, ALPN `http/1.1`.
pub fn client_config(ca_pem: &str, identity: Option<&Leaf>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots);
    match identity {
        Some(leaf) => {
            let chain = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("client certificate PEM");
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client certificate")
        }
        None => builder.with_no_client_auth(),
    }
}

impl HttpsClient {
    pub fn new(ca_pem: &str, identity: Option<&Leaf>) -> HttpsClient {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("client runtime");
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client_config(ca_pem, identity))
            .https_only()
            .enable_http1()
            .build();
        // One connection per request, so a rotated server certificate or CA is seen by
        // the next request.
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        HttpsClient { runtime, client }
    }

    /// GET `url` with `headers` (repeatable names allowed): (status, body), or the
    /// transport error as text.
    pub fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<(u16, String), String> {
        let mut request = hyper::Request::get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Body::new()).map_err(|e| e.to_string())?;
        self.runtime.block_on(async {
            let response =
                tokio::time::timeout(Duration::from_secs(20), self.client.request(request))
                    .await
                    .map_err(|_| "timed out".to_string())?
                    .map_err(|e| format!("{e:?}"))?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        })
    }
}
