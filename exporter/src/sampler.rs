//! The sampler: on its own thread, every collect interval, reads every planned field of
//! every GPU and MIG instance from the source and publishes an immutable [`Snapshot`].
//!
//! - A field that answers "not supported" on an entity is remembered and never asked again.
//! - Any other error is counted per field and affects only that reading.
//! - A lost GPU keeps its identity (so `gpu_exporter_gpu_up` can say it is lost) but its
//!   series disappear, as do its MIG instances'.
//! - When the driver as a whole stops answering, the sampler publishes an empty, "down"
//!   snapshot and, every cycle, asks the source for a cheap probe
//!   ([`GpuSource::probe`]); the full rediscovery runs as soon as a probe passes, so
//!   the data is back within two cycles of the driver. A probe that passes before a
//!   discovery that fails is not trusted again until the discovery backoff is due, so a
//!   half-working driver costs one discovery per backoff, not one per cycle.
//! - While the driver is up, every cycle asks the source whether the device set changed
//!   ([`GpuSource::device_set_changed`]: GPUs or MIG instances that came or went); if so
//!   it discovers again at once, logs what came and went, and starts a new inventory
//!   generation, so no per-entity state (rates, XIDs, pod holdings) carries over to a
//!   device that merely took another's place. A driver that lists no GPU is asked every
//!   cycle too, and `/readyz` says not ready until GPUs appear.

use crate::attribution::Attributor;
use crate::attribution::assign::{Holder, Holding, Holdings, split_owned, split_proportional};
use crate::attribution::pods::PodDirectory;
use crate::catalog::{Convert, ExporterField, Quantity, Scope};
use crate::counters::{ExportPlan, MetricKind};
use crate::health::{self, CounterHistory, Window};
use crate::hpc::HpcJobs;
use crate::plan_reload::PlanHandle;
use crate::snapshot::{
    EntitySnapshot, ExporterValues, Snapshot, SnapshotStore, Value, XidStat, push_label,
};
use crate::snapshot::{LinkSnapshot, PodRef, PodShare, ProcessSnapshot};
use crate::source::{EntityInfo, GpuSource, Inventory, ProcessSample, Raw, ReadError};
use arc_swap::ArcSwap;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

/// Longest wait between rediscovery attempts that no passing probe asked for.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How series are labelled and what is collected besides the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerOptions {
    pub interval: Duration,
    /// Hostname label (name, value), or none (`--no-hostname`).
    pub hostname: Option<(String, String)>,
    /// Replace spaces in `modelName` with `-` (dcgm's `--replace-blanks-in-model-name`).
    pub replace_blanks_in_model_name: bool,
    /// Collect and export per-process series.
    pub process_metrics: bool,
    /// Add `pod_uid` to a pod's series (`--kubernetes-enable-pod-uid`).
    pub pod_uid: bool,
    /// dcgm-exporter's `--kubernetes-virtual-gpus`: a shared device's series are
    /// repeated per pod with `vgpu`, instead of left unlabelled.
    pub virtual_gpus: bool,
    /// dcgm-exporter's `-o/--use-old-namespace`: its 1.x label names, `uuid` for
    /// `UUID` and `pod_name`, `pod_namespace`, `container_name` for `pod`,
    /// `namespace`, `container`.
    pub old_namespace: bool,
}

/// The label names `-o` changes, as (today's, 1.x).
const OLD_NAMESPACE: [(&str, &str); 4] = [
    ("UUID", "uuid"),
    ("pod", "pod_name"),
    ("namespace", "pod_namespace"),
    ("container", "container_name"),
];

impl SamplerOptions {
    /// The name a dcgm-exporter label has under these options: its 1.x name with `-o`.
    fn label_name(&self, name: &'static str) -> &'static str {
        match OLD_NAMESPACE.iter().find(|(now, _)| *now == name) {
            Some((_, old)) if self.old_namespace => old,
            _ => name,
        }
    }

    /// Whether a pod label of this name would collide with a label the exporter
    /// writes.
    fn reserved(&self, name: &str) -> bool {
        RESERVED_LABELS.contains(&name)
            || name.starts_with("dra_")
            || (self.old_namespace && OLD_NAMESPACE.iter().any(|(_, old)| *old == name))
    }
}

/// Label names the exporter itself writes, which a pod label must not take.
const RESERVED_LABELS: [&str; 19] = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "Hostname",
    "hostname",
    "container",
    "namespace",
    "pod",
    "err_code",
    "err_msg",
    "pid",
    "process_name",
    "hpc_job",
    "pod_uid",
    "vgpu",
];

/// The label set of one entity in dcgm-exporter's order, with a pod's labels when the
/// series belongs to one and the HPC job when it belongs to one: `gpu, UUID,
/// pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID,] hostname`, then label
/// fields and allow-listed pod labels in one byte-sorted run, then dcgm's attributes,
/// byte-sorted: `container, [dra_*,] hpc_job, namespace, pod, pod_uid, vgpu`. In
/// `--kubernetes-virtual-gpus` mode pod labels are not copied (nor are they by dcgm).
/// With `-o`, dcgm's 1.x names: `uuid` for `UUID`, and `container_name, [dra_*,]
/// hpc_job, pod_name, pod_namespace, pod_uid, vgpu`.
pub fn entity_label_string(
    e: &EntityInfo,
    plan: &ExportPlan,
    opts: &SamplerOptions,
    holder: Option<&Holder>,
    hpc_job: Option<&str>,
) -> Arc<str> {
    let mut s = String::with_capacity(256);
    push_label(&mut s, "gpu", itoa::Buffer::new().format(e.gpu_index));
    push_label(&mut s, opts.label_name("UUID"), &e.uuid);
    push_label(&mut s, "pci_bus_id", &e.pci_bus_id);
    push_label(&mut s, "device", &format!("nvidia{}", e.gpu_index));
    let model = if opts.replace_blanks_in_model_name {
        e.model_name.replace(' ', "-")
    } else {
        e.model_name.clone()
    };
    push_label(&mut s, "modelName", &model);
    if let Some(m) = &e.mig {
        push_label(&mut s, "GPU_I_PROFILE", &m.profile);
        push_label(
            &mut s,
            "GPU_I_ID",
            itoa::Buffer::new().format(m.gpu_instance_id),
        );
    }
    if let Some((name, value)) = &opts.hostname {
        push_label(&mut s, name, value);
    }
    // `plan.labels` is byte-sorted, as dcgm-exporter emits label fields; pod labels
    // join that run in order.
    let mut run: Vec<(&str, &str)> = plan
        .labels
        .iter()
        .filter_map(|(name, field)| e.labels.get(field).map(|v| (*name, v.as_str())))
        .collect();
    if let Some(h) = holder.filter(|_| !opts.virtual_gpus) {
        for (k, v) in &h.pod_labels {
            let taken = opts.reserved(k) || run.iter().any(|(n, _)| *n == k.as_str());
            if !taken {
                run.push((k, v));
            }
        }
        run.sort_by(|a, b| a.0.cmp(b.0));
    }
    for (name, value) in run {
        push_label(&mut s, name, value);
    }
    if let Some(c) = holder.and_then(|h| h.container.as_ref()) {
        push_label(&mut s, opts.label_name("container"), c);
    }
    if let Some(dra) = holder.and_then(|h| h.dra.as_ref()) {
        for (name, value) in dra.pairs() {
            push_label(&mut s, name, value);
        }
    }
    if let Some(job) = hpc_job {
        push_label(&mut s, "hpc_job", job);
    }
    if let Some(h) = holder {
        // Byte-sorted either way: `namespace, pod`; `pod_name, pod_namespace`.
        if opts.old_namespace {
            push_label(&mut s, opts.label_name("pod"), &h.pod);
            push_label(&mut s, opts.label_name("namespace"), &h.namespace);
        } else {
            push_label(&mut s, opts.label_name("namespace"), &h.namespace);
            push_label(&mut s, opts.label_name("pod"), &h.pod);
        }
        if let Some(uid) = h.pod_uid.as_ref().filter(|_| opts.pod_uid) {
            push_label(&mut s, "pod_uid", uid);
        }
        if let Some(replica) = h.vgpu.filter(|_| opts.virtual_gpus) {
            push_label(&mut s, "vgpu", itoa::Buffer::new().format(replica));
        }
    }
    Arc::from(s)
}

/// The label set of each entity, without pods.
fn entity_labels(inv: &Inventory, plan: &ExportPlan, opts: &SamplerOptions) -> Vec<Arc<str>> {
    inv.entities
        .iter()
        .map(|e| entity_label_string(e, plan, opts, None, None))
        .collect()
}

/// The label set of one NVLink, as dcgm-exporter labels its NVLink entities: `nvlink,
/// gpu, gpu_uuid, pci_bus_id, device, model_name, hostname`, then the label fields
/// (byte-sorted). No pod labels: a link belongs to the node, not to a workload.
pub fn link_label_string(
    e: &EntityInfo,
    link: u32,
    plan: &ExportPlan,
    opts: &SamplerOptions,
) -> Arc<str> {
    let mut s = String::with_capacity(256);
    push_label(&mut s, "nvlink", itoa::Buffer::new().format(link));
    push_label(&mut s, "gpu", itoa::Buffer::new().format(e.gpu_index));
    push_label(&mut s, "gpu_uuid", &e.uuid);
    push_label(&mut s, "pci_bus_id", &e.pci_bus_id);
    push_label(&mut s, "device", &format!("nvidia{}", e.gpu_index));
    // dcgm-exporter never replaces blanks in an NVLink's model name.
    push_label(&mut s, "model_name", &e.model_name);
    if let Some((name, value)) = &opts.hostname {
        push_label(&mut s, name, value);
    }
    for (name, field) in &plan.labels {
        if let Some(v) = e.labels.get(field) {
            push_label(&mut s, name, v);
        }
    }
    Arc::from(s)
}

/// One NVLink of a GPU, found at discovery.
struct LinkSlot {
    /// The GPU's entity index.
    entity: usize,
    labels: Arc<str>,
}

/// Which metrics are split per pod on a shared device, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Split {
    /// In proportion to the pods' processes' SM utilisation.
    BySmShare,
    /// Each pod's processes' own memory, MiB.
    ByMemory,
}

/// Everything known about the devices between cycles.
struct Devices {
    inventory: Inventory,
    /// Which discovery this is (pod attribution caches per inventory).
    generation: u64,
    /// Each entity's labels without pods.
    base_labels: Vec<Arc<str>>,
    /// Each entity's own labels: with its pod when it is held whole by one.
    labels: Vec<Arc<str>>,
    /// Label sets the entity's device series are repeated under instead of its own
    /// labels (one per HPC job; one per pod with `--kubernetes-virtual-gpus`).
    copies: Vec<Option<Arc<[Arc<str>]>>>,
    /// The HPC jobs generation the labels were made with.
    hpc_generation: Option<u64>,
    /// Who holds what, and the label sets that follow from it.
    holdings: Option<Arc<Holdings>>,
    /// Per entity, for a shared one: each holding pod's labels.
    share_labels: Vec<Vec<Arc<str>>>,
    allocation_labels: Vec<Arc<str>>,
    /// `unsupported[e][q]`: quantity q answered NOT_SUPPORTED on entity e.
    unsupported: Vec<[bool; Quantity::COUNT]>,
    lost: Vec<bool>,
    last_xid: Vec<Option<u64>>,
    xids: Vec<BTreeMap<u64, XidStat>>,
    /// Previous raw reading of rate fields: (entity, metric) → (value, when).
    previous: HashMap<(usize, usize), (f64, Instant)>,
    /// This cycle's readings and processes per entity (allocations reused).
    readings: Vec<Vec<(Quantity, Raw)>>,
    processes: Vec<Vec<ProcessSample>>,
    /// This cycle's process list of the entity was read.
    processes_read: Vec<bool>,
    /// Per entity: the windows of dcgm-exporter's own collectors (physical GPUs only).
    windows: Vec<GpuWindows>,
    /// NVLinks of the GPUs, GPU by GPU, when link-scoped fields are planned.
    links: Vec<LinkSlot>,
    /// This cycle's readings per link.
    link_readings: Vec<Vec<(Quantity, Raw)>>,
    /// `link_unsupported[e][q]`: link quantity q answered NOT_SUPPORTED on every link
    /// of entity e.
    link_unsupported: Vec<[bool; Quantity::COUNT]>,
    /// Previous raw reading of link rate fields: (link, metric) → (value, when).
    link_previous: HashMap<(usize, usize), (f64, Instant)>,
}

/// The trailing windows of one GPU.
struct GpuWindows {
    /// XID codes, when each was reported (a MIG instance's count on its GPU).
    xids: Window<u64>,
    /// Clock-event reason masks of the cycles that had any reason set.
    clock_events: Window<u64>,
    /// PCIe replays and the four NVLink error counters, for the health watches.
    counters: CounterHistory<5>,
}

