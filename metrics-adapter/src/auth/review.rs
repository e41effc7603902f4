//! TokenReview and SubjectAccessReview against the kube-apiserver, cached as
//! k8s.io/apiserver's webhook authenticator and authorizer cache them: answers (yes and
//! no) for a TTL each, errors never.

use std::num::NonZeroUsize;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Api;
use kube::api::PostParams;

use super::AuthMetrics;
use super::User;
use super::cache::TtlCache;
use crate::error::Error;

const TOKEN_REVIEW: &str = "TokenReview";
const ACCESS_REVIEW: &str = "SubjectAccessReview";

/// The API server's own bound on a review (`--authentication-token-webhook` default).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Entries per cache: enough for every client of a busy cluster's HPA controller,
/// KEDA and humans many times over, and a few MiB at most.
const CACHE_ENTRIES: NonZeroUsize = NonZeroUsize::new(4096).expect("4096 > 0");

/// Bearer tokens to users through TokenReview.
pub struct TokenReviewer {
    api: Api<TokenReview>,
    /// Token → the user, or `None` for a token the API server rejected. The key is the
    /// token itself: it lives in this process anyway while requests carry it.
    cache: TtlCache<String, Option<User>>,
    ttl: Duration,
    metrics: AuthMetrics,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, ttl: Duration, metrics: AuthMetrics) -> Self {
        Self {
            api: Api::all(client),
            cache: TtlCache::new(CACHE_ENTRIES),
            ttl,
            metrics,
        }
    }

    /// The user the token belongs to, `None` if it is not valid, or why the API server
    /// could not say.
    pub async fn review(&self, token: &str) -> Result<Option<User>, Error> {
        if let Some(answer) = self.cache.get(&token.to_string()) {
            self.metrics.cached(TOKEN_REVIEW);
            return Ok(answer);
        }
        let started = std::time::Instant::now();
        let answer = self.ask(token).await;
        let result = match &answer {
            Ok(Some(_)) => "allowed",
            Ok(None) => "denied",
            Err(_) => "error",
        };
        self.metrics.asked(TOKEN_REVIEW, result, started.elapsed());
        let answer = answer?;
        self.cache.put(token.to_string(), answer.clone(), self.ttl);
        Ok(answer)
    }

    async fn ask(&self, token: &str) -> Result<Option<User>, Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let created = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.api.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| Error::Review("TokenReview timed out".into()))?
        .map_err(|e| Error::Review(format!("TokenReview failed: {e}")))?;
        let status = created.status.unwrap_or_default();
        let answer = match (status.authenticated, status.user) {
            (Some(true), Some(info)) => Some(User {
                name: info.username.unwrap_or_default(),
                uid: info.uid.unwrap_or_default(),
                groups: info.groups.unwrap_or_default(),
                extra: info.extra.unwrap_or_default(),
            }),
            _ => None,
        };
        Ok(answer)
    }
}

/// An authorization answer: allowed or not, and the API server's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// SubjectAccessReviews, cached by their full spec.
pub struct AccessReviewer {
    api: Api<SubjectAccessReview>,
    cache: TtlCache<String, Decision>,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    metrics: AuthMetrics,
}

impl AccessReviewer {
    pub fn new(
        client: kube::Client,
        allowed_ttl: Duration,
        denied_ttl: Duration,
        metrics: AuthMetrics,
    ) -> Self {
        Self {
            api: Api::all(client),
            cache: TtlCache::new(CACHE_ENTRIES),
            allowed_ttl,
            denied_ttl,
            metrics,
        }
    }

    pub async fn review(&self, review: &SubjectAccessReview) -> Result<Decision, Error> {
        // The spec's JSON is a faithful key: `extra` is a BTreeMap and group order is
        // the request's, so equal requests give equal keys.
        let key = serde_json::to_string(&review.spec)
            .map_err(|e| Error::Review(format!("encoding a SubjectAccessReview: {e}")))?;
        if let Some(decision) = self.cache.get(&key) {
            self.metrics.cached(ACCESS_REVIEW);
            return Ok(decision);
        }
        let started = std::time::Instant::now();
        let decision = self.ask(review).await;
        let result = match &decision {
            Ok(d) if d.allowed => "allowed",
            Ok(_) => "denied",
            Err(_) => "error",
        };
        self.metrics.asked(ACCESS_REVIEW, result, started.elapsed());
        let decision = decision?;
        let ttl = if decision.allowed {
            self.allowed_ttl
        } else {
            self.denied_ttl
        };
        self.cache.put(key, decision.clone(), ttl);
        Ok(decision)
    }

    async fn ask(&self, review: &SubjectAccessReview) -> Result<Decision, Error> {
        let created = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.api.create(&PostParams::default(), review),
        )
        .await
        .map_err(|_| Error::Review("SubjectAccessReview timed out".into()))?
        .map_err(|e| Error::Review(format!("SubjectAccessReview failed: {e}")))?;
        let status = created.status.unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        })
    }
}
