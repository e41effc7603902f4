//! NVLink link state, per-link error counters and the GPU's NVLink fabric registration
//! (what `nvmlDeviceGetGpuFabricInfoV` reports on NVSwitch systems such as GB200
//! NVL72): all links up, no errors and a completed, healthy registration unless the
//! scenario's faults say otherwise.

use crate::node::in_window;
use crate::scenario::{Fault, Scenario};
use crate::{SimNode, models};
use serde::{Deserialize, Serialize};

/// `nvmlDeviceArchitecture_t` of Hopper and Blackwell.
const HOPPER: u32 = 9;
const BLACKWELL: u32 = 10;

/// The fabric a rack's GPUs are registered in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    /// The cluster UUID the fabric manager assigns (`8-4-4-4-12` hex).
    pub cluster_uuid: String,
    /// The NVLink clique (partition) the node's GPUs belong to.
    pub clique_id: u32,
}

/// `nvmlGpuFabricState_t`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricState {
    NotStarted,
    InProgress,
    #[default]
    Completed,
}

impl FabricState {
    /// The `NVML_GPU_FABRIC_STATE_*` value.
    pub fn nvml(self) -> u8 {
        match self {
            FabricState::NotStarted => 1,
            FabricState::InProgress => 2,
            FabricState::Completed => 3,
        }
    }
}

/// What a GPU's fabric registration reports at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricReading {
    pub cluster_uuid: [u8; 16],
    pub clique_id: u32,
    pub state: FabricState,
    /// `nvmlReturn_t` of the registration.
    pub status: u32,
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` bits.
    pub health_mask: u32,
    /// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*` (v3 of the struct).
    pub health_summary: u32,
}

/// Health-mask fields: (shift, width mask) of degraded bandwidth, route recovery,
/// route unhealthy, access-timeout recovery (each 0 not supported, 1 true, 2 false),
/// then incorrect configuration (0 not supported, 1 none, 2+ a reason).
const MASK_FLAGS: [u32; 4] = [0, 2, 4, 6];
const MASK_CONFIG_SHIFT: u32 = 8;

/// The mask of a healthy registration: Blackwell reports every check as "false" and the
/// configuration as correct; Hopper reports none of them (all "not supported").
pub fn healthy_mask(architecture: u32) -> u32 {
    if architecture >= BLACKWELL {
        MASK_FLAGS.iter().map(|s| 2 << s).sum::<u32>() | (1 << MASK_CONFIG_SHIFT)
    } else {
        0
    }
}

/// The v3 health summary NVML derives from the mask: not supported (0) when the mask
/// reports nothing, unhealthy (2) for an unhealthy route, a pending recovery or a
/// wrong configuration, limited capacity (3) for degraded bandwidth alone, else
/// healthy (1).
pub fn health_summary(mask: u32) -> u32 {
    if mask == 0 {
        return 0;
    }
    let flag = |shift: u32| (mask >> shift) & 0x3;
    let config = (mask >> MASK_CONFIG_SHIFT) & 0x7FFF;
    if flag(2) == 1 || flag(4) == 1 || flag(6) == 1 || config >= 2 {
        2
    } else if flag(0) == 1 {
        3
    } else {
        1
    }
}

/// Parse `8-4-4-4-12` hex into 16 bytes.
fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || s.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A link fault's counts: [CRC flit, CRC data, replay, recovery].
pub(crate) fn link_error_counts(f: &Fault) -> [u64; 4] {
    match *f {
        Fault::NvlinkErrors {
            crc_flit,
            crc_data,
            replay,
            recovery,
            ..
        } => [crc_flit, crc_data, replay, recovery],
        _ => [0; 4],
    }
}

/// The fabric table's cluster UUID parses.
pub(crate) fn check_spec(s: &Scenario) -> Result<(), String> {
    match &s.fabric {
        Some(spec) if parse_uuid(&spec.cluster_uuid).is_none() => Err(format!(
            "fabric.cluster_uuid {:?} is not a UUID",
            spec.cluster_uuid
        )),
        _ => Ok(()),
    }
}

