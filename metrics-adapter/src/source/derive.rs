//! From one exporter scrape to per-pod GPU values.
//!
//! The exporter labels a device's series with the pod holding it (whole GPU or MIG
//! instance), and splits a shared GPU's utilisation and memory into one series per pod
//! plus an unlabelled remainder. So a pod's value is read from the series that carry
//! its `namespace` and `pod` labels, and never from another pod's or the device's.
//!
//! Per device the pod holds:
//! - `gpu_utilization`: `DCGM_FI_DEV_GPU_UTIL`; on MIG, where NVML has none,
//!   `DCGM_FI_PROF_GR_ENGINE_ACTIVE × 100`;
//! - `gpu_memory_used_bytes`: `DCGM_FI_DEV_FB_USED` (MiB) × 2^20;
//! - `gpu_memory_utilization`: the pod's used memory over the device's capacity (every
//!   `FB_USED` series of the device, the pods' shares and the remainder, plus `FB_FREE`);
//! - `gpu_power_watts`: `DCGM_FI_DEV_POWER_USAGE`, only on devices held whole (power is
//!   never split, so a shared GPU's power is nobody's);
//! - `gpu_tensor_active`: `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE × 100`.
//!
//! A pod holding several devices gets the mean of the percentages and the sum of
//! bytes and watts.
//!
//! Every field read here is a level, a ratio or a count, never below 0: a sample that
//! is negative or not a finite number is skipped. A value whose arithmetic overflows
//! (two GPUs at 1e308 W summed, MiB scaled to bytes) is no value for that pod, never
//! ±Inf: the pod is then missing that metric, as if the exporter had not sent it.

use crate::fleet::{GpuMetric, PodKey, PodValues};
use std::collections::{BTreeMap, HashMap};

/// The exporter families the per-pod values are derived from: what the direct source
/// keeps of a scrape, and what the Prometheus source queries.
pub const FAMILIES: [&str; 6] = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
];

/// The labels the derivation reads: what the exporters' decoders keep of a series.
pub const LABELS: [&str; 4] = ["UUID", "GPU_I_ID", "namespace", "pod"];

/// A decoded answer: its series, and how many it refused for carrying more than
/// [`super::limits::MAX_LABELS_PER_SERIES`] labels (the rest are kept).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Decoded {
    pub series: Vec<Series>,
    pub over_labels: u64,
    /// Samples dropped as exact duplicates of one already kept (same name, same full
    /// label set, including labels the decoder does not keep).
    pub duplicates: u64,
}

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// Label pairs in exposition order.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Series {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A device: its UUID and, on MIG, its GPU instance.
type DeviceKey = (String, String);

fn device_of(s: &Series) -> Option<DeviceKey> {
    Some((
        s.label("UUID")?.to_string(),
        s.label("GPU_I_ID").unwrap_or("").to_string(),
    ))
}

fn pod_of(s: &Series) -> Option<PodKey> {
    Some((
        s.label("namespace")?.to_string(),
        s.label("pod")?.to_string(),
    ))
}

