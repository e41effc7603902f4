//! The NVML source, through `nvml-wrapper`, with raw calls where it has gaps ([`raw`]).
//!
//! - The library is loaded and initialised once per process and kept (nvml-wrapper
//!   never unloads it either).
//! - Nothing static is read twice: device and MIG handles, identities, labels and the
//!   MIG layout are read at discovery and kept until the next one. Rediscovery after a
//!   driver failure re-initialises NVML and drops every cache first; a change of the
//!   device set (GPUs or MIG instances) is found as [`NvmlSource::device_set_changed`]
//!   describes.
//! - GPM ratios need two samples: each entity allocates two once and swaps them every
//!   cycle, so the first cycle has no value and every later one reports the interval
//!   since the last.
//! - Process lists are read in one call into buffers kept across cycles, and process
//!   names once per pid ([`ProcessNames`]).
//! - XIDs arrive on their own thread ([`events`]).
//! - GPUs bound to the nvidia driver after NVML was initialised are found in sysfs
//!   ([`sysfs`]): NVML is initialised again for them.

mod discover;
mod events;
mod links;
mod raw;
pub mod sysfs;

use super::{GpuSource, Inventory, ProcessSample, Raw, ReadError, XidEvent};
use crate::plan::catalog::{LabelField, Quantity};
use events::XidWatcher;
use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock, InfoRom, PcieUtilCounter, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::GpmSample;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessUtilizationSample_t};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;

// The device set is compared with the one discovered every cycle: the device count,
// and per MIG-capable GPU its MIG devices' UUIDs (`mig_devices_now`). A layout changes
// by an operator's action (`nvidia-smi mig -cgi/-dgi`, the GPU operator's mig-manager,
// a DRA driver preparing a claim) and a workload waits for it, so it is found within a
// cycle. Nothing cheaper tells: a new instance raises no error anywhere. The cost is
// bounded by the node: 1 call, plus 1 per MIG-capable GPU not in MIG mode and 8 + 1 per
// instance per GPU in MIG mode; docs/exporter/devices.md gives the measured figure. GPUs NVML has not
// enumerated yet are found by one sysfs directory listing (`sysfs`, 8–10 µs).

/// Quantities read through `nvmlDeviceGetFieldValues`, all of a GPU's in one call per
/// cycle (as DCGM reads them), instead of one getter call each: ECC totals, retired
/// pages, violation times, energy and the counters only fields expose. All IDs are
/// below 251, where the driver-580 renumbering does not apply.
mod field {
    use crate::plan::catalog::Quantity;
    use nvml_wrapper_sys::bindings::field_id::*;

    /// `scopeId` meaning "all NVLink links".
    pub const ALL_LINKS: u32 = u32::MAX;

