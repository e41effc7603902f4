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

pub mod attribution;
pub mod catalog;
pub mod config;
pub mod counters;
pub mod encode;
pub mod error;
pub mod http;
pub mod sampler;
pub mod snapshot;
pub mod source;

use crate::config::Cli;
use crate::error::{Error, Result};
use crate::sampler::{Sampler, SamplerOptions};
use crate::snapshot::Snapshot;
use crate::source::GpuSource;
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::time::SystemTime;

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
    match &cli.simulate {
        Some(path) => {
            let scenario = gpu_sim::Scenario::load(path)?;
            let mut node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
            // The same override the fake libnvidia-ml honours, for golden tests.
            if let Some(t) = std::env::var("GPU_SIM_FROZEN_AT_S")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
            {
                node.freeze_at(t);
            }
            Ok(Box::new(source::simulated::SimulatedSource::new(
                node,
                path.display().to_string(),
            )))
        }
        None => Ok(Box::new(source::nvml::NvmlSource::new(
            cli.nvml_lib.clone(),
        ))),
    }
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

/// Run the exporter until SIGINT or SIGTERM.
pub fn run(cli: Cli) -> Result<()> {
    let plan = Arc::new(load_plan(&cli)?);
    let source = build_source(&cli)?;
    let build_labels: Arc<str> = {
        let mut s = String::new();
        sampler::escape_label_value(env!("CARGO_PKG_VERSION"), &mut s);
        let mut src = String::new();
        sampler::escape_label_value(&source.describe(), &mut src);
        format!("version=\"{s}\",source=\"{src}\"").into()
    };
    let opts = SamplerOptions {
        interval: cli.interval(),
        hostname: (!cli.no_hostname).then(|| (cli.hostname_label.clone(), node_name())),
        replace_blanks_in_model_name: cli.replace_blanks_in_model_name,
        process_metrics: cli.process_metrics,
    };
    tracing::info!(source = %source.describe(), metrics = plan.metrics.len(), interval_ms = cli.collect_interval, "starting");
    let store = Arc::new(ArcSwap::from_pointee(Snapshot::empty(
        plan.clone(),
        build_labels.clone(),
    )));
    let sampler = Sampler::new(source, plan, opts, build_labels);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let sampler_store = store.clone();
    let sampler_thread = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || sampler::run(sampler, sampler_store, stop_rx))
        .map_err(Error::Serve)?;

    // Two workers: scrapes are cheap (a cached body), but one slow client must not hold
    // up the others, and more threads would only cost memory.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_io()
        .enable_time()
        .build()
        .map_err(Error::Serve)?;
    let state = Arc::new(http::AppState::new(store, cli.interval(), cli.openmetrics));
    let address = cli.bind_address();
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .map_err(|source| Error::Listen {
                address: address.clone(),
                source,
            })?;
        let local = listener.local_addr().map_err(Error::Serve)?;
        tracing::info!(address = %local, "listening");
        axum::serve(listener, http::router(state))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(Error::Serve)
    });
    drop(stop_tx);
    let _ = sampler_thread.join();
    tracing::info!("stopped");
    served
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
