//! A scenario resolved into concrete GPUs, MIG instances and processes, and the
//! readings they give at any scenario instant. Everything here is a pure function of the
//! scenario and the time, so two readers (the exporter's simulated source and the fake
//! libnvidia-ml) always agree.

use crate::dial::Dial;
use crate::load::Load;
use crate::models::{MigProfile, ModelProfile};
use crate::scenario::{Capability, Fault, GpuSpec, ProcessSpec, Scenario, ViolationPolicy};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MIB: u64 = 1 << 20;
/// Power draw at 100 % utilisation, as a share of the power limit.
const FULL_LOAD_POWER_SHARE: f64 = 0.85;
/// Utilisation above which the software power cap engages.
const POWER_CAP_UTIL: f64 = 97.0;

/// NVML clock-event reason bits.
pub mod reasons {
    pub const GPU_IDLE: u64 = 0x1;
    pub const SW_POWER_CAP: u64 = 0x4;
}

/// A resolved node.
#[derive(Debug, Clone)]
pub struct SimNode {
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    pub gpus: Vec<SimGpu>,
    pub faults: Vec<Fault>,
    /// The NVLink fabric the GPUs are registered in, if the scenario names one.
    pub fabric: Option<crate::fabric::FabricSpec>,
    /// The GPUs are passed through to a VM (see [`Scenario::passthrough_vm`]).
    pub passthrough_vm: bool,
    clock: SimClock,
    /// Utilisation set from outside while the node runs, if a dial file is attached.
    dial: Option<Arc<Dial>>,
}

/// One physical GPU.
#[derive(Debug, Clone)]
pub struct SimGpu {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub serial: String,
    pub minor_number: u32,
    pub model: &'static ModelProfile,
    pub load: Load,
    pub memory_used_mib: u64,
    pub processes: Vec<SimProcess>,
    /// MIG instances; empty when MIG mode is off.
    pub mig: Vec<SimMig>,
    pub unsupported: BTreeSet<Capability>,
    pub gpm: bool,
    pub encoder_percent: u32,
    pub decoder_percent: u32,
    /// Energy counter at scenario second 0 (the driver was loaded earlier).
    pub energy_base_mj: u64,
}

/// One MIG GPU instance (with one compute instance).
#[derive(Debug, Clone)]
pub struct SimMig {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub profile: MigProfile,
    /// First memory slice of the GPU instance's placement (`nvmlGpuInstancePlacement_t`;
    /// its size is `profile.memory_slices`).
    pub placement_start: u32,
    pub uuid: String,
    pub load: Load,
    pub memory_used_mib: u64,
    pub processes: Vec<SimProcess>,
}

/// A process on a GPU or MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct SimProcess {
    pub pid: u32,
    pub name: String,
    pub used_memory_bytes: u64,
    pub weight: f64,
}

/// What a whole GPU reports at one instant, in NVML's own units.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// `None` on MIG-enabled GPUs, where NVML does not report utilisation.
    pub gpu_util_percent: Option<u32>,
    pub memory_util_percent: Option<u32>,
    pub encoder_percent: u32,
    pub decoder_percent: u32,
    pub memory: MemoryReading,
    pub power_mw: u32,
    /// Enforced power limit, mW.
    pub power_limit_mw: u32,
    pub energy_mj: u64,
    pub gpu_temp_c: u32,
    pub memory_temp_c: u32,
    pub sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub pcie_tx_kb_s: u32,
    pub pcie_rx_kb_s: u32,
    pub pcie_replay: u64,
    pub clock_event_reasons: u64,
    /// Violation time per [`ViolationPolicy`], ns.
    pub violation_ns: [u64; 6],
    pub ecc_corrected_volatile: u64,
    pub ecc_uncorrected_volatile: u64,
    pub ecc_corrected_aggregate: u64,
    pub ecc_uncorrected_aggregate: u64,
    pub retired_single_bit: u64,
    pub retired_double_bit: u64,
    pub retired_pending: bool,
    pub remapped_correctable: u64,
    pub remapped_uncorrectable: u64,
    pub remap_pending: bool,
    pub remap_failure: bool,
    /// ECC mode now and after the next reboot (`nvmlDeviceGetEccMode`).
    pub ecc_mode_current: bool,
    pub ecc_mode_pending: bool,
    /// `nvmlDeviceGpuRecoveryAction_t`: 0 none, 1 GPU reset, 2 node reboot...
    pub recovery_action: u32,
    /// Cumulative NVLink data throughput, all links, KiB.
    pub nvlink_rx_kib: u64,
    pub nvlink_tx_kib: u64,
    /// NVLink error counters summed over links: CRC flit, CRC data, replay, recovery.
    pub nvlink_errors: [u64; 4],
    /// GPM ratios for the whole GPU; `None` without GPM.
    pub gpm: Option<GpmReading>,
}