    /// The (field ID, scope ID) requests that answer `q`: the sum of their values.
    pub fn of(q: Quantity) -> &'static [(u32, u32)] {
        use Quantity::*;
        match q {
            MemoryTemp => &[(NVML_FI_DEV_MEMORY_TEMP, 0)],
            TotalEnergy => &[(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0)],
            EccSbeVolatile => &[(NVML_FI_DEV_ECC_SBE_VOL_TOTAL, 0)],
            EccDbeVolatile => &[(NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0)],
            EccSbeAggregate => &[(NVML_FI_DEV_ECC_SBE_AGG_TOTAL, 0)],
            EccDbeAggregate => &[(NVML_FI_DEV_ECC_DBE_AGG_TOTAL, 0)],
            RetiredSbe => &[(NVML_FI_DEV_RETIRED_SBE, 0)],
            RetiredDbe => &[(NVML_FI_DEV_RETIRED_DBE, 0)],
            RetiredPending => &[(NVML_FI_DEV_RETIRED_PENDING, 0)],
            // The violation counters of `nvmlDeviceGetViolationStatus`, in ns.
            PowerViolation => &[(NVML_FI_DEV_PERF_POLICY_POWER, 0)],
            ThermalViolation => &[(NVML_FI_DEV_PERF_POLICY_THERMAL, 0)],
            SyncBoostViolation => &[(NVML_FI_DEV_PERF_POLICY_SYNC_BOOST, 0)],
            BoardLimitViolation => &[(NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT, 0)],
            LowUtilViolation => &[(NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION, 0)],
            ReliabilityViolation => &[(NVML_FI_DEV_PERF_POLICY_RELIABILITY, 0)],
            NvlinkCrcFlitErrors => &[(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0)],
            NvlinkCrcDataErrors => &[(NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 0)],
            NvlinkReplayErrors => &[(NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 0)],
            NvlinkRecoveryErrors => &[(NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, 0)],
            NvlinkDataKib => &[
                (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
                (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
            ],
            RemappedCorrectable => &[(NVML_FI_DEV_REMAPPED_COR, 0)],
            RemappedUncorrectable => &[(NVML_FI_DEV_REMAPPED_UNC, 0)],
            RemapFailure => &[(NVML_FI_DEV_REMAPPED_FAILURE, 0)],
            EccModeCurrent => &[(NVML_FI_DEV_ECC_CURRENT, 0)],
            EccModePending => &[(NVML_FI_DEV_ECC_PENDING, 0)],
            RemapPending => &[(NVML_FI_DEV_REMAPPED_PENDING, 0)],
            RecoveryAction => &[(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)],
            // Not the temperature thresholds: fields 193–196 answer them relative to
            // the GPU's T.Limit (signed, -8 and -2 °C on a real H100, driver 580),
            // not in °C as DCGM serves them; see `threshold`.
            _ => &[],
        }
    }
}

/// GPM metrics the catalog serves, in the order [`gpm_index`] expects.
const GPM_METRICS: [GpmMetricId; 10] = [
    GpmMetricId::GraphicsUtil,
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::HmmaTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::Fp64Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp16Util,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
];

fn gpm_index(q: Quantity) -> Option<usize> {
    use Quantity::*;
    Some(match q {
        GpmGraphicsUtil => 0,
        GpmSmUtil => 1,
        GpmSmOccupancy => 2,
        GpmTensorUtil => 3,
        GpmDramUtil => 4,
        GpmFp64Util => 5,
        GpmFp32Util => 6,
        GpmFp16Util => 7,
        GpmPcieTx => 8,
        GpmPcieRx => 9,
        _ => return None,
    })
}

/// The GPM metric a quantity is read from: its own, or for PCIe throughput the GPM
/// PCIe rate that answers it where the GPU has GPM.
fn gpm_source(q: Quantity) -> Option<usize> {
    gpm_index(match q {
        Quantity::PcieTxThroughput => Quantity::GpmPcieTx,
        Quantity::PcieRxThroughput => Quantity::GpmPcieRx,
        q => q,
    })
}

/// PCIe throughput (`q`, Tx or Rx), KB/s. `nvmlDeviceGetPcieThroughput` samples the
/// link for 20 ms per call (20.9 ms each on a real H100: 42 of a 50 ms cycle). Where
/// the GPU has GPM, its PCIe rate over the whole interval answers the same quantity
/// from the sample the cycle takes anyway (`gpm`; MiB/s → KB/s).
fn pcie_throughput(
    dev: &Device<'static>,
    q: Quantity,
    gpm: &Result<Vec<Result<f64, ReadError>>, ReadError>,
) -> Result<Raw, ReadError> {
    let from_gpm = match gpm {
        Ok(v) => gpm_source(q)
            .and_then(|i| v.get(i).cloned())
            .unwrap_or(Err(ReadError::NotSupported)),
        Err(e) => Err(e.clone()),
    };
    match from_gpm {
        // KB of 1000 bytes, as gpu-sim models the getter's unit.
        Ok(mib_s) => Ok(Raw::U64((mib_s * 1_048.576).round() as u64)),
        Err(ReadError::NotSupported) => dev
            .pcie_throughput(if q == Quantity::PcieTxThroughput {
                PcieUtilCounter::Send
            } else {
                PcieUtilCounter::Receive
            })
            .map(|v| Raw::U64(v.into()))
            .map_err(map_err),
        Err(e) => Err(e),
    }
}

/// A device handle kept from discovery to the next discovery, as an address (so the
/// source stays `Send`). Valid while NVML stays initialised: only `discover` shuts NVML
/// down, and it drops every handle first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handle(usize);

impl Handle {
    fn of(dev: &Device<'_>) -> Handle {
        // SAFETY: the handle is only copied, as an identity and for later calls while
        // this initialisation lasts.
        Handle(unsafe { dev.handle() } as usize)
    }

    fn raw(self) -> nvmlDevice_t {
        self.0 as nvmlDevice_t
    }

    fn device(self, nvml: &'static Nvml) -> Device<'static> {
        // SAFETY: a handle of this NVML initialisation (see the type's doc).
        unsafe { Device::new(self.raw(), nvml) }
    }
}

/// Where an entity lives: a GPU index and, for MIG, the MIG slot and GPU-instance ID,
/// with the handles read at discovery.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: u32,
    mig: Option<(u32, u32)>,
    /// A physical GPU in MIG mode: its processes are reported on its instances.
    mig_parent: bool,
    /// The entity's handle (a MIG device handle for an instance); none for a GPU lost
    /// at discovery.
    handle: Option<Handle>,
    /// The physical GPU's handle (the same as `handle` for a GPU).
    parent: Option<Handle>,
    /// The physical GPU's entity (the entity itself for a GPU).
    parent_entity: usize,
    /// A MIG instance's compute-instance ID.
    compute_instance: u32,
    /// The driver said this device has no vGPU licensing (bare metal): a property of
    /// the driver and board that only a re-initialisation can change, so its licence
    /// state is 0 without asking again every cycle.
    no_vgpu_licensing: bool,
}

/// One MIG instance as discovery saw it: slot, handle, GPU- and compute-instance IDs,
/// UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MigInstance {
    slot: u32,
    handle: Handle,
    gpu_instance: u32,
    compute_instance: u32,
    uuid: String,
}

/// The MIG devices of one MIG-capable GPU at discovery, as [`mig_devices_now`] lists
/// them.
struct MigLayout {
    index: u32,
    gpu: Handle,
    devices: Vec<(u32, String)>,
}

/// The MIG devices of a MIG-capable GPU now, as (slot, UUID): empty when MIG is off
/// (the maximum count is zero then, so one call also tells the mode). A MIG device's
/// UUID is new whenever its instance is created, even with the IDs of one destroyed
/// before, so the UUIDs alone tell a changed layout: 1 + 7 + 1 per instance calls.
fn mig_devices_now(dev: &Device<'_>) -> Vec<(u32, String)> {
    (0..dev.mig_device_count().unwrap_or(0))
        .filter_map(|slot| {
            let mig = dev.mig_device_by_index(slot).ok()?;
            Some((slot, mig.uuid().unwrap_or_default()))
        })
        .collect()
}

/// GPM state of one entity.
enum Gpm {
    Unknown,
    Unsupported,
    /// Two samples allocated once and reused: each cycle fills `current`, compares it
    /// with `previous` (once `primed`), then the two swap. Freed when dropped, which
    /// `discover` does before NVML is re-initialised.
    Sampling {
        previous: GpmSample<'static>,
        current: GpmSample<'static>,
        primed: bool,
    },
}

