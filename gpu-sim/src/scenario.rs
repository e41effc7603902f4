//! The scenario file: what a simulated node looks like and what happens to it.
//! TOML or JSON (by extension); every table rejects unknown keys so typos fail loudly.

use crate::load::Load;
use crate::models;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A whole simulated node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default = "default_driver")]
    pub driver_version: String,
    #[serde(default = "default_nvml")]
    pub nvml_version: String,
    /// CUDA driver version as NVML encodes it (13000 = 13.0).
    #[serde(default = "default_cuda")]
    pub cuda_driver_version: i32,
    /// Seed for UUIDs and serials, so two nodes can be told apart.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub clock: ClockSpec,
    pub gpus: Vec<GpuSpec>,
    /// Each GPU's minor number (`/dev/nvidia<N>`, `nvmlDeviceGetMinorNumber`), in NVML
    /// index order; default: the index. On real nodes they differ: NVML orders GPUs by
    /// PCI bus ID, the driver numbers them as it probes them.
    #[serde(default)]
    pub minor_numbers: Vec<u32>,
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Pods using the node's GPUs (served by `kube-sim`; ignored by NVML).
    #[serde(default)]
    pub pods: Vec<crate::pods::PodSpec>,
    /// The NVLink fabric (NVL72-class racks) the node's GPUs are registered in.
    #[serde(default)]
    pub fabric: Option<crate::fabric::FabricSpec>,
    /// The GPUs are passed through to a virtual machine (cloud GPU VMs): the guest's
    /// driver knows no NUMA node for them and no PCIe topology between them.
    #[serde(default)]
    pub passthrough_vm: bool,
}

fn default_driver() -> String {
    "580.82.07".into()
}
fn default_nvml() -> String {
    "13.580.82.07".into()
}
fn default_cuda() -> i32 {
    13000
}

/// How scenario time relates to the wall clock.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockSpec {
    /// Freeze scenario time at this many seconds (golden tests).
    pub frozen_at_s: Option<f64>,
    /// Unix time of scenario second 0; default: when the process started the model.
    pub epoch_unix_s: Option<f64>,
}

/// One or more identical GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    #[serde(default = "one")]
    pub count: u32,
    /// NVML model name; must be one of [`models::MODELS`].
    pub model: String,
    #[serde(default)]
    pub load: Load,
    /// Each further GPU of the group runs its load pattern this many seconds later, so
    /// that GPUs of one group do not move in lock-step.
    #[serde(default)]
    pub stagger_s: f64,
    /// Memory in use besides the listed processes, MiB.
    #[serde(default)]
    pub memory_used_mib: u64,
    /// Explicit processes on each GPU of this group.
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
    /// Additional generated processes on each GPU of this group.
    #[serde(default)]
    pub process_count: u32,
    /// Memory of each generated process, MiB.
    #[serde(default = "default_process_mib")]
    pub process_memory_mib: u64,
    /// MIG mode with these instances; empty = MIG disabled.
    #[serde(default)]
    pub mig: Vec<MigSpec>,
    /// Capabilities this board answers NOT_SUPPORTED for (see [`Capability`]).
    #[serde(default)]
    pub unsupported: Vec<Capability>,
    /// Override the model's GPM support.
    pub gpm: Option<bool>,
    /// Encoder and decoder utilisation, percent.
    #[serde(default)]
    pub encoder_percent: u32,
    #[serde(default)]
    pub decoder_percent: u32,
}

fn one() -> u32 {
    1
}
fn default_process_mib() -> u64 {
    2048
}

/// One or more identical MIG GPU instances.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigSpec {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    #[serde(default = "one")]
    pub count: u32,
    #[serde(default)]
    pub load: Load,
    #[serde(default)]
    pub memory_used_mib: u64,
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
    #[serde(default)]
    pub process_count: u32,
    #[serde(default = "default_mig_process_mib")]
    pub process_memory_mib: u64,
}

fn default_mig_process_mib() -> u64 {
    1024
}

/// A process using a GPU or a MIG instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    /// Fixed PID; generated when absent.
    pub pid: Option<u32>,
    pub name: String,
    pub used_memory_mib: u64,
    /// Relative share of the device's SM activity.
    #[serde(default = "one_f")]
    pub weight: f64,
}

fn one_f() -> f64 {
    1.0
}

/// A part of NVML a board may not support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    Utilization,
    EncoderUtilization,
    DecoderUtilization,
    MemoryTemperature,
    Temperature,
    Power,
    Energy,
    Clocks,
    PcieReplay,
    PcieThroughput,
    ThrottleReasons,
    Violations,
    Ecc,
    RetiredPages,
    RemappedRows,
    Nvlink,
    VgpuLicense,
    Gpm,
    Processes,
}

