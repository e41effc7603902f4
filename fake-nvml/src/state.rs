//! Process-global state: the scenario loaded at `nvmlInit`, the static table that
//! device handles point into, and the two call wrappers every export goes through
//! ([`system_call`] and [`device_call`]) which apply the scenario's faults.

use crate::events::EventSet;
use crate::ffi::{
    DRIVER_NOT_LOADED, GPU_IS_LOST, INVALID_ARGUMENT, NOT_SUPPORTED, Outcome, Ret, UNINITIALIZED,
    UNKNOWN, guard,
};
use crate::gpm::GpmSample;
use gpu_sim::{Capability, GpuReading, Scenario, SimGpu, SimMig, SimNode, XidEvent};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_st, nvmlDevice_t, nvmlGpuInstance_st, nvmlGpuInstance_t,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

/// Environment variable naming the scenario: a file path or `builtin:NAME`.
pub const SCENARIO_ENV: &str = "GPU_SIM_SCENARIO";
/// Environment variable freezing scenario time at this many seconds.
pub const FROZEN_ENV: &str = "GPU_SIM_FROZEN_AT_S";
/// Environment variable naming a dial file that sets GPUs' utilisation at run time
/// (`GPU=PERCENT` lines, see `gpu_sim::dial`).
pub const DIAL_ENV: &str = "GPU_SIM_DIAL";
/// Scenario used when [`SCENARIO_ENV`] is unset.
pub const DEFAULT_SCENARIO: &str = "builtin:default";

/// Largest node the handle table can serve.
pub const MAX_GPUS: usize = 256;
/// Handle slots per GPU: the GPU itself and up to seven MIG instances.
pub const SLOTS_PER_GPU: usize = 8;

/// Device handles are addresses in this table: stable for the life of the process,
/// distinct, non-null, and never dereferenced by anyone.
static HANDLE_SLOTS: [u8; MAX_GPUS * SLOTS_PER_GPU] = [0; MAX_GPUS * SLOTS_PER_GPU];

/// The handle of a GPU (`mig = None`) or of one of its MIG instances.
pub(crate) fn handle(gpu: u32, mig: Option<usize>) -> nvmlDevice_t {
    let slot = gpu as usize * SLOTS_PER_GPU + mig.map_or(0, |m| m + 1);
    HANDLE_SLOTS
        .as_ptr()
        .wrapping_add(slot)
        .cast::<nvmlDevice_st>()
        .cast_mut()
}

/// GPU-instance handles are addresses in this table, one per MIG device slot of each
/// GPU (the slot's instance is the GPU instance).
static GPU_INSTANCE_SLOTS: [u8; MAX_GPUS * SLOTS_PER_GPU] = [0; MAX_GPUS * SLOTS_PER_GPU];

/// The handle of the GPU instance of MIG device `mig` of GPU `gpu`.
pub(crate) fn gpu_instance_handle(gpu: u32, mig: usize) -> nvmlGpuInstance_t {
    GPU_INSTANCE_SLOTS
        .as_ptr()
        .wrapping_add(gpu as usize * SLOTS_PER_GPU + mig)
        .cast::<nvmlGpuInstance_st>()
        .cast_mut()
}

/// Objects handed out by address (event sets, GPM samples). Each owns a heap token whose
/// address is the handle, so handles stay unique while the object lives.
pub(crate) struct Registry<T> {
    items: Mutex<HashMap<usize, (Box<u8>, T)>>,
}

