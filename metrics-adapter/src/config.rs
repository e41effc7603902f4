//! Command-line flags. Serving flags are named as Kubernetes API servers name them.

use crate::error::Error;
use crate::source::prometheus::pushdown::Queries;
use clap::Parser;
use kube_support::duration;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-metrics-adapter",
    version,
    about = "Kubernetes custom and external metrics APIs for GPU workloads, fed straight from the gpu-exporters.",
    next_line_help = true
)]
pub struct Cli {
    /// Port of the metrics APIs.
    #[arg(long, default_value_t = 6443)]
    pub secure_port: u16,

    /// Port of KEDA's external scaler gRPC service.
    #[arg(long, default_value_t = 9090)]
    pub grpc_port: u16,

    /// Address to bind (an IP address or host name); default: every interface, IPv4 and
    /// IPv6 where the host has IPv6. 0.0.0.0 is IPv4 only, :: IPv6 (and IPv4 if the host
    /// maps it).
    #[arg(long, value_name = "ADDRESS")]
    pub bind_address: Option<String>,

    /// Serve the APIs (and gRPC) over plain HTTP, without authentication or
    /// authorization: local use and tests only, never in a cluster.
    #[arg(long)]
    pub insecure_serve_http: bool,

    /// PEM serving certificate, with its chain; reloaded when it changes. It must be
    /// valid for SERVICE.NAMESPACE.svc, which the APIService's caBundle verifies.
    /// Without it a self-signed pair is generated (APIServices then need
    /// insecureSkipTLSVerify: true).
    #[arg(long, value_name = "PATH", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of --tls-cert-file.
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Oldest TLS version accepted.
    #[arg(long, value_name = "VERSION", default_value = "VersionTLS12", value_parser = ["VersionTLS12", "VersionTLS13"])]
    pub tls_min_version: String,

    /// CA for client certificates (user = CN, groups = O); default: `client-ca-file` of
    /// the kube-system/extension-apiserver-authentication ConfigMap.
    #[arg(long, value_name = "PATH")]
    pub client_ca_file: Option<PathBuf>,

    /// CA of the front proxy's (the aggregator's) client certificate. Given, every
    /// --requestheader-* flag applies; absent, all of them come from the
    /// kube-system/extension-apiserver-authentication ConfigMap, which is watched.
    #[arg(long, value_name = "PATH")]
    pub requestheader_client_ca_file: Option<PathBuf>,

    /// CNs allowed for the front proxy's certificate (comma-separated); empty: any
    /// certificate from the request-header CA.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,

    /// Headers with the user name [default: x-remote-user].
    #[arg(long, value_name = "HEADERS", value_delimiter = ',')]
    pub requestheader_username_headers: Vec<String>,

    /// Headers with the groups [default: x-remote-group].
    #[arg(long, value_name = "HEADERS", value_delimiter = ',')]
    pub requestheader_group_headers: Vec<String>,

    /// Header prefixes of extra attributes [default: x-remote-extra-].
    #[arg(long, value_name = "PREFIXES", value_delimiter = ',')]
    pub requestheader_extra_headers_prefix: Vec<String>,

    /// Headers with the user's UID [default: x-remote-uid].
    #[arg(long, value_name = "HEADERS", value_delimiter = ',')]
    pub requestheader_uid_headers: Vec<String>,

    /// kubeconfig for TokenReviews and the authentication ConfigMap; default:
    /// --kubeconfig, else in-cluster.
    #[arg(long, value_name = "PATH")]
    pub authentication_kubeconfig: Option<PathBuf>,

    /// kubeconfig for SubjectAccessReviews; default: --kubeconfig, else in-cluster.
    #[arg(long, value_name = "PATH")]
    pub authorization_kubeconfig: Option<PathBuf>,

    /// Treat requests without credentials as user system:anonymous (group
    /// system:unauthenticated), for authorization to decide, as Kubernetes API servers
    /// do by default; false: answer them 401.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub anonymous_auth: bool,

    /// Do not read the authentication ConfigMap (only flag-given CAs are trusted).
    #[arg(long)]
    pub authentication_skip_lookup: bool,

    /// Start even when the authentication ConfigMap cannot be read.
    #[arg(long)]
    pub authentication_tolerate_lookup_failure: bool,

    /// How long TokenReview answers are cached.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse_flag)]
    pub authentication_token_webhook_cache_ttl: Duration,

