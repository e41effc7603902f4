//! Discovery: NVML initialised (again where needed), then every GPU and, on a GPU in
//! MIG mode, its MIG instances, with their identities, labels and handles.

use super::{
    Gpm, Handle, MigInstance, MigLayout, NvmlSource, ProcessReads, Slot, map_err, mig_devices_now,
    mig_profile_name, raw, read_label,
};
use crate::plan::catalog::LabelField;
use crate::source::{EntityInfo, GiPlacement, Inventory, MigInfo, ReadError};
use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::nvmlDevice_t;
use std::collections::{BTreeMap, HashMap};

use super::events::XidWatcher;

/// What discovery reads once for every device: the label fields asked for and the
/// versions some of them take.
struct Context<'a> {
    labels: &'a [LabelField],
    driver_version: String,
    nvml_version: String,
}

/// One GPU as discovered: its slot and entity, its MIG instances' (slot, entity), and
/// its handle for XID events (none for a GPU lost at discovery).
struct DiscoveredGpu {
    gpu: (Slot, EntityInfo),
    migs: Vec<(Slot, EntityInfo)>,
    events: Option<nvmlDevice_t>,
}

impl NvmlSource {
    /// [`crate::source::GpuSource::discover`]: every GPU, then every MIG instance, in
    /// that order of entities.
    pub(super) fn discover_devices(
        &mut self,
        labels: &[LabelField],
    ) -> Result<Inventory, ReadError> {
        // A MIG layout change needs a new inventory, not a new NVML initialisation.
        let layout_only = std::mem::take(&mut self.layout_stale);
        let probed = std::mem::take(&mut self.probed);
        let rediscovery = self.nvml.is_some() && !layout_only && !probed;
        if !layout_only && !probed {
            self.sysfs_reference();
        }
        let nvml = self.init()?;
        // Every cache goes, GPM samples freed before NVML is shut down.
        self.forget();
        if rediscovery {
            // After a driver failure: drop NVML's state and initialise it again, so a
            // reloaded driver is picked up.
            raw::reinit(nvml)?;
        }
        let cx = Context {
            labels,
            driver_version: nvml.sys_driver_version().map_err(map_err)?,
            nvml_version: nvml.sys_nvml_version().unwrap_or_default(),
        };
        let count = nvml.device_count().map_err(map_err)?;
        self.device_count = count;
        let mut gpus = Vec::new();
        let mut migs = Vec::new();
        let mut event_handles = Vec::new();
        for index in 0..count {
            let found = self.discover_gpu(nvml, &cx, index, gpus.len())?;
            gpus.push(found.gpu);
            migs.extend(found.migs);
            event_handles.extend(found.events);
        }
        let (mut slots, mut entities): (Vec<Slot>, Vec<EntityInfo>) = gpus.into_iter().unzip();
        for (slot, e) in migs {
            if let Some((_, gi)) = slot.mig {
                self.event_migs
                    .insert((slot.parent_entity, gi), entities.len());
            }
            slots.push(slot);
            entities.push(e);
        }
        let n = slots.len();
        self.slots = slots;
        self.gpm = (0..n).map(|_| Gpm::Unknown).collect();
        self.process_reads = (0..n).map(|_| ProcessReads::default()).collect();
        self.thresholds.clear();
        self.xids = Some(XidWatcher::start(nvml, event_handles));
        Ok(Inventory {
            driver_version: cx.driver_version,
            nvml_version: cx.nvml_version,
            entities,
        })
    }

    /// GPU `index`, entity `gpu_entity`, and its MIG instances. A GPU that cannot be
    /// read is reported lost; a driver that fails as a whole fails the discovery.
    fn discover_gpu(
        &mut self,
        nvml: &'static Nvml,
        cx: &Context<'_>,
        index: u32,
        gpu_entity: usize,
    ) -> Result<DiscoveredGpu, ReadError> {
        let dev = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e @ (NvmlError::GpuLost | NvmlError::Unknown)) => {
                return Ok(lost_gpu(cx, index, &e.to_string()));
            }
            Err(e) => return Err(map_err(e)),
        };
        let uuid = match dev.uuid() {
            Ok(u) => u,
            Err(e) => return Ok(lost_gpu(cx, index, &e.to_string())),
        };
        let handle = Handle::of(&dev);
        self.event_devices.insert(handle.0, gpu_entity);
        let mig_mode = dev.mig_mode();
        let mig_on = mig_mode
            .as_ref()
            .is_ok_and(|m| m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE);
        if mig_mode.is_ok() {
            self.mig_layouts.push(MigLayout {
                index,
                gpu: handle,
                devices: mig_devices_now(&dev),
            });
        }
        let gpu = EntityInfo {
            gpu_index: index,
            uuid,
            minor_number: dev.minor_number().ok(),
            pci_bus_id: dev.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            model_name: dev.name().unwrap_or_default(),
            mig: None,
            labels: cx
                .labels
                .iter()
                .filter_map(|&l| {
                    Some((
                        l,
                        read_label(&dev, l, &cx.driver_version, &cx.nvml_version).ok()?,
                    ))
                })
                .collect::<BTreeMap<LabelField, String>>(),
            lost: false,
        };
        let migs = if mig_on {
            discover_migs(nvml, &dev, handle, &gpu, gpu_entity)
        } else {
            Vec::new()
        };
        let slot = Slot {
            index,
            mig: None,
            mig_parent: mig_on,
            handle: Some(handle),
            parent: Some(handle),
            parent_entity: gpu_entity,
            compute_instance: 0,
            no_vgpu_licensing: false,
        };
        Ok(DiscoveredGpu {
            gpu: (slot, gpu),
            migs,
            events: Some(handle.raw()),
        })
    }
}

