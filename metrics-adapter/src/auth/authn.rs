//! Who is asking: the front-proxy (request-header) authenticator, the client-certificate
//! authenticator, and where their CAs and header names come from (flags, or the
//! `kube-system/extension-apiserver-authentication` ConfigMap the kube-apiserver keeps
//! current).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName};
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;

use super::User;
use super::x509;
use crate::error::Error;

pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
pub const CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";

/// The request-header defaults of k8s.io/apiserver, stripped from every request even
/// when configured otherwise, so that no spelling of them ever reaches a handler.
const DEFAULT_USERNAME_HEADERS: [&str; 1] = ["x-remote-user"];
const DEFAULT_GROUP_HEADERS: [&str; 1] = ["x-remote-group"];
const DEFAULT_EXTRA_PREFIXES: [&str; 1] = ["x-remote-extra-"];
const DEFAULT_UID_HEADERS: [&str; 1] = ["x-remote-uid"];

/// How the front proxy (the kube-aggregator) is recognised and what it sends.
#[derive(Debug, Clone)]
pub struct RequestHeaderConfig {
    pub ca: Arc<RootCertStore>,
    /// CNs the proxy's certificate may have; empty: any certificate from `ca`.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<HeaderName>,
    pub group_headers: Vec<HeaderName>,
    /// Lower case.
    pub extra_prefixes: Vec<String>,
    pub uid_headers: Vec<HeaderName>,
}

/// Everything certificate authentication needs, swapped whole when the ConfigMap or a
/// CA file changes.
#[derive(Debug, Clone, Default)]
pub struct AuthnConfig {
    pub client_ca: Option<Arc<RootCertStore>>,
    pub request_header: Option<RequestHeaderConfig>,
}

/// Request-header settings as text: from flags, or from the ConfigMap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHeaderSettings {
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
    pub uid_headers: Vec<String>,
}

impl RequestHeaderSettings {
    /// With `ca`, a checked configuration; header names must be valid.
    pub fn with_ca(&self, ca: Arc<RootCertStore>) -> Result<RequestHeaderConfig, Error> {
        let names = |list: &[String], default: &[&str]| -> Result<Vec<HeaderName>, Error> {
            let list: Vec<&str> = if list.is_empty() {
                default.to_vec()
            } else {
                list.iter().map(String::as_str).collect()
            };
            list.iter()
                .map(|n| {
                    HeaderName::from_bytes(n.trim().as_bytes())
                        .map_err(|_| Error::Config(format!("{n:?} is not a header name")))
                })
                .collect()
        };
        Ok(RequestHeaderConfig {
            ca,
            allowed_names: self.allowed_names.clone(),
            username_headers: names(&self.username_headers, &DEFAULT_USERNAME_HEADERS)?,
            group_headers: names(&self.group_headers, &DEFAULT_GROUP_HEADERS)?,
            extra_prefixes: if self.extra_prefixes.is_empty() {
                DEFAULT_EXTRA_PREFIXES
                    .iter()
                    .map(|p| p.to_string())
                    .collect()
            } else {
                self.extra_prefixes
                    .iter()
                    .map(|p| p.trim().to_ascii_lowercase())
                    .collect()
            },
            uid_headers: names(&self.uid_headers, &DEFAULT_UID_HEADERS)?,
        })
    }
}

/// The CAs and request-header settings the flags give. Each part the flags leave out
/// comes from the ConfigMap, as k8s.io/apiserver does: the client CA alone, and the
/// request-header settings as one group tied to `--requestheader-client-ca-file`.
#[derive(Debug, Clone, Default)]
pub struct FlagSources {
    pub client_ca_file: Option<std::path::PathBuf>,
    pub requestheader_client_ca_file: Option<std::path::PathBuf>,
    pub requestheader: RequestHeaderSettings,
}

impl FlagSources {
    /// Whether anything must come from the ConfigMap.
    pub fn needs_lookup(&self) -> bool {
        self.client_ca_file.is_none() || self.requestheader_client_ca_file.is_none()
    }