/// Something that happens to the node at a given scenario time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// An XID error on a GPU (or one of its MIG instances).
    Xid {
        at_s: f64,
        gpu: u32,
        code: u64,
        /// GPU-instance ID when the XID belongs to a MIG instance.
        gpu_instance: Option<u32>,
    },
    /// The GPU falls off the bus: every call on it answers GPU_IS_LOST from then on.
    GpuLost { at_s: f64, gpu: u32 },
    /// The whole driver is unusable in this window (every call fails).
    DriverUnavailable { from_s: f64, until_s: Option<f64> },
    /// Every call takes this long in this window.
    Slow {
        from_s: f64,
        until_s: Option<f64>,
        delay_ms: u64,
    },
    /// `nvmlInit` fails (driver not loaded).
    InitFailure,
    /// ECC errors appear (volatile and aggregate counters grow by these amounts).
    Ecc {
        at_s: f64,
        gpu: u32,
        #[serde(default)]
        corrected: u64,
        #[serde(default)]
        uncorrected: u64,
    },
    /// Memory pages are retired.
    RetiredPages {
        at_s: f64,
        gpu: u32,
        #[serde(default)]
        single_bit: u64,
        #[serde(default)]
        double_bit: u64,
        #[serde(default)]
        pending: bool,
    },
    /// Memory rows are remapped.
    RowRemap {
        at_s: f64,
        gpu: u32,
        #[serde(default)]
        correctable: u64,
        #[serde(default)]
        uncorrectable: u64,
        #[serde(default)]
        failure: bool,
        /// A remapping waits for the next GPU reset (`isPending` of
        /// `nvmlDeviceGetRemappedRows`, field 144) from `at_s` on.
        #[serde(default)]
        pending: bool,
    },
    /// PCIe link replays.
    PcieReplay { at_s: f64, gpu: u32, count: u64 },
    /// Clock-event (throttle) reasons held in a window, NVML bitmask.
    Throttle {
        from_s: f64,
        until_s: Option<f64>,
        gpu: u32,
        reasons: u64,
    },
    /// The driver asks for a recovery action from `at_s` on
    /// (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, value `nvmlDeviceGpuRecoveryAction_t`;
    /// see [`Fault::RECOVERY_ACTIONS`]); a real driver reports XID 154 when it changes,
    /// and so does the model.
    RecoveryAction { at_s: f64, gpu: u32, action: u32 },
    /// An ECC mode change is pending from `at_s` on: `nvmlDeviceGetEccMode`'s pending
    /// mode (field 2) becomes `enabled` while the current mode stays until a reboot.
    EccModePending { at_s: f64, gpu: u32, enabled: bool },
    /// Clocks held back by a performance policy for this long (ns) at this instant.
    Violation {
        at_s: f64,
        gpu: u32,
        policy: ViolationPolicy,
        ns: u64,
    },
    /// One NVLink of a GPU is down (inactive) in this window.
    NvlinkDown {
        from_s: f64,
        until_s: Option<f64>,
        gpu: u32,
        link: u32,
    },
    /// NVLink data-link errors on one link at this instant.
    NvlinkErrors {
        at_s: f64,
        gpu: u32,
        link: u32,
        #[serde(default)]
        crc_flit: u64,
        #[serde(default)]
        crc_data: u64,
        #[serde(default)]
        replay: u64,
        #[serde(default)]
        recovery: u64,
    },
    /// The GPU's fabric registration in this window (see [`crate::fabric`]).
    Fabric {
        from_s: f64,
        until_s: Option<f64>,
        gpu: u32,
        #[serde(default)]
        state: crate::fabric::FabricState,
        /// `nvmlReturn_t` of a completed registration (0 = success).
        #[serde(default)]
        status: u32,
        /// `NVML_GPU_FABRIC_HEALTH_MASK_*` bits; absent = the board's healthy mask.
        health_mask: Option<u32>,
    },
}

/// Health signals of issue 17 (row-remap and ECC-mode pending, recovery action),
/// kept in their own block.
impl Fault {
    /// The `nvmlDeviceGpuRecoveryAction_t` names, in value order (0 = none).
    pub const RECOVERY_ACTIONS: [&'static str; 8] = [
        "none",
        "gpu_reset",
        "node_reboot",
        "drain_p2p",
        "drain_and_reset",
        "recover_imex_domain",
        "bus_reset",
        "system_reboot",
    ];
}

/// NVML performance policies (`nvmlPerfPolicyType_t` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationPolicy {
    Power = 0,
    Thermal = 1,
    SyncBoost = 2,
    BoardLimit = 3,
    LowUtilization = 4,
    Reliability = 5,
}

