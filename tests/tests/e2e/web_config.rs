//! The exporter behind `--web-config-file` (exporter-toolkit's web-config.yml): a real
//! Prometheus scrapes it over TLS with basic auth; wrong or missing credentials get
//! `401`; the health endpoints stay open; plain HTTP on the TLS port gets a prompt
//! `400`; client certificates are required and verified, and their SANs checked;
//! certificates and users rotate without a restart; a bad file stops startup.
//!
//! Requests go through a small blocking rustls client so the tests see everything: the
//! status, the headers, the certificate the server presented, the negotiated ALPN, and a
//! refused handshake as an error.

use e2e_tests::flood::{basic, exporter_with_web_config, get_from, runtime};
use e2e_tests::https::client_config;
use e2e_tests::pki::{Ca, Leaf};
use e2e_tests::{
    Adapter, Exporter, Process, Prometheus, binary, scratch_dir, try_wait_for, wait_for,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// bcrypt at the lowest cost keeps the tests fast (real files use 10 or more).
fn bcrypt_hash(password: &str) -> String {
    bcrypt::hash(password, 4).expect("bcrypt hash")
}

/// One HTTPS exchange as it happened.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    /// The leaf certificate the server presented.
    server_cert: Vec<u8>,
    alpn: Option<Vec<u8>>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` over TLS with `config`, HTTP/1.1, one connection; `Err` when the handshake
/// or the connection fails before a response arrives.
fn https_get(
    addr: &str,
    config: rustls::ClientConfig,
    path: &str,
    authorization: Option<&str>,
) -> Result<Answer, String> {
    let tcp = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let connection =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(a) = authorization {
        request.push_str(&format!("Authorization: {a}\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    let read = tls.read_to_end(&mut raw);
    if raw.is_empty() {
        return Err(match read {
            Err(e) => format!("read: {e}"),
            Ok(_) => "connection closed without a response".into(),
        });
    }
    let server_cert = tls
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let alpn = tls.conn.alpn_protocol().map(<[u8]>::to_vec);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no header end in {text:?}"))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: dechunk(body),
        server_cert,
        alpn,
    })
}

/// The body of a chunked HTTP/1.1 response (hyper chunks bodies of unknown length).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return body.to_string();
        };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_string();
        };
        if n == 0 || after.len() < n {
            return if n == 0 { out } else { body.to_string() };
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
}

/// A directory with a CA and a serving certificate for 127.0.0.1 and localhost
/// (`server.crt`/`server.key`), and `ca.pem`.
struct Pki {
    dir: PathBuf,
    ca: Ca,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = scratch_dir(name);
        let ca = Ca::new("gpu-exporter test CA");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write CA");
        ca.server(&["127.0.0.1", "localhost"]).write(&dir, "server");
        Pki { dir, ca }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Write `web.yml` (relative paths in it resolve against this directory).
    fn web_config(&self, yaml: &str) -> PathBuf {
        let path = self.dir.join("web.yml");
        std::fs::write(&path, yaml).expect("write web config");
        path
    }

    fn client(&self) -> rustls::ClientConfig {
        client_config(&self.ca.pem(), None)
    }
}

/// The exporter on simulated GPUs with this web config; `base` is `https://…`.
fn secure_exporter(web: &Path) -> Exporter {
    let mut e = exporter_with_web_config(web);
    e.base = e.base.replacen("http://", "https://", 1);
    e
}

fn addr(e: &Exporter) -> String {
    e.base.trim_start_matches("https://").to_string()
}

fn der_of(leaf: &Leaf) -> Vec<u8> {
    CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
        .next()
        .expect("a certificate")
        .expect("PEM")
        .to_vec()
}

#[test]
fn prometheus_scrapes_over_tls_with_basic_auth() {
    let pki = Pki::new("web-prometheus");
    let web = pki.web_config(&format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  prometheus: '{}'\n",
        bcrypt_hash("scrape-secret")
    ));
    let exporter = secure_exporter(&web);
    let target = addr(&exporter);
    let ca = pki.ca_file();
    let ca = ca.display();
    let good = format!(
        "    scheme: https\n    tls_config:\n      ca_file: {ca}\n    basic_auth:\n      username: prometheus\n      password: scrape-secret\n"
    );
    let wrong = format!(
        "    scheme: https\n    tls_config:\n      ca_file: {ca}\n    basic_auth:\n      username: prometheus\n      password: not-it\n"
    );
    let prom = Prometheus::start(&[("tls", &target, &good), ("wrong", &target, &wrong)]);

    let series = wait_for(
        "8 GPU_UTIL series scraped over TLS",
        Duration::from_secs(60),
        || {
            let r = prom.query("DCGM_FI_DEV_GPU_UTIL{job=\"tls\"}");
            (r.len() == 8).then_some(r)
        },
    );
    assert!(
        series
            .iter()
            .all(|s| s["metric"]["modelName"] == "NVIDIA H100 80GB HBM3"),
        "{series:?}"
    );
    let up = wait_for("up for both jobs", Duration::from_secs(30), || {
        let r = prom.query("up");
        (r.len() == 2).then_some(r)
    });
    for s in &up {
        let job = s["metric"]["job"].as_str().expect("job");
        let want = if job == "tls" { "1" } else { "0" };
        assert_eq!(s["value"][1], want, "{job}: {up:?}");
    }
    assert!(
        prom.query("DCGM_FI_DEV_GPU_UTIL{job=\"wrong\"}").is_empty(),
        "a wrong password scrapes nothing"
    );
}

