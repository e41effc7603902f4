//! `GPU_SIM_COST_MODEL=h100-580` and `h200-580`: the CPU time a plan of calls costs on
//! the fake equals the sum of the real driver's medians in the fixture the model is read
//! from.
//!
//! The plan is the exporter's steady cycle with dcgm-exporter's default counters on one
//! whole GPU (the calls `nvml_calls::` budgets), on each model's own machine as a
//! scenario: its cost is measured as the calling
//! thread's CPU time with the model on minus the same with it off (the fake's own work),
//! each in a child process of this test binary (the model is read once per process),
//! the minimum of several repetitions, so a loaded machine does not move it.

mod common;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::sys_exports::field_id::*;
use std::path::Path;
use std::process::Command;

/// Each model and the fixture directory it is read from.
const MODELS: &[(&str, &str)] = &[
    (
        "h100-580",
        "../tests/fixtures/real-gpu/h100-80gb-hbm3-580.159.04",
    ),
    (
        "h200-580",
        "../tests/fixtures/real-gpu/h200-141gb-hbm3e-580.159.04",
    ),
];
const CHILD_ENV: &str = "COST_MODEL_TEST_CHILD";
/// The child's fixture directory.
const FIXTURE_ENV: &str = "COST_MODEL_TEST_FIXTURE";
const REPEATS: usize = 7;

/// dcgm-exporter's five GPM metrics, as `nvml-latency.py` timed them together.
const GPM_FIVE: [GpmMetricId; 5] = [
    GpmMetricId::DramBwUtil,
    GpmMetricId::GraphicsUtil,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::PcieRxPerSec,
    GpmMetricId::PcieTxPerSec,
];

/// The field IDs of the exporter's one field-values call for the default counters:
/// memory temperature, energy, remapped rows (correctable, uncorrectable, failure).
const FIELDS: [u32; 5] = [
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_UNC,
    NVML_FI_DEV_REMAPPED_FAILURE,
];

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One default-counter cycle on GPU 0, as the exporter makes it.
fn cycle(nvml: &Nvml, s1: &nvml_wrapper::GpmSample, s2: &nvml_wrapper::GpmSample) {
    nvml.device_count().unwrap();
    let d = nvml.device_by_index(0).unwrap();
    d.memory_info().unwrap();
    d.clock_info(Clock::SM).unwrap();
    d.clock_info(Clock::Memory).unwrap();
    d.decoder_utilization().unwrap();
    d.encoder_utilization().unwrap();
    d.pcie_replay_counter().unwrap();
    d.power_usage().unwrap();
    d.temperature(TemperatureSensor::Gpu).unwrap();
    d.utilization_rates().unwrap();
    d.mig_device_count().unwrap();
    let ids: Vec<_> = FIELDS
        .iter()
        .map(|&i| nvml_wrapper::structs::device::FieldId(i))
        .collect();
    for v in d.field_values_for(&ids).unwrap() {
        v.unwrap();
    }
    // The exporter reuses its two samples: take one into the older, as it does.
    // SAFETY: valid device and sample handles of this library.
    let r = unsafe { nvml.lib().nvmlGpmSampleGet(d.handle(), s2.handle()) };
    assert_eq!(r, 0);
    nvml_wrapper::gpm::gpm_metrics_get(nvml, s1, s2, &GPM_FIVE).unwrap();
}

/// The `nvmlDeviceGetHandleByIndex_v2` of `device_by_index` is not in the exporter's
/// cycle (it keeps handles); the child measures it alone and takes it off.
fn handle_lookup(nvml: &Nvml) {
    nvml.device_by_index(0).unwrap();
}

