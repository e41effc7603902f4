//! `--web-config-file`: the Prometheus exporter-toolkit web configuration
//! (`web-config.yml`, the file dcgm-exporter users already have), parsed strictly into a
//! typed [`WebConfig`], and the rustls server configuration it describes.
//!
//! What is read, and how it differs from exporter-toolkit (a Go program on `crypto/tls`):
//!
//! - `tls_server_config`: `cert_file`/`key_file` or inline `cert`/`key` (PEM),
//!   `client_ca_file` or inline `client_ca`, `client_auth_type` (all five Go policies, and
//!   the old alias `RequireClientCert`), `client_allowed_sans`, `min_version`,
//!   `max_version`, `cipher_suites`, `curve_preferences`, `prefer_server_cipher_suites`.
//! - `http_server_config`: `http2` and `headers` (the same five headers exporter-toolkit
//!   allows, with the same value checks).
//! - `basic_auth_users`: user → bcrypt hash (`$2a$`, `$2b$`, `$2y$`).
//! - `rate_limit`: `interval` (a Go duration) and `burst`, a token bucket over every
//!   request except the health endpoints.
//!
//! Unknown keys, duplicate keys and values of the wrong type are errors, as with
//! exporter-toolkit's strict YAML decoding; every error names the file. Relative paths
//! resolve against the directory of the web config file, as exporter-toolkit does.
//!
//! rustls speaks TLS 1.2 and 1.3 only, with a fixed set of modern suites (ECDHE key
//! exchange and AEAD ciphers only: no CBC, no RSA key exchange) and key-exchange groups
//! (X25519, P-256, P-384). So:
//!
//! - `min_version`/`max_version` `TLS10` or `TLS11` are errors that say so, and
//!   `max_version: TLS12` is an error too (rustls cannot cap a server below 1.3 through
//!   the configuration this exporter builds). `TLS12` and `TLS13` minimums are honoured.
//! - `cipher_suites` and `curve_preferences` can only be honoured when they allow at least
//!   everything rustls would negotiate (then nothing outside the list is ever used):
//!   a list that leaves out one of rustls' TLS 1.2 suites, or one of its groups, is an
//!   error naming what is missing, rather than a silently wider policy than written.
//!   With `min_version: TLS13`, `cipher_suites` does not apply (as in Go, it governs
//!   TLS 1.2 only), so any known names are accepted. Preference order within the lists is
//!   rustls' own.
//! - `prefer_server_cipher_suites` is honoured: rustls then picks its own preferred suite
//!   among those the client offers instead of the client's favourite.
//! - `client_allowed_sans` is checked per request from the connection's client
//!   certificate: a request whose certificate has no listed SAN is answered `403`,
//!   where exporter-toolkit ends the handshake. Either way nothing is served.
//! - A verifying `client_auth_type` without a client CA is an error (Go would quietly
//!   verify against the system roots).
//! - Setting both the inline and the file form of the certificate, key or client CA is
//!   an error (Go silently prefers the file).

use axum::http::{HeaderName, HeaderValue};
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tls_serving::{ClientAuth, MinTlsVersion};

/// A web config file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("web config file {}: {problem}", path.display())]
pub struct WebConfigError {
    pub path: PathBuf,
    pub problem: String,
}

/// A validated web configuration.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// The file it was read from.
    pub path: PathBuf,
    /// HTTPS settings; `None` serves plain HTTP.
    pub tls: Option<TlsSettings>,
    /// Offer HTTP/2 by ALPN (default true).
    pub http2: bool,
    /// Response headers to add (only those exporter-toolkit allows).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// User name → bcrypt hash; empty means no basic authentication.
    pub users: BTreeMap<String, String>,
    /// Requests allowed per `interval`, with bursts up to `burst`.
    pub rate_limit: Option<RateLimit>,
}

/// Where PEM text comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PemSource {
    File(PathBuf),
    Inline(String),
}

/// exporter-toolkit's `client_auth_type` values (Go's `tls.ClientAuthType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuthType {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuthType {
    fn parse(s: &str) -> Option<ClientAuthType> {
        Some(match s {
            "" | "NoClientCert" => ClientAuthType::NoClientCert,
            "RequestClientCert" => ClientAuthType::RequestClientCert,
            // "RequireClientCert" is exporter-toolkit's backwards-compatible alias.
            "RequireAnyClientCert" | "RequireClientCert" => ClientAuthType::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => ClientAuthType::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => ClientAuthType::RequireAndVerifyClientCert,
            _ => return None,
        })
    }

    fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuthType::VerifyClientCertIfGiven | ClientAuthType::RequireAndVerifyClientCert
        )
    }
}

