//! GPU sources: where readings come from. One trait, two backends: real NVML through
//! `nvml-wrapper` ([`nvml::NvmlSource`]) and the gpu-sim model ([`simulated::SimulatedSource`]).
//! Sources answer in NVML's own units; the sampler converts.

// The NVML boundary: the one place unsafe code is allowed (each block says why).
#[allow(unsafe_code)]
pub mod nvml;
pub mod selection;
// Unit tests drive the simulated source whatever the features.
#[cfg(any(test, feature = "demo"))]
pub mod simulated;

use crate::plan::catalog::{LabelField, Quantity};
use std::collections::BTreeMap;
use std::time::SystemTime;

/// A raw reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Raw {
    U64(u64),
    F64(f64),
}

impl Raw {
    pub fn as_f64(self) -> f64 {
        match self {
            Raw::U64(v) => v as f64,
            Raw::F64(v) => v,
        }
    }
}

/// Why a reading is missing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReadError {
    /// The device does not support it; asked once, then remembered.
    #[error("not supported")]
    NotSupported,
    /// No value this cycle, and nothing wrong (a rate's first sample).
    #[error("no value yet")]
    NoValueYet,
    /// The GPU has fallen off the bus.
    #[error("GPU is lost")]
    GpuLost,
    /// The driver as a whole is not answering; the source must be rediscovered.
    #[error("driver unavailable: {0}")]
    Unavailable(String),
    /// Any other failure of this one reading.
    #[error("{0}")]
    Failed(String),
}

/// The devices a source sees: physical GPUs, then MIG instances.
#[derive(Debug, Clone, PartialEq)]
pub struct Inventory {
    pub driver_version: String,
    pub nvml_version: String,
    pub entities: Vec<EntityInfo>,
}

/// A physical GPU or a MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityInfo {
    /// NVML index of the (parent) GPU.
    pub gpu_index: u32,
    /// UUID of the (parent) GPU, as dcgm-exporter labels MIG series.
    pub uuid: String,
    /// Minor number of the (parent) GPU (`/dev/nvidia<N>`), by which NVIDIA's DRA
    /// driver names devices; `None` when NVML does not tell.
    pub minor_number: Option<u32>,
    pub pci_bus_id: String,
    pub model_name: String,
    pub mig: Option<MigInfo>,
    /// String attributes for `label` rows (read once).
    pub labels: BTreeMap<LabelField, String>,
    /// Already lost when discovered (its identity may be unknown).
    pub lost: bool,
}

/// What identifies a MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct MigInfo {
    /// Entity index of the parent GPU in the inventory.
    pub parent: usize,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// Position in the parent's MIG device enumeration
    /// (`nvmlDeviceGetMigDeviceHandleByIndex`), which the device plugin's `index`
    /// strategy names as `<gpu>:<slot>`.
    pub slot: u32,
    /// Profile name, e.g. `3g.40gb`.
    pub profile: String,
    pub mig_uuid: String,
    /// The GPU instance's profile ID and placement; `None` when NVML does not tell
    /// (reading a GPU instance needs the MIG monitoring capability).
    pub placement: Option<GiPlacement>,
}

/// A GPU instance's unique profile ID (19 for `1g.10gb` on an H100, as
/// `nvidia-smi mig -lgip` shows) and its placement among the GPU's memory slices, from
/// `nvmlGpuInstanceGetInfo`: what NVIDIA's DRA driver names MIG devices by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GiPlacement {
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// A process using a GPU or MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    pub name: String,
    pub used_memory_bytes: Option<u64>,
    pub sm_util_percent: Option<u32>,
}

/// An XID error reported by the driver.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct XidEvent {
    /// Entity index (the MIG instance when the driver names one, else the GPU).
    pub entity: usize,
    pub code: u64,
    pub at: SystemTime,
}

/// DCGM's spelling of an NVML brand (`nvmlBrandType_t`), for `DCGM_FI_DEV_BRAND`.
#[allow(non_upper_case_globals)] // bindgen names NVML's constants
pub fn brand_name(brand: u32) -> &'static str {
    use nvml_wrapper_sys::bindings::*;
    match brand {
        nvmlBrandType_enum_NVML_BRAND_QUADRO => "Quadro",
        nvmlBrandType_enum_NVML_BRAND_TESLA => "Tesla",
        nvmlBrandType_enum_NVML_BRAND_NVS => "NVS",
        nvmlBrandType_enum_NVML_BRAND_GRID => "GRID",
        nvmlBrandType_enum_NVML_BRAND_GEFORCE => "GeForce",
        nvmlBrandType_enum_NVML_BRAND_TITAN => "Titan",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VAPPS => "NVIDIA vApps",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VPC => "NVIDIA Virtual PC",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VCS => "NVIDIA Virtual Compute Server",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VWS => "NVIDIA RTX Virtual Workstation",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_CLOUD_GAMING => "NVIDIA Cloud Gaming",
        nvmlBrandType_enum_NVML_BRAND_QUADRO_RTX => "Quadro RTX",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX => "NVIDIA RTX",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA => "NVIDIA",
        nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX => "GeForce RTX",
        nvmlBrandType_enum_NVML_BRAND_TITAN_RTX => "Titan RTX",
        _ => "Unknown",
    }
}

