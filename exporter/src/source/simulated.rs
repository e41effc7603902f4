//! The simulated source: reads the gpu-sim model directly, the same model the fake
//! libnvidia-ml serves through the NVML ABI. Faults in the scenario (lost GPUs, an
//! unavailable driver, slow calls, unsupported capabilities) surface here exactly as the
//! NVML backend reports them.

use super::{
    EntityInfo, GiPlacement, GpuSource, Inventory, MigInfo, ProcessSample, Raw, ReadError, XidEvent,
};
use crate::plan::catalog::{LabelField, Quantity};
use gpu_sim::{Capability, GpuReading, InforomObject, MigReading, SimNode};
use std::collections::BTreeMap;

/// Where an entity lives in the model.
#[derive(Debug, Clone, Copy)]
struct Slot {
    gpu: u32,
    mig: Option<usize>,
}

pub struct SimulatedSource {
    node: SimNode,
    origin: String,
    slots: Vec<Slot>,
    /// Scenario time up to which XIDs have been delivered.
    xids_delivered_to: f64,
}

impl SimulatedSource {
    /// `origin` names the scenario in logs.
    pub fn new(node: SimNode, origin: impl Into<String>) -> SimulatedSource {
        let mut slots: Vec<Slot> = (0..node.gpus.len() as u32)
            .map(|gpu| Slot { gpu, mig: None })
            .collect();
        for g in &node.gpus {
            for m in 0..g.mig.len() {
                slots.push(Slot {
                    gpu: g.index,
                    mig: Some(m),
                });
            }
        }
        SimulatedSource {
            node,
            origin: origin.into(),
            slots,
            xids_delivered_to: f64::NEG_INFINITY,
        }
    }

    /// Scenario time now, after any injected call latency, or why the driver is down.
    fn enter(&self) -> Result<f64, ReadError> {
        if self.node.init_fails() {
            return Err(ReadError::Unavailable(
                "simulated driver is not loaded (init failure)".into(),
            ));
        }
        let t = self.node.clock().now_s();
        if let Some(delay) = self.node.call_delay(t) {
            std::thread::sleep(delay);
        }
        if self.node.driver_available(t) {
            Ok(t)
        } else {
            Err(ReadError::Unavailable(
                "simulated driver is unavailable".into(),
            ))
        }
    }

    fn entity_of(&self, gpu: u32, gpu_instance: Option<u32>) -> usize {
        gpu_instance
            .and_then(|gi| {
                let g = &self.node.gpus[gpu as usize];
                let m = g.mig.iter().position(|m| m.gpu_instance_id == gi)?;
                self.slots
                    .iter()
                    .position(|s| s.gpu == gpu && s.mig == Some(m))
            })
            .unwrap_or(gpu as usize)
    }
}

