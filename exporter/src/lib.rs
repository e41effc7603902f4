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
pub mod health;
pub mod hpc;
pub mod http;
pub mod plan_reload;
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
            kube_support::config_file::read_attribute(
                std::path::Path::new("/proc/sys/kernel/hostname"),
                kube_support::config_file::ATTRIBUTE_LIMIT,
            )
            .ok()
            .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "localhost".into())
}

/// The GPU source the flags ask for, narrowed to `--devices`.
pub fn build_source(cli: &Cli) -> Result<Box<dyn GpuSource>> {
    let source = all_devices(cli)?;
    Ok(match &cli.devices {
        source::selection::DeviceSelection::Flex => source,
        selection => Box::new(source::selection::Selected::new(source, selection.clone())),
    })
}

fn all_devices(cli: &Cli) -> Result<Box<dyn GpuSource>> {
    #[cfg(feature = "demo")]
    if let Some(path) = &cli.simulate {
        return demo::simulated_source(path);
    }
    Ok(Box::new(
        source::nvml::NvmlSource::new(cli.nvml_lib.clone()).with_sysfs(&cli.path_sysfs),
    ))
}

/// Load the counters plan named by `-f` (or the built-in one), logging its warnings; a
/// ConfigMap (`-m`) is read by [`run`] through the API server.
pub fn load_plan(cli: &Cli) -> Result<counters::ExportPlan> {
    plan_reload::load_local(&plan_reload::PlanSource::new(
        "none",
        cli.collectors.as_deref(),
    )?)
}

/// Where pod attribution gets its inputs.
#[derive(Debug, Clone)]
pub struct KubernetesOptions {
    pub socket: std::path::PathBuf,
    pub refresh_interval: std::time::Duration,
    pub extra_resources: Vec<String>,
    pub pod_labels: attribution::pods::LabelSelection,
    pub kubeconfig: Option<std::path::PathBuf>,
    /// This node's name, for the node-scoped pod watch; without it there is no watch.
    pub node_name: Option<String>,
    /// Watch the node's ResourceSlices of NVIDIA's DRA driver (`--kubernetes-enable-dra`).
    pub enable_dra: bool,
    pub proc_root: std::path::PathBuf,
}

impl KubernetesOptions {
    /// The options the flags give; an allow-list pattern that is no regular expression
    /// is an error.
    pub fn from_cli(cli: &Cli) -> Result<KubernetesOptions> {
        let keys = cli
            .kubernetes_pod_labels
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let pod_labels = attribution::pods::LabelSelection::new(
            keys,
            cli.kubernetes_enable_pod_labels,
            &cli.kubernetes_pod_label_allowlist_regex,
        )
        .map_err(Error::Config)?;
        Ok(KubernetesOptions {
            socket: cli.pod_resources_kubelet_socket.clone(),
            refresh_interval: cli.kubernetes_refresh_interval,
            extra_resources: cli
                .nvidia_resource_names
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            pod_labels,
            kubeconfig: cli.kubeconfig.clone(),
            node_name: std::env::var("NODE_NAME").ok().filter(|s| !s.is_empty()),
            enable_dra: cli.kubernetes_enable_dra,
            proc_root: cli.proc_root.clone(),
        })
    }
}

/// Start the kubelet refresher and, with a node name, the pod watch on `runtime`, and
/// return the sampler's handle on them.
pub fn start_attribution(
    opts: &KubernetesOptions,
    runtime: &tokio::runtime::Handle,
) -> attribution::Attributor {
    use attribution::dra::{self, SliceDirectory};
    use attribution::kubelet::{self, KubeletOptions, KubeletView};
    use attribution::pods::{self, PodDirectory};
    let kubelet_view = Arc::new(ArcSwap::from_pointee(KubeletView::default()));
    let directory = Arc::new(ArcSwap::from_pointee(PodDirectory::default()));
    let slices = Arc::new(ArcSwap::from_pointee(SliceDirectory::default()));
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
            let dra_store = opts.enable_dra.then(|| slices.clone());
            let rt = runtime.clone();
            let kubelet = kubelet_view.clone();
            runtime.spawn(async move {
                match kube_support::client(kubeconfig.as_deref()).await {
                    Ok(client) => {
                        if let Some(dra_store) = dra_store {
                            tracing::info!(node = %node, "watching this node's ResourceSlices of NVIDIA's DRA driver");
                            rt.spawn(dra::watch(client.clone(), node.clone(), dra_store));
                        }
                        tracing::info!(node = %node, labels = ?allow, "watching this node's pods");
                        pods::watch(client, node, allow, store, kubelet).await;
                    }
                    Err(e) => tracing::error!(error = %e, "no Kubernetes API access: no pod labels, no per-pod split of shared GPUs"),
                }
            });
        }
        None => {
            tracing::warn!(
                "NODE_NAME is not set: no pod watch, so no pod labels and no per-pod split of shared GPUs (set it from the downward API: spec.nodeName)"
            );
            if opts.enable_dra {
                tracing::warn!(
                    "--kubernetes-enable-dra needs NODE_NAME: no ResourceSlice watch; DRA devices are resolved by name only"
                );
            }
        }
    }
    attribution::Attributor::new(kubelet_view, directory, pod_watch, opts.proc_root.clone())
        .with_slices(slices)
}