impl<T> Registry<T> {
    fn new() -> Self {
        Registry {
            items: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<usize, (Box<u8>, T)>> {
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Store `v`; the returned address is its handle.
    pub(crate) fn insert(&self, v: T) -> usize {
        let token = Box::new(0u8);
        let key = &*token as *const u8 as usize;
        self.lock().insert(key, (token, v));
        key
    }

    /// Run `f` on the object behind `key`; `None` for an unknown handle.
    pub(crate) fn with<R>(&self, key: usize, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.lock().get_mut(&key).map(|(_, v)| f(v))
    }

    pub(crate) fn remove(&self, key: usize) -> Option<T> {
        self.lock().remove(&key).map(|(_, v)| v)
    }
}

/// One loaded scenario and the objects clients created while it was loaded.
pub(crate) struct Sim {
    pub node: SimNode,
    /// GPUs this initialisation enumerated: the first N of the scenario's
    /// (`GPU_SIM_DEVICES_FILE`, read at init as a driver enumerates at init).
    pub gpu_count: u32,
    /// Every XID of the scenario, in time order.
    pub xids: Vec<XidEvent>,
    pub event_sets: Registry<EventSet>,
    pub gpm_samples: Registry<GpmSample>,
}

impl Sim {
    pub(crate) fn now(&self) -> f64 {
        self.node.clock().now_s()
    }

    /// The GPU and MIG instance a handle designates, if it is one of ours.
    pub(crate) fn decode(&self, h: nvmlDevice_t) -> Option<(u32, Option<usize>)> {
        let off = (h as usize).wrapping_sub(HANDLE_SLOTS.as_ptr() as usize);
        if off >= HANDLE_SLOTS.len() {
            return None;
        }
        let (gpu, slot) = (off / SLOTS_PER_GPU, off % SLOTS_PER_GPU);
        if gpu >= self.gpu_count as usize {
            return None;
        }
        let g = self.node.gpus.get(gpu)?;
        let mig = match slot {
            0 => None,
            // A destroyed MIG instance's handle is no handle any more.
            s if s <= g.mig.len() && crate::devices::with(|d| d.mig_exists(gpu as u32, s - 1)) => {
                Some(s - 1)
            }
            _ => return None,
        };
        Some((gpu as u32, mig))
    }
}

impl Sim {
    /// The GPU and MIG device a GPU-instance handle designates, if it is one of ours.
    pub(crate) fn decode_gpu_instance(&self, h: nvmlGpuInstance_t) -> Option<(u32, usize)> {
        let off = (h as usize).wrapping_sub(GPU_INSTANCE_SLOTS.as_ptr() as usize);
        if off >= GPU_INSTANCE_SLOTS.len() {
            return None;
        }
        let (gpu, mig) = (off / SLOTS_PER_GPU, off % SLOTS_PER_GPU);
        (mig < self.node.gpus.get(gpu)?.mig.len()).then_some((gpu as u32, mig))
    }
}

struct Global {
    refs: u32,
    sim: Option<Arc<Sim>>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global { refs: 0, sim: None });

fn global() -> MutexGuard<'static, Global> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `nvmlInit*`: load the scenario on the first call, count the others.
pub(crate) fn init() -> Outcome {
    let mut g = global();
    if g.sim.is_none() {
        g.sim = Some(Arc::new(load()?));
    }
    g.refs += 1;
    Ok(())
}

/// `nvmlShutdown`: the last one unloads the scenario (a later init reloads it).
pub(crate) fn shutdown() -> Outcome {
    let mut g = global();
    if g.refs == 0 {
        return Err(UNINITIALIZED);
    }
    g.refs -= 1;
    if g.refs == 0 {
        g.sim = None;
    }
    Ok(())
}

fn load() -> Result<Sim, Ret> {
    // One line on stderr, however many lines the underlying error has.
    let fail = |msg: String| {
        let line: Vec<&str> = msg
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && *l != "|")
            .collect();
        eprintln!("fake-nvml: {}", line.join(" "));
        UNKNOWN
    };
    if let Err(e) = crate::cost::from_env() {
        return Err(fail(e.to_string()));
    }
    let spec = std::env::var(SCENARIO_ENV).unwrap_or_else(|_| DEFAULT_SCENARIO.into());
    let scenario = Scenario::load(Path::new(&spec)).map_err(|e| fail(e.to_string()))?;
    // Scenario time runs from the first initialisation in this process: a client that
    // shuts NVML down and initialises it again (after a driver failure) sees time go on,
    // as on a real machine, rather than the scenario starting over.
    static FIRST_INIT: std::sync::OnceLock<SystemTime> = std::sync::OnceLock::new();
    let mut node = SimNode::new(&scenario, *FIRST_INIT.get_or_init(SystemTime::now));
    if let Ok(v) = std::env::var(FROZEN_ENV) {
        let t: f64 = v
            .trim()
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite())
            .ok_or_else(|| fail(format!("{FROZEN_ENV}={v:?} is not a number of seconds")))?;
        node.freeze_at(t);
    }
    if let Some(path) = std::env::var_os(DIAL_ENV) {
        node.attach_dial(gpu_sim::dial::Dial::new(path));
    }
    if node.init_fails() || crate::cue::current() == crate::cue::Cue::NotLoaded {
        return Err(DRIVER_NOT_LOADED);
    }
    if node.gpus.len() > MAX_GPUS {
        return Err(fail(format!(
            "scenario {spec} has {} GPUs; at most {MAX_GPUS} are supported",
            node.gpus.len()
        )));
    }
    if let Some((i, g)) = node
        .gpus
        .iter()
        .enumerate()
        .find(|(_, g)| g.mig.len() >= SLOTS_PER_GPU)
    {
        return Err(fail(format!(
            "scenario {spec}: GPU {i} has {} MIG instances; at most {} are supported",
            g.mig.len(),
            SLOTS_PER_GPU - 1
        )));
    }
    let xids = node.xids_between(f64::NEG_INFINITY, f64::INFINITY);
    let gpu_count = crate::devices::with(|d| d.gpus)
        .map_or(node.gpus.len(), |n| (n as usize).min(node.gpus.len())) as u32;
    Ok(Sim {
        gpu_count,
        node,
        xids,
        event_sets: Registry::new(),
        gpm_samples: Registry::new(),
    })
}

fn current() -> Result<Arc<Sim>, Ret> {
    global().sim.clone().ok_or(UNINITIALIZED)
}

/// Run the body of a call that needs an initialised library: panics are caught, the
/// scenario's `Slow` window delays the call and its `DriverUnavailable` window fails
/// it with `NVML_ERROR_UNKNOWN`. `body` gets the scenario and the current scenario time.
pub(crate) fn system_call(body: impl FnOnce(&Sim, f64) -> Outcome) -> Ret {
    guard(|| {
        let sim = current()?;
        let t = sim.now();
        if let Some(d) = sim.node.call_delay(t) {
            std::thread::sleep(d);
        }
        if !sim.node.driver_available(t) || !crate::cue::before_call() {
            return Err(UNKNOWN);
        }
        body(&sim, t)
    })
}

/// A device call in progress: the device behind the handle and the scenario instant.
pub(crate) struct Dev<'a> {
    pub sim: &'a Sim,
    pub index: u32,
    pub gpu: &'a SimGpu,
    /// Position of the MIG instance in `gpu.mig` when the handle is a MIG handle.
    pub mig: Option<usize>,
    pub t: f64,
}

