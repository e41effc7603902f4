//! A whole simulated Kubernetes node, driven by a `gpu-sim` scenario: the kubelet's
//! PodResources socket, the API server's view of the node's pods and the `/proc` tree of
//! their GPU processes, all telling the same story as the simulated NVML.
//!
//! Pods follow scenario time: one is listed from its `start_s`, and at its `end_s` the
//! kubelet stops listing it (Kubernetes 1.34+ lists active pods only) and the API server
//! moves it to `Succeeded`.

use crate::apiserver::{FakeApiServer, PodMeta};
use crate::kubelet::FakeKubelet;
use crate::procfs::{CgroupLayout, FakeProc, Qos, cgroup_file, non_pod_cgroup};
use crate::proto::{
    CdiDevice, ClaimResource, ContainerDevices, ContainerResources, DynamicResource, PodResources,
};
use crate::server_thread::ServerThread;
use gpu_sim::{Scenario, SimNode};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The node name [`pod_resources`] assumes for DRA pools a scenario leaves unnamed.
pub const DEFAULT_NODE_NAME: &str = "sim-node";

/// The longest the phase updater sleeps between checks, so that a long wait for the
/// next pod event stays correct if the wall clock jumps.
const MAX_UPDATE_SLEEP: Duration = Duration::from_secs(5);

/// What the kubelet's `List` returns at scenario second `t_s` on a node named
/// [`DEFAULT_NODE_NAME`]; see [`pod_resources_on`].
pub fn pod_resources(
    scenario: &Scenario,
    node: &SimNode,
    t_s: f64,
    list_finished: bool,
) -> Vec<PodResources> {
    pod_resources_on(scenario, node, DEFAULT_NODE_NAME, t_s, list_finished)
}

/// What the kubelet's `List` returns at scenario second `t_s`: the pods started by then
/// and, unless `list_finished` (kubelets before 1.34 also listed finished pods), not
/// ended. Each container lists its devices grouped by resource name, in order of first
/// appearance, with the IDs the device plugin would use ([`SimNode::device_id`]), and
/// its DRA claims; a claim's pool defaults to `node_name`.
pub fn pod_resources_on(
    scenario: &Scenario,
    node: &SimNode,
    node_name: &str,
    t_s: f64,
    list_finished: bool,
) -> Vec<PodResources> {
    scenario
        .pods
        .iter()
        .filter(|pod| pod.started(t_s) && (list_finished || !pod.ended(t_s)))
        .map(|pod| PodResources {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            containers: pod
                .containers
                .iter()
                .map(|c| ContainerResources {
                    name: c.name.clone(),
                    devices: grouped_devices(c.devices.iter().filter_map(|d| {
                        match node.device_id(d) {
                            Ok(id) => Some((d.resource.clone(), id)),
                            Err(e) => {
                                // `Scenario::validate` rejects these; a scenario built
                                // by hand may still have one.
                                tracing::warn!(pod = %pod.name, container = %c.name, error = %e, "skipping a device");
                                None
                            }
                        }
                    })),
                    dynamic_resources: c
                        .claims
                        .iter()
                        .filter_map(|claim| {
                            // `Scenario::validate` rejects claims that cannot be spelled.
                            let device = node.dra_device_name(claim).ok()?;
                            let cdi = node.dra_cdi_devices(claim, &pod.namespace).ok()?;
                            Some(DynamicResource {
                                claim_name: claim.claim_name.clone(),
                                claim_namespace: claim
                                    .claim_namespace
                                    .clone()
                                    .unwrap_or_else(|| pod.namespace.clone()),
                                claim_resources: vec![ClaimResource {
                                    cdi_devices: cdi
                                        .into_iter()
                                        .map(|name| CdiDevice { name })
                                        .collect(),
                                    driver_name: claim.driver.clone(),
                                    pool_name: claim
                                        .pool
                                        .clone()
                                        .unwrap_or_else(|| node_name.to_string()),
                                    device_name: device,
                                    share_id: None,
                                }],
                            })
                        })
                        .collect(),
                    ..ContainerResources::default()
                })
                .collect(),
            ..PodResources::default()
        })
        .collect()
}

/// (resource, device ID) pairs as one `ContainerDevices` per resource, in order of
/// first appearance.
fn grouped_devices(ids: impl Iterator<Item = (String, String)>) -> Vec<ContainerDevices> {
    let mut groups: Vec<ContainerDevices> = Vec::new();
    for (resource, id) in ids {
        match groups.iter_mut().find(|g| g.resource_name == resource) {
            Some(group) => group.device_ids.push(id),
            None => groups.push(ContainerDevices {
                resource_name: resource,
                device_ids: vec![id],
                topology: None,
            }),
        }
    }
    groups
}

