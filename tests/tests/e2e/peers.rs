//! Peer NVML tools on the fake `libnvidia-ml.so.1`: nvitop-exporter (PyPI) and all-smi
//! (crates.io, `all-smi api`), as a user of either would run them on a GPU node. Each
//! reads the big node (8 H100s, 4 in MIG mode) frozen at one instant and must
//!   - serve it without logging a missing NVML function (nvitop at debug log level, so
//!     its symbol probes show too), and
//!   - report, per GPU, the name, memory, utilisation, clocks, temperature and power the
//!     gpu-sim model gives for that instant.
//!
//! all-smi looks for an NVIDIA controller with `lspci` before it loads NVML: the test
//! puts `tests/fake-bin` (a stand-in `lspci` listing the fake's GPUs) first on PATH.
//!
//! `bash tests/setup.sh` installs both, pinned, under the target dir's `peers/` or
//! `PEERS_DIR` (tests/install-peers.sh); a missing tool fails the test, never skips it.

use e2e_tests::{
    Process, fake_nvml, free_port, scratch_dir, series_values, target_profile_dir, try_get,
    workspace,
};
use gpu_sim::models::ModelProfile;
use gpu_sim::{GpuReading, Scenario, SimNode};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SCENARIO: &str = "big-node";
const FROZEN_AT_S: f64 = 100.0;

/// What a tool logs when the library lacks a function it calls or probes for:
/// nvitop's `FunctionNotFound` error and its debug line for a failed symbol probe,
/// nvml-wrapper's `FailedToLoadSymbol`, and the dynamic loader's message.
const MISSING_FUNCTION: &[&str] = &[
    "FunctionNotFound",
    "Function Not Found",
    "Failed to find symbol",
    "FailedToLoadSymbol",
    "undefined symbol",
];

/// An installed peer tool under `PEERS_DIR` (tests/install-peers.sh's), by default the
/// target dir's `peers/`.
fn peer_tool(relative: &str) -> PathBuf {
    let dir = std::env::var_os("PEERS_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            target_profile_dir()
                .parent()
                .expect("target/<profile> has a parent")
                .join("peers")
        });
    let path = dir.join(relative);
    assert!(
        path.exists(),
        "{} is not installed; run `bash tests/setup.sh` (tests/install-peers.sh)",
        path.display()
    );
    path
}

/// A directory with `libnvidia-ml.so.1` and `libnvidia-ml.so` pointing at the fake, for
/// `LD_LIBRARY_PATH` (NVML clients open one or the other).
fn lib_dir() -> PathBuf {
    let dir = scratch_dir("peers-lib");
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        std::os::unix::fs::symlink(fake_nvml(), dir.join(name)).expect("symlink the fake");
    }
    dir
}

fn prepend_path(var: &str, dir: &Path) -> String {
    match std::env::var(var) {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    }
}

/// A peer's command with the fake library and the frozen scenario in its environment.
fn with_fake(program: &Path, lib_dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("LD_LIBRARY_PATH", prepend_path("LD_LIBRARY_PATH", lib_dir))
        .env(
            "PATH",
            prepend_path("PATH", &workspace().join("tests/fake-bin")),
        )
        .env("GPU_SIM_SCENARIO", format!("builtin:{SCENARIO}"))
        .env("GPU_SIM_FROZEN_AT_S", FROZEN_AT_S.to_string())
        .env_remove("GPU_SIM_CALL_COUNTS");
    cmd
}

/// The model's view of the node at the frozen instant.
fn model() -> SimNode {
    let scenario = Scenario::builtin(SCENARIO).expect("built-in scenario");
    SimNode::new(&scenario, std::time::UNIX_EPOCH)
}