/// Framebuffer memory, bytes (NVML `nvmlMemory_v2_t` semantics: used excludes reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    pub total: u64,
    pub reserved: u64,
    pub used: u64,
    pub free: u64,
}

/// GPM metrics, as NVML reports them: utilisations in percent, PCIe in MiB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpmReading {
    pub graphics_util: f64,
    pub sm_util: f64,
    pub sm_occupancy: f64,
    pub hmma_tensor_util: f64,
    pub dram_bw_util: f64,
    pub fp64_util: f64,
    pub fp32_util: f64,
    pub fp16_util: f64,
    pub pcie_tx_mib_s: f64,
    pub pcie_rx_mib_s: f64,
}

/// What a MIG instance reports at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct MigReading {
    pub memory: MemoryReading,
    pub gpm: Option<GpmReading>,
}

/// A process's share at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessReading {
    pub pid: u32,
    pub name: String,
    pub used_memory_bytes: u64,
    /// GPU-instance ID, or `None` on a whole GPU.
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// Share of the device's SM utilisation, percent; shares sum to the device value.
    pub sm_util_percent: u32,
}

/// An XID error delivered by the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct XidEvent {
    pub at_s: f64,
    pub gpu: u32,
    pub gpu_instance: Option<u32>,
    pub code: u64,
}

/// Scenario time.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    frozen_at_s: Option<f64>,
    epoch: SystemTime,
}

impl SimClock {
    /// Scenario seconds now.
    pub fn now_s(&self) -> f64 {
        match self.frozen_at_s {
            Some(t) => t,
            None => SystemTime::now()
                .duration_since(self.epoch)
                .unwrap_or_default()
                .as_secs_f64(),
        }
    }

    /// Wall-clock time of a scenario instant.
    pub fn wall_time(&self, t_s: f64) -> SystemTime {
        self.epoch + Duration::from_secs_f64(t_s.max(0.0))
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen_at_s.is_some()
    }
}

/// Deterministic 64-bit mixer (SplitMix64) for identifiers.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn uuid_body(a: u64, b: u64) -> String {
    let (h, l) = (mix(a), mix(b));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        l >> 48,
        l & 0xffff_ffff_ffff
    )
}

/// PCI bus numbers of the eight GPUs of an HGX H100 baseboard.
const HGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

const PROCESS_NAMES: [&str; 4] = ["python3", "tritonserver", "vllm", "torchrun"];

impl SimNode {
    /// Resolve a scenario. `started` is when the process started the model; it is
    /// scenario second 0 unless the scenario fixes its epoch.
    pub fn new(s: &Scenario, started: SystemTime) -> SimNode {
        let mut gpus = Vec::new();
        let mut next_pid = 4100u32;
        let mut pid = |spec: Option<u32>| {
            spec.unwrap_or_else(|| {
                next_pid += 1;
                next_pid
            })
        };
        for g in &s.gpus {
            for k in 0..g.count {
                let index = gpus.len() as u32;
                gpus.push(resolve_gpu(s.seed, index, k, g, &mut pid));
            }
        }
        for (gpu, &minor) in gpus.iter_mut().zip(&s.minor_numbers) {
            gpu.minor_number = minor;
        }
        let epoch = s
            .clock
            .epoch_unix_s
            .map(|e| UNIX_EPOCH + Duration::from_secs_f64(e))
            .unwrap_or(started);
        SimNode {
            driver_version: s.driver_version.clone(),
            nvml_version: s.nvml_version.clone(),
            cuda_driver_version: s.cuda_driver_version,
            gpus,
            faults: s.faults.clone(),
            fabric: s.fabric.clone(),
            passthrough_vm: s.passthrough_vm,
            clock: SimClock {
                frozen_at_s: s.clock.frozen_at_s,
                epoch,
            },
            dial: None,
        }
    }

    pub fn clock(&self) -> SimClock {
        self.clock
    }

    /// Freeze scenario time (tests), overriding the scenario's clock.
    pub fn freeze_at(&mut self, t_s: f64) {
        self.clock.frozen_at_s = Some(t_s);
    }

    /// Let a dial file ([`crate::dial`]) set whole GPUs' utilisation from now on.
    pub fn attach_dial(&mut self, dial: Dial) {
        self.dial = Some(Arc::new(dial));
    }

    /// `nvmlInit` fails for this scenario.
    pub fn init_fails(&self) -> bool {
        self.faults.iter().any(|f| matches!(f, Fault::InitFailure))
    }

