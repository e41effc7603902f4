//! The fake NVML answers every NVML client, not only ours: a sweep of nvidia-ml-py's
//! whole getter surface (`tests/fidelity/sweep.py`) finds no missing function, and its
//! sampled answers equal the gpu-sim model's; gpustat and nvitop run against it and
//! show the scenario's values without logging a missing function.
//!
//! Needs python3 with nvidia-ml-py, gpustat and nvitop: `bash tests/setup.sh`.

use super::nvml_fidelity::{ld_library_path, lib_dir, require_pynvml};
use e2e_tests::{fixture, workspace};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// `nvmlDeviceArchitecture_t` of Hopper.
const HOPPER: u32 = 9;
/// `NVML_GPU_FABRIC_STATE_COMPLETED` (nvml.h).
const FABRIC_STATE_COMPLETED: u64 = 3;

/// Scenario second every run here is frozen at, so the model and the tools agree.
const FROZEN_AT_S: f64 = 60.0;

fn run_python(lib_dir: &Path, scenario: &str, args: &[&str]) -> Output {
    Command::new("python3")
        .args(args)
        .current_dir(workspace())
        .env("LD_LIBRARY_PATH", ld_library_path(lib_dir))
        .env("GPU_SIM_SCENARIO", scenario)
        .env("GPU_SIM_FROZEN_AT_S", FROZEN_AT_S.to_string())
        .env("TERM", "dumb")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("run python3 {args:?}: {e}"))
}

fn stdout_of(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The model's node at the frozen instant.
fn model(scenario: &str) -> gpu_sim::SimNode {
    let s = gpu_sim::Scenario::load(Path::new(scenario)).expect("scenario");
    let mut node = gpu_sim::SimNode::new(&s, std::time::SystemTime::now());
    node.freeze_at(FROZEN_AT_S);
    node
}

fn sweep(scenario: &str) -> Value {
    require_pynvml();
    let out = run_python(&lib_dir(), scenario, &["tests/fidelity/sweep.py"]);
    let stdout = stdout_of(&out, "sweep.py");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("sweep.py printed no JSON ({e})"))
}

/// No bound symbol is missing and no getter call ends in FUNCTION_NOT_FOUND (or is
/// refused by pynvml before reaching the library), INSUFFICIENT_SIZE (pynvml sizes its
/// buffers as the driver documents, so that is a protocol mismatch) or UNKNOWN (a panic
/// caught in the library).
fn assert_every_getter_answered(doc: &Value) {
    let missing = &doc["symbols"]["missing"];
    assert_eq!(
        missing.as_array().map(Vec::len),
        Some(0),
        "symbols pynvml binds that the fake lacks: {missing}"
    );
    let bound = doc["symbols"]["bound"].as_u64().unwrap_or(0);
    assert!(bound > 400, "pynvml binds only {bound} symbols?");
    let calls = doc["calls"].as_object().expect("calls");
    assert!(calls.len() > 200, "only {} getters swept", calls.len());
    let unanswered: Vec<String> = calls
        .iter()
        .filter(|(_, outcomes)| {
            outcomes.as_object().is_some_and(|o| {
                o.keys().any(|k| {
                    ["FunctionNotFound", "InsufficientSize", "Unknown"].contains(&k.as_str())
                        || k.starts_with("skipped")
                })
            })
        })
        .map(|(name, outcomes)| format!("{name}: {outcomes}"))
        .collect();
    assert!(
        unanswered.is_empty(),
        "getters not answered, or answered wrongly:\n{}",
        unanswered.join("\n")
    );
}

fn u64_at(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number: {}", v[key]))
}

