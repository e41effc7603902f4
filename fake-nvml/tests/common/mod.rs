//! Shared by the integration tests: find the built fake library, load it with the real
//! `nvml-wrapper` for one scenario per test process, and compute what `gpu-sim` says
//! the same scenario reports.
#![allow(dead_code)]

use gpu_sim::{Scenario, SimNode};
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

/// The cdylib cargo built alongside this test: `<target>/<profile>/libnvidia_ml.so`.
/// Test binaries live in `<target>/<profile>/deps/`; fall back to `CARGO_TARGET_DIR` or
/// the workspace's `target/debug`.
pub fn lib_path() -> PathBuf {
    const NAME: &str = "libnvidia_ml.so";
    // `cargo build` puts the cdylib in target/<profile>; plain `cargo test` leaves it in
    // target/<profile>/deps, beside this test binary, without updating the first: so
    // deps first, or a test could load a stale library and pass against old code.
    if let Some(deps) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.to_path_buf()))
    {
        for dir in [Some(deps.clone()), deps.parent().map(Path::to_path_buf)]
            .into_iter()
            .flatten()
        {
            if dir.join(NAME).exists() {
                return dir.join(NAME);
            }
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("debug").join(NAME);
    assert!(
        path.exists(),
        "{} not found: build it with `cargo build -p fake-nvml`",
        path.display()
    );
    path
}

/// A scenario file under `tests/scenarios/`.
pub fn scenario_path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(file)
}

/// Point the fake library at a scenario (read by the next `nvmlInit` that loads it).
///
/// Only the one-scenario-per-process helpers below and single-test files call this, so
/// no other thread of the test process touches the environment at the same time.
pub fn set_scenario(scenario: &str, frozen_at_s: Option<f64>) {
    // SAFETY: see above: no concurrent environment access in these test processes.
    unsafe {
        std::env::set_var("GPU_SIM_SCENARIO", scenario);
        match frozen_at_s {
            Some(t) => std::env::set_var("GPU_SIM_FROZEN_AT_S", t.to_string()),
            None => std::env::remove_var("GPU_SIM_FROZEN_AT_S"),
        }
    }
}

/// Initialise NVML from the fake library.
pub fn try_init() -> Result<Nvml, NvmlError> {
    let path = lib_path();
    Nvml::builder().lib_path(path.as_os_str()).init()
}

/// The test process's one NVML instance, for `file` frozen at `frozen_at_s` (or on the
/// real clock when `None`), and when it was initialised.
pub fn shared(file: &str, frozen_at_s: Option<f64>) -> &'static (Nvml, Instant) {
    static NVML: OnceLock<(Nvml, Instant)> = OnceLock::new();
    NVML.get_or_init(|| {
        set_scenario(scenario_path(file).to_str().unwrap(), frozen_at_s);
        let started = Instant::now();
        (try_init().expect("nvmlInit on the fake library"), started)
    })
}

/// What gpu-sim says the scenario reports at `t`.
pub fn model(file: &str, t: f64) -> SimNode {
    let s = Scenario::load(&scenario_path(file)).expect("scenario loads");
    let mut node = SimNode::new(&s, SystemTime::now());
    node.freeze_at(t);
    node
}
