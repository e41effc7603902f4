//! The accept loop end to end on loopback: TLS with each client-auth policy, the peer
//! certificate reaching the handler, plain HTTP on the TLS port, and rotation.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Extension;
use axum::routing::get;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tls_serving::{ClientAuth, MinTlsVersion, PeerCertificates, TlsConfigHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Pair = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn pair(names: &[&str]) -> Pair {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    tls_serving::self_signed(&names).expect("self-signed pair")
}

fn roots(cert: &CertificateDer<'static>) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone()).expect("root");
    roots
}

/// A server answering `/` with the number of client certificates it saw.
async fn start(tls: Option<TlsConfigHandle>) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let router = axum::Router::new().route(
        "/",
        get(|Extension(peer): Extension<PeerCertificates>| async move { peer.0.len().to_string() }),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(tls_serving::serve(
        listener,
        tls,
        router,
        tls_serving::Limits::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

fn handle(server: &Pair, client_auth: ClientAuth) -> TlsConfigHandle {
    let config = tls_serving::server_config(
        server.0.clone(),
        server.1.clone_key(),
        client_auth,
        MinTlsVersion::Tls12,
    )
    .expect("server config");
    Arc::new(ArcSwap::from_pointee(config))
}

/// One HTTP/1.1 GET over TLS: the response text and the server's certificate, or the
/// error.
async fn https_get(
    addr: &str,
    trust: &CertificateDer<'static>,
    identity: Option<&Pair>,
) -> Result<(String, CertificateDer<'static>), String> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots(trust));
    let config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let served = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned()
        .ok_or("no server certificate")?;
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_string(&mut response))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    Ok((response, served))
}

fn body(response: &str) -> &str {
    response.split("\r\n\r\n").nth(1).unwrap_or_default()
}

#[tokio::test]
async fn client_certificates_reach_the_handler_when_requested() {
    tls_serving::install_crypto_provider();
    let server = pair(&["localhost"]);
    let client = pair(&["client"]);
    let (addr, _stop) = start(Some(handle(&server, ClientAuth::Request))).await;
    let (anonymous, _) = https_get(&addr, &server.0[0], None).await.expect("no cert");
    assert!(anonymous.starts_with("HTTP/1.1 200"), "{anonymous}");
    assert_eq!(body(&anonymous), "0");
    let (with_cert, _) = https_get(&addr, &server.0[0], Some(&client))
        .await
        .expect("with cert");
    assert_eq!(body(&with_cert), "1", "{with_cert}");
}

#[tokio::test]
async fn require_and_verify_refuses_missing_and_foreign_certificates() {
    tls_serving::install_crypto_provider();
    let server = pair(&["localhost"]);
    let trusted = pair(&["trusted-client"]);
    let foreign = pair(&["foreign-client"]);
    let policy = ClientAuth::RequireAndVerify(Arc::new(roots(&trusted.0[0])));
    let (addr, _stop) = start(Some(handle(&server, policy))).await;
    // A self-signed leaf as its own CA: rustls-webpki accepts it as a trust anchor.
    let ok = https_get(&addr, &server.0[0], Some(&trusted)).await;
    assert!(matches!(&ok, Ok((r, _)) if body(r) == "1"), "{ok:?}");
    assert!(https_get(&addr, &server.0[0], None).await.is_err());
    assert!(
        https_get(&addr, &server.0[0], Some(&foreign))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn plain_http_on_the_tls_port_gets_a_400() {
    tls_serving::install_crypto_provider();
    let server = pair(&["localhost"]);
    let (addr, _stop) = start(Some(handle(&server, ClientAuth::None))).await;
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut response))
        .await
        .expect("an answer, not a hang")
        .expect("read");
    assert!(
        response.starts_with("HTTP/1.0 400 Bad Request"),
        "{response}"
    );
    assert!(response.contains("Client sent an HTTP request to an HTTPS server"));
}

#[tokio::test]
async fn rewritten_certificate_files_are_served_to_new_connections() {
    tls_serving::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let write = |pair: &rcgen::CertifiedKey<rcgen::KeyPair>| {
        std::fs::write(&cert_path, pair.cert.pem()).expect("cert");
        std::fs::write(&key_path, pair.signing_key.serialize_pem()).expect("key");
    };
    let first = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("first");
    write(&first);
    let build = {
        let (cert_path, key_path) = (cert_path.clone(), key_path.clone());
        move || {
            let config = tls_serving::server_config(
                tls_serving::load_cert_chain(&cert_path)?,
                tls_serving::load_private_key(&key_path)?,
                ClientAuth::None,
                MinTlsVersion::Tls12,
            )?;
            Ok((config, vec![cert_path.clone(), key_path.clone()]))
        }
    };
    let (config, files) = build().expect("first build");
    let handle: TlsConfigHandle = Arc::new(ArcSwap::from_pointee(config));
    tls_serving::watch_server_config(handle.clone(), files, Duration::from_millis(50), build);
    let (addr, _stop) = start(Some(handle)).await;
    let (_, served) = https_get(&addr, first.cert.der(), None)
        .await
        .expect("first");
    assert_eq!(&served, first.cert.der());

    let second = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("second");
    write(&second);
    let mut seen = None;
    for _ in 0..400 {
        if let Ok((_, served)) = https_get(&addr, second.cert.der(), None).await {
            seen = Some(served);
            break;
        }
        // Poll until the watcher (every 50 ms) has swapped the configuration; bounded
        // at 4 s.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        seen.as_ref(),
        Some(second.cert.der()),
        "the new certificate is served"
    );
}

/// What the server sends back to HTTP/2 by prior knowledge (the client preface and an
/// empty SETTINGS frame over TLS, no ALPN): at most 64 bytes, until it stops sending.
async fn h2_prior_knowledge(addr: &str, trust: &CertificateDer<'static>) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots(trust))
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .expect("write");
    let mut answer = vec![0u8; 64];
    let mut got = 0;
    while got < 9 {
        match tokio::time::timeout(Duration::from_secs(5), tls.read(&mut answer[got..])).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => got += n,
        }
    }
    answer.truncate(got);
    answer
}

/// A TLS configuration without `h2` in its ALPN list (exporter-toolkit's `http2: false`)
/// serves HTTP/1.1 only: HTTP/2 by prior knowledge gets no HTTP/2 answer, where the
/// default configuration answers it with the server's SETTINGS frame.
#[tokio::test]
async fn without_h2_in_alpn_http2_by_prior_knowledge_is_refused() {
    tls_serving::install_crypto_provider();
    let server = pair(&["localhost"]);
    let with_h2 = handle(&server, ClientAuth::None);
    let (addr, _stop) = start(Some(with_h2)).await;
    let answer = h2_prior_knowledge(&addr, &server.0[0]).await;
    assert!(
        answer.len() >= 9 && answer[3] == 0x04,
        "h2 offered: a SETTINGS frame first, got {answer:?}"
    );

    let mut config = rustls::ServerConfig::clone(&handle(&server, ClientAuth::None).load());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let (addr, _stop) = start(Some(Arc::new(ArcSwap::from_pointee(config)))).await;
    let answer = h2_prior_knowledge(&addr, &server.0[0]).await;
    // hyper's HTTP/1 parser rejects the preface's `HTTP/2.0` and closes the connection.
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 "),
        "h2 not offered: refused, got {:?}",
        String::from_utf8_lossy(&answer)
    );
    // HTTP/1.1 itself still works on that configuration.
    let (ok, _) = https_get(&addr, &server.0[0], None)
        .await
        .expect("HTTP/1.1");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
}
