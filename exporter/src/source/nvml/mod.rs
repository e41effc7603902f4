//! The NVML source, through `nvml-wrapper`, with raw calls where it has gaps ([`raw`]).
//!
//! - The library is loaded and initialised once per process and kept (nvml-wrapper
//!   never unloads it either); device handles are fetched per read, so rediscovery after
//!   a driver failure needs no handle fix-up.
//! - GPM ratios need two samples: each entity keeps its previous sample, so the first
//!   cycle has none and every later cycle reports the interval since the last one.
//! - XIDs arrive on their own thread ([`events`]).

mod events;
mod raw;

use super::{EntityInfo, GpuSource, Inventory, MigInfo, ProcessSample, Raw, ReadError, XidEvent};
use crate::catalog::{LabelField, Quantity};
use events::XidWatcher;
use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, InfoRom, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::GpmSample;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;

/// NVML field IDs (`NVML_FI_DEV_*`) read through field values, with their scope.
/// All are below 251, where the driver-580 renumbering does not apply.
mod field {
    /// `scopeId` meaning "all NVLink links".
    pub const ALL_LINKS: u32 = u32::MAX;
    pub const MEMORY_TEMP: (u32, u32) = (82, 0);
    pub const NVLINK_CRC_FLIT_TOTAL: (u32, u32) = (38, 0);
    pub const NVLINK_CRC_DATA_TOTAL: (u32, u32) = (45, 0);
    pub const NVLINK_REPLAY_TOTAL: (u32, u32) = (52, 0);
    pub const NVLINK_RECOVERY_TOTAL: (u32, u32) = (59, 0);
    pub const NVLINK_DATA_TX: (u32, u32) = (138, ALL_LINKS);
    pub const NVLINK_DATA_RX: (u32, u32) = (139, ALL_LINKS);
    pub const REMAPPED_COR: (u32, u32) = (142, 0);
    pub const REMAPPED_UNC: (u32, u32) = (143, 0);
    pub const REMAPPED_FAILURE: (u32, u32) = (145, 0);

    pub const ALL: [(u32, u32); 10] = [
        MEMORY_TEMP,
        NVLINK_CRC_FLIT_TOTAL,
        NVLINK_CRC_DATA_TOTAL,
        NVLINK_REPLAY_TOTAL,
        NVLINK_RECOVERY_TOTAL,
        NVLINK_DATA_TX,
        NVLINK_DATA_RX,
        REMAPPED_COR,
        REMAPPED_UNC,
        REMAPPED_FAILURE,
    ];
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

/// Where an entity lives: a GPU index and, for MIG, the MIG slot and GPU-instance ID.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: u32,
    mig: Option<(u32, u32)>,
    /// A physical GPU in MIG mode: its processes are reported on its instances.
    mig_parent: bool,
}

/// GPM state of one entity.
enum Gpm {
    Unknown,
    Unsupported,
    Previous(Option<GpmSample<'static>>),
}

pub struct NvmlSource {
    library: Option<PathBuf>,
    nvml: Option<&'static Nvml>,
    slots: Vec<Slot>,
    gpm: Vec<Gpm>,
    /// Last process-utilisation timestamp seen per entity (µs), for incremental reads.
    process_seen: Vec<u64>,
    /// Device handle address of each physical GPU → entity index, for events.
    event_devices: HashMap<usize, usize>,
    /// (GPU entity, GPU-instance ID) → MIG entity, for events.
    event_migs: HashMap<(usize, u32), usize>,
    xids: Option<XidWatcher>,
}

impl NvmlSource {
    /// `library`: an explicit libnvidia-ml path, or the default search path.
    pub fn new(library: Option<PathBuf>) -> NvmlSource {
        NvmlSource {
            library,
            nvml: None,
            slots: Vec::new(),
            gpm: Vec::new(),
            process_seen: Vec::new(),
            event_devices: HashMap::new(),
            event_migs: HashMap::new(),
            xids: None,
        }
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

    fn device(&self, entity: usize) -> Result<Device<'static>, ReadError> {
        let nvml = self.nvml()?;
        let slot = self
            .slots
            .get(entity)
            .ok_or_else(|| ReadError::Failed(format!("no entity {entity}")))?;
        let dev = nvml.device_by_index(slot.index).map_err(map_err)?;
        match slot.mig {
            None => Ok(dev),
            Some((j, _)) => dev.mig_device_by_index(j).map_err(map_err),
        }
    }