/// What `GetAllocatableResources` reports: every whole GPU under `nvidia.com/gpu` and
/// every MIG instance under `nvidia.com/mig-<profile>` (the device plugin's mixed
/// strategy), both by UUID, plus any other device ID the scenario's pods use, so that
/// allocatable always covers allocated.
pub fn allocatable(scenario: &Scenario, node: &SimNode) -> Vec<ContainerDevices> {
    let mut ids: Vec<(String, String)> = Vec::new();
    for gpu in &node.gpus {
        if gpu.mig.is_empty() {
            ids.push(("nvidia.com/gpu".to_string(), gpu.uuid.clone()));
        }
        for mig in &gpu.mig {
            ids.push((
                format!("nvidia.com/mig-{}", mig.profile.name),
                mig.uuid.clone(),
            ));
        }
    }
    for pod in &scenario.pods {
        for container in &pod.containers {
            for device in &container.devices {
                if let Ok(id) = node.device_id(device) {
                    let pair = (device.resource.clone(), id);
                    if !ids.contains(&pair) {
                        ids.push(pair);
                    }
                }
            }
        }
    }
    grouped_devices(ids.into_iter())
}

/// What the API server knows about the node's pods at scenario second `t_s`: every pod
/// started by then, `Running`, or `Succeeded` once ended.
pub fn pod_meta(scenario: &Scenario, t_s: f64, node_name: &str) -> Vec<PodMeta> {
    scenario
        .pods
        .iter()
        .filter(|pod| pod.started(t_s))
        .map(|pod| PodMeta {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid(),
            labels: pod.labels.clone(),
            annotations: BTreeMap::new(),
            node_name: node_name.to_string(),
            owner: pod.owner.as_ref().map(|o| (o.kind.clone(), o.name.clone())),
            phase: if pod.ended(t_s) {
                "Succeeded"
            } else {
                "Running"
            }
            .to_string(),
        })
        .collect()
}

