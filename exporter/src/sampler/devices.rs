//! What is known of the devices between cycles, and how they are discovered.

use super::Sampler;
use super::labels::entity_labels;
use super::labels::link_label_string;
use super::windows::GpuWindows;
use crate::attribution::assign::Holdings;
use crate::health::{CounterHistory, Window};
use crate::plan::catalog::{Quantity, Scope};
use crate::snapshot::XidStat;
use crate::source::{Inventory, ProcessSample, Raw, ReadError};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// One NVLink of a GPU, found at discovery.
pub(super) struct LinkSlot {
    /// The GPU's entity index.
    pub(super) entity: usize,
    pub(super) labels: Arc<str>,
}

/// Everything known about the devices between cycles.
pub(super) struct Devices {
    pub(super) inventory: Inventory,
    /// Which discovery this is (pod attribution caches per inventory).
    pub(super) generation: u64,
    /// Each entity's labels without pods.
    pub(super) base_labels: Vec<Arc<str>>,
    /// Each entity's own labels: with its pod when it is held whole by one.
    pub(super) labels: Vec<Arc<str>>,
    /// Label sets the entity's device series are repeated under instead of its own
    /// labels (one per HPC job; one per pod with `--kubernetes-virtual-gpus`).
    pub(super) copies: Vec<Option<Arc<[Arc<str>]>>>,
    /// The HPC jobs generation the labels were made with.
    pub(super) hpc_generation: Option<u64>,
    /// Who holds what, and the label sets that follow from it.
    pub(super) holdings: Option<Arc<Holdings>>,
    /// Per entity, for a shared one: each holding pod's labels.
    pub(super) share_labels: Vec<Vec<Arc<str>>>,
    pub(super) allocation_labels: Vec<Arc<str>>,
    /// `unsupported[e][q]`: quantity q answered NOT_SUPPORTED on entity e.
    pub(super) unsupported: Vec<[bool; Quantity::COUNT]>,
    pub(super) lost: Vec<bool>,
    pub(super) last_xid: Vec<Option<u64>>,
    pub(super) xids: Vec<BTreeMap<u64, XidStat>>,
    /// Previous raw reading of rate fields: (entity, metric) → (value, when).
    pub(super) previous: HashMap<(usize, usize), (f64, Instant)>,
    /// This cycle's readings and processes per entity (allocations reused).
    pub(super) readings: Vec<Vec<(Quantity, Raw)>>,
    pub(super) processes: Vec<Vec<ProcessSample>>,
    /// This cycle's process list of the entity was read.
    pub(super) processes_read: Vec<bool>,
    /// Per entity: the windows of dcgm-exporter's own collectors (physical GPUs only).
    pub(super) windows: Vec<GpuWindows>,
    /// NVLinks of the GPUs, GPU by GPU, when link-scoped fields are planned.
    pub(super) links: Vec<LinkSlot>,
    /// This cycle's readings per link.
    pub(super) link_readings: Vec<Vec<(Quantity, Raw)>>,
    /// `link_unsupported[e][q]`: link quantity q answered NOT_SUPPORTED on every link
    /// of entity e.
    pub(super) link_unsupported: Vec<[bool; Quantity::COUNT]>,
    /// Previous raw reading of link rate fields: (link, metric) → (value, when).
    pub(super) link_previous: HashMap<(usize, usize), (f64, Instant)>,
    /// Cycles of this inventory so far (the current one included): the clock of the
    /// read periods.
    pub(super) cycle: u64,
    /// Per entity and quantity: the last successful reading and the cycle it was read
    /// in, served in the cycles its period skips.
    pub(super) held: Vec<[Option<(Raw, u64)>; Quantity::COUNT]>,
    /// Per GPU and link quantity: the cycle its links were last read in.
    pub(super) links_read_at: Vec<[Option<u64>; Quantity::COUNT]>,
    /// Per link and quantity: the last successful reading, served as `held` is.
    pub(super) link_held: Vec<[Option<Raw>; Quantity::COUNT]>,
}

impl Devices {
    /// Forget the last cycle's readings and process lists (their allocations stay).
    pub(super) fn start_cycle(&mut self) {
        self.cycle += 1;
        for r in &mut self.readings {
            r.clear();
        }
        for p in &mut self.processes {
            p.clear();
        }
        self.processes_read.fill(false);
        for r in &mut self.link_readings {
            r.clear();
        }
    }
}