/// A GPU that cannot be read at discovery: reported lost, with only its index and the
/// driver version.
fn lost_gpu(cx: &Context<'_>, index: u32, why: &str) -> DiscoveredGpu {
    tracing::error!(gpu = index, error = %why, "GPU cannot be read at discovery; reported as lost");
    let slot = Slot {
        index,
        mig: None,
        mig_parent: false,
        handle: None,
        parent: None,
        parent_entity: index as usize,
        compute_instance: 0,
        no_vgpu_licensing: false,
    };
    let entity = EntityInfo {
        gpu_index: index,
        uuid: String::new(),
        minor_number: None,
        pci_bus_id: String::new(),
        model_name: String::new(),
        mig: None,
        labels: cx
            .labels
            .iter()
            .filter(|l| **l == LabelField::DriverVersion)
            .map(|l| (*l, cx.driver_version.clone()))
            .collect(),
        lost: true,
    };
    DiscoveredGpu {
        gpu: (slot, entity),
        migs: Vec::new(),
        events: None,
    }
}

/// The MIG instances of the GPU `gpu` (in MIG mode, entity `gpu_entity`, handle
/// `parent`), each an entity with its GPU's identity and labels.
fn discover_migs(
    nvml: &'static Nvml,
    dev: &Device<'_>,
    parent: Handle,
    gpu: &EntityInfo,
    gpu_entity: usize,
) -> Vec<(Slot, EntityInfo)> {
    let index = gpu.gpu_index;
    let total_mib = dev.memory_info().map(|m| m.total >> 20).unwrap_or(0);
    let instances = mig_instances(nvml, dev, index);
    let placements = gi_placements(nvml, parent, index, &instances);
    instances
        .into_iter()
        .map(|instance| {
            let (j, gi, ci) = (
                instance.slot,
                instance.gpu_instance,
                instance.compute_instance,
            );
            let profile = instance
                .handle
                .device(nvml)
                .attributes()
                .map(|a| mig_profile_name(a.gpu_instance_slice_count, a.memory_size_mb, total_mib))
                .unwrap_or_default();
            let slot = Slot {
                index,
                mig: Some((j, gi)),
                mig_parent: false,
                handle: Some(instance.handle),
                parent: Some(parent),
                parent_entity: gpu_entity,
                compute_instance: ci,
                no_vgpu_licensing: false,
            };
            let entity = EntityInfo {
                mig: Some(MigInfo {
                    parent: gpu_entity,
                    gpu_instance_id: gi,
                    compute_instance_id: ci,
                    slot: j,
                    profile,
                    mig_uuid: instance.uuid,
                    placement: placements.get(&gi).copied(),
                }),
                ..gpu.clone()
            };
            (slot, entity)
        })
        .collect()
}

/// The MIG instances of one GPU in MIG mode, slot by slot (empty slots skipped).
fn mig_instances(nvml: &Nvml, dev: &Device<'_>, index: u32) -> Vec<MigInstance> {
    let mut found = Vec::new();
    for slot in 0..dev.mig_device_count().unwrap_or(0) {
        let Ok(mig) = dev.mig_device_by_index(slot) else {
            continue; // an empty MIG slot
        };
        let handle = Handle::of(&mig);
        match raw::instance_ids(nvml, handle.raw()) {
            Ok((gpu_instance, compute_instance)) => found.push(MigInstance {
                slot,
                handle,
                gpu_instance,
                compute_instance,
                uuid: mig.uuid().unwrap_or_default(),
            }),
            Err(e) => {
                tracing::warn!(gpu = index, slot, error = %e, "MIG instance without IDs; skipped");
            }
        }
    }
    found
}

/// Each GPU instance's profile ID and placement, by GPU-instance ID. Without them
/// (no MIG monitoring capability, an old driver) DRA MIG device names resolve only
/// by profile name; said once per discovery.
fn gi_placements(
    nvml: &Nvml,
    parent: Handle,
    index: u32,
    instances: &[MigInstance],
) -> HashMap<u32, GiPlacement> {
    let mut found = HashMap::new();
    let mut failure = None;
    for i in instances {
        if found.contains_key(&i.gpu_instance) {
            continue;
        }
        match raw::gpu_instance_placement(nvml, parent.raw(), i.gpu_instance) {
            Ok(p) => {
                found.insert(i.gpu_instance, p);
            }
            Err(e) => failure = Some(e),
        }
    }
    if let Some(e) = failure {
        tracing::info!(gpu = index, error = %e, "MIG GPU-instance placements not readable; DRA MIG devices are matched by profile name only");
    }
    found
}
