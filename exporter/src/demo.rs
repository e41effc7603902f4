//! `--simulate` (the `demo` feature): simulated GPUs from a gpu-sim scenario and, when
//! the scenario has pods, a simulated Kubernetes node serving them (kube-sim's fake
//! kubelet, API server and /proc). Everything the production build leaves out lives
//! here, so the rest of the crate needs no feature switches.

use crate::config::Cli;
use crate::error::{Error, Result};
use crate::sampler::Sampler;
use crate::source::GpuSource;
use crate::{KubernetesOptions, hostname, source, start_attribution};
use std::path::Path;
use std::time::SystemTime;

/// The scenario's GPUs at the current time, frozen where `GPU_SIM_FROZEN_AT_S` says
/// (the same override the fake libnvidia-ml honours, for golden tests).
fn sim_node(scenario: &gpu_sim::Scenario) -> gpu_sim::SimNode {
    let mut node = gpu_sim::SimNode::new(scenario, SystemTime::now());
    if let Some(t) = std::env::var("GPU_SIM_FROZEN_AT_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        node.freeze_at(t);
    }
    node
}

/// The simulated GPU source for `--simulate=<path>`.
pub fn simulated_source(path: &Path) -> Result<Box<dyn GpuSource>> {
    let scenario = gpu_sim::Scenario::load(path)?;
    Ok(Box::new(source::simulated::SimulatedSource::new(
        sim_node(&scenario),
        path.display().to_string(),
    )))
}

/// The demo's simulated Kubernetes node and its files, kept until exit.
pub struct DemoNode {
    _node: kube_sim::node::SimKubeNode,
    _dir: tempfile::TempDir,
}

/// For `--simulate` with a scenario that has pods (and no `-k`): start a simulated
/// Kubernetes node serving them and attribute `sampler`'s GPUs through it, over the
/// same gRPC, watch and cgroup paths a real node uses. Otherwise `sampler` as it is.
pub fn with_kube_node(
    cli: &Cli,
    node_name: Option<String>,
    sampler: Sampler,
    runtime: &tokio::runtime::Handle,
) -> Result<(Sampler, Option<DemoNode>)> {
    let Some(path) = cli.simulate.as_deref().filter(|_| !cli.kubernetes) else {
        return Ok((sampler, None));
    };
    let scenario = gpu_sim::Scenario::load(path)?;
    if scenario.pods.is_empty() {
        return Ok((sampler, None));
    }
    let node = sim_node(&scenario);
    let dir = tempfile::Builder::new()
        .prefix("gpu-exporter-demo-")
        .tempdir()
        .map_err(Error::Serve)?;
    let node_name = hostname(node_name.as_deref());
    let sim = kube_sim::node::SimKubeNode::start(scenario, node, dir.path(), &node_name)
        .map_err(Error::Serve)?;
    tracing::info!(dir = %dir.path().display(), "simulated Kubernetes node for the scenario's pods");
    let mut k8s = KubernetesOptions::from_cli(cli, None)?;
    k8s.socket = sim.kubelet_socket().to_path_buf();
    k8s.kubeconfig = Some(sim.kubeconfig_path().to_path_buf());
    k8s.proc_root = sim.proc_root().to_path_buf();
    k8s.node_name = Some(node_name);
    let sampler = sampler.with_attribution(start_attribution(&k8s, runtime));
    Ok((
        sampler,
        Some(DemoNode {
            _node: sim,
            _dir: dir,
        }),
    ))
}
