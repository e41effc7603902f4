//! Command-line flags. Flags shared with dcgm-exporter keep its names, short forms and
//! environment variables, so existing DaemonSet values carry over.

use clap::{Parser, ValueEnum};
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
    /// (default, big-node). Without a value: builtin:default, eight H100s.
    #[arg(
        long,
        value_name = "SCENARIO",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "builtin:default"
    )]
    pub simulate: Option<PathBuf>,

    /// Path of libnvidia-ml to load instead of the default search for libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH", conflicts_with = "simulate")]
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

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, as RUST_LOG (e.g. info, gpu_exporter=debug).
    #[arg(long, env = "RUST_LOG", hide_env_values = true, default_value = "info")]
    pub log_level: String,
}

impl Cli {
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.collect_interval)
    }

    /// The socket address to bind: `:9400` means every IPv4 interface.
    pub fn bind_address(&self) -> String {
        match self.address.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => self.address.clone(),
        }
    }
}
