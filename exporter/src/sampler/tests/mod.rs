//! The sampler's unit tests, by topic, and the scripted sources they share.

mod cadence;
mod convert;
mod discovery;
mod labels;
mod links;
mod splitting;

use super::build::convert_value;
use super::devices::inventory_changes;
use super::plan::Split;
use super::pods::split_entity;
use super::*;
use crate::attribution::Attributor;
use crate::attribution::assign::Holder;
use crate::attribution::pods::PodDirectory;
use crate::hpc::HpcJobs;
use crate::plan::catalog::{Convert, Quantity};
use crate::plan::counters::ExportPlan;
use crate::plan::reload::PlanHandle;
use crate::snapshot::{Snapshot, SnapshotStore, Value};
use crate::source::{EntityInfo, GpuSource, Inventory, ProcessSample, Raw, ReadError};
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

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
    fn discover(&mut self, _: &[crate::plan::catalog::LabelField]) -> Result<Inventory, ReadError> {
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
    fn discover(&mut self, _: &[crate::plan::catalog::LabelField]) -> Result<Inventory, ReadError> {
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
        crate::plan::counters::plan("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, n\n", "test.csv")
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

/// Pod UIDs of the split tests: two holders of the GPU, a third pod on the same
/// namespace that does not hold it, and a pod named like a holder in another
/// namespace.
const UID_A: &str = "0a0a0a0a-0000-0000-0000-00000000000a";
const UID_B: &str = "0b0b0b0b-0000-0000-0000-00000000000b";
const UID_C: &str = "0c0c0c0c-0000-0000-0000-00000000000c";
const UID_D: &str = "0d0d0d0d-0000-0000-0000-00000000000d";

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
    fn discover(&mut self, _: &[crate::plan::catalog::LabelField]) -> Result<Inventory, ReadError> {
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

fn process(pid: u32, sm: Option<u32>, memory_bytes: u64) -> ProcessSample {
    ProcessSample {
        pid,
        name: format!("p{pid}"),
        used_memory_bytes: Some(memory_bytes),
        sm_util_percent: sm,
    }
}

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

const MIB: u64 = 1 << 20;