impl Sampler {
    pub(super) fn discover(&mut self) -> Result<(), ReadError> {
        let inventory = self
            .source
            .discover(&self.plan.labels.iter().map(|l| l.1).collect::<Vec<_>>())?;
        let n = inventory.entities.len();
        tracing::info!(
            driver = %inventory.driver_version,
            gpus = inventory.entities.iter().filter(|e| e.mig.is_none()).count(),
            mig_instances = inventory.entities.iter().filter(|e| e.mig.is_some()).count(),
            "discovered GPUs"
        );
        if let Some(old) = &self.devices {
            let (added, removed) = inventory_changes(&old.inventory, &inventory);
            tracing::info!(?added, ?removed, "the GPU device set changed");
        }
        if inventory.entities.is_empty() {
            tracing::warn!(
                "the GPU driver answers but lists no GPU; not ready, enumerating again every cycle"
            );
        }
        self.discoveries += 1;
        let labels = entity_labels(&inventory, &self.plan, &self.opts);
        let links = self.discover_links(&inventory);
        self.devices = Some(Devices {
            generation: self.discoveries,
            base_labels: labels.clone(),
            labels,
            copies: vec![None; n],
            hpc_generation: None,
            holdings: None,
            share_labels: vec![Vec::new(); n],
            allocation_labels: Vec::new(),
            lost: inventory.entities.iter().map(|e| e.lost).collect(),
            inventory,
            unsupported: vec![[false; Quantity::COUNT]; n],
            last_xid: vec![None; n],
            xids: vec![BTreeMap::new(); n],
            previous: HashMap::new(),
            readings: vec![Vec::new(); n],
            processes: vec![Vec::new(); n],
            processes_read: vec![false; n],
            windows: (0..n)
                .map(|_| GpuWindows {
                    xids: Window::new(self.exporter.xid_window),
                    clock_events: Window::new(self.exporter.clock_events_window),
                    counters: CounterHistory::default(),
                })
                .collect(),
            link_readings: links.iter().map(|_| Vec::new()).collect(),
            link_held: vec![[None; Quantity::COUNT]; links.len()],
            links,
            cycle: 0,
            held: vec![[None; Quantity::COUNT]; n],
            links_read_at: vec![[None; Quantity::COUNT]; n],
            link_unsupported: vec![[false; Quantity::COUNT]; n],
            link_previous: HashMap::new(),
        });
        Ok(())
    }

    /// The NVLinks of every GPU that answers, when the plan has link-scoped fields.
    pub(super) fn discover_links(&mut self, inventory: &Inventory) -> Vec<LinkSlot> {
        if !self.quantities.iter().any(|(_, s, _)| *s == Scope::Link) {
            return Vec::new();
        }
        let mut links = Vec::new();
        for (e, info) in inventory.entities.iter().enumerate() {
            if info.mig.is_some() || info.lost {
                continue;
            }
            for link in 0..self.source.nvlinks(e) {
                links.push(LinkSlot {
                    entity: e,
                    labels: link_label_string(info, link, &self.plan, &self.opts),
                });
            }
        }
        links
    }
}

/// What a rediscovery changed: the GPUs and MIG instances (by UUID) of `new` that `old`
/// lacks, and those of `old` that `new` lacks.
pub(super) fn inventory_changes(old: &Inventory, new: &Inventory) -> (Vec<String>, Vec<String>) {
    fn names(inv: &Inventory) -> Vec<String> {
        inv.entities
            .iter()
            .map(|e| match &e.mig {
                Some(m) => format!(
                    "MIG {} (GPU {}, GI {}, {})",
                    m.mig_uuid, e.gpu_index, m.gpu_instance_id, m.profile
                ),
                None if e.uuid.is_empty() => format!("GPU {} (lost)", e.gpu_index),
                None => format!("GPU {} ({})", e.gpu_index, e.uuid),
            })
            .collect()
    }
    let (old, new) = (names(old), names(new));
    let added = new.iter().filter(|n| !old.contains(n)).cloned().collect();
    let removed = old.iter().filter(|n| !new.contains(n)).cloned().collect();
    (added, removed)
}
