//! Command-line flags. Flags shared with dcgm-exporter keep its names, short forms and
//! environment variables, so existing DaemonSet values carry over.

use crate::source::selection::DeviceSelection;
use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, ValueEnum};
use kube_support::duration;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The help section of dcgm-exporter's flags that have no effect here.
const COMPAT: &str = "Accepted for dcgm-exporter compatibility, without effect (logged when given)";

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-exporter",
    version,
    disable_version_flag = true,
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

    /// Read periods that override the defaults (docs/exporter/cadence.md): FIELD=DURATION
    /// items, comma-separated; FIELD a DCGM field name, device-set (the GPU and MIG-layout
    /// check) or * (every field); DURATION as 10s, 1m or 0 (every cycle). A field is read
    /// every whole number of intervals within its period and serves its last value between.
    #[arg(
        long,
        env = "DCGM_EXPORTER_FIELD_PERIODS",
        hide_env_values = true,
        value_name = "FIELD=DURATION,...",
        value_parser = crate::sampler::FieldPeriods::parse
    )]
    pub field_periods: Option<crate::sampler::FieldPeriods>,

    /// Serve simulated GPUs instead of NVML: a scenario file (TOML or JSON) or builtin:NAME
    /// (demo, default, big-node, gb200-nvl72). Without a value: builtin:demo, eight H100s
    /// running pods.
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

    /// sysfs mount point, as node_exporter's --path.sysfs: GPUs bound to the nvidia
    /// driver after the start are found under DIR/bus/pci/drivers/nvidia and NVML is
    /// initialised again for them (no such directory: not checked).
    #[arg(
        long,
        env = "DCGM_EXPORTER_PATH_SYSFS",
        hide_env_values = true,
        value_name = "DIR",
        default_value = "/sys"
    )]
    pub path_sysfs: PathBuf,

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
    #[arg(short = 'n', long, env = "DCGM_EXPORTER_NO_HOSTNAME", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub no_hostname: bool,

    /// Replace spaces in the modelName label with dashes.
    #[arg(long, visible_alias = "rbmn", env = "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
          hide_env_values = true, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub replace_blanks_in_model_name: bool,

    /// Use old 1.x namespace: dcgm-exporter 1.x label names on its series (`uuid`,
    /// `pod_name`, `pod_namespace`, `container_name`).
    #[arg(short = 'o', long, env = "DCGM_EXPORTER_USE_OLD_NAMESPACE", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub use_old_namespace: bool,

    /// Label GPU series with the pod, namespace and container they are allocated to, from
    /// the kubelet's PodResources API.
    #[arg(short = 'k', long, env = "DCGM_EXPORTER_KUBERNETES", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub kubernetes: bool,

    /// The kubelet's PodResources socket.
    #[arg(
        long,
        env = "DCGM_POD_RESOURCES_KUBELET_SOCKET",
        hide_env_values = true,
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
    #[arg(
        long,
        env = "NVIDIA_RESOURCE_NAMES",
        hide_env_values = true,
        value_name = "NAMES",
        value_delimiter = ','
    )]
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

    /// The listener's bounds (shared with the adapter).
    #[command(flatten)]
    pub listener: kube_support::listener_flags::ListenerFlags<512>,

    /// Log format.
    #[arg(long, env = "DCGM_EXPORTER_LOG_FORMAT", hide_env_values = true, value_enum,
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter: a level (off, error, warn, info, debug, trace) or RUST_LOG
    /// directives (e.g. info,gpu_exporter=debug); a malformed one stops startup.
    #[arg(long, env = "RUST_LOG", hide_env_values = true, default_value = "info",
          value_parser = kube_support::log_filter::parse)]
    pub log_level: String,

    // ---- dcgm-exporter flags implemented here (issue 17) ----
    /// Devices to sample and serve, in dcgm-exporter's syntax: f (every GPU and MIG
    /// instance), g[:IDS] (GPUs by NVML index), i[:IDS] (MIG instances by node-wide
    /// position); IDS like 0,2-4.
    #[arg(short = 'd', long, env = "DCGM_EXPORTER_DEVICES_STR", hide_env_values = true,
          value_name = "DEVICES", default_value = "f", value_parser = DeviceSelection::parse)]
    pub devices: DeviceSelection,

    /// Enable debug output: --log-level debug, unless --log-level or RUST_LOG is given.
    #[arg(long, env = "DCGM_EXPORTER_DEBUG", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub debug: bool,

    /// Type of kubelet GPU ID mapped to pods: uid (GPU-<uuid>) or device-name
    /// (nvidia<N>). Both forms, and the others the device plugins use, are always
    /// resolved; the value is checked for dcgm-exporter compatibility.
    #[arg(long, env = "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", hide_env_values = true,
          value_name = "TYPE", default_value = "uid", value_parser = ["uid", "device-name"])]
    pub kubernetes_gpu_id_type: String,

    /// Print version.
    #[arg(short = 'v', long, short_alias = 'V', action = ArgAction::Version)]
    pub version: (),

    // ---- dcgm-exporter flags accepted for compatibility but without effect here: each,
    // when given, is logged once at startup with the reason (Cli::ignored_flags).
    /// CPU devices to monitor (dcgm-exporter's device syntax).
    #[arg(short = 'p', long, env = "DCGM_EXPORTER_CPU_DEVICES_STR", hide_env_values = true,
          help_heading = COMPAT, value_name = "DEVICES", default_value = "f",
          value_parser = DeviceSelection::parse)]
    pub cpu_devices: DeviceSelection,

    /// NVSwitch devices to monitor (dcgm-exporter's device syntax).
    #[arg(short = 's', long, env = "DCGM_EXPORTER_OTHER_DEVICES_STR", hide_env_values = true,
          help_heading = COMPAT, value_name = "DEVICES", default_value = "f",
          value_parser = DeviceSelection::parse)]
    pub switch_devices: DeviceSelection,

    /// Connect to remote hostengine at <HOST>:<PORT>.
    #[arg(short = 'r', long, env = "DCGM_REMOTE_HOSTENGINE_INFO", hide_env_values = true,
          help_heading = COMPAT, value_name = "HOST:PORT", default_value = "localhost:5555")]
    pub remote_hostengine_info: String,

    /// Accept GPUs that are fake, for testing purposes only.
    #[arg(long, env = "DCGM_EXPORTER_USE_FAKE_GPUS", hide_env_values = true,
          help_heading = COMPAT, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub fake_gpus: bool,

    /// Enable writing DCGM logs to standard output.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_DCGM_LOG", hide_env_values = true,
          help_heading = COMPAT, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_dcgm_log: bool,

    /// DCGM log verbosity.
    #[arg(long, env = "DCGM_EXPORTER_DCGM_LOG_LEVEL", hide_env_values = true,
          help_heading = COMPAT, value_name = "LEVEL", default_value = "NONE",
          value_parser = ["NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "VERB"])]
    pub dcgm_log_level: String,

    /// Enable file-based debugging dumps.
    #[arg(long, env = "DCGM_EXPORTER_DUMP_ENABLED", hide_env_values = true,
          help_heading = COMPAT, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub dump_enabled: bool,

    /// Directory to store debug dump files.
    #[arg(long, env = "DCGM_EXPORTER_DUMP_DIRECTORY", hide_env_values = true,
          help_heading = COMPAT, value_name = "PATH", default_value = "/tmp/dcgm-exporter-debug")]
    pub dump_directory: PathBuf,

    /// Retention period for debug dump files in hours (0 = no cleanup).
    #[arg(long, env = "DCGM_EXPORTER_DUMP_RETENTION", hide_env_values = true,
          help_heading = COMPAT, value_name = "HOURS", default_value_t = 24)]
    pub dump_retention: i64,

    /// Use gzip compression for debug dump files.
    #[arg(long, env = "DCGM_EXPORTER_DUMP_COMPRESSION", hide_env_values = true,
          help_heading = COMPAT, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = go_bool,
          action = ArgAction::Set)]
    pub dump_compression: bool,

    /// Disable validation checks during startup.
    #[arg(long, env = "DISABLE_STARTUP_VALIDATE", hide_env_values = true,
          help_heading = COMPAT, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub disable_startup_validate: bool,

    /// Watch for GPU bind/unbind events.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH", hide_env_values = true,
          help_heading = COMPAT, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_gpu_bind_unbind_watch: bool,

    /// Interval for polling GPU bind/unbind events.
    #[arg(long, env = "DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL", hide_env_values = true,
          help_heading = COMPAT, value_name = "DURATION", default_value = "1s")]
    pub gpu_bind_unbind_poll_interval: String,

    /// Enable /debug/pprof/ HTTP endpoints.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_PPROF", hide_env_values = true,
          help_heading = COMPAT, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_pprof: bool,

    /// Use systemd socket activation listeners instead of port listeners: serve on the
    /// socket systemd passes (LISTEN_FDS), not on --address.
    #[arg(long, env = "DCGM_EXPORTER_SYSTEMD_SOCKET", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub web_systemd_socket: bool,

    /// The flags given (on the command line or in the environment), by argument id.
    #[arg(skip)]
    pub given: std::collections::BTreeSet<String>,

    // ---- dcgm-exporter flags, accepted here; their behaviour is built by other parts of
    // issue 17. Names, short forms, environment variables and defaults are dcgm-exporter's
    // (pkg/cmd/app.go); booleans take Go's spellings (true, 1, t, false, 0, f, ...).
    /// Enable kubernetes pod labels in metrics. This parameter is effective only when the
    /// '--kubernetes' option is set to 'true'. Adds to the --kubernetes-pod-labels keys.
    #[arg(long, env = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub kubernetes_enable_pod_labels: bool,

    /// Regex patterns for filtering pod labels to include in metrics (comma-separated,
    /// unanchored; a bad one stops startup). Empty means include all labels. This
    /// parameter is effective only when '--kubernetes-enable-pod-labels' is true.
    #[arg(
        long,
        env = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
        hide_env_values = true,
        value_name = "REGEXES",
        value_delimiter = ','
    )]
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

    /// Also watch this node's ResourceSlices of NVIDIA's DRA driver (resource.k8s.io/v1)
    /// and resolve DRA devices by the UUIDs they publish. DRA claims get pod and dra_*
    /// labels without it, from the driver's device names. Needs NODE_NAME.
    #[arg(long, env = "KUBERNETES_ENABLE_DRA", hide_env_values = true,
          value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub kubernetes_enable_dra: bool,

    /// Path to HPC job mapping file directory used for mapping GPUs to jobs (empty: none).
    #[arg(long, env = "DCGM_HPC_JOB_MAPPING_DIR", hide_env_values = true, value_name = "PATH",
          value_parser = path_or_empty)]
    pub hpc_job_mapping_dir: Option<PathBuf>,

    /// ConfigMap <NAMESPACE>:<NAME> for metric data (none: read no ConfigMap).
    #[arg(
        short = 'm',
        long,
        env = "DCGM_EXPORTER_CONFIGMAP_DATA",
        hide_env_values = true,
        value_name = "NAMESPACE:NAME",
        default_value = "none"
    )]
    pub configmap_data: String,

    /// Set time window size in milliseconds (ms) for counting active XID errors.
    #[arg(
        short = 'x',
        long,
        env = "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE",
        hide_env_values = true,
        value_name = "MS",
        default_value_t = 300_000
    )]
    pub xid_count_window_size: u64,

    /// Set time window size in milliseconds (ms) for counting clock events.
    #[arg(
        long,
        env = "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE",
        hide_env_values = true,
        value_name = "MS",
        default_value_t = 300_000
    )]
    pub clock_events_count_window_size: u64,
    // ---- end of the dcgm-exporter flags built by other parts of issue 17 ----
}