    /// GPM readings of one entity over the interval since its previous sample.
    fn gpm_read(
        &mut self,
        entity: usize,
        dev: &Device<'static>,
    ) -> Result<Vec<Result<f64, ReadError>>, ReadError> {
        let nvml = self.nvml()?;
        let slot = self.slots[entity];
        if matches!(self.gpm[entity], Gpm::Unknown) {
            // GPM support is a property of the physical GPU, also for its MIG instances.
            let parent = nvml.device_by_index(slot.index).map_err(map_err)?;
            self.gpm[entity] = match parent.gpm_support() {
                Ok(true) => Gpm::Previous(None),
                Ok(false) | Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                    Gpm::Unsupported
                }
                Err(e) => return Err(map_err(e)),
            };
        }
        let Gpm::Previous(previous) = &mut self.gpm[entity] else {
            return Err(ReadError::NotSupported);
        };
        let sample = match slot.mig {
            None => dev.gpm_sample(),
            Some((_, gi)) => nvml
                .device_by_index(slot.index)
                .and_then(|parent| parent.gpm_mig_sample(gi)),
        }
        .map_err(map_err)?;
        let Some(before) = previous.replace(sample) else {
            // The first sample only opens the interval.
            return Ok(GPM_METRICS
                .iter()
                .map(|_| Err(ReadError::NoValueYet))
                .collect());
        };
        let after = previous
            .as_ref()
            .ok_or(ReadError::Failed("no GPM sample".into()))?;
        let results = nvml_wrapper::gpm::gpm_metrics_get(nvml, &before, after, &GPM_METRICS)
            .map_err(map_err)?;
        Ok(results
            .into_iter()
            .map(|r| r.map(|m| m.value).map_err(map_err))
            .collect())
    }
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