/// In a child: the least CPU time of a cycle, less a handle lookup, over REPEATS.
fn measure() -> u64 {
    let fixture = std::env::var(FIXTURE_ENV).expect("the fixture directory");
    common::set_scenario(
        &format!("{}/{fixture}/scenario.toml", env!("CARGO_MANIFEST_DIR")),
        Some(100.0),
    );
    let nvml = common::try_init().expect("init");
    let d = nvml.device_by_index(0).unwrap();
    let s1 = d.gpm_sample().unwrap();
    let s2 = d.gpm_sample().unwrap();
    cycle(&nvml, &s1, &s2);
    let min = |f: &dyn Fn()| {
        (0..REPEATS)
            .map(|_| {
                let t = thread_cpu_ns();
                f();
                thread_cpu_ns() - t
            })
            .min()
            .unwrap()
    };
    let whole = min(&|| cycle(&nvml, &s1, &s2));
    let lookup = min(&|| handle_lookup(&nvml));
    whole.saturating_sub(lookup)
}

#[test]
fn child() {
    if std::env::var_os(CHILD_ENV).is_some() {
        println!("CPU_NS {}", measure());
    }
}

fn run_child(model: Option<&str>, fixture: &str) -> u64 {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(FIXTURE_ENV, fixture);
    match model {
        Some(m) => cmd.env("GPU_SIM_COST_MODEL", m),
        None => cmd.env_remove("GPU_SIM_COST_MODEL"),
    };
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The test harness prints "test child ... " on the same line.
    text.split("CPU_NS ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no measurement: {text}"))
        .parse()
        .unwrap()
}

/// The fixture's medians of the plan's calls, in ns, read here on their own. GPM: the
/// fresh-pair file's sample and metrics where the fixture has one (`gpm-fresh-pairs.py`),
/// each metric alone where the latency file times them so, else its five together.
fn fixture_sum(fixture: &str) -> u64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(fixture);
    let read = |name: &str| -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(dir.join(name)).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    };
    let doc = read("nvml-latency.json").expect("nvml-latency.json");
    let fresh = read("gpm-fresh-pairs.json");
    let gpm = |key: &str| -> Option<f64> {
        fresh
            .as_ref()
            .and_then(|f| f["gpm"][key]["median_us"].as_f64())
            .or_else(|| doc["gpm"][key]["median_us"].as_f64())
    };
    let us = |section: &str, key: &str| -> f64 {
        doc[section][key]["median_us"]
            .as_f64()
            .unwrap_or_else(|| panic!("{section}.{key} not in the fixture"))
    };
    let field = |id: u32| -> f64 {
        let fields = doc["field_values"].as_object().unwrap();
        fields
            .values()
            .filter(|v| v["id"].as_u64() == Some(u64::from(id)))
            .map(|v| v["median_us"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min)
    };
    let getters = [
        "nvmlDeviceGetCount",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMaxMigDeviceCount",
    ];
    let total: f64 = getters.iter().map(|g| us("getters", g)).sum::<f64>()
        + FIELDS.iter().map(|&f| field(f)).sum::<f64>()
        + gpm("nvmlGpmSampleGet").expect("the GPM sample")
        + GPM_FIVE
            .iter()
            .map(|m| gpm(&format!("nvmlGpmMetricsGet(metric {})", m.as_c())))
            .sum::<Option<f64>>()
            .unwrap_or_else(|| us("gpm", "nvmlGpmMetricsGet(5 metrics)"));
    (total * 1000.0) as u64
}

#[test]
fn a_default_counter_cycle_costs_the_real_drivers_medians() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    for (model, fixture) in MODELS {
        let expected = fixture_sum(fixture);
        let (on, off) = (run_child(Some(model), fixture), run_child(None, fixture));
        let modelled = on.saturating_sub(off);
        let ratio = modelled as f64 / expected as f64;
        println!(
            "{model}: modelled {modelled} ns (on {on}, off {off}), fixture {expected} ns, ratio {ratio:.3}"
        );
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{model}: modelled cycle {modelled} ns vs the fixture's {expected} ns (ratio {ratio:.3})"
        );
    }
}

#[test]
fn an_unknown_model_fails_init() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture"])
        .env(CHILD_ENV, "1")
        .env(FIXTURE_ENV, MODELS[0].1)
        .env("GPU_SIM_COST_MODEL", "h100-999");
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "init passed with an unknown model: {stdout}"
    );
    assert!(
        stderr.contains("fake-nvml: GPU_SIM_COST_MODEL=\"h100-999\" is not a cost model; the models are: h100-580, h200-580"),
        "{stderr}"
    );
}
