//! A synthetic GPU fleet for the fleet-scale harness (tests/scale): many nodes' worth of
//! dcgm-exporter-shaped series, as `gpu-exporter` serves them, and the per-pod values
//! an adapter must answer for them (the truth), both from one model.
//!
//! Shape (node `i` of `nodes`, 8 GPUs each, `NVIDIA H100 80GB HBM3`):
//! - `i % 20 == 18`: a MIG node, every GPU split into two `3g.40gb` instances
//!   (`GPU_I_ID` 1 and 2), one single-instance pod on each;
//! - `i % 20 == 19`: a time-sliced node, every GPU shared by two pods (the exporter's
//!   per-pod `GPU_UTIL` and `FB_USED` shares plus the unlabelled remainder);
//! - otherwise whole GPUs, by `i % 4`: one 8-GPU pod; two 4-GPU pods; a 4-, a 2- and a
//!   1-GPU pod with one GPU idle; two 2-GPU pods and four 1-GPU pods.
//!
//! Pods are numbered in node order; eight consecutive pods form a workload `wNNNNN`
//! (its `app` label), in namespace `team-NN` (40 namespaces); a pod is `wNNNNN-K`,
//! container `main`.
//!
//! Families ([`FAMILIES`]): the six the adapter derives from plus six more of
//! dcgm-exporter's default counters. Series per GPU: 12 whole, 16 shared (two pods'
//! shares of two families), 21 MIG (11 device-wide, 5 per instance). Per 20 nodes
//! (160 GPUs): 2,024 series, so 1,265,000 at 100,000 GPUs (625 such blocks) and
//! 126,448 at 10,000 (62 blocks and 10 whole-GPU nodes).
//!
//! Values are a deterministic function of the device, the field and a time step, so the
//! truth at any step is computed here from the model, never from the rendered series.

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub const GPUS_PER_NODE: u32 = 8;
pub const NAMESPACES: u32 = 40;
pub const PODS_PER_WORKLOAD: u32 = 8;
/// Framebuffer of a whole GPU as NVML reports it (used + free), MiB.
pub const GPU_FB_MIB: u64 = 80_980;
/// Framebuffer of a `3g.40gb` instance (used + free), MiB.
pub const MIG_FB_MIB: u64 = 40_192;
const MODEL: &str = "NVIDIA H100 80GB HBM3";
const DRIVER: &str = "580.82.07";
const PCI: [&str; 8] = [
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
];

/// The families served, in the order the exporter serves them (the order of its
/// default counters); their HELP and TYPE are the exporter's ([`headers`]).
pub const FAMILIES: [&str; 12] = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
];

/// Each family's `# HELP` and `# TYPE` lines as gpu-exporter writes them, from its
/// own default counters (one source for both), in [`FAMILIES`] order.
fn headers() -> &'static [String; 12] {
    static HEADERS: std::sync::OnceLock<[String; 12]> = std::sync::OnceLock::new();
    HEADERS.get_or_init(|| {
        use gpu_exporter::plan::counters::{DEFAULT_COUNTERS, MetricType, plan};
        let (plan, _) = plan(DEFAULT_COUNTERS, "default-counters.csv")
            .expect("the exporter's built-in counters plan");
        FAMILIES.map(|name| {
            let m = plan
                .metrics
                .iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("{name} is not in the exporter's default counters"));
            let kind = match m.metric_type {
                MetricType::Gauge => "gauge",
                MetricType::Counter => "counter",
            };
            format!("# HELP {name} {}\n# TYPE {name} {kind}\n", m.help)
        })
    })
}

/// Families a MIG instance has (the rest are device-wide, on the physical GPU only).
const MIG_FAMILIES: [&str; 5] = [
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
];

/// What a node's GPUs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Whole GPUs; the pods' sizes in GPUs, in GPU order (the rest idle).
    Whole(&'static [u32]),
    Mig,
    Shared,
}

/// A pod of the fleet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub app: String,
}

/// How a pod holds a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Whole { gpu: u32 },
    Share { gpu: u32, replica: u32 },
    Mig { gpu: u32, instance: u32 },
}