#[test]
fn credentials_are_checked_and_health_endpoints_stay_open() {
    let pki = Pki::new("web-auth");
    let web = pki.web_config(&format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\nbasic_auth_users:\n  alice: '{}'\n  bob: '{}'\n",
        bcrypt_hash("alice-pw"),
        bcrypt_hash("bob-pw")
    ));
    let exporter = secure_exporter(&web);
    let a = addr(&exporter);
    let get = |path: &str, auth: Option<&str>| {
        https_get(&a, pki.client(), path, auth).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    };

    let ok = get("/metrics", Some(&basic("alice", "alice-pw")));
    assert_eq!(ok.status, 200, "{ok:?}");
    assert!(ok.body.contains("DCGM_FI_DEV_GPU_UTIL{"), "{}", ok.body);
    assert_eq!(ok.header("x-frame-options"), Some("deny"));
    assert_eq!(
        get("/metrics", Some(&basic("bob", "bob-pw"))).status,
        200,
        "second user"
    );
    // Cached now: the same credentials again.
    assert_eq!(
        get("/metrics", Some(&basic("alice", "alice-pw"))).status,
        200
    );

    for (what, auth) in [
        ("wrong password", Some(basic("alice", "bob-pw"))),
        ("unknown user", Some(basic("mallory", "alice-pw"))),
        ("no credentials", None),
        ("not basic", Some("Bearer alice-pw".to_string())),
        ("not base64", Some("Basic !!!".to_string())),
    ] {
        let r = get("/metrics", auth.as_deref());
        assert_eq!(r.status, 401, "{what}: {r:?}");
        assert_eq!(r.header("www-authenticate"), Some("Basic"), "{what}");
        assert_eq!(r.body, "Unauthorized\n", "{what}");
        assert!(!r.body.contains("DCGM"), "{what}");
        assert_eq!(
            r.header("x-frame-options"),
            Some("deny"),
            "{what}: headers on refusals too"
        );
    }
    // Everything else asks for credentials too, unknown paths included.
    assert_eq!(get("/", None).status, 401);
    assert_eq!(get("/debug", None).status, 401);
    assert_eq!(get("/debug", Some(&basic("alice", "alice-pw"))).status, 404);

    // Probes carry no credentials: the health endpoints answer them over TLS.
    assert_eq!(get("/healthz", None).status, 200);
    assert_eq!(get("/healthz", None).body, "ok\n");
    let ready = wait_for(
        "/readyz 200 without credentials",
        Duration::from_secs(30),
        || {
            let r = get("/readyz", None);
            (r.status == 200).then_some(r)
        },
    );
    assert_eq!(ready.body, "ready\n");

    // HTTP/2 is offered by ALPN by default (http_server_config.http2).
    let mut h2 = pki.client();
    h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(&a).expect("connect");
    let mut conn = rustls::ClientConnection::new(
        Arc::new(h2),
        ServerName::try_from("127.0.0.1").expect("name"),
    )
    .expect("client");
    let mut tcp = tcp;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).expect("handshake");
    }
    assert_eq!(conn.alpn_protocol(), Some(&b"h2"[..]));
}

