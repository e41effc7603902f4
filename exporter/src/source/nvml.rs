//! The NVML source, through `nvml-wrapper`. The library is loaded once per process and
//! kept for its lifetime (nvml-wrapper never unloads it anyway); device handles are
//! fetched per read, so a re-enumeration after a driver failure needs no handle fix-up.

use super::{EntityInfo, GpuSource, Inventory, MigInfo, ProcessSample, Raw, ReadError, XidEvent};
use crate::catalog::{LabelField, Quantity};
use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

/// NVML field IDs (`NVML_FI_DEV_*`) below 251, where the numbering never changed.
mod field {
    pub const MEMORY_TEMP: u32 = 82;
    pub const NVLINK_CRC_FLIT_TOTAL: u32 = 38;
    pub const NVLINK_CRC_DATA_TOTAL: u32 = 45;
    pub const NVLINK_REPLAY_TOTAL: u32 = 52;
    pub const NVLINK_RECOVERY_TOTAL: u32 = 59;
    pub const REMAPPED_COR: u32 = 142;
    pub const REMAPPED_UNC: u32 = 143;
    pub const REMAPPED_FAILURE: u32 = 145;
}

/// Where an entity lives: a GPU index and, for MIG, the MIG slot on it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: u32,
    mig_slot: Option<u32>,
}

pub struct NvmlSource {
    library: Option<PathBuf>,
    nvml: Option<&'static Nvml>,
    slots: Vec<Slot>,
}

impl NvmlSource {
    /// `library`: an explicit libnvidia-ml path, or the default search path.
    pub fn new(library: Option<PathBuf>) -> NvmlSource {
        NvmlSource {
            library,
            nvml: None,
            slots: Vec::new(),
        }
    }

    fn library_name(&self) -> String {
        self.library
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "libnvidia-ml.so.1".into())
    }

    /// Load and initialise NVML once; later calls reuse it.
    pub fn init(&mut self) -> Result<&'static Nvml, ReadError> {
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
        // Leaked on purpose: one per process, never unloaded (nvml-wrapper keeps the library
        // mapped regardless), and `Device<'static>` handles need it to outlive them.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        self.nvml = Some(nvml);
        Ok(nvml)
    }

    fn device(&self, entity: usize) -> Result<Device<'static>, ReadError> {
        let nvml = self
            .nvml
            .ok_or_else(|| ReadError::Unavailable("NVML is not initialised".into()))?;
        let slot = self
            .slots
            .get(entity)
            .ok_or_else(|| ReadError::Failed(format!("no entity {entity}")))?;
        let dev = nvml.device_by_index(slot.index).map_err(map_err)?;
        match slot.mig_slot {
            None => Ok(dev),
            Some(j) => dev.mig_device_by_index(j).map_err(map_err),
        }
    }
}

