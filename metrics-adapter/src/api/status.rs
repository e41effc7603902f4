//! Kubernetes `Status` error bodies.
//!
//! Every error this adapter returns must be a `metav1.Status`: the aggregator relays
//! our body to the HPA, KEDA and kubectl, and anything else shows up on their side as
//! "apiserver received an error that is not an metav1.Status" (kedacore/keda #1344),
//! losing the message. The reason/code pairs are those of
//! k8s.io/apimachinery `pkg/apis/meta/v1/types.go`.

use std::fmt;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Serialize, Serializer};

use super::selector::SelectorError;

/// `metav1.StatusReason` values we answer with, each tied to its HTTP code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// 400: malformed request, e.g. an unparsable `labelSelector`.
    BadRequest,
    /// 401: no valid credentials (only when anonymous auth is off).
    Unauthorized,
    /// 403: authenticated (or anonymous) but not allowed.
    Forbidden,
    /// 404: unknown path, metric or object.
    NotFound,
    /// 405: a verb other than `get`.
    MethodNotAllowed,
    /// 500: our bug.
    InternalError,
    /// 503: a dependency (exporters, the API server) is unavailable.
    ServiceUnavailable,
}

impl Reason {
    /// The `reason` string in the JSON body.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "BadRequest",
            Self::Unauthorized => "Unauthorized",
            Self::Forbidden => "Forbidden",
            Self::NotFound => "NotFound",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::InternalError => "InternalError",
            Self::ServiceUnavailable => "ServiceUnavailable",
        }
    }

    /// The gRPC code of the same failure, for the KEDA external scaler.
    pub const fn grpc_code(self) -> tonic::Code {
        match self {
            Self::BadRequest => tonic::Code::InvalidArgument,
            Self::Unauthorized => tonic::Code::Unauthenticated,
            Self::Forbidden => tonic::Code::PermissionDenied,
            Self::NotFound => tonic::Code::NotFound,
            Self::MethodNotAllowed => tonic::Code::Unimplemented,
            Self::InternalError => tonic::Code::Internal,
            Self::ServiceUnavailable => tonic::Code::Unavailable,
        }
    }

    /// The HTTP status code, also the body's `code`.
    pub const fn code(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::InternalError => 500,
            Self::ServiceUnavailable => 503,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed request, rendered as a `metav1.Status` with `status: "Failure"`.
///
/// `Display` is the message alone, like Go's `StatusError.Error()`, so logs and the
/// body say the same thing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    // Always `reason.code()`: the constructors are the only way in.
    code: u16,
    reason: Reason,
    message: String,
}

impl ApiError {
    /// An error with `reason` and its code.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            code: reason.code(),
            reason,
            message: message.into(),
        }
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, message)
    }

    /// 401 `Unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(Reason::Unauthorized, message)
    }

    /// 403 `Forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(Reason::Forbidden, message)
    }

    /// 404 `NotFound`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Reason::NotFound, message)
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(Reason::MethodNotAllowed, message)
    }

    /// 500 `InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Reason::InternalError, message)
    }

    /// 503 `ServiceUnavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Reason::ServiceUnavailable, message)
    }

    /// 404 for an unknown metric, worded as custom-metrics-apiserver's
    /// `NewMetricNotFoundError` so users searching the message find the usual advice.
    /// `resource` is the group-qualified resource (`pods`, `deployments.apps`).
    pub fn metric_not_found(metric: &str, resource: &str) -> Self {
        Self::not_found(format!(
            "the server could not find the metric {metric} for {resource}"
        ))
    }

    /// 404 for a metric missing on one named object, as upstream
    /// `NewMetricNotFoundForError`.
    pub fn metric_not_found_for(metric: &str, resource: &str, name: &str) -> Self {
        Self::not_found(format!(
            "the server could not find the metric {metric} for {resource} {name}"
        ))
    }

    /// The HTTP status code (equal to `reason().code()`).
    pub fn code(&self) -> u16 {
        self.code
    }

    /// The reason.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP status for the response.
    pub fn status_code(&self) -> StatusCode {
        // Every Reason maps to a standard code, so the fallback is unreachable.
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The exact JSON body:
    /// `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":…,"reason":…,"code":…}`.
    pub fn to_json(&self) -> String {
        match serde_json::to_string(&self.body()) {
            Ok(json) => json,
            // Serializing string and integer fields cannot fail; keep the response a
            // Status even so.
            Err(_) => FALLBACK_BODY.to_owned(),
        }
    }

    fn body(&self) -> StatusBody<'_> {
        StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata: Metadata {},
            status: "Failure",
            message: &self.message,
            reason: self.reason.as_str(),
            code: self.code,
        }
    }
}