#[test]
fn plain_http_to_the_tls_port_fails_cleanly() {
    let pki = Pki::new("web-plain");
    let web =
        pki.web_config("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n");
    let exporter = secure_exporter(&web);
    let url = format!("http://{}/metrics", addr(&exporter));
    let started = Instant::now();
    let (status, body) = e2e_tests::try_get(&url, &[]).expect("an HTTP answer, not a hang");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered in {:?}",
        started.elapsed()
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("Client sent an HTTP request to an HTTPS server"),
        "{body}"
    );
    // And HTTPS on the same port still works.
    let r = https_get(&addr(&exporter), pki.client(), "/metrics", None).expect("https");
    assert_eq!(r.status, 200);
}

#[test]
fn client_certificates_are_required_and_verified() {
    let pki = Pki::new("web-mtls");
    let clients = Ca::new("client CA");
    std::fs::write(pki.dir.join("clients-ca.pem"), clients.pem()).expect("write client CA");
    let web = pki.web_config(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: clients-ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n  min_version: TLS12\nhttp_server_config:\n  http2: false\n",
    );
    let exporter = secure_exporter(&web);
    let a = addr(&exporter);

    let prometheus = clients.client("prometheus", &["monitoring"]);
    let r = https_get(
        &a,
        client_config(&pki.ca.pem(), Some(&prometheus)),
        "/metrics",
        None,
    )
    .expect("a certificate from the client CA is accepted");
    assert_eq!(r.status, 200);
    assert!(r.body.contains("DCGM_FI_DEV_GPU_UTIL{"));

    let e = https_get(&a, client_config(&pki.ca.pem(), None), "/metrics", None)
        .expect_err("no client certificate");
    assert!(!e.is_empty());
    let stranger = Ca::new("some other CA").client("prometheus", &["monitoring"]);
    let e = https_get(
        &a,
        client_config(&pki.ca.pem(), Some(&stranger)),
        "/metrics",
        None,
    )
    .expect_err("a certificate from another CA");
    assert!(!e.is_empty());

    // http2: false: ALPN offers HTTP/1.1 only.
    let mut h2 = client_config(&pki.ca.pem(), Some(&prometheus));
    h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let r = https_get(&a, h2, "/healthz", None).expect("healthz");
    assert_eq!(r.alpn.as_deref(), Some(&b"http/1.1"[..]));
}

/// A self-signed client certificate with these SANs (DNS names or IPs).
fn self_signed_client(sans: &[&str]) -> Leaf {
    let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).expect("params");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("certificate");
    Leaf {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[test]
fn client_allowed_sans_are_enforced() {
    let pki = Pki::new("web-sans");
    let web = pki.web_config(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [prometheus.monitoring.svc, 10.9.8.7]\n",
    );
    let exporter = secure_exporter(&web);
    let a = addr(&exporter);
    let get = |leaf: &Leaf, path: &str| {
        https_get(&a, client_config(&pki.ca.pem(), Some(leaf)), path, None)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    };
    let by_dns = self_signed_client(&["prometheus.monitoring.svc"]);
    assert_eq!(get(&by_dns, "/metrics").status, 200);
    let by_ip = self_signed_client(&["other.example", "10.9.8.7"]);
    assert_eq!(get(&by_ip, "/metrics").status, 200);
    let other = self_signed_client(&["grafana.monitoring.svc"]);
    let r = get(&other, "/metrics");
    assert_eq!(r.status, 403, "{r:?}");
    assert!(!r.body.contains("DCGM"));
    // RequireAnyClientCert still demands a certificate.
    https_get(&a, client_config(&pki.ca.pem(), None), "/metrics", None)
        .expect_err("no client certificate");
}

#[test]
fn certificates_and_users_rotate_without_restart() {
    let pki = Pki::new("web-rotate");
    let yaml = |password: &str| {
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  prometheus: '{}'\n",
            bcrypt_hash(password)
        )
    };
    let web = pki.web_config(&yaml("first"));
    let exporter = secure_exporter(&web);
    let a = addr(&exporter);
    let first = https_get(&a, pki.client(), "/healthz", None).expect("first certificate");
    assert_eq!(first.status, 200);

    let next = pki.ca.server(&["127.0.0.1", "localhost"]);
    let next_der = der_of(&next);
    assert_ne!(first.server_cert, next_der);
    next.write(&pki.dir, "server");
    let served = try_wait_for(Duration::from_secs(20), || {
        let r = https_get(&a, pki.client(), "/healthz", None).ok()?;
        (r.server_cert == next_der).then_some(r)
    });
    assert!(
        served.is_some(),
        "the rotated certificate is served; log:\n{}",
        exporter.process.log()
    );

    // Users rotate too: the old password stops working, the new one works.
    assert_eq!(
        https_get(
            &a,
            pki.client(),
            "/metrics",
            Some(&basic("prometheus", "first"))
        )
        .expect("get")
        .status,
        200
    );
    pki.web_config(&yaml("second"));
    let switched = try_wait_for(Duration::from_secs(20), || {
        let r = https_get(
            &a,
            pki.client(),
            "/metrics",
            Some(&basic("prometheus", "second")),
        )
        .ok()?;
        (r.status == 200).then_some(())
    });
    assert!(
        switched.is_some(),
        "the new password is accepted; log:\n{}",
        exporter.process.log()
    );
    let old = https_get(
        &a,
        pki.client(),
        "/metrics",
        Some(&basic("prometheus", "first")),
    )
    .expect("get");
    assert_eq!(old.status, 401);

    // A broken rewrite keeps the running configuration, and says so.
    pki.web_config("tls_server_config:\n  cert_file: server.crt\n  key_file: missing.key\n");
    let mut process = exporter.process;
    let line = process.wait_for_line("missing.key", Duration::from_secs(20));
    assert!(line.contains("does not load"), "{line}");
    let still = https_get(
        &a,
        pki.client(),
        "/metrics",
        Some(&basic("prometheus", "second")),
    )
    .expect("still serving");
    assert_eq!(still.status, 200);
    assert_eq!(still.server_cert, next_der);
}