/// How an NVML error affects the sampler.
fn map_err(e: NvmlError) -> ReadError {
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

/// The GPU-instance ID of a MIG device handle (unwrapped in nvml-wrapper).
fn gpu_instance_id(nvml: &Nvml, dev: &Device<'_>) -> Result<u32, ReadError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetGpuInstanceId
        .as_ref()
        .map_err(|_| ReadError::NotSupported)?;
    let mut id = 0u32;
    // SAFETY: `dev.handle()` is a live handle from this NVML instance, and `id` is a
    // valid out-pointer for the duration of the call.
    let rc = unsafe { sym(dev.handle(), &mut id) };
    nvml_wrapper::error::nvml_try(rc).map_err(map_err)?;
    Ok(id)
}

/// dcgm-exporter's profile naming: `<slices>g.<GB>gb`, the memory rounded up to eighths
/// of the whole GPU as NVIDIA names its profiles (1g.10gb, 3g.40gb, 7g.80gb on H100).
pub fn mig_profile_name(slices: u32, mig_mib: u64, gpu_total_mib: u64) -> String {
    let total_gb = (gpu_total_mib as f64 / 1024.0).round();
    let eighths = ((mig_mib as f64 / gpu_total_mib.max(1) as f64) * 8.0 - 1e-9).ceil();
    format!("{slices}g.{}gb", (eighths / 8.0 * total_gb).round() as u64)
}

fn fv(samples: &[Result<FieldValueSample, NvmlError>], i: usize) -> Result<Raw, ReadError> {
    use nvml_wrapper::enums::device::SampleValue::*;
    match samples.get(i) {
        Some(Ok(s)) => match &s.value {
            Ok(F64(v)) => Ok(Raw::F64(*v)),
            Ok(U32(v)) => Ok(Raw::U64((*v).into())),
            Ok(U64(v)) => Ok(Raw::U64(*v)),
            Ok(I64(v)) => Ok(Raw::U64((*v).max(0) as u64)),
            Err(e) => Err(map_err(e.clone_shallow())),
        },
        Some(Err(e)) => Err(map_err(e.clone_shallow())),
        None => Err(ReadError::Failed("field value missing".into())),
    }
}

/// `NvmlError` is not `Clone`; keep what the sampler needs.
trait CloneShallow {
    fn clone_shallow(&self) -> NvmlError;
}

impl CloneShallow for NvmlError {
    fn clone_shallow(&self) -> NvmlError {
        match self {
            NvmlError::NotSupported => NvmlError::NotSupported,
            NvmlError::GpuLost => NvmlError::GpuLost,
            NvmlError::NotFound => NvmlError::NotFound,
            NvmlError::Uninitialized => NvmlError::Uninitialized,
            NvmlError::DriverNotLoaded => NvmlError::DriverNotLoaded,
            _ => NvmlError::Unknown,
        }
    }
}

impl GpuSource for NvmlSource {
    fn describe(&self) -> String {
        format!("nvml ({})", self.library_name())
    }

    fn discover(&mut self, labels: &[LabelField]) -> Result<Inventory, ReadError> {
        let nvml = self.init()?;
        let driver_version = nvml.sys_driver_version().map_err(map_err)?;
        let nvml_version = nvml.sys_nvml_version().unwrap_or_default();
        let count = nvml.device_count().map_err(map_err)?;
        let mut entities = Vec::new();
        let mut slots = Vec::new();
        let mut migs = Vec::new();
        for index in 0..count {
            let dev = nvml.device_by_index(index).map_err(map_err)?;
            let uuid = dev.uuid().map_err(map_err)?;
            let pci_bus_id = dev.pci_info().map(|p| p.bus_id).unwrap_or_default();
            let model_name = dev.name().unwrap_or_default();
            let mut values = BTreeMap::new();
            for l in labels {
                let v = match l {
                    LabelField::DriverVersion => Ok(driver_version.clone()),
                    LabelField::NvmlVersion => Ok(nvml_version.clone()),
                    LabelField::Brand => dev.brand().map(|b| format!("{b:?}")),
                    LabelField::Serial => dev.serial(),
                    LabelField::VbiosVersion => dev.vbios_version(),
                    LabelField::OemInforom => {
                        dev.info_rom_version(nvml_wrapper::enum_wrappers::device::InfoRom::OEM)
                    }
                    LabelField::EccInforom => {
                        dev.info_rom_version(nvml_wrapper::enum_wrappers::device::InfoRom::ECC)
                    }
                    LabelField::PowerInforom => {
                        dev.info_rom_version(nvml_wrapper::enum_wrappers::device::InfoRom::Power)
                    }
                    LabelField::InforomImage => dev.info_rom_image_version(),
                };
                if let Ok(v) = v {
                    values.insert(*l, v);
                }
            }
            let parent = entities.len();
            let total_mib = dev.memory_info().map(|m| m.total >> 20).unwrap_or(0);
            let mig_on = dev
                .mig_mode()
                .map(|m| m.current == nvml_wrapper_sys_mig_enabled())
                .unwrap_or(false);
            if mig_on {
                let max = dev.mig_device_count().unwrap_or(0);
                for j in 0..max {
                    let Ok(mig) = dev.mig_device_by_index(j) else {
                        continue;
                    };
                    let gi = gpu_instance_id(nvml, &mig).unwrap_or(j);
                    let attrs = mig.attributes().ok();
                    let profile = attrs
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
                            mig_slot: Some(j),
                        },
                        EntityInfo {
                            gpu_index: index,
                            uuid: uuid.clone(),
                            pci_bus_id: pci_bus_id.clone(),
                            model_name: model_name.clone(),
                            mig: Some(MigInfo {
                                parent,
                                gpu_instance_id: gi,
                                compute_instance_id: 0,
                                profile,
                                mig_uuid: mig.uuid().unwrap_or_default(),
                            }),
                            labels: values.clone(),
                        },
                    ));
                }
            }
            slots.push(Slot {
                index,
                mig_slot: None,
            });
            entities.push(EntityInfo {
                gpu_index: index,
                uuid,
                pci_bus_id,
                model_name,
                mig: None,
                labels: values,
            });
        }
        for (slot, e) in migs {
            slots.push(slot);
            entities.push(e);
        }
        self.slots = slots;
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
        // Calls that answer several quantities at once are made once per read.
        let mut util = None;
        let mut mem = None;
        let mut fields: Option<Vec<Result<FieldValueSample, NvmlError>>> = None;
        const FIELD_IDS: [u32; 8] = [
            field::MEMORY_TEMP,
            field::NVLINK_CRC_FLIT_TOTAL,
            field::NVLINK_CRC_DATA_TOTAL,
            field::NVLINK_REPLAY_TOTAL,
            field::NVLINK_RECOVERY_TOTAL,
            field::REMAPPED_COR,
            field::REMAPPED_UNC,
            field::REMAPPED_FAILURE,
        ];
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
                | RemappedCorrectable
                | RemappedUncorrectable
                | RemapFailure => {
                    let f = fields.get_or_insert_with(|| {
                        let ids: Vec<FieldId> = FIELD_IDS.iter().map(|&i| FieldId(i)).collect();
                        dev.field_values_for(&ids).unwrap_or_else(|e| {
                            FIELD_IDS.iter().map(|_| Err(e.clone_shallow())).collect()
                        })
                    });
                    let id = match q {
                        MemoryTemp => field::MEMORY_TEMP,
                        NvlinkCrcFlitErrors => field::NVLINK_CRC_FLIT_TOTAL,
                        NvlinkCrcDataErrors => field::NVLINK_CRC_DATA_TOTAL,
                        NvlinkReplayErrors => field::NVLINK_REPLAY_TOTAL,
                        NvlinkRecoveryErrors => field::NVLINK_RECOVERY_TOTAL,
                        RemappedCorrectable => field::REMAPPED_COR,
                        RemappedUncorrectable => field::REMAPPED_UNC,
                        _ => field::REMAPPED_FAILURE,
                    };
                    // FIELD_IDS holds every id matched above.
                    let i = FIELD_IDS.iter().position(|&x| x == id).unwrap_or(0);
                    fv(f, i)
                }
                // Needs scoped field values and GPM sampling: issue #3 completes these.
                NvlinkDataKib | VgpuLicensed => Err(ReadError::NotSupported),
                GpmGraphicsUtil | GpmSmUtil | GpmSmOccupancy | GpmTensorUtil | GpmDramUtil
                | GpmFp64Util | GpmFp32Util | GpmFp16Util | GpmPcieTx | GpmPcieRx => {
                    Err(ReadError::NotSupported)
                }
            };
            out.push(r);
        }
    }

    fn processes(&mut self, entity: usize) -> Result<Vec<ProcessSample>, ReadError> {
        let dev = self.device(entity)?;
        let nvml = self
            .nvml
            .ok_or_else(|| ReadError::Unavailable("NVML is not initialised".into()))?;
        let procs = dev.running_compute_processes().map_err(map_err)?;
        Ok(procs
            .into_iter()
            .map(|p| ProcessSample {
                pid: p.pid,
                name: nvml.sys_process_name(p.pid, 64).unwrap_or_default(),
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                sm_util_percent: None,
            })
            .collect())
    }

    fn xid_events(&mut self) -> Vec<XidEvent> {
        // XID delivery through NVML's event set runs on its own thread (issue #3).
        Vec::new()
    }
}

/// `NVML_DEVICE_MIG_ENABLE` as nvml-wrapper reports `MigMode::current`.
fn nvml_wrapper_sys_mig_enabled() -> u32 {
    nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE
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
            other => panic!("{other:?}"),
        }
    }
}
