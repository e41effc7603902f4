//! Pod attribution: which Kubernetes pod and container a GPU, a MIG instance or a share
//! of a shared GPU belongs to, so that series carry `pod`, `namespace` and `container`
//! labels as dcgm-exporter's do, for every device-ID form a device plugin produces.
//!
//! Inputs, each refreshed in the background and never on the scrape path:
//!
//! - [`kubelet`]: the kubelet's PodResources API, polled over one long-lived channel,
//!   gives each container's device IDs; [`device_id`] types them.
//! - [`pods`]: a node-scoped, metadata-only pod watch gives pod UIDs and labels, and
//!   tells which pods have finished.
//! - [`cgroup`]: `/proc/<pid>/cgroup` names the pod of each GPU process, for splitting
//!   a shared GPU's usage between the pods on it.
//! - [`dra`]: with `--kubernetes-enable-dra`, the node's ResourceSlices of NVIDIA's DRA
//!   driver, which tell each DRA device's UUID.
//!
//! [`Attributor`] is the sampler's view of them: per cycle it hands out the current
//! [`assign::Holdings`] (recomputed only when an input changed) and maps process IDs to
//! pods (cached while the process lives).

pub mod assign;
pub mod cgroup;
pub mod device_id;
pub mod dra;
pub mod kubelet;
pub mod pods;

use crate::source::Inventory;
use arc_swap::ArcSwap;
use assign::{Holdings, ResolveCache};
use cgroup::PodContainer;
use dra::SliceDirectory;
use kubelet::KubeletView;
use pods::PodDirectory;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The state of the attribution inputs, for the exporter's own metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttributionStatus {
    pub kubelet_up: bool,
    pub kubelet_failures_total: u64,
    pub kubelet_list_duration_seconds: f64,
    /// The pod watch is configured (an API server and a node name are known).
    pub pod_watch: bool,
    pub pod_watch_up: bool,
    pub pod_watch_synced: bool,
    /// Device IDs under GPU resources that name no device of this node.
    pub unmapped_devices: usize,
    /// Device IDs that match no known form.
    pub unparsed_devices: usize,
    /// Time the last cycle spent on attribution, seconds.
    pub duration_seconds: f64,
}

/// The sampler's handle on the attribution inputs.
pub struct Attributor {
    kubelet: Arc<ArcSwap<KubeletView>>,
    pods: Arc<ArcSwap<PodDirectory>>,
    pod_watch: bool,
    proc_root: PathBuf,
    /// The ResourceSlice watch's devices (`--kubernetes-enable-dra`); stays empty
    /// without it.
    slices: Arc<ArcSwap<SliceDirectory>>,
    /// Resolved device references for the current (inventory, slices) generations.
    cache: Option<((u64, u64), ResolveCache)>,
    /// (inventory, kubelet, pods, slices) generations the holdings were computed from.
    computed_from: Option<(u64, u64, u64, u64)>,
    holdings: Arc<Holdings>,
    /// The pod directory the holdings were computed from: shares use the same one, so
    /// a cycle never mixes two views of the pods.
    directory: Arc<PodDirectory>,
    /// Likewise the kubelet view, so self-metrics describe the labels they come with.
    view: Arc<KubeletView>,
    /// PID → its pod container (None: not in a pod, or unreadable), for live processes.
    cgroups: HashMap<u32, Option<PodContainer>>,
    seen: Vec<u32>,
    unreadable_logged: bool,
}

impl Attributor {
    pub fn new(
        kubelet: Arc<ArcSwap<KubeletView>>,
        pods: Arc<ArcSwap<PodDirectory>>,
        pod_watch: bool,
        proc_root: PathBuf,
    ) -> Attributor {
        Attributor {
            kubelet,
            pods,
            pod_watch,
            proc_root,
            slices: Arc::new(ArcSwap::from_pointee(SliceDirectory::default())),
            cache: None,
            computed_from: None,
            holdings: Arc::new(Holdings {
                per_entity: Vec::new(),
                allocations: Vec::new(),
                unmapped: Vec::new(),
            }),
            directory: Arc::new(PodDirectory::default()),
            view: Arc::new(KubeletView::default()),
            cgroups: HashMap::new(),
            seen: Vec::new(),
            unreadable_logged: false,
        }
    }

