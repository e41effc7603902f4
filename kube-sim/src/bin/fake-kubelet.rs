//! A fake kubelet for a real control plane (tests and the `tests/kube` demo cluster):
//! it watches the pods the real scheduler bound to its node, gives each container the
//! GPUs its `nvidia.com/gpu` limit asks for (the device plugin's job), and serves the
//! result on the PodResources v1 socket the exporter reads. The GPUs are those of a
//! gpu-sim scenario, the same one the exporter's fake libnvidia-ml reads, so UUIDs
//! agree. kwok plays the rest of the node (status, pod phases).
//!
//!   fake-kubelet --kubeconfig K --node-name N --socket S [--scenario builtin:default]

use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube_sim::FakeKubelet;
use kube_sim::allocation::Allocator;
use kube_support::watch::Change;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "A fake kubelet PodResources server following a real API server"
)]
struct Args {
    /// kubeconfig to watch pods with.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// The node whose pods this kubelet serves.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The PodResources socket to serve.
    #[arg(long)]
    socket: PathBuf,
    /// The gpu-sim scenario whose GPUs this node has (a file or builtin:NAME).
    #[arg(long, default_value = "builtin:default")]
    scenario: String,
    /// The extended resource the GPUs are requested as.
    #[arg(long, default_value = "nvidia.com/gpu")]
    resource: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-kubelet: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let scenario = gpu_sim::Scenario::load(Path::new(&args.scenario))?;
    let node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
    let uuids = node.gpus.iter().map(|g| g.uuid.clone()).collect();
    let mut allocator = Allocator::new(args.resource, uuids);
    let kubelet = FakeKubelet::start(&args.socket)?;
    kubelet.set_allocatable(allocator.allocatable());
    let client = kube_support::client(Some(&args.kubeconfig)).await?;
    let pods = kube::Api::<Pod>::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", args.node_name));
    eprintln!(
        "fake-kubelet: node {} serving {}",
        args.node_name,
        args.socket.display()
    );
    let follow = kube_support::watch::watch(pods, config, "pod watch", |change| {
        let unfit = match change {
            Change::Listed(pods) => allocator.replace_all(&pods),
            Change::Applied(pod) => allocator.apply(&pod).err().into_iter().collect(),
            Change::Deleted(pod) => {
                allocator.remove(&pod);
                Vec::new()
            }
            Change::Failed => return,
        };
        for e in unfit {
            eprintln!("fake-kubelet: {e}");
        }
        kubelet.set_pods(allocator.pod_resources());
    });
    tokio::select! {
        () = follow => {}
        () = kube_support::shutdown::signal() => {}
    }
    kubelet.stop()?;
    Ok(())
}