impl Cli {
    /// Bounds on the listener's connections, from the listener flags; the health
    /// reserve answers `health_paths` only.
    pub fn listener_limits(&self, health_paths: &[&str]) -> tls_serving::Limits {
        self.listener.limits(health_paths)
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

    /// Parse the command line and environment as dcgm-exporter's parser would read them
    /// (see [`go_style_args`]), remembering which flags were given; exits on bad input.
    pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Cli {
        let matches = Cli::command().get_matches_from(go_style_args(args));
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.given = matches
            .ids()
            .filter(|id| {
                matches!(
                    matches.value_source(id.as_str()),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            })
            .map(|id| id.to_string())
            .collect();
        cli
    }

    /// The log filter: --log-level, or debug with --debug when no level is given.
    pub fn log_filter(&self) -> &str {
        if self.debug && !self.given.contains("log_level") {
            "debug"
        } else {
            &self.log_level
        }
    }

    /// dcgm-exporter flags that were given but have no effect here, with the reason.
    pub fn ignored_flags(&self) -> Vec<(&'static str, &'static str)> {
        const NO_DUMPS: &str = "there are no DCGM objects to dump; --debug logs what is read";
        const NO_BIND_EVENTS: &str = "there are no DCGM bind/unbind events; the sampler's own NVML discovery follows the devices";
        [
            ("cpu_devices", "--cpu-devices", "NVML has no CPU entities (Grace CPU metrics come from DCGM only)"),
            ("switch_devices", "--switch-devices", "NVSwitch entities are not read: NVML reports fabric state per GPU"),
            ("remote_hostengine_info", "--remote-hostengine-info", "there is no DCGM hostengine: GPUs are read in this process through NVML"),
            ("fake_gpus", "--fake-gpus", "DCGM's injected fake GPUs do not exist in NVML"),
            ("enable_dcgm_log", "--enable-dcgm-log", "no DCGM library is loaded; NVML errors are in this log"),
            ("dcgm_log_level", "--dcgm-log-level", "no DCGM library is loaded; see --log-level"),
            ("dump_enabled", "--dump-enabled", NO_DUMPS),
            ("dump_directory", "--dump-directory", NO_DUMPS),
            ("dump_retention", "--dump-retention", NO_DUMPS),
            ("dump_compression", "--dump-compression", NO_DUMPS),
            ("disable_startup_validate", "--disable-startup-validate", "there are no DCGM prerequisites to validate; a missing driver is reported by /health, not at startup"),
            ("enable_gpu_bind_unbind_watch", "--enable-gpu-bind-unbind-watch", NO_BIND_EVENTS),
            ("gpu_bind_unbind_poll_interval", "--gpu-bind-unbind-poll-interval", NO_BIND_EVENTS),
            ("enable_pprof", "--enable-pprof", "Go's pprof does not exist in this binary; see --debug and the gpu_exporter_* self-metrics"),
        ]
        .into_iter()
        .filter(|(id, _, _)| self.given.contains(*id))
        .map(|(_, flag, reason)| (flag, reason))
        .collect()
    }
}

/// The arguments as clap should see them: Go's flag package, under dcgm-exporter's
/// parser, reads `-collectors` like `--collectors` (and `-rbmn`), so a single-dash
/// long name (or long alias) of ours gets its second dash. Short flags (`-f PATH`,
/// `-c1000`) and anything after `--` are left alone.
pub fn go_style_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let command = Cli::command();
    let longs: std::collections::HashSet<&str> = command
        .get_arguments()
        .flat_map(|a| {
            a.get_long()
                .into_iter()
                .chain(a.get_all_aliases().unwrap_or_default())
        })
        .collect();
    let mut options_done = false;
    args.into_iter()
        .map(|arg| {
            let Some(text) = arg.to_str() else { return arg };
            if text == "--" {
                options_done = true;
            }
            let single_dash_long = !options_done
                && text.len() > 2
                && text.starts_with('-')
                && !text.starts_with("--")
                && longs.contains(text[1..].split('=').next().unwrap_or_default());
            if single_dash_long {
                OsString::from(format!("-{text}"))
            } else {
                arg
            }
        })
        .collect()
}

/// A path, where an empty value is allowed (clap's path parser refuses one).
fn path_or_empty(text: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(text))
}