/// Process names by pid, read once per pid. A pid stays only while some GPU lists it:
/// one missing from every list in a cycle is dropped, so a reused pid (which needs the
/// old process gone first) is read again, and the map never outgrows the processes
/// running on GPUs.
#[derive(Default)]
struct ProcessNames {
    /// pid → (name, the cycle it was last listed in).
    by_pid: HashMap<u32, (String, u64)>,
    cycle: u64,
}

impl ProcessNames {
    /// The name of `pid`, from `read` only when the pid is new.
    fn name(&mut self, pid: u32, read: impl FnOnce(u32) -> String) -> String {
        let cycle = self.cycle;
        // No name (a process that just exited, or no permission) is kept as empty too:
        // asking again each cycle would not change the answer.
        let entry = self.by_pid.entry(pid).or_insert_with(|| (read(pid), cycle));
        entry.1 = cycle;
        entry.0.clone()
    }

    fn end_cycle(&mut self) {
        let cycle = self.cycle;
        self.by_pid.retain(|_, (_, seen)| *seen == cycle);
        self.cycle += 1;
    }
}

/// Buffers and state for one entity's process reads, kept across cycles.
#[derive(Default)]
struct ProcessReads {
    infos: Vec<nvmlProcessInfo_t>,
    /// How many of `infos` the last list filled, and in which cycle (a GPU in MIG mode
    /// lists every instance's processes once per cycle, for all of them).
    listed: usize,
    listed_in: Option<u64>,
    samples: Vec<nvmlProcessUtilizationSample_t>,
    /// Last process-utilisation timestamp seen (µs), for incremental reads.
    seen: u64,
    /// The entity has no per-process utilisation (MIG instances): not asked again.
    no_utilization: bool,
}

pub struct NvmlSource {
    library: Option<PathBuf>,
    nvml: Option<&'static Nvml>,
    slots: Vec<Slot>,
    gpm: Vec<Gpm>,
    process_reads: Vec<ProcessReads>,
    names: ProcessNames,
    /// MIG-capable GPUs' layouts at discovery.
    mig_layouts: Vec<MigLayout>,
    /// `nvmlDeviceGetCount` at discovery.
    device_count: u32,
    /// The device set differs from the one discovered: rediscover, without
    /// re-initialising NVML.
    layout_stale: bool,
    /// A probe has just initialised NVML afresh: the discovery that follows need not.
    probed: bool,
    /// Device handle address of each physical GPU → entity index, for events.
    event_devices: HashMap<usize, usize>,
    /// (GPU entity, GPU-instance ID) → MIG entity, for events.
    event_migs: HashMap<(usize, u32), usize>,
    xids: Option<XidWatcher>,
    /// Temperature thresholds by (entity, quantity), read once per discovery: board
    /// constants, and 141 µs a call on a real H100.
    thresholds: HashMap<(usize, Quantity), Result<u32, ReadError>>,
    /// The GPUs bound to the nvidia driver in sysfs (`--path-sysfs`); none: not checked.
    bound: Option<sysfs::BoundGpus>,
}

impl NvmlSource {
    /// `library`: an explicit libnvidia-ml path, or the default search path.
    pub fn new(library: Option<PathBuf>) -> NvmlSource {
        NvmlSource {
            library,
            nvml: None,
            slots: Vec::new(),
            gpm: Vec::new(),
            process_reads: Vec::new(),
            names: ProcessNames::default(),
            mig_layouts: Vec::new(),
            device_count: 0,
            layout_stale: false,
            probed: false,
            event_devices: HashMap::new(),
            event_migs: HashMap::new(),
            xids: None,
            thresholds: HashMap::new(),
            bound: None,
        }
    }

    /// Check the GPUs bound to the nvidia driver under this sysfs root every cycle, and
    /// initialise NVML again when they change (see [`sysfs`]).
    pub fn with_sysfs(mut self, root: &std::path::Path) -> NvmlSource {
        self.bound = Some(sysfs::BoundGpus::new(root));
        self
    }