    /// The files to watch for changes.
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        self.client_ca_file
            .iter()
            .chain(self.requestheader_client_ca_file.iter())
            .cloned()
            .collect()
    }

    /// The configuration from the flags' files and, for what they leave out, the
    /// ConfigMap's data (`None`: no ConfigMap, or not looked up).
    pub fn build(
        &self,
        config_map: Option<&BTreeMap<String, String>>,
    ) -> Result<AuthnConfig, Error> {
        let client_ca = match &self.client_ca_file {
            Some(path) => Some(load_ca(path)?),
            None => config_map
                .and_then(|data| data.get("client-ca-file"))
                .filter(|pem| !pem.trim().is_empty())
                .map(|pem| ca_from_pem("client-ca-file", pem))
                .transpose()?,
        };
        let request_header = match &self.requestheader_client_ca_file {
            Some(path) => Some(self.requestheader.with_ca(load_ca(path)?)?),
            None => match config_map {
                Some(data) => match data
                    .get("requestheader-client-ca-file")
                    .filter(|pem| !pem.trim().is_empty())
                {
                    Some(pem) => {
                        let ca = ca_from_pem("requestheader-client-ca-file", pem)?;
                        let list = |key: &str| -> Result<Vec<String>, Error> {
                            match data.get(key) {
                                None => Ok(Vec::new()),
                                Some(text) if text.trim().is_empty() => Ok(Vec::new()),
                                Some(text) => serde_json::from_str(text).map_err(|e| {
                                    Error::Config(format!(
                                        "{key}: not a JSON array of strings: {e}"
                                    ))
                                }),
                            }
                        };
                        let settings = RequestHeaderSettings {
                            allowed_names: list("requestheader-allowed-names")?,
                            username_headers: list("requestheader-username-headers")?,
                            group_headers: list("requestheader-group-headers")?,
                            extra_prefixes: list("requestheader-extra-headers-prefix")?,
                            uid_headers: list("requestheader-uid-headers")?,
                        };
                        Some(settings.with_ca(ca)?)
                    }
                    None => None,
                },
                None => None,
            },
        };
        Ok(AuthnConfig {
            client_ca,
            request_header,
        })
    }
}

fn load_ca(path: &Path) -> Result<Arc<RootCertStore>, Error> {
    tls_serving::load_ca_bundle(path)
        .map(Arc::new)
        .map_err(|e| Error::Tls(e.to_string()))
}

fn ca_from_pem(key: &str, pem: &str) -> Result<Arc<RootCertStore>, Error> {
    tls_serving::ca_bundle_from_pem(Path::new(key), pem.as_bytes())
        .map(Arc::new)
        .map_err(|e| {
            Error::Tls(format!(
                "ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: {e}"
            ))
        })
}

/// One authenticator's verdict, as k8s.io/apiserver's `(response, ok, err)`.
pub enum Verdict {
    User(User),
    /// This method does not apply (no certificate, no username header).
    NotApplicable,
    /// It applies and failed: the request is refused with 401 unless a later method
    /// succeeds.
    Failed(String),
}

impl AuthnConfig {
    /// The front-proxy authenticator (`headerrequest` behind `x509request.Verifier`).
    pub fn front_proxy(&self, chain: &[CertificateDer<'_>], headers: &HeaderMap) -> Verdict {
        let (Some(config), false) = (&self.request_header, chain.is_empty()) else {
            return Verdict::NotApplicable;
        };
        let subject = match x509::verify_client(chain, &config.ca) {
            Ok(subject) => subject,
            Err(e) => return Verdict::Failed(format!("front-proxy: {e}")),
        };
        if !config.allowed_names.is_empty() && !config.allowed_names.contains(&subject.common_name)
        {
            return Verdict::Failed(format!(
                "front-proxy: certificate CN {:?} is not one of --requestheader-allowed-names {:?}",
                subject.common_name, config.allowed_names
            ));
        }
        let first = |names: &[HeaderName]| {
            names
                .iter()
                .find_map(|n| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .filter(|v| !v.is_empty())
                })
                .unwrap_or_default()
                .to_string()
        };
        let name = first(&config.username_headers);
        if name.is_empty() {
            return Verdict::NotApplicable;
        }
        let groups = config
            .group_headers
            .iter()
            .flat_map(|n| headers.get_all(n))
            .filter_map(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let lower = header.as_str();
            for prefix in &config.extra_prefixes {
                if let Some(suffix) = lower.strip_prefix(prefix.as_str())
                    && let Ok(value) = value.to_str()
                {
                    extra
                        .entry(percent_decode(suffix))
                        .or_default()
                        .push(value.to_string());
                }
            }
        }
        Verdict::User(User {
            name,
            uid: first(&config.uid_headers),
            groups,
            extra,
        })
    }