const FALLBACK_BODY: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"internal error","reason":"InternalError","code":500}"#;

/// Wire layout of `metav1.Status`; field order is the order Go writes them.
#[derive(Serialize)]
struct StatusBody<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: Metadata,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

/// Serializes as `{}` (an empty `ListMeta`).
#[derive(Serialize)]
struct Metadata {}

impl Serialize for ApiError {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.body().serialize(serializer)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status_code(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.to_json(),
        )
            .into_response()
    }
}

/// A bad `labelSelector`/`metricLabelSelector` is the client's fault: 400 with the
/// parser's message, which names the offending token and byte.
impl From<SelectorError> for ApiError {
    fn from(err: SelectorError) -> Self {
        Self::bad_request(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    /// Body of an in-memory response. Its future is ready on the first poll, so no async
    /// runtime is needed.
    fn body_bytes(response: Response) -> Vec<u8> {
        let mut future = pin!(axum::body::to_bytes(response.into_body(), 1 << 20));
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(bytes)) => bytes.to_vec(),
            Poll::Ready(Err(err)) => panic!("body error: {err}"),
            Poll::Pending => panic!("in-memory body was not ready"),
        }
    }

    #[test]
    fn metric_not_found_serializes_exactly_like_upstream() {
        let err = ApiError::metric_not_found("gpu_sm_util", "pods");
        assert_eq!(
            err.to_json(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the metric gpu_sm_util for pods","reason":"NotFound","code":404}"#
        );
        assert_eq!(
            err.to_string(),
            "the server could not find the metric gpu_sm_util for pods"
        );
        assert_eq!(
            ApiError::metric_not_found_for("gpu_sm_util", "deployments.apps", "llm").message(),
            "the server could not find the metric gpu_sm_util for deployments.apps llm"
        );
    }

    #[test]
    fn every_constructor_has_its_reason_and_code() {
        let cases = [
            (
                ApiError::bad_request("m"),
                Reason::BadRequest,
                400,
                "BadRequest",
            ),
            (
                ApiError::unauthorized("m"),
                Reason::Unauthorized,
                401,
                "Unauthorized",
            ),
            (
                ApiError::forbidden("m"),
                Reason::Forbidden,
                403,
                "Forbidden",
            ),
            (ApiError::not_found("m"), Reason::NotFound, 404, "NotFound"),
            (
                ApiError::method_not_allowed("m"),
                Reason::MethodNotAllowed,
                405,
                "MethodNotAllowed",
            ),
            (
                ApiError::internal("m"),
                Reason::InternalError,
                500,
                "InternalError",
            ),
            (
                ApiError::unavailable("m"),
                Reason::ServiceUnavailable,
                503,
                "ServiceUnavailable",
            ),
        ];
        for (err, reason, code, text) in cases {
            assert_eq!(
                (err.reason(), err.code(), err.reason().as_str()),
                (reason, code, text)
            );
            assert_eq!(err.status_code().as_u16(), code);
            let value: serde_json::Value = match serde_json::from_str(&err.to_json()) {
                Ok(value) => value,
                Err(e) => panic!("{e}"),
            };
            assert_eq!(value["reason"], text);
            assert_eq!(value["code"], code);
            assert_eq!(value["status"], "Failure");
            assert_eq!(serde_json::to_value(&err).ok(), Some(value));
        }
    }

    #[test]
    fn messages_are_json_escaped() {
        let err = ApiError::bad_request("bad \"selector\"\n\u{e9}\\");
        let value: serde_json::Value = match serde_json::from_str(&err.to_json()) {
            Ok(value) => value,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(value["message"], "bad \"selector\"\n\u{e9}\\");
    }

    #[test]
    fn into_response_sets_status_content_type_and_body() {
        let err = ApiError::forbidden("forbidden: User \"system:anonymous\" cannot get resource");
        let expected = err.to_json();
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/json")
        );
        assert_eq!(body_bytes(response), expected.into_bytes());
    }

    #[test]
    fn selector_errors_become_bad_requests() {
        let err = match crate::api::Selector::parse("a=b c") {
            Err(err) => ApiError::from(err),
            Ok(selector) => panic!("parsed {selector}"),
        };
        assert_eq!(err.code(), 400);
        assert!(err.message().contains("byte 4"), "{err}");
    }
}