/// The per-pod values an adapter must answer (absent: the pod has no such value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodTruth {
    pub gpu_utilization: f64,
    pub gpu_memory_used_bytes: f64,
    pub gpu_memory_utilization: f64,
    pub gpu_power_watts: Option<f64>,
    pub gpu_tensor_active: Option<f64>,
    pub devices: u32,
}

/// The fleet: `nodes` nodes of 8 GPUs, `nodes_per_group` per scrape endpoint.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub nodes: u32,
    pub nodes_per_group: u32,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A deterministic draw for (node, gpu, slot, field, step); slot 0 is the device,
/// 1.. a MIG instance or a share.
fn draw(node: u32, gpu: u32, slot: u32, field: u32, step: u64) -> u64 {
    mix(
        mix(mix(u64::from(node) << 32 | u64::from(gpu) << 16 | u64::from(slot)) ^ u64::from(field))
            ^ step,
    )
}

// Field numbers of the draws.
const F_UTIL: u32 = 1;
const F_FB: u32 = 2;
const F_POWER: u32 = 3;
const F_GR: u32 = 4;
const F_TENSOR: u32 = 5;
const F_DRAM: u32 = 6;
const F_CLOCK: u32 = 7;
const F_TEMP: u32 = 8;
const F_COPY: u32 = 9;

/// A ratio in thousandths, 0..=1.
fn ratio(node: u32, gpu: u32, slot: u32, field: u32, step: u64) -> f64 {
    (draw(node, gpu, slot, field, step) % 1001) as f64 / 1000.0
}

/// The values of one device (a whole or shared GPU, or a MIG instance) at a step.
#[derive(Debug, Clone, Copy)]
struct DeviceValues {
    util: u64,
    fb_used: u64,
    fb_free: u64,
    power: f64,
    gr: f64,
    tensor: f64,
    dram: f64,
}

impl Fleet {
    /// The fleet with `gpus` GPUs (rounded up to whole nodes).
    pub fn with_gpus(gpus: u32, nodes_per_group: u32) -> Fleet {
        Fleet {
            nodes: gpus.div_ceil(GPUS_PER_NODE).max(1),
            nodes_per_group: nodes_per_group.max(1),
        }
    }

    pub fn gpus(&self) -> u64 {
        u64::from(self.nodes) * u64::from(GPUS_PER_NODE)
    }

    pub fn groups(&self) -> u32 {
        self.nodes.div_ceil(self.nodes_per_group)
    }

    pub fn kind(node: u32) -> NodeKind {
        match node % 20 {
            18 => NodeKind::Mig,
            19 => NodeKind::Shared,
            _ => NodeKind::Whole(match node % 4 {
                0 => &[8],
                1 => &[4, 4],
                2 => &[4, 2, 1],
                _ => &[2, 2, 1, 1, 1, 1],
            }),
        }
    }

    fn pods_on(node: u32) -> u32 {
        match Fleet::kind(node) {
            NodeKind::Whole(sizes) => sizes.len() as u32,
            NodeKind::Mig | NodeKind::Shared => 2 * GPUS_PER_NODE,
        }
    }

    /// The global number of the first pod on `node` (pods are numbered in node order).
    pub fn first_pod(node: u32) -> u64 {
        // Per block of 20 nodes: 5 of each whole layout (minus what 18/19 replace) plus
        // 32 pods; counted directly over the block's remainder.
        let block = u64::from(node / 20);
        let per_block: u64 = (0..20).map(|n| u64::from(Fleet::pods_on(n))).sum();
        let head: u64 = (node / 20 * 20..node)
            .map(|n| u64::from(Fleet::pods_on(n)))
            .sum();
        block * per_block + head
    }

    pub fn pod(ordinal: u64) -> Pod {
        let workload = ordinal / u64::from(PODS_PER_WORKLOAD);
        let app = format!("w{workload:05}");
        Pod {
            namespace: format!("team-{:02}", workload % u64::from(NAMESPACES)),
            name: format!("{app}-{}", ordinal % u64::from(PODS_PER_WORKLOAD)),
            app,
        }
    }

    /// Every pod of the fleet, in order.
    pub fn pods(&self) -> Vec<Pod> {
        (0..Fleet::first_pod(self.nodes)).map(Fleet::pod).collect()
    }