/// The ResourceSlice NVIDIA's DRA driver publishes for this node: pool `node_name`,
/// every whole GPU as `gpu-<minor>` (attributes `type = "gpu"`, `uuid`, `productName`)
/// and every MIG instance under its 25.12+ name (`type = "mig"`, `uuid`, `parentUUID`,
/// `profile`).
pub fn resource_slice(node: &SimNode, node_name: &str) -> ResourceSlice {
    use gpu_sim::{ClaimSpec, DraNaming};
    let text = |v: &str| DeviceAttribute {
        string: Some(v.to_string()),
        ..DeviceAttribute::default()
    };
    let mut devices = Vec::new();
    for (index, gpu) in node.gpus.iter().enumerate() {
        let claim = |mig: Option<usize>| ClaimSpec {
            claim_name: String::new(),
            claim_namespace: None,
            driver: NVIDIA_DRA_DRIVER.into(),
            pool: None,
            device: None,
            gpu: Some(index as u32),
            mig,
            naming: DraNaming::Current,
            cdi_devices: None,
        };
        let mut push = |mig: Option<usize>, attributes: Vec<(&str, DeviceAttribute)>| {
            if let Ok(name) = node.dra_device_name(&claim(mig)) {
                devices.push(Device {
                    name,
                    attributes: Some(
                        attributes
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                    ),
                    ..Device::default()
                });
            }
        };
        if gpu.mig.is_empty() {
            push(
                None,
                vec![
                    ("type", text("gpu")),
                    ("uuid", text(&gpu.uuid)),
                    ("productName", text(gpu.model.name)),
                ],
            );
        }
        for (slot, m) in gpu.mig.iter().enumerate() {
            push(
                Some(slot),
                vec![
                    ("type", text("mig")),
                    ("uuid", text(&m.uuid)),
                    ("parentUUID", text(&gpu.uuid)),
                    ("profile", text(m.profile.name)),
                ],
            );
        }
    }
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node_name}-{NVIDIA_DRA_DRIVER}-sim")),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: NVIDIA_DRA_DRIVER.into(),
            node_name: Some(node_name.to_string()),
            pool: ResourcePool {
                name: node_name.to_string(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
}

/// The DRA driver name of NVIDIA's GPU driver.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// The first pod start or end strictly after `t_s`, if any.
fn next_pod_event(scenario: &Scenario, t_s: f64) -> Option<f64> {
    scenario
        .pods
        .iter()
        .flat_map(|p| [Some(p.start_s), p.end_s])
        .flatten()
        .filter(|&t| t > t_s)
        .min_by(f64::total_cmp)
}

/// A fake kubelet, API server and `/proc` for one simulated node. Dropping it stops
/// the servers and removes the kubelet socket; the directory's other files stay.
pub struct SimKubeNode {
    /// Dropped first (field order): it holds the API server.
    _updater: Option<ServerThread>,
    kubelet: FakeKubelet,
    apiserver: Arc<FakeApiServer>,
    proc_root: FakeProc,
    kubeconfig: PathBuf,
    node_name: String,
}

impl SimKubeNode {
    /// Starts the three parts under `dir`: the kubelet socket at `<dir>/kubelet.sock`
    /// (its pods follow `node.clock()`), an API server holding the scenario's pods
    /// (their phases follow the clock too) with its kubeconfig at `<dir>/kubeconfig`,
    /// and `<dir>/proc` with a `cgroup` file for every PID the scenario's containers
    /// list (cgroup v2, systemd driver, containerd, Burstable), whether or not its pod
    /// runs yet.
    pub fn start(
        scenario: Scenario,
        node: SimNode,
        dir: &Path,
        node_name: &str,
    ) -> io::Result<SimKubeNode> {
        std::fs::create_dir_all(dir)?;
        let scenario = Arc::new(scenario);
        let node = Arc::new(node);
        let clock = node.clock();

        let kubelet = FakeKubelet::start(&dir.join("kubelet.sock"))?;
        kubelet.set_allocatable(allocatable(&scenario, &node));
        {
            let (scenario, node, node_name) =
                (scenario.clone(), node.clone(), node_name.to_string());
            kubelet.set_pod_source(Arc::new(move || {
                pod_resources_on(&scenario, &node, &node_name, node.clock().now_s(), false)
            }));
        }

        let apiserver = Arc::new(FakeApiServer::start()?);
        for pod in pod_meta(&scenario, clock.now_s(), node_name) {
            apiserver.apply(pod);
        }
        // The DRA driver publishes its devices on nodes where claims use it.
        let uses_dra = scenario.pods.iter().any(|p| {
            p.containers.iter().any(|c| {
                c.claims
                    .iter()
                    .any(|claim| claim.driver == NVIDIA_DRA_DRIVER)
            })
        });
        if uses_dra {
            apiserver.apply_resource_slice(resource_slice(&node, node_name));
        }
        let kubeconfig = dir.join("kubeconfig");
        apiserver.write_kubeconfig(&kubeconfig)?;
        let updater = if clock.is_frozen() || next_pod_event(&scenario, clock.now_s()).is_none() {
            None
        } else {
            let (scenario, apiserver, node_name) =
                (scenario.clone(), apiserver.clone(), node_name.to_string());
            Some(ServerThread::spawn("sim-kube-node", move || {
                follow_scenario(scenario, clock, apiserver, node_name)
            })?)
        };

        let proc_root = FakeProc::new(&dir.join("proc"))?;
        for pod in &scenario.pods {
            let uid = pod.uid();
            for container in &pod.containers {
                let file = cgroup_file(
                    CgroupLayout::V2SystemdContainerd,
                    Qos::Burstable,
                    &uid,
                    &container.container_id(&uid),
                );
                for &pid in &container.pids {
                    proc_root.add(pid, &file)?;
                }
            }
        }

        // Every other GPU process runs outside any pod (a system service).
        let in_pods: std::collections::BTreeSet<u32> = scenario
            .pods
            .iter()
            .flat_map(|p| p.containers.iter().flat_map(|c| c.pids.iter().copied()))
            .collect();
        let others = node.gpus.iter().flat_map(|g| {
            g.processes
                .iter()
                .chain(g.mig.iter().flat_map(|m| m.processes.iter()))
                .map(|p| p.pid)
        });
        for pid in others.filter(|pid| !in_pods.contains(pid)) {
            proc_root.add(pid, &non_pod_cgroup())?;
        }

        Ok(SimKubeNode {
            _updater: updater,
            kubelet,
            apiserver,
            proc_root,
            kubeconfig,
            node_name: node_name.to_string(),
        })
    }

    /// The fake kubelet.
    pub fn kubelet(&self) -> &FakeKubelet {
        &self.kubelet
    }

    /// The fake API server.
    pub fn apiserver(&self) -> &FakeApiServer {
        &self.apiserver
    }

    /// The fake `/proc`.
    pub fn proc(&self) -> &FakeProc {
        &self.proc_root
    }

    /// `<dir>/kubelet.sock`.
    pub fn kubelet_socket(&self) -> &Path {
        self.kubelet.socket_path()
    }

    /// `<dir>/kubeconfig`, for the API server.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `<dir>/proc`.
    pub fn proc_root(&self) -> &Path {
        self.proc_root.root()
    }

    /// The node name the pods are scheduled on.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }
}

impl std::fmt::Debug for SimKubeNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimKubeNode")
            .field("node_name", &self.node_name)
            .field("kubelet", &self.kubelet)
            .field("apiserver", &self.apiserver)
            .field("proc_root", &self.proc_root.root())
            .finish_non_exhaustive()
    }
}