    fn library_name(&self) -> String {
        self.library
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "libnvidia-ml.so.1".into())
    }

    /// Load and initialise NVML once; later calls reuse it. After a driver failure the
    /// same library is re-initialised through `nvmlInit_v2` (NVML counts inits).
    fn init(&mut self) -> Result<&'static Nvml, ReadError> {
        if let Some(n) = self.nvml {
            return Ok(n);
        }
        let path: Option<OsString> = self.library.as_ref().map(|p| p.clone().into_os_string());
        let mut builder = Nvml::builder();
        if let Some(p) = &path {
            builder.lib_path(p);
        }
        let nvml = builder.init().map_err(|e| {
            ReadError::Unavailable(format!(
                "cannot initialise NVML from {}: {e}",
                self.library_name()
            ))
        })?;
        // Leaked on purpose: one per process, never unloaded (nvml-wrapper keeps the
        // library mapped regardless), and `Device<'static>` handles need it to outlive them.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        self.nvml = Some(nvml);
        Ok(nvml)
    }

    fn nvml(&self) -> Result<&'static Nvml, ReadError> {
        self.nvml
            .ok_or_else(|| ReadError::Unavailable("NVML is not initialised".into()))
    }

    fn slot(&self, entity: usize) -> Result<Slot, ReadError> {
        self.slots
            .get(entity)
            .copied()
            .ok_or_else(|| ReadError::Failed(format!("no entity {entity}")))
    }

    /// The entity's handle from discovery (no NVML call).
    fn device(&self, entity: usize) -> Result<Device<'static>, ReadError> {
        let nvml = self.nvml()?;
        let handle = self.slot(entity)?.handle.ok_or(ReadError::GpuLost)?;
        Ok(handle.device(nvml))
    }

    /// Take the hot-add check's reference, just before NVML is (re)initialised and
    /// enumerates: a GPU bound in between costs one more initialisation, never a
    /// missed GPU. Only where NVML is initialised: a rediscovery without one (a MIG
    /// layout change) must leave a GPU bound meanwhile to the next check.
    fn sysfs_reference(&mut self) {
        if let Some(b) = &mut self.bound {
            b.check();
        }
    }

    /// Drop everything tied to the current NVML initialisation and inventory: GPM
    /// samples (freed here, while NVML can still free them), handles, buffers, names.
    fn forget(&mut self) {
        self.xids = None;
        self.gpm.clear();
        self.slots.clear();
        self.process_reads.clear();
        self.names = ProcessNames::default();
        self.mig_layouts.clear();
        self.event_devices.clear();
        self.event_migs.clear();
    }

    /// A MIG entity whose every reading failed: if its handle no longer answers with
    /// the instance IDs discovered, the layout has changed.
    fn verify_mig_handle(&mut self, entity: usize) {
        let (Ok(nvml), Ok(slot)) = (self.nvml(), self.slot(entity)) else {
            return;
        };
        let (Some((_, gi)), Some(handle)) = (slot.mig, slot.handle) else {
            return;
        };
        let same = raw::instance_ids(nvml, handle.raw()).is_ok_and(|(now, _)| now == gi);
        if !same {
            tracing::info!(
                gpu = slot.index,
                gpu_instance = gi,
                "a MIG instance is gone; rediscovering"
            );
            self.layout_stale = true;
        }
    }

    /// The GPM metrics of `entity` over the interval since its previous sample, one per [`GPM_METRICS`] entry:
    /// computed only where `wanted` (indexed like it) is set, `NotSupported` elsewhere.
    /// On a real H100 `nvmlGpmMetricsGet` costs 3.4 µs a metric, except the graphics
    /// engine's activity (1.24 ms alone; docs/benchmarks/real-gpu.md), so what the plan leaves out
    /// is not asked.
    fn gpm_read(
        &mut self,
        entity: usize,
        wanted: &[bool; GPM_METRICS.len()],
    ) -> Result<Vec<Result<f64, ReadError>>, ReadError> {
        let nvml = self.nvml()?;
        let slot = self.slot(entity)?;
        let parent = slot.parent.ok_or(ReadError::GpuLost)?;
        let gpm = self
            .gpm
            .get_mut(entity)
            .ok_or_else(|| ReadError::Failed(format!("no entity {entity}")))?;
        if matches!(gpm, Gpm::Unknown) {
            // GPM support is a property of the physical GPU, also for its MIG instances.
            *gpm = match parent.device(nvml).gpm_support() {
                Ok(true) => Gpm::Sampling {
                    previous: raw::gpm_sample_alloc(nvml)?,
                    current: raw::gpm_sample_alloc(nvml)?,
                    primed: false,
                },
                Ok(false) | Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                    Gpm::Unsupported
                }
                Err(e) => return Err(map_err(e)),
            };
        }
        let Gpm::Sampling {
            previous,
            current,
            primed,
        } = gpm
        else {
            return Err(ReadError::NotSupported);
        };
        let filled = match slot.mig {
            None => raw::gpm_sample_get(nvml, parent.raw(), None, current),
            Some((_, gi)) => raw::gpm_sample_get(nvml, parent.raw(), Some(gi), current),
        };
        if let Err(e) = filled {
            // The next good sample opens a new interval.
            *primed = false;
            return Err(e);
        }
        let results = if *primed {
            let ids: Vec<GpmMetricId> = GPM_METRICS
                .iter()
                .zip(wanted)
                .filter(|(_, w)| **w)
                .map(|(m, _)| *m)
                .collect();
            nvml_wrapper::gpm::gpm_metrics_get(nvml, previous, current, &ids)
                .map_err(map_err)
                .map(|results| {
                    let mut got = results.into_iter();
                    wanted
                        .iter()
                        .map(|w| match (w, w.then(|| got.next()).flatten()) {
                            (true, Some(r)) => r.map(|m| m.value).map_err(map_err),
                            _ => Err(ReadError::NotSupported),
                        })
                        .collect()
                })
        } else {
            // The first sample only opens the interval.
            Ok(GPM_METRICS
                .iter()
                .map(|_| Err(ReadError::NoValueYet))
                .collect())
        };
        std::mem::swap(previous, current);
        *primed = true;
        results
    }

    /// One `nvmlDeviceGetFieldValues` call for every field-read quantity among
    /// `quantities`: one result per request of [`field::of`], in order.
    fn field_values(
        &self,
        dev: &Device<'static>,
        quantities: &[Quantity],
    ) -> Vec<Result<Raw, ReadError>> {
        let requests: Vec<(u32, u32)> = quantities
            .iter()
            .flat_map(|&q| field::of(q).iter().copied())
            .collect();
        if requests.is_empty() {
            return Vec::new();
        }
        // SAFETY: `dev` is a live handle of this NVML instance.
        let values = self
            .nvml()
            .and_then(|nvml| raw::field_values(nvml, unsafe { dev.handle() }, &requests));
        match values {
            Ok(v) => v,
            Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
        }
    }
}

