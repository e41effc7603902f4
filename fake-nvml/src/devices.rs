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
}
