//! Command-line flags. Flags shared with dcgm-exporter keep its names, short forms and
//! environment variables, so existing DaemonSet values carry over.

use clap::{ArgAction, Parser, ValueEnum};
use kube_support::duration;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-exporter",
    version,
    about = "NVIDIA GPU metrics for Prometheus, straight from NVML: a drop-in successor of dcgm-exporter.",
    long_about = None
)]
pub struct Cli {
    /// Counters CSV in dcgm-exporter's format (field, type, help); default: dcgm-exporter's default list.
    #[arg(
        short = 'f',
        long,
        env = "DCGM_EXPORTER_COLLECTORS",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub collectors: Option<PathBuf>,

    /// Address to serve metrics on, HOST:PORT or :PORT.
    #[arg(
        short = 'a',
        long,
        env = "DCGM_EXPORTER_LISTEN",
        hide_env_values = true,
        default_value = ":9400"
    )]
    pub address: String,

    /// Sampling interval in milliseconds.
    #[arg(
        short = 'c',
        long,
        env = "DCGM_EXPORTER_INTERVAL",
        hide_env_values = true,
        default_value_t = 1000,
        value_name = "MS",
        value_parser = clap::value_parser!(u64).range(10..=3_600_000)
    )]
    pub collect_interval: u64,

    /// Serve simulated GPUs instead of NVML: a scenario file (TOML or JSON) or builtin:NAME
    /// (demo, default, big-node). Without a value: builtin:demo, eight H100s running pods.
    #[cfg(feature = "demo")]
    #[arg(
        long,
        value_name = "SCENARIO",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "builtin:demo"
    )]
    pub simulate: Option<PathBuf>,

    /// Path of libnvidia-ml to load instead of the default search for libnvidia-ml.so.1.
    #[cfg_attr(
        feature = "demo",
        arg(long, value_name = "PATH", conflicts_with = "simulate")
    )]
    #[cfg_attr(not(feature = "demo"), arg(long, value_name = "PATH"))]
    pub nvml_lib: Option<PathBuf>,

    /// Answer in OpenMetrics 1.0 when the scraper asks for it (counters then end in _total).
    #[arg(long)]
    pub openmetrics: bool,

    /// Also export per-process GPU memory and SM utilisation series (pid, process_name).
    #[arg(long)]
    pub process_metrics: bool,

    /// Name of the hostname label: Hostname (dcgm-exporter up to 4.8.2) or hostname (later).
    #[arg(long, default_value = "Hostname", value_parser = ["Hostname", "hostname"])]
    pub hostname_label: String,

    /// Do not add the hostname label.
    #[arg(short = 'n', long)]
    pub no_hostname: bool,

    /// Replace spaces in the modelName label with dashes.
    #[arg(long)]
    pub replace_blanks_in_model_name: bool,

    /// Label GPU series with the pod, namespace and container they are allocated to, from
    /// the kubelet's PodResources API.
    #[arg(
        short = 'k',
        long,
        env = "DCGM_EXPORTER_KUBERNETES",
        hide_env_values = true
    )]
    pub kubernetes: bool,

    /// The kubelet's PodResources socket.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pub pod_resources_kubelet_socket: PathBuf,

    /// How often to refresh allocations from the kubelet (background; never per scrape):
    /// 2s, 500ms, or milliseconds.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration::parse_flag)]
    pub kubernetes_refresh_interval: Duration,

    /// Extra kubelet resource names that are NVIDIA GPUs, comma-separated (nvidia.com/gpu,
    /// nvidia.com/gpu.shared and nvidia.com/mig-* are always recognised).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub nvidia_resource_names: Vec<String>,

    /// Pod labels copied onto GPU series, comma-separated; names are sanitised to
    /// [a-zA-Z0-9_]. Needs NODE_NAME and API access; empty to copy none.
    #[arg(
        long,
        value_name = "KEYS",
        value_delimiter = ',',
        default_value = "app,app.kubernetes.io/name,app.kubernetes.io/instance"
    )]
    pub kubernetes_pod_labels: Vec<String>,

    /// kubeconfig for the pod watch; default: the in-cluster service account.
    #[arg(long, env = "KUBECONFIG", hide_env_values = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Where to read /proc/<pid>/cgroup of GPU processes, to split shared GPUs per pod
    /// (the host's /proc: run with hostPID).
    #[arg(long, value_name = "PATH", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// Web config file in Prometheus exporter-toolkit's format (web-config.yml): TLS,
    /// client certificates, basic auth. Reloaded when it or a file it names changes.
    // An empty value means none, as in dcgm-exporter (charts set the variable empty).
    #[arg(
        long,
        env = "DCGM_EXPORTER_WEB_CONFIG_FILE",
        hide_env_values = true,
        value_name = "PATH",
        value_parser = path_or_empty
    )]
    pub web_config_file: Option<PathBuf>,

    // Listener limits (issue 20): every connection is bounded in time and number.
    /// Close a connection with no request in progress for this long: before its first
    /// request, between requests, and while an HTTP/1.1 request's headers trickle in
    /// (slowloris).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse_flag)]
    pub http_idle_timeout: Duration,

    /// A TLS client must finish its handshake within this.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse_flag)]
    pub tls_handshake_timeout: Duration,

    /// Connections served at once; more are closed at once, except a few that may only
    /// ask /healthz and /readyz so probes still pass under a flood.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Streams an HTTP/2 client may have open at once on one connection.
    #[arg(long, value_name = "N", default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub http2_max_streams_per_connection: u32,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter: a level (off, error, warn, info, debug, trace) or RUST_LOG
    /// directives (e.g. info,gpu_exporter=debug); a malformed one stops startup.
    #[arg(long, env = "RUST_LOG", hide_env_values = true, default_value = "info",
          value_parser = kube_support::log_filter::parse)]
    pub log_level: String,

    // ---- dcgm-exporter flags, accepted here; their behaviour is built by other parts of
    // issue 17. Names, short forms, environment variables and defaults are dcgm-exporter's
    // (pkg/cmd/app.go); booleans take Go's spellings (true, 1, t, false, 0, f, ...).
    /// Enable kubernetes pod labels in metrics. This parameter is effective only when the
    /// '--kubernetes' option is set to 'true'.
    #[arg(long, env = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub kubernetes_enable_pod_labels: bool,

    /// Regex patterns for filtering pod labels to include in metrics (comma-separated).
    /// Empty means include all labels. This parameter is effective only when
    /// '--kubernetes-enable-pod-labels' is true.
    #[arg(long, env = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX", hide_env_values = true,
          value_name = "REGEXES", value_delimiter = ',')]
    pub kubernetes_pod_label_allowlist_regex: Vec<String>,

    /// Enable kubernetes pod UID in metrics. This parameter is effective only when the
    /// '--kubernetes' option is set to 'true'.
    #[arg(long, env = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub kubernetes_enable_pod_uid: bool,

    /// Capture metrics associated with virtual GPUs exposed by Kubernetes device plugins
    /// when using GPU sharing strategies, e.g. time-sharing or MPS.
    #[arg(long, env = "KUBERNETES_VIRTUAL_GPUS", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub kubernetes_virtual_gpus: bool,

    /// Capture metrics associated with GPUs managed by Kubernetes Dynamic Resource
    /// Allocation (DRA) API.
    #[arg(long, env = "KUBERNETES_ENABLE_DRA", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub kubernetes_enable_dra: bool,

    /// Path to HPC job mapping file directory used for mapping GPUs to jobs (empty: none).
    #[arg(long, env = "DCGM_HPC_JOB_MAPPING_DIR", hide_env_values = true, value_name = "PATH",
          value_parser = path_or_empty)]
    pub hpc_job_mapping_dir: Option<PathBuf>,

    /// ConfigMap <NAMESPACE>:<NAME> for metric data (none: read no ConfigMap).
    #[arg(short = 'm', long, env = "DCGM_EXPORTER_CONFIGMAP_DATA", hide_env_values = true,
          value_name = "NAMESPACE:NAME", default_value = "none")]
    pub configmap_data: String,

    /// Set time window size in milliseconds (ms) for counting active XID errors.
    #[arg(short = 'x', long, env = "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", hide_env_values = true,
          value_name = "MS", default_value_t = 300_000)]
    pub xid_count_window_size: u64,

    /// Set time window size in milliseconds (ms) for counting clock events.
    #[arg(long, env = "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE", hide_env_values = true,
          value_name = "MS", default_value_t = 300_000)]
    pub clock_events_count_window_size: u64,
    // ---- end of the dcgm-exporter flags built by other parts of issue 17 ----
}

