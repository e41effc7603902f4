//! What delegated authentication and authorization record about themselves.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub review: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabel {
    pub review: &'static str,
}

/// What delegated authentication and authorization record: how each request was
/// authenticated, and each TokenReview and SubjectAccessReview by how it was answered
/// (`cached`, or by the API server: `allowed`, `denied`, `error`) with the round trip.
#[derive(Clone, Debug)]
pub struct AuthMetrics {
    authentications: Family<OutcomeLabel, Counter>,
    reviews: Family<ReviewLabels, Counter>,
    review_duration: HistogramFamily<ReviewLabel>,
}

impl Default for AuthMetrics {
    fn default() -> AuthMetrics {
        AuthMetrics {
            authentications: Family::default(),
            reviews: Family::default(),
            // 1 ms to ~4 s, factor 4: one API server round trip, bounded at 10 s.
            review_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 4.0, 7))
            }),
        }
    }
}

impl AuthMetrics {
    /// `outcome`: the method that authenticated the request (`front-proxy`,
    /// `client-certificate`, `token`), `anonymous`, or `failure`.
    pub fn authenticated(&self, outcome: &'static str) {
        self.authentications
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// A review answered from the cache.
    pub fn cached(&self, review: &'static str) {
        self.reviews
            .get_or_create(&ReviewLabels {
                review,
                result: "cached",
            })
            .inc();
    }

    /// A review the API server was asked, its `result` and how long it took.
    pub fn asked(&self, review: &'static str, result: &'static str, took: Duration) {
        self.reviews
            .get_or_create(&ReviewLabels { review, result })
            .inc();
        self.review_duration
            .get_or_create(&ReviewLabel { review })
            .observe(took.as_secs_f64());
    }

    /// Registers the authentication and review metrics (prefixed by the registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "authentications",
            "Requests by how they were authenticated: front-proxy, client-certificate, token, anonymous, or failure (401)",
            self.authentications.clone(),
        );
        registry.register(
            "delegated_reviews",
            "TokenReviews and SubjectAccessReviews by result: cached, or the API server's allowed, denied or error",
            self.reviews.clone(),
        );
        registry.register_with_unit(
            "delegated_review_duration",
            "API server round trip of a review the cache could not answer",
            Unit::Seconds,
            self.review_duration.clone(),
        );
    }
}
