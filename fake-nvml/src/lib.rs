//! # fake-nvml: a fake `libnvidia-ml.so.1`
//!
//! A `cdylib` exporting the NVML C API that the exporter (through `nvml-wrapper`) and
//! `nvidia-ml-py` use, answered from a [`gpu_sim`] scenario instead of a driver, so the
//! real NVML code path runs on machines without GPUs. Load it with
//! `Nvml::builder().lib_path("…/libnvidia_ml.so")` or put it on `LD_LIBRARY_PATH` as
//! `libnvidia-ml.so.1` (its SONAME).
//!
//! ## What is served
//! Every function nvidia-ml-py (13.615.71) and nvml-wrapper-sys (0.10) bind — 428
//! symbols — each answered as a bare-metal H100 SXM with the scenario's driver would:
//! - From the model: init/shutdown (reference-counted), error strings, driver/NVML/CUDA
//!   versions and driver branch, process names, device enumeration (by index, UUID —
//!   `GPU-…` and `MIG-…`, as a string or an `nvmlUUID_t` —, serial and PCI bus ID), identity (name, UUID, serial, PCI
//!   info v1/v2/v3/ext, brand, architecture, VBIOS, minor number, board part number and
//!   ID, module ID), InfoROM, device attributes, memory (v1, v2), BAR1, utilisation,
//!   dynamic P-state domains, samples (`GetSamples`), encoder/decoder (and JPEG/OFA,
//!   idle), power, energy,
//!   power limits and their range, temperature (`GetTemperature`, `GetTemperatureV`,
//!   thresholds, margin), clocks of every type (graphics, SM, memory, video) and ID
//!   (current, applications target/default, customer boost), supported clocks,
//!   performance state, clock-event reasons, violation times, PCIe link generation,
//!   width and speed, replays and throughput, NUMA node and topology (two-socket HGX),
//!   P2P status, NVLink (state, version, capabilities, remote NVSwitch PCI info and
//!   device type, per-link error counters, fabric state on Hopper HGX boards), ECC modes and totals, memory error
//!   counters, retired pages, remapped rows, field values (ECC, retired pages, NVLink
//!   link count, state, version, error totals and throughput with `scopeId`, violation
//!   policies, temperatures and thresholds, power, energy, PCIe replays, remapped rows),
//!   running processes — compute (v1, v2, v3), graphics and MPS (v1, v2, v3; none, the
//!   model runs compute work only), `GetRunningProcessDetailList` — and per-process
//!   utilisation (plain and `GetProcessesUtilizationInfo`), MIG (mode, device handles,
//!   parent, GPU/compute-instance IDs, instance profiles, an existing GPU instance by ID
//!   with its unique profile ID and placement), XID events and GPM metrics.
//! - Fixed board facts (`gpu_sim::models::BoardFacts`): persistence mode on, compute
//!   mode default, display off, GSP firmware on (its version is the driver's),
//!   confidential computing off, accounting off, no encoder/FBC sessions, fans only on
//!   actively cooled boards (`fans.rs`; SXM and data-centre PCIe boards report 0 and
//!   answer every fan getter `NOT_SUPPORTED`), no S-class units, no excluded GPUs, no
//!   virtualisation.
//! - `NOT_SUPPORTED`: vGPU queries on a device (no vGPU host driver), Windows-only,
//!   Blackwell-only and deprecated queries (`unsupported.rs`, `vgpu.rs`); also, where a
//!   real H100 answers but the model has no data, CPU/memory affinity, IRQ, SRAM ECC,
//!   row-remapper histogram, clock monitor and the clock/performance-mode strings.
//! - `NO_PERMISSION`: every call that changes device or driver state (`setters.rs`),
//!   and enumerating or creating GPU/compute instances (`instances.rs`, also on a GPU
//!   instance handle), as the driver answers a non-root client; the fake changes no
//!   state.
//! - `INVALID_ARGUMENT`: calls on handles this node never hands out (units, vGPU
//!   instances and types, compute instances).
//!
//! The exact list is in `sigcheck.rs`, which also proves at compile time that every
//! export has the signature `nvml-wrapper-sys` expects; the 32 exports nvml-wrapper-sys
//! does not bind (newer ones such as `nvmlEventSetWait_v3`) are listed there separately
//! with their signatures from `nvml.h`. Anything else is not exported, so a client sees
//! "function not found" rather than a silent stub.

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
//! - `GPU_SIM_COST_MODEL`: a cost model (`h100-580`): every call then spends, busy on
//!   the calling thread's CPU, what the real driver's call costs, per function, per
//!   field ID and per GPM metric, from a real GPU's measurements (`cost.rs`). An unknown
//!   name makes `nvmlInit*` fail (`NVML_ERROR_UNKNOWN`) after one line on stderr naming
//!   the models. Off (one atomic load per call) when unset.
//! - `GPU_SIM_FAULT_FILE`: a cue file whose one word (`unavailable`, `hang`,
//!   `slow=MS`, `not_loaded`, or nothing) switches a driver fault on and off while the
//!   process runs (looked at every 10 ms at most), so fault tests can time recovery
//!   from the instant they end a fault (`cue.rs`).
//! - `GPU_SIM_DEVICES_FILE`: a cue file of `gpus=N` and `mig.G=I,J` lines that makes the
//!   scenario's GPUs and MIG instances appear and go while the process runs, as GPUs
//!   added or lost and MIG instances created or destroyed do on a real node
//!   (`devices.rs`).
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
//! - MIG handles answer name, UUID, brand, architecture, memory, BAR1, processes, MIG
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
//! `nvmlEventSetWait*` blocks like the driver: it sleeps on a condition variable until
//! the wall-clock instant of the set's next XID (never, with scenario time frozen) or
//! the timeout, woken early by registrations, and returns `NVML_ERROR_TIMEOUT`.

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
mod cost;
mod cue;
mod device;
mod devices;
mod events;
mod fans;
mod ffi;
mod fields;
mod gpm;
mod host;
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
pub use cost::{COST_MODEL_ENV, CostModelError, Model as CostModel};
pub use devices::DEVICES_FILE_ENV;
pub use state::{DEFAULT_SCENARIO, FROZEN_ENV, SCENARIO_ENV};
