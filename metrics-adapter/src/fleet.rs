//! The fleet snapshot: what the sources last learned about every pod, swapped
//! atomically by the source loops and read, never written, by queries. Its vocabulary
//! (the served metrics, pod keys, per-pod values) is defined here so that sources
//! write it and queries read it without either importing the other.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

/// The metrics the adapter serves: the five GPU metrics, with no configuration; the
/// serving-engine signals of the built-in profiles (the serving source); and
/// the user-defined serving mappings (`--serving-metric`), by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuMetric {
    Utilization,
    MemoryUsedBytes,
    MemoryUtilization,
    PowerWatts,
    TensorActive,
    /// Requests waiting in the engine's queue.
    ServingRequestsWaiting,
    /// Requests being processed (in the running batch).
    ServingRequestsRunning,
    /// KV-cache use, 0 to 1.
    ServingKvCacheUsage,
    /// Generated tokens per second, between the last two scrapes.
    ServingGenerationTokensPerSecond,
    /// Time to first token quantiles, over the requests between the last two scrapes.
    ServingTimeToFirstTokenP50,
    ServingTimeToFirstTokenP95,
    ServingTimeToFirstTokenP99,
    /// A user-defined serving metric (`--serving-metric`), by its name.
    Mapped(&'static str),
}

/// The names of the user-defined serving metrics, set once at startup.
static MAPPED: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();

/// Declares the user-defined serving metrics' names (once, at startup, before any
/// query); false if they were already declared.
pub fn declare_mapped(names: Vec<&'static str>) -> bool {
    MAPPED.set(names).is_ok()
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
            GpuMetric::ServingRequestsWaiting => "serving_requests_waiting",
            GpuMetric::ServingRequestsRunning => "serving_requests_running",
            GpuMetric::ServingKvCacheUsage => "serving_kv_cache_usage",
            GpuMetric::ServingGenerationTokensPerSecond => "serving_generation_tokens_per_second",
            GpuMetric::ServingTimeToFirstTokenP50 => "serving_time_to_first_token_seconds_p50",
            GpuMetric::ServingTimeToFirstTokenP95 => "serving_time_to_first_token_seconds_p95",
            GpuMetric::ServingTimeToFirstTokenP99 => "serving_time_to_first_token_seconds_p99",
            GpuMetric::Mapped(name) => name,
        }
    }

    /// The serving-engine signals every profile may serve.
    pub const SERVING: [GpuMetric; 7] = [
        GpuMetric::ServingRequestsWaiting,
        GpuMetric::ServingRequestsRunning,
        GpuMetric::ServingKvCacheUsage,
        GpuMetric::ServingGenerationTokensPerSecond,
        GpuMetric::ServingTimeToFirstTokenP50,
        GpuMetric::ServingTimeToFirstTokenP95,
        GpuMetric::ServingTimeToFirstTokenP99,
    ];

    /// Every metric served: GPU, serving signals, then the user-defined ones.
    pub fn served() -> Vec<GpuMetric> {
        let mapped = MAPPED
            .get()
            .into_iter()
            .flatten()
            .map(|n| GpuMetric::Mapped(n));
        GpuMetric::ALL
            .into_iter()
            .chain(GpuMetric::SERVING)
            .chain(mapped)
            .collect()
    }

    pub fn from_name(name: &str) -> Option<GpuMetric> {
        GpuMetric::served().into_iter().find(|m| m.name() == name)
    }

    /// Whether the value comes from the serving engines (else from the GPU exporters).
    pub fn is_serving(self) -> bool {
        !GpuMetric::ALL.contains(&self)
    }

    /// Whether an external metric (a namespace or selector's value) is the sum over
    /// its pods as one item, rather than one item per pod: the serving signals are.
    pub fn external_sum(self) -> bool {
        self.is_serving()
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
    /// Ordered by namespace then name, so a request reads its namespace's pods as one
    /// range ([`in_namespace`]), not by a walk over the fleet's.
    pub pods: BTreeMap<PodKey, Observed>,
    /// Targets in the last round, and how many answered.
    pub targets: usize,
    pub answered: usize,
    /// When a round last got at least one answer.
    pub last_answer: Option<Instant>,
}

/// A map keyed and ordered by pod: the fleet's values (a `BTreeMap`, rebuilt each
/// round) and the pod index (an `imbl::OrdMap`, changed one pod at a time).
pub trait ByPod<V> {
    /// The entries from `from` on, in key order.
    fn entries_from<'a>(
        &'a self,
        from: PodKey,
    ) -> Box<dyn Iterator<Item = (&'a PodKey, &'a V)> + 'a>;
}

impl<V> ByPod<V> for BTreeMap<PodKey, V> {
    fn entries_from<'a>(
        &'a self,
        from: PodKey,
    ) -> Box<dyn Iterator<Item = (&'a PodKey, &'a V)> + 'a> {
        Box::new(self.range(from..))
    }
}

impl<V: Clone> ByPod<V> for imbl::OrdMap<PodKey, V> {
    fn entries_from<'a>(
        &'a self,
        from: PodKey,
    ) -> Box<dyn Iterator<Item = (&'a PodKey, &'a V)> + 'a> {
        Box::new(self.range(from..))
    }
}

/// The entries of `map` in `namespace`, by pod name in order: one range of the map,
/// whatever the other namespaces hold.
pub fn in_namespace<'a, V: 'a>(
    map: &'a impl ByPod<V>,
    namespace: &'a str,
) -> impl Iterator<Item = (&'a str, &'a V)> + 'a {
    map.entries_from((namespace.to_string(), String::new()))
        .take_while(move |((ns, _), _)| ns == namespace)
        .map(|((_, name), v)| (name.as_str(), v))
}

#[cfg(test)]
mod namespace_tests {
    use super::*;

    /// A namespace's range holds its pods, in name order, and nothing of a namespace
    /// whose name only starts like it or sorts next to it.
    #[test]
    fn in_namespace_reads_one_namespace_in_order() {
        let entries = || {
            [
                ("ab", "x", 1),
                ("a", "z", 2),
                ("b", "a", 3),
                ("a", "c", 4),
                ("", "q", 5),
            ]
            .into_iter()
            .map(|(ns, name, v)| ((ns.to_string(), name.to_string()), v))
        };
        fn check(map: &impl ByPod<u32>) {
            let a: Vec<(&str, &u32)> = in_namespace(map, "a").collect();
            assert_eq!(a, vec![("c", &4), ("z", &2)]);
            assert_eq!(in_namespace(map, "ab").count(), 1);
            assert_eq!(in_namespace(map, "c").count(), 0);
            assert_eq!(
                in_namespace(map, "").map(|(n, _)| n).collect::<Vec<_>>(),
                ["q"]
            );
        }
        check(&entries().collect::<BTreeMap<PodKey, u32>>());
        check(&entries().collect::<imbl::OrdMap<PodKey, u32>>());
    }
}