fn gpu_quantity(r: &GpuReading, q: Quantity) -> Result<Raw, ReadError> {
    use Quantity::*;
    let u = |v: u64| Ok(Raw::U64(v));
    match q {
        GpuUtil => r
            .gpu_util_percent
            .map(|v| Raw::U64(v.into()))
            .ok_or(ReadError::NotSupported),
        MemCopyUtil => r
            .memory_util_percent
            .map(|v| Raw::U64(v.into()))
            .ok_or(ReadError::NotSupported),
        EncoderUtil => u(r.encoder_percent.into()),
        DecoderUtil => u(r.decoder_percent.into()),
        FbFree => u(r.memory.free),
        FbUsed => u(r.memory.used),
        FbReserved => u(r.memory.reserved),
        FbTotal => u(r.memory.total),
        PowerUsage => u(r.power_mw.into()),
        PowerLimit => u(r.power_limit_mw.into()),
        TotalEnergy => u(r.energy_mj),
        GpuTemp => u(r.gpu_temp_c.into()),
        MemoryTemp => u(r.memory_temp_c.into()),
        SmClock => u(r.sm_clock_mhz.into()),
        MemClock => u(r.mem_clock_mhz.into()),
        PcieReplayCounter => u(r.pcie_replay),
        PcieTxThroughput => u(r.pcie_tx_kb_s.into()),
        PcieRxThroughput => u(r.pcie_rx_kb_s.into()),
        ClockEventReasons => u(r.clock_event_reasons),
        PowerViolation => u(r.violation_ns[0]),
        ThermalViolation => u(r.violation_ns[1]),
        SyncBoostViolation => u(r.violation_ns[2]),
        BoardLimitViolation => u(r.violation_ns[3]),
        LowUtilViolation => u(r.violation_ns[4]),
        ReliabilityViolation => u(r.violation_ns[5]),
        EccSbeVolatile => u(r.ecc_corrected_volatile),
        EccDbeVolatile => u(r.ecc_uncorrected_volatile),
        EccSbeAggregate => u(r.ecc_corrected_aggregate),
        EccDbeAggregate => u(r.ecc_uncorrected_aggregate),
        RetiredSbe => u(r.retired_single_bit),
        RetiredDbe => u(r.retired_double_bit),
        RetiredPending => u(r.retired_pending.into()),
        RemappedCorrectable => u(r.remapped_correctable),
        RemappedUncorrectable => u(r.remapped_uncorrectable),
        RemapFailure => u(r.remap_failure.into()),
        NvlinkCrcFlitErrors => u(r.nvlink_errors[0]),
        NvlinkCrcDataErrors => u(r.nvlink_errors[1]),
        NvlinkReplayErrors => u(r.nvlink_errors[2]),
        NvlinkRecoveryErrors => u(r.nvlink_errors[3]),
        NvlinkDataKib => u(r.nvlink_rx_kib + r.nvlink_tx_kib),
        // Bare-metal GPUs are not vGPU guests: unlicensed, as DCGM reports them.
        VgpuLicensed => u(0),
        EccModeCurrent => u(r.ecc_mode_current.into()),
        EccModePending => u(r.ecc_mode_pending.into()),
        RemapPending => u(r.remap_pending.into()),
        RecoveryAction => u(r.recovery_action.into()),
        _ => gpm_quantity(r.gpm.as_ref(), q),
    }
}

/// A GPM quantity from a GPU's or MIG instance's GPM reading; anything else, or no GPM,
/// is not supported.
fn gpm_quantity(g: Option<&gpu_sim::GpmReading>, q: Quantity) -> Result<Raw, ReadError> {
    use Quantity::*;
    let g = g.ok_or(ReadError::NotSupported)?;
    Ok(Raw::F64(match q {
        GpmGraphicsUtil => g.graphics_util,
        GpmSmUtil => g.sm_util,
        GpmSmOccupancy => g.sm_occupancy,
        GpmTensorUtil => g.hmma_tensor_util,
        GpmDramUtil => g.dram_bw_util,
        GpmFp64Util => g.fp64_util,
        GpmFp32Util => g.fp32_util,
        GpmFp16Util => g.fp16_util,
        GpmPcieTx => g.pcie_tx_mib_s,
        GpmPcieRx => g.pcie_rx_mib_s,
        _ => return Err(ReadError::NotSupported),
    }))
}

fn mig_quantity(r: &MigReading, q: Quantity) -> Result<Raw, ReadError> {
    use Quantity::*;
    match q {
        FbFree => Ok(Raw::U64(r.memory.free)),
        FbUsed => Ok(Raw::U64(r.memory.used)),
        FbReserved => Ok(Raw::U64(r.memory.reserved)),
        FbTotal => Ok(Raw::U64(r.memory.total)),
        _ => gpm_quantity(r.gpm.as_ref(), q),
    }
}