    /// The driver answers at `t`.
    pub fn driver_available(&self, t: f64) -> bool {
        !self.faults.iter().any(|f| match *f {
            Fault::DriverUnavailable { from_s, until_s } => in_window(t, from_s, until_s),
            _ => false,
        })
    }

    /// Extra latency every call has at `t`.
    pub fn call_delay(&self, t: f64) -> Option<Duration> {
        self.faults.iter().find_map(|f| match *f {
            Fault::Slow {
                from_s,
                until_s,
                delay_ms,
            } if in_window(t, from_s, until_s) => Some(Duration::from_millis(delay_ms)),
            _ => None,
        })
    }

    /// The GPU has fallen off the bus by `t`.
    pub fn gpu_lost(&self, gpu: u32, t: f64) -> bool {
        self.faults
            .iter()
            .any(|f| matches!(*f, Fault::GpuLost { at_s, gpu: g } if g == gpu && at_s <= t))
    }

    /// XIDs that happened in `(after_s, up_to_s]`, in time order.
    pub fn xids_between(&self, after_s: f64, up_to_s: f64) -> Vec<XidEvent> {
        let mut v: Vec<XidEvent> = self
            .faults
            .iter()
            .filter_map(|f| match *f {
                Fault::Xid {
                    at_s,
                    gpu,
                    code,
                    gpu_instance,
                } if at_s > after_s && at_s <= up_to_s => Some(XidEvent {
                    at_s,
                    gpu,
                    gpu_instance,
                    code,
                }),
                // The driver reports XID 154 ("GPU recovery action changed").
                Fault::RecoveryAction { at_s, gpu, .. } if at_s > after_s && at_s <= up_to_s => {
                    Some(XidEvent {
                        at_s,
                        gpu,
                        gpu_instance: None,
                        code: 154,
                    })
                }
                _ => None,
            })
            .collect();
        v.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        v
    }

    /// Utilisation driving the whole GPU at `t`: its own load, or the slice-weighted
    /// load of its MIG instances.
    fn gpu_load(&self, g: &SimGpu, t: f64) -> f64 {
        if g.mig.is_empty() {
            match self.dial_setting(g, t) {
                Some(setting) => setting.percent,
                None => g.load.at(t),
            }
        } else {
            g.mig
                .iter()
                .map(|m| m.load.at(t) * f64::from(m.profile.slices))
                .sum::<f64>()
                / 7.0
        }
    }

    fn gpu_load_integral(&self, g: &SimGpu, t: f64) -> f64 {
        if g.mig.is_empty() {
            match self.dial_setting(g, t) {
                Some(setting) => setting.integral(t),
                None => g.load.integral(t),
            }
        } else {
            g.mig
                .iter()
                .map(|m| m.load.integral(t) * f64::from(m.profile.slices))
                .sum::<f64>()
                / 7.0
        }
    }

    fn dial_setting(&self, g: &SimGpu, t: f64) -> Option<crate::dial::Setting> {
        self.dial
            .as_ref()?
            .setting(g.index, t, |t| g.load.integral(t))
    }

