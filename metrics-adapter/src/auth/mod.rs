//! Delegated authentication and authorization, as k8s.io/apiserver does it for an
//! aggregated API server (kubernetes-apis reference, section (c)).
//!
//! Per request, after the TLS handshake has accepted any client certificate:
//!
//! 1. **Authenticate**, first success wins, in k8s.io/apiserver's order: the front proxy
//!    (a certificate from the request-header CA with an allowed CN, then the identity
//!    in `X-Remote-User`/`-Group`/`-Extra-*`/`-Uid`), a client certificate from the
//!    client CA (user = CN, groups = O), a bearer token through TokenReview. A method
//!    that applies and fails (a certificate from an unknown CA, a rejected token) makes
//!    the request 401 unless a later one succeeds. With no credentials at all the user
//!    is `system:anonymous` (anonymous authentication is on, as in every delegated API
//!    server), which authorization then usually refuses with 403.
//! 2. **Strip** every request-header identity header, whatever happened in step 1.
//! 3. **Authorize**: `/healthz`, `/livez`, `/readyz` (configurable) always; the
//!    `system:masters` group always (the aggregator's availability probe); anything
//!    else by SubjectAccessReview, with the request's attributes. Denied → 403, a
//!    review that fails → 500; all as `Status` bodies.
//!
//! Both reviews are cached (10 s by default, allowed and denied alike, bounded), so a
//! steady HPA or KEDA poll costs no API server round trip.

pub mod attributes;
pub mod authn;
pub mod cache;
mod metrics;
pub mod review;
pub mod x509;

pub use metrics::AuthMetrics;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use arc_swap::ArcSwap;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use tls_serving::PeerCertificates;

use crate::api::ApiError;
use attributes::Attributes;
use authn::{AuthnConfig, FlagSources, Verdict};
use review::{AccessReviewer, TokenReviewer};

/// An authenticated (or anonymous) user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

pub const ANONYMOUS_USER: &str = "system:anonymous";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Members are allowed everything without a review (`authorizerfactory.NewPrivilegedGroups`).
pub const PRIVILEGED_GROUP: &str = "system:masters";

/// How often CA files named by flags are checked for changes.
const CA_FILE_POLL: Duration = Duration::from_secs(5);
/// The startup lookup of the ConfigMap gives up after this.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The authentication and authorization settings from the flags.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    pub sources: FlagSources,
    pub skip_lookup: bool,
    pub tolerate_lookup_failure: bool,
    pub anonymous: bool,
    pub token_cache_ttl: Duration,
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
    /// Exact paths, or prefixes ending in `*`.
    pub always_allow_paths: Vec<String>,
    /// Where authentications and reviews are counted.
    pub metrics: AuthMetrics,
}

/// The state the middleware reads.
pub struct Auth {
    config: Arc<ArcSwap<AuthnConfig>>,
    tokens: TokenReviewer,
    access: AccessReviewer,
    always_allow_paths: Vec<String>,
    anonymous: bool,
    metrics: AuthMetrics,
}