/// Why a scenario could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("scenario {path}: {message}")]
    Parse { path: String, message: String },
    #[error("scenario {path}: {message}")]
    Invalid { path: String, message: String },
}

/// Built-in scenarios, by name.
pub const BUILTIN: &[(&str, &str)] = &[
    ("default", include_str!("../scenarios/default.toml")),
    ("demo", include_str!("../scenarios/demo.toml")),
    ("big-node", include_str!("../scenarios/big-node.toml")),
    ("gb200-nvl72", include_str!("../scenarios/gb200-nvl72.toml")),
];

/// The largest scenario file read: 8 MiB, far above any written by hand or generated
/// for the soak runs, yet small enough that `--simulate=/dev/zero` fails at once.
pub const SCENARIO_LIMIT: u64 = 8 << 20;

impl Scenario {
    /// A built-in scenario (`default`, `demo`, `big-node`).
    pub fn builtin(name: &str) -> Result<Scenario, ScenarioError> {
        let (_, text) =
            BUILTIN
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| ScenarioError::Invalid {
                    path: name.into(),
                    message: format!(
                        "no built-in scenario named {name:?} (have: {})",
                        BUILTIN
                            .iter()
                            .map(|(n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })?;
        Scenario::parse_toml(text, &format!("builtin:{name}"))
    }

    /// Load a scenario from a file (`.json` is JSON, anything else TOML), or a built-in
    /// one when `path` is `builtin:NAME`.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let shown = path.display().to_string();
        if let Some(name) = shown.strip_prefix("builtin:") {
            return Scenario::builtin(name);
        }
        // Bounded, regular files only: `--simulate=/dev/zero` fails at once.
        let text = config_file::read_to_string(path, SCENARIO_LIMIT).map_err(|source| {
            ScenarioError::Read {
                path: shown.clone(),
                source,
            }
        })?;
        if path.extension().is_some_and(|e| e == "json") {
            let s: Scenario = serde_json::from_str(&text).map_err(|e| ScenarioError::Parse {
                path: shown.clone(),
                message: e.to_string(),
            })?;
            s.validate(&shown)?;
            Ok(s)
        } else {
            Scenario::parse_toml(&text, &shown)
        }
    }

    /// Parse TOML text; `origin` names it in errors.
    pub fn parse_toml(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: origin.into(),
            message: e.to_string(),
        })?;
        s.validate(origin)?;
        Ok(s)
    }

    /// Number of GPUs the scenario describes.
    pub fn gpu_count(&self) -> u32 {
        self.gpus.iter().map(|g| g.count).sum()
    }

    /// Check cross-references and ranges.
    pub fn validate(&self, origin: &str) -> Result<(), ScenarioError> {
        let bad = |message: String| ScenarioError::Invalid {
            path: origin.into(),
            message,
        };
        if self.gpus.is_empty() {
            return Err(bad("no GPUs: add at least one [[gpus]] table".into()));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            let model = models::lookup(&g.model).ok_or_else(|| {
                bad(format!(
                    "gpus[{i}]: unknown model {:?} (known: {})",
                    g.model,
                    models::MODELS
                        .iter()
                        .map(|m| m.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            g.load.check().map_err(|m| bad(format!("gpus[{i}]: {m}")))?;
            let mut slices = 0;
            for (j, m) in g.mig.iter().enumerate() {
                let p = model
                    .mig_profiles
                    .iter()
                    .find(|p| p.name == m.profile)
                    .ok_or_else(|| {
                        bad(format!(
                            "gpus[{i}].mig[{j}]: {} has no MIG profile {:?}",
                            model.name, m.profile
                        ))
                    })?;
                m.load
                    .check()
                    .map_err(|e| bad(format!("gpus[{i}].mig[{j}]: {e}")))?;
                slices += p.slices * m.count;
            }
            if slices > 7 {
                return Err(bad(format!(
                    "gpus[{i}]: MIG instances use {slices} compute slices, a GPU has 7"
                )));
            }
            let profiles: Vec<&models::MigProfile> = g
                .mig
                .iter()
                .flat_map(|m| {
                    let p = model.mig_profiles.iter().find(|p| p.name == m.profile);
                    std::iter::repeat_n(p, m.count as usize).flatten()
                })
                .collect();
            if crate::node::mig_placements(&profiles).is_none() {
                return Err(bad(format!(
                    "gpus[{i}]: the MIG instances do not fit the GPU's eight memory slices"
                )));
            }
        }
        let n = self.gpu_count();
        if !self.minor_numbers.is_empty() {
            if self.minor_numbers.len() != n as usize {
                return Err(bad(format!(
                    "minor_numbers lists {} numbers for {n} GPUs",
                    self.minor_numbers.len()
                )));
            }
            let distinct: std::collections::BTreeSet<u32> =
                self.minor_numbers.iter().copied().collect();
            if distinct.len() != self.minor_numbers.len() {
                return Err(bad("minor_numbers: a minor number is listed twice".into()));
            }
        }
        for (k, f) in self.faults.iter().enumerate() {
            let gpu = match f {
                Fault::Xid { gpu, .. }
                | Fault::GpuLost { gpu, .. }
                | Fault::Ecc { gpu, .. }
                | Fault::RetiredPages { gpu, .. }
                | Fault::RowRemap { gpu, .. }
                | Fault::PcieReplay { gpu, .. }
                | Fault::Throttle { gpu, .. }
                | Fault::Violation { gpu, .. }
                | Fault::RecoveryAction { gpu, .. }
                | Fault::EccModePending { gpu, .. }
                | Fault::NvlinkDown { gpu, .. }
                | Fault::NvlinkErrors { gpu, .. }
                | Fault::Fabric { gpu, .. } => Some(*gpu),
                _ => None,
            };
            if let Fault::RecoveryAction { action, .. } = f
                && *action as usize >= Fault::RECOVERY_ACTIONS.len()
            {
                return Err(bad(format!(
                    "faults[{k}]: recovery action {action} is not an nvmlDeviceGpuRecoveryAction_t (0..={})",
                    Fault::RECOVERY_ACTIONS.len() - 1
                )));
            }
            if let Some(gpu) = gpu
                && gpu >= n
            {
                return Err(bad(format!(
                    "faults[{k}]: GPU {gpu} does not exist (the scenario has {n})"
                )));
            }
            crate::fabric::check_fault(self, f).map_err(|m| bad(format!("faults[{k}]: {m}")))?;
        }
        crate::fabric::check_spec(self).map_err(bad)?;
        let node = crate::SimNode::new(self, std::time::SystemTime::UNIX_EPOCH);
        let mut names = std::collections::BTreeSet::new();
        for (k, pod) in self.pods.iter().enumerate() {
            if !names.insert((pod.namespace.as_str(), pod.name.as_str())) {
                return Err(bad(format!(
                    "pods[{k}]: {}/{} is listed twice",
                    pod.namespace, pod.name
                )));
            }
            for (c, container) in pod.containers.iter().enumerate() {
                for (d, device) in container.devices.iter().enumerate() {
                    node.device_id(device)
                        .map_err(|e| bad(format!("pods[{k}].containers[{c}].devices[{d}]: {e}")))?;
                }
                for (d, claim) in container.claims.iter().enumerate() {
                    node.dra_device_name(claim)
                        .map_err(|e| bad(format!("pods[{k}].containers[{c}].claims[{d}]: {e}")))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_scenarios_parse_and_validate() {
        for (name, _) in BUILTIN {
            let s = Scenario::builtin(name).expect(name);
            assert!(s.gpu_count() > 0);
        }
        assert_eq!(Scenario::builtin("default").unwrap().gpu_count(), 8);
    }

    #[test]
    fn unknown_keys_and_models_are_rejected_with_context() {
        let e = Scenario::parse_toml(
            "[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\ncuont = 2\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cuont"), "{e}");
        let e = Scenario::parse_toml("[[gpus]]\nmodel = \"GeForce 256\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown model") && e.contains("H100"), "{e}");
    }

    #[test]
    fn mig_layouts_must_fit_the_gpu() {
        let text = "[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\nmig = [{ profile = \"3g.40gb\", count = 3 }]\n";
        let e = Scenario::parse_toml(text, "t").unwrap_err().to_string();
        assert!(e.contains("9 compute slices"), "{e}");
    }

    #[test]
    fn faults_must_name_existing_gpus() {
        let text = "[[gpus]]\nmodel = \"NVIDIA L4\"\n[[faults]]\nkind = \"xid\"\nat_s = 1\ngpu = 3\ncode = 79\n";
        let e = Scenario::parse_toml(text, "t").unwrap_err().to_string();
        assert!(e.contains("GPU 3 does not exist"), "{e}");
    }

    /// A scenario path that is a device, or a file past the limit, fails at once.
    #[test]
    fn scenario_files_are_read_bounded() {
        let e = Scenario::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.toml");
        let file = std::fs::File::create(&path).expect("create");
        file.set_len(SCENARIO_LIMIT + 1).expect("grow");
        let e = Scenario::load(&path).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }
}