    /// Everything a whole GPU reports at `t`.
    pub fn gpu_reading(&self, gpu: u32, t: f64) -> GpuReading {
        let g = &self.gpus[gpu as usize];
        let m = g.model;
        let u = self.gpu_load(g, t);
        let u_int = self.gpu_load_integral(g, t);
        let span_mw =
            f64::from(m.power_limit_mw) * FULL_LOAD_POWER_SHARE - f64::from(m.idle_power_mw);
        let power_mw = f64::from(m.idle_power_mw) + span_mw * u / 100.0;
        // mW·s = mJ.
        let energy =
            g.energy_base_mj as f64 + f64::from(m.idle_power_mw) * t + span_mw * u_int / 100.0;
        let power_w = power_mw / 1000.0;
        let gpu_temp = 27.0 + power_w * 0.075;
        let mem_util = u * 0.45;
        let busy = u >= 1.0;
        let capped = u > POWER_CAP_UTIL;

        let mut reasons = 0;
        if !busy {
            reasons |= reasons::GPU_IDLE;
        }
        if capped {
            reasons |= reasons::SW_POWER_CAP;
        }
        let mut r = GpuReading {
            gpu_util_percent: g.mig.is_empty().then(|| u.round() as u32),
            memory_util_percent: g.mig.is_empty().then(|| mem_util.round() as u32),
            encoder_percent: g.encoder_percent,
            decoder_percent: g.decoder_percent,
            memory: self.gpu_memory(g),
            power_mw: power_mw.round() as u32,
            power_limit_mw: m.power_limit_mw,
            energy_mj: energy.round() as u64,
            gpu_temp_c: gpu_temp.round() as u32,
            memory_temp_c: (gpu_temp + 6.0).round() as u32,
            sm_clock_mhz: match (busy, capped) {
                (false, _) => m.idle_sm_clock_mhz,
                (true, false) => m.max_sm_clock_mhz,
                (true, true) => m.max_sm_clock_mhz * 93 / 100,
            },
            mem_clock_mhz: m.mem_clock_mhz,
            pcie_tx_kb_s: (200.0 + u / 100.0 * 12_000_000.0).round() as u32,
            pcie_rx_kb_s: (150.0 + u / 100.0 * 7_000_000.0).round() as u32,
            pcie_replay: 0,
            clock_event_reasons: reasons,
            violation_ns: [0; 6],
            ecc_corrected_volatile: 0,
            ecc_uncorrected_volatile: 0,
            ecc_corrected_aggregate: 0,
            ecc_uncorrected_aggregate: 0,
            retired_single_bit: 0,
            retired_double_bit: 0,
            retired_pending: false,
            remapped_correctable: 0,
            remapped_uncorrectable: 0,
            remap_pending: false,
            remap_failure: false,
            ecc_mode_current: true,
            ecc_mode_pending: true,
            recovery_action: 0,
            nvlink_rx_kib: (m.nvlink_peak_kib_s as f64 * 0.30 * u_int / 100.0).round() as u64,
            nvlink_tx_kib: (m.nvlink_peak_kib_s as f64 * 0.28 * u_int / 100.0).round() as u64,
            nvlink_errors: [0; 4],
            gpm: g.gpm.then(|| gpm_for(u, mem_util, 1.0)),
        };
        self.apply_faults(gpu, t, &mut r);
        r
    }

    fn apply_faults(&self, gpu: u32, t: f64, r: &mut GpuReading) {
        for f in &self.faults {
            match *f {
                Fault::Ecc {
                    at_s,
                    gpu: g,
                    corrected,
                    uncorrected,
                } if g == gpu && at_s <= t => {
                    r.ecc_corrected_volatile += corrected;
                    r.ecc_uncorrected_volatile += uncorrected;
                    r.ecc_corrected_aggregate += corrected;
                    r.ecc_uncorrected_aggregate += uncorrected;
                }
                Fault::RetiredPages {
                    at_s,
                    gpu: g,
                    single_bit,
                    double_bit,
                    pending,
                } if g == gpu && at_s <= t => {
                    r.retired_single_bit += single_bit;
                    r.retired_double_bit += double_bit;
                    r.retired_pending |= pending;
                }
                Fault::RowRemap {
                    at_s,
                    gpu: g,
                    correctable,
                    uncorrectable,
                    failure,
                    pending,
                } if g == gpu && at_s <= t => {
                    r.remapped_correctable += correctable;
                    r.remapped_uncorrectable += uncorrectable;
                    r.remap_failure |= failure;
                    r.remap_pending |= pending;
                }
                // The latest action in force wins, as the driver keeps only one.
                Fault::RecoveryAction {
                    at_s,
                    gpu: g,
                    action,
                } if g == gpu && at_s <= t => r.recovery_action = action,
                Fault::EccModePending {
                    at_s,
                    gpu: g,
                    enabled,
                } if g == gpu && at_s <= t => r.ecc_mode_pending = enabled,
                Fault::PcieReplay {
                    at_s,
                    gpu: g,
                    count,
                } if g == gpu && at_s <= t => {
                    r.pcie_replay += count;
                }
                Fault::Throttle {
                    from_s,
                    until_s,
                    gpu: g,
                    reasons,
                } if g == gpu && in_window(t, from_s, until_s) => r.clock_event_reasons |= reasons,
                Fault::Violation {
                    at_s,
                    gpu: g,
                    policy,
                    ns,
                } if g == gpu && at_s <= t => r.violation_ns[policy as usize] += ns,
                Fault::NvlinkErrors { at_s, gpu: g, .. } if g == gpu && at_s <= t => {
                    let per_link = crate::fabric::link_error_counts(f);
                    for (total, n) in r.nvlink_errors.iter_mut().zip(per_link) {
                        *total += n;
                    }
                }
                _ => {}
            }
        }
    }

    fn gpu_memory(&self, g: &SimGpu) -> MemoryReading {
        let m = g.model;
        let total = m.memory_total_mib * MIB;
        let reserved = m.memory_reserved_mib * MIB;
        let used = if g.mig.is_empty() {
            g.memory_used_mib * MIB + g.processes.iter().map(|p| p.used_memory_bytes).sum::<u64>()
        } else {
            g.mig.iter().map(mig_used_bytes).sum()
        };
        let used = used.min(total - reserved);
        MemoryReading {
            total,
            reserved,
            used,
            free: total - reserved - used,
        }
    }

