//! The outgoing HTTP client for exporters and Prometheus: http or https, trusting a CA
//! file or the system's roots.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
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
    // The scrape loop keeps one connection open per exporter (1,250 at the scale
    // target), most of them idle in a long poll: a read buffer that grew to a whole
    // 65 KB body and stayed would hold ~80 MiB. 16 KiB reads cost a few more syscalls.
    client.http1_max_buf_size(16 * 1024);
    Ok(client.build(https))
}

/// One answer read whole.
pub struct Answer {
    pub status: StatusCode,
    /// The `Content-Type` header, empty when absent or not text.
    pub content_type: String,
    /// Every response header (the scrape loop reads the exporter's snapshot generation).
    pub headers: axum::http::HeaderMap,
    pub body: Bytes,
}

/// Send one GET built by `request` and read its whole answer, at most `max_body` bytes,
/// all within `timeout`: a server that hangs mid-body costs one timeout, never a task.
pub async fn get(
    client: &Client,
    request: axum::http::request::Builder,
    max_body: usize,
    timeout: Duration,
) -> Result<Answer, Error> {
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| Error::Scrape(format!("bad request: {e}")))?;
    let work = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| Error::Scrape(e.to_string()))?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let (parts, body) = response.into_parts();
        let headers = parts.headers;
        let body = Limited::new(body, max_body)
            .collect()
            .await
            .map_err(|e| Error::Scrape(format!("reading the body: {e}")))?
            .to_bytes();
        Ok(Answer {
            status,
            content_type,
            headers,
            body,
        })
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| Error::Scrape(format!("no answer within {timeout:?}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A server that answers every connection with `head` and then holds it open
    /// without another byte, as a wedged exporter or proxy does.
    fn stalling_server(head: &'static str) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request);
                stream.write_all(head.as_bytes()).unwrap();
                held.push(stream);
            }
        });
        format!("http://{address}/metrics")
    }

    #[tokio::test]
    async fn a_body_that_stops_midway_costs_one_timeout() {
        let url = stalling_server(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nabc",
        );
        let client = client(&TlsOptions::default(), None).unwrap();
        let timeout = Duration::from_millis(300);
        let request = axum::http::Request::get(url.as_str());
        let Err(e) = get(&client, request, 1024, timeout).await else {
            panic!("a stalled body must fail");
        };
        assert_eq!(e.to_string(), format!("no answer within {timeout:?}"));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        let url = stalling_server(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 64\r\n\r\n\
             0123456789012345678901234567890123456789012345678901234567890123",
        );
        let client = client(&TlsOptions::default(), None).unwrap();
        let request = axum::http::Request::get(url.as_str());
        let Err(e) = get(&client, request, 32, Duration::from_secs(10)).await else {
            panic!("64 bytes over a 32-byte limit must fail");
        };
        assert!(e.to_string().contains("reading the body"), "{e}");
        let request = axum::http::Request::get(url.as_str());
        let answer = get(&client, request, 64, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(
            (answer.status, answer.content_type.as_str()),
            (StatusCode::OK, "text/plain")
        );
        assert_eq!(answer.body.len(), 64);
    }
}