    /// How long allowed SubjectAccessReview answers are cached.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse_flag)]
    pub authorization_webhook_cache_authorized_ttl: Duration,

    /// How long denied SubjectAccessReview answers are cached.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse_flag)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,

    /// Paths anyone may get, authenticated or not (a trailing * matches a prefix).
    #[arg(
        long,
        value_name = "PATHS",
        value_delimiter = ',',
        default_value = "/healthz,/readyz,/livez"
    )]
    pub authorization_always_allow_paths: Vec<String>,

    /// CA for KEDA's client certificates on the gRPC port: given, the gRPC port
    /// requires mutual TLS.
    #[arg(long, value_name = "PATH")]
    pub grpc_client_ca_file: Option<PathBuf>,

    /// Serve gRPC in plain text (KEDA triggers without enableTLS), even when the APIs
    /// use TLS.
    #[arg(long, conflicts_with = "grpc_client_ca_file")]
    pub grpc_insecure: bool,

    /// An exporter to scrape (repeatable); without it, exporters are discovered from
    /// the exporter Service's EndpointSlices.
    #[arg(long = "exporter-url", value_name = "URL")]
    pub exporter_urls: Vec<String>,

    /// The exporter Service, NAMESPACE/NAME, whose EndpointSlices list the exporters to
    /// scrape when no --exporter-url is given.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "gpu-exporter/gpu-exporter", value_parser = parse_service)]
    pub exporter_service: ServiceRef,

    /// The EndpointSlice port to scrape; a slice with a single port is scraped on it
    /// whatever its name.
    #[arg(long, value_name = "NAME", default_value = "metrics")]
    pub exporter_port_name: String,

    /// Scheme of the discovered exporters' URLs: https where the exporters serve TLS
    /// (their --web-config-file).
    #[arg(long, value_name = "SCHEME", default_value = "http", value_parser = ["http", "https"])]
    pub exporter_scheme: String,

    /// PEM CA bundle that signed the exporters' certificates; default: the system's
    /// roots.
    #[arg(long, value_name = "PATH")]
    pub exporter_ca_file: Option<PathBuf>,

    /// The name the exporters' certificates must carry, verified instead of the pod IP
    /// they are scraped at, e.g. gpu-exporter.gpu-exporter.svc.
    #[arg(long, value_name = "NAME")]
    pub exporter_tls_server_name: Option<String>,

    /// Basic-auth user for exporters whose --web-config-file sets basic_auth_users.
    #[arg(
        long,
        value_name = "USER",
        requires = "exporter_basic_auth_password_file"
    )]
    pub exporter_basic_auth_username: Option<String>,

    /// File with that user's password (re-read every scrape round; a trailing newline
    /// is ignored).
    #[arg(long, value_name = "PATH", requires = "exporter_basic_auth_username")]
    pub exporter_basic_auth_password_file: Option<PathBuf>,

    /// A serving engine's metrics endpoint for a pod, NAMESPACE/POD=URL (repeatable),
    /// e.g. llm/vllm-0=http://10.0.0.7:8000/metrics. The engine (vLLM, SGLang, TGI,
    /// Triton) is recognised from its exposition; its signals are served as
    /// serving_* metrics for that pod.
    #[arg(long = "serving-target", value_name = "NAMESPACE/POD=URL", value_parser = parse_serving_target, help_heading = "Serving engines")]
    pub serving_targets: Vec<crate::source::serving::ServingTarget>,

    /// Find serving engines in the cluster: the pods behind the Services with these
    /// labels (a label selector, e.g. gpu-metrics.io/serving=true), through their
    /// EndpointSlices, which carry their Service's labels. Needs list and watch of
    /// EndpointSlices in every namespace.
    #[arg(long, value_name = "SELECTOR", value_parser = parse_label_selector, help_heading = "Serving engines")]
    pub serving_service_selector: Option<String>,

    /// The EndpointSlice port the engines serve /metrics on; a slice with a single port
    /// is scraped on it whatever its name.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "metrics",
        help_heading = "Serving engines"
    )]
    pub serving_port_name: String,

    /// A user-defined serving metric (repeatable):
    /// NAME=FAMILY{LABEL="VALUE",LABEL!="VALUE"}:sum|avg|max|min|rate, read from every
    /// serving target, e.g. 'llama_queue=my_queue_depth{model="llama"}:sum'.
    #[arg(
        long = "serving-metric",
        value_name = "DEFINITION",
        help_heading = "Serving engines"
    )]
    pub serving_metrics: Vec<String>,

    /// Query this Prometheus-compatible API (Prometheus, Thanos, Mimir) instead of
    /// scraping the exporters, e.g. http://prometheus.monitoring:9090.
    #[arg(long, value_name = "URL", conflicts_with = "exporter_urls")]
    pub prometheus_url: Option<String>,

    /// Extra header for Prometheus queries, `Name: value` (repeatable), e.g. a tenant ID.
    #[arg(long = "prometheus-header", value_name = "HEADER", value_parser = parse_header)]
    pub prometheus_headers: Vec<(String, String)>,

    /// File with a bearer token for Prometheus (read at every query round).
    #[arg(long, value_name = "PATH")]
    pub prometheus_bearer_token_file: Option<std::path::PathBuf>,

    /// PEM CA bundle for an https Prometheus URL; default: the system's roots.
    #[arg(long, value_name = "PATH")]
    pub prometheus_ca_file: Option<std::path::PathBuf>,

    /// Where the per-pod values are aggregated: `inline`, in each query a round sends,
    /// or `recorded`, by recording rules in the engine (print them with
    /// --print-recording-rules), so a round reads one series per pod and metric: for
    /// fleets whose raw series are too many to aggregate every round.
    #[arg(long, value_name = "WHERE", value_enum, default_value_t = Queries::Inline)]
    pub prometheus_queries: Queries,

    /// Print the Prometheus recording rules that --prometheus-queries=recorded reads
    /// (a rule file; its `groups` are also a PrometheusRule's spec) and exit.
    #[arg(long)]
    pub print_recording_rules: bool,

    /// How often to scrape an exporter that does not support the long poll (older
    /// gpu-exporters, dcgm-exporter), and how long a gpu-exporter may hold a long poll
    /// before answering that nothing is new: 2s, 500ms, or milliseconds. gpu-exporters
    /// are followed sample by sample whatever this is.
    #[arg(long, default_value = "2s", value_parser = duration::parse_flag)]
    pub scrape_interval: Duration,

    /// Bound on one scrape (a long poll may take this plus its hold).
    #[arg(long, default_value = "1500ms", value_parser = duration::parse_flag)]
    pub scrape_timeout: Duration,

    /// Data older than this is never served; default: 3 scrape intervals.
    #[arg(long, value_parser = duration::parse_flag)]
    pub max_staleness: Option<Duration>,

    /// The listener's bounds (shared with the exporter).
    #[command(flatten)]
    pub listener: kube_support::listener_flags::ListenerFlags<256>,

    /// Largest answer read from one exporter or one Prometheus query: 16Mi, five times
    /// a 10,000-GPU fleet's query answer. Bytes, or with a Ki, Mi or Gi suffix.
    #[arg(long, value_name = "SIZE", default_value = "16Mi", value_parser = parse_size, help_heading = "Memory bounds")]
    pub max_response_size: usize,

    /// Bytes of answers read or being decoded at once, over every exporter and query;
    /// an answer waits for room. Like every memory bound's default, its row of the
    /// Deployment's 256Mi memory budget (see source::limits); raise them with it.
    #[arg(long, value_name = "SIZE", default_value = "32Mi", value_parser = parse_size, help_heading = "Memory bounds")]
    pub max_in_flight_size: usize,

    /// Series of the served families one exporter may report; past it, its answer is
    /// refused (a node with 8 GPUs split 7 ways reports ~1,000).
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::source::limits::DEFAULT_MAX_SERIES_PER_TARGET,
        help_heading = "Memory bounds"
    )]
    pub max_series_per_target: usize,

    /// Pods one exporter may report; past it, its answer is refused.
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::source::limits::DEFAULT_MAX_PODS_PER_TARGET,
        help_heading = "Memory bounds"
    )]
    pub max_pods_per_target: usize,

    /// Pods held over the whole fleet; an answer that would pass it is refused (~4 KiB
    /// a pod: raise the memory limit with it).
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::source::limits::DEFAULT_MAX_PODS,
        help_heading = "Memory bounds"
    )]
    pub max_pods: usize,

    /// Samples one Prometheus query round may keep: one per pod and query, six
    /// queries (16,000 pods: 96,000); past it, the round fails.
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::source::limits::DEFAULT_PROMETHEUS_MAX_SERIES,
        help_heading = "Memory bounds"
    )]
    pub prometheus_max_series: usize,

    /// A composite metric, `NAME=EXPRESSION` (repeatable): numbers, per-pod metric
    /// names, + - * /, min(...), max(...), parentheses, e.g.
    /// `pressure=max(gpu_utilization/70, gpu_memory_utilization/80)`. Evaluated per pod;
    /// served like the built-in metrics.
    #[arg(
        long = "composite-metric",
        value_name = "NAME=EXPRESSION",
        help_heading = "Composite metrics and signals"
    )]
    pub composite_metrics: Vec<String>,

    /// File of composite metrics, one `NAME = EXPRESSION` a line (`#` comments).
    #[arg(
        long,
        value_name = "PATH",
        help_heading = "Composite metrics and signals"
    )]
    pub composite_metrics_file: Option<PathBuf>,

    /// A signal without pods, for scale from zero (repeatable):
    /// `NAMESPACE/NAME=URL#SERIES` (the sum of SERIES, `name` or `name{label="v"}`, in
    /// the text exposition at URL, e.g. a gateway's /metrics) or
    /// `NAMESPACE/NAME=promql:QUERY`. Served as the external metric NAME of NAMESPACE
    /// and as a KEDA trigger metric.
    #[arg(long = "signal", value_name = "NAMESPACE/NAME=SOURCE", value_parser = crate::source::signal::parse_spec, help_heading = "Composite metrics and signals")]
    pub signals: Vec<crate::source::signal::SignalSpec>,

    /// The Prometheus-compatible API of `promql:` signals; default: --prometheus-url.
    #[arg(
        long,
        value_name = "URL",
        help_heading = "Composite metrics and signals"
    )]
    pub signal_prometheus_url: Option<String>,

    /// How often every signal is read; KEDA's StreamIsActive hears of a change within it.
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = duration::parse_flag, help_heading = "Composite metrics and signals")]
    pub signal_interval: Duration,

    /// kubeconfig for the pod watch; default: the in-cluster service account.
    #[arg(long, env = "KUBECONFIG", hide_env_values = true, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Log filter: a level (off, error, warn, info, debug, trace) or RUST_LOG
    /// directives (TARGET=LEVEL, comma-separated); a malformed one stops startup.
    #[arg(long, env = "RUST_LOG", hide_env_values = true, default_value = "info",
          value_parser = kube_support::log_filter::parse)]
    pub log_level: String,
}

