//! # gpu-exporter
//!
//! NVIDIA GPU metrics for Prometheus from NVML, with dcgm-exporter's metric names,
//! labels and counters-CSV format. Data flows one way:
//!
//! [`source`] (NVML or simulated) → [`sampler`] (background thread) →
//! [`snapshot`] (immutable, swapped atomically) → [`encode`] (per scrape) → [`serving`].
//!
//! [`plan`] says what to export: its catalog knows every servable field, and the
//! counters CSV picks from it.

pub mod attribution;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
pub mod encode;
pub mod error;
pub mod health;
pub mod hpc;
pub mod plan;
pub mod sampler;
pub mod serving;
pub mod snapshot;
pub mod source;

use crate::config::Cli;
use crate::error::{Error, Result};
use crate::sampler::{Sampler, SamplerOptions};
use crate::snapshot::Snapshot;
use crate::source::GpuSource;
use arc_swap::ArcSwap;
use rustls::ServerConfig;
use std::sync::Arc;

/// This node's name: `NODE_NAME`, set from the downward API (`spec.nodeName`) in
/// Kubernetes; empty is unset. Read once, by [`run`], and handed to what needs it.
pub fn node_name_from_env() -> Option<String> {
    std::env::var("NODE_NAME").ok().filter(|s| !s.is_empty())
}

/// The hostname label's value: the node's name, else the kernel's hostname.
pub fn hostname(node_name: Option<&str>) -> String {
    node_name
        .map(str::to_string)
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
pub fn load_plan(cli: &Cli) -> Result<plan::counters::ExportPlan> {
    plan::reload::load_local(&plan::reload::PlanSource::new(
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
    /// The options the flags give, on the node `node_name`; an allow-list pattern that
    /// is no regular expression is an error.
    pub fn from_cli(cli: &Cli, node_name: Option<String>) -> Result<KubernetesOptions> {
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
        )?;
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
            node_name,
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
    let activated = cli.web_systemd_socket.then(systemd_socket).transpose()?;
    tls_serving::install_crypto_provider();
    // What can be wrong in the flags and files, before the GPUs are touched.
    let web = load_web_config(&cli)?;
    let plan_source =
        plan::reload::PlanSource::new(&cli.configmap_data, cli.collectors.as_deref())?;
    let node_name = node_name_from_env();
    let k8s = cli
        .kubernetes
        .then(|| KubernetesOptions::from_cli(&cli, node_name.clone()))
        .transpose()?;
    let runtime = start_runtime()?;
    let plan = start_plan(&cli, plan_source, &runtime)?;
    let source = build_source(&cli)?;
    let build_labels = build_labels(source.as_ref());
    tracing::info!(source = %source.describe(), metrics = plan.plan().metrics.len(), interval_ms = cli.collect_interval, "starting");
    let store = Arc::new(snapshot::SnapshotStore::new(Snapshot::empty(
        plan.plan(),
        build_labels.clone(),
    )));
    let sampler = Sampler::new(
        source,
        plan.plan(),
        sampler_options(&cli, node_name.as_deref()),
        build_labels,
    )
    .with_plan_updates(plan)
    .with_cadence(sampler::Cadence::new(
        &cli.field_periods.clone().unwrap_or_default(),
        cli.interval(),
    ))
    .with_count_windows(
        std::time::Duration::from_millis(cli.xid_count_window_size),
        std::time::Duration::from_millis(cli.clock_events_count_window_size),
    );
    let sampler = start_attribution_and_jobs(&cli, k8s.as_ref(), sampler, runtime.handle());
    // The demo's simulated Kubernetes node, held until exit.
    #[cfg(feature = "demo")]
    let (sampler, _demo_node) = demo::with_kube_node(&cli, node_name, sampler, runtime.handle())?;
    let (stop, sampler_thread) = start_sampler(sampler, store.clone())?;
    let served = runtime.block_on(serve(&cli, store, web, activated));
    drop(stop);
    let _ = sampler_thread.join();
    tracing::info!("stopped");
    served
}

/// The web config (`--web-config-file`) and the TLS server configuration it gives; a
/// bad one stops startup.
fn load_web_config(
    cli: &Cli,
) -> Result<Option<(serving::web_config::WebConfig, Option<ServerConfig>)>> {
    let Some(path) = cli.web_config_file() else {
        return Ok(None);
    };
    let config = serving::web_config::WebConfig::load(path)?;
    let server = config.server_config()?;
    serving::access::warn_if_insecure(&config);
    Ok(Some((config, server)))
}

/// The runtime of the HTTP server and the Kubernetes refreshers. Two workers: scrapes
/// are cheap (a cached body) and the refreshers mostly idle, but one slow client must
/// not hold up the others; more threads would only cost memory.
fn start_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_io()
        .enable_time()
        .build()
        .map_err(Error::Serve)
}

/// The counters plan from its source (a file, the built-in list or a `-m` ConfigMap),
/// and its reloading on changes and on SIGHUP.
fn start_plan(
    cli: &Cli,
    source: plan::reload::PlanSource,
    runtime: &tokio::runtime::Runtime,
) -> Result<Arc<plan::reload::PlanHandle>> {
    // A SIGHUP reloads the counters, whatever their source; never the default action
    // (ending the process).
    let hangup = Arc::new(tokio::sync::Notify::new());
    runtime
        .block_on(async { plan::reload::forward_sighup(hangup.clone()) })
        .map_err(Error::Serve)?;
    let (plan, client) = match &source {
        plan::reload::PlanSource::ConfigMap { namespace, name } => runtime.block_on(async {
            let client = kube_support::client(cli.kubeconfig.as_deref())
                .await
                .map_err(|e| Error::Config(format!("--configmap-data needs API access: {e}")))?;
            let text = plan::reload::fetch_configmap(&client, namespace, name).await?;
            let (plan, warnings) = plan::counters::plan(&text, &source.describe())?;
            plan::reload::log_warnings(warnings);
            Ok::<_, Error>((plan, Some(client)))
        })?,
        local => (plan::reload::load_local(local)?, None),
    };
    tracing::info!(counters = %source.describe(), "counters loaded");
    let handle = Arc::new(plan::reload::PlanHandle::new(Arc::new(plan)));
    let _guard = runtime.enter();
    plan::reload::watch(
        source,
        handle.clone(),
        hangup,
        client,
        serving::access::RELOAD_INTERVAL,
    );
    Ok(handle)
}

/// `gpu_exporter_build_info`'s labels: the version and the GPU source.
fn build_labels(source: &dyn GpuSource) -> Arc<str> {
    let mut s = String::new();
    snapshot::push_label(&mut s, "version", env!("CARGO_PKG_VERSION"));
    snapshot::push_label(&mut s, "source", &source.describe());
    s.into()
}

/// How the sampler labels series and what it collects besides the plan.
fn sampler_options(cli: &Cli, node_name: Option<&str>) -> SamplerOptions {
    SamplerOptions {
        interval: cli.interval(),
        hostname: (!cli.no_hostname).then(|| (cli.hostname_label.clone(), hostname(node_name))),
        replace_blanks_in_model_name: cli.replace_blanks_in_model_name,
        process_metrics: cli.process_metrics,
        pod_uid: cli.kubernetes_enable_pod_uid,
        virtual_gpus: cli.kubernetes_virtual_gpus,
        old_namespace: cli.use_old_namespace,
    }
}

/// `sampler` with pod attribution (`-k`) and HPC job mapping
/// (`--hpc-job-mapping-dir`), each where the flags ask for it, refreshed on `runtime`.
fn start_attribution_and_jobs(
    cli: &Cli,
    k8s: Option<&KubernetesOptions>,
    mut sampler: Sampler,
    runtime: &tokio::runtime::Handle,
) -> Sampler {
    if let Some(k8s) = k8s {
        sampler = sampler.with_attribution(start_attribution(k8s, runtime));
    }
    if let Some(dir) = cli
        .hpc_job_mapping_dir
        .as_ref()
        .filter(|d| !d.as_os_str().is_empty())
    {
        let jobs = Arc::new(ArcSwap::from_pointee(hpc::HpcJobs::default()));
        hpc::watch(dir.clone(), jobs.clone(), runtime);
        sampler = sampler.with_hpc_jobs(jobs);
    }
    sampler
}

/// The sampling thread, publishing into `store` until the returned sender is dropped.
fn start_sampler(
    sampler: Sampler,
    store: Arc<snapshot::SnapshotStore>,
) -> Result<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || sampler::run(sampler, store, stop_rx))
        .map_err(Error::Serve)?;
    Ok((stop_tx, thread))
}