    /// What a MIG instance reports at `t`.
    pub fn mig_reading(&self, gpu: u32, mig: usize, t: f64) -> MigReading {
        let g = &self.gpus[gpu as usize];
        let m = &g.mig[mig];
        let total = m.profile.memory_mib * MIB;
        let used = mig_used_bytes(m).min(total);
        let u = m.load.at(t);
        MigReading {
            memory: MemoryReading {
                total,
                reserved: 0,
                used,
                free: total - used,
            },
            gpm: g
                .gpm
                .then(|| gpm_for(u, u * 0.45, f64::from(m.profile.slices) / 7.0)),
        }
    }

    /// Processes of a whole GPU (not MIG) at `t`, with their SM shares.
    pub fn gpu_processes(&self, gpu: u32, t: f64) -> Vec<ProcessReading> {
        let g = &self.gpus[gpu as usize];
        if g.mig.is_empty() {
            shares(&g.processes, self.gpu_load(g, t), None)
        } else {
            g.mig
                .iter()
                .flat_map(|m| shares(&m.processes, m.load.at(t), Some(m)))
                .collect()
        }
    }

    /// Processes of one MIG instance at `t`.
    pub fn mig_processes(&self, gpu: u32, mig: usize, t: f64) -> Vec<ProcessReading> {
        let m = &self.gpus[gpu as usize].mig[mig];
        shares(&m.processes, m.load.at(t), Some(m))
    }

    /// Name of a process by PID, on any GPU.
    pub fn process_name(&self, pid: u32) -> Option<&str> {
        self.gpus
            .iter()
            .flat_map(|g| {
                g.processes
                    .iter()
                    .chain(g.mig.iter().flat_map(|m| m.processes.iter()))
            })
            .find(|p| p.pid == pid)
            .map(|p| p.name.as_str())
    }
}

fn mig_used_bytes(m: &SimMig) -> u64 {
    m.memory_used_mib * MIB + m.processes.iter().map(|p| p.used_memory_bytes).sum::<u64>()
}

pub(crate) fn in_window(t: f64, from: f64, until: Option<f64>) -> bool {
    t >= from && until.is_none_or(|u| t < u)
}

/// GPM ratios implied by an engine utilisation `u` (percent). `share` scales the PCIe
/// traffic of a MIG instance by its share of the GPU.
fn gpm_for(u: f64, mem_util: f64, share: f64) -> GpmReading {
    let kb_to_mib = 1000.0 / MIB as f64;
    GpmReading {
        graphics_util: u,
        sm_util: u * 0.92,
        sm_occupancy: u * 0.45,
        hmma_tensor_util: u * 0.60,
        dram_bw_util: mem_util,
        fp64_util: u * 0.05,
        fp32_util: u * 0.30,
        fp16_util: u * 0.40,
        pcie_tx_mib_s: (200.0 + u / 100.0 * 12_000_000.0) * kb_to_mib * share,
        pcie_rx_mib_s: (150.0 + u / 100.0 * 7_000_000.0) * kb_to_mib * share,
    }
}

/// Split an engine utilisation over processes by weight, rounding so that the integer
/// shares sum exactly to the rounded total (largest remainder).
fn shares(procs: &[SimProcess], util: f64, mig: Option<&SimMig>) -> Vec<ProcessReading> {
    let total = util.round() as u32;
    let weight: f64 = procs.iter().map(|p| p.weight).sum();
    let exact: Vec<f64> = procs
        .iter()
        .map(|p| {
            if weight > 0.0 {
                f64::from(total) * p.weight / weight
            } else {
                0.0
            }
        })
        .collect();
    let mut out: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    let mut left = total.saturating_sub(out.iter().sum());
    if weight > 0.0 {
        let mut order: Vec<usize> = (0..procs.len()).collect();
        order.sort_by(|&a, &b| {
            (exact[b] - exact[b].floor())
                .total_cmp(&(exact[a] - exact[a].floor()))
                .then(a.cmp(&b))
        });
        for i in order {
            if left == 0 {
                break;
            }
            out[i] += 1;
            left -= 1;
        }
    }
    procs
        .iter()
        .zip(out)
        .map(|(p, sm)| ProcessReading {
            pid: p.pid,
            name: p.name.clone(),
            used_memory_bytes: p.used_memory_bytes,
            gpu_instance_id: mig.map(|m| m.gpu_instance_id),
            compute_instance_id: mig.map(|m| m.compute_instance_id),
            sm_util_percent: sm,
        })
        .collect()
}