/// The sampled answers equal the model's facts and readings.
fn assert_values_match_model(doc: &Value, node: &gpu_sim::SimNode) {
    let values = doc["values"].as_array().expect("values");
    assert_eq!(values.len(), node.gpus.len());
    for (i, (v, g)) in values.iter().zip(&node.gpus).enumerate() {
        let m = g.model;
        let b = &m.board;
        let r = node.gpu_reading(i as u32, FROZEN_AT_S);
        let ctx = format!("GPU {i} ({}): {v}", m.name);
        if node.gpu_lost(i as u32, FROZEN_AT_S) {
            assert_eq!(v["name"]["error"], "NVMLError_GpuIsLost", "{ctx}");
            continue;
        }
        assert_eq!(v["name"], m.name, "{ctx}");
        assert_eq!(
            u64_at(v, "max_sm_clock"),
            u64::from(m.max_sm_clock_mhz),
            "{ctx}"
        );
        assert_eq!(
            u64_at(v, "boost_clock"),
            u64::from(m.max_sm_clock_mhz),
            "{ctx}"
        );
        assert_eq!(
            u64_at(v, "max_video_clock"),
            u64::from(b.max_video_clock_mhz),
            "{ctx}"
        );
        assert_eq!(
            u64_at(v, "app_clock_mem"),
            u64::from(m.mem_clock_mhz),
            "{ctx}"
        );
        if g.mig.is_empty() {
            assert_eq!(
                u64_at(v, "current_sm_clock"),
                u64::from(r.sm_clock_mhz),
                "{ctx}"
            );
            assert_eq!(
                u64_at(v, "clock_info_sm"),
                u64::from(r.sm_clock_mhz),
                "{ctx}"
            );
        }
        assert_eq!(u64_at(v, "temperature"), u64::from(r.gpu_temp_c), "{ctx}");
        assert_eq!(u64_at(v, "pcie_gen"), u64::from(b.pcie_generation), "{ctx}");
        assert_eq!(
            u64_at(v, "pcie_gen_max"),
            u64::from(b.pcie_generation),
            "{ctx}"
        );
        assert_eq!(u64_at(v, "pcie_width"), u64::from(b.pcie_width), "{ctx}");
        assert_eq!(
            u64_at(v, "shutdown_temp"),
            u64::from(b.shutdown_temp_c),
            "{ctx}"
        );
        assert_eq!(
            u64_at(v, "slowdown_temp"),
            u64::from(b.slowdown_temp_c),
            "{ctx}"
        );
        assert_eq!(v["part_number"], b.part_number, "{ctx}");
        assert_eq!(u64_at(v, "bar1_total"), b.bar1_mib << 20, "{ctx}");
        assert_eq!(u64_at(v, "cores"), u64::from(b.cuda_cores), "{ctx}");
        let (major, minor) = b.cuda_capability;
        assert_eq!(v["cuda_cc"], serde_json::json!([major, minor]), "{ctx}");
        assert_eq!(
            v["power_limits"],
            serde_json::json!([b.min_power_limit_mw, m.power_limit_mw]),
            "{ctx}"
        );
        // SXM boards have no fans.
        assert_eq!(v["fan"]["error"], "NVMLError_NotSupported", "{ctx}");
        if m.nvlink_links > 0 {
            assert_eq!(
                u64_at(v, "nvlink_link_count"),
                u64::from(m.nvlink_links),
                "{ctx}"
            );
            assert_eq!(
                u64_at(v, "nvlink_version"),
                u64::from(b.nvlink_version),
                "{ctx}"
            );
        }
        // Hopper NVLink boards report a completed fabric registration; others have none.
        if m.nvlink_links > 0 && m.architecture == HOPPER {
            assert_eq!(u64_at(v, "fabric_state"), FABRIC_STATE_COMPLETED, "{ctx}");
        } else {
            assert_eq!(
                v["fabric_state"]["error"], "NVMLError_NotSupported",
                "{ctx}"
            );
        }
        let mut pids: Vec<u64> = node
            .gpu_processes(i as u32, FROZEN_AT_S)
            .iter()
            .map(|p| u64::from(p.pid))
            .collect();
        pids.sort_unstable();
        assert_eq!(v["compute_pids"], serde_json::json!(pids), "{ctx}");
        assert_eq!(v["detail_pids"], serde_json::json!(pids), "{ctx}");
        assert_eq!(v["graphics_pids"], serde_json::json!([]), "{ctx}");
    }
}