/// Wait until `/metrics` carries `marker` for every GPU of the model (`label` names the
/// GPU index label); returns that body.
fn scrape_when_complete(
    process: &mut Process,
    url: &str,
    marker: &str,
    label: &str,
    gpus: u32,
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        if let Some(status) = process.exited() {
            panic!("the tool exited ({status}); its log:\n{}", process.log());
        }
        if let Ok((status, body)) = try_get(url, &[]) {
            if status == 200
                && (0..gpus)
                    .all(|g| !series_values(&body, marker, &[(label, &g.to_string())]).is_empty())
            {
                return body;
            }
            last = body;
        }
        // The tool's own log and last answer say why, where a bare timeout would not.
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after 60 s waiting for {url} serving {marker} for {gpus} GPUs; \
             last body:\n{}\nlog tail:\n{}",
            last.lines()
                .filter(|l| l.contains(marker))
                .collect::<Vec<_>>()
                .join("\n"),
            process
                .log()
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn assert_no_missing_function(tool: &str, log: &str) {
    let missing: Vec<&str> = log
        .lines()
        .filter(|l| MISSING_FUNCTION.iter().any(|m| l.contains(m)))
        .collect();
    assert!(
        missing.is_empty(),
        "{tool} reports NVML functions missing from the fake:\n{}",
        missing.join("\n")
    );
}

/// One sample per GPU: `name` with the GPU's index label, compared with the model.
fn assert_gpu_value(
    tool: &str,
    body: &str,
    name: &str,
    labels: &[(&str, &str)],
    want: f64,
    tolerance: f64,
) {
    let got = series_values(body, name, labels);
    assert_eq!(
        got.len(),
        1,
        "{tool}: one {name} sample for {labels:?}, got {got:?}"
    );
    assert!(
        (got[0] - want).abs() <= tolerance,
        "{tool}: {name}{labels:?} = {} but the model says {want}",
        got[0]
    );
}

/// The fields both peers report, from the model.
struct Expected {
    index: String,
    model: &'static ModelProfile,
    reading: GpuReading,
    mig: bool,
}

fn expected() -> Vec<Expected> {
    let node = model();
    node.gpus
        .iter()
        .map(|g| Expected {
            index: g.index.to_string(),
            model: g.model,
            reading: node.gpu_reading(g.index, FROZEN_AT_S),
            mig: !g.mig.is_empty(),
        })
        .collect()
}

const MIB: f64 = 1048576.0;

#[test]
fn nvitop_exporter_serves_the_simulated_gpus_without_missing_functions() {
    let program = peer_tool("nvitop-venv/bin/nvitop-exporter");
    let lib = lib_dir();
    let port = free_port();
    let mut cmd = with_fake(&program, &lib);
    // At debug level nvitop also writes nvitop.log into its working directory.
    cmd.current_dir(scratch_dir("nvitop-exporter"))
        .args(["--bind-address", "127.0.0.1", "--port", &port.to_string()])
        .args(["--interval", "1"])
        // nvitop's own logger: debug shows every failed symbol probe too.
        .env("LOGLEVEL", "DEBUG");
    let mut process = Process::spawn(cmd);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let want = expected();
    let body = scrape_when_complete(
        &mut process,
        &url,
        "gpu_temperature_C",
        "index",
        want.len() as u32,
    );

    for e in &want {
        let r = &e.reading;
        let labels = [("index", e.index.as_str()), ("devicename", e.model.name)];
        let check = |name: &str, want: f64, tolerance: f64| {
            assert_gpu_value("nvitop-exporter", &body, name, &labels, want, tolerance)
        };
        check(
            "gpu_memory_total_MiB",
            (r.memory.total as f64 / MIB).round(),
            0.5,
        );
        check(
            "gpu_memory_used_MiB",
            (r.memory.used as f64 / MIB).round(),
            0.5,
        );
        check("gpu_temperature_C", f64::from(r.gpu_temp_c), 0.0);
        check("gpu_power_usage_W", f64::from(r.power_mw) / 1000.0, 1e-9);
        check(
            "gpu_power_limit_W",
            f64::from(r.power_limit_mw) / 1000.0,
            1e-9,
        );
        check("gpu_clock_sm_MHz", f64::from(r.sm_clock_mhz), 0.0);
        check("gpu_clock_memory_MHz", f64::from(r.mem_clock_mhz), 0.0);
        // A MIG-enabled GPU reports no utilisation (NOT_SUPPORTED): nvitop shows NaN.
        match (r.gpu_util_percent, e.mig) {
            (Some(util), false) => check("gpu_utilization_Percentage", f64::from(util), 0.0),
            _ => {
                let got = series_values(&body, "gpu_utilization_Percentage", &labels);
                assert!(
                    got.len() == 1 && got[0].is_nan(),
                    "nvitop-exporter: MIG GPU {} utilisation should be N/A, got {got:?}",
                    e.index
                );
            }
        }
        // The model bounds the video clock by the board's maximum.
        let video = series_values(&body, "gpu_clock_video_MHz", &labels);
        assert!(
            video.len() == 1
                && video[0] > 0.0
                && video[0] <= f64::from(e.model.board.max_video_clock_mhz),
            "nvitop-exporter: GPU {} video clock should be read, up to {} MHz, got {video:?}",
            e.index,
            e.model.board.max_video_clock_mhz
        );
    }
    assert_no_missing_function("nvitop-exporter", &process.log());
}

#[test]
fn all_smi_api_serves_the_simulated_gpus_without_missing_functions() {
    let program = peer_tool("all-smi/bin/all-smi");
    let lib = lib_dir();
    let scratch = scratch_dir("all-smi-home");
    let port = free_port();
    let mut cmd = with_fake(&program, &lib);
    cmd.current_dir(&scratch)
        .args(["api", "--port", &port.to_string(), "--interval", "1"])
        // Its energy journal and config live under these: keep them in the scratch dir.
        .env("XDG_CACHE_HOME", scratch.join("cache"))
        .env("XDG_CONFIG_HOME", scratch.join("config"))
        .env("HOME", &scratch)
        .env("RUST_LOG", "debug");
    let mut process = Process::spawn(cmd);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let want = expected();
    let body = scrape_when_complete(
        &mut process,
        &url,
        "all_smi_gpu_temperature_celsius",
        "gpu_index",
        want.len() as u32,
    );

    for e in &want {
        let r = &e.reading;
        let labels = [("gpu_index", e.index.as_str()), ("gpu", e.model.name)];
        let check = |name: &str, want: f64, tolerance: f64| {
            assert_gpu_value("all-smi", &body, name, &labels, want, tolerance)
        };
        check("all_smi_gpu_memory_total_bytes", r.memory.total as f64, 0.0);
        check("all_smi_gpu_memory_used_bytes", r.memory.used as f64, 0.0);
        check(
            "all_smi_gpu_temperature_celsius",
            f64::from(r.gpu_temp_c),
            0.0,
        );
        check(
            "all_smi_gpu_power_consumption_watts",
            f64::from(r.power_mw) / 1000.0,
            1e-9,
        );
        check("all_smi_gpu_frequency_mhz", f64::from(r.sm_clock_mhz), 0.0);
        if let (Some(util), false) = (r.gpu_util_percent, e.mig) {
            check("all_smi_gpu_utilization", f64::from(util), 0.0);
        }
        // Board facts, each from its own NVML getter (thresholds, max customer boost
        // clocks, power limit).
        let board = &e.model.board;
        check(
            "all_smi_gpu_temperature_threshold_slowdown_celsius",
            f64::from(board.slowdown_temp_c),
            0.0,
        );
        check(
            "all_smi_gpu_temperature_threshold_shutdown_celsius",
            f64::from(board.shutdown_temp_c),
            0.0,
        );
        check(
            "all_smi_gpu_temperature_threshold_max_operating_celsius",
            f64::from(board.gpu_max_operating_temp_c),
            0.0,
        );
        check(
            "all_smi_gpu_clock_graphics_max_mhz",
            f64::from(e.model.max_sm_clock_mhz),
            0.0,
        );
        // all-smi reads it from nvmlDeviceGetMaxCustomerBoostClock(MEM), which the real
        // driver answers NOT_SUPPORTED (H100, 580.159.04: only graphics and SM have a
        // customer boost clock), so it serves none, as on a real node.
        let memory_max = series_values(&body, "all_smi_gpu_clock_memory_max_mhz", &labels);
        assert!(
            memory_max.is_empty(),
            "all-smi: no memory boost clock exists, yet it serves {memory_max:?} for {labels:?}"
        );
        check(
            "all_smi_gpu_power_limit_current_watts",
            f64::from(r.power_limit_mw) / 1000.0,
            1e-9,
        );
        // The PCIe link generation is a label of the info series.
        let generation = board.pcie_generation.to_string();
        let mut info_labels = labels.to_vec();
        info_labels.push(("pcie_generation", generation.as_str()));
        assert_eq!(
            series_values(&body, "all_smi_gpu_info", &info_labels).len(),
            1,
            "all-smi: GPU {} info should say PCIe generation {generation}",
            e.index
        );
        // The P-state (nvmlDeviceGetPerformanceState) is served when the fake answers it.
        assert_eq!(
            series_values(&body, "all_smi_gpu_performance_state", &labels).len(),
            1,
            "all-smi: GPU {} has no performance state",
            e.index
        );
    }
    assert_no_missing_function("all-smi", &process.log());
}
