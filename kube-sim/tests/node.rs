//! A simulated node from a scenario: the kubelet, the API server and `/proc` agree, and
//! follow scenario time.

use gpu_sim::{Scenario, SimNode};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use kube_sim::node::{SimKubeNode, pod_resources_on};
use kube_sim::proto::{
    AllocatableResourcesRequest, ListPodResourcesRequest, PodResourcesListerClient,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

async fn kubelet_client(path: &Path) -> PodResourcesListerClient<Channel> {
    let path: PathBuf = path.to_path_buf();
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap();
    PodResourcesListerClient::new(channel)
}

async fn listed(client: &mut PodResourcesListerClient<Channel>) -> Vec<String> {
    client
        .list(ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_resources
        .into_iter()
        .map(|p| p.name)
        .collect()
}

fn scenario(clock: &str) -> Scenario {
    Scenario::parse_toml(
        &format!(
            r#"
{clock}

[[gpus]]
model = "NVIDIA H100 80GB HBM3"
count = 2

[[pods]]
name = "long"
namespace = "ml"
labels = {{ app = "trainer" }}
[[pods.containers]]
name = "main"
pids = [5001, 5002]
devices = [{{ gpu = 0 }}]

[[pods]]
name = "short"
end_s = 101.5
[[pods.containers]]
name = "main"
pids = [5003]
devices = [{{ gpu = 1 }}]

[[pods]]
name = "next"
start_s = 101.5
[[pods.containers]]
name = "main"
devices = [{{ gpu = 1 }}]
"#
        ),
        "test",
    )
    .unwrap()
}

#[tokio::test]
async fn pods_come_and_go_with_scenario_time_on_every_surface() {
    // Scenario second 100 is now: "short" ends and "next" starts 1.5 s from now.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let s = scenario(&format!("[clock]\nepoch_unix_s = {}", now - 100.0));
    let node = SimNode::new(&s, SystemTime::now());
    let gpu1 = node.gpus[1].uuid.clone();
    let dir = tempfile::tempdir().unwrap();
    let sim = SimKubeNode::start(s.clone(), node, dir.path(), "node-a").unwrap();
    assert_eq!(sim.kubelet_socket(), dir.path().join("kubelet.sock"));
    assert_eq!(sim.kubeconfig_path(), dir.path().join("kubeconfig"));
    assert_eq!(sim.proc_root(), dir.path().join("proc"));
    assert_eq!(sim.node_name(), "node-a");

    let mut kubelet = kubelet_client(sim.kubelet_socket()).await;
    assert_eq!(listed(&mut kubelet).await, ["long", "short"]);
    let alloc = kubelet
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(alloc.devices[0].device_ids.contains(&gpu1));

    let kubeconfig = Kubeconfig::read_from(sim.kubeconfig_path()).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::all(Client::try_from(config).unwrap());
    let phases = || async {
        pods.list(&ListParams::default().fields("spec.nodeName=node-a"))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|p| {
                (
                    p.metadata.name.unwrap(),
                    p.status.and_then(|s| s.phase).unwrap(),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect::<Vec<_>>()
    };
    let running = |name: &str| (name.to_string(), "Running".to_string());
    assert_eq!(phases().await, [running("long"), running("short")]);
    let long = &s.pods[0];
    let long_meta = pods
        .list_metadata(&ListParams::default().labels("app=trainer"))
        .await
        .unwrap();
    assert_eq!(long_meta.items[0].metadata.uid, Some(long.uid()));

    // The cgroup files name each listed PID's pod and container.
    let cgroup = std::fs::read_to_string(sim.proc_root().join("5002").join("cgroup")).unwrap();
    let uid = long.uid();
    assert_eq!(
        cgroup,
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n",
            uid.replace('-', "_"),
            long.containers[0].container_id(&uid)
        )
    );
    assert!(sim.proc_root().join("5003").join("cgroup").exists());

    // At scenario second 101.5, "short" ends and "next" starts, on both servers.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut now_listed = listed(&mut kubelet).await;
    while now_listed != ["long", "next"] && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now_listed = listed(&mut kubelet).await;
    }
    assert_eq!(now_listed, ["long", "next"]);
    let want = [
        running("long"),
        running("next"),
        ("short".to_string(), "Succeeded".to_string()),
    ];
    let mut now_phases = phases().await;
    while now_phases != want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now_phases = phases().await;
    }
    assert_eq!(now_phases, want);
}

#[tokio::test]
async fn a_frozen_clock_serves_that_instant() {
    let s = scenario("[clock]\nfrozen_at_s = 200.0");
    let node = SimNode::new(&s, SystemTime::now());
    let want = pod_resources_on(&s, &node, "node-b", 200.0, false);
    let dir = tempfile::tempdir().unwrap();
    let sim = SimKubeNode::start(s, node, dir.path(), "node-b").unwrap();
    let mut kubelet = kubelet_client(sim.kubelet_socket()).await;
    let got = kubelet
        .list(ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    assert_eq!(got, want);
    assert_eq!(
        got.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["long", "next"]
    );
    let phases: Vec<(String, String)> = sim
        .apiserver()
        .pods()
        .into_iter()
        .map(|p| (p.name, p.phase))
        .collect();
    let pair = |n: &str, p: &str| (n.to_string(), p.to_string());
    // In (namespace, name) order.
    assert_eq!(
        phases,
        [
            pair("next", "Running"),
            pair("short", "Succeeded"),
            pair("long", "Running"),
        ]
    );
    let socket = sim.kubelet_socket().to_path_buf();
    drop(sim);
    assert!(!socket.exists());
}