#[test]
fn a_bad_web_config_stops_startup_naming_the_problem() {
    let pki = Pki::new("web-bad");
    let hash = bcrypt_hash("pw");
    for (name, yaml, want) in [
        (
            "unknown-key.yml",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth: RequireAndVerifyClientCert\n".to_string(),
            "unknown key `client_auth`",
        ),
        (
            "tls10.yml",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS10\n".to_string(),
            "TLS 1.2 and 1.3 only",
        ),
        (
            "missing-cert.yml",
            "tls_server_config:\n  cert_file: nowhere.crt\n  key_file: server.key\n".to_string(),
            "nowhere.crt",
        ),
        (
            "bad-auth-type.yml",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: Sometimes\n".to_string(),
            "client_auth_type: invalid value \"Sometimes\"",
        ),
        (
            "bad-hash.yml",
            "basic_auth_users:\n  alice: hunter2\n".to_string(),
            "user \"alice\": not a bcrypt hash",
        ),
        (
            "wrong-key.yml",
            format!(
                "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\nbasic_auth_users:\n  a: '{hash}'\n"
            ),
            "the private key does not belong to the certificate",
        ),
    ] {
        if name == "wrong-key.yml" {
            pki.ca.server(&["127.0.0.1"]).write(&pki.dir, "other");
        }
        let path = pki.dir.join(name);
        std::fs::write(&path, yaml).expect("write");
        let mut cmd = Command::new(binary("gpu-exporter"));
        cmd.args(["--simulate=builtin:default", "-a", "127.0.0.1:0", "--web-config-file"])
            .arg(&path)
            .env_remove("DCGM_EXPORTER_WEB_CONFIG_FILE")
            .env("RUST_LOG", "info");
        let mut process = Process::spawn(cmd);
        let code = process.wait_exit(Duration::from_secs(30));
        // The log readers may still be collecting the last lines.
        let log = try_wait_for(Duration::from_secs(5), || {
            let log = process.log();
            log.contains("gpu-exporter: ").then_some(log)
        })
        .unwrap_or_else(|| process.log());
        assert_eq!(code, Some(1), "{name}: {log}");
        assert!(
            log.contains(&format!("web config file {}", path.display())),
            "{name} names the file: {log}"
        );
        assert!(log.contains(want), "{name}: want {want:?} in {log}");
        assert!(!log.contains("hunter2"), "{name}: a bad hash is not echoed: {log}");
        assert!(!log.contains("listening"), "{name}: {log}");
    }
}

