//! The gpu-exporter binary: flags, logging, then [`gpu_exporter::run`].

use gpu_exporter::config::{Cli, LogFormat};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse_args(std::env::args_os());
    // Checked by clap (kube_support::log_filter::parse): every directive applies.
    let filter = tracing_subscriber::EnvFilter::new(cli.log_filter());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(false).init(),
    }
    if cli.debug {
        tracing::debug!("debug output is enabled");
    }
    match gpu_exporter::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("gpu-exporter: {e}");
            ExitCode::FAILURE
        }
    }
}
