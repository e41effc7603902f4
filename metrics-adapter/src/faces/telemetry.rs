//! The adapter's own metrics, served on `/metrics` (behind the same authentication and
//! authorization as the APIs, as Kubernetes API servers serve theirs): requests per API
//! and status code with their latency, KEDA calls per method and gRPC code, and the
//! source's health.
//!
//! Unlike the exporter's device metrics, nothing here must look like dcgm-exporter, so
//! prometheus-client's registry and OpenMetrics encoder serve as they are.

use crate::auth::AuthMetrics;
use crate::fleet::Fleet;
use crate::source::SourceMetrics;
use arc_swap::ArcSwap;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The OpenMetrics text content type prometheus-client writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// HTTP request labels: which API (a fixed set, so the cardinality is bounded whatever
/// paths clients send) and the status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub api: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabel {
    pub api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    pub method: &'static str,
    pub grpc_code: &'static str,
}

/// A histogram per label set, each made by a plain constructor function.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Request latencies: 100 µs to ~1.6 s, factor 4 (cached answers are tens of µs; an
/// uncached SubjectAccessReview is an API server round trip).
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 4.0, 8))
}

/// The registry and the handles the middleware and source loops write to.
#[derive(Debug)]
pub struct Telemetry {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_duration: HistogramFamily<ApiLabel>,
    grpc_requests: Family<GrpcLabels, Counter>,
    pub source: SourceMetrics,
    /// The serving engines' scrapes (`serving_source_*`).
    pub serving_source: SourceMetrics,
    pub auth: AuthMetrics,
    /// The HTTPS port's listener refusals (`listener="api"`).
    pub api_listener: Arc<tls_serving::ListenerStats>,
    /// The KEDA gRPC port's listener refusals (`listener="grpc"`).
    pub grpc_listener: Arc<tls_serving::ListenerStats>,
}

impl Telemetry {
    /// Registers every metric; `fleet` and `staleness` feed the source gauges, computed
    /// when `/metrics` is read.
    pub fn new(fleet: Arc<ArcSwap<Fleet>>, staleness: Duration) -> Telemetry {
        let mut registry = Registry::with_prefix("gpu_metrics_adapter");
        registry.register(
            "build",
            "The adapter's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by API and status code (401 and 403 included)",
            requests.clone(),
        );
        let request_duration: HistogramFamily<ApiLabel> =
            Family::new_with_constructor(request_histogram);
        registry.register_with_unit(
            "http_request_duration",
            "Time to answer an HTTP request, authentication and authorization included",
            Unit::Seconds,
            request_duration.clone(),
        );
        let grpc_requests = Family::<GrpcLabels, Counter>::default();
        registry.register(
            "grpc_requests",
            "KEDA external scaler calls, by method and gRPC status code (streams count when they open)",
            grpc_requests.clone(),
        );
        let source = SourceMetrics::default();
        source.register(&mut registry);
        let serving_source = SourceMetrics::default();
        serving_source.register(registry.sub_registry_with_prefix("serving"));
        let auth = AuthMetrics::default();
        auth.register(&mut registry);
        registry.register_collector(Box::new(FleetCollector { fleet, staleness }));
        let api_listener = Arc::<tls_serving::ListenerStats>::default();
        let grpc_listener = Arc::<tls_serving::ListenerStats>::default();
        registry.register_collector(Box::new(ListenerCollector {
            listeners: [
                ("api", api_listener.clone()),
                ("grpc", grpc_listener.clone()),
            ],
        }));
        Telemetry {
            registry,
            requests,
            request_duration,
            grpc_requests,
            source,
            serving_source,
            auth,
            api_listener,
            grpc_listener,
        }
    }

    /// The serving engines' view gets the source gauges too, `serving_`-prefixed
    /// (`serving_source_targets`, `serving_pods_fresh`, …).
    pub fn watch_serving(&mut self, serving: Arc<ArcSwap<Fleet>>, staleness: Duration) {
        self.registry
            .sub_registry_with_prefix("serving")
            .register_collector(Box::new(FleetCollector {
                fleet: serving,
                staleness,
            }));
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// A router serving `GET /metrics`.
    pub fn router(self: &Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route("/metrics", axum::routing::get(metrics))
            .with_state(self.clone())
    }
}

async fn metrics(State(t): State<Arc<Telemetry>>) -> Response {
    match t.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => crate::api::ApiError::internal(format!("encoding metrics: {e}")).into_response(),
    }
}