/// The `tls_server_config` section, validated.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub cert: PemSource,
    pub key: PemSource,
    pub client_ca: Option<PemSource>,
    pub client_auth: ClientAuthType,
    pub min_version: MinTlsVersion,
    pub prefer_server_cipher_suites: bool,
    /// A client certificate must carry one of these SANs (DNS, IP, e-mail or URI), exactly.
    pub client_allowed_sans: Option<Vec<String>>,
}

/// exporter-toolkit's token bucket: one request per `interval`, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub interval: Duration,
    pub burst: u32,
}

// The file as written. Every section rejects unknown keys, as Go's UnmarshalStrict does.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    tls_server_config: Option<RawTls>,
    #[serde(default)]
    http_server_config: Option<RawHttp>,
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    prefer_server_cipher_suites: Option<bool>,
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    interval: Option<GoDuration>,
    burst: Option<u32>,
}

/// A Go `time.Duration` as YAML gives it: a string such as `1s` or `250ms`, or an
/// integer number of nanoseconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum GoDuration {
    Nanos(u64),
    Text(String),
}

/// The headers exporter-toolkit lets a web config add, and the values it allows (none
/// listed: any value).
const ALLOWED_HEADERS: &[(&str, &[&str])] = &[
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// Go's names for the cipher suites `crypto/tls` knows (`tls.CipherSuites()` and
/// `tls.InsecureCipherSuites()`): exporter-toolkit rejects any other name.
const GO_CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// The TLS 1.2 suites rustls (ring provider) negotiates, by their Go names.
const RUSTLS_TLS12_SUITES: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
];

/// exporter-toolkit's curve names.
const GO_CURVES: &[&str] = &["CurveP256", "CurveP384", "CurveP521", "X25519"];

/// The key-exchange groups rustls (ring provider) uses, by exporter-toolkit's names.
const RUSTLS_CURVES: &[&str] = &["X25519", "CurveP256", "CurveP384"];

