//! Command-line flags. Serving flags are named as Kubernetes API servers name them.

use clap::Parser;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-metrics-adapter",
    version,
    about = "Kubernetes custom and external metrics APIs for GPU workloads, fed straight from the gpu-exporters."
)]
pub struct Cli {
    /// Port of the metrics APIs.
    #[arg(long, default_value_t = 6443)]
    pub secure_port: u16,

    /// Port of KEDA's external scaler gRPC service.
    #[arg(long, default_value_t = 9090)]
    pub grpc_port: u16,

    /// Address to bind.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: String,

    /// Serve the APIs over plain HTTP, without authentication: local use and tests only.
    #[arg(long)]
    pub insecure_serve_http: bool,

    /// An exporter to scrape (repeatable); without it, exporters are discovered from
    /// the exporter Service's EndpointSlices.
    #[arg(long = "exporter-url", value_name = "URL")]
    pub exporter_urls: Vec<String>,

    /// How often to scrape every exporter: 2s, 500ms, or milliseconds.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub scrape_interval: Duration,

    /// Bound on one scrape.
    #[arg(long, default_value = "1500ms", value_parser = parse_duration)]
    pub scrape_timeout: Duration,

    /// Data older than this is never served; default: 3 scrape intervals.
    #[arg(long, value_parser = parse_duration)]
    pub max_staleness: Option<Duration>,

    /// kubeconfig for the pod watch; default: the in-cluster service account.
    #[arg(long, env = "KUBECONFIG", hide_env_values = true, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Log filter, as RUST_LOG.
    #[arg(long, env = "RUST_LOG", hide_env_values = true, default_value = "info")]
    pub log_level: String,
}

impl Cli {
    pub fn staleness(&self) -> Duration {
        self.max_staleness.unwrap_or(self.scrape_interval * 3)
    }
}

/// A duration as `2s`, `500ms`, `1m`, or a bare number of milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => t.split_at(i),
        None => (t, "ms"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 2s, 500ms)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use ms, s or m)")),
    };
    if !(0.01..=3600.0).contains(&seconds) {
        return Err(format!("{text:?} is outside 10ms..1h"));
    }
    Ok(Duration::from_secs_f64(seconds))
}