/// Which API a request path belongs to.
pub fn api_of(path: &str) -> &'static str {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let segments = path.trim_matches('/').split('/').count();
    if under("/apis/custom.metrics.k8s.io") {
        // /apis/<group>/<version> and shorter are discovery; longer ones are metrics.
        if segments > 3 { "custom" } else { "discovery" }
    } else if under("/apis/external.metrics.k8s.io") {
        if segments > 3 {
            "external"
        } else {
            "discovery"
        }
    } else if under("/apis") || under("/api") {
        "discovery"
    } else if under("/metrics-api") {
        "metrics-api"
    } else if under("/openapi") {
        "openapi"
    } else if path == "/metrics" {
        "metrics"
    } else if path == "/healthz" || path == "/livez" || path == "/readyz" {
        "health"
    } else {
        "other"
    }
}

/// Middleware counting and timing every HTTP request by API and final status; layered
/// outermost, so refusals by authentication and authorization are counted too.
pub async fn track_http(State(t): State<Arc<Telemetry>>, request: Request, next: Next) -> Response {
    let api = api_of(request.uri().path());
    let started = Instant::now();
    let response = next.run(request).await;
    let code = response.status().as_u16();
    t.requests.get_or_create(&RequestLabels { api, code }).inc();
    t.request_duration
        .get_or_create(&ApiLabel { api })
        .observe(started.elapsed().as_secs_f64());
    response
}

/// The KEDA external scaler's methods, by their gRPC path.
fn grpc_method_of(path: &str) -> &'static str {
    match path.rsplit_once('/') {
        Some(("/externalscaler.ExternalScaler", method)) => match method {
            "IsActive" => "IsActive",
            "StreamIsActive" => "StreamIsActive",
            "GetMetricSpec" => "GetMetricSpec",
            "GetMetrics" => "GetMetrics",
            _ => "other",
        },
        _ => "other",
    }
}

/// gRPC status codes by number, named as grpc-go's `grpc_code` label names them.
fn grpc_code_name(code: &str) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    code.parse::<usize>()
        .ok()
        .and_then(|n| NAMES.get(n).copied())
        .unwrap_or("Unknown")
}

/// Middleware counting KEDA calls. tonic sends a failed unary call's status in the
/// response headers (trailers-only) and a successful one's in the trailers, so a
/// response without `grpc-status` in its headers is OK.
pub async fn track_grpc(State(t): State<Arc<Telemetry>>, request: Request, next: Next) -> Response {
    let method = grpc_method_of(request.uri().path());
    let response = next.run(request).await;
    let grpc_code = if !response.status().is_success() {
        // Not gRPC at all (an HTTP-level refusal): gRPC clients read it as Unknown.
        "Unknown"
    } else {
        response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map_or("OK", grpc_code_name)
    };
    t.grpc_requests
        .get_or_create(&GrpcLabels { method, grpc_code })
        .inc();
    response
}

/// Gauges read off the current fleet view when `/metrics` is scraped.
#[derive(Debug)]
struct FleetCollector {
    fleet: Arc<ArcSwap<Fleet>>,
    staleness: Duration,
}

impl Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let fleet = self.fleet.load();
        let now = Instant::now();
        let up = fleet
            .last_answer
            .is_some_and(|t| now.saturating_duration_since(t) <= self.staleness);
        let fresh = fleet
            .pods
            .values()
            .filter(|o| now.saturating_duration_since(o.seen) <= self.staleness)
            .count();
        let seconds = Some(&Unit::Seconds);
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "source_up",
            "1 while the source answers within the staleness limit (what /readyz reports).",
            None,
            i64::from(up),
        )?;
        gauge(
            &mut encoder,
            "source_targets",
            "Exporters (or Prometheus endpoints) in the last round.",
            None,
            count(fleet.targets),
        )?;
        gauge(
            &mut encoder,
            "source_targets_answering",
            "Targets that answered in the last round.",
            None,
            count(fleet.answered),
        )?;
        gauge(
            &mut encoder,
            "pods_fresh",
            "Pods with values within the staleness limit.",
            None,
            count(fresh),
        )?;
        if let Some(t) = fleet.last_answer {
            gauge(
                &mut encoder,
                "source_last_answer_age",
                "Time since the source last answered.",
                seconds,
                now.saturating_duration_since(t).as_secs_f64(),
            )?;
        }
        Ok(())
    }
}