fn resolve_processes(
    explicit: &[ProcessSpec],
    generated: u32,
    generated_mib: u64,
    pid: &mut impl FnMut(Option<u32>) -> u32,
) -> Vec<SimProcess> {
    let mut v: Vec<SimProcess> = explicit
        .iter()
        .map(|p| SimProcess {
            pid: pid(p.pid),
            name: p.name.clone(),
            used_memory_bytes: p.used_memory_mib * MIB,
            weight: p.weight,
        })
        .collect();
    for k in 0..generated {
        v.push(SimProcess {
            pid: pid(None),
            name: PROCESS_NAMES[k as usize % PROCESS_NAMES.len()].into(),
            used_memory_bytes: generated_mib * MIB,
            weight: 1.0,
        });
    }
    v
}

fn resolve_gpu(
    seed: u64,
    index: u32,
    in_group: u32,
    g: &GpuSpec,
    pid: &mut impl FnMut(Option<u32>) -> u32,
) -> SimGpu {
    // A validated scenario names a known model; `Scenario::validate` guarantees this.
    let model = crate::models::lookup(&g.model).unwrap_or(&crate::models::MODELS[0]);
    let key = seed.wrapping_mul(1_000_003).wrapping_add(u64::from(index));
    let bus = HGX_BUSES
        .get(index as usize)
        .copied()
        .unwrap_or(0xe0 + index);
    let mut mig: Vec<SimMig> = Vec::new();
    let mut gi = 1u32;
    for m in &g.mig {
        let profile = model
            .mig_profiles
            .iter()
            .find(|p| p.name == m.profile)
            .cloned()
            // Validated scenario: the profile exists for this model.
            .unwrap_or_else(|| model.mig_profiles[0].clone());
        for _ in 0..m.count {
            mig.push(SimMig {
                gpu_instance_id: gi,
                compute_instance_id: 0,
                uuid: format!(
                    "MIG-{}",
                    uuid_body(key ^ 0x004d_4947, u64::from(gi) << 32 | key)
                ),
                load: m.load.delayed(f64::from(gi) * 3.0),
                memory_used_mib: m.memory_used_mib,
                processes: resolve_processes(
                    &m.processes,
                    m.process_count,
                    m.process_memory_mib,
                    pid,
                ),
                profile: profile.clone(),
                placement_start: 0,
            });
            gi += 1;
        }
    }
    let profiles: Vec<&MigProfile> = mig.iter().map(|m| &m.profile).collect();
    // A validated scenario's instances fit (`Scenario::validate`); one built by hand
    // that does not keeps every instance at slice 0.
    if let Some(starts) = mig_placements(&profiles) {
        for (m, start) in mig.iter_mut().zip(starts) {
            m.placement_start = start;
        }
    }
    SimGpu {
        index,
        uuid: format!("GPU-{}", uuid_body(key, !key)),
        pci_bus_id: format!("00000000:{bus:02X}:00.0"),
        serial: format!("{:013}", 1_654_922_000_000 + mix(key) % 1_000_000),
        minor_number: index,
        model,
        load: g.load.delayed(g.stagger_s * f64::from(in_group)),
        memory_used_mib: g.memory_used_mib,
        processes: if g.mig.is_empty() {
            resolve_processes(&g.processes, g.process_count, g.process_memory_mib, pid)
        } else {
            Vec::new()
        },
        mig,
        unsupported: g.unsupported.iter().copied().collect(),
        gpm: g.gpm.unwrap_or(model.gpm),
        encoder_percent: g.encoder_percent,
        decoder_percent: g.decoder_percent,
        energy_base_mj: u64::from(model.idle_power_mw) * 86_400,
    }
}

/// Where MIG instances of these profiles (in creation order) sit among a GPU's eight
/// memory slices, or `None` if they cannot all fit. A start is allowed where the
/// hardware allows it: a multiple of the instance's size, within the eight memory
/// slices and with its compute slices within the seven (so `1g` starts at 0..=6, `2g`
/// at 0, 2 or 4, `3g` at 0 or 4, `4g` and `7g` at 0, as `nvidia-smi mig -lgipp` lists
/// them). Larger instances are placed first, each at the lowest start that lets the
/// rest fit.
pub fn mig_placements(profiles: &[&MigProfile]) -> Option<Vec<u32>> {
    fn place(order: &[usize], profiles: &[&MigProfile], used: u8, starts: &mut [u32]) -> bool {
        let Some((&i, rest)) = order.split_first() else {
            return true;
        };
        let p = profiles[i];
        let size = p.memory_slices.clamp(1, 8);
        for start in (0..8u32).step_by(size as usize) {
            let mask = (((1u16 << size) - 1) << start) as u8;
            let fits = start + size <= 8 && start + p.slices <= 7 && used & mask == 0;
            if fits && place(rest, profiles, used | mask, starts) {
                starts[i] = start;
                return true;
            }
        }
        false
    }
    let mut order: Vec<usize> = (0..profiles.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(profiles[i].memory_slices));
    let mut starts = vec![0; profiles.len()];
    place(&order, profiles, 0, &mut starts).then_some(starts)
}