/// Thermal limits, performance state, fans and fabric: facts of the board and the
/// scenario rather than of the load. `None` for every other quantity.
fn board_quantity(node: &SimNode, gpu: u32, t: f64, q: Quantity) -> Option<Result<Raw, ReadError>> {
    use Quantity::*;
    let g = &node.gpus[gpu as usize];
    let b = &g.model.board;
    let u = |v: u32| Some(Ok(Raw::U64(v.into())));
    // As the fake NVML: a fabric on Hopper or newer boards with NVLink.
    let fabric = || {
        (g.model.nvlink_links > 0 && g.model.architecture >= 9)
            .then(|| node.fabric(gpu, t))
            .ok_or(ReadError::NotSupported)
    };
    match q {
        SlowdownTemp => u(b.slowdown_temp_c),
        ShutdownTemp => u(b.shutdown_temp_c),
        GpuMaxOpTemp => u(b.gpu_max_operating_temp_c),
        MemMaxOpTemp => u(b.memory_max_operating_temp_c),
        // Data-centre boards in persistence mode stay in P0.
        Pstate => u(0),
        // `nvmlDeviceGetFanSpeed`: the first fan; passively cooled boards have none.
        FanSpeed => Some(
            node.fan_speed_percent(gpu, 0, t)
                .map(|v| Raw::U64(v.into()))
                .ok_or(ReadError::NotSupported),
        ),
        FabricManagerStatus => {
            Some(fabric().map(|f| Raw::U64(super::fabric_manager_status(f.state.nvml(), f.status))))
        }
        FabricManagerError => Some(fabric().and_then(|f| {
            super::fabric_manager_error(f.state.nvml(), f.status)
                .map(|e| Raw::F64(e as f64))
                .ok_or(ReadError::NoValueYet)
        })),
        FabricCliqueId => Some(fabric().map(|f| Raw::U64(f.clique_id.into()))),
        FabricHealthMask => Some(fabric().map(|f| Raw::U64(f.health_mask.into()))),
        FabricHealthSummary => Some(fabric().map(|f| Raw::U64(f.health_summary.into()))),
        _ => None,
    }
}

/// One link quantity of one link at `t`.
fn link_quantity(
    node: &SimNode,
    gpu: u32,
    link: u32,
    t: f64,
    q: Quantity,
) -> Result<Raw, ReadError> {
    use Quantity::*;
    let active = node.nvlink_active(gpu, link, t);
    let errors = node.nvlink_link_errors(gpu, link, t);
    // Traffic runs evenly over the links that are up, as the fake NVML splits it.
    let share = |total: u64| {
        if active {
            total / u64::from(node.nvlinks_active(gpu, t).max(1))
        } else {
            0
        }
    };
    let r = || node.gpu_reading(gpu, t);
    Ok(Raw::U64(match q {
        LinkState => active.into(),
        LinkCrcFlitErrors => errors[0],
        LinkCrcDataErrors => errors[1],
        LinkReplayErrors => errors[2],
        LinkRecoveryErrors => errors[3],
        LinkTxKib => share(r().nvlink_tx_kib),
        LinkRxKib => share(r().nvlink_rx_kib),
        LinkDataKib => {
            let r = r();
            share(r.nvlink_tx_kib) + share(r.nvlink_rx_kib)
        }
        _ => return Err(ReadError::NotSupported),
    }))
}