/// The listeners' refused connections, read when `/metrics` is scraped.
#[derive(Debug)]
struct ListenerCollector {
    listeners: [(&'static str, Arc<tls_serving::ListenerStats>); 2],
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    listener: &'static str,
    reason: &'static str,
}

impl Collector for ListenerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "http_connections_refused",
            "Connections denied a regular place on a listener (api: the HTTPS port, grpc: KEDA's), by reason: per_address (the client's address held --max-connections-per-address) or max_connections (the listener held --max-connections). On the HTTPS port they may ask only the health paths; on the gRPC port they are closed.",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (listener, stats) in &self.listeners {
            for reason in tls_serving::Refusal::ALL {
                let labels = RefusalLabels {
                    listener,
                    reason: reason.reason(),
                };
                ConstCounter::new(stats.refused(reason)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// One gauge sample with its descriptor.
fn gauge<N: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: N,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, unit, gauge.metric_type())?;
    gauge.encode(metric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_a_fixed_set_of_apis() {
        let cases = [
            (
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization",
                "custom",
            ),
            (
                "/apis/custom.metrics.k8s.io/v1beta1/namespaces/ml/metrics/gpu_utilization",
                "custom",
            ),
            ("/apis/custom.metrics.k8s.io/v1beta2", "discovery"),
            ("/apis/custom.metrics.k8s.io", "discovery"),
            (
                "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/gpu_utilization",
                "external",
            ),
            ("/apis/external.metrics.k8s.io/v1beta1", "discovery"),
            ("/apis", "discovery"),
            ("/apis/custom.metrics.k8s.io.evil/x/y/z", "discovery"),
            ("/metrics-api/namespaces/ml/gpu_utilization", "metrics-api"),
            ("/openapi/v2", "openapi"),
            ("/metrics", "metrics"),
            ("/readyz", "health"),
            ("/livez", "health"),
            ("/metricsx", "other"),
            ("/anything/else", "other"),
        ];
        for (path, api) in cases {
            assert_eq!(api_of(path), api, "{path}");
        }
    }

    #[test]
    fn grpc_methods_and_codes_are_named() {
        assert_eq!(
            grpc_method_of("/externalscaler.ExternalScaler/GetMetrics"),
            "GetMetrics"
        );
        assert_eq!(
            grpc_method_of("/externalscaler.ExternalScaler/Nope"),
            "other"
        );
        assert_eq!(grpc_method_of("/other.Service/GetMetrics"), "other");
        assert_eq!(grpc_code_name("3"), "InvalidArgument");
        assert_eq!(grpc_code_name("14"), "Unavailable");
        assert_eq!(grpc_code_name("99"), "Unknown");
    }

    #[test]
    fn listener_refusals_are_served_per_listener_and_reason() {
        let fleet = Arc::new(ArcSwap::from_pointee(Fleet::default()));
        let t = Telemetry::new(fleet, Duration::from_secs(6));
        let remote = "192.0.2.9:1234".parse().expect("addr");
        for _ in 0..2 {
            t.api_listener
                .refuse(tls_serving::Refusal::PerAddress, remote, 64);
        }
        t.grpc_listener
            .refuse(tls_serving::Refusal::MaxConnections, remote, 256);
        let text = t.encode().expect("encodes");
        for line in [
            "# TYPE gpu_metrics_adapter_http_connections_refused counter\n",
            "gpu_metrics_adapter_http_connections_refused_total{listener=\"api\",reason=\"per_address\"} 2\n",
            "gpu_metrics_adapter_http_connections_refused_total{listener=\"api\",reason=\"max_connections\"} 0\n",
            "gpu_metrics_adapter_http_connections_refused_total{listener=\"grpc\",reason=\"per_address\"} 0\n",
            "gpu_metrics_adapter_http_connections_refused_total{listener=\"grpc\",reason=\"max_connections\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn the_source_gauges_follow_the_fleet_view() {
        let fleet = Arc::new(ArcSwap::from_pointee(Fleet::default()));
        let t = Telemetry::new(fleet.clone(), Duration::from_secs(6));
        let text = t.encode().expect("encodes");
        assert!(text.contains("gpu_metrics_adapter_source_up 0\n"), "{text}");
        assert!(!text.contains("source_last_answer_age"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");

        fleet.store(Arc::new(Fleet {
            pods: Default::default(),
            targets: 3,
            answered: 2,
            last_answer: Some(Instant::now()),
        }));
        t.source.scraped(true);
        t.source.scraped(true);
        t.source.scraped(false);
        let text = t.encode().expect("encodes");
        for line in [
            "gpu_metrics_adapter_source_up 1\n",
            "gpu_metrics_adapter_source_targets 3\n",
            "gpu_metrics_adapter_source_targets_answering 2\n",
            "gpu_metrics_adapter_pods_fresh 0\n",
            "gpu_metrics_adapter_source_scrapes_total{result=\"success\"} 2\n",
            "gpu_metrics_adapter_source_scrapes_total{result=\"failure\"} 1\n",
            "# TYPE gpu_metrics_adapter_source_last_answer_age_seconds gauge\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
    }
}