/// DCGM's `dcgmFabricManagerStatus_t` for an NVML fabric state and registration status
/// (`DCGM_FI_DEV_FABRIC_MANAGER_STATUS`): 0 not supported, 1 not started, 2 in
/// progress, 3 success, 4 failure (completed with an error status), 5 unrecognized.
pub fn fabric_manager_status(state: u8, status: u32) -> u64 {
    use nvml_wrapper_sys::bindings::*;
    match u32::from(state) {
        NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => 0,
        NVML_GPU_FABRIC_STATE_NOT_STARTED => 1,
        NVML_GPU_FABRIC_STATE_IN_PROGRESS => 2,
        NVML_GPU_FABRIC_STATE_COMPLETED if status == nvmlReturn_enum_NVML_SUCCESS => 3,
        NVML_GPU_FABRIC_STATE_COMPLETED => 4,
        _ => 5,
    }
}

/// `DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE`: once the registration has completed, its
/// status as DCGM converts an `nvmlReturn_t` (`NvmlReturnToDcgmReturn`: 0 OK, else a
/// negative `DCGM_ST_*`); before that, no value.
#[allow(non_upper_case_globals)] // bindgen names NVML's constants
pub fn fabric_manager_error(state: u8, status: u32) -> Option<i64> {
    use nvml_wrapper_sys::bindings::*;
    if u32::from(state) != NVML_GPU_FABRIC_STATE_COMPLETED {
        return None;
    }
    Some(match status {
        nvmlReturn_enum_NVML_SUCCESS => 0,
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => -6,
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => -17,
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => -14,
        nvmlReturn_enum_NVML_ERROR_TIMEOUT => -11,
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => -18,
        nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => -19,
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => -1,
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => -49,
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => -56,
        // DCGM_ST_NVML_ERROR for every other NVML error.
        _ => -8,
    })
}

/// A GPU source. Calls may block; the sampler runs them on its own thread.
pub trait GpuSource: Send {
    /// One line for logs and `gpu_exporter_build_info`.
    fn describe(&self) -> String;

    /// (Re)connect and enumerate devices, reading the string attributes in `labels`.
    fn discover(&mut self, labels: &[LabelField]) -> Result<Inventory, ReadError>;

    /// While the driver is down: a cheap check, made every cycle, of whether a full
    /// [`GpuSource::discover`] could succeed now, so that the sampler notices the driver
    /// is back within a cycle without rediscovering every device on every cycle of an
    /// outage. Like every call it may block; the sampler's hung-call guard covers it.
    fn probe(&mut self) -> Result<(), ReadError>;

    /// Read `quantities` of one entity; `out` receives one result per quantity, in order.
    fn read(
        &mut self,
        entity: usize,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    );

    /// Processes running on one entity.
    fn processes(&mut self, entity: usize) -> Result<Vec<ProcessSample>, ReadError>;

    /// Whether the device set changed since discovery (GPUs that appeared or went, MIG
    /// instances created or destroyed), so the sampler must discover again. Called
    /// once per cycle while the driver is up, also when discovery found no GPU; cheap.
    fn device_set_changed(&mut self) -> bool {
        false
    }

    /// The cycle's reads are done (caches keyed on what a cycle saw may be pruned).
    fn end_cycle(&mut self) {}

    /// XIDs reported since the last call, each exactly once.
    fn xid_events(&mut self) -> Vec<XidEvent>;

    /// NVLinks of the physical GPU `entity` (0 without NVLink). Asked once per
    /// discovery, and only when link-scoped fields are planned.
    fn nvlinks(&mut self, _entity: usize) -> u32 {
        0
    }

    /// Read link-scoped `quantities` of links `0..links` of the GPU `entity`: `out`
    /// receives `links × quantities.len()` results, link by link.
    fn read_links(
        &mut self,
        _entity: usize,
        links: u32,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        out.clear();
        out.extend((0..links as usize * quantities.len()).map(|_| Err(ReadError::NotSupported)));
    }
}