/// Scenario checks of the NVLink and fabric faults: the link exists, the GPU has a
/// fabric.
pub(crate) fn check_fault(s: &Scenario, f: &Fault) -> Result<(), String> {
    let model = |gpu: u32| {
        let mut left = gpu;
        s.gpus.iter().find_map(|g| {
            if left < g.count {
                models::lookup(&g.model)
            } else {
                left -= g.count;
                None
            }
        })
    };
    match *f {
        Fault::NvlinkDown { gpu, link, .. } | Fault::NvlinkErrors { gpu, link, .. } => {
            let links = model(gpu).map_or(0, |m| m.nvlink_links);
            if link >= links {
                return Err(format!("GPU {gpu} has no NVLink {link} (it has {links})"));
            }
        }
        Fault::Fabric { gpu, .. } => {
            let m = model(gpu);
            if !m.is_some_and(|m| m.nvlink_links > 0 && m.architecture >= HOPPER) {
                return Err(format!(
                    "GPU {gpu} has no NVLink fabric (Hopper or newer with NVLink)"
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

impl SimNode {
    /// Whether `link` of `gpu` is active at `t`.
    pub fn nvlink_active(&self, gpu: u32, link: u32, t: f64) -> bool {
        !self.faults.iter().any(|f| {
            matches!(*f, Fault::NvlinkDown { from_s, until_s, gpu: g, link: l }
                if g == gpu && l == link && in_window(t, from_s, until_s))
        })
    }

    /// Active links of `gpu` at `t`.
    pub fn nvlinks_active(&self, gpu: u32, t: f64) -> u32 {
        let links = self.gpus[gpu as usize].model.nvlink_links;
        (0..links)
            .filter(|l| self.nvlink_active(gpu, *l, t))
            .count() as u32
    }

    /// One link's error counters at `t`: [CRC flit, CRC data, replay, recovery].
    pub fn nvlink_link_errors(&self, gpu: u32, link: u32, t: f64) -> [u64; 4] {
        let mut out = [0; 4];
        for f in &self.faults {
            if let Fault::NvlinkErrors {
                at_s,
                gpu: g,
                link: l,
                ..
            } = *f
                && g == gpu
                && l == link
                && at_s <= t
            {
                for (o, n) in out.iter_mut().zip(link_error_counts(f)) {
                    *o += n;
                }
            }
        }
        out
    }

    /// The GPU's fabric registration at `t`: the last fabric fault in force, else a
    /// completed, healthy one.
    pub fn fabric(&self, gpu: u32, t: f64) -> FabricReading {
        let arch = self.gpus[gpu as usize].model.architecture;
        let (cluster_uuid, clique_id) = self
            .fabric
            .as_ref()
            .map(|s| (parse_uuid(&s.cluster_uuid).unwrap_or_default(), s.clique_id))
            .unwrap_or_default();
        let mut r = FabricReading {
            cluster_uuid,
            clique_id,
            state: FabricState::Completed,
            status: 0,
            health_mask: healthy_mask(arch),
            health_summary: 0,
        };
        for f in &self.faults {
            if let Fault::Fabric {
                from_s,
                until_s,
                gpu: g,
                state,
                status,
                health_mask,
            } = *f
                && g == gpu
                && in_window(t, from_s, until_s)
            {
                r.state = state;
                r.status = status;
                r.health_mask = health_mask.unwrap_or_else(|| healthy_mask(arch));
            }
        }
        r.health_summary = health_summary(r.health_mask);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(faults: &str) -> SimNode {
        let text = format!(
            "[[gpus]]\ncount = 2\nmodel = \"NVIDIA GB200\"\n[fabric]\ncluster_uuid = \"0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9\"\nclique_id = 7\n{faults}"
        );
        let s = Scenario::parse_toml(&text, "t").expect("scenario");
        SimNode::new(&s, std::time::SystemTime::UNIX_EPOCH)
    }

    #[test]
    fn a_link_goes_down_in_its_window_only() {
        let n = node(
            "[[faults]]\nkind = \"nvlink_down\"\nfrom_s = 10\nuntil_s = 20\ngpu = 1\nlink = 3\n",
        );
        assert!(n.nvlink_active(1, 3, 9.0));
        assert!(!n.nvlink_active(1, 3, 10.0));
        assert!(n.nvlink_active(1, 3, 20.0));
        assert!(n.nvlink_active(0, 3, 15.0) && n.nvlink_active(1, 4, 15.0));
        assert_eq!(n.nvlinks_active(1, 15.0), 17);
    }

    #[test]
    fn link_errors_add_up_to_the_gpu_totals() {
        let n = node(
            "[[faults]]\nkind = \"nvlink_errors\"\nat_s = 5\ngpu = 0\nlink = 2\nreplay = 4\n\
             [[faults]]\nkind = \"nvlink_errors\"\nat_s = 6\ngpu = 0\nlink = 9\nreplay = 1\ncrc_flit = 3\n",
        );
        assert_eq!(n.nvlink_link_errors(0, 2, 4.0), [0; 4]);
        assert_eq!(n.nvlink_link_errors(0, 2, 7.0), [0, 0, 4, 0]);
        let sum = (0..18).fold([0u64; 4], |mut acc, l| {
            for (a, v) in acc.iter_mut().zip(n.nvlink_link_errors(0, l, 7.0)) {
                *a += v;
            }
            acc
        });
        assert_eq!(sum, n.gpu_reading(0, 7.0).nvlink_errors);
        assert_eq!(sum, [3, 0, 5, 0]);
    }

    #[test]
    fn the_fabric_is_healthy_until_a_fault_and_the_summary_follows_the_mask() {
        // Route unhealthy: bits 4-5 say "true".
        let unhealthy = healthy_mask(BLACKWELL) & !(0x3 << 4) | (1 << 4);
        let n = node(&format!(
            "[[faults]]\nkind = \"fabric\"\nfrom_s = 30\ngpu = 1\nhealth_mask = {unhealthy}\n"
        ));
        let ok = n.fabric(1, 0.0);
        assert_eq!(
            (ok.state, ok.status, ok.clique_id),
            (FabricState::Completed, 0, 7)
        );
        assert_eq!(ok.cluster_uuid[0], 0x0a);
        assert_eq!(ok.cluster_uuid[15], 0xf9);
        assert_eq!(ok.health_summary, 1);
        let bad = n.fabric(1, 31.0);
        assert_eq!((bad.health_mask, bad.health_summary), (unhealthy, 2));
        assert_eq!(n.fabric(0, 31.0).health_summary, 1);
        // Degraded bandwidth alone is limited capacity; Hopper reports no checks.
        let degraded = healthy_mask(BLACKWELL) & !0x3 | 1;
        assert_eq!(health_summary(degraded), 3);
        assert_eq!(health_summary(healthy_mask(HOPPER)), 0);
    }

    #[test]
    fn faults_on_missing_links_or_fabrics_are_rejected() {
        let e = Scenario::parse_toml(
            "[[gpus]]\nmodel = \"NVIDIA GB200\"\n[[faults]]\nkind = \"nvlink_down\"\nfrom_s = 0\ngpu = 0\nlink = 18\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no NVLink 18"), "{e}");
        let e = Scenario::parse_toml(
            "[[gpus]]\nmodel = \"NVIDIA L4\"\n[[faults]]\nkind = \"fabric\"\nfrom_s = 0\ngpu = 0\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no NVLink fabric"), "{e}");
        let e = Scenario::parse_toml(
            "[[gpus]]\nmodel = \"NVIDIA GB200\"\n[fabric]\ncluster_uuid = \"nope\"\nclique_id = 1\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a UUID"), "{e}");
    }
}