/// An InfoROM object (`nvmlInforomObject_t` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InforomObject {
    Oem = 0,
    Ecc = 1,
    Power = 2,
}

impl SimGpu {
    /// Whether the board answers for `c`: not when the scenario says so, and never
    /// for NVLink on a board without links.
    pub fn supports(&self, c: Capability) -> bool {
        let no_links = c == Capability::Nvlink && self.model.nvlink_links == 0;
        !no_links && !self.unsupported.contains(&c)
    }

    /// VBIOS version string.
    pub fn vbios_version(&self) -> &'static str {
        "96.00.99.00.01"
    }

    /// InfoROM object version; data-centre boards report no power object.
    pub fn inforom_version(&self, object: InforomObject) -> Option<&'static str> {
        match object {
            InforomObject::Oem => Some("2.1"),
            InforomObject::Ecc => Some("7.16"),
            InforomObject::Power => None,
        }
    }

    /// InfoROM image version string.
    pub fn inforom_image_version(&self) -> &'static str {
        "G520.0200.00.05"
    }
}

impl ViolationPolicy {
    pub const ALL: [ViolationPolicy; 6] = [
        ViolationPolicy::Power,
        ViolationPolicy::Thermal,
        ViolationPolicy::SyncBoost,
        ViolationPolicy::BoardLimit,
        ViolationPolicy::LowUtilization,
        ViolationPolicy::Reliability,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> SimNode {
        SimNode::new(&Scenario::builtin(name).unwrap(), UNIX_EPOCH)
    }

    #[test]
    fn identities_are_stable_and_distinct() {
        let a = node("default");
        let b = node("default");
        assert_eq!(a.gpus[3].uuid, b.gpus[3].uuid);
        let uuids: BTreeSet<_> = a.gpus.iter().map(|g| g.uuid.clone()).collect();
        assert_eq!(uuids.len(), 8);
        assert!(a.gpus[0].uuid.starts_with("GPU-") && a.gpus[0].uuid.len() == 40);
        assert_eq!(a.gpus[1].pci_bus_id, "00000000:2A:00.0");
    }

    #[test]
    fn energy_is_the_integral_of_power() {
        let n = node("default");
        let (t0, t1) = (100.0, 160.0);
        let e = n.gpu_reading(2, t1).energy_mj as f64 - n.gpu_reading(2, t0).energy_mj as f64;
        let steps = 6000;
        let dt = (t1 - t0) / steps as f64;
        let numeric: f64 = (0..steps)
            .map(|i| {
                let t = t0 + (i as f64 + 0.5) * dt;
                let g = &n.gpus[2];
                let span = f64::from(g.model.power_limit_mw) * FULL_LOAD_POWER_SHARE
                    - f64::from(g.model.idle_power_mw);
                (f64::from(g.model.idle_power_mw) + span * g.load.at(t) / 100.0) * dt
            })
            .sum();
        assert!((e - numeric).abs() / numeric < 1e-3, "{e} vs {numeric}");
    }

    #[test]
    fn a_dial_sets_utilisation_and_energy_stays_monotonic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dial");
        let mut n = node("default");
        n.attach_dial(Dial::new(&path).checked_every(Duration::ZERO));
        let scenario = n.gpu_reading(0, 10.0);
        std::fs::write(&path, "0=97\n*=3\n").unwrap();
        let high = n.gpu_reading(0, 11.0);
        assert_eq!(high.gpu_util_percent, Some(97));
        assert_eq!(n.gpu_reading(1, 11.0).gpu_util_percent, Some(3));
        assert!(high.power_mw > n.gpu_reading(1, 11.0).power_mw);
        let later = n.gpu_reading(0, 21.0);
        assert!(scenario.energy_mj < high.energy_mj && high.energy_mj < later.energy_mj);
        // 10 s at the dial's constant power (mW·s = mJ), up to rounding of both.
        let want = f64::from(later.power_mw) * 10.0;
        let got = (later.energy_mj - high.energy_mj) as f64;
        assert!((got - want).abs() <= 10.0, "{got} vs {want}");
        let procs: u32 = n
            .gpu_processes(0, 21.0)
            .iter()
            .map(|p| p.sm_util_percent)
            .sum();
        assert!(
            procs == 0 || procs == 97,
            "process shares follow the dial: {procs}"
        );
    }

