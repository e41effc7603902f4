//! A device-set cue: a file whose lines change which GPUs and MIG instances the driver
//! has while the process runs (`GPU_SIM_DEVICES_FILE`), so that a test can make devices
//! appear and go at an instant it knows. The scenario's GPUs and MIG instances are
//! everything there can be; the file says which of them exist now.
//!
//! Lines (blanks and `#` comments ignored; a line it does not know is reported once on
//! stderr and ignored):
//! - `gpus=N`: the driver has the scenario's first N GPUs. Models two real situations.
//!   NVML enumerates GPUs when it is initialised, so a raised N shows from the next
//!   `nvmlInit` on, as a GPU does that was still bound to `vfio-pci`, attached to a VM
//!   by passthrough or hot-plugged after the client started. A lowered N is a GPU
//!   falling off the bus (XID 79): its handles answer `GPU_IS_LOST` at once, and the
//!   next `nvmlInit` no longer lists it, as after the driver is reloaded without it.
//! - `mig.G=I,J,…` (or `mig.G=` for none): the MIG instances of GPU G that exist, by
//!   their position in the scenario's list, as `nvidia-smi mig -cgi/-dgi`, the GPU
//!   operator's mig-manager or a DRA driver creates and destroys them. They take effect
//!   at once, as on a real driver: `nvmlDeviceGetMigDeviceHandleByIndex` enumerates
//!   the instances that exist, and the handle of a destroyed one answers
//!   `INVALID_ARGUMENT`. The MIG mode stays what the scenario says.
//!
//! A GPU or MIG instance the file does not mention exists. No file: everything exists.

use crate::cue::Watched;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// Environment variable naming the device-set file.
pub const DEVICES_FILE_ENV: &str = "GPU_SIM_DEVICES_FILE";

/// Which of the scenario's devices exist.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSet {
    /// The first N GPUs exist; `None`: all.
    pub gpus: Option<u32>,
    /// GPU index → positions of its MIG instances that exist; a GPU not here has all.
    pub mig: BTreeMap<u32, Vec<usize>>,
}

impl DeviceSet {
    pub fn gpu_exists(&self, gpu: u32) -> bool {
        self.gpus.is_none_or(|n| gpu < n)
    }

    pub fn mig_exists(&self, gpu: u32, position: usize) -> bool {
        self.mig.get(&gpu).is_none_or(|p| p.contains(&position))
    }
}

/// Parse the file's text; the second part lists the lines that are not understood.
pub fn parse(text: &str) -> (DeviceSet, Vec<String>) {
    let mut set = DeviceSet::default();
    let mut bad = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let parsed = line.split_once('=').and_then(|(key, value)| {
            let (key, value) = (key.trim(), value.trim());
            if key == "gpus" {
                set.gpus = Some(value.parse().ok()?);
                return Some(());
            }
            let gpu = key.strip_prefix("mig.")?.parse().ok()?;
            let positions = value
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<usize>>>()?;
            set.mig.insert(gpu, positions);
            Some(())
        });
        if parsed.is_none() {
            bad.push(line.to_string());
        }
    }
    (set, bad)
}

struct State {
    file: Watched,
    set: DeviceSet,
    reported: Vec<String>,
}

static STATE: Mutex<State> = Mutex::new(State {
    file: Watched::new(),
    set: DeviceSet {
        gpus: None,
        mig: BTreeMap::new(),
    },
    reported: Vec::new(),
});