#[test]
fn nvml_every_pynvml_getter_is_answered_on_eight_gpus() {
    let scenario = "builtin:default";
    let doc = sweep(scenario);
    assert_eq!(doc["gpus"], 8);
    assert_every_getter_answered(&doc);
    assert_values_match_model(&doc, &model(scenario));
}

#[test]
fn nvml_every_pynvml_getter_is_answered_on_mig_devices() {
    let scenario = fixture("golden-node.toml").display().to_string();
    let doc = sweep(&scenario);
    assert!(
        doc["migs"].as_u64().unwrap_or(0) > 0,
        "no MIG devices swept"
    );
    assert_every_getter_answered(&doc);
    assert_values_match_model(&doc, &model(&scenario));
}

/// Lines a tool printed that name an NVML failure other than NOT_SUPPORTED.
fn nvml_complaints(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            l.contains("FunctionNotFound")
                || l.contains("Function Not Found")
                || l.contains("NVMLError")
                || l.contains("Traceback")
        })
        .collect()
}

fn require_tool(module: &str) {
    let out = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{module} cannot be imported; run `bash tests/setup.sh`:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn nvml_gpustat_shows_the_scenario() {
    require_tool("gpustat");
    let scenario = "builtin:default";
    let out = run_python(&lib_dir(), scenario, &["-m", "gpustat", "--json"]);
    let stdout = stdout_of(&out, "gpustat --json");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        nvml_complaints(&stderr).is_empty(),
        "gpustat complained:\n{stderr}"
    );
    let doc: Value = serde_json::from_str(&stdout).expect("gpustat JSON");
    let node = model(scenario);
    assert_eq!(doc["driver_version"], node.driver_version.as_str());
    let gpus = doc["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), node.gpus.len());
    for (i, (v, g)) in gpus.iter().zip(&node.gpus).enumerate() {
        let r = node.gpu_reading(i as u32, FROZEN_AT_S);
        assert_eq!(v["uuid"], g.uuid.as_str(), "{v}");
        assert_eq!(v["name"], g.model.name, "{v}");
        assert_eq!(u64_at(v, "memory.total"), r.memory.total >> 20, "{v}");
        assert_eq!(u64_at(v, "memory.used"), r.memory.used >> 20, "{v}");
        assert_eq!(
            v["utilization.gpu"],
            serde_json::json!(r.gpu_util_percent),
            "{v}"
        );
        assert_eq!(u64_at(v, "temperature.gpu"), u64::from(r.gpu_temp_c), "{v}");
        assert_eq!(u64_at(v, "power.draw"), u64::from(r.power_mw / 1000), "{v}");
        assert!(v["fan.speed"].is_null(), "SXM boards have no fan: {v}");
    }
}

#[test]
fn nvml_nvitop_shows_the_scenario() {
    require_tool("nvitop");
    let scenario = "builtin:default";
    let node = model(scenario);
    // Its Python API: the values nvitop's screens are drawn from, one JSON line per GPU.
    let script = r#"
import json, logging
logging.basicConfig(level=logging.WARNING)
from nvitop import Device
for d in Device.all():
    print(json.dumps({
        "uuid": d.uuid(), "name": d.name(), "memory_total": d.memory_total(),
        "memory_used": d.memory_used(), "gpu_util": d.gpu_utilization(),
        "sm_clock": d.sm_clock(), "video_clock": d.video_clock(),
        "max_sm_clock": d.max_sm_clock(), "fan": d.fan_speed(),
        "temperature": d.temperature(), "pids": sorted(d.processes()),
        "nvlink_links": d.nvlink_link_count(),
        "performance_state": d.performance_state(),
    }))
"#;
    let out = run_python(&lib_dir(), scenario, &["-c", script]);
    let stdout = stdout_of(&out, "nvitop API");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        nvml_complaints(&stderr).is_empty(),
        "nvitop logged:\n{stderr}"
    );
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(rows.len(), node.gpus.len());
    for (i, (v, g)) in rows.iter().zip(&node.gpus).enumerate() {
        let m = g.model;
        let r = node.gpu_reading(i as u32, FROZEN_AT_S);
        assert_eq!(v["uuid"], g.uuid.as_str(), "{v}");
        assert_eq!(v["name"], m.name, "{v}");
        assert_eq!(u64_at(v, "memory_total"), r.memory.total, "{v}");
        assert_eq!(v["gpu_util"], serde_json::json!(r.gpu_util_percent), "{v}");
        assert_eq!(u64_at(v, "sm_clock"), u64::from(r.sm_clock_mhz), "{v}");
        assert_eq!(
            u64_at(v, "max_sm_clock"),
            u64::from(m.max_sm_clock_mhz),
            "{v}"
        );
        let video = u64::from(m.board.max_video_clock_mhz) * u64::from(r.sm_clock_mhz)
            / u64::from(m.max_sm_clock_mhz);
        assert_eq!(u64_at(v, "video_clock"), video, "{v}");
        assert_eq!(u64_at(v, "temperature"), u64::from(r.gpu_temp_c), "{v}");
        assert_eq!(u64_at(v, "nvlink_links"), u64::from(m.nvlink_links), "{v}");
        assert_eq!(v["fan"], "N/A", "{v}");
        assert_eq!(v["performance_state"], "P0", "{v}");
        let pids: Vec<u64> = node
            .gpu_processes(i as u32, FROZEN_AT_S)
            .iter()
            .map(|p| u64::from(p.pid))
            .collect();
        let mut pids = pids;
        pids.sort_unstable();
        assert_eq!(v["pids"], serde_json::json!(pids), "{v}");
    }
    // The one-shot screen: runs, names every GPU's bus ID, logs nothing.
    let out = run_python(&lib_dir(), scenario, &["-m", "nvitop", "--once"]);
    let screen = stdout_of(&out, "nvitop --once");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        nvml_complaints(&screen).is_empty() && nvml_complaints(&stderr).is_empty(),
        "nvitop --once:\n{screen}\n{stderr}"
    );
    for g in &node.gpus {
        assert!(
            screen.contains(&g.pci_bus_id),
            "{} missing:\n{screen}",
            g.pci_bus_id
        );
    }
}