    /// The pods on `node` and what each holds.
    fn holdings(node: u32) -> Vec<(Pod, Vec<Hold>)> {
        let first = Fleet::first_pod(node);
        match Fleet::kind(node) {
            NodeKind::Whole(sizes) => {
                let mut gpu = 0;
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| {
                        let holds = (gpu..gpu + n).map(|g| Hold::Whole { gpu: g }).collect();
                        gpu += n;
                        (Fleet::pod(first + i as u64), holds)
                    })
                    .collect()
            }
            NodeKind::Mig => (0..2 * GPUS_PER_NODE)
                .map(|i| {
                    let hold = Hold::Mig {
                        gpu: i / 2,
                        instance: i % 2 + 1,
                    };
                    (Fleet::pod(first + u64::from(i)), vec![hold])
                })
                .collect(),
            NodeKind::Shared => (0..2 * GPUS_PER_NODE)
                .map(|i| {
                    let hold = Hold::Share {
                        gpu: i / 2,
                        replica: i % 2,
                    };
                    (Fleet::pod(first + u64::from(i)), vec![hold])
                })
                .collect(),
        }
    }

    /// A whole GPU's values (also the device-wide values of a shared or MIG GPU).
    fn device(node: u32, gpu: u32, step: u64) -> DeviceValues {
        let fb_used = 1024 + draw(node, gpu, 0, F_FB, step) % 78_000;
        DeviceValues {
            util: draw(node, gpu, 0, F_UTIL, step) % 101,
            fb_used,
            fb_free: GPU_FB_MIB - fb_used,
            power: (60_000 + draw(node, gpu, 0, F_POWER, step) % 640_000) as f64 / 1000.0,
            gr: ratio(node, gpu, 0, F_GR, step),
            tensor: ratio(node, gpu, 0, F_TENSOR, step),
            dram: ratio(node, gpu, 0, F_DRAM, step),
        }
    }

    /// A MIG instance's values (slot = instance id).
    fn instance(node: u32, gpu: u32, instance: u32, step: u64) -> DeviceValues {
        let fb_used = 512 + draw(node, gpu, instance, F_FB, step) % 39_000;
        DeviceValues {
            util: 0,
            fb_used,
            fb_free: MIG_FB_MIB - fb_used,
            power: 0.0,
            gr: ratio(node, gpu, instance, F_GR, step),
            tensor: ratio(node, gpu, instance, F_TENSOR, step),
            dram: ratio(node, gpu, instance, F_DRAM, step),
        }
    }

    /// A share of a time-sliced GPU (replica 0 or 1): its utilisation and memory; the
    /// remainder is slot 3.
    fn share(node: u32, gpu: u32, slot: u32, step: u64) -> (u64, u64) {
        (
            draw(node, gpu, slot + 1, F_UTIL, step) % 50,
            draw(node, gpu, slot + 1, F_FB, step) % 25_000,
        )
    }

    /// The truth at `step`: every pod's values, as the adapter's derivation defines
    /// them (mean of percentages, sum of bytes and watts over the pod's devices; power
    /// only on whole GPUs; utilisation of a MIG instance is its GR engine activity).
    pub fn truth(&self, step: u64) -> BTreeMap<Pod, PodTruth> {
        let mut out = BTreeMap::new();
        for node in 0..self.nodes {
            for (pod, holds) in Fleet::holdings(node) {
                let mut util = Vec::new();
                let mut mem_util = Vec::new();
                let mut tensor = Vec::new();
                let mut power = Vec::new();
                let mut used = 0.0;
                for hold in &holds {
                    match *hold {
                        Hold::Whole { gpu } => {
                            let d = Fleet::device(node, gpu, step);
                            util.push(d.util as f64);
                            used += d.fb_used as f64 * 1_048_576.0;
                            mem_util.push(d.fb_used as f64 / GPU_FB_MIB as f64 * 100.0);
                            power.push(d.power);
                            tensor.push(d.tensor * 100.0);
                        }
                        Hold::Share { gpu, replica } => {
                            let (u, m) = Fleet::share(node, gpu, replica, step);
                            util.push(u as f64);
                            used += m as f64 * 1_048_576.0;
                            // The device's capacity: every FB_USED series (both shares,
                            // the remainder) plus FB_FREE, which is the GPU's framebuffer.
                            mem_util.push(m as f64 / GPU_FB_MIB as f64 * 100.0);
                        }
                        Hold::Mig { gpu, instance } => {
                            let d = Fleet::instance(node, gpu, instance, step);
                            util.push(d.gr * 100.0);
                            used += d.fb_used as f64 * 1_048_576.0;
                            mem_util.push(d.fb_used as f64 / MIG_FB_MIB as f64 * 100.0);
                            tensor.push(d.tensor * 100.0);
                        }
                    }
                }
                let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
                out.insert(
                    pod,
                    PodTruth {
                        gpu_utilization: mean(&util),
                        gpu_memory_used_bytes: used,
                        gpu_memory_utilization: mean(&mem_util),
                        gpu_power_watts: (!power.is_empty()).then(|| power.iter().sum()),
                        gpu_tensor_active: (!tensor.is_empty()).then(|| mean(&tensor)),
                        devices: holds.len() as u32,
                    },
                );
            }
        }
        out
    }

    /// Node `node`'s series at `step`, appended family by family to `out[family]`.
    fn render_node(node: u32, step: u64, out: &mut [String; 12]) {
        let host = format!("fleet-node-{node:05}");
        let holdings = Fleet::holdings(node);
        let holder = |gpu: u32| {
            holdings
                .iter()
                .find(|(_, h)| h.contains(&Hold::Whole { gpu }))
                .map(|(p, _)| p)
        };
        for gpu in 0..GPUS_PER_NODE {
            let uuid = {
                let h = mix(u64::from(node) << 8 | u64::from(gpu));
                let l = mix(h);
                format!(
                    "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                    h >> 32,
                    (h >> 16) & 0xffff,
                    h & 0xffff,
                    l >> 48,
                    l & 0xffff_ffff_ffff
                )
            };
            let device = format!(
                "gpu=\"{gpu}\",UUID=\"{uuid}\",pci_bus_id=\"{}\",device=\"nvidia{gpu}\",modelName=\"{MODEL}\"",
                PCI[gpu as usize]
            );
            let tail = format!("Hostname=\"{host}\",DCGM_FI_DRIVER_VERSION=\"{DRIVER}\"");
            let pod_labels = |p: &Pod| {
                format!(
                    ",app=\"{}\",container=\"main\",namespace=\"{}\",pod=\"{}\"",
                    p.app, p.namespace, p.name
                )
            };
            let kind = Fleet::kind(node);
            let d = Fleet::device(node, gpu, step);
            // Device-wide labels: the pod's on a whole GPU held by one, none otherwise.
            let whole_pod = holder(gpu).map(pod_labels).unwrap_or_default();
            let dev = format!("{device},{tail}{whole_pod}");
            // A counter: it only grows with the step.
            let energy = (u64::from(node) * 8 + u64::from(gpu)) * 1_000_000_000 + step * 450_000;
            let shared = kind == NodeKind::Shared;
            let mig = kind == NodeKind::Mig;
            // Shares of a time-sliced GPU and the remainder.
            let shares: Vec<(String, u64, u64)> = if shared {
                (0..2)
                    .map(|r| {
                        let (pod, _) = &holdings[(gpu * 2 + r) as usize];
                        let (u, m) = Fleet::share(node, gpu, r, step);
                        (pod_labels(pod), u, m)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let (rest_util, rest_fb) = Fleet::share(node, gpu, 2, step);
            let fb_used_total: u64 = shares.iter().map(|s| s.2).sum::<u64>() + rest_fb;
            let line = |out: &mut String, labels: &str, value: &str| {
                let _ = writeln!(out, "{{{labels}}} {value}");
            };
            for (i, name) in FAMILIES.iter().enumerate() {
                let o = &mut out[i];
                let mut put = |labels: &str, value: String| {
                    o.push_str(name);
                    line(o, labels, &value);
                };
                match *name {
                    "DCGM_FI_DEV_SM_CLOCK" => put(
                        &dev,
                        (1980 - draw(node, gpu, 0, F_CLOCK, step) % 600).to_string(),
                    ),
                    "DCGM_FI_DEV_MEM_CLOCK" => put(&dev, "2619".into()),
                    "DCGM_FI_DEV_GPU_TEMP" => put(
                        &dev,
                        (30 + draw(node, gpu, 0, F_TEMP, step) % 50).to_string(),
                    ),
                    "DCGM_FI_DEV_POWER_USAGE" => put(&dev, format!("{:.6}", d.power)),
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => put(&dev, energy.to_string()),
                    "DCGM_FI_DEV_GPU_UTIL" if mig => {}
                    "DCGM_FI_DEV_GPU_UTIL" if shared => {
                        for (labels, u, _) in &shares {
                            put(&format!("{device},{tail}{labels}"), u.to_string());
                        }
                        put(&dev, rest_util.to_string());
                    }
                    "DCGM_FI_DEV_GPU_UTIL" => put(&dev, d.util.to_string()),
                    "DCGM_FI_DEV_MEM_COPY_UTIL" => {
                        put(&dev, (draw(node, gpu, 0, F_COPY, step) % 101).to_string())
                    }
                    "DCGM_FI_DEV_FB_FREE" if shared => {
                        put(&dev, (GPU_FB_MIB - fb_used_total).to_string())
                    }
                    "DCGM_FI_DEV_FB_FREE" if mig => put(&dev, "76884".into()),
                    "DCGM_FI_DEV_FB_FREE" => put(&dev, d.fb_free.to_string()),
                    "DCGM_FI_DEV_FB_USED" if shared => {
                        for (labels, _, m) in &shares {
                            put(&format!("{device},{tail}{labels}"), m.to_string());
                        }
                        put(&dev, rest_fb.to_string());
                    }
                    "DCGM_FI_DEV_FB_USED" if mig => put(&dev, "4096".into()),
                    "DCGM_FI_DEV_FB_USED" => put(&dev, d.fb_used.to_string()),
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => put(&dev, format!("{:.6}", d.gr)),
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => put(&dev, format!("{:.6}", d.tensor)),
                    "DCGM_FI_PROF_DRAM_ACTIVE" => put(&dev, format!("{:.6}", d.dram)),
                    _ => {}
                }
                if mig && MIG_FAMILIES.contains(name) {
                    for instance in 1..=2 {
                        let (pod, _) = &holdings[(gpu * 2 + instance - 1) as usize];
                        let v = Fleet::instance(node, gpu, instance, step);
                        let labels = format!(
                            "{device},GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"{instance}\",{tail}{}",
                            pod_labels(pod)
                        );
                        let value = match *name {
                            "DCGM_FI_DEV_FB_FREE" => v.fb_free.to_string(),
                            "DCGM_FI_DEV_FB_USED" => v.fb_used.to_string(),
                            "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => format!("{:.6}", v.gr),
                            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => format!("{:.6}", v.tensor),
                            _ => format!("{:.6}", v.dram),
                        };
                        put(&labels, value);
                    }
                }
            }
        }
    }

    /// The text exposition of endpoint `group` (its nodes) at `step`, as the exporter
    /// serves it: each family's HELP and TYPE, then its series.
    pub fn render_group(&self, group: u32, step: u64) -> String {
        let first = group.saturating_mul(self.nodes_per_group);
        let last = first.saturating_add(self.nodes_per_group).min(self.nodes);
        let mut families: [String; 12] = Default::default();
        for node in first..last {
            Fleet::render_node(node, step, &mut families);
        }
        let mut out = String::with_capacity(families.iter().map(String::len).sum::<usize>() + 2048);
        for (header, body) in headers().iter().zip(&families) {
            out.push_str(header);
            out.push_str(body);
        }
        out
    }

    /// Series of the whole fleet (what the shards hold together).
    pub fn series(&self) -> u64 {
        (0..self.nodes)
            .map(|n| match Fleet::kind(n) {
                NodeKind::Whole(_) => 12 * 8,
                NodeKind::Shared => 16 * 8,
                NodeKind::Mig => 21 * 8,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_is_what_the_module_documents() {
        let f = Fleet::with_gpus(10_000, 50);
        assert_eq!(f.nodes, 1250);
        assert_eq!(f.series(), 126_448);
        assert_eq!(Fleet::with_gpus(100_000, 50).series(), 1_265_000);
        let rendered: usize = (0..f.groups())
            .map(|g| {
                f.render_group(g, 3)
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .count()
            })
            .sum();
        assert_eq!(rendered as u64, f.series(), "every series rendered once");
        let pods = f.pods();
        assert_eq!(pods.len(), f.truth(0).len(), "every pod has a truth");
        let unique: std::collections::BTreeSet<_> = pods.iter().collect();
        assert_eq!(unique.len(), pods.len(), "pod names are unique");
    }

    #[test]
    fn values_move_between_steps() {
        let f = Fleet::with_gpus(160, 20);
        let (a, b) = (f.truth(1), f.truth(2));
        let moved = a
            .iter()
            .filter(|(p, t)| b[*p].gpu_utilization != t.gpu_utilization)
            .count();
        assert!(moved * 10 > a.len() * 8, "{moved} of {} moved", a.len());
    }

    /// The rendered series and the truth agree, derived here the way the adapter's
    /// documentation defines it, for one pod of each kind.
    #[test]
    fn the_truth_matches_the_rendered_series() {
        let f = Fleet::with_gpus(160, 20);
        let body = f.render_group(0, 7);
        let truth = f.truth(7);
        let value = |name: &str, pod: &Pod, extra: &str| -> Vec<f64> {
            body.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .filter(|l| l.contains(&format!("pod=\"{}\"", pod.name)))
                .filter(|l| l.contains(&format!("namespace=\"{}\"", pod.namespace)))
                .filter(|l| l.contains(extra))
                .map(|l| l.rsplit_once(' ').expect("value").1.parse().expect("f64"))
                .collect()
        };
        // Node 0: one 8-GPU pod.
        let p = Fleet::pod(0);
        let t = &truth[&p];
        let util = value("DCGM_FI_DEV_GPU_UTIL", &p, "");
        assert_eq!(util.len(), 8);
        assert!((util.iter().sum::<f64>() / 8.0 - t.gpu_utilization).abs() < 1e-9);
        let power: f64 = value("DCGM_FI_DEV_POWER_USAGE", &p, "").iter().sum();
        assert!((power - t.gpu_power_watts.expect("power")).abs() < 1e-6);
        // Node 18 is MIG, node 19 shared: their first pods.
        let mig = Fleet::pod(Fleet::first_pod(18));
        let gr = value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &mig, "GPU_I_ID=\"1\"");
        assert_eq!(gr.len(), 1);
        assert!((gr[0] * 100.0 - truth[&mig].gpu_utilization).abs() < 1e-9);
        assert_eq!(truth[&mig].gpu_power_watts, None);
        let shared = Fleet::pod(Fleet::first_pod(19));
        let fb = value("DCGM_FI_DEV_FB_USED", &shared, "");
        assert_eq!(fb.len(), 1);
        assert_eq!(fb[0] * 1_048_576.0, truth[&shared].gpu_memory_used_bytes);
        assert_eq!(value("DCGM_FI_DEV_POWER_USAGE", &shared, "").len(), 0);
        // A shared GPU's capacity is its framebuffer: every FB_USED plus FB_FREE.
        let uuid_line = body
            .lines()
            .find(|l| l.contains(&format!("pod=\"{}\"", shared.name)))
            .expect("a series of the shared pod");
        let uuid = uuid_line
            .split("UUID=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .expect("UUID");
        let cap: f64 = body
            .lines()
            .filter(|l| {
                (l.starts_with("DCGM_FI_DEV_FB_USED{") || l.starts_with("DCGM_FI_DEV_FB_FREE{"))
                    && l.contains(uuid)
            })
            .map(|l| {
                l.rsplit_once(' ')
                    .expect("v")
                    .1
                    .parse::<f64>()
                    .expect("f64")
            })
            .sum();
        assert_eq!(cap, GPU_FB_MIB as f64);
    }
}