    /// The client-certificate authenticator: user = CN, groups = O.
    pub fn client_cert(&self, chain: &[CertificateDer<'_>]) -> Verdict {
        let (Some(ca), false) = (&self.client_ca, chain.is_empty()) else {
            return Verdict::NotApplicable;
        };
        match x509::verify_client(chain, ca) {
            Ok(subject) if subject.common_name.is_empty() => Verdict::NotApplicable,
            Ok(subject) => Verdict::User(User {
                name: subject.common_name,
                uid: String::new(),
                groups: subject.organizations,
                extra: BTreeMap::new(),
            }),
            Err(e) => Verdict::Failed(format!("client certificate: {e}")),
        }
    }

    /// Removes every request-header authentication header: the configured ones and the
    /// defaults, so that a handler never sees an identity it did not verify.
    pub fn strip_headers(&self, headers: &mut HeaderMap) {
        let mut exact: Vec<&str> = DEFAULT_USERNAME_HEADERS
            .iter()
            .chain(DEFAULT_GROUP_HEADERS.iter())
            .chain(DEFAULT_UID_HEADERS.iter())
            .copied()
            .collect();
        let mut prefixes: Vec<&str> = DEFAULT_EXTRA_PREFIXES.to_vec();
        if let Some(config) = &self.request_header {
            exact.extend(
                config
                    .username_headers
                    .iter()
                    .chain(config.group_headers.iter())
                    .chain(config.uid_headers.iter())
                    .map(HeaderName::as_str),
            );
            prefixes.extend(config.extra_prefixes.iter().map(String::as_str));
        }
        let doomed: Vec<HeaderName> = headers
            .keys()
            .filter(|name| {
                let n = name.as_str();
                exact.contains(&n) || prefixes.iter().any(|p| n.starts_with(p))
            })
            .cloned()
            .collect();
        for name in doomed {
            headers.remove(name);
        }
    }
}

/// `%XX` escapes decoded, as Go's `url.PathUnescape` does for extra keys; a malformed
/// escape keeps the text as it is (Go keeps the raw key too).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        if bytes[i] == b'%' {
            return text.to_string();
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_percent_decoded() {
        assert_eq!(percent_decode("scopes"), "scopes");
        assert_eq!(percent_decode("example.com%2fteam"), "example.com/team");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
    }

