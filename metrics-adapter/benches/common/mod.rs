//! Shared by the adapter's benchmarks: gpu-exporter scrape bodies in the Prometheus
//! protobuf exposition (length-delimited `MetricFamily` messages), shaped as the
//! exporter serves them with its default counters, and a small deterministic RNG.

#![allow(dead_code)]

use gpu_metrics_adapter::source::exposition::proto::{
    Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType,
};
use prost::Message;

/// What the exporter answers a protobuf scrape with.
pub const CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// The exporter's default counters (`default-counters.csv`, less the driver-version
/// label): 25 families, 6 of which the adapter reads.
pub const FAMILIES: [(&str, bool, &str); 25] = [
    (
        "DCGM_FI_DEV_SM_CLOCK",
        false,
        "SM clock frequency (in MHz).",
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        false,
        "Memory clock frequency (in MHz).",
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        false,
        "Memory temperature (in C).",
    ),
    ("DCGM_FI_DEV_GPU_TEMP", false, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", false, "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        true,
        "Total energy consumption since boot (in mJ).",
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        true,
        "Total number of PCIe retries.",
    ),
    ("DCGM_FI_DEV_GPU_UTIL", false, "GPU utilization (in %)."),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        false,
        "Memory utilization (in %).",
    ),
    ("DCGM_FI_DEV_ENC_UTIL", false, "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", false, "Decoder utilization (in %)."),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        false,
        "Value of the last XID error encountered.",
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        false,
        "Framebuffer memory free (in MiB).",
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        false,
        "Framebuffer memory used (in MiB).",
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        false,
        "Framebuffer memory reserved (in MiB).",
    ),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        true,
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    (
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        false,
        "vGPU License status",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        true,
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        true,
        "Number of remapped rows for correctable errors",
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        false,
        "Whether remapping of rows has failed",
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        false,
        "Ratio of time the graphics engine is active.",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        false,
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        false,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        false,
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        false,
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
];

/// Framebuffer of the simulated GPU (an H100 80GB), MiB.
pub const FB_TOTAL_MIB: f64 = 81_559.0;

/// The pod holding a GPU whole.
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    pub app: String,
}

/// One GPU of a node, with what the exporter labels its series with.
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub holder: Option<Holder>,
}

impl Gpu {
    pub fn new(node: usize, index: u32, holder: Option<Holder>) -> Gpu {
        let n = node as u64 * 8 + u64::from(index);
        Gpu {
            index,
            uuid: format!(
                "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                (n.wrapping_mul(2_654_435_761)) as u32,
                n & 0xffff,
                (n >> 16) & 0xffff,
                0x4a00 | index,
                n.wrapping_mul(0x9e37_79b9_7f4a_7c15) & 0xffff_ffff_ffff
            ),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index * 0x10),
            holder,
        }
    }
}

/// The values a GPU's six adapter-relevant families carry.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub util: f64,
    pub fb_used_mib: f64,
    pub power_watts: f64,
    pub gr_active: f64,
    pub tensor_active: f64,
}

impl Reading {
    /// A plausible reading, varying deterministically with `seed`.
    pub fn varied(seed: u64) -> Reading {
        let mut r = Rng(seed.wrapping_add(0x5eed));
        let util = (r.next() % 101) as f64;
        Reading {
            util,
            fb_used_mib: (1024 + r.next() % 79_000) as f64,
            power_watts: 80.0 + (r.next() % 6200) as f64 / 10.0,
            gr_active: util / 100.0 * 0.97,
            tensor_active: (r.next() % 1000) as f64 / 1000.0,
        }
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    LabelPair {
        name: Some(name.to_string()),
        value: Some(value.to_string()),
    }
}

/// One exporter's scrape body: every family, one series per GPU, labels in the
/// exporter's order (device labels, `Hostname`, driver version, then the holding pod's
/// labels and `container`, `namespace`, `pod`).
pub fn exporter_body(hostname: &str, gpus: &[Gpu], reading: impl Fn(&Gpu) -> Reading) -> Vec<u8> {
    let labels: Vec<Vec<LabelPair>> = gpus
        .iter()
        .map(|g| {
            let mut l = vec![
                label("gpu", &g.index.to_string()),
                label("UUID", &g.uuid),
                label("pci_bus_id", &g.pci_bus_id),
                label("device", &format!("nvidia{}", g.index)),
                label("modelName", "NVIDIA H100 80GB HBM3"),
                label("Hostname", hostname),
                label("DCGM_FI_DRIVER_VERSION", "550.54.15"),
            ];
            if let Some(h) = &g.holder {
                l.push(label("app", &h.app));
                l.push(label("container", "main"));
                l.push(label("namespace", &h.namespace));
                l.push(label("pod", &h.pod));
            }
            l
        })
        .collect();
    let readings: Vec<Reading> = gpus.iter().map(&reading).collect();
    let mut out = Vec::with_capacity(64 * 1024);
    for (name, counter, help) in FAMILIES {
        let metric = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let r = readings[i];
                let value = match name {
                    "DCGM_FI_DEV_GPU_UTIL" => r.util,
                    "DCGM_FI_DEV_FB_USED" => r.fb_used_mib,
                    "DCGM_FI_DEV_FB_FREE" => FB_TOTAL_MIB - r.fb_used_mib - 502.0,
                    "DCGM_FI_DEV_FB_RESERVED" => 502.0,
                    "DCGM_FI_DEV_POWER_USAGE" => r.power_watts,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => r.gr_active,
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => r.tensor_active,
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => 8.1e9 + f64::from(g.index) * 1e6,
                    "DCGM_FI_DEV_SM_CLOCK" => 1980.0,
                    "DCGM_FI_DEV_MEM_CLOCK" => 2619.0,
                    "DCGM_FI_DEV_GPU_TEMP" | "DCGM_FI_DEV_MEMORY_TEMP" => 41.0 + r.util / 4.0,
                    "DCGM_FI_PROF_PCIE_TX_BYTES" | "DCGM_FI_PROF_PCIE_RX_BYTES" => {
                        1.2e8 + r.util * 1e6
                    }
                    "DCGM_FI_PROF_DRAM_ACTIVE" => r.gr_active * 0.6,
                    _ => 0.0,
                };
                Metric {
                    label: labels[i].clone(),
                    gauge: (!counter).then_some(Gauge { value: Some(value) }),
                    counter: counter.then(|| Counter {
                        value: Some(value),
                        ..Counter::default()
                    }),
                    ..Metric::default()
                }
            })
            .collect();
        let family = MetricFamily {
            name: Some(name.to_string()),
            help: Some(help.to_string()),
            r#type: Some(if counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            } as i32),
            metric,
            ..MetricFamily::default()
        };
        family
            .encode_length_delimited(&mut out)
            .expect("a Vec grows");
    }
    out
}

/// splitmix64: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Percentile (nearest rank) of sorted values.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// "nproc, CPU model" of this machine.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores (nproc), {model}")
}