/// A fabric quantity from one fabric-info read, as DCGM derives its fields.
fn fabric_quantity(
    f: &Result<raw::FabricInfo, raw::FabricError>,
    q: Quantity,
) -> Result<Raw, ReadError> {
    let info = match f {
        Ok(info) => info,
        // DCGM: a driver without the call is "NVML too old" (6); its other fields blank.
        Err(raw::FabricError::NoSymbol) if q == Quantity::FabricManagerStatus => {
            return Ok(Raw::U64(6));
        }
        Err(raw::FabricError::NoSymbol) => return Err(ReadError::NotSupported),
        Err(raw::FabricError::Read(e)) => return Err(e.clone()),
    };
    Ok(Raw::U64(match q {
        Quantity::FabricManagerStatus => super::fabric_manager_status(info.state, info.status),
        Quantity::FabricManagerError => {
            // Negative DCGM codes: a float reading, printed as the integer it is.
            return super::fabric_manager_error(info.state, info.status)
                .map(|e| Raw::F64(e as f64))
                .ok_or(ReadError::NoValueYet);
        }
        Quantity::FabricCliqueId => info.clique_id.into(),
        Quantity::FabricHealthMask => info.health_mask.into(),
        _ => info.health_summary.ok_or(ReadError::NotSupported)?.into(),
    }))
}

/// How an NVML error affects the sampler.
pub(crate) fn map_err(e: NvmlError) -> ReadError {
    match e {
        NvmlError::NotSupported
        | NvmlError::FunctionNotFound
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::NotFound => ReadError::NotSupported,
        NvmlError::GpuLost => ReadError::GpuLost,
        NvmlError::Uninitialized
        | NvmlError::DriverNotLoaded
        | NvmlError::LibRmVersionMismatch
        | NvmlError::LibloadingError(_) => ReadError::Unavailable(e.to_string()),
        other => ReadError::Failed(other.to_string()),
    }
}

/// dcgm-exporter's profile naming: `<slices>g.<GB>gb`, the memory rounded up to eighths
/// of the whole GPU as NVIDIA names its profiles (1g.10gb, 3g.40gb, 7g.80gb on H100).
pub fn mig_profile_name(slices: u32, mig_mib: u64, gpu_total_mib: u64) -> String {
    let total_gb = (gpu_total_mib as f64 / 1024.0).round();
    let eighths = ((mig_mib as f64 / gpu_total_mib.max(1) as f64) * 8.0 - 1e-9).ceil();
    format!("{slices}g.{}gb", (eighths / 8.0 * total_gb).round() as u64)
}

fn read_label(
    dev: &Device<'_>,
    l: LabelField,
    driver: &str,
    nvml_version: &str,
) -> Result<String, NvmlError> {
    match l {
        LabelField::DriverVersion => Ok(driver.to_string()),
        LabelField::NvmlVersion => Ok(nvml_version.to_string()),
        LabelField::Brand => dev.brand().map(|b| super::brand_name(b.as_c()).to_string()),
        LabelField::Serial => dev.serial(),
        LabelField::VbiosVersion => dev.vbios_version(),
        LabelField::OemInforom => dev.info_rom_version(InfoRom::OEM),
        LabelField::EccInforom => dev.info_rom_version(InfoRom::ECC),
        LabelField::PowerInforom => dev.info_rom_version(InfoRom::Power),
        LabelField::InforomImage => dev.info_rom_image_version(),
    }
}

impl GpuSource for NvmlSource {
    fn describe(&self) -> String {
        format!("nvml ({})", self.library_name())
    }

    fn nvlinks(&mut self, entity: usize) -> u32 {
        self.link_count(entity)
    }

    fn read_links(
        &mut self,
        entity: usize,
        links: u32,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        self.read_links_of(entity, links, quantities, out);
    }

    fn discover(&mut self, labels: &[LabelField]) -> Result<Inventory, ReadError> {
        self.discover_devices(labels)
    }

    /// Initialise NVML (the first time, which loads the library) or initialise it again
    /// (after a failure, so a reloaded driver is picked up), then count the devices: the
    /// calls a discovery starts with, and nothing per device.
    fn probe(&mut self) -> Result<(), ReadError> {
        self.sysfs_reference();
        let nvml = match self.nvml {
            None => self.init()?,
            Some(nvml) => {
                // Handles and GPM samples of the old initialisation go before it does.
                self.forget();
                raw::reinit(nvml)?;
                nvml
            }
        };
        nvml.device_count().map_err(map_err)?;
        self.probed = true;
        Ok(())
    }

    fn read(
        &mut self,
        entity: usize,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        out.clear();
        let dev = match self.device(entity) {
            Ok(d) => d,
            Err(e) => {
                out.extend(quantities.iter().map(|_| Err(e.clone())));
                return;
            }
        };
        self.read_with(entity, &dev, quantities, out);
        // With the handle kept from discovery, the readings themselves are what shows
        // the driver answering. The vGPU licence state of a driver without the call is
        // 0 from no call at all, so when every other reading failed it fails with them:
        // a driver that stopped answering is then seen as such.
        let answered = |(q, r): (&Quantity, &Result<Raw, ReadError>)| {
            *q != Quantity::VgpuLicensed && matches!(r, Ok(_) | Err(ReadError::NoValueYet))
        };
        let failure = quantities
            .iter()
            .zip(out.iter())
            .find_map(|(_, r)| match r {
                Err(e @ (ReadError::Failed(_) | ReadError::Unavailable(_))) => Some(e.clone()),
                _ => None,
            });
        if let Some(e) = failure
            && !quantities.iter().zip(out.iter()).any(answered)
        {
            for (q, r) in quantities.iter().zip(out.iter_mut()) {
                if *q == Quantity::VgpuLicensed {
                    *r = Err(e.clone());
                }
            }
        }
        let all_failed = !out.is_empty()
            && out
                .iter()
                .all(|r| matches!(r, Err(e) if *e != ReadError::NoValueYet));
        if all_failed && self.slots.get(entity).is_some_and(|s| s.mig.is_some()) {
            self.verify_mig_handle(entity);
        }
    }