impl WebConfig {
    /// Read and validate `path`. The certificate, key and CA files it names are read
    /// by [`WebConfig::server_config`].
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let text = kube_support::config_file::read_to_string(
            path,
            kube_support::config_file::DEFAULT_LIMIT,
        )
        .map_err(|e| WebConfigError {
            path: path.to_owned(),
            problem: format!("cannot read it: {e}"),
        })?;
        WebConfig::parse(&text, path)
    }

    /// Validate the text of a web config file read from `path` (which names it in
    /// errors, and whose directory relative paths resolve against).
    pub fn parse(text: &str, path: &Path) -> Result<WebConfig, WebConfigError> {
        let fail = |problem: String| WebConfigError {
            path: path.to_owned(),
            problem,
        };
        let raw: RawConfig = if is_blank_yaml(text) {
            // An empty file is a valid configuration that changes nothing, as in Go.
            RawConfig::default()
        } else {
            // No source snippet: the message names the file, line and column instead.
            let options = serde_saphyr::options! { with_snippet: false };
            serde_saphyr::from_str_with_options(text, options)
                .map_err(|e| fail(yaml_problem(&e.to_string())))?
        };
        let dir = path.parent().unwrap_or(Path::new(""));

        let tls = match raw.tls_server_config {
            Some(t) => tls_settings(t, dir).map_err(|why| fail(why.to_string()))?,
            None => None,
        };

        let http = raw.http_server_config.unwrap_or_default();
        let mut headers = Vec::new();
        for (name, value) in http.headers.unwrap_or_default() {
            let Some((_, allowed)) = ALLOWED_HEADERS.iter().find(|(n, _)| *n == name) else {
                return Err(fail(format!(
                    "http_server_config.headers: HTTP header {name:?} can not be configured (allowed: {})",
                    ALLOWED_HEADERS
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            if value.is_empty() {
                // "Unset if blank."
                continue;
            }
            if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
                return Err(fail(format!(
                    "http_server_config.headers: invalid value for {name}: expected one of {allowed:?}, got {value:?}"
                )));
            }
            let header_value = HeaderValue::from_str(&value).map_err(|_| {
                fail(format!(
                    "http_server_config.headers: {name}: {value:?} is not a valid header value"
                ))
            })?;
            // Every allowed name is a valid header name; the error path is unreachable.
            let header_name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| fail(format!("http_server_config.headers: {name}: {e}")))?;
            headers.push((header_name, header_value));
        }

        let users = raw.basic_auth_users.unwrap_or_default();
        for (user, hash) in &users {
            check_bcrypt_hash(hash)
                .map_err(|why| fail(format!("basic_auth_users: user {user:?}: {why}")))?;
        }

        let rate_limit = match raw.rate_limit {
            None => None,
            Some(r) => rate_limit(r).map_err(|why| fail(why.to_string()))?,
        };

        Ok(WebConfig {
            path: path.to_owned(),
            tls,
            http2: http.http2.unwrap_or(true),
            headers,
            users,
            rate_limit,
        })
    }

    /// The files this configuration depends on: itself, then the certificate, key and
    /// client CA files it names. Rotation watches them all.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.path.clone()];
        if let Some(tls) = &self.tls {
            for source in [Some(&tls.cert), Some(&tls.key), tls.client_ca.as_ref()]
                .into_iter()
                .flatten()
            {
                if let PemSource::File(p) = source {
                    files.push(p.clone());
                }
            }
        }
        files
    }

    /// The rustls configuration for HTTPS, reading the certificate, key and CA; `None`
    /// when the file configures no TLS.
    pub fn server_config(&self) -> Result<Option<ServerConfig>, WebConfigError> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        let fail = |problem: String| WebConfigError {
            path: self.path.clone(),
            problem,
        };
        let chain = match &tls.cert {
            PemSource::File(p) => tls_serving::load_cert_chain(p).map_err(|e| {
                fail(format!(
                    "tls_server_config.cert_file: {}",
                    tls_error(&e.to_string())
                ))
            })?,
            PemSource::Inline(text) => {
                let chain = CertificateDer::pem_slice_iter(text.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| fail(format!("tls_server_config.cert: {e}")))?;
                if chain.is_empty() {
                    return Err(fail("tls_server_config.cert: no CERTIFICATE block".into()));
                }
                chain
            }
        };
        let key: PrivateKeyDer<'static> = match &tls.key {
            PemSource::File(p) => tls_serving::load_private_key(p).map_err(|e| {
                fail(format!(
                    "tls_server_config.key_file: {}",
                    tls_error(&e.to_string())
                ))
            })?,
            PemSource::Inline(text) => PrivateKeyDer::from_pem_slice(text.as_bytes())
                .map_err(|e| fail(format!("tls_server_config.key: {e}")))?,
        };
        let roots = match (&tls.client_ca, tls.client_auth.verifies()) {
            (Some(PemSource::File(p)), true) => {
                Some(Arc::new(tls_serving::load_ca_bundle(p).map_err(|e| {
                    fail(format!(
                        "tls_server_config.client_ca_file: {}",
                        tls_error(&e.to_string())
                    ))
                })?))
            }
            (Some(PemSource::Inline(text)), true) => Some(Arc::new(
                tls_serving::ca_bundle_from_pem(&self.path, text.as_bytes()).map_err(|e| {
                    fail(format!(
                        "tls_server_config.client_ca: {}",
                        tls_error(&e.to_string())
                    ))
                })?,
            )),
            _ => None,
        };
        let client_auth = match (tls.client_auth, roots) {
            (ClientAuthType::NoClientCert, _) => ClientAuth::None,
            (ClientAuthType::RequestClientCert, _) => ClientAuth::Request,
            (ClientAuthType::RequireAnyClientCert, _) => ClientAuth::RequireAny,
            (ClientAuthType::VerifyClientCertIfGiven, Some(roots)) => {
                ClientAuth::VerifyIfGiven(roots)
            }
            (ClientAuthType::RequireAndVerifyClientCert, Some(roots)) => {
                ClientAuth::RequireAndVerify(roots)
            }
            // Validation makes a verifying policy come with a CA.
            (_, None) => {
                return Err(fail(
                    "tls_server_config: this client_auth_type needs client_ca_file or client_ca"
                        .into(),
                ));
            }
        };
        let mut config = tls_serving::server_config(chain, key, client_auth, tls.min_version)
            .map_err(|e| fail(format!("tls_server_config: {}", tls_error(&e.to_string()))))?;
        config.ignore_client_order = tls.prefer_server_cipher_suites;
        if !self.http2 {
            // tls_serving serves a configuration without h2 in its ALPN list as
            // HTTP/1.1 only, prior-knowledge h2 included.
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        Ok(Some(config))
    }
}

/// Plainer words for rustls' and the PEM reader's errors.
fn tls_error(message: &str) -> String {
    if message.contains("KeyMismatch") || message.contains("keys do not match") {
        format!("{message} (the private key does not belong to the certificate)")
    } else {
        message.to_string()
    }
}

/// Whether `text` holds no YAML document at all (blank, or only comments).
fn is_blank_yaml(text: &str) -> bool {
    text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    })
}

/// The YAML library's message (`line L column C: ...`) in the words of this file:
/// serde's "unknown field" is a key here, and its duplicate-key hint names a Rust option.
fn yaml_problem(message: &str) -> String {
    let message = message.trim();
    message
        .strip_prefix("error: ")
        .unwrap_or(message)
        .replace("unknown field", "unknown key")
        .replace(", set DuplicateKeyPolicy in Options if acceptable", "")
}

/// A setting of the file that cannot be used: which one, and why.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {why}")]
pub struct InvalidSetting {
    pub setting: &'static str,
    pub why: String,
}

fn invalid(setting: &'static str, why: impl Into<String>) -> InvalidSetting {
    InvalidSetting {
        setting,
        why: why.into(),
    }
}

