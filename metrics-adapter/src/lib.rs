//! # gpu-metrics-adapter
//!
//! A Kubernetes aggregated API server that answers `custom.metrics.k8s.io` (v1beta2 and
//! v1beta1) and `external.metrics.k8s.io` (v1beta1) with GPU metrics, fed straight from
//! the gpu-exporters, so HPAs scale GPU workloads without a Prometheus in between.
//!
//! Data flows one way: [`source`] (scrape the exporters) → [`derive`] (per-pod values) →
//! a [`source::Fleet`] snapshot swapped atomically → [`query`] (per request, with the
//! [`pods`] index for selectors and owners) → [`http`] (the API shapes, in [`api`]).

pub mod api;
pub mod config;
pub mod derive;
pub mod discovery;
pub mod error;
pub mod exposition;
pub mod http;
pub mod keda;
pub mod pods;
pub mod prometheus;
pub mod query;
pub mod source;

use arc_swap::ArcSwap;
use config::Cli;
use error::Error;
use std::sync::Arc;

/// Run the adapter until SIGINT or SIGTERM.
pub fn run(cli: Cli) -> Result<(), Error> {
    if !cli.insecure_serve_http {
        return Err(Error::Config(
            "TLS serving is not built yet (issue 6); pass --insecure-serve-http for local use"
                .into(),
        ));
    }
    tracing::warn!(
        "serving over plain HTTP without authentication (--insecure-serve-http): for local use and tests only, never in a cluster"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("adapter")
        .enable_all()
        .build()
        .map_err(Error::Io)?;
    runtime.block_on(async move {
        let fleet = Arc::new(ArcSwap::from_pointee(source::Fleet::default()));
        let pods = Arc::new(ArcSwap::from_pointee(pods::PodIndex::default()));
        // Static from --exporter-url, else kept current by EndpointSlice discovery.
        let targets = Arc::new(ArcSwap::from_pointee(cli.exporter_urls.clone()));
        let discover = cli.exporter_urls.is_empty() && cli.prometheus_url.is_none();
        if let Some(url) = &cli.prometheus_url {
            tracing::info!(url = %url, "source: Prometheus-compatible API");
            tokio::spawn(prometheus::run(
                prometheus::PrometheusOptions {
                    url: url.clone(),
                    headers: cli.prometheus_headers.clone(),
                    bearer_token_file: cli.prometheus_bearer_token_file.clone(),
                    ca_file: cli.prometheus_ca_file.clone(),
                    interval: cli.scrape_interval,
                    timeout: cli.scrape_timeout,
                    staleness: cli.staleness(),
                },
                fleet.clone(),
            ));
        } else {
            tokio::spawn(source::run(
                source::ScrapeOptions {
                    targets: targets.clone(),
                    interval: cli.scrape_interval,
                    timeout: cli.scrape_timeout,
                    accept: exposition::ACCEPT,
                },
                exposition::decode,
                fleet.clone(),
            ));
        }
        match kube_client(cli.kubeconfig.as_deref()).await {
            Ok(client) => {
                if discover {
                    tokio::spawn(discovery::watch_exporters(
                        client.clone(),
                        cli.exporter_service.clone(),
                        cli.exporter_port_name.clone(),
                        targets,
                    ));
                }
                tokio::spawn(pods::watch(client, pods.clone()));
            }
            Err(e) if discover => {
                return Err(Error::Config(format!(
                    "no --exporter-url, and discovering the exporters from the EndpointSlices of {} needs the Kubernetes API: {e}",
                    cli.exporter_service
                )));
            }
            Err(e) => tracing::warn!(error = %e, "no Kubernetes API access: label selectors and workload metrics are unavailable"),
        }
        let state = Arc::new(http::AppState {
            fleet,
            pods,
            staleness: cli.staleness(),
            window_seconds: cli.scrape_interval.as_secs().max(1),
        });
        let grpc_address = format!("{}:{}", cli.bind_address, cli.grpc_port);
        let grpc_listener = tokio::net::TcpListener::bind(&grpc_address)
            .await
            .map_err(|e| Error::Listen(grpc_address.clone(), e))?;
        let grpc_local = grpc_listener.local_addr().map_err(Error::Io)?;
        tracing::info!(grpc_address = %grpc_local, "KEDA external scaler ready");
        let scaler = keda::Scaler::new(state.clone(), cli.scrape_interval);
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(keda::proto::external_scaler_server::ExternalScalerServer::new(scaler))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc_listener))
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "KEDA external scaler stopped");
            }
        });
        let address = format!("{}:{}", cli.bind_address, cli.secure_port);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .map_err(|e| Error::Listen(address.clone(), e))?;
        let local = listener.local_addr().map_err(Error::Io)?;
        tracing::info!(address = %local, "listening");
        axum::serve(listener, http::router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(Error::Io)
    })
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, String> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    // The watcher retries by itself; client retries would hide outages.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}