    #[test]
    fn configmap_lists_must_be_json_arrays() {
        // A valid CA, so the PEM parse succeeds and the JSON decoding is what is tested.
        let (ca_pem, _) = ca_and_client("front-proxy-client");
        let keys = [
            "requestheader-allowed-names",
            "requestheader-username-headers",
            "requestheader-group-headers",
            "requestheader-extra-headers-prefix",
            "requestheader-uid-headers",
        ];
        let with = |key: &str, value: &str| {
            let mut data = BTreeMap::new();
            data.insert("requestheader-client-ca-file".to_string(), ca_pem.clone());
            data.insert(key.to_string(), value.to_string());
            data
        };
        for key in keys {
            for bad in ["X-Remote-User", "{\"a\":1}", "[1,2]", "[\"unterminated"] {
                let err = FlagSources::default()
                    .build(Some(&with(key, bad)))
                    .err()
                    .unwrap_or_else(|| panic!("{key}={bad} was accepted"));
                let text = err.to_string();
                assert!(
                    text.contains(key) && text.contains("not a JSON array of strings"),
                    "{key}={bad}: {text}"
                );
            }
            // The same ConfigMap with a JSON array is accepted.
            FlagSources::default()
                .build(Some(&with(key, "[\"X-Remote-User\"]")))
                .unwrap_or_else(|e| panic!("{key} as a JSON array: {e}"));
        }
        // And what the arrays hold is what the configuration uses.
        let built = FlagSources::default()
            .build(Some(&with(
                "requestheader-allowed-names",
                "[\"aggregator\",\"b\"]",
            )))
            .expect("valid");
        let config = built.request_header.expect("request-header configured");
        assert_eq!(config.allowed_names, ["aggregator", "b"]);
        let built = FlagSources::default()
            .build(Some(&with("requestheader-username-headers", "[\"X-Who\"]")))
            .expect("valid");
        let config = built.request_header.expect("request-header configured");
        assert_eq!(config.username_headers, [HeaderName::from_static("x-who")]);
    }

    /// A CA and a client certificate it issued, as DER.
    fn ca_and_client(cn: &str) -> (String, CertificateDer<'static>) {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer =
            CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("CA");
        let mut leaf = CertificateParams::new(Vec::<String>::new()).expect("params");
        leaf.distinguished_name.push(DnType::CommonName, cn);
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("key");
        let cert = leaf.signed_by(&key, &issuer).expect("leaf");
        (issuer.pem(), cert.der().clone())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn flag_given_request_header_settings_replace_the_config_map_and_its_names() {
        let (ca_pem, proxy) = ca_and_client("any-proxy-name");
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("front-proxy-ca.crt");
        std::fs::write(&ca_file, ca_pem).expect("write CA");
        let sources = FlagSources {
            client_ca_file: None,
            requestheader_client_ca_file: Some(ca_file),
            requestheader: RequestHeaderSettings {
                // Empty: any certificate from the CA.
                allowed_names: vec![],
                username_headers: vec!["X-Proxy-User".into()],
                group_headers: vec!["X-Proxy-Group".into()],
                extra_prefixes: vec!["X-Proxy-Extra-".into()],
                uid_headers: vec![],
            },
        };
        // The ConfigMap's request-header keys are ignored when the flag names the CA.
        let mut data = BTreeMap::new();
        data.insert(
            "requestheader-username-headers".to_string(),
            r#"["X-Remote-User"]"#.to_string(),
        );
        let config = sources.build(Some(&data)).expect("config");
        let chain = [proxy];
        let verdict = config.front_proxy(
            &chain,
            &headers(&[
                ("x-remote-user", "spoofed"),
                ("x-proxy-user", "alice"),
                ("x-proxy-group", "a"),
                ("x-proxy-group", "b"),
                ("x-proxy-extra-scopes", "read"),
            ]),
        );
        let Verdict::User(user) = verdict else {
            panic!("the proxied user must authenticate");
        };
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["a", "b"]);
        assert_eq!(user.extra["scopes"], ["read"]);
        // No username header: not this method, not a failure.
        assert!(matches!(
            config.front_proxy(&chain, &headers(&[("x-proxy-group", "a")])),
            Verdict::NotApplicable
        ));
        // The custom names are stripped as well as the defaults.
        let mut h = headers(&[("x-proxy-user", "alice"), ("x-remote-user", "x")]);
        config.strip_headers(&mut h);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn stripping_covers_defaults_and_prefixes() {
        let mut headers = HeaderMap::new();
        for (k, v) in [
            ("x-remote-user", "admin"),
            ("x-remote-group", "system:masters"),
            ("x-remote-extra-scopes", "all"),
            ("x-remote-uid", "1"),
            ("accept", "application/json"),
        ] {
            headers.append(HeaderName::from_static(k), v.parse().expect("valid value"));
        }
        AuthnConfig::default().strip_headers(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("accept"));
    }
}