fn tls_settings(t: RawTls, dir: &Path) -> Result<Option<TlsSettings>, InvalidSetting> {
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
    let cert_inline = non_empty(t.cert);
    let key_inline = non_empty(t.key);
    let ca_inline = non_empty(t.client_ca);
    let cert_file = non_empty(t.cert_file);
    let key_file = non_empty(t.key_file);
    let ca_file = non_empty(t.client_ca_file);
    let auth_name = t.client_auth_type.unwrap_or_default();

    let min_version = tls_versions(t.min_version.as_deref(), t.max_version.as_deref())?;
    if let Some(suites) = &t.cipher_suites {
        check_cipher_suites(suites, min_version)?;
    }
    if let Some(curves) = &t.curve_preferences {
        check_curves(curves)?;
    }
    let client_auth = ClientAuthType::parse(&auth_name).ok_or_else(|| {
        invalid(
            "tls_server_config.client_auth_type",
            format!(
                "invalid value {auth_name:?} (NoClientCert, RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
            ),
        )
    })?;

    // exporter-toolkit's IsEnabled: any of these turns TLS on; the rest alone do not.
    let enabled = cert_inline.is_some()
        || key_inline.is_some()
        || ca_inline.is_some()
        || cert_file.is_some()
        || key_file.is_some()
        || ca_file.is_some()
        || !auth_name.is_empty();
    if !enabled {
        if t.client_allowed_sans.is_some() {
            return Err(invalid(
                "tls_server_config.client_allowed_sans",
                "needs TLS: set cert_file and key_file",
            ));
        }
        if t.min_version.is_some() || t.max_version.is_some() || t.cipher_suites.is_some() {
            tracing::warn!(
                "tls_server_config has no certificate, key, client CA or client_auth_type: TLS stays off and its other settings are ignored"
            );
        }
        return Ok(None);
    }

    let cert = pem_source(dir, "cert", cert_inline, cert_file)?
        .ok_or_else(|| invalid("tls_server_config", "missing one of cert or cert_file"))?;
    let key = pem_source(dir, "key", key_inline, key_file)?
        .ok_or_else(|| invalid("tls_server_config", "missing one of key or key_file"))?;
    let client_ca = pem_source(dir, "client_ca", ca_inline, ca_file)?;
    check_client_auth(
        client_auth,
        &auth_name,
        client_ca.is_some(),
        t.client_allowed_sans.is_some(),
    )?;

    Ok(Some(TlsSettings {
        cert,
        key,
        client_ca,
        client_auth,
        min_version,
        prefer_server_cipher_suites: t.prefer_server_cipher_suites.unwrap_or(true),
        client_allowed_sans: t.client_allowed_sans,
    }))
}

/// `min_version` and `max_version`, as far as rustls can honour them: the minimum.
fn tls_versions(min: Option<&str>, max: Option<&str>) -> Result<MinTlsVersion, InvalidSetting> {
    let min_version = match min {
        None | Some("TLS12") => MinTlsVersion::Tls12,
        Some("TLS13") => MinTlsVersion::Tls13,
        Some(v @ ("TLS10" | "TLS11")) => {
            return Err(invalid(
                "tls_server_config.min_version",
                format!(
                    "{v} is not supported: this exporter's TLS (rustls) speaks TLS 1.2 and 1.3 only; use TLS12 or TLS13"
                ),
            ));
        }
        Some(v) => {
            return Err(invalid(
                "tls_server_config.min_version",
                format!("unknown TLS version {v:?} (TLS12 or TLS13)"),
            ));
        }
    };
    match max {
        None | Some("TLS13") => Ok(min_version),
        Some("TLS12") => Err(invalid(
            "tls_server_config.max_version",
            "TLS12 is not supported: this exporter always offers TLS 1.3 (rustls); remove max_version or set it to TLS13",
        )),
        Some(v @ ("TLS10" | "TLS11")) => Err(invalid(
            "tls_server_config.max_version",
            format!(
                "{v} is not supported: this exporter's TLS (rustls) speaks TLS 1.2 and 1.3 only"
            ),
        )),
        Some(v) => Err(invalid(
            "tls_server_config.max_version",
            format!("unknown TLS version {v:?} (TLS12 or TLS13)"),
        )),
    }
}

/// `cipher_suites`: Go names, and only a list rustls can honour exactly.
fn check_cipher_suites(
    suites: &[String],
    min_version: MinTlsVersion,
) -> Result<(), InvalidSetting> {
    if let Some(unknown) = suites
        .iter()
        .find(|s| !GO_CIPHER_SUITES.contains(&s.as_str()))
    {
        return Err(invalid(
            "tls_server_config.cipher_suites",
            format!("unknown cipher {unknown:?}"),
        ));
    }
    let missing: Vec<&str> = RUSTLS_TLS12_SUITES
        .iter()
        .copied()
        .filter(|s| !suites.iter().any(|l| l == s))
        .collect();
    if !suites.is_empty() && min_version == MinTlsVersion::Tls12 && !missing.is_empty() {
        return Err(invalid(
            "tls_server_config.cipher_suites",
            format!(
                "rustls cannot narrow its TLS 1.2 suites per server, and would also negotiate {}; it offers only ECDHE key exchange with AEAD ciphers ({}). List all of those, remove cipher_suites, or set min_version: TLS13",
                missing.join(", "),
                RUSTLS_TLS12_SUITES.join(", ")
            ),
        ));
    }
    Ok(())
}