/// Run the exporter until SIGINT or SIGTERM.
pub fn run(cli: Cli) -> Result<()> {
    for (flag, reason) in cli.ignored_flags() {
        tracing::warn!(flag, reason, "dcgm-exporter flag ignored");
    }
    // Taken before any thread starts: reading the activation variables also unsets them.
    let activated = if cli.web_systemd_socket {
        Some(systemd_socket()?)
    } else {
        None
    };
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
    // Flags that can be wrong, before anything starts.
    let plan_source = plan_reload::PlanSource::new(&cli.configmap_data, cli.collectors.as_deref())?;
    let k8s_opts = if cli.kubernetes {
        Some(KubernetesOptions::from_cli(&cli)?)
    } else {
        None
    };
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
    // A SIGHUP reloads the counters, whatever their source; never the default action
    // (ending the process).
    let hangup = Arc::new(tokio::sync::Notify::new());
    runtime
        .block_on(async { plan_reload::forward_sighup(hangup.clone()) })
        .map_err(Error::Serve)?;
    let (plan, plan_client) = match &plan_source {
        plan_reload::PlanSource::ConfigMap { namespace, name } => runtime.block_on(async {
            let client = kube_support::client(cli.kubeconfig.as_deref())
                .await
                .map_err(|e| Error::Config(format!("--configmap-data needs API access: {e}")))?;
            let text = plan_reload::fetch_configmap(&client, namespace, name).await?;
            let (plan, warnings) = counters::plan(&text, &plan_source.describe())?;
            plan_reload::log_warnings(warnings);
            Ok::<_, Error>((plan, Some(client)))
        })?,
        local => (plan_reload::load_local(local)?, None),
    };
    let plan = Arc::new(plan);
    tracing::info!(counters = %plan_source.describe(), "counters loaded");
    let plan_handle = Arc::new(plan_reload::PlanHandle::new(plan.clone()));
    {
        let _guard = runtime.enter();
        plan_reload::watch(
            plan_source,
            plan_handle.clone(),
            hangup,
            plan_client,
            access::RELOAD_INTERVAL,
        );
    }
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
        pod_uid: cli.kubernetes_enable_pod_uid,
        virtual_gpus: cli.kubernetes_virtual_gpus,
        old_namespace: cli.use_old_namespace,
    };
    tracing::info!(source = %source.describe(), metrics = plan.metrics.len(), interval_ms = cli.collect_interval, "starting");
    let store = Arc::new(snapshot::SnapshotStore::new(Snapshot::empty(
        plan.clone(),
        build_labels.clone(),
    )));
    let mut sampler = Sampler::new(source, plan, opts, build_labels)
        .with_plan_updates(plan_handle)
        .with_count_windows(
            std::time::Duration::from_millis(cli.xid_count_window_size),
            std::time::Duration::from_millis(cli.clock_events_count_window_size),
        );
    if let Some(k8s) = &k8s_opts {
        sampler = sampler.with_attribution(start_attribution(k8s, runtime.handle()));
    }
    if let Some(dir) = cli
        .hpc_job_mapping_dir
        .as_ref()
        .filter(|d| !d.as_os_str().is_empty())
    {
        let jobs = Arc::new(ArcSwap::from_pointee(hpc::HpcJobs::default()));
        hpc::watch(dir.clone(), jobs.clone(), runtime.handle());
        sampler = sampler.with_hpc_jobs(jobs);
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

    // Long polls may hold half the connection slots, so probes and scrapers keep theirs.
    let state = Arc::new(
        http::AppState::new(store, cli.interval(), cli.openmetrics)
            .with_max_held(cli.max_connections as usize / 2),
    );
    let address = cli.address.clone();
    // Probes carry no credentials, so the paths open to everyone are the health paths.
    let mut limits = cli.listener_limits(access::UNAUTHENTICATED_PATHS);
    limits.stats = state.listener.clone();
    let served = runtime.block_on(async move {
        let listener = match activated {
            Some(socket) => socket
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(socket)),
            None => tls_serving::bind(&address).await,
        }
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

/// The listening socket systemd passed (`--web-systemd-socket`, as exporter-toolkit
/// reads it: `LISTEN_FDS`, and `LISTEN_PID` when set); `--address` is then not bound.
fn systemd_socket() -> Result<std::net::TcpListener> {
    let error = |message: String| Error::Listen {
        address: "the systemd socket (--web-systemd-socket)".into(),
        source: std::io::Error::other(message),
    };
    let mut fds = listenfd::ListenFd::from_env();
    let passed = fds.len();
    let socket = fds
        .take_tcp_listener(0)
        .map_err(|e| {
            error(format!(
                "the first passed descriptor is not a TCP listener: {e}"
            ))
        })?
        .ok_or_else(|| {
            error("no socket was passed (LISTEN_FDS unset, or meant for another process)".into())
        })?;
    if passed > 1 {
        tracing::warn!(
            passed,
            "systemd passed several sockets: serving on the first only"
        );
    }
    Ok(socket)
}
