//! gpu-metrics-adapter: see the library for what it does.

use clap::Parser;
use gpu_metrics_adapter::config::Cli;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if cli.print_recording_rules {
        print!(
            "{}",
            gpu_metrics_adapter::source::prometheus::pushdown::recording_rules()
        );
        return std::process::ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            // Checked by clap (kube_support::log_filter::parse): every directive applies.
            tracing_subscriber::EnvFilter::new(&cli.log_level),
        )
        .init();
    match gpu_metrics_adapter::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-metrics-adapter: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