/// `curve_preferences`: Go names, and only a list rustls can honour exactly.
fn check_curves(curves: &[String]) -> Result<(), InvalidSetting> {
    if let Some(unknown) = curves.iter().find(|c| !GO_CURVES.contains(&c.as_str())) {
        return Err(invalid(
            "tls_server_config.curve_preferences",
            format!("unknown curve {unknown:?}"),
        ));
    }
    let missing: Vec<&str> = RUSTLS_CURVES
        .iter()
        .copied()
        .filter(|c| !curves.iter().any(|l| l == c))
        .collect();
    if !curves.is_empty() && !missing.is_empty() {
        return Err(invalid(
            "tls_server_config.curve_preferences",
            format!(
                "rustls cannot narrow its key-exchange groups per server, and would also use {}; it uses exactly {}. List all of those or remove curve_preferences",
                missing.join(", "),
                RUSTLS_CURVES.join(", ")
            ),
        ));
    }
    Ok(())
}

/// One PEM input given inline (`what`) or as a file (`what_file`, relative to `dir`).
fn pem_source(
    dir: &Path,
    what: &str,
    inline: Option<String>,
    file: Option<String>,
) -> Result<Option<PemSource>, InvalidSetting> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(invalid(
            "tls_server_config",
            format!("both {what} and {what}_file are set; use one"),
        )),
        (Some(text), None) => Ok(Some(PemSource::Inline(text))),
        (None, Some(f)) => {
            let p = PathBuf::from(f);
            Ok(Some(PemSource::File(if p.is_absolute() {
                p
            } else {
                dir.join(p)
            })))
        }
        (None, None) => Ok(None),
    }
}

/// The client-certificate policy agrees with the CA and the SAN allow-list.
fn check_client_auth(
    client_auth: ClientAuthType,
    auth_name: &str,
    has_client_ca: bool,
    has_allowed_sans: bool,
) -> Result<(), InvalidSetting> {
    if has_client_ca && client_auth == ClientAuthType::NoClientCert {
        return Err(invalid(
            "tls_server_config",
            "a client CA is configured but client_auth_type is NoClientCert (set client_auth_type, e.g. RequireAndVerifyClientCert)",
        ));
    }
    if client_auth.verifies() && !has_client_ca {
        return Err(invalid(
            "tls_server_config",
            format!(
                "client_auth_type {auth_name} needs client_ca_file (or client_ca) to verify client certificates against"
            ),
        ));
    }
    if has_allowed_sans
        && !matches!(
            client_auth,
            ClientAuthType::RequireAnyClientCert | ClientAuthType::RequireAndVerifyClientCert
        )
    {
        return Err(invalid(
            "tls_server_config",
            "client_allowed_sans requires client_auth_type to be one of RequireAnyClientCert or RequireAndVerifyClientCert",
        ));
    }
    Ok(())
}

/// What Go's bcrypt accepts: `$2a$`, `$2b$` or `$2y$`, a cost of 4 to 31, and 53
/// characters of salt and hash in bcrypt's base64 alphabet.
/// Why a `basic_auth_users` value is not a hash Go's bcrypt accepts. The value itself is
/// never part of the message.
#[derive(Debug, thiserror::Error)]
pub enum BadHash {
    #[error(
        "not a bcrypt hash (expected $2a$, $2b$ or $2y$, a cost and 53 characters); make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
    )]
    NotBcrypt,
    #[error("bcrypt cost {0} is outside 4..31")]
    Cost(u32),
    #[error("$2x$ bcrypt hashes are not accepted (use $2a$, $2b$ or $2y$)")]
    Version2x,
    #[error("not a bcrypt hash (characters outside bcrypt's base64 alphabet)")]
    Alphabet,
}

fn check_bcrypt_hash(hash: &str) -> Result<(), BadHash> {
    // The value is not echoed: a plain password written here by mistake must not reach
    // the logs.
    let parts: bcrypt::HashParts = hash.parse().map_err(|_| BadHash::NotBcrypt)?;
    if !(4..=31).contains(&parts.get_cost()) {
        return Err(BadHash::Cost(parts.get_cost()));
    }
    if hash.starts_with("$2x$") {
        return Err(BadHash::Version2x);
    }
    let body = hash.rsplit('$').next().unwrap_or_default();
    if !body
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
    {
        return Err(BadHash::Alphabet);
    }
    Ok(())
}