impl Auth {
    /// Loads the CAs (from files, then the ConfigMap unless `skip_lookup`) and starts
    /// keeping them current. Must run inside the runtime.
    pub async fn start(
        settings: AuthSettings,
        authn_client: kube::Client,
        authz_client: kube::Client,
    ) -> Result<Arc<Auth>, Error> {
        let lookup = settings.sources.needs_lookup() && !settings.skip_lookup;
        let config_maps: Api<ConfigMap> =
            Api::namespaced(authn_client.clone(), authn::CONFIG_MAP_NAMESPACE);
        let data = if lookup {
            match tokio::time::timeout(LOOKUP_TIMEOUT, config_maps.get_opt(authn::CONFIG_MAP_NAME))
                .await
            {
                Ok(Ok(Some(map))) => Some(map.data.unwrap_or_default()),
                Ok(Ok(None)) => {
                    tracing::warn!(
                        "ConfigMap {}/{} does not exist: no front-proxy or client-certificate authentication until it does",
                        authn::CONFIG_MAP_NAMESPACE,
                        authn::CONFIG_MAP_NAME
                    );
                    None
                }
                Ok(Err(e)) if settings.tolerate_lookup_failure => {
                    tracing::warn!(error = %e, "cannot read the authentication ConfigMap (tolerated: certificates are not trusted until it is read)");
                    None
                }
                Ok(Err(e)) => {
                    return Err(Error::Config(format!(
                        "reading ConfigMap {}/{}: {e} (the adapter needs the extension-apiserver-authentication-reader Role; --authentication-tolerate-lookup-failure starts anyway)",
                        authn::CONFIG_MAP_NAMESPACE,
                        authn::CONFIG_MAP_NAME
                    )));
                }
                Err(_) if settings.tolerate_lookup_failure => {
                    tracing::warn!("reading the authentication ConfigMap timed out (tolerated)");
                    None
                }
                Err(_) => {
                    return Err(Error::Config(format!(
                        "reading ConfigMap {}/{} timed out after {LOOKUP_TIMEOUT:?}",
                        authn::CONFIG_MAP_NAMESPACE,
                        authn::CONFIG_MAP_NAME
                    )));
                }
            }
        } else {
            None
        };
        let initial = settings.sources.build(data.as_ref())?;
        describe(&initial);
        let config = Arc::new(ArcSwap::from_pointee(initial));
        let latest_data = Arc::new(ArcSwap::from_pointee(data));
        if lookup {
            tokio::spawn(watch_config_map(
                config_maps,
                settings.sources.clone(),
                latest_data.clone(),
                config.clone(),
            ));
        }
        let files = settings.sources.files();
        if !files.is_empty() {
            let (sources, config) = (settings.sources.clone(), config.clone());
            tls_serving::watch_files("client CAs", files, CA_FILE_POLL, move || {
                let built = sources
                    .build(latest_data.load().as_ref().as_ref())
                    .map_err(tls_serving::ReloadError::new)?;
                config.store(Arc::new(built));
                Ok(sources.files())
            });
        }
        Ok(Arc::new(Auth {
            config,
            tokens: TokenReviewer::new(
                authn_client,
                settings.token_cache_ttl,
                settings.metrics.clone(),
            ),
            access: AccessReviewer::new(
                authz_client,
                settings.authorized_ttl,
                settings.unauthorized_ttl,
                settings.metrics.clone(),
            ),
            always_allow_paths: settings.always_allow_paths,
            anonymous: settings.anonymous,
            metrics: settings.metrics,
        }))
    }

