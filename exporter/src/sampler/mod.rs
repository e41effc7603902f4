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

mod build;
pub mod cadence;
mod devices;
mod labels;
mod plan;
mod pods;
mod read;
mod run;

pub use cadence::{Cadence, FieldPeriodError, FieldPeriods};
pub use labels::{entity_label_string, link_label_string};
pub use plan::{DEFAULT_COUNT_WINDOW, ExporterCollectors};
pub use run::{HUNG_INTERVALS, run};
mod windows;

#[cfg(test)]
mod tests;

use crate::attribution::Attributor;
use crate::hpc::HpcJobs;
use crate::plan::catalog::{Quantity, Scope};
use crate::plan::counters::ExportPlan;
use crate::plan::reload::PlanHandle;
use crate::snapshot::Snapshot;
use crate::source::{GpuSource, Raw, ReadError};
use arc_swap::ArcSwap;
use devices::Devices;
use plan::Split;
use plan::plan_tables;
use pods::PodRefs;
use std::sync::Arc;
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
    /// How often each field and the device set are read.
    cadence: Cadence,
    /// Cycles since the device set was last checked.
    device_set_age: u32,
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
            cadence: Cadence::every_cycle(),
            device_set_age: 0,
        }
    }

    /// Read each field at its own period (`--field-periods`); without this, every field
    /// and the device set are read every cycle.
    pub fn with_cadence(mut self, cadence: Cadence) -> Sampler {
        self.cadence = cadence;
        self
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
            // GPUs or MIG instances came or went: a new inventory, right away. Checked
            // at its own period (the MIG-layout check costs a driver call per GPU), and
            // every cycle while the driver lists no GPU (nothing to read, not ready).
            Some(ref d) => {
                self.device_set_age += 1;
                if self.device_set_age >= self.cadence.device_set()
                    || d.inventory.entities.is_empty()
                {
                    self.device_set_age = 0;
                    let changed = self.source.device_set_changed();
                    tracing::trace!(took = ?started.elapsed(), changed, "checked the device set");
                    changed
                } else {
                    false
                }
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
}