/// Serve `/metrics` and the probes from `store` on `--address` (or the systemd
/// socket), behind the web config's TLS and authentication, until a shutdown signal.
async fn serve(
    cli: &Cli,
    store: Arc<snapshot::SnapshotStore>,
    web: Option<(serving::web_config::WebConfig, Option<ServerConfig>)>,
    activated: Option<std::net::TcpListener>,
) -> Result<()> {
    // Long polls may hold half the connection slots, so probes and scrapers keep theirs.
    let state = Arc::new(
        serving::http::AppState::new(store, cli.interval(), cli.openmetrics)
            .with_max_held(cli.listener.max_connections as usize / 2),
    );
    let address = cli.address.clone();
    // Probes carry no credentials, so the paths open to everyone are the health paths.
    let mut limits = cli.listener_limits(serving::access::UNAUTHENTICATED_PATHS);
    limits.stats = state.listener.clone();
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
    let mut router = serving::http::router(state);
    let mut tls = None;
    if let Some((config, server)) = web {
        let handle: Option<tls_serving::TlsConfigHandle> =
            server.map(|s| Arc::new(ArcSwap::from_pointee(s)));
        let guard = Arc::new(serving::access::Guard::new(&config));
        serving::access::watch(&config, handle.clone(), guard.clone());
        router = serving::access::protect(router, guard);
        tracing::info!(
            file = %config.path.display(),
            tls = handle.is_some(),
            basic_auth_users = config.users.len(),
            exempt = ?serving::access::UNAUTHENTICATED_PATHS,
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