#[test]
fn basic_auth_over_plain_http_with_a_rate_limit() {
    let pki = Pki::new("web-plain-auth");
    let web = pki.web_config(&format!(
        "basic_auth_users:\n  prometheus: '{}'\nrate_limit:\n  interval: 1h\n  burst: 2\n",
        bcrypt_hash("pw")
    ));
    let mut exporter = Exporter::start(
        &[
            "--simulate=builtin:default",
            "--web-config-file",
            web.to_str().expect("utf-8 path"),
        ],
        &[],
    );
    // Allowed, and said to be unwise.
    exporter
        .process
        .wait_for_line("basic authentication without TLS", Duration::from_secs(10));
    let auth = basic("prometheus", "pw");
    let get = |path: &str, auth: Option<&str>| {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        e2e_tests::get_with(&exporter.url(path), &headers)
    };
    // Health checks take no tokens.
    for _ in 0..5 {
        assert_eq!(get("/healthz", None).0, 200);
    }
    assert_eq!(get("/metrics", None).0, 401, "a token spent on a refusal");
    assert_eq!(get("/metrics", Some(&auth)).0, 200);
    let (status, body) = get("/metrics", Some(&auth));
    assert_eq!(status, 429, "burst of 2 spent: {body}");
    assert_eq!(body, "Too Many Requests\n");
    assert_eq!(get("/healthz", None).0, 200, "probes are never throttled");
}

/// The metrics adapter scrapes an exporter that requires TLS and basic auth: it
/// verifies the certificate for the Service name (exporters are scraped by IP), sends
/// the password from a file, and a wrong password leaves it unready with the 401 logged.
#[test]
fn the_metrics_adapter_scrapes_a_tls_and_basic_auth_exporter() {
    let pki = Pki::new("web-adapter");
    // A certificate for the Service name only, as a cluster's would be.
    pki.ca
        .server(&["gpu-exporter.gpu-monitoring.svc"])
        .write(&pki.dir, "service");
    let web = pki.web_config(&format!(
        "tls_server_config:\n  cert_file: service.crt\n  key_file: service.key\nbasic_auth_users:\n  adapter: '{}'\n",
        bcrypt_hash("adapter-secret")
    ));
    let exporter = secure_exporter(&web);
    let url = format!("https://{}/metrics", addr(&exporter));
    let ca = pki.ca_file();
    let adapter = |password: &str, name: &str| {
        let file = pki.dir.join(format!("{name}.password"));
        // With the trailing newline `kubectl create secret --from-file` keeps.
        std::fs::write(&file, format!("{password}\n")).expect("write password");
        Adapter::start(&[
            &format!("--exporter-url={url}"),
            &format!("--exporter-ca-file={}", ca.display()),
            "--exporter-tls-server-name=gpu-exporter.gpu-monitoring.svc",
            "--exporter-basic-auth-username=adapter",
            &format!("--exporter-basic-auth-password-file={}", file.display()),
            "--scrape-interval=200ms",
        ])
    };

    let good = adapter("adapter-secret", "good");
    wait_for(
        "the adapter ready on the TLS exporter",
        Duration::from_secs(30),
        || (good.get("/readyz").0 == 200).then_some(()),
    );

    let mut wrong = adapter("not-it", "wrong");
    wrong
        .process
        .wait_for_line("HTTP 401", Duration::from_secs(30));
    assert_eq!(wrong.get("/readyz").0, 503, "no exporter answered it");
}