    /// Step 1: who is asking, or why the credentials they sent are refused.
    pub async fn authenticate(
        &self,
        config: &AuthnConfig,
        chain: &[rustls_pki_types::CertificateDer<'static>],
        headers: &axum::http::HeaderMap,
    ) -> Result<User, Error> {
        let (outcome, result) = self.authenticate_by(config, chain, headers).await;
        self.metrics.authenticated(outcome);
        result
    }

    /// [`Auth::authenticate`], with the method that decided it (`failure` on refusal).
    async fn authenticate_by(
        &self,
        config: &AuthnConfig,
        chain: &[rustls_pki_types::CertificateDer<'static>],
        headers: &axum::http::HeaderMap,
    ) -> (&'static str, Result<User, Error>) {
        let mut failures = Vec::new();
        for (method, verdict) in [
            ("front-proxy", config.front_proxy(chain, headers)),
            ("client-certificate", config.client_cert(chain)),
        ] {
            match verdict {
                Verdict::User(user) => return (method, Ok(with_authenticated_group(user))),
                Verdict::Failed(why) => failures.push(why),
                Verdict::NotApplicable => {}
            }
        }
        if let Some(token) = bearer_token(headers) {
            match self.tokens.review(token).await {
                Ok(Some(user)) => return ("token", Ok(with_authenticated_group(user))),
                Ok(None) => failures.push("invalid bearer token".into()),
                Err(e) => failures.push(e.to_string()),
            }
        }
        if failures.is_empty() && !self.anonymous {
            (
                "failure",
                Err(Error::Unauthenticated(
                    "no credentials, and anonymous authentication is off".into(),
                )),
            )
        } else if failures.is_empty() {
            let anonymous = User {
                name: ANONYMOUS_USER.into(),
                groups: vec![UNAUTHENTICATED_GROUP.into()],
                ..User::default()
            };
            ("anonymous", Ok(anonymous))
        } else {
            ("failure", Err(Error::Unauthenticated(failures.join("; "))))
        }
    }

    /// Step 3: whether `user` may do `attributes`.
    pub async fn authorize(&self, user: &User, attributes: &Attributes) -> Result<(), ApiError> {
        if let Attributes::NonResource { path, .. } = attributes
            && self.always_allowed(path)
        {
            return Ok(());
        }
        if user.groups.iter().any(|g| g == PRIVILEGED_GROUP) {
            return Ok(());
        }
        match self.access.review(&attributes.access_review(user)).await {
            Ok(decision) if decision.allowed => Ok(()),
            Ok(decision) => Err(ApiError::forbidden(
                attributes.forbidden_message(&user.name, &decision.reason),
            )),
            Err(e) => {
                tracing::warn!(error = %e, "authorization failed");
                Err(ApiError::internal(format!("authorization failed: {e}")))
            }
        }
    }

    fn always_allowed(&self, path: &str) -> bool {
        self.always_allow_paths
            .iter()
            .any(|allowed| match allowed.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => path == allowed,
            })
    }
}

/// The middleware: authenticate, strip, authorize, then the handler.
pub async fn middleware(
    State(auth): State<Arc<Auth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let config = auth.config.load_full();
    let chain = request
        .extensions()
        .get::<PeerCertificates>()
        .map(|p| p.0.clone())
        .unwrap_or_default();
    let authenticated = auth.authenticate(&config, &chain, request.headers()).await;
    config.strip_headers(request.headers_mut());
    let user = match authenticated {
        Ok(user) => user,
        Err(why) => {
            tracing::debug!(path = request.uri().path(), reason = %why, "unauthorized");
            return ApiError::unauthorized("Unauthorized").into_response();
        }
    };
    let attributes = Attributes::from_request(
        request.method().as_str(),
        request.uri().path(),
        request.uri().query(),
    );
    if let Err(refused) = auth.authorize(&user, &attributes).await {
        tracing::debug!(user = %user.name, path = request.uri().path(), reason = %refused, "refused");
        return refused.into_response();
    }
    request.headers_mut().remove(header::AUTHORIZATION);
    next.run(request).await
}

/// `Authorization: Bearer <token>`, as k8s.io/apiserver's bearertoken authenticator
/// reads it (scheme case-insensitive, one non-empty token).
fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

fn with_authenticated_group(mut user: User) -> User {
    if !user.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        user.groups.push(AUTHENTICATED_GROUP.into());
    }
    user
}

fn describe(config: &AuthnConfig) {
    tracing::info!(
        client_ca = config.client_ca.is_some(),
        front_proxy_ca = config.request_header.is_some(),
        front_proxy_allowed_names = ?config.request_header.as_ref().map(|r| &r.allowed_names),
        "certificate authentication configured"
    );
}

/// Keeps the configuration current with the ConfigMap: the kube-apiserver rewrites it
/// when its CAs rotate. A ConfigMap that does not build keeps the last good one.
async fn watch_config_map(
    api: Api<ConfigMap>,
    sources: FlagSources,
    latest_data: Arc<ArcSwap<Option<BTreeMap<String, String>>>>,
    config: Arc<ArcSwap<AuthnConfig>>,
) {
    let selector =
        watcher::Config::default().fields(&format!("metadata.name={}", authn::CONFIG_MAP_NAME));
    let mut events = std::pin::pin!(watcher(api, selector));
    while let Some(event) = events.next().await {
        let map = match event {
            Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)) => map,
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!("the authentication ConfigMap was deleted: keeping the last CAs");
                continue;
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "watching the authentication ConfigMap");
                continue;
            }
        };
        let data = map.data.unwrap_or_default();
        if latest_data.load().as_ref().as_ref() == Some(&data) {
            continue;
        }
        match sources.build(Some(&data)) {
            Ok(built) => {
                tracing::info!("the authentication ConfigMap changed");
                describe(&built);
                config.store(Arc::new(built));
                latest_data.store(Arc::new(Some(data)));
            }
            Err(e) => {
                tracing::error!(error = %e, "the authentication ConfigMap does not load: keeping the last CAs")
            }
        }
    }
}