impl Cli {
    /// Bounds on the listener's connections, from the listener flags; the health
    /// reserve answers `health_paths` only.
    pub fn listener_limits(&self, health_paths: &[&str]) -> tls_serving::Limits {
        self.listener.limits(health_paths)
    }

    /// The memory limits of the sources, checked against each other.
    pub fn limits(&self) -> Result<crate::source::limits::Limits, Error> {
        crate::source::limits::Limits::new(
            self.max_response_size,
            self.max_in_flight_size,
            self.max_series_per_target,
            self.max_pods_per_target,
            self.max_pods,
        )
        .map_err(Error::from)
    }

    /// The composite metrics and signals the flags declare; an error names the bad one.
    pub fn catalog(&self) -> Result<crate::query::composite::Catalog, Error> {
        let mut composites: Vec<crate::query::composite::Definition> = self
            .composite_metrics
            .iter()
            .map(crate::query::composite::Definition::flag)
            .collect();
        if let Some(path) = &self.composite_metrics_file {
            composites.extend(crate::query::composite::Catalog::read_file(path)?);
        }
        let signals: Vec<(String, String)> = self
            .signals
            .iter()
            .map(|s| (s.namespace.clone(), s.name.clone()))
            .collect();
        crate::query::composite::Catalog::new(&composites, &signals)
    }