/// Run `f` on the device set in force now.
pub fn with<R>(f: impl FnOnce(&DeviceSet) -> R) -> R {
    let Some(path) = std::env::var_os(DEVICES_FILE_ENV).map(PathBuf::from) else {
        return f(&DeviceSet::default());
    };
    let mut s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(text) = s.file.changed(&path) {
        let (set, bad) = parse(&text);
        for line in bad {
            if !s.reported.contains(&line) {
                eprintln!(
                    "fake-nvml: {}: {line:?} is not a device-set line (gpus=N, mig.G=I,J)",
                    path.display()
                );
                s.reported.push(line);
            }
        }
        s.set = set;
    }
    f(&s.set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_sets_parse_and_unknown_lines_are_reported() {
        let (set, bad) = parse("gpus=2 # two left\nmig.0=0, 2\nmig.1=\nexplode\nmig.x=1\n");
        assert_eq!(set.gpus, Some(2));
        assert!(set.gpu_exists(1) && !set.gpu_exists(2));
        assert!(set.mig_exists(0, 2) && !set.mig_exists(0, 1));
        // Listed with nothing: none; not listed: all.
        assert!(!set.mig_exists(1, 0));
        assert!(set.mig_exists(3, 5));
        assert_eq!(bad, ["explode", "mig.x=1"]);
        assert_eq!(parse("").0, DeviceSet::default());
    }

    /// The only test here that initialises the library: the environment it sets is the
    /// process's.
    #[test]
    fn devices_come_and_go_as_on_a_real_driver() {
        use crate::ffi::{GPU_IS_LOST, INVALID_ARGUMENT, NOT_FOUND, SUCCESS};
        use crate::mig::nvmlDeviceGetMigDeviceHandleByIndex;
        use crate::system::{
            nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlInit_v2, nvmlShutdown,
        };
        use nvml_wrapper_sys::bindings::nvmlDevice_t;
        use std::time::{Duration, Instant};

        let dir = std::env::temp_dir().join(format!("fake-nvml-devices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (scenario, cue) = (dir.join("node.toml"), dir.join("devices"));
        std::fs::write(
            &scenario,
            "[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\nmig = [{ profile = \"1g.10gb\", count = 3 }]\n\n\
             [[gpus]]\nmodel = \"NVIDIA L4\"\n",
        )
        .unwrap();
        let set = |text: &str| {
            let tmp = cue.with_extension("tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, &cue).unwrap();
        };
        set("gpus=1\nmig.0=0,2\n");
        // SAFETY: no other test of this crate reads the environment.
        unsafe {
            std::env::set_var(crate::state::SCENARIO_ENV, &scenario);
            std::env::set_var(DEVICES_FILE_ENV, &cue);
        }
        // Poll `f` until it answers `want` (the cue is looked at every CHECK_EVERY).
        let until = |what: &str, want: u32, mut f: Box<dyn FnMut() -> u32 + '_>| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let got = f();
                if got == want {
                    return;
                }
                assert!(Instant::now() < deadline, "{what}: {got}, want {want}");
                std::thread::sleep(crate::cue::CHECK_EVERY);
            }
        };
        // SAFETY: the out-pointers are valid locals.
        unsafe {
            assert_eq!(nvmlInit_v2(), SUCCESS);
            let mut count = 0;
            assert_eq!(nvmlDeviceGetCount_v2(&mut count), SUCCESS);
            assert_eq!(count, 1, "one GPU listed at init");
            let mut gpu: nvmlDevice_t = std::ptr::null_mut();
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut gpu), INVALID_ARGUMENT);
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut gpu), SUCCESS);
            let mig = |i| {
                let mut h: nvmlDevice_t = std::ptr::null_mut();
                (nvmlDeviceGetMigDeviceHandleByIndex(gpu, i, &mut h), h)
            };
            // Two instances, dense from index 0; the second is the scenario's third.
            let (first, third) = (mig(0).1, mig(1).1);
            assert_eq!(mig(2).0, NOT_FOUND);
            let uuid = |h| {
                let mut buf = [0 as std::ffi::c_char; 96];
                crate::device::nvmlDeviceGetUUID(h, buf.as_mut_ptr(), buf.len() as u32)
            };
            assert_eq!(uuid(third), SUCCESS);
            // The third destroyed: its handle is no handle any more; the first stays.
            set("gpus=1\nmig.0=0\n");
            until(
                "destroyed instance's UUID",
                INVALID_ARGUMENT,
                Box::new(|| uuid(third)),
            );
            assert_eq!(uuid(first), SUCCESS);
            assert_eq!(mig(1).0, NOT_FOUND);
            // A second GPU shows only from the next initialisation, as NVML enumerates.
            set("gpus=2\n");
            until("MIG instances back", SUCCESS, Box::new(|| mig(2).0));
            assert_eq!(nvmlDeviceGetCount_v2(&mut count), SUCCESS);
            assert_eq!(count, 1);
            assert_eq!(nvmlShutdown(), SUCCESS);
            assert_eq!(nvmlInit_v2(), SUCCESS);
            assert_eq!(nvmlDeviceGetCount_v2(&mut count), SUCCESS);
            assert_eq!(count, 2);
            // It falls off the bus: its handle answers GPU_IS_LOST at once.
            let mut l4: nvmlDevice_t = std::ptr::null_mut();
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut l4), SUCCESS);
            assert_eq!(uuid(l4), SUCCESS);
            // (Another size than the last file, whatever the clock's resolution.)
            set("gpus=1 # GPU 1 lost\n");
            until("lost GPU's UUID", GPU_IS_LOST, Box::new(|| uuid(l4)));
            assert_eq!(nvmlShutdown(), SUCCESS);
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