impl Cli {
    /// Bounds on the listener's connections, from the listener flags; the health
    /// reserve answers `health_paths` only.
    pub fn listener_limits(&self, health_paths: &[&str]) -> tls_serving::Limits {
        tls_serving::Limits {
            idle_timeout: self.http_idle_timeout,
            handshake_timeout: self.tls_handshake_timeout,
            max_connections: self.max_connections as usize,
            http2_max_concurrent_streams: self.http2_max_streams_per_connection,
            health_paths: health_paths.iter().map(|p| p.to_string()).collect(),
            ..tls_serving::Limits::default()
        }
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.collect_interval)
    }

    /// The web config file, if one is named (an empty value names none).
    pub fn web_config_file(&self) -> Option<&std::path::Path> {
        self.web_config_file
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// The socket address to bind: `:9400` means every IPv4 interface.
    pub fn bind_address(&self) -> String {
        match self.address.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => self.address.clone(),
        }
    }
}

/// A path, where an empty value is allowed (clap's path parser refuses one).
fn path_or_empty(text: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(text))
}

/// A boolean as Go's strconv.ParseBool reads it (dcgm-exporter's flags and environment
/// variables): 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False.
pub fn go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!(
            "{other:?} is not a boolean (true, false, 1, 0, t, f, TRUE, FALSE, True, False)"
        )),
    }
}