    pub fn staleness(&self) -> Duration {
        self.max_staleness.unwrap_or(self.scrape_interval * 3)
    }
}

/// A byte size: a number, or with a Ki, Mi or Gi suffix (as Kubernetes quantities).
pub fn parse_size(text: &str) -> Result<usize, Error> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => {
            return Err(Error::Config(format!(
                "{text:?} is not a size: bytes, or a number with Ki, Mi or Gi"
            )));
        }
    };
    digits
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| Error::Config(format!("{text:?} is not a positive size")))
}

/// `Name: value` → (name, value), the name a valid HTTP header name.
pub fn parse_header(text: &str) -> Result<(String, String), Error> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| Error::Config(format!("{text:?} is not `Name: value`")))?;
    let name = name.trim();
    axum::http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| Error::Config(format!("{name:?} is not a valid header name")))?;
    axum::http::HeaderValue::from_str(value.trim())
        .map_err(|_| Error::Config(format!("the value of {name} is not a valid header value")))?;
    Ok((name.to_string(), value.trim().to_string()))
}

/// A Service by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `NAMESPACE/NAME` → [`ServiceRef`], both DNS labels as Kubernetes requires, so a typo
/// fails at startup instead of silently watching nothing.
/// A label selector flag, checked.
pub fn parse_label_selector(text: &str) -> Result<String, Error> {
    match crate::api::selector::Selector::parse(text) {
        Ok(s) if !s.is_empty() => Ok(text.to_string()),
        Ok(_) => Err(Error::Config(
            "an empty selector would match every Service".into(),
        )),
        Err(e) => Err(Error::Config(format!(
            "{text:?} is not a label selector: {e}"
        ))),
    }
}