/// Per-pod values from one scrape's series.
pub fn pod_values(series: &[Series]) -> HashMap<PodKey, PodValues> {
    // Device capacity, MiB: every FB_USED series of the device plus its FB_FREE.
    let mut capacity: HashMap<DeviceKey, f64> = HashMap::new();
    // (pod, device) → metric → value.
    let mut held: BTreeMap<(PodKey, DeviceKey), BTreeMap<&'static str, f64>> = BTreeMap::new();
    for s in series {
        let Some(device) = device_of(s) else { continue };
        if !s.value.is_finite() || s.value < 0.0 {
            continue;
        }
        match s.name.as_str() {
            "DCGM_FI_DEV_FB_USED" | "DCGM_FI_DEV_FB_FREE" => {
                *capacity.entry(device.clone()).or_default() += s.value;
            }
            _ => {}
        }
        let field = match s.name.as_str() {
            "DCGM_FI_DEV_GPU_UTIL" => "util",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => "gr",
            "DCGM_FI_DEV_FB_USED" => "fb_used",
            "DCGM_FI_DEV_POWER_USAGE" => "power",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => "tensor",
            _ => continue,
        };
        if let Some(pod) = pod_of(s) {
            held.entry((pod, device))
                .or_default()
                .insert(field, s.value);
        }
    }
    // pod → metric → (sum, count)
    type Sums = BTreeMap<GpuMetric, (f64, u32)>;
    let mut acc: HashMap<PodKey, Sums> = HashMap::new();
    for ((pod, device), fields) in held {
        let entry = acc.entry(pod).or_default();
        let mig = !device.1.is_empty();
        let util = match (fields.get("util"), fields.get("gr")) {
            (Some(u), _) => Some(*u),
            (None, Some(gr)) if mig => Some(gr * 100.0),
            _ => None,
        };
        let used = fields.get("fb_used").copied();
        let mem_util = used.and_then(|u| {
            let cap = capacity.get(&device).copied().unwrap_or(0.0);
            (cap > 0.0 && cap.is_finite()).then(|| u / cap * 100.0)
        });
        let values = [
            (GpuMetric::Utilization, util),
            (
                GpuMetric::MemoryUsedBytes,
                used.map(|mib| mib * 1_048_576.0),
            ),
            (GpuMetric::MemoryUtilization, mem_util),
            (GpuMetric::PowerWatts, fields.get("power").copied()),
            (
                GpuMetric::TensorActive,
                fields.get("tensor").map(|r| r * 100.0),
            ),
        ];
        for (m, v) in values {
            if let Some(v) = v {
                let slot = entry.entry(m).or_insert((0.0, 0));
                slot.0 += v;
                slot.1 += 1;
            }
        }
    }
    acc.into_iter()
        .map(|(pod, metrics)| {
            let values = metrics
                .into_iter()
                .map(|(m, (sum, n))| (m, if m.sums() { sum } else { sum / f64::from(n) }))
                .filter(|(_, v)| v.is_finite())
                .collect();
            (pod, PodValues { values })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str, labels: &[(&str, &str)], value: f64) -> Series {
        Series {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    fn key(ns: &str, pod: &str) -> PodKey {
        (ns.into(), pod.into())
    }

    #[test]
    fn whole_gpus_shares_and_mig_each_give_the_pod_its_own_value() {
        let g0 = [("UUID", "GPU-0"), ("namespace", "ml"), ("pod", "a")];
        let g1 = [("UUID", "GPU-1"), ("namespace", "ml"), ("pod", "a")];
        let shared_b = [("UUID", "GPU-2"), ("namespace", "ml"), ("pod", "b")];
        let shared_rest = [("UUID", "GPU-2")];
        let mig = [
            ("UUID", "GPU-3"),
            ("GPU_I_ID", "1"),
            ("namespace", "ml"),
            ("pod", "c"),
        ];
        let series = vec![
            s("DCGM_FI_DEV_GPU_UTIL", &g0, 80.0),
            s("DCGM_FI_DEV_GPU_UTIL", &g1, 60.0),
            s("DCGM_FI_DEV_POWER_USAGE", &g0, 300.0),
            s("DCGM_FI_DEV_POWER_USAGE", &g1, 200.0),
            s("DCGM_FI_DEV_FB_USED", &g0, 1024.0),
            s("DCGM_FI_DEV_FB_FREE", &g0, 3072.0),
            s("DCGM_FI_DEV_GPU_UTIL", &shared_b, 30.0),
            s("DCGM_FI_DEV_GPU_UTIL", &shared_rest, 10.0),
            s("DCGM_FI_DEV_FB_USED", &shared_b, 500.0),
            s("DCGM_FI_DEV_FB_USED", &shared_rest, 500.0),
            s("DCGM_FI_DEV_FB_FREE", &shared_rest, 1000.0),
            s("DCGM_FI_DEV_POWER_USAGE", &shared_rest, 250.0),
            s("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &mig, 0.42),
        ];
        let v = pod_values(&series);
        let a = &v[&key("ml", "a")];
        assert_eq!(
            a.values[&GpuMetric::Utilization],
            70.0,
            "mean over its GPUs"
        );
        assert_eq!(a.values[&GpuMetric::PowerWatts], 500.0, "sum over its GPUs");
        assert_eq!(a.values[&GpuMetric::MemoryUsedBytes], 1024.0 * 1_048_576.0);
        assert_eq!(a.values[&GpuMetric::MemoryUtilization], 25.0);
        let b = &v[&key("ml", "b")];
        assert_eq!(
            b.values[&GpuMetric::Utilization],
            30.0,
            "its share, not the device"
        );
        assert_eq!(
            b.values[&GpuMetric::MemoryUtilization],
            25.0,
            "500 of 2000 MiB"
        );
        assert!(
            !b.values.contains_key(&GpuMetric::PowerWatts),
            "power is never split"
        );
        let c = &v[&key("ml", "c")];
        assert!(
            (c.values[&GpuMetric::Utilization] - 42.0).abs() < 1e-9,
            "GR engine on MIG"
        );
        assert_eq!(v.len(), 3, "the unlabelled remainder is nobody's");
    }

    /// Issue 27: two GPUs at 1e308 W (and 1e308 MiB, and 1e308 %) overflow their
    /// sum, their mean and the bytes; the pod has none of those values, never +Inf,
    /// and its neighbour is untouched. Negative and NaN samples are skipped.
    #[test]
    fn values_that_overflow_are_missing_never_infinite() {
        let g0 = [("UUID", "GPU-0"), ("namespace", "ml"), ("pod", "bad")];
        let g1 = [("UUID", "GPU-1"), ("namespace", "ml"), ("pod", "bad")];
        let ok = [("UUID", "GPU-2"), ("namespace", "ml"), ("pod", "ok")];
        let mut series = Vec::new();
        for (name, value) in [
            ("DCGM_FI_DEV_POWER_USAGE", 1e308),
            ("DCGM_FI_DEV_GPU_UTIL", 1e308),
            ("DCGM_FI_DEV_FB_USED", 1e308),
            ("DCGM_FI_DEV_FB_FREE", 1e308),
        ] {
            series.push(s(name, &g0, value));
            series.push(s(name, &g1, value));
        }
        series.push(s("DCGM_FI_DEV_POWER_USAGE", &ok, 250.0));
        series.push(s("DCGM_FI_DEV_GPU_UTIL", &ok, -5.0));
        series.push(s("DCGM_FI_DEV_FB_USED", &ok, f64::NAN));
        let v = pod_values(&series);
        let bad = &v[&key("ml", "bad")].values;
        for m in [
            GpuMetric::PowerWatts,
            GpuMetric::Utilization,
            GpuMetric::MemoryUsedBytes,
        ] {
            assert!(!bad.contains_key(&m), "{m:?}: {bad:?}");
        }
        assert!(bad.values().all(|x| x.is_finite()), "{bad:?}");
        let ok = &v[&key("ml", "ok")].values;
        assert_eq!(ok.get(&GpuMetric::PowerWatts), Some(&250.0));
        assert!(!ok.contains_key(&GpuMetric::Utilization), "-5 % is skipped");
        assert!(
            !ok.contains_key(&GpuMetric::MemoryUsedBytes),
            "NaN is skipped"
        );
    }
}
