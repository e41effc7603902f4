//! The outgoing HTTP client for exporters and Prometheus: http or https, trusting a CA
//! file or the system's roots.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

use super::limits::{Limits, Rejection};
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use http_body_util::{BodyExt, Empty};
use rustls_pki_types::ServerName;
use tokio::sync::OwnedSemaphorePermit;

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
            // Bounded, regular files only: a CA path given /dev/zero fails at once.
            let pem =
                kube_support::config_file::read(path, kube_support::config_file::DEFAULT_LIMIT)
                    .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
            for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
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
    /// The body's share of the in-flight budget: keep it until the body is decoded.
    pub budget: Option<OwnedSemaphorePermit>,
}

fn too_large(limit: usize) -> Error {
    Error::OverLimit {
        reason: Rejection::TooLarge,
        message: format!(
            "the answer is larger than the {limit} bytes allowed (--max-response-size)"
        ),
    }
}

/// Send one GET built by `request` and read its whole answer, at most
/// `limits.max_response_bytes`, within the in-flight budget, all within `timeout`: a
/// server that hangs mid-body costs one timeout, never a task, and one that sends too
/// much is cut off at the limit (at once when its `Content-Length` says so).
pub async fn get(
    client: &Client,
    request: axum::http::request::Builder,
    limits: &Limits,
    timeout: Duration,
) -> Result<Answer, Error> {
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| Error::Scrape(format!("bad request: {e}")))?;
    let max_body = limits.max_response_bytes;
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
        let (parts, mut body) = response.into_parts();
        let headers = parts.headers;
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max_body as u64) {
            return Err(too_large(max_body));
        }
        // A declared length is reserved whole, at once (no two answers can each hold
        // part of the budget and wait for the rest); an undeclared one chunk by chunk.
        let mut budget = match declared {
            Some(n) => Some(
                limits
                    .reserve(n as usize)
                    .await
                    .ok_or_else(|| Error::Scrape("shutting down".into()))?,
            ),
            None => None,
        };
        // One allocation, never grown: a buffer doubling its way up leaves the
        // allocator holding the smaller sizes it passed through (against 200 MB
        // Prometheus answers with the default limits, VmHWM 175 MB, against 90-106 MB
        // so). Without a declared length it is the limit: the pages of a large
        // allocation cost memory only once written.
        let mut data = Vec::with_capacity(declared.map_or(max_body, |n| n as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Error::Scrape(format!("reading the body: {e}")))?;
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            if data.len() + chunk.len() > max_body {
                return Err(too_large(max_body));
            }
            if declared.is_none() {
                let more = limits
                    .reserve(chunk.len())
                    .await
                    .ok_or_else(|| Error::Scrape("shutting down".into()))?;
                match &mut budget {
                    Some(held) => held.merge(more),
                    None => budget = Some(more),
                }
            } else if declared.is_some_and(|n| (data.len() + chunk.len()) as u64 > n) {
                return Err(Error::Scrape(
                    "reading the body: longer than its Content-Length".into(),
                ));
            }
            data.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            content_type,
            headers,
            body: Bytes::from(data),
            budget,
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

    fn limits(max_response: usize, in_flight: usize) -> Limits {
        Limits::new(max_response, in_flight, 1, 1, 1).unwrap()
    }

    #[tokio::test]
    async fn a_body_that_stops_midway_costs_one_timeout() {
        let url = stalling_server(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nabc",
        );
        let client = client(&TlsOptions::default(), None).unwrap();
        let timeout = Duration::from_millis(300);
        let request = axum::http::Request::get(url.as_str());
        let limits = limits(1024, 1024);
        let Err(e) = get(&client, request, &limits, timeout).await else {
            panic!("a stalled body must fail");
        };
        assert_eq!(e.to_string(), format!("no answer within {timeout:?}"));
        assert_eq!(
            limits.in_flight_bytes(),
            0,
            "a failed read gives its room back"
        );
    }

    /// A Content-Length past the limit is refused from the headers: the body never
    /// comes, so waiting for it would end in the timeout instead.
    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_before_reading() {
        let url = stalling_server(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000000000\r\n\r\n",
        );
        let client = client(&TlsOptions::default(), None).unwrap();
        let request = axum::http::Request::get(url.as_str());
        let Err(e) = get(
            &client,
            request,
            &limits(1024, 1024),
            Duration::from_secs(30),
        )
        .await
        else {
            panic!("a terabyte must be refused");
        };
        assert!(
            matches!(
                e,
                Error::OverLimit {
                    reason: Rejection::TooLarge,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// A chunked body that never ends is cut off at the limit, long before its timeout.
    #[tokio::test]
    async fn an_endless_chunked_body_is_cut_off_at_the_limit() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
            stream.write_all(head.as_bytes()).unwrap();
            let chunk = format!("400\r\n{}\r\n", "x".repeat(0x400));
            while stream.write_all(chunk.as_bytes()).is_ok() {}
        });
        let client = client(&TlsOptions::default(), None).unwrap();
        let request = axum::http::Request::get(format!("http://{address}/"));
        let limits = limits(64 * 1024, 64 * 1024);
        let Err(e) = get(&client, request, &limits, Duration::from_secs(60)).await else {
            panic!("an endless body must be refused");
        };
        assert!(
            matches!(
                e,
                Error::OverLimit {
                    reason: Rejection::TooLarge,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(limits.in_flight_bytes(), 0);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        let url = stalling_server(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 64\r\n\r\n\
             0123456789012345678901234567890123456789012345678901234567890123",
        );
        let client = client(&TlsOptions::default(), None).unwrap();
        let request = axum::http::Request::get(url.as_str());
        let Err(e) = get(&client, request, &limits(32, 32), Duration::from_secs(10)).await else {
            panic!("64 bytes over a 32-byte limit must fail");
        };
        assert!(e.to_string().contains("larger than the 32 bytes"), "{e}");
        let request = axum::http::Request::get(url.as_str());
        let answer = get(&client, request, &limits(64, 64), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(
            (answer.status, answer.content_type.as_str()),
            (StatusCode::OK, "text/plain")
        );
        assert_eq!(answer.body.len(), 64);
    }

    /// An answer holds its bytes of the in-flight budget until dropped; meanwhile
    /// another that would not fit waits (here past its timeout), then fits.
    #[tokio::test]
    async fn answers_wait_for_room_in_the_in_flight_budget() {
        let url = stalling_server(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 40\r\n\r\n\
             0123456789012345678901234567890123456789",
        );
        let client = client(&TlsOptions::default(), None).unwrap();
        let limits = limits(64, 64);
        let first = get(
            &client,
            axum::http::Request::get(url.as_str()),
            &limits,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(limits.in_flight_bytes(), first.body.len());
        let timeout = Duration::from_millis(300);
        let Err(e) = get(
            &client,
            axum::http::Request::get(url.as_str()),
            &limits,
            timeout,
        )
        .await
        else {
            panic!("40 more bytes do not fit in 64 while 40 are held");
        };
        assert_eq!(e.to_string(), format!("no answer within {timeout:?}"));
        drop(first);
        assert_eq!(limits.in_flight_bytes(), 0);
        let second = get(
            &client,
            axum::http::Request::get(url.as_str()),
            &limits,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(second.body.len(), 40);
    }
}