    fn processes(&mut self, entity: usize) -> Result<Vec<ProcessSample>, ReadError> {
        let slot = self.slot(entity)?;
        if slot.mig_parent {
            return Ok(Vec::new());
        }
        let nvml = self.nvml()?;
        let handle = slot.handle.ok_or(ReadError::GpuLost)?;
        // A MIG instance's processes come from its GPU's list, which names each one's
        // instance IDs: one call per GPU and cycle for all its instances, not one each.
        let (list, instance) = match slot.mig {
            Some((_, gi)) => (slot.parent_entity, Some((gi, slot.compute_instance))),
            None => (entity, None),
        };
        let cycle = self.names.cycle;
        let reads = self
            .process_reads
            .get_mut(list)
            .ok_or_else(|| ReadError::Failed(format!("no entity {list}")))?;
        if instance.is_none() || reads.listed_in != Some(cycle) {
            let listed_on = if instance.is_some() {
                slot.parent.ok_or(ReadError::GpuLost)?
            } else {
                handle
            };
            reads.listed_in = None;
            reads.listed = raw::compute_processes(nvml, listed_on.raw(), &mut reads.infos)?;
            reads.listed_in = Some(cycle);
        }
        // SM shares since the last read; not every GPU (nor any MIG instance) has them.
        let mut sm: HashMap<u32, u32> = HashMap::new();
        let own = self
            .process_reads
            .get_mut(entity)
            .ok_or_else(|| ReadError::Failed(format!("no entity {entity}")))?;
        if !own.no_utilization {
            match raw::process_utilization(nvml, handle.raw(), own.seen, &mut own.samples) {
                Ok(n) => {
                    for s in &own.samples[..n] {
                        own.seen = own.seen.max(s.timeStamp);
                        sm.insert(s.pid, s.smUtil);
                    }
                }
                Err(ReadError::NotSupported) => own.no_utilization = true,
                Err(_) => {}
            }
        }
        let reads = &self.process_reads[list];
        let names = &mut self.names;
        Ok(reads.infos[..reads.listed]
            .iter()
            .filter(|p| {
                instance.is_none_or(|(gi, ci)| p.gpuInstanceId == gi && p.computeInstanceId == ci)
            })
            .map(|p| ProcessSample {
                pid: p.pid,
                name: names.name(p.pid, |pid| {
                    nvml.sys_process_name(pid, 64).unwrap_or_default()
                }),
                used_memory_bytes: match UsedGpuMemory::from(p.usedGpuMemory) {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                sm_util_percent: sm.get(&p.pid).copied(),
            })
            .collect())
    }

    fn device_set_changed(&mut self) -> bool {
        if self.layout_stale {
            return true;
        }
        let Ok(nvml) = self.nvml() else {
            return false;
        };
        // One directory listing (see `sysfs`); read every cycle so that its reference is
        // the last check, whatever the path below.
        let bound = self.bound.as_mut().and_then(|b| b.check());
        if self.device_count == 0 {
            // NVML enumerates GPUs when it is initialised: a node that came up with none
            // (GPUs still bound to vfio-pci, a passthrough GPU attached later, a driver
            // that finished probing after the exporter started) shows them only after a
            // new initialisation. With no device, that costs one shutdown and init.
            match self.probe() {
                Ok(()) if nvml.device_count().is_ok_and(|c| c > 0) => {
                    tracing::info!("GPUs appeared; rediscovering");
                    self.layout_stale = true;
                }
                // Still none; the next discovery after a failure initialises NVML itself.
                Ok(()) => self.probed = false,
                // The driver went: the discovery this asks for fails and says so, and
                // the sampler probes as for any outage.
                Err(_) => self.layout_stale = true,
            }
            return self.layout_stale;
        }
        if let Some(change) = bound {
            // A GPU bound to or unbound from the driver since the last check: only a new
            // initialisation lists it (or stops listing it). A change only, never a
            // difference from NVML's count, which a GPU NVML cannot initialise would make
            // permanent.
            tracing::info!(came = ?change.came, went = ?change.went,
                "GPUs bound to the nvidia driver changed; re-initialising NVML");
            // As for a node with no GPU: the discovery that follows does not initialise
            // again, and a failure is the driver's, which that discovery reports.
            let _ = self.probe();
            self.layout_stale = true;
            return true;
        }
        match nvml.device_count() {
            Ok(c) if c != self.device_count => {
                tracing::info!(
                    discovered = self.device_count,
                    now = c,
                    "the GPU count changed; rediscovering"
                );
                self.layout_stale = true;
            }
            // A failing count is the driver's failure: the reads of this cycle find it.
            _ => {}
        }
        if !self.layout_stale {
            let changed = self
                .mig_layouts
                .iter()
                .find(|l| mig_devices_now(&l.gpu.device(nvml)) != l.devices);
            if let Some(l) = changed {
                tracing::info!(gpu = l.index, "the MIG layout changed; rediscovering");
                self.layout_stale = true;
            }
        }
        self.layout_stale
    }

    fn end_cycle(&mut self) {
        self.names.end_cycle();
    }

    fn xid_events(&mut self) -> Vec<XidEvent> {
        let Some(watcher) = &self.xids else {
            return Vec::new();
        };
        watcher
            .drain()
            .into_iter()
            .filter_map(|x| {
                let gpu = *self.event_devices.get(&x.device)?;
                let entity = x
                    .gpu_instance
                    .and_then(|gi| self.event_migs.get(&(gpu, gi)).copied())
                    .unwrap_or(gpu);
                Some(XidEvent {
                    entity,
                    code: x.code,
                    at: x.at,
                })
            })
            .collect()
    }
}

impl NvmlSource {
    /// [`GpuSource::read`] with the entity's handle.
    fn read_with(
        &mut self,
        entity: usize,
        dev: &Device<'static>,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        // Calls that answer several quantities are made once per read.
        let mut util = None;
        let mut mem = None;
        let mut fields = self.field_values(dev, quantities).into_iter();
        let mut gpm: Option<Result<Vec<Result<f64, ReadError>>, ReadError>> = None;
        let mut gpm_wanted = [false; GPM_METRICS.len()];
        for &q in quantities {
            if let Some(i) = gpm_source(q) {
                gpm_wanted[i] = true;
            }
        }
        let mut fabric = None;
        let u = |r: Result<u32, NvmlError>| r.map(|v| Raw::U64(v.into())).map_err(map_err);
        let u64r = |r: Result<u64, NvmlError>| r.map(Raw::U64).map_err(map_err);
        for &q in quantities {
            use Quantity::*;
            let r = match q {
                GpuUtil | MemCopyUtil => {
                    let rates =
                        util.get_or_insert_with(|| dev.utilization_rates().map_err(map_err));
                    rates
                        .as_ref()
                        .map_err(Clone::clone)
                        .map(|r| Raw::U64(if q == GpuUtil { r.gpu } else { r.memory }.into()))
                }
                EncoderUtil => u(dev.encoder_utilization().map(|i| i.utilization)),
                DecoderUtil => u(dev.decoder_utilization().map(|i| i.utilization)),
                FbFree | FbUsed | FbReserved | FbTotal => {
                    let m = mem.get_or_insert_with(|| dev.memory_info().map_err(map_err));
                    m.as_ref().map_err(Clone::clone).map(|m| {
                        Raw::U64(match q {
                            FbFree => m.free,
                            FbUsed => m.used,
                            FbReserved => m.reserved,
                            _ => m.total,
                        })
                    })
                }
                PowerUsage => u(dev.power_usage()),
                PowerLimit => u(dev.enforced_power_limit()),
                GpuTemp => u(dev.temperature(TemperatureSensor::Gpu)),
                SmClock => u(dev.clock_info(Clock::SM)),
                MemClock => u(dev.clock_info(Clock::Memory)),
                PcieReplayCounter => u(dev.pcie_replay_counter()),
                PcieTxThroughput | PcieRxThroughput => {
                    let g = gpm.get_or_insert_with(|| self.gpm_read(entity, &gpm_wanted));
                    pcie_throughput(dev, q, g)
                }
                ShutdownTemp | SlowdownTemp | MemMaxOpTemp | GpuMaxOpTemp => {
                    self.threshold(entity, dev, q)
                }
                ClockEventReasons => u64r(dev.current_throttle_reasons().map(|r| r.bits())),
                Pstate => u(dev.performance_state().map(|p| p.as_c())),
                // SAFETY: `dev` is a live handle of this NVML instance.
                FanSpeed => self
                    .nvml()
                    .and_then(|nvml| raw::fan_speed(nvml, unsafe { dev.handle() }))
                    .map(|v| Raw::U64(v.into())),
                FabricManagerStatus | FabricManagerError | FabricCliqueId | FabricHealthMask
                | FabricHealthSummary => {
                    let f = fabric.get_or_insert_with(|| match self.nvml() {
                        // SAFETY: `dev` is a live handle of this NVML instance.
                        Ok(nvml) => raw::fabric_info(nvml, unsafe { dev.handle() }),
                        Err(e) => Err(raw::FabricError::Read(e)),
                    });
                    fabric_quantity(f, q)
                }
                _ if !field::of(q).is_empty() => {
                    // This quantity's requests, in the order `field_values` made them.
                    let mut parts = fields.by_ref().take(field::of(q).len());
                    let first = parts.next().unwrap_or(Err(ReadError::NotSupported));
                    parts.fold(first, |sum, part| match (sum, part) {
                        (Ok(a), Ok(b)) => Ok(Raw::U64(a.as_f64() as u64 + b.as_f64() as u64)),
                        (Err(e), _) | (_, Err(e)) => Err(e),
                    })
                }
                VgpuLicensed => self.vgpu_licensed(entity, dev),
                _ => {
                    // GPM: `gpm_index` covers every remaining quantity.
                    let i = gpm_index(q).unwrap_or(0);
                    let g = gpm.get_or_insert_with(|| self.gpm_read(entity, &gpm_wanted));
                    match g {
                        Ok(v) => v
                            .get(i)
                            .cloned()
                            .unwrap_or(Err(ReadError::NotSupported))
                            .map(Raw::F64),
                        Err(e) => Err(e.clone()),
                    }
                }
            };
            out.push(r);
        }
    }