/// Applies pod phase changes to the API server as scenario time passes them, sleeping
/// until the next pod start or end.
async fn follow_scenario(
    scenario: Arc<Scenario>,
    clock: gpu_sim::SimClock,
    apiserver: Arc<FakeApiServer>,
    node_name: String,
) {
    loop {
        let now = clock.now_s();
        for pod in pod_meta(&scenario, now, &node_name) {
            // A no-op when nothing changed: the server ignores identical updates.
            apiserver.apply(pod);
        }
        let Some(next) = next_pod_event(&scenario, now) else {
            return;
        };
        let wait = clock
            .wall_time(next)
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .min(MAX_UPDATE_SLEEP);
        // A millisecond past the event, so that `now_s()` has reached it on waking.
        tokio::time::sleep(wait + Duration::from_millis(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = r#"
[clock]
frozen_at_s = 0.0

[[gpus]]
model = "NVIDIA H100 80GB HBM3"
count = 2

[[pods]]
name = "train"
namespace = "ml"
labels = { app = "trainer" }
start_s = 0.0
end_s = 100.0
[[pods.containers]]
name = "main"
pids = [5001]
devices = [{ gpu = 0 }, { gpu = 1 }, { gpu = 0, resource = "example.com/other", form = "index" }]
[[pods.containers]]
name = "dra"
claims = [{ claim_name = "gpu-claim", device = "gpu-0", cdi_devices = ["k8s.gpu.nvidia.com/device=gpu-0"] }]

[[pods]]
name = "later"
start_s = 50.0
[[pods.containers]]
name = "c"
devices = [{ id = "raw-id" }]
"#;

    fn scenario() -> (Scenario, SimNode) {
        let s = Scenario::parse_toml(SCENARIO, "test").unwrap();
        let n = SimNode::new(&s, SystemTime::now());
        (s, n)
    }

    #[test]
    fn pods_are_listed_while_running_with_devices_grouped_by_resource() {
        let (s, n) = scenario();
        let at0 = pod_resources_on(&s, &n, "node-a", 0.0, false);
        assert_eq!(at0.len(), 1);
        let train = &at0[0];
        assert_eq!(
            (train.name.as_str(), train.namespace.as_str()),
            ("train", "ml")
        );
        let main = &train.containers[0];
        assert_eq!(main.devices.len(), 2);
        assert_eq!(main.devices[0].resource_name, "nvidia.com/gpu");
        assert_eq!(
            main.devices[0].device_ids,
            vec![n.gpus[0].uuid.clone(), n.gpus[1].uuid.clone()]
        );
        assert_eq!(main.devices[1].resource_name, "example.com/other");
        assert_eq!(main.devices[1].device_ids, vec!["0".to_string()]);
        let dra = &train.containers[1];
        assert!(dra.devices.is_empty());
        let claim = &dra.dynamic_resources[0];
        assert_eq!(
            (claim.claim_name.as_str(), claim.claim_namespace.as_str()),
            ("gpu-claim", "ml")
        );
        let r = &claim.claim_resources[0];
        assert_eq!(
            (
                r.driver_name.as_str(),
                r.pool_name.as_str(),
                r.device_name.as_str()
            ),
            ("gpu.nvidia.com", "node-a", "gpu-0")
        );
        assert_eq!(r.cdi_devices[0].name, "k8s.gpu.nvidia.com/device=gpu-0");

        let names = |v: Vec<PodResources>| v.into_iter().map(|p| p.name).collect::<Vec<_>>();
        assert_eq!(
            names(pod_resources(&s, &n, 60.0, false)),
            ["train", "later"]
        );
        assert_eq!(names(pod_resources(&s, &n, 100.0, false)), ["later"]);
        assert_eq!(
            names(pod_resources(&s, &n, 100.0, true)),
            ["train", "later"]
        );
        assert_eq!(
            pod_resources(&s, &n, 0.0, false)[0].containers[1].dynamic_resources[0].claim_resources
                [0]
            .pool_name,
            DEFAULT_NODE_NAME
        );
    }

    #[test]
    fn claims_and_the_resource_slice_name_devices_as_the_dra_driver_does() {
        let s = Scenario::parse_toml(
            r#"
minor_numbers = [1, 0]
[clock]
frozen_at_s = 0.0
[[gpus]]
model = "NVIDIA H100 80GB HBM3"
[[gpus]]
model = "NVIDIA H100 80GB HBM3"
mig = [{ profile = "3g.40gb" }, { profile = "2g.20gb", count = 2 }]
[[pods]]
name = "p"
namespace = "ml"
[[pods.containers]]
name = "c"
claims = [
  { claim_name = "whole", gpu = 0 },
  { claim_name = "slice", gpu = 1, mig = 0 },
  { claim_name = "old", gpu = 1, mig = 2, naming = "legacy" },
]
"#,
            "t",
        )
        .unwrap();
        let n = SimNode::new(&s, SystemTime::now());
        // NVIDIA's names: the minor number (GPU 0 is /dev/nvidia1), and for MIG the
        // profile without dots, its unique ID (3g.40gb: 9, 2g.20gb: 14, as nvidia-smi
        // mig -lgip shows) and placement (3g.40gb + 2 x 2g.20gb fit only with the 3g
        // instance at slice 4).
        let pods = pod_resources_on(&s, &n, "node-a", 0.0, false);
        let claims = &pods[0].containers[0].dynamic_resources;
        let devices: Vec<&str> = claims
            .iter()
            .map(|c| c.claim_resources[0].device_name.as_str())
            .collect();
        assert_eq!(
            devices,
            ["gpu-1", "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-14-2-2"]
        );
        // CDI names carry the claim's UID, not the GPU's.
        let cdi = &claims[0].claim_resources[0].cdi_devices[0].name;
        let uid = s.pods[0].containers[0].claims[0].uid("ml");
        assert_eq!(cdi, &format!("k8s.gpu.nvidia.com/claim={uid}-gpu-1"));
        assert!(!cdi.contains(&n.gpus[0].uuid["GPU-".len()..]));

        let slice = resource_slice(&n, "node-a");
        assert_eq!(slice.spec.driver, "gpu.nvidia.com");
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice.spec.pool.name, "node-a");
        let published: Vec<(String, String)> = slice
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| {
                let attrs = d.attributes.as_ref().unwrap();
                (d.name.clone(), attrs["uuid"].string.clone().unwrap())
            })
            .collect();
        assert_eq!(
            published,
            [
                ("gpu-1".to_string(), n.gpus[0].uuid.clone()),
                (
                    "gpu-0-mig-3g40gb-9-4".to_string(),
                    n.gpus[1].mig[0].uuid.clone()
                ),
                (
                    "gpu-0-mig-2g20gb-14-0".to_string(),
                    n.gpus[1].mig[1].uuid.clone()
                ),
                (
                    "gpu-0-mig-2g20gb-14-2".to_string(),
                    n.gpus[1].mig[2].uuid.clone()
                ),
            ]
        );
    }

    #[test]
    fn pod_meta_follows_phases_and_allocatable_covers_allocated() {
        let (s, n) = scenario();
        let at = |t| {
            pod_meta(&s, t, "node-a")
                .into_iter()
                .map(|p| (p.name, p.phase))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(0.0), [("train".into(), "Running".into())]);
        assert_eq!(
            at(100.0),
            [
                ("train".into(), "Succeeded".into()),
                ("later".into(), "Running".into())
            ]
        );
        let meta = &pod_meta(&s, 0.0, "node-a")[0];
        assert_eq!(meta.uid, s.pods[0].uid());
        assert_eq!(meta.labels.get("app").map(String::as_str), Some("trainer"));
        assert_eq!(meta.node_name, "node-a");

        let alloc = allocatable(&s, &n);
        for pod in pod_resources(&s, &n, 60.0, false) {
            for c in pod.containers {
                for d in c.devices {
                    for id in d.device_ids {
                        assert!(
                            alloc.iter().any(|a| a.resource_name == d.resource_name
                                && a.device_ids.contains(&id)),
                            "{id} not allocatable"
                        );
                    }
                }
            }
        }
        assert_eq!(next_pod_event(&s, 0.0), Some(50.0));
        assert_eq!(next_pod_event(&s, 100.0), None);
    }
}
