//! # gpu-sim
//!
//! One description of a GPU node, two ways in: `gpu-exporter --simulate` reads it
//! directly, and the fake `libnvidia-ml.so.1` serves it through the NVML C ABI.
//!
//! A [`Scenario`] (TOML or JSON) names GPU models, MIG layouts, processes, load
//! patterns and faults. [`SimNode`] resolves it and answers, for any scenario instant,
//! what each GPU, MIG instance and process reports, in NVML's own units. Readings are
//! pure functions of the scenario and the time: no state, no sampling-rate effects.

pub mod dial;
pub mod fabric;
pub mod fans;
pub mod load;
pub mod models;
pub mod node;
pub mod pods;
pub mod scenario;

pub use fabric::{FabricReading, FabricSpec, FabricState};
pub use load::Load;
pub use node::{
    GpmReading, GpuReading, InforomObject, MemoryReading, MigReading, ProcessReading, SimClock,
    SimGpu, SimMig, SimNode, SimProcess, XidEvent,
};
pub use pods::{
    ClaimSpec, ContainerSpec, DeviceSpec, DeviceSpecError, DraNaming, IdForm, OwnerSpec, PodSpec,
    dra_profile_name,
};
pub use scenario::{Capability, Fault, Scenario, ScenarioError, ViolationPolicy};