/// The model capability a quantity needs.
fn capability(q: Quantity) -> Option<Capability> {
    use Quantity::*;
    Some(match q {
        GpuUtil | MemCopyUtil => Capability::Utilization,
        EncoderUtil => Capability::EncoderUtilization,
        DecoderUtil => Capability::DecoderUtilization,
        FbFree | FbUsed | FbReserved | FbTotal => return None,
        PowerUsage | PowerLimit => Capability::Power,
        TotalEnergy => Capability::Energy,
        GpuTemp => Capability::Temperature,
        MemoryTemp => Capability::MemoryTemperature,
        SmClock | MemClock => Capability::Clocks,
        PcieReplayCounter => Capability::PcieReplay,
        PcieTxThroughput | PcieRxThroughput => Capability::PcieThroughput,
        ClockEventReasons => Capability::ThrottleReasons,
        PowerViolation | ThermalViolation | SyncBoostViolation | BoardLimitViolation
        | LowUtilViolation | ReliabilityViolation => Capability::Violations,
        EccSbeVolatile | EccDbeVolatile | EccSbeAggregate | EccDbeAggregate => Capability::Ecc,
        RetiredSbe | RetiredDbe | RetiredPending => Capability::RetiredPages,
        RemappedCorrectable | RemappedUncorrectable | RemapFailure | RemapPending => {
            Capability::RemappedRows
        }
        EccModeCurrent | EccModePending => Capability::Ecc,
        RecoveryAction => return None,
        NvlinkCrcFlitErrors | NvlinkCrcDataErrors | NvlinkReplayErrors | NvlinkRecoveryErrors
        | NvlinkDataKib => Capability::Nvlink,
        VgpuLicensed => Capability::VgpuLicense,
        SlowdownTemp | ShutdownTemp | GpuMaxOpTemp | MemMaxOpTemp => Capability::Temperature,
        Pstate => Capability::Clocks,
        FanSpeed => return None,
        FabricManagerStatus | FabricManagerError | FabricCliqueId | FabricHealthMask
        | FabricHealthSummary | LinkState | LinkCrcFlitErrors | LinkCrcDataErrors
        | LinkReplayErrors | LinkRecoveryErrors | LinkTxKib | LinkRxKib | LinkDataKib => {
            Capability::Nvlink
        }
        _ => Capability::Gpm,
    })
}

impl GpuSource for SimulatedSource {
    fn describe(&self) -> String {
        format!("simulated ({})", self.origin)
    }

    fn probe(&mut self) -> Result<(), ReadError> {
        self.enter().map(|_| ())
    }

