//! Pods on the simulated node: what the kubelet's PodResources API and the API server
//! would report about the workloads using its GPUs. Pure data; `kube-sim` serves it.
//!
//! A pod's devices are written either as a raw kubelet device ID (`id`, used as is) or
//! symbolically (`gpu`, optional `mig`, `form`, `replica`), resolved against the
//! node's UUIDs by [`SimNode::device_id`] so that a scenario need not spell UUIDs.

use crate::node::SimNode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One pod scheduled on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The pod UID; default: derived from the namespace and name.
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub containers: Vec<ContainerSpec>,
    /// Scenario second the pod starts running.
    #[serde(default)]
    pub start_s: f64,
    /// Scenario second the pod ends (phase `Succeeded` from then on).
    pub end_s: Option<f64>,
    /// The controlling owner, e.g. `{ kind = "ReplicaSet", name = "resnet-7c9f8d6b5" }`
    /// (with the pod label `pod-template-hash = "7c9f8d6b5"` for a Deployment's pods).
    pub owner: Option<OwnerSpec>,
}

/// A pod's controlling owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnerSpec {
    pub kind: String,
    pub name: String,
}

fn default_namespace() -> String {
    "default".into()
}

/// One container of a pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    pub name: String,
    /// Devices the device plugin allocated to this container.
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    /// DRA claims allocated to this container.
    #[serde(default)]
    pub claims: Vec<ClaimSpec>,
    /// PIDs of the GPU processes running in this container (their `/proc/<pid>/cgroup`
    /// names this pod and container).
    #[serde(default)]
    pub pids: Vec<u32>,
    /// The runtime's 64-hex container ID; default: derived from the pod UID and name.
    pub container_id: Option<String>,
}

/// A device-plugin allocation: one kubelet device ID under a resource name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    #[serde(default = "default_resource")]
    pub resource: String,
    /// A raw device ID, reported exactly as written.
    pub id: Option<String>,
    /// The GPU, by NVML index.
    pub gpu: Option<u32>,
    /// A MIG instance of `gpu`, by its position in the scenario's MIG list (which is
    /// also its `nvmlDeviceGetMigDeviceHandleByIndex` slot).
    pub mig: Option<usize>,
    #[serde(default)]
    pub form: IdForm,
    /// Sharing replica (time-slicing, MPS): `::N`, or `/vgpuN` in the GKE form.
    pub replica: Option<u32>,
}

fn default_resource() -> String {
    "nvidia.com/gpu".into()
}

/// How a device plugin spells a device ID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdForm {
    /// `GPU-<uuid>` / `MIG-<uuid>` (NVIDIA plugin, `deviceIDStrategy: uuid`).
    #[default]
    Uuid,
    /// `<idx>` / `<idx>:<slot>` (NVIDIA plugin, `deviceIDStrategy: index`).
    Index,
    /// `nvidia<idx>` / `nvidia<idx>/gi<gi>` (GKE plugin).
    Gke,
    /// `MIG-GPU-<uuid>/<gi>/<ci>` (drivers before R470; MIG only).
    Legacy,
}

/// A DRA claim's device (`dynamic_resources[].claim_resources[]`), written either as
/// the driver's raw device name (`device`) or symbolically (`gpu`, optional `mig`,
/// `naming`), spelled as NVIDIA's DRA driver names it by [`SimNode::dra_device_name`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimSpec {
    pub claim_name: String,
    /// Default: the pod's namespace.
    pub claim_namespace: Option<String>,
    #[serde(default = "default_driver")]
    pub driver: String,
    /// Default: the node name `kube-sim` uses.
    pub pool: Option<String>,
    /// The driver's device name, reported exactly as written, e.g. `gpu-0`.
    pub device: Option<String>,
    /// The GPU, by NVML index.
    pub gpu: Option<u32>,
    /// A MIG instance of `gpu`, by its position in the scenario's MIG list.
    pub mig: Option<usize>,
    #[serde(default)]
    pub naming: DraNaming,
    /// CDI device names, fully qualified; default: the one NVIDIA's DRA driver writes,
    /// `k8s.gpu.nvidia.com/claim=<claim UID>-<device>`.
    pub cdi_devices: Option<Vec<String>>,
}

/// Which release of NVIDIA's DRA driver names a MIG device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DraNaming {
    /// 25.12 and later: `gpu-<minor>-mig-<profile>-<profile ID>-<placement start>`, the
    /// profile name without dots (`1g10gb`).
    #[default]
    Current,
    /// 25.3 and 25.8: `gpu-<minor>-mig-<profile ID>-<placement start>-<placement size>`.
    Legacy,
}