/// nvitop draws a MIG device's BAR1 (a crash if the driver does not answer it on a MIG
/// handle) with its profile and instance IDs.
#[test]
fn nvml_nvitop_shows_mig_devices() {
    require_tool("nvitop");
    let scenario = "builtin:big-node";
    let node = model(scenario);
    let out = run_python(&lib_dir(), scenario, &["-m", "nvitop", "--once"]);
    let screen = stdout_of(&out, "nvitop --once");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        nvml_complaints(&screen).is_empty() && nvml_complaints(&stderr).is_empty(),
        "nvitop --once:\n{screen}\n{stderr}"
    );
    let mut instances = 0;
    for (i, g) in node.gpus.iter().enumerate() {
        for (k, m) in g.mig.iter().enumerate() {
            let line = screen
                .lines()
                .find(|l| l.contains(&format!("{i}:{k} ")))
                .unwrap_or_else(|| panic!("no line for MIG device {i}:{k}:\n{screen}"));
            assert!(line.contains(m.profile.name), "{line}");
            let ids = format!(
                "GI/CI:{:>2}/{:<2}",
                m.gpu_instance_id, m.compute_instance_id
            );
            assert!(line.contains(&ids), "{ids} not in {line}");
            assert!(line.contains("BAR1:"), "{line}");
            instances += 1;
        }
    }
    assert!(instances > 0, "the scenario has no MIG devices");
}
