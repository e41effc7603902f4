//! # gpu-metrics-adapter
//!
//! A Kubernetes aggregated API server that answers `custom.metrics.k8s.io` (v1beta2 and
//! v1beta1) and `external.metrics.k8s.io` (v1beta1) with GPU metrics, fed straight from
//! the gpu-exporters, so HPAs scale GPU workloads without a Prometheus in between.
//!
//! Data flows one way, and no module imports from one downstream of it:
//!
//! [`source`] (scrape the exporters or query Prometheus, derive per-pod values; watch
//! the pods) → [`fleet`] (the snapshot, swapped atomically) → [`query`] (per request:
//! which pods, which values are fresh; KEDA triggers) → [`faces`] (the metrics APIs,
//! KEDA gRPC, the adapter's own `/metrics`).
//!
//! Beside the flow: [`api`] holds the wire primitives (quantities, `Status`), [`auth`]
//! the delegated authentication and authorization in front of the faces, [`error`] the
//! one error type and its `Status` reason, [`config`] the flags.

pub mod api;
pub mod auth;
pub mod config;
pub mod error;
pub mod faces;
pub mod fleet;
pub mod query;
pub mod source;

/// Entry points for the fuzz targets (`tests/fuzz`) into code that is private to its
/// module. Not an API: nothing else may use it.
#[doc(hidden)]
pub mod fuzzing {
    use crate::error::Error;
    use std::time::Duration;

    /// One Prometheus round whose queries got `bodies`, in order (missing ones answer
    /// nothing): the fleet it gives.
    pub use crate::source::prometheus::decode_round as prometheus_round;

    /// A `promql:` signal's reading of an instant-query answer `body`.
    pub fn signal_value(body: &[u8]) -> Result<f64, Error> {
        crate::source::prometheus::query_value(axum::http::StatusCode::OK, body)
    }

    /// The state a KEDA trigger is parsed against: the built-in metrics only, no data.
    pub fn trigger_state() -> crate::query::AppState {
        crate::query::AppState {
            fleet: Default::default(),
            serving: Default::default(),
            pods: Default::default(),
            staleness: Duration::from_secs(30),
            window_seconds: 2,
            catalog: Default::default(),
            signals: crate::source::signal::handle(),
        }
    }
}

use arc_swap::ArcSwap;
use config::Cli;
use error::Error;
use faces::telemetry::{self, Telemetry};
use faces::{http, keda};
use fleet::Fleet;
use query::AppState;
use source::pods::{self, PodIndex};
use source::{SourceMetrics, discovery, exposition, prometheus, scrape};
use std::sync::Arc;
use tokio::sync::watch;