    fn discover(&mut self, labels: &[LabelField]) -> Result<Inventory, ReadError> {
        self.enter()?;
        let mut entities = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            let g = &self.node.gpus[s.gpu as usize];
            let mut values = BTreeMap::new();
            for l in labels {
                let v = match l {
                    LabelField::DriverVersion => Some(self.node.driver_version.clone()),
                    LabelField::NvmlVersion => Some(self.node.nvml_version.clone()),
                    LabelField::Brand => Some(super::brand_name(g.model.brand).to_string()),
                    LabelField::Serial => Some(g.serial.clone()),
                    LabelField::VbiosVersion => Some(g.vbios_version().to_string()),
                    LabelField::OemInforom => {
                        g.inforom_version(InforomObject::Oem).map(str::to_string)
                    }
                    LabelField::EccInforom => {
                        g.inforom_version(InforomObject::Ecc).map(str::to_string)
                    }
                    LabelField::PowerInforom => {
                        g.inforom_version(InforomObject::Power).map(str::to_string)
                    }
                    LabelField::InforomImage => Some(g.inforom_image_version().to_string()),
                };
                if let Some(v) = v {
                    values.insert(*l, v);
                }
            }
            entities.push(EntityInfo {
                gpu_index: g.index,
                uuid: g.uuid.clone(),
                minor_number: Some(g.minor_number),
                pci_bus_id: g.pci_bus_id.clone(),
                model_name: g.model.name.to_string(),
                mig: s.mig.map(|m| {
                    let mig = &g.mig[m];
                    MigInfo {
                        parent: s.gpu as usize,
                        gpu_instance_id: mig.gpu_instance_id,
                        compute_instance_id: mig.compute_instance_id,
                        slot: m as u32,
                        profile: mig.profile.name.to_string(),
                        mig_uuid: mig.uuid.clone(),
                        placement: Some(GiPlacement {
                            profile_id: mig.profile.id,
                            start: mig.placement_start,
                            size: mig.profile.memory_slices,
                        }),
                    }
                }),
                labels: values,
                lost: false,
            });
        }
        Ok(Inventory {
            driver_version: self.node.driver_version.clone(),
            nvml_version: self.node.nvml_version.clone(),
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
        let t = match self.enter() {
            Ok(t) => t,
            Err(e) => {
                out.extend(quantities.iter().map(|_| Err(e.clone())));
                return;
            }
        };
        let Some(slot) = self.slots.get(entity).copied() else {
            out.extend(
                quantities
                    .iter()
                    .map(|_| Err(ReadError::Failed("no such entity".into()))),
            );
            return;
        };
        if self.node.gpu_lost(slot.gpu, t) {
            out.extend(quantities.iter().map(|_| Err(ReadError::GpuLost)));
            return;
        }
        let g = &self.node.gpus[slot.gpu as usize];
        let supported = |q: Quantity| capability(q).is_none_or(|c| g.supports(c));
        match slot.mig {
            None => {
                let r = self.node.gpu_reading(slot.gpu, t);
                out.extend(quantities.iter().map(|&q| {
                    if !supported(q) {
                        Err(ReadError::NotSupported)
                    } else if let Some(v) = board_quantity(&self.node, slot.gpu, t, q) {
                        v
                    } else {
                        gpu_quantity(&r, q)
                    }
                }));
            }
            Some(m) => {
                let r = self.node.mig_reading(slot.gpu, m, t);
                out.extend(quantities.iter().map(|&q| {
                    if supported(q) {
                        mig_quantity(&r, q)
                    } else {
                        Err(ReadError::NotSupported)
                    }
                }));
            }
        }
    }

    fn processes(&mut self, entity: usize) -> Result<Vec<ProcessSample>, ReadError> {
        let t = self.enter()?;
        let slot = self
            .slots
            .get(entity)
            .copied()
            .ok_or_else(|| ReadError::Failed("no such entity".into()))?;
        if self.node.gpu_lost(slot.gpu, t) {
            return Err(ReadError::GpuLost);
        }
        let g = &self.node.gpus[slot.gpu as usize];
        if !g.supports(Capability::Processes) {
            return Err(ReadError::NotSupported);
        }
        let procs = match slot.mig {
            // Processes of MIG instances are reported on the instances.
            None if !g.mig.is_empty() => Vec::new(),
            None => self.node.gpu_processes(slot.gpu, t),
            Some(m) => self.node.mig_processes(slot.gpu, m, t),
        };
        Ok(procs
            .into_iter()
            .map(|p| ProcessSample {
                pid: p.pid,
                name: p.name,
                used_memory_bytes: Some(p.used_memory_bytes),
                // As NVML: no per-process utilisation on MIG instances.
                sm_util_percent: slot.mig.is_none().then_some(p.sm_util_percent),
            })
            .collect())
    }

    fn nvlinks(&mut self, entity: usize) -> u32 {
        match self.slots.get(entity) {
            Some(Slot { gpu, mig: None }) => {
                let g = &self.node.gpus[*gpu as usize];
                if g.supports(Capability::Nvlink) {
                    g.model.nvlink_links
                } else {
                    0
                }
            }
            _ => 0,
        }
    }

    fn read_links(
        &mut self,
        entity: usize,
        links: u32,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        out.clear();
        let total = links as usize * quantities.len();
        let t = match self.enter() {
            Ok(t) => t,
            Err(e) => {
                out.extend((0..total).map(|_| Err(e.clone())));
                return;
            }
        };
        let gpu = match self.slots.get(entity) {
            Some(Slot { gpu, mig: None }) => *gpu,
            _ => {
                out.extend((0..total).map(|_| Err(ReadError::NotSupported)));
                return;
            }
        };
        if self.node.gpu_lost(gpu, t) {
            out.extend((0..total).map(|_| Err(ReadError::GpuLost)));
            return;
        }
        for link in 0..links {
            out.extend(
                quantities
                    .iter()
                    .map(|&q| link_quantity(&self.node, gpu, link, t, q)),
            );
        }
    }

    fn xid_events(&mut self) -> Vec<XidEvent> {
        let Ok(t) = self.enter() else {
            return Vec::new();
        };
        let events = self.node.xids_between(self.xids_delivered_to, t);
        self.xids_delivered_to = t;
        let clock = self.node.clock();
        events
            .into_iter()
            .filter(|e| !self.node.gpu_lost(e.gpu, e.at_s))
            .map(|e| XidEvent {
                entity: self.entity_of(e.gpu, e.gpu_instance),
                code: e.code,
                at: clock.wall_time(e.at_s),
            })
            .collect()
    }
}