pub(crate) fn bcrypt_cost(hash: &str) -> Option<u32> {
    hash.parse::<bcrypt::HashParts>().ok().map(|p| p.get_cost())
}

fn rate_limit(r: RawRateLimit) -> Result<Option<RateLimit>, InvalidSetting> {
    let interval = match r.interval {
        None => Duration::ZERO,
        Some(GoDuration::Nanos(n)) => Duration::from_nanos(n),
        Some(GoDuration::Text(t)) => {
            // Go's time.ParseDuration, as exporter-toolkit's YAML decoding reads it.
            kube_support::duration::parse(&t)
                .map_err(|why| invalid("rate_limit", format!("interval: {why}")))?
        }
    };
    if interval.is_zero() {
        // "set to 0 to disable rate limiter"
        return Ok(None);
    }
    let burst = r.burst.unwrap_or(0);
    if burst == 0 {
        return Err(invalid(
            "rate_limit",
            "burst is 0, which would refuse every request; set burst to at least 1",
        ));
    }
    Ok(Some(RateLimit { interval, burst }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

    fn parse(text: &str) -> Result<WebConfig, WebConfigError> {
        WebConfig::parse(text, Path::new("/etc/gpu-exporter/web.yml"))
    }

    fn problem(text: &str) -> String {
        let e = parse(text).expect_err("should fail");
        let message = e.to_string();
        assert!(
            message.starts_with("web config file /etc/gpu-exporter/web.yml: "),
            "{message}"
        );
        message
    }

    #[test]
    fn a_full_config_parses() {
        let c = parse(&format!(
            r#"
tls_server_config:
  cert_file: tls/server.crt
  key_file: /abs/server.key
  client_ca_file: ca.pem
  client_auth_type: RequireAndVerifyClientCert
  client_allowed_sans: [prometheus.monitoring.svc, 10.0.0.7]
  min_version: TLS13
  max_version: TLS13
  prefer_server_cipher_suites: false
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  prometheus: {HASH}
  'grafana': "{HASH}"
rate_limit:
  interval: 100ms
  burst: 20
"#
        ))
        .expect("valid");
        let tls = c.tls.as_ref().expect("tls");
        assert_eq!(
            tls.cert,
            PemSource::File("/etc/gpu-exporter/tls/server.crt".into())
        );
        assert_eq!(tls.key, PemSource::File("/abs/server.key".into()));
        assert_eq!(
            tls.client_ca,
            Some(PemSource::File("/etc/gpu-exporter/ca.pem".into()))
        );
        assert_eq!(tls.client_auth, ClientAuthType::RequireAndVerifyClientCert);
        assert_eq!(tls.min_version, MinTlsVersion::Tls13);
        assert!(!tls.prefer_server_cipher_suites);
        assert_eq!(
            tls.client_allowed_sans.as_deref(),
            Some(&["prometheus.monitoring.svc".to_string(), "10.0.0.7".into()][..])
        );
        assert!(!c.http2);
        assert_eq!(c.headers.len(), 2);
        assert_eq!(c.users.len(), 2);
        assert_eq!(c.users["prometheus"], HASH);
        assert_eq!(
            c.rate_limit,
            Some(RateLimit {
                interval: Duration::from_millis(100),
                burst: 20
            })
        );
        assert_eq!(
            c.files(),
            vec![
                PathBuf::from("/etc/gpu-exporter/web.yml"),
                "/etc/gpu-exporter/tls/server.crt".into(),
                "/abs/server.key".into(),
                "/etc/gpu-exporter/ca.pem".into(),
            ]
        );
    }

    #[test]
    fn empty_and_auth_only_files_serve_plain_http() {
        for text in ["", "# nothing\n", "---\n"] {
            let c = parse(text).expect("empty is valid");
            assert!(c.tls.is_none() && c.users.is_empty() && c.http2);
        }
        let c = parse(&format!("basic_auth_users:\n  u: {HASH}\n")).expect("valid");
        assert!(c.tls.is_none());
        assert_eq!(c.users.len(), 1);
        // Only a version: TLS stays off, as in exporter-toolkit.
        let c = parse("tls_server_config:\n  min_version: TLS13\n").expect("valid");
        assert!(c.tls.is_none());
    }

    #[test]
    fn unknown_keys_are_named() {
        let m = problem("tls_server_config:\n  cert_file: a\n  key_file: b\n  cert_fiel: c\n");
        assert!(m.contains("cert_fiel"), "{m}");
        let m = problem("basic_auth_user:\n  u: x\n");
        assert!(m.contains("basic_auth_user"), "{m}");
        let m = problem("http_server_config:\n  http3: true\n");
        assert!(m.contains("http3"), "{m}");
    }

    #[test]
    fn wrong_types_and_duplicates_fail() {
        let m = problem("http_server_config:\n  http2: maybe\n");
        assert!(m.contains("http2") || m.contains("bool"), "{m}");
        let m = problem(&format!("basic_auth_users:\n  u: {HASH}\n  u: {HASH}\n"));
        assert!(m.to_lowercase().contains("duplicate"), "{m}");
    }

    #[test]
    fn client_auth_types() {
        let base = "tls_server_config:\n  cert_file: c\n  key_file: k\n";
        for (name, want) in [
            ("NoClientCert", ClientAuthType::NoClientCert),
            ("RequestClientCert", ClientAuthType::RequestClientCert),
            ("RequireAnyClientCert", ClientAuthType::RequireAnyClientCert),
            ("RequireClientCert", ClientAuthType::RequireAnyClientCert),
        ] {
            let c = parse(&format!("{base}  client_auth_type: {name}\n")).expect(name);
            assert_eq!(c.tls.expect("tls").client_auth, want);
        }
        let m = problem(&format!("{base}  client_auth_type: RequireAndVerify\n"));
        assert!(
            m.contains("client_auth_type") && m.contains("\"RequireAndVerify\""),
            "{m}"
        );
        // Verifying without a CA, a CA without asking, SANs without requiring a cert.
        let m = problem(&format!(
            "{base}  client_auth_type: RequireAndVerifyClientCert\n"
        ));
        assert!(m.contains("needs client_ca_file"), "{m}");
        let m = problem(&format!("{base}  client_ca_file: ca.pem\n"));
        assert!(m.contains("NoClientCert"), "{m}");
        let m = problem(&format!(
            "{base}  client_ca_file: ca.pem\n  client_auth_type: VerifyClientCertIfGiven\n  client_allowed_sans: [a]\n"
        ));
        assert!(m.contains("client_allowed_sans requires"), "{m}");
    }

    #[test]
    fn tls_versions() {
        let base = "tls_server_config:\n  cert_file: c\n  key_file: k\n";
        for v in ["TLS10", "TLS11"] {
            let m = problem(&format!("{base}  min_version: {v}\n"));
            assert!(m.contains(v) && m.contains("TLS 1.2 and 1.3 only"), "{m}");
        }
        let m = problem(&format!("{base}  min_version: TLS14\n"));
        assert!(m.contains("unknown TLS version"), "{m}");
        let m = problem(&format!("{base}  max_version: TLS12\n"));
        assert!(m.contains("max_version: TLS12 is not supported"), "{m}");
        let c = parse(&format!(
            "{base}  min_version: TLS12\n  max_version: TLS13\n"
        ))
        .expect("valid");
        assert_eq!(c.tls.expect("tls").min_version, MinTlsVersion::Tls12);
    }

    #[test]
    fn cipher_suites_and_curves_must_cover_what_rustls_uses() {
        let base = "tls_server_config:\n  cert_file: c\n  key_file: k\n";
        let m = problem(&format!("{base}  cipher_suites: [TLS_FOO]\n"));
        assert!(m.contains("unknown cipher \"TLS_FOO\""), "{m}");
        let m = problem(&format!(
            "{base}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
        ));
        assert!(
            m.contains("would also negotiate") && m.contains("CHACHA20"),
            "{m}"
        );
        // Everything rustls uses (plus CBC suites it never offers): honoured.
        let all = RUSTLS_TLS12_SUITES
            .iter()
            .chain(["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"].iter())
            .map(|s| format!("    - {s}\n"))
            .collect::<String>();
        parse(&format!("{base}  cipher_suites:\n{all}")).expect("superset");
        // TLS 1.3 only: cipher_suites does not apply.
        parse(&format!(
            "{base}  min_version: TLS13\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
        ))
        .expect("TLS 1.3 ignores cipher_suites");
        let m = problem(&format!("{base}  curve_preferences: [CurveP256]\n"));
        assert!(m.contains("X25519"), "{m}");
        let m = problem(&format!("{base}  curve_preferences: [Curve25519]\n"));
        assert!(m.contains("unknown curve"), "{m}");
        parse(&format!(
            "{base}  curve_preferences: [X25519, CurveP256, CurveP384, CurveP521]\n"
        ))
        .expect("superset");
    }

    #[test]
    fn missing_or_doubled_certificates() {
        let m = problem("tls_server_config:\n  key_file: k\n");
        assert!(m.contains("missing one of cert or cert_file"), "{m}");
        let m = problem("tls_server_config:\n  cert_file: c\n");
        assert!(m.contains("missing one of key or key_file"), "{m}");
        let m = problem("tls_server_config:\n  cert_file: c\n  cert: x\n  key_file: k\n");
        assert!(m.contains("both cert and cert_file"), "{m}");
        let c = parse("tls_server_config:\n  cert: |\n    PEM\n  key: KEY\n").expect("inline");
        assert_eq!(c.files(), vec![PathBuf::from("/etc/gpu-exporter/web.yml")]);
        let tls = c.tls.expect("tls");
        assert_eq!(tls.cert, PemSource::Inline("PEM\n".into()));
    }

    #[test]
    fn relative_paths_follow_the_config_file() {
        let c = WebConfig::parse(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: ../keys/server.key\n",
            Path::new("conf/web.yml"),
        )
        .expect("valid");
        let tls = c.tls.expect("tls");
        assert_eq!(tls.cert, PemSource::File("conf/server.crt".into()));
        assert_eq!(tls.key, PemSource::File("conf/../keys/server.key".into()));
        // A bare file name: relative to the working directory, as Go's filepath.Dir(".").
        let c = WebConfig::parse(
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n",
            Path::new("web.yml"),
        )
        .expect("valid");
        assert_eq!(c.tls.expect("tls").cert, PemSource::File("a.crt".into()));
    }

    #[test]
    fn bad_bcrypt_hashes() {
        for (hash, want) in [
            ("hunter2", "not a bcrypt hash"),
            ("$1$abc$def", "not a bcrypt hash"),
            (
                "$2y$03$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi",
                "outside 4..31",
            ),
            (
                "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeS",
                "not a bcrypt hash",
            ),
            (
                "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDe!i",
                "alphabet",
            ),
        ] {
            let m = problem(&format!("basic_auth_users:\n  alice: '{hash}'\n"));
            assert!(m.contains("\"alice\"") && m.contains(want), "{hash}: {m}");
        }
    }

    #[test]
    fn headers_are_restricted_like_exporter_toolkit() {
        let m = problem("http_server_config:\n  headers:\n    X-Powered-By: me\n");
        assert!(m.contains("\"X-Powered-By\" can not be configured"), "{m}");
        let m = problem("http_server_config:\n  headers:\n    X-Frame-Options: allow\n");
        assert!(m.contains("invalid value for X-Frame-Options"), "{m}");
        let c = parse("http_server_config:\n  headers:\n    X-Content-Type-Options: ''\n")
            .expect("blank unsets");
        assert!(c.headers.is_empty());
    }

    #[test]
    fn rate_limits() {
        let c = parse("rate_limit:\n  interval: 0\n  burst: 0\n").expect("disabled");
        assert_eq!(c.rate_limit, None);
        let c = parse("rate_limit:\n  interval: 1m30s\n  burst: 3\n").expect("valid");
        assert_eq!(
            c.rate_limit.expect("limit").interval,
            Duration::from_secs(90)
        );
        let m = problem("rate_limit:\n  interval: 1s\n");
        assert!(m.contains("burst is 0"), "{m}");
        let m = problem("rate_limit:\n  interval: soon\n  burst: 1\n");
        assert!(m.contains("not a duration"), "{m}");
    }

    fn pem_pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate");
        (cert.pem(), key.serialize_pem())
    }

    fn indent(pem: &str) -> String {
        pem.lines().map(|l| format!("    {l}\n")).collect()
    }

    #[test]
    fn server_configs_are_built_from_inline_pem() {
        let (cert, key) = pem_pair("localhost");
        let yaml = format!(
            "tls_server_config:\n  cert: |\n{}  key: |\n{}  client_ca: |\n{}  client_auth_type: VerifyClientCertIfGiven\n  prefer_server_cipher_suites: false\nhttp_server_config:\n  http2: false\n",
            indent(&cert),
            indent(&key),
            indent(&cert)
        );
        let c = parse(&yaml).expect("valid");
        let server = c.server_config().expect("builds").expect("TLS");
        assert_eq!(server.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert!(!server.ignore_client_order);
        // Nothing to watch but the file itself.
        assert_eq!(c.files().len(), 1);

        let default = parse(&format!(
            "tls_server_config:\n  cert: |\n{}  key: |\n{}",
            indent(&cert),
            indent(&key)
        ))
        .expect("valid")
        .server_config()
        .expect("builds")
        .expect("TLS");
        assert_eq!(
            default.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert!(default.ignore_client_order);

        // A key of another certificate.
        let (_, other_key) = pem_pair("localhost");
        let e = parse(&format!(
            "tls_server_config:\n  cert: |\n{}  key: |\n{}",
            indent(&cert),
            indent(&other_key)
        ))
        .expect("parses")
        .server_config()
        .expect_err("mismatched key");
        assert!(
            e.to_string()
                .contains("the private key does not belong to the certificate"),
            "{e}"
        );
        let e = parse("tls_server_config:\n  cert: junk\n  key: junk\n")
            .expect("parses")
            .server_config()
            .expect_err("junk");
        assert!(e.to_string().contains("tls_server_config.cert"), "{e}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = WebConfig::load(Path::new("/nonexistent/web.yml")).expect_err("missing");
        let m = e.to_string();
        assert!(
            m.contains("/nonexistent/web.yml") && m.contains("cannot read"),
            "{m}"
        );
    }
}