/// Run the adapter until SIGINT or SIGTERM.
pub fn run(cli: Cli) -> Result<(), Error> {
    tls_serving::install_crypto_provider();
    if cli.insecure_serve_http {
        tracing::warn!(
            "serving over plain HTTP without authentication or authorization (--insecure-serve-http): for local use and tests only, never in a cluster"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("adapter")
        .enable_all()
        .build()?;
    runtime.block_on(serve(cli))
}

/// source → fleet → query → faces, then serve until stopped.
async fn serve(cli: Cli) -> Result<(), Error> {
    let fleet = Arc::new(ArcSwap::from_pointee(Fleet::default()));
    let pods = Arc::new(ArcSwap::from_pointee(PodIndex::default()));
    let serving = Arc::new(ArcSwap::from_pointee(Fleet::default()));
    let mut telemetry = Telemetry::new(fleet.clone(), cli.staleness());
    telemetry.watch_serving(serving.clone(), cli.staleness());
    let telemetry = Arc::new(telemetry);
    // One in-flight budget over the exporters and the serving engines.
    let limits = cli.limits()?;
    let targets = start_source(
        &cli,
        fleet.clone(),
        telemetry.source.clone(),
        limits.clone(),
    )?;
    // Before the catalog: it checks composites' inputs against the served names.
    let serving_discovery = start_serving(
        &cli,
        serving.clone(),
        telemetry.serving_source.clone(),
        limits,
    )?;
    let catalog = Arc::new(cli.catalog()?);
    let signals = start_signals(&cli, telemetry.source.clone())?;
    start_watches(&cli, targets, serving_discovery, pods.clone()).await?;
    let state = Arc::new(AppState {
        fleet,
        serving,
        pods,
        staleness: cli.staleness(),
        window_seconds: cli.scrape_interval.as_secs().max(1),
        catalog,
        signals,
    });
    let (stop, stopped) = watch::channel(false);
    let grpc = serve_grpc(&cli, state.clone(), &telemetry, stopped.clone()).await?;
    tokio::spawn(async move {
        kube_support::shutdown::signal().await;
        let _ = stop.send(true);
    });
    serve_api(&cli, state, &telemetry, stopped).await?;
    grpc.await
        .map_err(|e| Error::Config(format!("the gRPC server task failed: {e}")))??;
    Ok(())
}

/// Start the source the flags name, publishing into `fleet`. Returns the exporter
/// targets (static from --exporter-url, else for EndpointSlice discovery to keep
/// current), or `None` when there are no exporters to discover.
fn start_source(
    cli: &Cli,
    fleet: Arc<ArcSwap<Fleet>>,
    metrics: SourceMetrics,
    limits: source::limits::Limits,
) -> Result<Option<Arc<ArcSwap<Vec<String>>>>, Error> {
    if let Some(url) = &cli.prometheus_url {
        tracing::info!(url = %url, "source: Prometheus-compatible API");
        let opts = prometheus::PrometheusOptions {
            endpoint: prometheus_endpoint(cli, url),
            interval: cli.scrape_interval,
            timeout: cli.scrape_timeout,
            staleness: cli.staleness(),
            metrics,
            limits,
            max_series: cli.prometheus_max_series,
            queries: cli.prometheus_queries,
        };
        let client = prometheus::client(&opts)
            .map_err(|e| Error::Config(format!("the Prometheus client: {e}")))?;
        tokio::spawn(prometheus::run(opts, client, fleet));
        return Ok(None);
    }
    let targets = Arc::new(ArcSwap::from_pointee(cli.exporter_urls.clone()));
    let opts = scrape::ScrapeOptions {
        targets: targets.clone(),
        interval: cli.scrape_interval,
        timeout: cli.scrape_timeout,
        accept: exposition::ACCEPT,
        auth: scrape::ExporterAuth {
            tls: source::http_client::TlsOptions {
                ca_file: cli.exporter_ca_file.clone(),
                server_name: cli.exporter_tls_server_name.clone(),
            },
            basic_auth: cli
                .exporter_basic_auth_username
                .clone()
                .zip(cli.exporter_basic_auth_password_file.clone()),
        },
        metrics,
        limits,
    };
    let client = scrape::client(&opts)
        .map_err(|e| Error::Config(format!("the exporter scrape client: {e}")))?;
    tokio::spawn(scrape::run(opts, client, exposition::decode, fleet));
    Ok(cli.exporter_urls.is_empty().then_some(targets))
}

/// The Prometheus API at `url` with the --prometheus-* flags' headers, token and CA.
fn prometheus_endpoint(cli: &Cli, url: &str) -> prometheus::Endpoint {
    prometheus::Endpoint {
        url: url.to_string(),
        headers: cli.prometheus_headers.clone(),
        bearer_token_file: cli.prometheus_bearer_token_file.clone(),
        ca_file: cli.prometheus_ca_file.clone(),
    }
}

/// The signal loop, when --signal declares any.
fn start_signals(
    cli: &Cli,
    metrics: SourceMetrics,
) -> Result<source::signal::SignalsHandle, Error> {
    let signals = source::signal::handle();
    if cli.signals.is_empty() {
        return Ok(signals);
    }
    // --signal-prometheus-url is asked as it is; without it, the signals ask
    // --prometheus-url as the Prometheus source does (its headers, token and CA).
    let prometheus = match (&cli.signal_prometheus_url, &cli.prometheus_url) {
        (Some(url), _) => Some(prometheus::Endpoint {
            url: url.clone(),
            ..Default::default()
        }),
        (None, Some(url)) => Some(prometheus_endpoint(cli, url)),
        (None, None) => None,
    };
    if prometheus.is_none()
        && let Some(s) = cli
            .signals
            .iter()
            .find(|s| matches!(s.source, source::signal::SignalSource::Query(_)))
    {
        return Err(Error::Config(format!(
            "--signal {}/{}: promql: signals need --signal-prometheus-url or --prometheus-url",
            s.namespace, s.name
        )));
    }
    let opts = source::signal::SignalOptions {
        specs: cli.signals.clone(),
        prometheus,
        interval: cli.signal_interval,
        timeout: cli.scrape_timeout.min(cli.signal_interval * 4),
        limits: cli.limits()?,
        metrics,
    };
    let clients = source::signal::clients(&opts)
        .map_err(|e| Error::Config(format!("the signal client: {e}")))?;
    tracing::info!(signals = cli.signals.len(), interval = ?cli.signal_interval, "source: signals without pods");
    tokio::spawn(source::signal::run(opts, clients, signals.clone()));
    Ok(signals)
}

/// Follow the serving engines (`--serving-target`), with the user's mappings
/// (`--serving-metric`), publishing into `serving`: the exporters' loop, limits and
/// staleness, its own self-metrics.
fn start_serving(
    cli: &Cli,
    serving: Arc<ArcSwap<Fleet>>,
    metrics: SourceMetrics,
    limits: source::limits::Limits,
) -> Result<Option<ServingDiscovery>, Error> {
    use source::serving::{ServingReader, mapping};
    let reserved: Vec<&str> = fleet::GpuMetric::ALL
        .into_iter()
        .chain(fleet::GpuMetric::SERVING)
        .map(fleet::GpuMetric::name)
        .collect();
    let mappings = mapping::parse_all(&cli.serving_metrics, &reserved)?;
    // Leaked once: the names live as long as the process, as metric names.
    let names: Vec<&'static str> = mappings.iter().map(|m| &*m.name.clone().leak()).collect();
    fleet::declare_mapped(names.clone());
    if cli.serving_targets.is_empty() && cli.serving_service_selector.is_none() {
        if !mappings.is_empty() {
            tracing::warn!(
                "--serving-metric without --serving-target or --serving-service-selector: nothing to read it from"
            );
        }
        return Ok(None);
    }
    let mut pods = std::collections::HashMap::new();
    for t in &cli.serving_targets {
        if let Some(other) = pods.insert(t.url.clone(), t.pod.clone()) {
            return Err(Error::Config(format!(
                "--serving-target: {} is given for both {}/{} and {}/{}",
                t.url, other.0, other.1, t.pod.0, t.pod.1
            )));
        }
    }
    tracing::info!(
        targets = pods.len(),
        mappings = mappings.len(),
        "serving engines"
    );
    let urls: Vec<String> = pods.keys().cloned().collect();
    let pods = Arc::new(ArcSwap::from_pointee(pods));
    let targets = Arc::new(ArcSwap::from_pointee(urls));
    let opts = scrape::ScrapeOptions {
        targets: targets.clone(),
        interval: cli.scrape_interval,
        timeout: cli.scrape_timeout,
        accept: source::serving::ACCEPT,
        auth: scrape::ExporterAuth::default(),
        metrics,
        limits,
    };
    let client = scrape::client(&opts)
        .map_err(|e| Error::Config(format!("the serving scrape client: {e}")))?;
    // TGI's KV-cache capacity comes from its /info, asked with the same client,
    // timeout and in-flight budget as the scrapes.
    let info = source::serving::info::TgiInfo::new(Some(source::serving::info::Fetcher {
        client: client.clone(),
        timeout: opts.timeout,
        limits: opts.limits.clone(),
        runtime: tokio::runtime::Handle::current(),
        metrics: opts.metrics.clone(),
    }));
    let reader = ServingReader::new(pods.clone(), mappings, names)
        .with_info(Arc::new(info))
        .with_metrics(opts.metrics.clone());
    tokio::spawn(scrape::run_with(
        opts,
        client,
        reader.into_reader(),
        serving,
    ));
    Ok(cli
        .serving_service_selector
        .clone()
        .map(|selector| ServingDiscovery {
            selector,
            pods,
            targets,
        }))
}

/// What serving engine discovery keeps current.
struct ServingDiscovery {
    selector: String,
    pods: source::serving::TargetPods,
    targets: Arc<ArcSwap<Vec<String>>>,
}

/// The pod watch, and exporter discovery when `targets` are to be discovered. Without
/// API access the adapter still serves unselected pod metrics, unless it has no other
/// way to find the exporters.
async fn start_watches(
    cli: &Cli,
    targets: Option<Arc<ArcSwap<Vec<String>>>>,
    serving: Option<ServingDiscovery>,
    pods: Arc<ArcSwap<PodIndex>>,
) -> Result<(), Error> {
    match kube_support::client(cli.kubeconfig.as_deref()).await {
        Ok(client) => {
            if let Some(d) = serving {
                tokio::spawn(source::serving::discovery::watch(
                    client.clone(),
                    d.selector,
                    cli.serving_port_name.clone(),
                    "http".to_string(),
                    cli.serving_targets.clone(),
                    d.pods,
                    d.targets,
                ));
            }
            if let Some(targets) = targets {
                tokio::spawn(discovery::watch_exporters(
                    client.clone(),
                    cli.exporter_service.clone(),
                    cli.exporter_port_name.clone(),
                    cli.exporter_scheme.clone(),
                    targets,
                ));
            }
            tokio::spawn(pods::watch(client, pods));
            Ok(())
        }
        Err(e) if serving.is_some() => Err(Error::Config(format!(
            "--serving-service-selector needs the Kubernetes API to discover the serving engines: {e}"
        ))),
        Err(e) if targets.is_some() && cli.serving_targets.is_empty() => {
            Err(Error::Config(format!(
                "no --exporter-url, and discovering the exporters from the EndpointSlices of {} needs the Kubernetes API: {e}",
                cli.exporter_service
            )))
        }
        Err(e) => {
            if targets.is_some() {
                tracing::warn!(error = %e, "no --exporter-url and no Kubernetes API to discover exporters: serving engine metrics only");
            }
            tracing::warn!(error = %e, "no Kubernetes API access: label selectors and workload metrics are unavailable");
            Ok(())
        }
    }
}

/// A future that resolves once `stopped` turns true.
async fn stopping(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Bind `port` on --bind-address, or on every interface of both address families.
async fn listen(cli: &Cli, port: u16) -> Result<tokio::net::TcpListener, Error> {
    let address = match cli.bind_address.as_deref() {
        None => format!(":{port}"),
        Some(host) if host.contains(':') && !host.starts_with('[') => format!("[{host}]:{port}"),
        Some(host) => format!("{host}:{port}"),
    };
    tls_serving::bind(&address)
        .await
        .map_err(|source| Error::Listen { address, source })
}

/// KEDA's external scaler on --grpc-port, served in the background until `stopped`.
async fn serve_grpc(
    cli: &Cli,
    state: Arc<AppState>,
    telemetry: &Arc<Telemetry>,
    stopped: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<(), Error>>, Error> {
    let tls = if cli.insecure_serve_http || cli.grpc_insecure {
        if cli.grpc_insecure {
            tracing::warn!("KEDA external scaler gRPC in plain text (--grpc-insecure)");
        }
        None
    } else {
        Some(serving_tls(
            cli,
            tls_serving::ClientAuth::None,
            cli.grpc_client_ca_file.clone(),
        )?)
    };
    let listener = listen(cli, cli.grpc_port).await?;
    let local = listener.local_addr()?;
    tracing::info!(grpc_address = %local, tls = tls.is_some(), mutual_tls = cli.grpc_client_ca_file.is_some(), "KEDA external scaler ready");
    let scaler = keda::Scaler::new(state, cli.scrape_interval);
    // No health paths on the gRPC port, so no reserve. KEDA's connections get the HTTP/2
    // limits and server pings of every listener (tls_serving::Limits).
    let mut limits = cli.listener_limits(&[]);
    limits.stats = telemetry.grpc_listener.clone();
    let grpc = tonic::service::Routes::new(
        keda::proto::external_scaler_server::ExternalScalerServer::new(scaler),
    )
    .into_axum_router()
    .layer(axum::middleware::from_fn_with_state(
        telemetry.clone(),
        telemetry::track_grpc,
    ));
    Ok(tokio::spawn(async move {
        Ok(tls_serving::serve(listener, tls, grpc, limits, stopping(stopped)).await?)
    }))
}

/// The probes' paths, which the HTTPS port's health reserve answers under a flood.
const HEALTH_PATHS: &[&str] = &["/healthz", "/readyz", "/livez"];

/// The metrics APIs and the adapter's own `/metrics` on --secure-port, until `stopped`.
/// `/metrics` sits behind authentication and authorization like every other path (a
/// SubjectAccessReview for the non-resource path, as Kubernetes API servers guard
/// theirs); the request counter wraps both, so refusals are counted.
async fn serve_api(
    cli: &Cli,
    state: Arc<AppState>,
    telemetry: &Arc<Telemetry>,
    stopped: watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut api = http::router(state).merge(telemetry.router());
    let mut tls = None;
    if !cli.insecure_serve_http {
        let auth = start_auth(cli, telemetry.auth.clone()).await?;
        api = api.layer(axum::middleware::from_fn_with_state(auth, auth::middleware));
        tls = Some(serving_tls(cli, tls_serving::ClientAuth::Request, None)?);
    }
    let api = api.layer(axum::middleware::from_fn_with_state(
        telemetry.clone(),
        telemetry::track_http,
    ));
    let listener = listen(cli, cli.secure_port).await?;
    let local = listener.local_addr()?;
    tracing::info!(address = %local, tls = tls.is_some(), "listening");
    let mut limits = cli.listener_limits(HEALTH_PATHS);
    limits.stats = telemetry.api_listener.clone();
    Ok(tls_serving::serve(listener, tls, api, limits, stopping(stopped)).await?)
}

/// Delegated authentication and authorization, with the API clients their flags name.
async fn start_auth(cli: &Cli, metrics: auth::AuthMetrics) -> Result<Arc<auth::Auth>, Error> {
    let client_for = |purpose: &'static str, path: Option<std::path::PathBuf>| async move {
        kube_support::client(path.as_deref()).await.map_err(|e| {
            Error::Config(format!(
                "{purpose} needs the Kubernetes API (--{purpose}-kubeconfig, --kubeconfig or in-cluster; --insecure-serve-http serves without it, for local use only): {e}"
            ))
        })
    };
    let authn = client_for(
        "authentication",
        cli.authentication_kubeconfig
            .clone()
            .or(cli.kubeconfig.clone()),
    )
    .await?;
    let authz = client_for(
        "authorization",
        cli.authorization_kubeconfig
            .clone()
            .or(cli.kubeconfig.clone()),
    )
    .await?;
    let settings = auth::AuthSettings {
        sources: auth::authn::FlagSources {
            client_ca_file: cli.client_ca_file.clone(),
            requestheader_client_ca_file: cli.requestheader_client_ca_file.clone(),
            requestheader: auth::authn::RequestHeaderSettings {
                allowed_names: cli.requestheader_allowed_names.clone(),
                username_headers: cli.requestheader_username_headers.clone(),
                group_headers: cli.requestheader_group_headers.clone(),
                extra_prefixes: cli.requestheader_extra_headers_prefix.clone(),
                uid_headers: cli.requestheader_uid_headers.clone(),
            },
        },
        skip_lookup: cli.authentication_skip_lookup,
        tolerate_lookup_failure: cli.authentication_tolerate_lookup_failure,
        anonymous: cli.anonymous_auth,
        token_cache_ttl: cli.authentication_token_webhook_cache_ttl,
        authorized_ttl: cli.authorization_webhook_cache_authorized_ttl,
        unauthorized_ttl: cli.authorization_webhook_cache_unauthorized_ttl,
        always_allow_paths: cli.authorization_always_allow_paths.clone(),
        metrics,
    };
    auth::Auth::start(settings, authn, authz).await
}

/// How often serving certificate, key and client-CA files are checked for changes.
const TLS_FILE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// The serving TLS configuration: --tls-cert-file and --tls-private-key-file, reloaded
/// on change (with `client_ca_file`, which makes client certificates required and
/// verified), or a self-signed pair.
fn serving_tls(
    cli: &Cli,
    client_auth: tls_serving::ClientAuth,
    client_ca_file: Option<std::path::PathBuf>,
) -> Result<tls_serving::TlsConfigHandle, Error> {
    let min_version = if cli.tls_min_version == "VersionTLS13" {
        tls_serving::MinTlsVersion::Tls13
    } else {
        tls_serving::MinTlsVersion::Tls12
    };
    let client_auth_from = move |ca: &Option<std::path::PathBuf>| -> Result<_, tls_serving::Error> {
        Ok(match ca {
            Some(path) => tls_serving::ClientAuth::RequireAndVerify(Arc::new(
                tls_serving::load_ca_bundle(path)?,
            )),
            None => client_auth.clone(),
        })
    };
    let (Some(cert), Some(key)) = (cli.tls_cert_file.clone(), cli.tls_private_key_file.clone())
    else {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let (chain, key) =
            tls_serving::self_signed(&names).map_err(|e| Error::Config(e.to_string()))?;
        let config = tls_serving::server_config(
            chain,
            key,
            client_auth_from(&client_ca_file).map_err(|e| Error::Config(e.to_string()))?,
            min_version,
        )
        .map_err(|e| Error::Config(e.to_string()))?;
        tracing::warn!(
            "no --tls-cert-file: serving a generated self-signed certificate; an APIService then needs insecureSkipTLSVerify: true (use a real certificate and caBundle in production)"
        );
        return Ok(Arc::new(ArcSwap::from_pointee(config)));
    };
    let build =
        move || -> Result<(rustls::ServerConfig, Vec<std::path::PathBuf>), tls_serving::Error> {
            let chain = tls_serving::load_cert_chain(&cert)?;
            let private_key = tls_serving::load_private_key(&key)?;
            let config = tls_serving::server_config(
                chain,
                private_key,
                client_auth_from(&client_ca_file)?,
                min_version,
            )?;
            let mut files = vec![cert.clone(), key.clone()];
            files.extend(client_ca_file.iter().cloned());
            Ok((config, files))
        };
    let (config, files) = build().map_err(|e| Error::Config(e.to_string()))?;
    let handle = Arc::new(ArcSwap::from_pointee(config));
    tls_serving::watch_server_config(handle.clone(), files, TLS_FILE_POLL, build);
    Ok(handle)
}