/// The bcrypt flood of issue 20: 256 clients, each from its own address, send random
/// passwords while Prometheus keeps scraping with the right one. The scraper is answered
/// 200 within its scrape timeout throughout; each flooding client is limited (429 with
/// `Retry-After`) after its allowance of failures; and a limited client with the right
/// password gets in once its `Retry-After` has passed.
#[test]
fn a_wrong_password_flood_neither_starves_the_scraper_nor_goes_unlimited() {
    const CLIENTS: u8 = 255; // 127.0.1.1 ..= 127.0.1.255, plus 127.0.2.1 below: 256.
    const GUESSES: usize = 16;
    const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
    const ALLOWED_FAILURES: usize = 10;
    let dir = scratch_dir("bcrypt-flood");
    // Cost 6: each wrong guess costs the exporter real bcrypt work (tens of ms in a
    // debug build), so the shared queue does fill.
    let hash = bcrypt::hash("scrape-secret", 6).expect("hash");
    let other_hash = bcrypt::hash("other-secret", 6).expect("hash");
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!("basic_auth_users:\n  prometheus: '{hash}'\n  other: '{other_hash}'\n"),
    )
    .expect("web");
    let e = exporter_with_web_config(&web);
    let to: std::net::SocketAddr = e
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("exporter address");
    let right = basic("prometheus", "scrape-secret");
    let rt = runtime();
    rt.block_on(async move {
        let local = std::net::Ipv4Addr::LOCALHOST;
        // Prometheus verifies its password once before the flood.
        assert_eq!(
            get_from(local, to, "/metrics", &right)
                .await
                .expect("scrape")
                .0,
            200
        );
        let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let scraper = {
            let (flooding, right) = (flooding.clone(), right.clone());
            tokio::spawn(async move {
                let mut scrapes = Vec::new();
                while flooding.load(std::sync::atomic::Ordering::Acquire) {
                    let started = Instant::now();
                    let answer = tokio::time::timeout(
                        SCRAPE_TIMEOUT,
                        get_from(local, to, "/metrics", &right),
                    )
                    .await;
                    scrapes.push((started.elapsed(), answer));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                scrapes
            })
        };
        let flood_started = Instant::now();
        let floods: Vec<_> = (1..=CLIENTS)
            .map(|host| {
                tokio::spawn(async move {
                    let from = std::net::Ipv4Addr::new(127, 0, 1, host);
                    let mut answers = Vec::new();
                    for guess in 0..GUESSES {
                        let wrong = basic(
                            "prometheus",
                            &format!("guess-{host}-{guess}-{}", rand_suffix()),
                        );
                        answers.push(
                            get_from(from, to, "/metrics", &wrong)
                                .await
                                .expect("answer"),
                        );
                    }
                    answers
                })
            })
            .collect();
        let mut per_client = Vec::new();
        for f in floods {
            per_client.push(f.await.expect("flooding client"));
        }
        let flood_time = flood_started.elapsed();
        flooding.store(false, std::sync::atomic::Ordering::Release);
        let scrapes = scraper.await.expect("scraper");
        assert!(!scrapes.is_empty());
        for (took, answer) in &scrapes {
            let status = answer
                .as_ref()
                .unwrap_or_else(|_| panic!("a scrape timed out during the flood"))
                .as_ref()
                .expect("scrape answer")
                .0;
            assert_eq!(status, 200, "scrape during the flood, after {took:?}");
            assert!(*took < SCRAPE_TIMEOUT);
        }
        // Failed checks each client got: its allowance, plus what grew back meanwhile
        // (one per 6 s).
        let grown_back = (flood_time.as_secs() / 6) as usize + 1;
        for (i, answers) in per_client.iter().enumerate() {
            let failures = answers.iter().filter(|(s, _)| *s == 401).count();
            assert!(
                failures <= ALLOWED_FAILURES + grown_back,
                "client {i} had {failures} password checks in {flood_time:?}"
            );
            assert!(
                answers.iter().all(|(s, _)| *s == 401 || *s == 429),
                "client {i}: {answers:?}"
            );
            assert!(
                answers
                    .iter()
                    .filter(|(s, _)| *s == 429)
                    .all(|(_, retry)| retry.is_some_and(|r| r >= 1)),
                "429 without Retry-After for client {i}: {answers:?}"
            );
        }
        let limited = per_client
            .iter()
            .filter(|a| a.iter().any(|(s, _)| *s == 429))
            .count();
        assert_eq!(
            limited,
            per_client.len(),
            "every flooding client was turned away"
        );

        // A client that used up its allowance: turned away even with a right password
        // that has not been verified yet (Prometheus's is, and would pass), and let in
        // once its Retry-After has passed.
        let right = basic("other", "other-secret");
        let from = std::net::Ipv4Addr::new(127, 0, 2, 1);
        let mut retry_after = None;
        for guess in 0..=ALLOWED_FAILURES {
            let wrong = basic("prometheus", &format!("last-{guess}"));
            let (status, retry) = get_from(from, to, "/metrics", &wrong)
                .await
                .expect("answer");
            if status == 429 && retry.is_some() {
                retry_after = retry;
                break;
            }
        }
        let retry_after = retry_after.expect("limited after its allowance");
        let limited_at = Instant::now();
        let (status, _) = get_from(from, to, "/metrics", &right)
            .await
            .expect("answer");
        assert_eq!(status, 429, "still limited before Retry-After");
        let deadline = limited_at + Duration::from_secs(retry_after + 5);
        loop {
            let (status, _) = get_from(from, to, "/metrics", &right)
                .await
                .expect("answer");
            if status == 200 {
                assert!(
                    limited_at.elapsed() + Duration::from_secs(1)
                        >= Duration::from_secs(retry_after),
                    "let in before Retry-After"
                );
                break;
            }
            assert_eq!(status, 429);
            assert!(Instant::now() < deadline, "the right password never got in");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}

/// Random enough to defeat any caching of wrong passwords.
fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}