/// A boolean as Go's strconv.ParseBool reads it (dcgm-exporter's flags and environment
/// variables): 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False.
pub fn go_bool(text: &str) -> Result<bool, NotABoolean> {
    match text {
        // An empty environment variable leaves a flag unset, as in dcgm-exporter.
        "" => Ok(false),
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(NotABoolean(other.into())),
    }
}

/// A flag value that Go's strconv.ParseBool refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a boolean (true, false, 1, 0, t, f, TRUE, FALSE, True, False)")]
pub struct NotABoolean(String);

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn single_dash_long_flags_read_as_go_reads_them() {
        let given = args(&[
            "gpu-exporter",
            "-collectors",
            "x.csv",
            "-rbmn",
            "-debug=true",
            "-f",
            "y.csv",
            "-c1000",
            "-unknown",
            "--",
            "-debug",
        ]);
        let expected = args(&[
            "gpu-exporter",
            "--collectors",
            "x.csv",
            "--rbmn",
            "--debug=true",
            "-f",
            "y.csv",
            "-c1000",
            "-unknown",
            "--",
            "-debug",
        ]);
        assert_eq!(go_style_args(given), expected);

        let matches = Cli::command()
            .try_get_matches_from(go_style_args(args(&[
                "gpu-exporter",
                "-collect-interval",
                "250",
                "-rbmn",
                "-kubernetes=false",
                "-d",
                "g:1",
            ])))
            .expect("dcgm-exporter's spelling parses");
        let cli = Cli::from_arg_matches(&matches).expect("cli");
        assert_eq!(cli.collect_interval, 250);
        assert!(cli.replace_blanks_in_model_name);
        assert!(!cli.kubernetes);
        assert_eq!(cli.devices.to_string(), "g:1");
    }

    #[test]
    fn go_booleans() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(go_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False", ""] {
            assert_eq!(go_bool(f), Ok(false), "{f:?}");
        }
        for bad in ["yes", "on", "tRUE", "2"] {
            assert!(go_bool(bad).is_err(), "{bad}");
        }
    }
}