/// `--serving-target`, for clap.
pub fn parse_serving_target(text: &str) -> Result<crate::source::serving::ServingTarget, Error> {
    crate::source::serving::parse_target(text)
}

pub fn parse_service(text: &str) -> Result<ServiceRef, Error> {
    let (namespace, name) = text
        .split_once('/')
        .ok_or_else(|| Error::Config(format!("{text:?} is not NAMESPACE/NAME")))?;
    for part in [namespace, name] {
        let label = !part.is_empty()
            && part.len() <= 63
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !part.starts_with('-')
            && !part.ends_with('-');
        if !label {
            return Err(Error::Config(format!(
                "{text:?}: {part:?} is not a namespace or Service name (lowercase letters, digits and '-', at most 63)"
            )));
        }
    }
    Ok(ServiceRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_bytes_or_binary_suffixes() {
        for (text, bytes) in [
            ("1", 1),
            ("512", 512),
            ("3Ki", 3 << 10),
            ("16Mi", 16 << 20),
            ("1Gi", 1 << 30),
        ] {
            assert_eq!(parse_size(text).unwrap(), bytes, "{text}");
        }
        for (bad, positive) in [
            ("", true),
            ("0", true),
            ("16M", false),
            ("Mi", true),
            ("-1", false),
            ("1.5Mi", false),
            ("16 Mi", false),
            ("99999999999999999999Gi", true),
            ("17179869184Gi", true),
        ] {
            let why = if positive {
                format!("{bad:?} is not a positive size")
            } else {
                format!("{bad:?} is not a size: bytes, or a number with Ki, Mi or Gi")
            };
            assert_eq!(parse_size(bad).unwrap_err().to_string(), why);
        }
    }

    /// A response limit that cannot fit in the in-flight budget stops startup.
    #[test]
    fn the_response_limit_must_fit_the_in_flight_budget() {
        let cli = |args: &[&str]| {
            Cli::try_parse_from(["gpu-metrics-adapter"].iter().chain(args)).unwrap()
        };
        let defaults = cli(&[]).limits().unwrap();
        assert!(defaults.max_response_bytes <= defaults.max_in_flight_bytes);
        // The flags' defaults are the memory budget's (source::limits::BUDGET).
        let budget = crate::source::limits::Limits::default();
        assert_eq!(
            (
                defaults.max_response_bytes,
                defaults.max_in_flight_bytes,
                defaults.max_series_per_target,
                defaults.max_pods_per_target,
                defaults.max_pods,
            ),
            (
                budget.max_response_bytes,
                budget.max_in_flight_bytes,
                budget.max_series_per_target,
                budget.max_pods_per_target,
                budget.max_pods,
            )
        );
        assert_eq!(
            cli(&[]).prometheus_max_series,
            crate::source::limits::DEFAULT_PROMETHEUS_MAX_SERIES
        );
        let e = cli(&[
            "--max-response-size",
            "64Mi",
            "--max-in-flight-size",
            "32Mi",
        ])
        .limits()
        .unwrap_err();
        assert!(e.to_string().contains("--max-response-size"), "{e}");
    }
}