/// The default of dcgm-exporter's `-x` and `--clock-events-count-window-size`.
pub const DEFAULT_COUNT_WINDOW: Duration = Duration::from_secs(300);

/// Which `DCGM_EXP_*` collectors the plan has, and their windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExporterCollectors {
    pub xid_count: bool,
    pub clock_events_count: bool,
    pub health: bool,
    pub xid_window: Duration,
    pub clock_events_window: Duration,
}

impl ExporterCollectors {
    fn any(&self) -> bool {
        self.xid_count || self.clock_events_count || self.health
    }
}

/// Rebuild the label sets that depend on who holds what (`h`) and on the HPC jobs.
fn relabel(
    d: &mut Devices,
    h: Option<&Arc<Holdings>>,
    jobs: Option<&HpcJobs>,
    plan: &ExportPlan,
    opts: &SamplerOptions,
) {
    for (e, info) in d.inventory.entities.iter().enumerate() {
        let jobs_here: Vec<Option<&str>> = match jobs {
            Some(j) => j
                .jobs(info.gpu_index, info.mig.as_ref().map(|m| m.gpu_instance_id))
                .iter()
                .map(|j| Some(j.as_str()))
                .collect(),
            None => Vec::new(),
        };
        // One series per job, as dcgm-exporter repeats them; one without a job else.
        let jobs_here = if jobs_here.is_empty() {
            vec![None]
        } else {
            jobs_here
        };
        let label = |holder: Option<&Holder>, job: Option<&str>| {
            entity_label_string(info, plan, opts, holder, job)
        };
        let per_job = |holder: Option<&Holder>| -> Vec<Arc<str>> {
            jobs_here.iter().map(|j| label(holder, *j)).collect()
        };
        let (own, copies, shares) = match h.and_then(|h| h.per_entity.get(e)) {
            Some(Holding::Exclusive(holder)) => {
                (label(Some(holder), None), per_job(Some(holder)), Vec::new())
            }
            Some(Holding::Shared(holders)) => {
                let shares: Vec<Arc<str>> = holders.iter().map(|h| label(Some(h), None)).collect();
                let copies = if opts.virtual_gpus {
                    holders.iter().flat_map(|h| per_job(Some(h))).collect()
                } else {
                    per_job(None)
                };
                (d.base_labels[e].clone(), copies, shares)
            }
            Some(Holding::Free) | None => (d.base_labels[e].clone(), per_job(None), Vec::new()),
        };
        // Copies only where they differ from the entity's own labels.
        d.copies[e] = (copies.len() != 1 || copies[0] != own).then(|| Arc::from(copies));
        d.labels[e] = own;
        d.share_labels[e] = shares;
    }
    if let Some(h) = h {
        d.allocation_labels = h
            .allocations
            .iter()
            .filter_map(|(e, holder)| {
                d.inventory
                    .entities
                    .get(*e)
                    .map(|info| entity_label_string(info, plan, opts, Some(holder), None))
            })
            .collect();
        d.holdings = Some(h.clone());
    }
    d.hpc_generation = jobs.map(|j| j.generation);
}

/// What a plan asks of the source: the distinct quantities with their scope and the
/// metrics each feeds, and the metrics split per pod on shared devices.
#[allow(clippy::type_complexity)]
fn plan_tables(
    plan: &ExportPlan,
) -> (
    Vec<(Quantity, Scope, Vec<usize>)>,
    Vec<(usize, Split)>,
    ExporterCollectors,
) {
    let mut quantities: Vec<(Quantity, Scope, Vec<usize>)> = Vec::new();
    for (i, m) in plan.metrics.iter().enumerate() {
        if let MetricKind::Value {
            quantity, scope, ..
        } = m.kind
        {
            match quantities.iter_mut().find(|(q, _, _)| *q == quantity) {
                Some((_, _, idx)) => idx.push(i),
                None => quantities.push((quantity, scope, vec![i])),
            }
        }
    }
    let has = |x: ExporterField| {
        plan.metrics
            .iter()
            .any(|m| m.kind == MetricKind::Exporter(x))
    };
    let exporter = ExporterCollectors {
        xid_count: has(ExporterField::XidWindowCount),
        clock_events_count: has(ExporterField::ClockEventWindowCount),
        health: has(ExporterField::HealthStatus),
        xid_window: DEFAULT_COUNT_WINDOW,
        clock_events_window: DEFAULT_COUNT_WINDOW,
    };
    // What the collectors read besides the plan's own fields: read every cycle,
    // exported only through them.
    let mut extra: Vec<Quantity> = Vec::new();
    if exporter.clock_events_count {
        extra.push(Quantity::ClockEventReasons);
    }
    if exporter.health {
        extra.extend(health::HEALTH_QUANTITIES);
    }
    for q in extra {
        if !quantities.iter().any(|(x, _, _)| *x == q) {
            quantities.push((q, Scope::Device, Vec::new()));
        }
    }
    let splits = plan
        .metrics
        .iter()
        .enumerate()
        .filter_map(|(i, m)| match m.kind {
            MetricKind::Value {
                quantity: Quantity::GpuUtil,
                ..
            } => Some((i, Split::BySmShare)),
            MetricKind::Value {
                quantity: Quantity::FbUsed,
                ..
            } => Some((i, Split::ByMemory)),
            _ => None,
        })
        .collect();
    (quantities, splits, exporter)
}

pub struct Sampler {
    source: Box<dyn GpuSource>,
    plan: Arc<ExportPlan>,
    opts: SamplerOptions,
    build_labels: Arc<str>,
    devices: Option<Devices>,
    /// Distinct quantities and the metric indices each one feeds.
    quantities: Vec<(Quantity, Scope, Vec<usize>)>,
    field_errors: Vec<u64>,
    samples_total: u64,
    failures_total: u64,
    last_success: Option<(Instant, SystemTime)>,
    /// The driver is not answering (logged once when it stops, once when it is back).
    down: bool,
    backoff: Duration,
    next_discovery: Instant,
    /// A probe passed and the discovery it let through failed: probes are not trusted
    /// until the next discovery succeeds.
    probe_misled: bool,
    scratch: Vec<Result<Raw, ReadError>>,
    attributor: Option<Attributor>,
    /// Time this cycle spent attributing (holdings, labels, per-pod shares).
    attribution_time: Duration,
    discoveries: u64,
    /// Metrics split per pod on shared devices: (metric index, how).
    splits: Vec<(usize, Split)>,
    /// The pods of processes' series, shared across cycles.
    process_pods: PodRefs,
    /// The HPC jobs on each device (`--hpc-job-mapping-dir`), kept current elsewhere.
    hpc_jobs: Option<Arc<ArcSwap<HpcJobs>>>,
    /// Reloaded plans (`--collectors`, `--configmap-data`), when reloading is on.
    plan_updates: Option<Arc<PlanHandle>>,
    exporter: ExporterCollectors,
}

impl Sampler {
    pub fn new(
        source: Box<dyn GpuSource>,
        plan: Arc<ExportPlan>,
        opts: SamplerOptions,
        build_labels: Arc<str>,
    ) -> Sampler {
        let (quantities, splits, exporter) = plan_tables(&plan);
        let field_errors = vec![0; plan.metrics.len()];
        Sampler {
            source,
            plan,
            backoff: opts.interval,
            opts,
            build_labels,
            devices: None,
            quantities,
            field_errors,
            samples_total: 0,
            failures_total: 0,
            last_success: None,
            down: false,
            next_discovery: Instant::now(),
            probe_misled: false,
            scratch: Vec::new(),
            attributor: None,
            attribution_time: Duration::ZERO,
            discoveries: 0,
            splits,
            process_pods: PodRefs::default(),
            hpc_jobs: None,
            plan_updates: None,
            exporter,
        }
    }

    /// Follow the plan in `handle`: a reloaded counters CSV is served from the next
    /// cycle on.
    pub fn with_plan_updates(mut self, handle: Arc<PlanHandle>) -> Sampler {
        self.plan_updates = Some(handle);
        self
    }

    /// Serve `plan` from now on: the devices are discovered again for it (its label
    /// fields may differ), and per-field error counts start over.
    fn set_plan(&mut self, plan: Arc<ExportPlan>) {
        let (quantities, splits, mut exporter) = plan_tables(&plan);
        exporter.xid_window = self.exporter.xid_window;
        exporter.clock_events_window = self.exporter.clock_events_window;
        self.exporter = exporter;
        self.field_errors = vec![0; plan.metrics.len()];
        self.quantities = quantities;
        self.splits = splits;
        self.plan = plan;
        self.devices = None;
        self.next_discovery = Instant::now();
    }

    /// Repeat each device's series per HPC job in `jobs` (`--hpc-job-mapping-dir`).
    pub fn with_hpc_jobs(mut self, jobs: Arc<ArcSwap<HpcJobs>>) -> Sampler {
        self.hpc_jobs = Some(jobs);
        self
    }

    /// The windows of `DCGM_EXP_XID_ERRORS_COUNT` (`-x`) and
    /// `DCGM_EXP_CLOCK_EVENTS_COUNT` (`--clock-events-count-window-size`).
    pub fn with_count_windows(mut self, xid: Duration, clock_events: Duration) -> Sampler {
        self.exporter.xid_window = xid;
        self.exporter.clock_events_window = clock_events;
        self
    }

    /// The pod attribution, if on.
    pub fn attributor_mut(&mut self) -> Option<&mut Attributor> {
        self.attributor.as_mut()
    }

    /// Attribute series to pods through `attributor` (`--kubernetes`).
    pub fn with_attribution(mut self, attributor: Attributor) -> Sampler {
        self.attributor = Some(attributor);
        self
    }