    /// A temperature threshold: board constants, read once per discovery (141 µs a
    /// call on a real H100). A transient failure is asked again next cycle.
    fn threshold(
        &mut self,
        entity: usize,
        dev: &Device<'static>,
        q: Quantity,
    ) -> Result<Raw, ReadError> {
        let t = match q {
            Quantity::ShutdownTemp => TemperatureThreshold::Shutdown,
            Quantity::SlowdownTemp => TemperatureThreshold::Slowdown,
            Quantity::MemMaxOpTemp => TemperatureThreshold::MemoryMax,
            _ => TemperatureThreshold::GpuMax,
        };
        let r = match self.thresholds.get(&(entity, q)) {
            Some(r) => r.clone(),
            None => {
                let r = dev.temperature_threshold(t).map_err(map_err);
                if matches!(r, Ok(_) | Err(ReadError::NotSupported)) {
                    self.thresholds.insert((entity, q), r.clone());
                }
                r
            }
        };
        r.map(|v| Raw::U64(v.into()))
    }

    /// The vGPU licence state: 0 on bare metal (remembered per discovery: only a
    /// re-initialisation can change it), else whether the guest is licensed.
    fn vgpu_licensed(&mut self, entity: usize, dev: &Device<'static>) -> Result<Raw, ReadError> {
        if self.slots.get(entity).is_some_and(|s| s.no_vgpu_licensing) {
            return Ok(Raw::U64(0));
        }
        let nvml = self.nvml()?;
        // SAFETY: `dev` is a live handle of this NVML instance.
        match raw::vgpu_licence(nvml, unsafe { dev.handle() })? {
            raw::VgpuLicence::NotAGuest => {
                if let Some(s) = self.slots.get_mut(entity) {
                    s.no_vgpu_licensing = true;
                }
                Ok(Raw::U64(0))
            }
            raw::VgpuLicence::Guest { licensed } => Ok(Raw::U64(u64::from(licensed))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_fields_follow_dcgm() {
        let info = |state, status, summary| {
            Ok(raw::FabricInfo {
                state,
                status,
                clique_id: 7,
                health_mask: 410,
                health_summary: summary,
            })
        };
        let status = |f| fabric_quantity(&f, Quantity::FabricManagerStatus);
        assert_eq!(status(info(3, 0, None)), Ok(Raw::U64(3)));
        // Completed with an error status is a failure; earlier states pass through.
        assert_eq!(status(info(3, 999, None)), Ok(Raw::U64(4)));
        assert_eq!(status(info(2, 0, None)), Ok(Raw::U64(2)));
        assert_eq!(status(info(9, 0, None)), Ok(Raw::U64(5)));
        assert_eq!(status(Err(raw::FabricError::NoSymbol)), Ok(Raw::U64(6)));
        assert_eq!(
            fabric_quantity(&Err(raw::FabricError::NoSymbol), Quantity::FabricCliqueId),
            Err(ReadError::NotSupported)
        );
        // A v2 struct has no health summary.
        let v2 = info(3, 0, None);
        assert_eq!(
            fabric_quantity(&v2, Quantity::FabricHealthSummary),
            Err(ReadError::NotSupported)
        );
        assert_eq!(
            fabric_quantity(&info(3, 0, Some(2)), Quantity::FabricHealthSummary),
            Ok(Raw::U64(2))
        );
        assert_eq!(
            fabric_quantity(&v2, Quantity::FabricHealthMask),
            Ok(Raw::U64(410))
        );
        assert_eq!(
            fabric_quantity(&v2, Quantity::FabricCliqueId),
            Ok(Raw::U64(7))
        );
        // The error code: DCGM's conversion of the status, only once completed.
        let error = |f| fabric_quantity(&f, Quantity::FabricManagerError);
        assert_eq!(error(info(3, 0, None)), Ok(Raw::F64(0.0)));
        assert_eq!(error(info(3, 999, None)), Ok(Raw::F64(-8.0)));
        assert_eq!(error(info(3, 15, None)), Ok(Raw::F64(-18.0)));
        assert_eq!(error(info(2, 0, None)), Err(ReadError::NoValueYet));
        assert_eq!(
            error(Err(raw::FabricError::NoSymbol)),
            Err(ReadError::NotSupported)
        );
    }

    #[test]
    fn mig_profile_names_follow_nvidia_naming() {
        let h100 = 81559;
        assert_eq!(mig_profile_name(1, 9856, h100), "1g.10gb");
        assert_eq!(mig_profile_name(1, 19968, h100), "1g.20gb");
        assert_eq!(mig_profile_name(3, 40192, h100), "3g.40gb");
        assert_eq!(mig_profile_name(7, 80896, h100), "7g.80gb");
        assert_eq!(mig_profile_name(7, 80384, 81920), "7g.80gb");
    }

    #[test]
    fn process_names_are_read_once_per_pid_and_again_after_the_pid_was_gone() {
        let mut names = ProcessNames::default();
        let mut reads = Vec::new();
        let mut read = |pid: u32| {
            reads.push(pid);
            format!("proc-{pid}-{}", reads.len())
        };
        // Cycle 1: two processes, each read once, even when listed on two devices.
        assert_eq!(names.name(10, &mut read), "proc-10-1");
        assert_eq!(names.name(11, &mut read), "proc-11-2");
        assert_eq!(names.name(10, &mut read), "proc-10-1");
        names.end_cycle();
        // Cycle 2: pid 11 is on no device any more.
        assert_eq!(names.name(10, &mut read), "proc-10-1");
        names.end_cycle();
        assert_eq!(
            names.by_pid.len(),
            1,
            "a pid gone from every list is dropped"
        );
        // Cycle 3: pid 11 is back (a reused pid): its name is read again.
        assert_eq!(names.name(11, &mut read), "proc-11-3");
        assert_eq!(reads, [10, 11, 11]);
    }

    #[test]
    fn a_missing_library_is_an_unavailable_driver() {
        let mut s = NvmlSource::new(Some("/nonexistent/libnvidia-ml.so.1".into()));
        match s.discover(&[]) {
            Err(ReadError::Unavailable(m)) => assert!(m.contains("/nonexistent"), "{m}"),
            other => panic!("{:?}", other.map(|i| i.entities.len())),
        }
    }
}