    #[test]
    fn big_node_has_the_benchmark_shape() {
        let n = node("big-node");
        assert_eq!(n.gpus.len(), 8);
        assert_eq!(n.gpus.iter().map(|g| g.mig.len()).sum::<usize>(), 28);
        let procs: usize = (0..8).map(|i| n.gpu_processes(i, 10.0).len()).sum();
        assert_eq!(procs, 200);
        assert_eq!(
            n.gpu_reading(5, 10.0).gpu_util_percent,
            None,
            "MIG GPUs have no utilisation"
        );
    }

    #[test]
    fn process_shares_sum_to_the_device_value() {
        let n = node("big-node");
        for t in [0.0, 7.3, 44.4, 91.0] {
            let total = n.gpu_reading(0, t).gpu_util_percent.unwrap();
            let sum: u32 = n
                .gpu_processes(0, t)
                .iter()
                .map(|p| p.sm_util_percent)
                .sum();
            assert_eq!(sum, total, "t={t}");
        }
    }

    #[test]
    fn faults_take_effect_at_their_time() {
        let mut s = Scenario::builtin("default").unwrap();
        s.faults = vec![
            Fault::GpuLost { at_s: 10.0, gpu: 1 },
            Fault::Ecc {
                at_s: 5.0,
                gpu: 0,
                corrected: 3,
                uncorrected: 1,
            },
            Fault::DriverUnavailable {
                from_s: 20.0,
                until_s: Some(30.0),
            },
        ];
        let n = SimNode::new(&s, UNIX_EPOCH);
        assert!(!n.gpu_lost(1, 9.9) && n.gpu_lost(1, 10.0) && !n.gpu_lost(0, 50.0));
        assert_eq!(n.gpu_reading(0, 4.0).ecc_uncorrected_volatile, 0);
        assert_eq!(n.gpu_reading(0, 5.0).ecc_corrected_aggregate, 3);
        assert!(n.driver_available(19.0) && !n.driver_available(20.0) && n.driver_available(30.0));
    }
}

#[cfg(test)]
mod health_signal_tests {
    use crate::{Scenario, SimNode};

    fn node(faults: &str) -> SimNode {
        let text = format!("[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\ncount = 2\n{faults}");
        SimNode::new(
            &Scenario::parse_toml(&text, "t").unwrap(),
            std::time::SystemTime::UNIX_EPOCH,
        )
    }

    #[test]
    fn a_recovery_action_holds_from_its_instant_and_raises_xid_154() {
        let n = node(
            "[[faults]]\nkind = \"recovery_action\"\nat_s = 5\ngpu = 1\naction = 4\n\
             [[faults]]\nkind = \"recovery_action\"\nat_s = 9\ngpu = 1\naction = 0\n",
        );
        assert_eq!(n.gpu_reading(1, 4.0).recovery_action, 0);
        assert_eq!(n.gpu_reading(1, 6.0).recovery_action, 4);
        assert_eq!(n.gpu_reading(0, 6.0).recovery_action, 0);
        // Cleared again (the GPU was reset): the later fault wins.
        assert_eq!(n.gpu_reading(1, 10.0).recovery_action, 0);
        let xids = n.xids_between(0.0, 6.0);
        assert_eq!(xids.len(), 1);
        assert_eq!((xids[0].gpu, xids[0].code), (1, 154));
    }

    #[test]
    fn pending_remaps_and_ecc_mode_changes_follow_their_faults() {
        let n = node(
            "[[faults]]\nkind = \"row_remap\"\nat_s = 5\ngpu = 0\npending = true\n\
             [[faults]]\nkind = \"ecc_mode_pending\"\nat_s = 5\ngpu = 1\nenabled = false\n",
        );
        let (before, after) = (n.gpu_reading(0, 1.0), n.gpu_reading(0, 6.0));
        assert!(!before.remap_pending && after.remap_pending);
        let r = n.gpu_reading(1, 6.0);
        assert!(r.ecc_mode_current && !r.ecc_mode_pending);
        assert!(n.gpu_reading(1, 1.0).ecc_mode_pending);
    }

    #[test]
    fn an_unknown_recovery_action_is_refused() {
        let text = "[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\n[[faults]]\nkind = \"recovery_action\"\nat_s = 1\ngpu = 0\naction = 9\n";
        let e = Scenario::parse_toml(text, "t").unwrap_err().to_string();
        assert!(e.contains("recovery action 9"), "{e}");
    }
}
