//! # gpu-exporter
//!
//! NVIDIA GPU metrics for Prometheus from NVML, with dcgm-exporter's metric names,
//! labels and counters-CSV format. Data flows one way:
//!
//! [`source`] (NVML or simulated) → [`sampler`] (background thread) →
//! [`snapshot`] (immutable, swapped atomically) → [`encode`] (per scrape) → [`http`].
//!
//! [`catalog`] knows every servable field; [`counters`] turns a counters CSV into the
//! plan of what to export.

pub mod access;
pub mod attribution;
pub mod catalog;
pub mod config;
pub mod counters;
#[cfg(feature = "demo")]
pub mod demo;
pub mod encode;
pub mod error;
pub mod http;
pub mod sampler;
pub mod snapshot;
pub mod source;
pub mod web_config;

use crate::config::Cli;
use crate::error::{Error, Result};
use crate::sampler::{Sampler, SamplerOptions};
use crate::snapshot::Snapshot;
use crate::source::GpuSource;
use arc_swap::ArcSwap;
use std::sync::Arc;

/// The node name for the hostname label: `NODE_NAME` (set from the downward API in
/// Kubernetes), else the kernel's hostname.
pub fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "localhost".into())
}

/// The GPU source the flags ask for.
pub fn build_source(cli: &Cli) -> Result<Box<dyn GpuSource>> {
    #[cfg(feature = "demo")]
    if let Some(path) = &cli.simulate {
        return demo::simulated_source(path);
    }
    Ok(Box::new(source::nvml::NvmlSource::new(
        cli.nvml_lib.clone(),
    )))
}

/// Load the counters plan named by the flags, logging its warnings.
pub fn load_plan(cli: &Cli) -> Result<counters::ExportPlan> {
    let (plan, warnings) = match &cli.collectors {
        Some(path) => counters::load(path)?,
        None => counters::plan(counters::DEFAULT_COUNTERS, "built-in default counters")?,
    };
    for w in warnings {
        if w.notice {
            tracing::info!(line = w.line, "{}", w.message);
        } else {
            tracing::warn!(line = w.line, "{}", w.message);
        }
    }
    Ok(plan)
}

/// Where pod attribution gets its inputs.
#[derive(Debug, Clone)]
pub struct KubernetesOptions {
    pub socket: std::path::PathBuf,
    pub refresh_interval: std::time::Duration,
    pub extra_resources: Vec<String>,
    pub pod_labels: Vec<String>,
    pub kubeconfig: Option<std::path::PathBuf>,
    /// This node's name, for the node-scoped pod watch; without it there is no watch.
    pub node_name: Option<String>,
    pub proc_root: std::path::PathBuf,
}

impl KubernetesOptions {
    pub fn from_cli(cli: &Cli) -> KubernetesOptions {
        KubernetesOptions {
            socket: cli.pod_resources_kubelet_socket.clone(),
            refresh_interval: cli.kubernetes_refresh_interval,
            extra_resources: cli
                .nvidia_resource_names
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            pod_labels: cli
                .kubernetes_pod_labels
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            kubeconfig: cli.kubeconfig.clone(),
            node_name: std::env::var("NODE_NAME").ok().filter(|s| !s.is_empty()),
            proc_root: cli.proc_root.clone(),
        }
    }
}

/// Start the kubelet refresher and, with a node name, the pod watch on `runtime`, and
/// return the sampler's handle on them.
pub fn start_attribution(
    opts: &KubernetesOptions,
    runtime: &tokio::runtime::Handle,
) -> attribution::Attributor {
    use attribution::kubelet::{self, KubeletOptions, KubeletView};
    use attribution::pods::{self, PodDirectory};
    let kubelet_view = Arc::new(ArcSwap::from_pointee(KubeletView::default()));
    let directory = Arc::new(ArcSwap::from_pointee(PodDirectory::default()));
    runtime.spawn(kubelet::refresh(
        KubeletOptions {
            socket: opts.socket.clone(),
            interval: opts.refresh_interval,
            timeout: std::time::Duration::from_secs(10).min(opts.refresh_interval * 5),
            extra_resources: opts.extra_resources.clone(),
        },
        kubelet_view.clone(),
    ));
    tracing::info!(socket = %opts.socket.display(), every = ?opts.refresh_interval, "pod attribution from the kubelet's PodResources API");
    let pod_watch = opts.node_name.is_some();
    match &opts.node_name {
        Some(node) => {
            let node = node.clone();
            let kubeconfig = opts.kubeconfig.clone();
            let allow = opts.pod_labels.clone();
            let store = directory.clone();
            let kubelet = kubelet_view.clone();
            runtime.spawn(async move {
                match kube_support::client(kubeconfig.as_deref()).await {
                    Ok(client) => {
                        tracing::info!(node = %node, labels = ?allow, "watching this node's pods");
                        pods::watch(client, node, allow, store, kubelet).await;
                    }
                    Err(e) => tracing::error!(error = %e, "no Kubernetes API access: no pod labels, no per-pod split of shared GPUs"),
                }
            });
        }
        None => tracing::warn!(
            "NODE_NAME is not set: no pod watch, so no pod labels and no per-pod split of shared GPUs (set it from the downward API: spec.nodeName)"
        ),
    }
    attribution::Attributor::new(kubelet_view, directory, pod_watch, opts.proc_root.clone())
}