    fn discover(&mut self, labels: &[LabelField]) -> Result<Inventory, ReadError> {
        let rediscovery = self.nvml.is_some();
        let nvml = self.init()?;
        self.xids = None;
        if rediscovery {
            // After a driver failure: drop NVML's state and initialise it again, so a
            // reloaded driver is picked up.
            raw::reinit(nvml)?;
        }
        let driver_version = nvml.sys_driver_version().map_err(map_err)?;
        let nvml_version = nvml.sys_nvml_version().unwrap_or_default();
        let count = nvml.device_count().map_err(map_err)?;
        let (mut gpus, mut migs) = (Vec::new(), Vec::new());
        let mut event_handles = Vec::new();
        self.event_devices.clear();
        self.event_migs.clear();
        for index in 0..count {
            let lost = |why: String| {
                tracing::error!(gpu = index, error = %why, "GPU cannot be read at discovery; reported as lost");
                (
                    Slot {
                        index,
                        mig: None,
                        mig_parent: false,
                    },
                    EntityInfo {
                        gpu_index: index,
                        uuid: String::new(),
                        pci_bus_id: String::new(),
                        model_name: String::new(),
                        mig: None,
                        labels: labels
                            .iter()
                            .filter(|l| **l == LabelField::DriverVersion)
                            .map(|l| (*l, driver_version.clone()))
                            .collect(),
                        lost: true,
                    },
                )
            };
            let dev = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e @ (NvmlError::GpuLost | NvmlError::Unknown)) => {
                    gpus.push(lost(e.to_string()));
                    continue;
                }
                Err(e) => return Err(map_err(e)),
            };
            let uuid = match dev.uuid() {
                Ok(u) => u,
                Err(e) => {
                    gpus.push(lost(e.to_string()));
                    continue;
                }
            };
            let pci_bus_id = dev.pci_info().map(|p| p.bus_id).unwrap_or_default();
            let model_name = dev.name().unwrap_or_default();
            let values: BTreeMap<LabelField, String> = labels
                .iter()
                .filter_map(|&l| {
                    Some((l, read_label(&dev, l, &driver_version, &nvml_version).ok()?))
                })
                .collect();
            let gpu_entity = gpus.len();
            // SAFETY: the handle stays valid while NVML is initialised; used as an identity only.
            let handle = unsafe { dev.handle() };
            self.event_devices.insert(handle as usize, gpu_entity);
            event_handles.push(handle);
            let total_mib = dev.memory_info().map(|m| m.total >> 20).unwrap_or(0);
            let mig_on = dev
                .mig_mode()
                .is_ok_and(|m| m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE);
            if mig_on {
                for j in 0..dev.mig_device_count().unwrap_or(0) {
                    let Ok(mig) = dev.mig_device_by_index(j) else {
                        continue; // an empty MIG slot
                    };
                    // SAFETY: `mig` is a live handle of this NVML instance.
                    let (gi, ci) = match raw::instance_ids(nvml, unsafe { mig.handle() }) {
                        Ok(ids) => ids,
                        Err(e) => {
                            tracing::warn!(gpu = index, slot = j, error = %e, "MIG instance without IDs; skipped");
                            continue;
                        }
                    };
                    let profile = mig
                        .attributes()
                        .map(|a| {
                            mig_profile_name(
                                a.gpu_instance_slice_count,
                                a.memory_size_mb,
                                total_mib,
                            )
                        })
                        .unwrap_or_default();
                    migs.push((
                        Slot {
                            index,
                            mig: Some((j, gi)),
                            mig_parent: false,
                        },
                        gpu_entity,
                        EntityInfo {
                            gpu_index: index,
                            uuid: uuid.clone(),
                            pci_bus_id: pci_bus_id.clone(),
                            model_name: model_name.clone(),
                            mig: Some(MigInfo {
                                parent: gpu_entity,
                                gpu_instance_id: gi,
                                compute_instance_id: ci,
                                slot: j,
                                profile,
                                mig_uuid: mig.uuid().unwrap_or_default(),
                            }),
                            labels: values.clone(),
                            lost: false,
                        },
                    ));
                }
            }
            gpus.push((
                Slot {
                    index,
                    mig: None,
                    mig_parent: mig_on,
                },
                EntityInfo {
                    gpu_index: index,
                    uuid,
                    pci_bus_id,
                    model_name,
                    mig: None,
                    labels: values,
                    lost: false,
                },
            ));
        }
        let mut slots = Vec::new();
        let mut entities = Vec::new();
        for (slot, e) in gpus {
            slots.push(slot);
            entities.push(e);
        }
        for (slot, parent, e) in migs {
            if let Some((_, gi)) = slot.mig {
                self.event_migs.insert((parent, gi), entities.len());
            }
            slots.push(slot);
            entities.push(e);
        }
        let n = slots.len();
        self.slots = slots;
        self.gpm = (0..n).map(|_| Gpm::Unknown).collect();
        self.process_seen = vec![0; n];
        self.xids = Some(XidWatcher::start(nvml, event_handles));
        Ok(Inventory {
            driver_version,
            nvml_version,
            entities,
        })
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
        // Calls that answer several quantities are made once per read.
        let mut util = None;
        let mut mem = None;
        let mut fields: Option<Result<Vec<Result<Raw, ReadError>>, ReadError>> = None;
        let mut gpm: Option<Result<Vec<Result<f64, ReadError>>, ReadError>> = None;
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
                TotalEnergy => u64r(dev.total_energy_consumption()),
                GpuTemp => u(dev.temperature(TemperatureSensor::Gpu)),
                SmClock => u(dev.clock_info(Clock::SM)),
                MemClock => u(dev.clock_info(Clock::Memory)),
                PcieReplayCounter => u(dev.pcie_replay_counter()),
                PcieTxThroughput => u(dev.pcie_throughput(PcieUtilCounter::Send)),
                PcieRxThroughput => u(dev.pcie_throughput(PcieUtilCounter::Receive)),
                ClockEventReasons => u64r(dev.current_throttle_reasons().map(|r| r.bits())),
                PowerViolation | ThermalViolation | SyncBoostViolation | BoardLimitViolation
                | LowUtilViolation | ReliabilityViolation => {
                    let policy = match q {
                        PowerViolation => PerformancePolicy::Power,
                        ThermalViolation => PerformancePolicy::Thermal,
                        SyncBoostViolation => PerformancePolicy::SyncBoost,
                        BoardLimitViolation => PerformancePolicy::BoardLimit,
                        LowUtilViolation => PerformancePolicy::LowUtilization,
                        _ => PerformancePolicy::Reliability,
                    };
                    u64r(dev.violation_status(policy).map(|v| v.violation_time))
                }
                EccSbeVolatile => {
                    u64r(dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile))
                }
                EccDbeVolatile => {
                    u64r(dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile))
                }
                EccSbeAggregate => {
                    u64r(dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate))
                }
                EccDbeAggregate => {
                    u64r(dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate))
                }
                RetiredSbe => u64r(
                    dev.retired_pages(RetirementCause::MultipleSingleBitEccErrors)
                        .map(|p| p.len() as u64),
                ),
                RetiredDbe => u64r(
                    dev.retired_pages(RetirementCause::DoubleBitEccError)
                        .map(|p| p.len() as u64),
                ),
                RetiredPending => u64r(dev.are_pages_pending_retired().map(u64::from)),
                MemoryTemp
                | NvlinkCrcFlitErrors
                | NvlinkCrcDataErrors
                | NvlinkReplayErrors
                | NvlinkRecoveryErrors
                | NvlinkDataKib
                | RemappedCorrectable
                | RemappedUncorrectable
                | RemapFailure => {
                    let f: &Result<Vec<Result<Raw, ReadError>>, ReadError> = fields
                        .get_or_insert_with(|| match self.nvml() {
                            // SAFETY: `dev` is a live handle of this NVML instance.
                            Ok(nvml) => {
                                raw::field_values(nvml, unsafe { dev.handle() }, &field::ALL)
                            }
                            Err(e) => Err(e),
                        });
                    let at = |id: (u32, u32)| -> Result<Raw, ReadError> {
                        let i = field::ALL.iter().position(|&x| x == id).unwrap_or(0);
                        match f {
                            Ok(v) => v.get(i).cloned().unwrap_or(Err(ReadError::NotSupported)),
                            Err(e) => Err(e.clone()),
                        }
                    };
                    match q {
                        MemoryTemp => at(field::MEMORY_TEMP),
                        NvlinkCrcFlitErrors => at(field::NVLINK_CRC_FLIT_TOTAL),
                        NvlinkCrcDataErrors => at(field::NVLINK_CRC_DATA_TOTAL),
                        NvlinkReplayErrors => at(field::NVLINK_REPLAY_TOTAL),
                        NvlinkRecoveryErrors => at(field::NVLINK_RECOVERY_TOTAL),
                        NvlinkDataKib => {
                            match (at(field::NVLINK_DATA_TX), at(field::NVLINK_DATA_RX)) {
                                (Ok(tx), Ok(rx)) => {
                                    Ok(Raw::U64(tx.as_f64() as u64 + rx.as_f64() as u64))
                                }
                                (Err(e), _) | (_, Err(e)) => Err(e),
                            }
                        }
                        RemappedCorrectable => at(field::REMAPPED_COR),
                        RemappedUncorrectable => at(field::REMAPPED_UNC),
                        _ => at(field::REMAPPED_FAILURE),
                    }
                }
                VgpuLicensed => match self.nvml() {
                    // SAFETY: `dev` is a live handle of this NVML instance.
                    Ok(nvml) => raw::vgpu_licensed(nvml, unsafe { dev.handle() }).map(Raw::U64),
                    Err(e) => Err(e),
                },
                _ => {
                    // GPM: `gpm_index` covers every remaining quantity.
                    let i = gpm_index(q).unwrap_or(0);
                    let g = gpm.get_or_insert_with(|| self.gpm_read(entity, &dev));
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

    fn processes(&mut self, entity: usize) -> Result<Vec<ProcessSample>, ReadError> {
        if self.slots.get(entity).is_some_and(|s| s.mig_parent) {
            return Ok(Vec::new());
        }
        let dev = self.device(entity)?;
        let nvml = self.nvml()?;
        let procs = dev.running_compute_processes().map_err(map_err)?;
        // SM shares since the last read; not every GPU (nor any MIG instance) has them.
        let since = self.process_seen.get(entity).copied().unwrap_or(0);
        let mut sm: HashMap<u32, u32> = HashMap::new();
        if let Ok(samples) = dev.process_utilization_stats(since) {
            for s in samples {
                if let Some(seen) = self.process_seen.get_mut(entity) {
                    *seen = (*seen).max(s.timestamp);
                }
                sm.insert(s.pid, s.sm_util);
            }
        }
        Ok(procs
            .into_iter()
            .map(|p| ProcessSample {
                pid: p.pid,
                name: nvml.sys_process_name(p.pid, 64).unwrap_or_default(),
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                sm_util_percent: sm.get(&p.pid).copied(),
            })
            .collect())
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_missing_library_is_an_unavailable_driver() {
        let mut s = NvmlSource::new(Some("/nonexistent/libnvidia-ml.so.1".into()));
        match s.discover(&[]) {
            Err(ReadError::Unavailable(m)) => assert!(m.contains("/nonexistent"), "{m}"),
            other => panic!("{:?}", other.map(|i| i.entities.len())),
        }
    }
}