impl ClaimSpec {
    /// The claim's UID: stable, derived from its namespace and name.
    pub fn uid(&self, namespace: &str) -> String {
        uuid_from(&format!("claim/{namespace}/{}", self.claim_name))
    }
}

fn default_driver() -> String {
    "gpu.nvidia.com".into()
}

impl PodSpec {
    /// The pod UID: the given one, else a stable UUID-shaped hash of namespace and name.
    pub fn uid(&self) -> String {
        self.uid
            .clone()
            .unwrap_or_else(|| uuid_from(&format!("pod/{}/{}", self.namespace, self.name)))
    }

    /// Whether the pod has ended at scenario second `t`.
    pub fn ended(&self, t: f64) -> bool {
        self.end_s.is_some_and(|end| t >= end)
    }

    /// Whether the pod exists (started) at scenario second `t`.
    pub fn started(&self, t: f64) -> bool {
        t >= self.start_s
    }
}

impl ContainerSpec {
    /// The container ID: the given one, else 64 hex digits derived from the pod UID and
    /// the container name.
    pub fn container_id(&self, pod_uid: &str) -> String {
        self.container_id.clone().unwrap_or_else(|| {
            let seed = format!("container/{pod_uid}/{}", self.name);
            (0..4u64)
                .map(|k| format!("{:016x}", fnv1a(&format!("{seed}/{k}"))))
                .collect()
        })
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A UUID-shaped (8-4-4-4-12) lower-case hex string derived from `seed`.
fn uuid_from(seed: &str) -> String {
    let hex = format!("{:016x}{:016x}", fnv1a(seed), fnv1a(&format!("{seed}/2")));
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Why a symbolic device cannot be spelled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceSpecError {
    #[error("a device needs either `id` or `gpu`")]
    Missing,
    #[error("GPU {0} does not exist")]
    NoGpu(u32),
    #[error("GPU {gpu} has no MIG instance {mig}")]
    NoMig { gpu: u32, mig: usize },
    #[error("the legacy form names MIG instances only")]
    LegacyNeedsMig,
    #[error("a claim needs either `device` or `gpu`")]
    MissingClaimDevice,
}

impl SimNode {
    /// The kubelet device ID for `spec` on this node.
    pub fn device_id(&self, spec: &DeviceSpec) -> Result<String, DeviceSpecError> {
        if let Some(id) = &spec.id {
            return Ok(id.clone());
        }
        let index = spec.gpu.ok_or(DeviceSpecError::Missing)?;
        let gpu = self
            .gpus
            .get(index as usize)
            .ok_or(DeviceSpecError::NoGpu(index))?;
        let mig = match spec.mig {
            Some(slot) => Some((
                slot,
                gpu.mig.get(slot).ok_or(DeviceSpecError::NoMig {
                    gpu: index,
                    mig: slot,
                })?,
            )),
            None => None,
        };
        let base = match (spec.form, mig) {
            (IdForm::Uuid, None) => gpu.uuid.clone(),
            (IdForm::Uuid, Some((_, m))) => m.uuid.clone(),
            (IdForm::Index, None) => index.to_string(),
            (IdForm::Index, Some((slot, _))) => format!("{index}:{slot}"),
            (IdForm::Gke, None) => format!("nvidia{index}"),
            (IdForm::Gke, Some((_, m))) => format!("nvidia{index}/gi{}", m.gpu_instance_id),
            (IdForm::Legacy, None) => return Err(DeviceSpecError::LegacyNeedsMig),
            (IdForm::Legacy, Some((_, m))) => format!(
                "MIG-{}/{}/{}",
                gpu.uuid, m.gpu_instance_id, m.compute_instance_id
            ),
        };
        Ok(match (spec.replica, spec.form) {
            (None, _) => base,
            (Some(k), IdForm::Gke) => format!("{base}/vgpu{k}"),
            (Some(k), _) => format!("{base}::{k}"),
        })
    }

    /// The DRA device name of `claim`'s device on this node: NVIDIA's DRA driver names
    /// a GPU by its minor number, never its index, and a MIG device by its parent's
    /// minor number, GPU-instance profile ID and placement.
    pub fn dra_device_name(&self, claim: &ClaimSpec) -> Result<String, DeviceSpecError> {
        if let Some(device) = &claim.device {
            return Ok(device.clone());
        }
        let index = claim.gpu.ok_or(DeviceSpecError::MissingClaimDevice)?;
        let gpu = self
            .gpus
            .get(index as usize)
            .ok_or(DeviceSpecError::NoGpu(index))?;
        let minor = gpu.minor_number;
        let Some(slot) = claim.mig else {
            return Ok(format!("gpu-{minor}"));
        };
        let m = gpu.mig.get(slot).ok_or(DeviceSpecError::NoMig {
            gpu: index,
            mig: slot,
        })?;
        let p = &m.profile;
        Ok(match claim.naming {
            DraNaming::Current => format!(
                "gpu-{minor}-mig-{}-{}-{}",
                dra_profile_name(p.name),
                p.id,
                m.placement_start
            ),
            DraNaming::Legacy => format!(
                "gpu-{minor}-mig-{}-{}-{}",
                p.id, m.placement_start, p.memory_slices
            ),
        })
    }

    /// The CDI device names the kubelet reports for `claim` of a pod in `namespace`.
    pub fn dra_cdi_devices(
        &self,
        claim: &ClaimSpec,
        namespace: &str,
    ) -> Result<Vec<String>, DeviceSpecError> {
        if let Some(names) = &claim.cdi_devices {
            return Ok(names.clone());
        }
        let device = self.dra_device_name(claim)?;
        let namespace = claim.claim_namespace.as_deref().unwrap_or(namespace);
        Ok(vec![format!(
            "k8s.gpu.nvidia.com/claim={}-{device}",
            claim.uid(namespace)
        )])
    }
}

/// A MIG profile name as NVIDIA's DRA driver puts it in device names: dots dropped,
/// lower case, anything else outside `[a-z0-9-]` a dash (`1g.10gb+me` → `1g10gb-me`).
pub fn dra_profile_name(profile: &str) -> String {
    let mapped: String = profile
        .chars()
        .filter(|&c| c != '.')
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scenario;

    fn node() -> SimNode {
        let s = Scenario::parse_toml(
            "[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\n[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\nmig = [{ profile = \"1g.10gb\", count = 2 }]\n",
            "t",
        )
        .unwrap();
        SimNode::new(&s, std::time::SystemTime::now())
    }

    fn dev(gpu: u32, mig: Option<usize>, form: IdForm, replica: Option<u32>) -> DeviceSpec {
        DeviceSpec {
            resource: default_resource(),
            id: None,
            gpu: Some(gpu),
            mig,
            form,
            replica,
        }
    }

    #[test]
    fn every_form_is_spelled_as_the_plugins_do() {
        let n = node();
        let g0 = n.gpus[0].uuid.clone();
        let g1 = n.gpus[1].uuid.clone();
        let m = &n.gpus[1].mig[1];
        let cases = [
            (dev(0, None, IdForm::Uuid, None), g0.clone()),
            (dev(0, None, IdForm::Uuid, Some(3)), format!("{g0}::3")),
            (dev(1, Some(1), IdForm::Uuid, None), m.uuid.clone()),
            (dev(0, None, IdForm::Index, None), "0".into()),
            (dev(1, Some(1), IdForm::Index, None), "1:1".into()),
            (dev(0, None, IdForm::Gke, Some(2)), "nvidia0/vgpu2".into()),
            (
                dev(1, Some(1), IdForm::Gke, None),
                format!("nvidia1/gi{}", m.gpu_instance_id),
            ),
            (
                dev(1, Some(1), IdForm::Legacy, None),
                format!("MIG-{g1}/{}/{}", m.gpu_instance_id, m.compute_instance_id),
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(n.device_id(&spec).unwrap(), want, "{spec:?}");
        }
        assert_eq!(
            n.device_id(&dev(5, None, IdForm::Uuid, None)),
            Err(DeviceSpecError::NoGpu(5))
        );
        assert_eq!(
            n.device_id(&dev(0, None, IdForm::Legacy, None)),
            Err(DeviceSpecError::LegacyNeedsMig)
        );
    }

    #[test]
    fn derived_identities_are_stable_and_well_formed() {
        let pod = PodSpec {
            name: "a".into(),
            namespace: "ns".into(),
            uid: None,
            labels: BTreeMap::new(),
            containers: vec![],
            start_s: 0.0,
            end_s: Some(10.0),
            owner: None,
        };
        let uid = pod.uid();
        assert_eq!(uid, pod.uid());
        assert_eq!(uid.len(), 36);
        assert_eq!(uid.matches('-').count(), 4);
        let c = ContainerSpec {
            name: "c".into(),
            devices: vec![],
            claims: vec![],
            pids: vec![],
            container_id: None,
        };
        let id = c.container_id(&uid);
        assert_eq!(id.len(), 64);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(pod.started(0.0) && !pod.ended(9.9) && pod.ended(10.0));
    }
}