    fn discover(&mut self) -> Result<(), ReadError> {
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
            links,
            link_unsupported: vec![[false; Quantity::COUNT]; n],
            link_previous: HashMap::new(),
        });
        Ok(())
    }

    /// The NVLinks of every GPU that answers, when the plan has link-scoped fields.
    fn discover_links(&mut self, inventory: &Inventory) -> Vec<LinkSlot> {
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

    /// Forget the devices; probe every cycle, and retry a full discovery after a growing
    /// backoff. Logged once per outage, not once per cycle.
    fn driver_down(&mut self, why: &str) {
        if !self.down {
            tracing::warn!(
                error = why,
                "GPU driver is not answering; probing it every cycle"
            );
            self.down = true;
        }
        self.devices = None;
        self.next_discovery = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// Run one cycle and return its snapshot.
    pub fn cycle(&mut self) -> Snapshot {
        let started = Instant::now();
        if let Some(h) = &self.plan_updates {
            let plan = h.plan();
            if !Arc::ptr_eq(&plan, &self.plan) {
                tracing::info!(
                    metrics = plan.metrics.len(),
                    "serving the reloaded counters"
                );
                self.set_plan(plan);
            }
        }
        self.samples_total += 1;
        self.attribution_time = Duration::ZERO;
        // Whether a passing probe, rather than the backoff, let this discovery through.
        let mut probed = false;
        let rediscover = match self.devices {
            None if started >= self.next_discovery => true,
            None if self.probe_misled => false,
            None => {
                probed = self.source.probe().is_ok();
                probed
            }
            // GPUs or MIG instances came or went: a new inventory, right away.
            Some(_) => {
                let changed = self.source.device_set_changed();
                tracing::trace!(took = ?started.elapsed(), changed, "checked the device set");
                changed
            }
        };
        if rediscover && let Err(e) = self.discover() {
            self.driver_down(&e.to_string());
        }
        let reached = self.devices.is_some()
            && match self.read_all() {
                Ok(()) => true,
                Err(e) => {
                    self.driver_down(&e.to_string());
                    false
                }
            };
        if probed && !reached {
            self.probe_misled = true;
        }
        if reached {
            if self.down {
                tracing::info!("GPU driver answers again");
                self.down = false;
            }
            self.probe_misled = false;
            self.backoff = self.opts.interval;
            self.last_success = Some((Instant::now(), SystemTime::now()));
        } else {
            self.failures_total += 1;
        }
        let mut snap = self.snapshot(started);
        // The whole cycle, per-pod shares included.
        snap.sample_duration = started.elapsed();
        if let Some(a) = &self.attributor {
            snap.attribution = Some(a.status(self.attribution_time.as_secs_f64()));
        }
        snap.config_reload = self.plan_updates.as_ref().map(|h| h.status());
        snap
    }

    fn read_all(&mut self) -> Result<(), ReadError> {
        let Some(d) = self.devices.as_mut() else {
            return Err(ReadError::Unavailable("no devices".into()));
        };
        let n = d.inventory.entities.len();
        for r in &mut d.readings {
            r.clear();
        }
        for p in &mut d.processes {
            p.clear();
        }
        d.processes_read.fill(false);
        let mut wanted: Vec<Quantity> = Vec::with_capacity(self.quantities.len());
        // A driver that vanished may answer every call with a generic error rather than
        // "not loaded"; a cycle where nothing at all succeeds is treated as that.
        let (mut succeeded, mut failed) = (0usize, None::<String>);
        for e in 0..n {
            let parent_lost = d.inventory.entities[e]
                .mig
                .as_ref()
                .is_some_and(|m| d.lost[m.parent]);
            if d.lost[e] || parent_lost {
                d.lost[e] = true;
                continue;
            }
            let is_gpu = d.inventory.entities[e].mig.is_none();
            wanted.clear();
            wanted.extend(
                self.quantities
                    .iter()
                    .filter(|(q, scope, _)| {
                        *scope != Scope::Link
                            && (is_gpu || *scope == Scope::Instance)
                            && !d.unsupported[e][*q as usize]
                    })
                    .map(|(q, _, _)| *q),
            );
            if wanted.is_empty() {
                continue;
            }
            self.source.read(e, &wanted, &mut self.scratch);
            for (q, r) in wanted.iter().zip(self.scratch.iter()) {
                match r {
                    Ok(_) => succeeded += 1,
                    Err(ReadError::NoValueYet) => succeeded += 1,
                    Err(ReadError::NotSupported) => {
                        d.unsupported[e][*q as usize] = true;
                        tracing::debug!(entity = e, quantity = ?q, "not supported; not asked again");
                    }
                    Err(ReadError::GpuLost) => mark_lost(d, e),
                    Err(ReadError::Unavailable(why)) => {
                        return Err(ReadError::Unavailable(why.clone()));
                    }
                    Err(ReadError::Failed(why)) => {
                        failed.get_or_insert_with(|| why.clone());
                        count_failure(
                            &self.quantities,
                            &self.plan,
                            &mut self.field_errors,
                            *q,
                            why,
                        );
                    }
                }
            }
            d.readings[e].extend(
                wanted
                    .iter()
                    .zip(self.scratch.iter())
                    .filter_map(|(q, r)| r.as_ref().ok().map(|r| (*q, *r))),
            );
        }
        // NVLinks, one batch per GPU.
        for r in &mut d.link_readings {
            r.clear();
        }
        let mut first = 0;
        while first < d.links.len() {
            let e = d.links[first].entity;
            let count = d.links[first..]
                .iter()
                .take_while(|l| l.entity == e)
                .count();
            let slots = first..first + count;
            first += count;
            if d.lost[e] {
                continue;
            }
            wanted.clear();
            wanted.extend(
                self.quantities
                    .iter()
                    .filter(|(q, scope, _)| {
                        *scope == Scope::Link && !d.link_unsupported[e][*q as usize]
                    })
                    .map(|(q, _, _)| *q),
            );
            if wanted.is_empty() {
                continue;
            }
            self.source
                .read_links(e, count as u32, &wanted, &mut self.scratch);
            for (qi, q) in wanted.iter().enumerate() {
                let results = || {
                    self.scratch
                        .iter()
                        .skip(qi)
                        .step_by(wanted.len())
                        .take(count)
                };
                if results().all(|r| matches!(r, Err(ReadError::NotSupported))) {
                    d.link_unsupported[e][*q as usize] = true;
                    tracing::debug!(entity = e, quantity = ?q, "not supported on any NVLink; not asked again");
                    continue;
                }
                for (slot, r) in slots.clone().zip(results()) {
                    match r {
                        Ok(raw) => {
                            succeeded += 1;
                            d.link_readings[slot].push((*q, *raw));
                        }
                        Err(ReadError::NoValueYet | ReadError::NotSupported) => {}
                        Err(ReadError::GpuLost) => mark_lost(d, e),
                        Err(ReadError::Unavailable(why)) => {
                            return Err(ReadError::Unavailable(why.clone()));
                        }
                        Err(ReadError::Failed(why)) => {
                            failed.get_or_insert_with(|| why.clone());
                            count_failure(
                                &self.quantities,
                                &self.plan,
                                &mut self.field_errors,
                                *q,
                                why,
                            );
                        }
                    }
                }
            }
        }
        if succeeded == 0
            && let Some(why) = failed
        {
            return Err(ReadError::Unavailable(format!(
                "every reading failed ({why})"
            )));
        }
        let jobs = self.hpc_jobs.as_ref().map(|j| j.load_full());
        let jobs_changed = jobs.as_ref().map(|j| j.generation) != d.hpc_generation;
        let holdings = match self.attributor.as_mut() {
            Some(a) => {
                let t = Instant::now();
                let (h, changed) = a.holdings(&d.inventory, d.generation);
                if changed || d.holdings.is_none() || jobs_changed {
                    relabel(d, Some(&h), jobs.as_deref(), &self.plan, &self.opts);
                }
                self.attribution_time += t.elapsed();
                Some(h)
            }
            None => {
                if jobs_changed {
                    relabel(d, None, jobs.as_deref(), &self.plan, &self.opts);
                }
                None
            }
        };
        for e in 0..n {
            let shared = holdings
                .as_ref()
                .is_some_and(|h| matches!(h.per_entity.get(e), Some(Holding::Shared(_))));
            if self.opts.process_metrics || shared {
                if d.lost[e] {
                    continue;
                }
                match self.source.processes(e) {
                    Ok(p) => {
                        d.processes[e] = p;
                        d.processes_read[e] = true;
                    }
                    Err(ReadError::Unavailable(why)) => return Err(ReadError::Unavailable(why)),
                    Err(_) => {}
                }
            }
        }
        for ev in self.source.xid_events() {
            if ev.entity < n {
                d.last_xid[ev.entity] = Some(ev.code);
                // dcgm-exporter reports a MIG instance's XID on its parent GPU's
                // DCGM_FI_DEV_XID_ERRORS (the only entity with that gauge); the
                // per-instance counter below keeps where it happened.
                if let Some(mig) = &d.inventory.entities[ev.entity].mig
                    && mig.parent < n
                {
                    d.last_xid[mig.parent] = Some(ev.code);
                }
                if self.exporter.any() {
                    let gpu = d.inventory.entities[ev.entity]
                        .mig
                        .as_ref()
                        .map_or(ev.entity, |m| m.parent);
                    if let Some(w) = d.windows.get_mut(gpu) {
                        w.xids.push(Instant::now(), ev.code);
                    }
                }
                let s = d.xids[ev.entity].entry(ev.code).or_insert(XidStat {
                    count: 0,
                    last_seen: ev.at,
                });
                s.count += 1;
                s.last_seen = ev.at;
                tracing::warn!(
                    gpu = d.inventory.entities[ev.entity].gpu_index,
                    xid = ev.code,
                    "XID error"
                );
            }
        }
        self.source.end_cycle();
        Ok(())
    }

    fn snapshot(&mut self, started: Instant) -> Snapshot {
        let now = Instant::now();
        let mut snap = Snapshot::empty(self.plan.clone(), self.build_labels.clone());
        snap.taken = now;
        snap.taken_at = SystemTime::now();
        snap.sample_duration = now - started;
        snap.last_success = self.last_success;
        snap.samples_total = self.samples_total;
        snap.sample_failures_total = self.failures_total;
        snap.process_metrics = self.opts.process_metrics;
        snap.field_errors = self
            .plan
            .metrics
            .iter()
            .zip(&self.field_errors)
            .filter(|(_, c)| **c > 0)
            .map(|(m, c)| (m.name, *c))
            .collect();
        let Some(d) = self.devices.as_mut() else {
            return snap;
        };
        snap.source_up = true;
        let metrics = self.plan.metrics.len();
        let n = d.inventory.entities.len();
        snap.values = vec![None; n * metrics];
        for e in 0..n {
            let up = !d.lost[e];
            let is_gpu = d.inventory.entities[e].mig.is_none();
            if up {
                for (i, m) in self.plan.metrics.iter().enumerate() {
                    snap.values[e * metrics + i] = match m.kind {
                        // The XID gauge belongs to physical GPUs, as in dcgm-exporter.
                        // Rendered from the entity's own values (`exporter`).
                        MetricKind::Exporter(_) => None,
                        MetricKind::LastXid => {
                            is_gpu.then(|| Value::Int(d.last_xid[e].map_or(0, |x| x as i64)))
                        }
                        MetricKind::Value {
                            quantity, convert, ..
                        } => d.readings[e].iter().find(|(q, _)| *q == quantity).and_then(
                            |&(_, raw)| {
                                let previous = match convert {
                                    Convert::RatePerSec(_) => {
                                        d.previous.insert((e, i), (raw.as_f64(), now))
                                    }
                                    _ => None,
                                };
                                convert_value(raw, convert, previous, now)
                            },
                        ),
                    };
                }
            }
            let shares = match (&mut self.attributor, d.holdings.as_deref()) {
                (Some(a), Some(h)) if up && d.processes_read[e] => match h.per_entity.get(e) {
                    Some(Holding::Shared(holders)) => {
                        let t = Instant::now();
                        let shares = split_entity(
                            a,
                            holders,
                            &d.share_labels[e],
                            &d.processes[e],
                            &self.splits,
                            &mut snap.values[e * metrics..(e + 1) * metrics],
                        );
                        self.attribution_time += t.elapsed();
                        shares
                    }
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            let processes = if self.opts.process_metrics {
                let samples = std::mem::take(&mut d.processes[e]);
                let held_whole = matches!(
                    d.holdings.as_deref().and_then(|h| h.per_entity.get(e)),
                    Some(Holding::Exclusive(_))
                );
                match &mut self.attributor {
                    Some(a) if !held_whole => {
                        let t = Instant::now();
                        let processes = with_pods(a, &mut self.process_pods, samples);
                        self.attribution_time += t.elapsed();
                        processes
                    }
                    _ => samples
                        .into_iter()
                        .map(|sample| ProcessSnapshot { sample, pod: None })
                        .collect(),
                }
            } else {
                Vec::new()
            };
            let exporter = (is_gpu && self.exporter.any()).then(|| {
                Box::new(exporter_values(
                    &self.exporter,
                    &mut d.windows[e],
                    &d.readings[e],
                    up,
                    now,
                ))
            });
            snap.entities.push(EntitySnapshot {
                labels: d.labels[e].clone(),
                copies: d.copies[e].clone(),
                is_gpu: d.inventory.entities[e].mig.is_none(),
                up,
                last_xid: d.last_xid[e],
                xids: d.xids[e].clone(),
                processes,
                shares,
                exporter,
            });
        }
        // NVLinks of the GPUs that are up.
        for (l, slot) in d.links.iter().enumerate() {
            if d.lost[slot.entity] {
                continue;
            }
            snap.links.push(LinkSnapshot {
                labels: slot.labels.clone(),
            });
            snap.link_values
                .extend(self.plan.metrics.iter().enumerate().map(|(i, m)| {
                    let MetricKind::Value {
                        quantity,
                        convert,
                        scope: Scope::Link,
                    } = m.kind
                    else {
                        return None;
                    };
                    let &(_, raw) = d.link_readings[l].iter().find(|(q, _)| *q == quantity)?;
                    let previous = match convert {
                        Convert::RatePerSec(_) => {
                            d.link_previous.insert((l, i), (raw.as_f64(), now))
                        }
                        _ => None,
                    };
                    convert_value(raw, convert, previous, now)
                }));
        }
        snap.allocations = d.allocation_labels.clone();
        snap.xid_window_ms = self.exporter.xid_window.as_millis() as u64;
        snap.clock_events_window_ms = self.exporter.clock_events_window.as_millis() as u64;
        if let Some(a) = self.attributor.as_mut() {
            a.end_cycle();
        }
        snap
    }
}

/// One GPU's `DCGM_EXP_*` values at `now`, from this cycle's readings and its windows.
fn exporter_values(
    c: &ExporterCollectors,
    w: &mut GpuWindows,
    readings: &[(Quantity, Raw)],
    up: bool,
    now: Instant,
) -> ExporterValues {
    let reading = |q: Quantity| {
        readings
            .iter()
            .find(|(x, _)| *x == q)
            .map(|(_, r)| r.as_f64() as u64)
    };
    let mut v = ExporterValues::default();
    w.xids.expire(now);
    for code in w.xids.values() {
        *v.xid_window.entry(code).or_insert(0) += 1;
    }
    if c.clock_events_count {
        // dcgm-exporter counts the samples (one per collect interval) with each reason
        // set; cycles with no reason set count nothing, so only those are kept.
        let known = health::CLOCK_EVENTS.iter().fold(0, |m, (bit, _)| m | bit);
        if let Some(mask) = reading(Quantity::ClockEventReasons).map(|m| m & known)
            && mask != 0
            && up
        {
            w.clock_events.push(now, mask);
        }
        w.clock_events.expire(now);
        for mask in w.clock_events.values() {
            for (i, (bit, _)) in health::CLOCK_EVENTS.iter().enumerate() {
                if mask & bit != 0 {
                    v.clock_events_window[i] += 1;
                }
            }
        }
    }
    if c.health {
        use Quantity::*;
        let counters = [
            PcieReplayCounter,
            NvlinkCrcFlitErrors,
            NvlinkCrcDataErrors,
            NvlinkReplayErrors,
            NvlinkRecoveryErrors,
        ]
        .map(reading);
        let up_by = if up {
            Some(w.counters.record(now, counters.map(|c| c.unwrap_or(0))))
        } else {
            w.counters.clear();
            None
        };
        v.health = Some(health::evaluate(&health::Signals {
            readings,
            xids: w.xids.values().collect(),
            pcie_replays: counters[0].and(up_by.map(|u| u[0])),
            nvlink_errors: counters[1..]
                .iter()
                .all(Option::is_some)
                .then_some(up_by.map(|u| [u[1], u[2], u[3], u[4]]))
                .flatten(),
            lost: !up,
        }));
    }
    v
}

/// What a rediscovery changed: the GPUs and MIG instances (by UUID) of `new` that `old`
/// lacks, and those of `old` that `new` lacks.
fn inventory_changes(old: &Inventory, new: &Inventory) -> (Vec<String>, Vec<String>) {
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

/// Pod UID → the pod's [`PodRef`], for one generation of the pod directory: a process's
/// series share their label strings across cycles instead of copying them every cycle.
#[derive(Default)]
struct PodRefs {
    generation: u64,
    by_uid: HashMap<String, Option<PodRef>>,
}

impl PodRefs {
    fn get(&mut self, pods: &PodDirectory, uid: &str) -> Option<PodRef> {
        if pods.generation != self.generation {
            self.by_uid.clear();
            self.generation = pods.generation;
        }
        if let Some(known) = self.by_uid.get(uid) {
            return known.clone();
        }
        let found = pods.by_uid.get(uid).map(|(namespace, pod)| PodRef {
            namespace: namespace.as_str().into(),
            pod: pod.as_str().into(),
        });
        self.by_uid.insert(uid.to_string(), found.clone());
        found
    }
}

/// Each process with the pod its cgroup names, when the pod watch knows that pod.
fn with_pods(
    a: &mut Attributor,
    refs: &mut PodRefs,
    samples: Vec<ProcessSample>,
) -> Vec<ProcessSnapshot> {
    let pods = a.pods();
    samples
        .into_iter()
        .map(|sample| {
            let pod = if pods.synced {
                a.pod_of(sample.pid)
                    .and_then(|pc| refs.get(&pods, &pc.pod_uid))
            } else {
                None
            };
            ProcessSnapshot { sample, pod }
        })
        .collect()
}

/// Split the split metrics of one shared entity between the pods holding it, from the
/// processes on it: each process's pod comes from its cgroup and the pod directory;
/// processes of no holding pod (other pods, system processes, unreadable cgroups) make
/// up the remainder left on the entity's own series. `values` are the entity's values,
/// one per plan metric; the split ones are replaced by their remainder.
fn split_entity(
    a: &mut Attributor,
    holders: &[Holder],
    labels: &[Arc<str>],
    processes: &[ProcessSample],
    splits: &[(usize, Split)],
    values: &mut [Option<Value>],
) -> Vec<PodShare> {
    let pods = a.pods();
    if !pods.synced {
        // Without pod UIDs, no process can be placed: leave the device whole rather
        // than report every pod at zero.
        return Vec::new();
    }
    let mut sm = vec![0u64; holders.len()];
    let mut mem = vec![0u64; holders.len()];
    let mut sm_all = 0u64;
    for p in processes {
        let sm_p = u64::from(p.sm_util_percent.unwrap_or(0));
        sm_all += sm_p;
        let holder = a
            .pod_of(p.pid)
            .and_then(|pc| pods.by_uid.get(&pc.pod_uid))
            .and_then(|(ns, name)| {
                holders
                    .iter()
                    .position(|h| &*h.namespace == ns && &*h.pod == name)
            });
        if let Some(i) = holder {
            sm[i] += sm_p;
            mem[i] += p.used_memory_bytes.unwrap_or(0);
        }
    }
    let mut shares: Vec<PodShare> = labels
        .iter()
        .map(|l| PodShare {
            labels: l.clone(),
            values: Vec::with_capacity(splits.len()),
        })
        .collect();
    for &(m, how) in splits {
        let Some(Some(Value::Int(total))) = values.get(m).copied() else {
            continue;
        };
        let (parts, rest) = match how {
            Split::BySmShare => split_proportional(total, &sm, sm_all),
            Split::ByMemory => {
                let mib: Vec<u64> = mem.iter().map(|b| b >> 20).collect();
                split_owned(total, &mib)
            }
        };
        for (share, v) in shares.iter_mut().zip(parts) {
            share.values.push((m, Value::Int(v)));
        }
        values[m] = Some(Value::Int(rest));
    }
    shares
}

/// Convert a raw reading to dcgm's units. `previous` is the last raw value of this
/// series, for rates; a rate needs two readings and a counter that did not go back.
fn convert_value(
    raw: Raw,
    c: Convert,
    previous: Option<(f64, Instant)>,
    now: Instant,
) -> Option<Value> {
    match c {
        Convert::Int => Some(Value::Int(match raw {
            Raw::U64(v) => i64::try_from(v).unwrap_or(i64::MAX),
            Raw::F64(v) => v.round() as i64,
        })),
        Convert::Float(div) => Some(Value::Float(raw.as_f64() / div)),
        Convert::IntDiv(div) => Some(Value::Int(match raw {
            Raw::U64(v) => i64::try_from(v / div).unwrap_or(i64::MAX),
            Raw::F64(v) => (v / div as f64) as i64,
        })),
        Convert::IntMul(mul) => Some(Value::Int((raw.as_f64() * mul).round() as i64)),
        Convert::RatePerSec(div) => {
            let (prev, at) = previous?;
            let dt = now.saturating_duration_since(at).as_secs_f64();
            let cur = raw.as_f64();
            (dt > 0.0 && cur >= prev).then(|| Value::Int(((cur - prev) / dt / div).round() as i64))
        }
    }
}

/// A cycle that has not finished after this many intervals counts as hung.
pub const HUNG_INTERVALS: u32 = 3;

/// Run the sampler until `stop` receives or disconnects, publishing into `store`.
///
/// Cycles run on a worker thread so that a GPU call that never returns cannot silence
/// the exporter: after [`HUNG_INTERVALS`] intervals without a result this thread
/// publishes a snapshot that says the source is hung (no device data, `source_up` 0,
/// `source_hung` 1), and keeps doing so until the worker comes back.
pub fn run(sampler: Sampler, store: Arc<SnapshotStore>, stop: Receiver<()>) {
    let interval = sampler.opts.interval;
    let budget = interval * HUNG_INTERVALS;
    let (tick_tx, tick_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<Snapshot>(1);
    let mut sampler = sampler;
    let worker = std::thread::Builder::new()
        .name("sampler-worker".into())
        .spawn(move || {
            while tick_rx.recv().is_ok() {
                if done_tx.send(sampler.cycle()).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = worker {
        tracing::error!(error = %e, "cannot start the sampling thread");
        return;
    }
    let mut next = Instant::now();
    loop {
        if tick_tx.send(()).is_err() {
            return;
        }
        let started = Instant::now();
        let mut hung = false;
        loop {
            match done_rx.recv_timeout(budget.min(interval)) {
                Ok(snap) => {
                    if hung {
                        tracing::info!(after = ?started.elapsed(), "GPU source answers again");
                    }
                    store.store(Arc::new(snap));
                    break;
                }
                Err(RecvTimeoutError::Timeout) if started.elapsed() >= budget => {
                    if !hung {
                        tracing::error!(budget = ?budget, "a GPU call has not returned; reporting the source as hung");
                    }
                    hung = true;
                    store.store(Arc::new(Snapshot::hung(&store.load())));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            match stop.try_recv() {
                Ok(()) | Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
            }
        }
        next += interval;
        let now = Instant::now();
        if next < now {
            // A cycle overran the interval: start the next one now, without a burst.
            next = now;
        }
        match stop.recv_timeout(next - now) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Mark entity `e` lost (fallen off the bus), logging it the first time.
fn mark_lost(d: &mut Devices, e: usize) {
    if !d.lost[e] {
        let entity = &d.inventory.entities[e];
        tracing::error!(gpu = entity.gpu_index, uuid = %entity.uuid, "GPU is lost (fallen off the bus)");
    }
    d.lost[e] = true;
}

/// Count a failed read of `q` against every metric it feeds, warning on each metric's
/// first failure.
fn count_failure(
    quantities: &[(Quantity, Scope, Vec<usize>)],
    plan: &ExportPlan,
    field_errors: &mut [u64],
    q: Quantity,
    why: &str,
) {
    let Some((_, _, metrics)) = quantities.iter().find(|(x, _, _)| *x == q) else {
        return;
    };
    for &m in metrics {
        if field_errors[m] == 0 {
            tracing::warn!(field = plan.metrics[m].name, error = %why, "field read failed");
        }
        field_errors[m] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    /// A driver that is up or down on command, counting probes and discoveries.
    #[derive(Clone, Default)]
    struct Scripted {
        /// Probes pass.
        probe_up: Arc<AtomicBool>,
        /// Discoveries succeed.
        discover_up: Arc<AtomicBool>,
        probes: Arc<AtomicU32>,
        discoveries: Arc<AtomicU32>,
    }

    impl GpuSource for Scripted {
        fn describe(&self) -> String {
            "scripted".into()
        }
        fn discover(&mut self, _: &[crate::catalog::LabelField]) -> Result<Inventory, ReadError> {
            self.discoveries.fetch_add(1, Ordering::SeqCst);
            if self.discover_up.load(Ordering::SeqCst) {
                Ok(Inventory {
                    driver_version: "1".into(),
                    nvml_version: "1".into(),
                    entities: Vec::new(),
                })
            } else {
                Err(ReadError::Unavailable("down".into()))
            }
        }
        fn probe(&mut self) -> Result<(), ReadError> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            if self.probe_up.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(ReadError::Unavailable("down".into()))
            }
        }
        fn read(&mut self, _: usize, _: &[Quantity], _: &mut Vec<Result<Raw, ReadError>>) {}
        fn processes(&mut self, _: usize) -> Result<Vec<ProcessSample>, ReadError> {
            Ok(Vec::new())
        }
        fn xid_events(&mut self) -> Vec<crate::source::XidEvent> {
            Vec::new()
        }
    }

    /// A driver whose device set the test changes: `now` is what the driver lists,
    /// checked against what the last discovery saw, as a real source compares layouts.
    #[derive(Clone, Default)]
    struct Reshaping {
        now: Arc<std::sync::Mutex<Vec<EntityInfo>>>,
        discovered: Vec<EntityInfo>,
        discoveries: Arc<AtomicU32>,
        /// An NVLink counter that advances by one GiB per read of any entity: forward
        /// from one entity to the next, so a reading carried over would give a rate.
        reads: u64,
    }

    fn gpu(index: u32) -> EntityInfo {
        EntityInfo {
            gpu_index: index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:0{index}:00.0"),
            model_name: "NVIDIA H100 80GB HBM3".into(),
            minor_number: Some(index),
            mig: None,
            labels: Default::default(),
            lost: false,
        }
    }

    fn mig(parent: u32, gi: u32, uuid: &str) -> EntityInfo {
        EntityInfo {
            mig: Some(crate::source::MigInfo {
                parent: parent as usize,
                gpu_instance_id: gi,
                compute_instance_id: 0,
                slot: 0,
                profile: "1g.10gb".into(),
                mig_uuid: uuid.into(),
                placement: None,
            }),
            ..gpu(parent)
        }
    }

    impl Reshaping {
        fn set(&self, entities: Vec<EntityInfo>) {
            *self.now.lock().unwrap() = entities;
        }
    }

    impl GpuSource for Reshaping {
        fn describe(&self) -> String {
            "reshaping".into()
        }
        fn discover(&mut self, _: &[crate::catalog::LabelField]) -> Result<Inventory, ReadError> {
            self.discoveries.fetch_add(1, Ordering::SeqCst);
            self.discovered = self.now.lock().unwrap().clone();
            Ok(Inventory {
                driver_version: "1".into(),
                nvml_version: "1".into(),
                entities: self.discovered.clone(),
            })
        }
        fn probe(&mut self) -> Result<(), ReadError> {
            Ok(())
        }
        fn device_set_changed(&mut self) -> bool {
            *self.now.lock().unwrap() != self.discovered
        }
        fn read(&mut self, e: usize, wanted: &[Quantity], out: &mut Vec<Result<Raw, ReadError>>) {
            assert!(e < self.discovered.len());
            self.reads += 1;
            let kib = self.reads * (1 << 20);
            out.clear();
            out.extend(wanted.iter().map(|q| match q {
                Quantity::NvlinkDataKib => Ok(Raw::U64(kib)),
                _ => Err(ReadError::NotSupported),
            }));
        }
        fn processes(&mut self, _: usize) -> Result<Vec<ProcessSample>, ReadError> {
            Ok(Vec::new())
        }
        fn xid_events(&mut self) -> Vec<crate::source::XidEvent> {
            Vec::new()
        }
    }

    /// A sampler on `source` exporting one NVLink rate.
    fn rate_sampler(source: &Reshaping) -> Sampler {
        let (plan, _) =
            crate::counters::plan("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, n\n", "test.csv")
                .unwrap();
        Sampler::new(
            Box::new(source.clone()),
            Arc::new(plan),
            SamplerOptions {
                interval: Duration::from_secs(3600),
                hostname: None,
                replace_blanks_in_model_name: false,
                process_metrics: false,
                pod_uid: false,
                virtual_gpus: false,
                old_namespace: false,
            },
            "".into(),
        )
    }

    /// The MIG UUIDs (or GPU UUIDs) of a snapshot's entities.
    fn names(snap: &Snapshot, s: &Sampler) -> Vec<String> {
        let inv = &s.devices.as_ref().unwrap().inventory;
        assert_eq!(inv.entities.len(), snap.entities.len());
        inv.entities
            .iter()
            .map(|e| {
                e.mig
                    .as_ref()
                    .map_or(e.uuid.clone(), |m| m.mig_uuid.clone())
            })
            .collect()
    }

    #[test]
    fn gpus_and_mig_instances_that_come_or_go_are_rediscovered_on_the_next_cycle_only() {
        let source = Reshaping::default();
        source.set(vec![gpu(0)]);
        let mut s = rate_sampler(&source);
        for _ in 0..5 {
            s.cycle();
        }
        // Nothing changed: the one discovery at start.
        assert_eq!(source.discoveries.load(Ordering::SeqCst), 1);
        let generation = s.devices.as_ref().unwrap().generation;

        source.set(vec![gpu(0), mig(0, 7, "MIG-a")]);
        let snap = s.cycle();
        assert_eq!(names(&snap, &s), ["GPU-0", "MIG-a"]);
        // Attribution caches keyed by generation see a new inventory.
        assert!(s.devices.as_ref().unwrap().generation > generation);

        source.set(vec![gpu(0), gpu(1)]);
        let snap = s.cycle();
        assert_eq!(names(&snap, &s), ["GPU-0", "GPU-1"]);
        assert_eq!(source.discoveries.load(Ordering::SeqCst), 3);
        for _ in 0..3 {
            s.cycle();
        }
        assert_eq!(source.discoveries.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_device_that_replaces_another_at_the_same_index_starts_fresh() {
        let source = Reshaping::default();
        source.set(vec![gpu(0)]);
        let mut s = rate_sampler(&source);
        let rate = 0;
        s.cycle();
        // The second reading gives the rate.
        assert!(s.cycle().value(0, rate).is_some());
        // Another GPU at index 0 (a MIG instance created again with the same GI is
        // the same case: a new UUID at the same place).
        let mut other = gpu(0);
        other.uuid = "GPU-other".into();
        source.set(vec![other]);
        let snap = s.cycle();
        assert_eq!(names(&snap, &s), ["GPU-other"]);
        // Its first reading has no rate: the old GPU's last reading is not its own.
        assert_eq!(snap.value(0, rate), None);
        assert!(s.cycle().value(0, rate).is_some());
    }

    #[test]
    fn a_node_whose_driver_lists_no_gpu_is_not_ready_until_gpus_appear() {
        let source = Reshaping::default();
        let mut s = rate_sampler(&source);
        let store = Arc::new(SnapshotStore::new(Snapshot::empty(
            Arc::new(ExportPlan::default()),
            "".into(),
        )));
        let state = crate::http::AppState::new(store.clone(), Duration::from_secs(3600), false);
        for _ in 0..3 {
            store.store(Arc::new(s.cycle()));
            let why = state.readiness(Instant::now()).unwrap_err();
            assert!(why.contains("no GPU"), "{why}");
        }
        source.set(vec![gpu(0)]);
        store.store(Arc::new(s.cycle()));
        assert_eq!(state.readiness(Instant::now()), Ok(()));
        assert_eq!(store.load().entities.len(), 1);
    }

    #[test]
    fn rediscovery_names_the_gpus_and_mig_instances_that_came_and_went() {
        let inv = |entities| Inventory {
            driver_version: "1".into(),
            nvml_version: "1".into(),
            entities,
        };
        let (added, removed) = inventory_changes(
            &inv(vec![gpu(0), mig(0, 7, "MIG-old")]),
            &inv(vec![gpu(0), gpu(1), mig(0, 7, "MIG-new")]),
        );
        assert_eq!(added.len(), 2, "{added:?}");
        assert!(added[0].contains("GPU-1") && added[1].contains("MIG-new"));
        assert_eq!(removed.len(), 1);
        assert!(removed[0].contains("MIG-old"));
    }

    /// A sampler on `source` whose discovery backoff never comes due within a test: only
    /// probes can bring the driver back.
    fn sampler(source: &Scripted) -> Sampler {
        Sampler::new(
            Box::new(source.clone()),
            Arc::new(ExportPlan::default()),
            SamplerOptions {
                interval: Duration::from_secs(3600),
                hostname: None,
                replace_blanks_in_model_name: false,
                process_metrics: false,
                pod_uid: false,
                virtual_gpus: false,
                old_namespace: false,
            },
            "".into(),
        )
    }

    #[test]
    fn a_down_driver_is_probed_every_cycle_and_discovered_on_the_first_passing_probe() {
        let source = Scripted::default();
        let mut s = sampler(&source);
        for _ in 0..10 {
            assert!(!s.cycle().source_up);
        }
        // One discovery at start; after that only the cheap probe, once per cycle.
        assert_eq!(source.discoveries.load(Ordering::SeqCst), 1);
        assert_eq!(source.probes.load(Ordering::SeqCst), 9);
        source.probe_up.store(true, Ordering::SeqCst);
        source.discover_up.store(true, Ordering::SeqCst);
        assert!(
            s.cycle().source_up,
            "back on the first cycle after the driver"
        );
        assert_eq!(source.discoveries.load(Ordering::SeqCst), 2);
        // Up again: no more probes.
        assert!(s.cycle().source_up);
        assert_eq!(source.probes.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn a_probe_that_passed_before_a_failed_discovery_is_not_trusted_again() {
        let source = Scripted::default();
        source.probe_up.store(true, Ordering::SeqCst);
        let mut s = sampler(&source);
        for _ in 0..10 {
            assert!(!s.cycle().source_up);
        }
        // The start, then the one discovery the first probe let through; then nothing
        // until the backoff comes due, instead of a full discovery every cycle.
        assert_eq!(source.discoveries.load(Ordering::SeqCst), 2);
        assert_eq!(source.probes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn rates_need_two_readings_and_a_forward_counter() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        let c = Convert::RatePerSec(1000.0);
        assert_eq!(convert_value(Raw::U64(5000), c, None, t1), None);
        assert_eq!(
            convert_value(Raw::U64(9000), c, Some((5000.0, t0)), t1),
            Some(Value::Int(2))
        );
        assert_eq!(convert_value(Raw::U64(10), c, Some((5000.0, t0)), t1), None);
    }

    #[test]
    fn conversions_use_dcgm_units() {
        let now = Instant::now();
        assert_eq!(
            convert_value(Raw::U64(287_415), Convert::Float(1000.0), None, now),
            Some(Value::Float(287.415))
        );
        assert_eq!(
            convert_value(Raw::U64(3 << 20 | 5), Convert::IntDiv(1 << 20), None, now),
            Some(Value::Int(3))
        );
    }

    #[test]
    fn whole_unit_conversions_scale_float_readings_and_round_products() {
        let now = Instant::now();
        // A float reading divided down to whole units: 7.5 MiB in bytes is 7 MiB.
        assert_eq!(
            convert_value(
                Raw::F64(7.5 * 1048576.0),
                Convert::IntDiv(1 << 20),
                None,
                now
            ),
            Some(Value::Int(7))
        );
        // Scaled up: 0.25 of a unit, times 1000, is 250.
        assert_eq!(
            convert_value(Raw::F64(0.25), Convert::IntMul(1000.0), None, now),
            Some(Value::Int(250))
        );
    }

    #[test]
    fn a_rate_over_no_elapsed_time_is_not_reported() {
        let t0 = Instant::now();
        let c = Convert::RatePerSec(1.0);
        // Two readings at the same instant: no time to divide by, whatever the counter did.
        assert_eq!(convert_value(Raw::U64(9), c, Some((5.0, t0)), t0), None);
        assert_eq!(convert_value(Raw::U64(5), c, Some((5.0, t0)), t0), None);
    }

    /// Pod UIDs of the split tests: two holders of the GPU, a third pod on the same
    /// namespace that does not hold it, and a pod named like a holder in another
    /// namespace.
    const UID_A: &str = "0a0a0a0a-0000-0000-0000-00000000000a";
    const UID_B: &str = "0b0b0b0b-0000-0000-0000-00000000000b";
    const UID_C: &str = "0c0c0c0c-0000-0000-0000-00000000000c";
    const UID_D: &str = "0d0d0d0d-0000-0000-0000-00000000000d";

    /// An attributor whose pod directory knows `pods` (uid, namespace, name) and whose
    /// `/proc` (under `proc_root`) places each of `procs` (pid, uid) in its pod.
    fn attributor_with(
        proc_root: &std::path::Path,
        pods: &[(&str, &str, &str)],
        procs: &[(u32, &str)],
        synced: bool,
        kubelet: crate::attribution::kubelet::KubeletView,
    ) -> Attributor {
        for (pid, uid) in procs {
            let dir = proc_root.join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join("cgroup"),
                format!(
                    "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope\n",
                    uid.replace('-', "_"),
                    "ab".repeat(32)
                ),
            )
            .unwrap();
        }
        let mut directory = PodDirectory {
            generation: 1,
            synced,
            up: synced,
            ..PodDirectory::default()
        };
        for (uid, ns, name) in pods {
            directory
                .by_uid
                .insert(uid.to_string(), (ns.to_string(), name.to_string()));
        }
        let mut a = Attributor::new(
            Arc::new(arc_swap::ArcSwap::from_pointee(kubelet)),
            Arc::new(arc_swap::ArcSwap::from_pointee(directory)),
            true,
            proc_root.to_path_buf(),
        );
        // The shares use the directory the holdings were computed from. A generation no
        // sampler's discovery has, so a sampler computes its own holdings.
        let inv = Inventory {
            driver_version: "1".into(),
            nvml_version: "1".into(),
            entities: Vec::new(),
        };
        a.holdings(&inv, u64::MAX);
        a
    }

    fn holder(namespace: &str, pod: &str) -> Holder {
        Holder {
            namespace: namespace.into(),
            pod: pod.into(),
            container: None,
            pod_labels: Vec::new(),
            pod_uid: None,
            vgpu: None,
            dra: None,
        }
    }

    fn process(pid: u32, sm: Option<u32>, memory_bytes: u64) -> ProcessSample {
        ProcessSample {
            pid,
            name: format!("p{pid}"),
            used_memory_bytes: Some(memory_bytes),
            sm_util_percent: sm,
        }
    }

    const MIB: u64 = 1 << 20;

    /// Processes on one GPU held by pods `a` and `b` of namespace `ns`: `a` runs at 30 %
    /// SM with 100 MiB, `b` at 10 % with 300 MiB, pod `c` (same namespace, not a holder)
    /// at 20 % with 50 MiB, pod `a` of namespace `other` at 20 % with 40 MiB, and a
    /// process outside any pod (no cgroup file) with 8 MiB and no SM figure. Memory
    /// figures carry some bytes past the MiB, which are not counted.
    fn shared_gpu_processes() -> Vec<ProcessSample> {
        vec![
            process(101, Some(30), 100 * MIB + 4095),
            process(102, Some(10), 300 * MIB + 1),
            process(103, Some(20), 50 * MIB),
            process(104, Some(20), 40 * MIB),
            process(105, None, 8 * MIB),
        ]
    }

    fn shared_gpu_attributor(
        proc_root: &std::path::Path,
        synced: bool,
        kubelet: crate::attribution::kubelet::KubeletView,
    ) -> Attributor {
        attributor_with(
            proc_root,
            &[
                (UID_A, "ns", "a"),
                (UID_B, "ns", "b"),
                (UID_C, "ns", "c"),
                (UID_D, "other", "a"),
            ],
            &[(101, UID_A), (102, UID_B), (103, UID_C), (104, UID_D)],
            synced,
            kubelet,
        )
    }

    #[test]
    fn a_shared_gpu_is_split_between_its_holders_by_their_own_processes() {
        let proc_root = tempfile::tempdir().unwrap();
        let mut a = shared_gpu_attributor(proc_root.path(), true, Default::default());
        let holders = [holder("ns", "a"), holder("ns", "b")];
        let labels: [Arc<str>; 2] = ["pod-a".into(), "pod-b".into()];
        // Utilisation 90 % and 1000 MiB used on the device; a third metric not split.
        let mut values = [
            Some(Value::Int(90)),
            Some(Value::Int(1000)),
            Some(Value::Float(1.5)),
        ];
        let splits = [(0, Split::BySmShare), (1, Split::ByMemory)];
        let shares = split_entity(
            &mut a,
            &holders,
            &labels,
            &shared_gpu_processes(),
            &splits,
            &mut values,
        );
        // SM: the processes add up to 30 + 10 + 20 + 20 = 80 %; pod a ran 30 of them, so
        // 30/80 of the device's 90 % is 33.75, b 10/80 of it 11.25; rounded to whole
        // percent with the sum kept, a 34 and b 11; the other 45 stay on the device.
        // Memory: each holder its own MiB, the rest of the 1000 on the device.
        let expected_sm = [90 * 30 / 80 + 1, 90 * 10 / 80];
        let expected_mem = [100, 300];
        assert_eq!(shares.len(), 2, "one share per holder");
        for (i, share) in shares.iter().enumerate() {
            assert_eq!(share.labels, labels[i]);
            assert_eq!(
                share.values,
                vec![
                    (0, Value::Int(expected_sm[i])),
                    (1, Value::Int(expected_mem[i]))
                ],
                "share of {}",
                labels[i]
            );
        }
        assert_eq!(
            values,
            [
                Some(Value::Int(90 - expected_sm.iter().sum::<i64>())),
                Some(Value::Int(1000 - 400)),
                Some(Value::Float(1.5)),
            ],
            "the device keeps what no holder used; unsplit metrics are untouched"
        );
    }

    #[test]
    fn without_a_synced_pod_directory_a_shared_gpu_stays_whole() {
        let proc_root = tempfile::tempdir().unwrap();
        let mut a = shared_gpu_attributor(proc_root.path(), false, Default::default());
        let holders = [holder("ns", "a"), holder("ns", "b")];
        let labels: [Arc<str>; 2] = ["pod-a".into(), "pod-b".into()];
        let mut values = [Some(Value::Int(90)), Some(Value::Int(1000))];
        let before = values;
        let shares = split_entity(
            &mut a,
            &holders,
            &labels,
            &shared_gpu_processes(),
            &[(0, Split::BySmShare), (1, Split::ByMemory)],
            &mut values,
        );
        assert!(shares.is_empty());
        assert_eq!(values, before);
    }

    const GPU_UUIDS: [&str; 3] = [
        "GPU-aaaaaaaa-0000-0000-0000-000000000000",
        "GPU-11111111-1111-1111-1111-111111111111",
        "GPU-22222222-2222-2222-2222-222222222222",
    ];
    /// Per GPU: utilisation (%) and memory used (MiB) the driver reports.
    const GPU_UTIL: [u64; 3] = [20, 90, 50];
    const FB_USED_MIB: [u64; 3] = [200, 1000, 500];
    /// NVLink counter (KiB) advance per cycle of GPU e: (e + 1) times this.
    const NVLINK_STEP_KIB: u64 = 1_000_000_000_000;

    /// Three GPUs: 0 held whole by pod `ns/c`; 1 shared by `ns/a` and `ns/b`, with the
    /// processes of [`shared_gpu_processes`]; 2 shared by the same pods, whose process
    /// list cannot be read. The SM clock fails on every GPU.
    struct ThreeGpus {
        cycles: u64,
    }

    impl GpuSource for ThreeGpus {
        fn describe(&self) -> String {
            "three GPUs".into()
        }
        fn discover(&mut self, _: &[crate::catalog::LabelField]) -> Result<Inventory, ReadError> {
            Ok(Inventory {
                driver_version: "1".into(),
                nvml_version: "1".into(),
                entities: (0..3)
                    .map(|i| EntityInfo {
                        gpu_index: i as u32,
                        uuid: GPU_UUIDS[i].into(),
                        minor_number: Some(i as u32),
                        pci_bus_id: format!("00000000:0{i}:00.0"),
                        model_name: "NVIDIA H100 80GB HBM3".into(),
                        mig: None,
                        labels: Default::default(),
                        lost: false,
                    })
                    .collect(),
            })
        }
        fn probe(&mut self) -> Result<(), ReadError> {
            Ok(())
        }
        fn read(&mut self, e: usize, wanted: &[Quantity], out: &mut Vec<Result<Raw, ReadError>>) {
            out.clear();
            out.extend(wanted.iter().map(|q| match q {
                Quantity::GpuUtil => Ok(Raw::U64(GPU_UTIL[e])),
                Quantity::FbUsed => Ok(Raw::U64(FB_USED_MIB[e] * MIB)),
                Quantity::NvlinkDataKib => Ok(Raw::U64(
                    (e as u64 + 1) * NVLINK_STEP_KIB * (self.cycles + 1),
                )),
                _ => Err(ReadError::Failed("broken".into())),
            }));
        }
        fn processes(&mut self, e: usize) -> Result<Vec<ProcessSample>, ReadError> {
            match e {
                0 => Ok(vec![process(103, Some(20), 50 * MIB)]),
                1 => Ok(shared_gpu_processes()),
                _ => Err(ReadError::Failed("no process list".into())),
            }
        }
        fn end_cycle(&mut self) {
            self.cycles += 1;
        }
        fn xid_events(&mut self) -> Vec<crate::source::XidEvent> {
            Vec::new()
        }
    }

    #[test]
    fn a_snapshot_splits_shared_gpus_labels_processes_and_rates_each_gpus_own_readings() {
        use crate::attribution::device_id::DeviceId;
        use crate::attribution::kubelet::{AllocatedDevice, Allocation, KubeletView};
        let proc_root = tempfile::tempdir().unwrap();
        let alloc = |pod: &str, gpu: usize| Allocation {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            shared_resource: false,
            device: AllocatedDevice::Plugin(GPU_UUIDS[gpu].parse::<DeviceId>().unwrap()),
        };
        let kubelet = KubeletView {
            generation: 1,
            allocations: vec![
                alloc("a", 1),
                alloc("a", 2),
                alloc("b", 1),
                alloc("b", 2),
                alloc("c", 0),
            ],
            up: true,
            ..KubeletView::default()
        };
        let a = shared_gpu_attributor(proc_root.path(), true, kubelet);
        // The rate first, the split metrics last: a share's slice of the values must
        // start at its own GPU's first metric.
        let (plan, _) = crate::counters::plan(
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, n\n\
             DCGM_FI_DEV_SM_CLOCK, gauge, c\n\
             DCGM_FI_DEV_GPU_UTIL, gauge, u\n\
             DCGM_FI_DEV_FB_USED, gauge, m\n",
            "test.csv",
        )
        .unwrap();
        let index = |name: &str| plan.metrics.iter().position(|m| m.name == name).unwrap();
        let (rate, clock, util, fb) = (
            index("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"),
            index("DCGM_FI_DEV_SM_CLOCK"),
            index("DCGM_FI_DEV_GPU_UTIL"),
            index("DCGM_FI_DEV_FB_USED"),
        );
        let metrics = plan.metrics.len();
        let mut s = Sampler::new(
            Box::new(ThreeGpus { cycles: 0 }),
            Arc::new(plan),
            SamplerOptions {
                interval: Duration::from_secs(3600),
                hostname: None,
                replace_blanks_in_model_name: false,
                process_metrics: true,
                pod_uid: false,
                virtual_gpus: false,
                old_namespace: false,
            },
            "".into(),
        )
        .with_attribution(a);

        let started = Instant::now();
        let first = s.cycle();
        assert!(first.source_up);
        assert_eq!(first.field_errors, vec![("DCGM_FI_DEV_SM_CLOCK", 3)]);
        for e in 0..3 {
            assert!(first.entities[e].up);
            assert_eq!(
                first.values[e * metrics + rate],
                None,
                "one reading, no rate"
            );
            assert_eq!(first.values[e * metrics + clock], None);
        }
        let snap = s.cycle();
        let elapsed = started.elapsed().as_secs_f64();
        assert_eq!(snap.field_errors, vec![("DCGM_FI_DEV_SM_CLOCK", 6)]);
        assert_eq!(snap.entities.len(), 3);
        let value = |e: usize, m: usize| snap.values[e * metrics + m];

        // Rates: GPU e's counter advanced (e + 1) steps over the same interval, at most
        // `elapsed`, so its rate is (e + 1) times GPU 0's and at least step / elapsed.
        let rates: Vec<i64> = (0..3)
            .map(|e| match value(e, rate) {
                Some(Value::Int(r)) => r,
                other => panic!("GPU {e}: no rate after two readings: {other:?}"),
            })
            .collect();
        assert!(rates[0] as f64 >= NVLINK_STEP_KIB as f64 / elapsed / 1000.0 - 0.5);
        for e in 1..3 {
            assert!(
                (rates[e] - (e as i64 + 1) * rates[0]).abs() <= 1,
                "rates {rates:?}"
            );
        }

        // GPU 0, held whole: its own values, no shares, its processes not given a pod
        // (the device's labels already name it).
        assert!(snap.entities[0].up);
        assert_eq!(value(0, util), Some(Value::Int(GPU_UTIL[0] as i64)));
        assert_eq!(value(0, fb), Some(Value::Int(FB_USED_MIB[0] as i64)));
        assert!(snap.entities[0].shares.is_empty());
        let pods = |e: usize| -> Vec<(u32, Option<(String, String)>)> {
            snap.entities[e]
                .processes
                .iter()
                .map(|p| {
                    let pod = p
                        .pod
                        .as_ref()
                        .map(|r| (r.namespace.to_string(), r.pod.to_string()));
                    (p.sample.pid, pod)
                })
                .collect()
        };
        assert_eq!(pods(0), vec![(103, None)]);

        // GPU 1, shared: split as in
        // `a_shared_gpu_is_split_between_its_holders_by_their_own_processes`.
        let shares: Vec<Vec<(usize, Value)>> = snap.entities[1]
            .shares
            .iter()
            .map(|s| s.values.clone())
            .collect();
        let expected_sm = [90 * 30 / 80 + 1, 90 * 10 / 80];
        assert_eq!(
            shares,
            vec![
                vec![(util, Value::Int(expected_sm[0])), (fb, Value::Int(100))],
                vec![(util, Value::Int(expected_sm[1])), (fb, Value::Int(300))],
            ]
        );
        assert_eq!(value(1, util), Some(Value::Int(90 - 45)));
        assert_eq!(value(1, fb), Some(Value::Int(1000 - 400)));
        let pod = |ns: &str, name: &str| Some((ns.to_string(), name.to_string()));
        assert_eq!(
            pods(1),
            vec![
                (101, pod("ns", "a")),
                (102, pod("ns", "b")),
                (103, pod("ns", "c")),
                (104, pod("other", "a")),
                (105, None),
            ]
        );

        // GPU 2, shared but with no process list: left whole rather than split blind.
        assert!(snap.entities[2].shares.is_empty());
        assert_eq!(value(2, util), Some(Value::Int(GPU_UTIL[2] as i64)));
        assert_eq!(value(2, fb), Some(Value::Int(FB_USED_MIB[2] as i64)));
        assert!(snap.entities[2].processes.is_empty());
    }

    /// The text series of `name` in a snapshot's device families.
    fn rendered(snap: &Snapshot, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        crate::encode::render_device_families(snap, crate::encode::Format::Text, &mut out);
        String::from_utf8(out)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .map(str::to_string)
            .collect()
    }

    fn opts(pod_uid: bool, virtual_gpus: bool) -> SamplerOptions {
        SamplerOptions {
            interval: Duration::from_secs(3600),
            hostname: None,
            replace_blanks_in_model_name: false,
            process_metrics: false,
            pod_uid,
            virtual_gpus,
            old_namespace: false,
        }
    }

    /// Pod `c` holds GPU 0 whole; pods `a` and `b` share GPU 1 as time-slicing replicas
    /// 0 and 1; every pod has a `team` label and a UID.
    fn replicas_attributor(proc_root: &std::path::Path) -> Attributor {
        use crate::attribution::device_id::DeviceId;
        use crate::attribution::kubelet::{AllocatedDevice, Allocation, KubeletView};
        use crate::attribution::pods::PodInfo;
        let alloc = |pod: &str, id: String| Allocation {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            shared_resource: false,
            device: AllocatedDevice::Plugin(id.parse::<DeviceId>().unwrap()),
        };
        let kubelet = KubeletView {
            generation: 1,
            allocations: vec![
                alloc("a", format!("{}::0", GPU_UUIDS[1])),
                alloc("b", format!("{}::1", GPU_UUIDS[1])),
                alloc("c", GPU_UUIDS[0].to_string()),
            ],
            up: true,
            ..KubeletView::default()
        };
        let mut directory = PodDirectory {
            generation: 2,
            synced: true,
            up: true,
            ..PodDirectory::default()
        };
        for (uid, pod) in [(UID_A, "a"), (UID_B, "b"), (UID_C, "c")] {
            directory.pods.insert(
                ("ns".to_string(), pod.to_string()),
                PodInfo {
                    uid: uid.into(),
                    labels: vec![("team".into(), format!("team-{pod}"))],
                },
            );
        }
        Attributor::new(
            Arc::new(ArcSwap::from_pointee(kubelet)),
            Arc::new(ArcSwap::from_pointee(directory)),
            true,
            proc_root.to_path_buf(),
        )
    }

    fn nvlink_and_util_plan() -> ExportPlan {
        crate::counters::plan(
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, n\n\
             DCGM_FI_DEV_GPU_UTIL, gauge, u\n",
            "test.csv",
        )
        .unwrap()
        .0
    }

    #[test]
    fn virtual_gpus_repeat_a_shared_gpus_series_per_pod_with_vgpu_and_pod_uid() {
        let proc_root = tempfile::tempdir().unwrap();
        let mut s = Sampler::new(
            Box::new(ThreeGpus { cycles: 0 }),
            Arc::new(nvlink_and_util_plan()),
            opts(true, true),
            "".into(),
        )
        .with_attribution(replicas_attributor(proc_root.path()));
        s.cycle();
        let snap = s.cycle();
        let nvlink = rendered(&snap, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL");
        let on_gpu = |g: usize| -> Vec<&String> {
            nvlink
                .iter()
                .filter(|l| l.contains(&format!("{{gpu=\"{g}\"")))
                .collect()
        };
        // GPU 1: one series per pod, none for the device alone; the same value each.
        let gpu1 = on_gpu(1);
        assert_eq!(gpu1.len(), 2, "{nvlink:#?}");
        assert!(
            gpu1[0].contains(&format!(
                "container=\"main\",namespace=\"ns\",pod=\"a\",pod_uid=\"{UID_A}\",vgpu=\"0\"}}"
            )),
            "{}",
            gpu1[0]
        );
        assert!(
            gpu1[1].contains(&format!(
                "container=\"main\",namespace=\"ns\",pod=\"b\",pod_uid=\"{UID_B}\",vgpu=\"1\"}}"
            )),
            "{}",
            gpu1[1]
        );
        let value = |l: &str| l.rsplit_once(' ').unwrap().1.to_string();
        assert_eq!(value(gpu1[0]), value(gpu1[1]));
        // dcgm-exporter copies no pod labels in this mode.
        assert!(nvlink.iter().all(|l| !l.contains("team=")), "{nvlink:#?}");
        // GPU 0, held whole: its pod, its UID, no replica.
        let gpu0 = on_gpu(0);
        assert_eq!(gpu0.len(), 1, "{nvlink:#?}");
        assert!(
            gpu0[0].ends_with(&format!(
                "container=\"main\",namespace=\"ns\",pod=\"c\",pod_uid=\"{UID_C}\"}} {}",
                value(gpu0[0])
            )),
            "{}",
            gpu0[0]
        );
        // GPU 2, free: its own series.
        assert_eq!(on_gpu(2).len(), 1);
        assert!(!on_gpu(2)[0].contains("pod="));
    }

    #[test]
    fn without_virtual_gpus_pod_labels_are_copied_and_pod_uid_only_when_asked() {
        let proc_root = tempfile::tempdir().unwrap();
        for pod_uid in [false, true] {
            let mut s = Sampler::new(
                Box::new(ThreeGpus { cycles: 0 }),
                Arc::new(nvlink_and_util_plan()),
                opts(pod_uid, false),
                "".into(),
            )
            .with_attribution(replicas_attributor(proc_root.path()));
            s.cycle();
            let snap = s.cycle();
            let nvlink = rendered(&snap, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL");
            let gpu0: Vec<_> = nvlink.iter().filter(|l| l.contains("gpu=\"0\"")).collect();
            assert_eq!(gpu0.len(), 1);
            let uid = if pod_uid {
                format!(",pod_uid=\"{UID_C}\"")
            } else {
                String::new()
            };
            assert!(
                gpu0[0].contains(&format!(
                    "team=\"team-c\",container=\"main\",namespace=\"ns\",pod=\"c\"{uid}}}"
                )),
                "{}",
                gpu0[0]
            );
            // The shared GPU stays one unlabelled series, without vgpu.
            let gpu1: Vec<_> = nvlink.iter().filter(|l| l.contains("gpu=\"1\"")).collect();
            assert_eq!(gpu1.len(), 1);
            assert!(!gpu1[0].contains("pod=") && !gpu1[0].contains("vgpu="));
        }
    }

    /// `-o`: dcgm-exporter's 1.x label names (its transformation package's `old*`
    /// attributes and the collectors' `uuid`), byte-sorted among the attributes as it
    /// emits them; a pod label taking one of those names is dropped, not doubled.
    #[test]
    fn the_old_namespace_serves_the_1x_label_names() {
        let proc_root = tempfile::tempdir().unwrap();
        let mut s = Sampler::new(
            Box::new(ThreeGpus { cycles: 0 }),
            Arc::new(nvlink_and_util_plan()),
            SamplerOptions {
                old_namespace: true,
                ..opts(true, false)
            },
            "".into(),
        )
        .with_attribution(replicas_attributor(proc_root.path()));
        s.cycle();
        let snap = s.cycle();
        let util = rendered(&snap, "DCGM_FI_DEV_GPU_UTIL");
        assert!(util.len() >= 3, "{util:#?}");
        for line in &util {
            assert!(
                line.contains(",uuid=\"GPU-") && !line.contains("UUID="),
                "{line}"
            );
            for now in [",pod=", ",namespace=", ",container="] {
                assert!(!line.contains(now), "{line}");
            }
        }
        let gpu0 = util
            .iter()
            .find(|l| l.contains("gpu=\"0\""))
            .expect("GPU 0");
        assert!(
            gpu0.contains(&format!(
                "team=\"team-c\",container_name=\"main\",pod_name=\"c\",pod_namespace=\"ns\",pod_uid=\"{UID_C}\"}}"
            )),
            "{gpu0}"
        );
        let default = opts(false, false);
        let old = SamplerOptions {
            old_namespace: true,
            ..opts(false, false)
        };
        assert!(!default.reserved("pod_name") && old.reserved("pod_name"));
        assert!(old.reserved("pod") && old.reserved("UUID"));
    }

    #[test]
    fn hpc_jobs_repeat_a_devices_series_per_job_and_follow_changes() {
        let jobs = Arc::new(ArcSwap::from_pointee(HpcJobs {
            generation: 1,
            by_device: [("2".to_string(), vec!["j1".to_string(), "j2".to_string()])]
                .into_iter()
                .collect(),
        }));
        let mut s = Sampler::new(
            Box::new(ThreeGpus { cycles: 0 }),
            Arc::new(nvlink_and_util_plan()),
            opts(false, false),
            "".into(),
        )
        .with_hpc_jobs(jobs.clone());
        s.cycle();
        let snap = s.cycle();
        let util = rendered(&snap, "DCGM_FI_DEV_GPU_UTIL");
        let gpu2: Vec<_> = util.iter().filter(|l| l.contains("gpu=\"2\"")).collect();
        assert_eq!(
            gpu2.iter()
                .map(|l| l.split("hpc_job=").nth(1).unwrap_or("none").to_string())
                .collect::<Vec<_>>(),
            vec![
                format!("\"j1\"}} {}", GPU_UTIL[2]),
                format!("\"j2\"}} {}", GPU_UTIL[2])
            ]
        );
        assert!(util.iter().filter(|l| l.contains("hpc_job")).count() == 2);
        // A job ends, another starts on GPU 0: the next cycle says so.
        jobs.store(Arc::new(HpcJobs {
            generation: 2,
            by_device: [("0".to_string(), vec!["k9".to_string()])]
                .into_iter()
                .collect(),
        }));
        let snap = s.cycle();
        let util = rendered(&snap, "DCGM_FI_DEV_GPU_UTIL");
        assert!(util.len() >= 3, "{util:#?}");
        let with_job: Vec<_> = util.iter().filter(|l| l.contains("hpc_job")).collect();
        assert_eq!(with_job.len(), 1);
        assert!(with_job[0].contains("gpu=\"0\"") && with_job[0].contains("hpc_job=\"k9\""));
    }

    #[test]
    fn a_reloaded_plan_is_served_from_the_next_cycle_and_a_failed_one_is_reported() {
        let handle = Arc::new(PlanHandle::new(Arc::new(nvlink_and_util_plan())));
        let mut s = Sampler::new(
            Box::new(ThreeGpus { cycles: 0 }),
            handle.plan(),
            opts(false, false),
            "".into(),
        )
        .with_plan_updates(handle.clone());
        let snap = s.cycle();
        assert_eq!(rendered(&snap, "DCGM_FI_DEV_GPU_UTIL").len(), 3);
        assert!(rendered(&snap, "DCGM_FI_DEV_FB_USED").is_empty());
        assert_eq!(snap.config_reload.map(|r| r.successful), Some(true));
        let (plan, _) =
            crate::counters::plan("DCGM_FI_DEV_FB_USED, gauge, m\n", "new.csv").unwrap();
        handle.succeeded(plan);
        let snap = s.cycle();
        assert!(rendered(&snap, "DCGM_FI_DEV_GPU_UTIL").is_empty());
        assert_eq!(
            rendered(&snap, "DCGM_FI_DEV_FB_USED")
                .iter()
                .map(|l| l.rsplit_once(' ').unwrap().1.to_string())
                .collect::<Vec<_>>(),
            FB_USED_MIB
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
        );
        handle.failed();
        let snap = s.cycle();
        assert_eq!(snap.config_reload.map(|r| r.successful), Some(false));
        assert_eq!(
            rendered(&snap, "DCGM_FI_DEV_FB_USED").len(),
            3,
            "the running plan stays"
        );
    }
}

#[cfg(test)]
mod exporter_collector_tests {
    use super::*;
    use crate::source::XidEvent;

    fn collectors(window: Duration) -> ExporterCollectors {
        ExporterCollectors {
            xid_count: true,
            clock_events_count: true,
            health: true,
            xid_window: window,
            clock_events_window: window,
        }
    }

    fn windows(window: Duration) -> GpuWindows {
        GpuWindows {
            xids: Window::new(window),
            clock_events: Window::new(window),
            counters: CounterHistory::default(),
        }
    }

    #[test]
    fn windowed_counts_count_what_the_window_holds_and_forget_the_rest() {
        let window = Duration::from_secs(10);
        let c = collectors(window);
        let mut w = windows(window);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        w.xids.push(at(0), 79);
        w.xids.push(at(4), 13);
        w.xids.push(at(5), 13);
        let throttled = [(Quantity::ClockEventReasons, Raw::U64(0x4 | 0x40))];
        let idle = [(Quantity::ClockEventReasons, Raw::U64(0x1))];
        let none = [(Quantity::ClockEventReasons, Raw::U64(0))];
        exporter_values(&c, &mut w, &throttled, true, at(1));
        exporter_values(&c, &mut w, &none, true, at(2));
        exporter_values(&c, &mut w, &throttled, true, at(3));
        let v = exporter_values(&c, &mut w, &idle, true, at(6));
        assert_eq!(v.xid_window, BTreeMap::from([(13, 2), (79, 1)]));
        let count = |name: &str| {
            let i = health::CLOCK_EVENTS
                .iter()
                .position(|(_, n)| *n == name)
                .unwrap();
            v.clock_events_window[i]
        };
        assert_eq!(
            (count("power_cap"), count("hw_thermal"), count("gpu_idle")),
            (2, 2, 1)
        );
        assert_eq!(count("sw_thermal"), 0);
        // Eleven seconds on, XID 79 and the first throttled cycle have left the window.
        let v = exporter_values(&c, &mut w, &none, true, at(12));
        assert_eq!(v.xid_window, BTreeMap::from([(13, 2)]));
        assert_eq!(v.clock_events_window.iter().sum::<u64>(), 2 + 1);
        let health = v.health.unwrap();
        assert_eq!(health[5].code, "DCGM_FR_OK", "XID 79 left the window");
        // A lost GPU fails ALL whatever the windows hold.
        let v = exporter_values(&c, &mut w, &[], false, at(13));
        assert_eq!(v.health.unwrap()[5].code, "DCGM_FR_FALLEN_OFF_BUS");
    }

    /// One GPU with one MIG instance; each cycle reports the XIDs queued for it.
    #[derive(Default)]
    struct OneGpuState {
        xids: Vec<XidEvent>,
        remap_pending: u64,
    }

    #[derive(Clone, Default)]
    struct OneGpu(Arc<std::sync::Mutex<OneGpuState>>);

    impl GpuSource for OneGpu {
        fn describe(&self) -> String {
            "one GPU".into()
        }
        fn discover(&mut self, _: &[crate::catalog::LabelField]) -> Result<Inventory, ReadError> {
            let gpu = EntityInfo {
                gpu_index: 0,
                uuid: "GPU-0".into(),
                pci_bus_id: "00000000:01:00.0".into(),
                model_name: "NVIDIA H100 80GB HBM3".into(),
                minor_number: Some(0),
                mig: None,
                labels: Default::default(),
                lost: false,
            };
            let mut mig = gpu.clone();
            mig.mig = Some(crate::source::MigInfo {
                parent: 0,
                gpu_instance_id: 2,
                compute_instance_id: 0,
                slot: 0,
                profile: "3g.40gb".into(),
                mig_uuid: "MIG-0".into(),
                placement: None,
            });
            Ok(Inventory {
                driver_version: "1".into(),
                nvml_version: "1".into(),
                entities: vec![gpu, mig],
            })
        }
        fn probe(&mut self) -> Result<(), ReadError> {
            Ok(())
        }
        fn read(&mut self, _: usize, wanted: &[Quantity], out: &mut Vec<Result<Raw, ReadError>>) {
            out.clear();
            out.extend(wanted.iter().map(|q| match q {
                Quantity::RemapPending => Ok(Raw::U64(self.0.lock().unwrap().remap_pending)),
                Quantity::ClockEventReasons => Ok(Raw::U64(0x80)),
                _ => Err(ReadError::NotSupported),
            }));
        }
        fn processes(&mut self, _: usize) -> Result<Vec<ProcessSample>, ReadError> {
            Ok(Vec::new())
        }
        fn xid_events(&mut self) -> Vec<XidEvent> {
            std::mem::take(&mut self.0.lock().unwrap().xids)
        }
    }

    fn text(snap: &Snapshot) -> String {
        let mut out = Vec::new();
        crate::encode::render_device_families(snap, crate::encode::Format::Text, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_exp_families_carry_dcgm_labels_and_a_mig_xid_counts_on_its_gpu() {
        let (plan, warnings) = crate::counters::plan(
            "DCGM_EXP_XID_ERRORS_COUNT, counter, xids\nDCGM_EXP_CLOCK_EVENTS_COUNT, counter, clocks\nDCGM_EXP_GPU_HEALTH_STATUS, counter, health\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            warnings.len(),
            3,
            "each declared counter is noted: {warnings:?}"
        );
        let source = OneGpu::default();
        let mut s = Sampler::new(
            Box::new(source.clone()),
            Arc::new(plan),
            SamplerOptions {
                interval: Duration::from_secs(3600),
                hostname: None,
                replace_blanks_in_model_name: false,
                process_metrics: false,
                pod_uid: false,
                virtual_gpus: false,
                old_namespace: false,
            },
            "".into(),
        )
        .with_count_windows(Duration::from_millis(60_000), Duration::from_millis(1234));
        let first = text(&s.cycle());
        let gpu = r#"gpu="0",UUID="GPU-0",pci_bus_id="00000000:01:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3""#;
        // Nothing yet: one zero series per GPU, none for the MIG instance.
        assert!(
            first.contains(&format!(
                "DCGM_EXP_XID_ERRORS_COUNT{{{gpu},window_size_in_ms=\"60000\"}} 0\n"
            )),
            "{first}"
        );
        assert_eq!(first.matches("DCGM_EXP_XID_ERRORS_COUNT{").count(), 1);
        assert!(first.contains(&format!(
            "DCGM_EXP_CLOCK_EVENTS_COUNT{{{gpu},clock_event=\"hw_power_brake\",window_size_in_ms=\"1234\"}} 1\n"
        )));
        assert!(first.contains(&format!(
            "DCGM_EXP_GPU_HEALTH_STATUS{{{gpu},health_error_code=\"DCGM_FR_CLOCK_THROTTLE_POWER\",health_watch=\"POWER\"}} 10\n"
        )));
        assert!(first.contains(&format!(
            "DCGM_EXP_GPU_HEALTH_STATUS{{{gpu},health_error_code=\"DCGM_FR_OK\",health_watch=\"MEM\"}} 0\n"
        )));
        assert!(first.contains("# TYPE DCGM_EXP_GPU_HEALTH_STATUS gauge\n"));
        // XIDs on the MIG instance (entity 1) count on its GPU; a pending remap warns.
        let mut src = source.0.lock().unwrap();
        for code in [31, 31, 43] {
            src.xids.push(XidEvent {
                entity: 1,
                code,
                at: SystemTime::now(),
            });
        }
        src.remap_pending = 1;
        drop(src);
        let second = text(&s.cycle());
        assert!(
            second.contains(&format!(
                "DCGM_EXP_XID_ERRORS_COUNT{{{gpu},window_size_in_ms=\"60000\",xid=\"31\"}} 2\n"
            )),
            "{second}"
        );
        assert!(second.contains(&format!(
            "DCGM_EXP_XID_ERRORS_COUNT{{{gpu},window_size_in_ms=\"60000\",xid=\"43\"}} 1\n"
        )));
        assert!(!second.contains("window_size_in_ms=\"60000\"} 0"));
        assert!(second.contains(&format!(
            "DCGM_EXP_GPU_HEALTH_STATUS{{{gpu},health_error_code=\"DCGM_FR_PENDING_ROW_REMAP\",health_watch=\"MEM\"}} 10\n"
        )));
    }
}

/// NVLink, thermal-limit and fabric series of the GB200 NVL72 scenario, checked against
/// what gpu-sim says the same instant reports.
#[cfg(test)]
mod link_tests {
    use super::*;
    use crate::encode::{Format, render_device_families};
    use crate::source::simulated::SimulatedSource;

    /// Scenario time inside the fault window: GPU 2's link 5 is down, GPU 3's fabric
    /// route unhealthy.
    const T: f64 = 100.0;

    fn node() -> gpu_sim::SimNode {
        let s = gpu_sim::Scenario::builtin("gb200-nvl72").expect("scenario");
        let mut node = gpu_sim::SimNode::new(&s, SystemTime::now());
        node.freeze_at(T);
        node
    }

    /// The text body of a third cycle (rates have a previous reading by then).
    fn render(csv: &str) -> String {
        let (plan, _) = crate::counters::plan(csv, "test.csv").expect("plan");
        let mut s = Sampler::new(
            Box::new(SimulatedSource::new(node(), "gb200")),
            Arc::new(plan),
            SamplerOptions {
                interval: Duration::from_secs(1),
                hostname: Some(("hostname".into(), "tray-1".into())),
                replace_blanks_in_model_name: true,
                process_metrics: false,
                pod_uid: false,
                virtual_gpus: false,
                old_namespace: false,
            },
            "".into(),
        );
        s.cycle();
        std::thread::sleep(Duration::from_millis(5));
        let snap = s.cycle();
        let mut out = Vec::new();
        render_device_families(&snap, Format::Text, &mut out);
        String::from_utf8(out).expect("utf-8")
    }

    /// The value of the one series of `name` whose labels start with `labels`.
    fn value(body: &str, name: &str, labels: &str) -> Option<String> {
        let prefix = format!("{name}{{{labels}");
        let mut found = body.lines().filter(|l| l.starts_with(&prefix));
        let line = found.next()?;
        assert!(found.next().is_none(), "{prefix} matches twice");
        line.rsplit(' ').next().map(str::to_string)
    }

    #[test]
    fn every_link_has_its_state_errors_and_rates_with_dcgms_nvlink_labels() {
        let body = render(
            "DCGM_FI_DEV_NVLINK_GET_STATE, gauge, s\n\
             DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, r\n\
             DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL, counter, v\n\
             DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK, gauge, b\n\
             DCGM_FI_DEV_GPU_TEMP, gauge, t\n\
             DCGM_FI_DRIVER_VERSION, label, d\n",
        );
        let m = node();
        let g = &m.gpus[2];
        // dcgm-exporter's NVLink label set, in its order, then the label fields; the
        // model name keeps its blanks (dcgm never replaces them on NVLink series).
        let expected = format!(
            "DCGM_FI_DEV_NVLINK_GET_STATE{{nvlink=\"5\",gpu=\"2\",gpu_uuid=\"{}\",pci_bus_id=\"{}\",device=\"nvidia2\",model_name=\"NVIDIA GB200\",hostname=\"tray-1\",DCGM_FI_DRIVER_VERSION=\"580.82.07\"}} 0",
            g.uuid, g.pci_bus_id
        );
        assert!(body.lines().any(|l| l == expected), "{expected}\n{body}");
        let count = |name: &str| {
            body.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .count()
        };
        assert_eq!(count("DCGM_FI_DEV_NVLINK_GET_STATE"), 4 * 18);
        assert_eq!(
            count("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL"),
            4 * 18
        );
        assert_eq!(count("DCGM_FI_DEV_GPU_TEMP"), 4);
        for gpu in 0..4u32 {
            for link in 0..18 {
                let labels = format!("nvlink=\"{link}\",gpu=\"{gpu}\",");
                let state = value(&body, "DCGM_FI_DEV_NVLINK_GET_STATE", &labels);
                let active = m.nvlink_active(gpu, link, T);
                assert_eq!(state.as_deref(), Some(if active { "1" } else { "0" }));
                let errors = m.nvlink_link_errors(gpu, link, T);
                let replay = value(
                    &body,
                    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
                    &labels,
                );
                assert_eq!(replay, Some(errors[2].to_string()));
                let recovery = value(
                    &body,
                    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL",
                    &labels,
                );
                assert_eq!(recovery, Some(errors[3].to_string()));
                // Frozen scenario time: the counters stand still, so every rate is 0.
                let rate = value(&body, "DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK", &labels);
                assert_eq!(rate.as_deref(), Some("0"), "gpu {gpu} link {link}");
            }
        }
        assert_eq!(
            value(
                &body,
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
                "nvlink=\"5\",gpu=\"2\","
            ),
            Some("12".into()),
            "the scenario's errors on the downed link"
        );
        // GPU series keep their own label set (and blanks replaced, as asked).
        assert!(
            body.contains("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\""),
            "{body}"
        );
        assert!(body.contains("modelName=\"NVIDIA-GB200\""));
    }

    #[test]
    fn thermal_limits_pstate_and_fabric_health_per_gpu_and_no_fan_on_an_nvl72_gpu() {
        let body = render(
            "DCGM_FI_DEV_SLOWDOWN_TEMP, gauge, a\n\
             DCGM_FI_DEV_SHUTDOWN_TEMP, gauge, b\n\
             DCGM_FI_DEV_GPU_MAX_OP_TEMP, gauge, c\n\
             DCGM_FI_DEV_MEM_MAX_OP_TEMP, gauge, d\n\
             DCGM_FI_DEV_PSTATE, gauge, e\n\
             DCGM_FI_DEV_FAN_SPEED, gauge, f\n\
             DCGM_FI_DEV_FABRIC_MANAGER_STATUS, gauge, g\n\
             DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE, gauge, k\n\
             DCGM_FI_DEV_FABRIC_CLIQUE_ID, gauge, h\n\
             DCGM_FI_DEV_FABRIC_HEALTH_MASK, gauge, i\n\
             DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY, gauge, j\n",
        );
        let m = node();
        let b = &m.gpus[0].model.board;
        for gpu in 0..4u32 {
            let labels = format!("gpu=\"{gpu}\",");
            let v = |name: &str| value(&body, name, &labels);
            assert_eq!(
                v("DCGM_FI_DEV_SLOWDOWN_TEMP"),
                Some(b.slowdown_temp_c.to_string())
            );
            assert_eq!(
                v("DCGM_FI_DEV_SHUTDOWN_TEMP"),
                Some(b.shutdown_temp_c.to_string())
            );
            assert_eq!(
                v("DCGM_FI_DEV_GPU_MAX_OP_TEMP"),
                Some(b.gpu_max_operating_temp_c.to_string())
            );
            assert_eq!(
                v("DCGM_FI_DEV_MEM_MAX_OP_TEMP"),
                Some(b.memory_max_operating_temp_c.to_string())
            );
            assert_eq!(v("DCGM_FI_DEV_PSTATE").as_deref(), Some("0"));
            let f = m.fabric(gpu, T);
            assert_eq!(v("DCGM_FI_DEV_FABRIC_MANAGER_STATUS").as_deref(), Some("3"));
            assert_eq!(
                v("DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE").as_deref(),
                Some("0")
            );
            assert_eq!(
                v("DCGM_FI_DEV_FABRIC_CLIQUE_ID"),
                Some(f.clique_id.to_string())
            );
            assert_eq!(
                v("DCGM_FI_DEV_FABRIC_HEALTH_MASK"),
                Some(f.health_mask.to_string())
            );
            assert_eq!(
                v("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"),
                Some(f.health_summary.to_string())
            );
        }
        assert_eq!(
            value(&body, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", "gpu=\"3\","),
            Some("2".into()),
            "the scenario's unhealthy route"
        );
        // No fans: the family is absent, not a series of zeros.
        assert!(!body.contains("DCGM_FI_DEV_FAN_SPEED"), "{body}");
    }
}
