//! The fleet snapshot: what the sources last learned about every pod, swapped
//! atomically by the source loops and read, never written, by queries. Its vocabulary
//! (the served metrics, pod keys, per-pod values) is defined here so that sources
//! write it and queries read it without either importing the other.

use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime};

/// The metrics the adapter serves, with no configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuMetric {
    Utilization,
    MemoryUsedBytes,
    MemoryUtilization,
    PowerWatts,
    TensorActive,
}

impl GpuMetric {
    pub const ALL: [GpuMetric; 5] = [
        GpuMetric::Utilization,
        GpuMetric::MemoryUsedBytes,
        GpuMetric::MemoryUtilization,
        GpuMetric::PowerWatts,
        GpuMetric::TensorActive,
    ];

    /// The name clients ask for.
    pub fn name(self) -> &'static str {
        match self {
            GpuMetric::Utilization => "gpu_utilization",
            GpuMetric::MemoryUsedBytes => "gpu_memory_used_bytes",
            GpuMetric::MemoryUtilization => "gpu_memory_utilization",
            GpuMetric::PowerWatts => "gpu_power_watts",
            GpuMetric::TensorActive => "gpu_tensor_active",
        }
    }

    pub fn from_name(name: &str) -> Option<GpuMetric> {
        GpuMetric::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether a pod's value over several devices is their sum (else their mean).
    pub fn sums(self) -> bool {
        matches!(self, GpuMetric::MemoryUsedBytes | GpuMetric::PowerWatts)
    }
}

/// A pod, by namespace and name.
pub type PodKey = (String, String);

/// A pod's values, one per metric it has data for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodValues {
    pub values: BTreeMap<GpuMetric, f64>,
    /// Devices (GPUs, MIG instances, shares) the pod holds on this node.
    pub devices: u32,
}

/// What the exporters last said about one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub values: PodValues,
    /// When the scrape that produced these values finished.
    pub at: SystemTime,
    pub seen: Instant,
}

/// The latest view of the fleet.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    pub pods: HashMap<PodKey, Observed>,
    /// Targets in the last round, and how many answered.
    pub targets: usize,
    pub answered: usize,
    /// When a round last got at least one answer.
    pub last_answer: Option<Instant>,
}