    /// Resolve DRA devices also by the UUIDs in the ResourceSlices `slices` holds.
    pub fn with_slices(mut self, slices: Arc<ArcSwap<SliceDirectory>>) -> Attributor {
        self.slices = slices;
        self
    }

    /// The holdings for `inv` (discovery number `inventory_generation`), and whether
    /// they changed since the last call.
    pub fn holdings(
        &mut self,
        inv: &Inventory,
        inventory_generation: u64,
    ) -> (Arc<Holdings>, bool) {
        // The pods first: the watch forgets an ended pod only after a kubelet view that
        // no longer lists it was published, so a view loaded after them cannot name it.
        let pods = self.pods.load_full();
        let slices = self.slices.load_full();
        let kubelet = self.kubelet.load_full();
        // Health counters change without the allocations changing.
        self.view = kubelet.clone();
        let key = (
            inventory_generation,
            kubelet.generation,
            pods.generation,
            slices.generation,
        );
        if self.computed_from == Some(key) {
            return (self.holdings.clone(), false);
        }
        let cache_key = (inventory_generation, slices.generation);
        let cache = match &mut self.cache {
            Some((g, c)) if *g == cache_key => c,
            slot => {
                &mut slot
                    .insert((cache_key, ResolveCache::with_slices(inv, slices)))
                    .1
            }
        };
        let h = Holdings::resolve(inv, &kubelet.allocations, &pods, cache);
        let changed = *self.holdings != h;
        self.holdings = Arc::new(h);
        self.directory = pods.clone();
        self.computed_from = Some(key);
        (self.holdings.clone(), changed)
    }

    /// The pod directory of the current holdings.
    pub fn pods(&self) -> Arc<PodDirectory> {
        self.directory.clone()
    }

    /// The pod container of process `pid`, read once per process lifetime.
    pub fn pod_of(&mut self, pid: u32) -> Option<&PodContainer> {
        self.seen.push(pid);
        let root = &self.proc_root;
        let logged = &mut self.unreadable_logged;
        self.cgroups
            .entry(pid)
            .or_insert_with(|| match cgroup::read_pod_container(root, pid) {
                Ok(pc) => pc,
                Err(e) => {
                    if !*logged {
                        tracing::warn!(pid, proc_root = %root.display(), error = %e, "cannot read a GPU process's cgroup (is hostPID set?); its usage stays unattributed");
                        *logged = true;
                    }
                    None
                }
            })
            .as_ref()
    }

    /// Forget processes not looked up since the last call (they have exited), so a
    /// reused PID is read afresh.
    pub fn end_cycle(&mut self) {
        let mut seen = std::mem::take(&mut self.seen);
        seen.sort_unstable();
        self.cgroups
            .retain(|pid, _| seen.binary_search(pid).is_ok());
        seen.clear();
        self.seen = seen;
    }

    /// Forget every process's pod, as if all had exited (benchmarks of the cold path).
    pub fn forget_processes(&mut self) {
        self.cgroups.clear();
    }

    /// The inputs' state, for self-metrics.
    pub fn status(&self, duration_seconds: f64) -> AttributionStatus {
        let k = &self.view;
        let p = &self.directory;
        AttributionStatus {
            kubelet_up: k.up,
            kubelet_failures_total: k.failures_total,
            kubelet_list_duration_seconds: k.last_list_duration.as_secs_f64(),
            pod_watch: self.pod_watch,
            pod_watch_up: p.up,
            pod_watch_synced: p.synced,
            unmapped_devices: self.holdings.unmapped.len(),
            unparsed_devices: k.unparsed.len(),
            duration_seconds,
        }
    }
}
