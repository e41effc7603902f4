//! The adapter's one error type, and the one place where a failure becomes a
//! Kubernetes `Status` reason ([`Error::reason`]). The HTTP faces answer with the
//! reason's code and a `metav1.Status` body, the KEDA gRPC face with the reason's gRPC
//! code, so the same failure reads the same everywhere.

use crate::api::{ApiError, Reason};
use kube_support::duration::DurationError;
use kube_support::selector::SelectorError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or setting that cannot work (at startup).
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Limits(#[from] crate::source::limits::BadLimits),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Kube(#[from] kube_support::Error),
    #[error(transparent)]
    Duration(#[from] DurationError),
    /// A certificate, key or CA bundle that does not load or verify.
    #[error("{0}")]
    Tls(String),
    /// An exporter or Prometheus that did not answer as it should.
    #[error("{0}")]
    Scrape(String),
    /// A scrape body or query answer that does not decode.
    #[error("{0}")]
    Decode(String),
    /// An answer refused for passing one of the memory limits (`--max-*`).
    #[error("{message}")]
    OverLimit {
        reason: crate::source::limits::Rejection,
        message: String,
    },
    /// A TokenReview or SubjectAccessReview the API server did not answer.
    #[error("{0}")]
    Review(String),
    /// Credentials that were sent and are refused.
    #[error("{0}")]
    Unauthenticated(String),
    /// A request whose parameters are wrong (KEDA trigger metadata, metrics-api keys).
    #[error("{0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// A selector or workload needs pod labels or owners before the pod watch synced.
    #[error("pod labels are not known yet (the pod watch has not synced)")]
    PodsUnknown,
    /// Every pod in scope has data, and all of it is older than `--max-staleness`.
    #[error("all {pods} pods have stale {metric} data")]
    Stale { pods: usize, metric: &'static str },
    /// The pods exist but no exporter has reported them: never seen is not zero.
    #[error("none of the {pods} pods has {metric} data yet: no exporter has reported them")]
    NeverSeen { pods: usize, metric: &'static str },
    /// The pods' values do not combine into a finite number (their sum overflows):
    /// no value, as with missing data, never ±Inf.
    #[error("the {pods} pods' {metric} values do not combine into a finite number")]
    NotFinite { pods: usize, metric: &'static str },
}

impl Error {
    /// The `Status` reason this failure answers with.
    pub fn reason(&self) -> Reason {
        match self {
            Error::InvalidRequest(_) | Error::Selector(_) => Reason::BadRequest,
            Error::Unauthenticated(_) => Reason::Unauthorized,
            Error::PodsUnknown
            | Error::Stale { .. }
            | Error::NeverSeen { .. }
            | Error::NotFinite { .. }
            | Error::Scrape(_)
            | Error::OverLimit { .. }
            | Error::Decode(_) => Reason::ServiceUnavailable,
            Error::Config(_)
            | Error::Limits(_)
            | Error::Listen { .. }
            | Error::Io(_)
            | Error::Kube(_)
            | Error::Duration(_)
            | Error::Tls(_)
            | Error::Review(_) => Reason::InternalError,
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        ApiError::new(e.reason(), e.to_string())
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> tonic::Status {
        tonic::Status::new(e.reason().grpc_code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_reads_the_same_over_http_and_grpc() {
        for (e, http, grpc) in [
            (
                Error::InvalidRequest("bad".into()),
                400,
                tonic::Code::InvalidArgument,
            ),
            (Error::PodsUnknown, 503, tonic::Code::Unavailable),
            (
                Error::Stale {
                    pods: 2,
                    metric: "gpu_utilization",
                },
                503,
                tonic::Code::Unavailable,
            ),
            (
                Error::NeverSeen {
                    pods: 1,
                    metric: "gpu_utilization",
                },
                503,
                tonic::Code::Unavailable,
            ),
            (
                Error::Unauthenticated("no".into()),
                401,
                tonic::Code::Unauthenticated,
            ),
            (Error::Review("down".into()), 500, tonic::Code::Internal),
        ] {
            let message = e.to_string();
            let status = tonic::Status::from(Error::from_parts(&e));
            assert_eq!(status.code(), grpc, "{e:?}");
            assert_eq!(status.message(), message);
            let api = ApiError::from(e);
            assert_eq!(api.code(), http, "{message}");
            assert_eq!(api.to_string(), message);
        }
    }

    impl Error {
        /// A copy for the test (io and kube errors are not Clone; none is used here).
        fn from_parts(e: &Error) -> Error {
            match e {
                Error::InvalidRequest(m) => Error::InvalidRequest(m.clone()),
                Error::PodsUnknown => Error::PodsUnknown,
                Error::Stale { pods, metric } => Error::Stale {
                    pods: *pods,
                    metric,
                },
                Error::NeverSeen { pods, metric } => Error::NeverSeen {
                    pods: *pods,
                    metric,
                },
                Error::Unauthenticated(m) => Error::Unauthenticated(m.clone()),
                Error::Review(m) => Error::Review(m.clone()),
                other => Error::Config(other.to_string()),
            }
        }
    }
}