/// Run the exporter until SIGINT or SIGTERM.
pub fn run(cli: Cli) -> Result<()> {
    tls_serving::install_crypto_provider();
    // The web config first: a bad one stops startup before the GPUs are touched.
    let web = match cli.web_config_file() {
        Some(path) => {
            let config = web_config::WebConfig::load(path)?;
            let server = config.server_config()?;
            access::warn_if_insecure(&config);
            Some((config, server))
        }
        None => None,
    };
    let plan = Arc::new(load_plan(&cli)?);
    let source = build_source(&cli)?;
    let build_labels: Arc<str> = {
        let mut s = String::new();
        snapshot::push_label(&mut s, "version", env!("CARGO_PKG_VERSION"));
        snapshot::push_label(&mut s, "source", &source.describe());
        s.into()
    };
    let opts = SamplerOptions {
        interval: cli.interval(),
        hostname: (!cli.no_hostname).then(|| (cli.hostname_label.clone(), node_name())),
        replace_blanks_in_model_name: cli.replace_blanks_in_model_name,
        process_metrics: cli.process_metrics,
    };
    tracing::info!(source = %source.describe(), metrics = plan.metrics.len(), interval_ms = cli.collect_interval, "starting");
    // Two workers: scrapes are cheap (a cached body) and the Kubernetes refreshers are
    // mostly idle, but one slow client must not hold up the others; more threads would
    // only cost memory.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_io()
        .enable_time()
        .build()
        .map_err(Error::Serve)?;
    let store = Arc::new(snapshot::SnapshotStore::new(Snapshot::empty(
        plan.clone(),
        build_labels.clone(),
    )));
    let mut sampler = Sampler::new(source, plan, opts, build_labels);
    if cli.kubernetes {
        sampler = sampler.with_attribution(start_attribution(
            &KubernetesOptions::from_cli(&cli),
            runtime.handle(),
        ));
    }
    // The demo's simulated Kubernetes node, held until exit.
    #[cfg(feature = "demo")]
    let (sampler, _demo_node) = demo::with_kube_node(&cli, sampler, runtime.handle())?;
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let sampler_store = store.clone();
    let sampler_thread = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || sampler::run(sampler, sampler_store, stop_rx))
        .map_err(Error::Serve)?;

    let state = Arc::new(http::AppState::new(store, cli.interval(), cli.openmetrics));
    let address = cli.bind_address();
    // Probes carry no credentials, so the paths open to everyone are the health paths.
    let limits = cli.listener_limits(access::UNAUTHENTICATED_PATHS);
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .map_err(|source| Error::Listen {
                address: address.clone(),
                source,
            })?;
        let local = listener.local_addr().map_err(Error::Serve)?;
        let mut router = http::router(state);
        let mut tls = None;
        if let Some((config, server)) = web {
            let handle: Option<tls_serving::TlsConfigHandle> =
                server.map(|s| Arc::new(ArcSwap::from_pointee(s)));
            let guard = Arc::new(access::Guard::new(&config));
            access::watch(&config, handle.clone(), guard.clone());
            router = access::protect(router, guard);
            tracing::info!(
                file = %config.path.display(),
                tls = handle.is_some(),
                basic_auth_users = config.users.len(),
                exempt = ?access::UNAUTHENTICATED_PATHS,
                "web config loaded"
            );
            tls = handle;
        }
        tracing::info!(address = %local, tls = tls.is_some(), "listening");
        tls_serving::serve(
            listener,
            tls,
            router,
            limits,
            kube_support::shutdown::signal(),
        )
        .await
        .map_err(Error::Serve)
    });
    drop(stop_tx);
    let _ = sampler_thread.join();
    tracing::info!("stopped");
    served
}