impl Dev<'_> {
    pub(crate) fn node(&self) -> &SimNode {
        &self.sim.node
    }

    pub(crate) fn mig_instance(&self) -> Option<&SimMig> {
        self.mig.map(|m| &self.gpu.mig[m])
    }

    /// Whole-GPU queries answer `NOT_SUPPORTED` on a MIG handle.
    pub(crate) fn whole_gpu(&self) -> Outcome {
        match self.mig {
            Some(_) => Err(NOT_SUPPORTED),
            None => Ok(()),
        }
    }

    /// `NOT_SUPPORTED` when the scenario lists the capability as unsupported.
    pub(crate) fn require(&self, c: Capability) -> Outcome {
        if self.gpu.supports(c) {
            Ok(())
        } else {
            Err(NOT_SUPPORTED)
        }
    }

    /// The whole-GPU reading for a query that needs capability `c`.
    pub(crate) fn reading(&self, c: Capability) -> Result<GpuReading, Ret> {
        self.whole_gpu()?;
        self.require(c)?;
        Ok(self.node().gpu_reading(self.index, self.t))
    }

    /// Microseconds since the Unix epoch of the current scenario instant.
    pub(crate) fn timestamp_us(&self) -> i64 {
        self.node()
            .clock()
            .wall_time(self.t)
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    }
}

/// Run the body of a call on a device handle: everything [`system_call`] does, then
/// `INVALID_ARGUMENT` for a handle that is not ours and `GPU_IS_LOST` for a GPU (or
/// an instance of a GPU) that has fallen off the bus.
pub(crate) fn device_call(h: nvmlDevice_t, body: impl FnOnce(&Dev) -> Outcome) -> Ret {
    system_call(|sim, t| {
        let (index, mig) = sim.decode(h).ok_or(INVALID_ARGUMENT)?;
        // Lost in the scenario, or gone from the device-set cue since init.
        if sim.node.gpu_lost(index, t) || !crate::devices::with(|d| d.gpu_exists(index)) {
            return Err(GPU_IS_LOST);
        }
        body(&Dev {
            sim,
            index,
            gpu: &sim.node.gpus[index as usize],
            mig,
            t,
        })
    })
}
