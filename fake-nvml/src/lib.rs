//! # fake-nvml: a fake `libnvidia-ml.so.1`
//!
//! A `cdylib` exporting the NVML C API that the exporter (through `nvml-wrapper`) and
//! `nvidia-ml-py` use, answered from a [`gpu_sim`] scenario instead of a driver, so the
//! real NVML code path runs on machines without GPUs. Load it with
//! `Nvml::builder().lib_path("…/libnvidia_ml.so")` or put it on `LD_LIBRARY_PATH` as
//! `libnvidia-ml.so.1` (its SONAME).
//!
//! ## What is served
//! Init/shutdown (reference-counted), error strings, driver/NVML/CUDA versions, process
//! names, device enumeration (by index, UUID — `GPU-…` and `MIG-…` — and PCI bus ID),
//! identity (name, UUID, serial, PCI info v1/v2/v3, brand, architecture, VBIOS, minor),
//! InfoROM versions, device attributes (MIG slices and memory), memory (v1 and v2), utilisation, encoder/decoder, power, energy, power limits, GPU
//! temperature, clocks, clock-event (throttle) reasons, violation times, PCIe replays
//! and throughput, ECC totals, retired pages, remapped rows, field values (ECC totals,
//! retired pages, NVLink error totals and data throughput with `scopeId`, violation
//! policies, memory temperature, energy, remapped rows), running compute processes
//! (v1, v2, v3) and per-process SM utilisation, MIG (mode, instance handles, parent,
//! GPU/compute-instance IDs, instance profiles), XID events and GPM metrics.
//! The exact list is in `sigcheck.rs`, which also proves at compile time that every
//! export has the signature `nvml-wrapper-sys` expects. Anything else is not exported,
//! so a client sees "function not found" rather than a silent stub.
//!
//! ## Environment
//! - `GPU_SIM_SCENARIO`: a scenario file (TOML, or JSON by extension) or
//!   `builtin:NAME`; default `builtin:default`. Read by the first `nvmlInit*` (and again
//!   by an init after the last `nvmlShutdown`). A scenario that cannot be loaded makes
//!   init return `NVML_ERROR_UNKNOWN` after one line on stderr naming the problem.
//! - `GPU_SIM_FROZEN_AT_S`: freeze scenario time at this many seconds (overrides the
//!   scenario's clock). Otherwise scenario second 0 is the first init.
//! - `GPU_SIM_DIAL`: a file of `GPU=PERCENT` lines (`*` for every GPU) that sets whole
//!   GPUs' utilisation while the process runs, re-read when it changes (looked at every
//!   100 ms at most); counters stay monotonic. Autoscaling tests turn load up and down
//!   with it.
//! - `GPU_SIM_CALL_COUNTS`: a file that receives per-function call counts (`COUNT NAME`
//!   lines, rewritten every 50 ms while they change), so tests and benchmarks can hold
//!   an NVML client to a number of calls per cycle. Off (one atomic load per call) when
//!   unset.
//!
//! ## Faults and errors
//! - `init_failure`: `nvmlInit*` returns `NVML_ERROR_DRIVER_NOT_LOADED`.
//! - `driver_unavailable` window: every call after init (system and device calls alike)
//!   returns `NVML_ERROR_UNKNOWN`, as a hung or crashed driver does.
//! - `slow` window: every call after init sleeps the delay before answering.
//! - `gpu_lost`: handle lookups still succeed, but every call on the GPU or its MIG
//!   instances returns `NVML_ERROR_GPU_IS_LOST`; other GPUs keep working.
//! - A capability listed in a GPU's `unsupported` makes the matching calls (and field
//!   IDs) return `NVML_ERROR_NOT_SUPPORTED`.
//! - MIG handles answer name, UUID, brand, architecture, memory, processes, MIG
//!   queries, events and GPM for the instance; whole-GPU queries on them return
//!   `NOT_SUPPORTED`, as does utilisation on a MIG-enabled GPU.
//! - Unknown handles are `INVALID_ARGUMENT`; calls before init are `UNINITIALIZED`;
//!   a too-small string buffer is `INSUFFICIENT_SIZE`; a wrong struct version is
//!   `ARGUMENT_VERSION_MISMATCH`.
//! - A panic inside an export is caught and returned as `NVML_ERROR_UNKNOWN`; the
//!   workspace keeps `panic = "unwind"` in every profile so this holds in release too.
//!
//! ## Events
//! Each XID of the scenario is delivered once per event set (XID type, code, GI/CI IDs
//! or `0xFFFFFFFF`, device handle), in time order, as soon as scenario time reaches it —
//! including XIDs whose time had passed before the set was created. With nothing due,
//! `nvmlEventSetWait*` blocks for the whole timeout, polling every 20 ms, and returns
//! `NVML_ERROR_TIMEOUT`.

#![allow(non_snake_case)]
// Patterns match bindgen constants such as `nvmlClockType_enum_NVML_CLOCK_SM`.
#![allow(non_upper_case_globals)]
// Every export is an `unsafe extern "C" fn` whose safety contract is the NVML API's:
// pointer arguments are null or valid for the access NVML documents.
#![allow(clippy::missing_safety_doc)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod board;
mod calls;
mod clocks;
mod device;
mod events;
mod ffi;
mod fields;
mod gpm;
mod instances;
mod mig;
mod nvlink;
mod pcie;
mod processes;
mod setters;
mod sigcheck;
mod state;
mod system;
mod unit;
mod unsupported;
mod vgpu;

pub use calls::CALL_COUNTS_ENV;
pub use state::{DEFAULT_SCENARIO, FROZEN_ENV, SCENARIO_ENV};
