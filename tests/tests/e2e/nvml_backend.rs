//! The real NVML code path (nvml-wrapper → the fake libnvidia-ml built by this
//! workspace) end to end: the exporter through NVML must say exactly what it says on the
//! simulated source for the same scenario and instant, and carry the scenario's values;
//! events, lost GPUs, driver outages and a missing driver behave as specified.

use e2e_tests::{
    Exporter, assert_matches_scenario, fake_nvml, get, sample_value, series_values, wait_for,
};
use std::time::Duration;

/// Lines that legitimately differ between two exporter processes.
pub(crate) fn comparable(body: &str) -> Vec<String> {
    const PROCESS_LOCAL: &[&str] = &[
        "gpu_exporter_samples_total",
        "gpu_exporter_sample_duration_seconds",
        "gpu_exporter_scrape_duration_seconds",
        "gpu_exporter_last_sample_timestamp_seconds",
        "gpu_exporter_config_last_reload_success_timestamp_seconds",
        "gpu_exporter_build_info",
        // NVML stamps an XID when it arrives; the simulation at its scenario time.
        "gpu_exporter_xid_last_seen_timestamp_seconds",
    ];
    let mut v: Vec<String> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| !PROCESS_LOCAL.iter().any(|p| l.starts_with(p)))
        .map(|l| match l.strip_prefix("gpu_exporter_gpu_up{gpu=\"") {
            // A GPU lost before discovery: NVML cannot tell its identity, only its index.
            Some(rest) if l.ends_with("} 0") => {
                let index = rest.split('"').next().unwrap_or_default();
                format!("gpu_exporter_gpu_up{{gpu=\"{index}\"}} 0")
            }
            _ => l.to_string(),
        })
        .collect();
    v.sort();
    v
}

pub(crate) fn difference(a: &[String], b: &[String]) -> String {
    let only_a: Vec<&String> = a.iter().filter(|l| !b.contains(l)).take(5).collect();
    let only_b: Vec<&String> = b.iter().filter(|l| !a.contains(l)).take(5).collect();
    format!("only simulated: {only_a:#?}\nonly NVML: {only_b:#?}")
}

fn parity(scenario: &str, frozen_at: &str) {
    let lib = fake_nvml();
    let lib = lib.to_str().expect("utf-8 path");
    let common = [
        "-f",
        "tests/fixtures/all-fields.csv",
        "--process-metrics",
        "-c",
        "100",
    ];
    let env = [
        ("GPU_SIM_SCENARIO", scenario),
        ("GPU_SIM_FROZEN_AT_S", frozen_at),
    ];
    let nvml = Exporter::start(&[&["--nvml-lib", lib][..], &common].concat(), &env);
    let simulate = format!("--simulate={scenario}");
    let sim = Exporter::start(&[&[simulate.as_str()][..], &common].concat(), &env);
    let expected = comparable(&sim.metrics_after_samples(3));
    // XIDs reach the NVML path through the event thread: wait until it has caught up.
    let mut last = Vec::new();
    let same = wait_for_opt(Duration::from_secs(20), || {
        last = comparable(&nvml.metrics_after_samples(3));
        last == expected
    });
    assert!(
        same,
        "NVML and simulated output differ for {scenario}:\n{}",
        difference(&expected, &last)
    );

    let body = nvml.metrics();
    let scenario = gpu_sim::Scenario::load(&fixture_or_builtin(scenario)).expect("scenario");
    assert_matches_scenario(&body, &scenario, frozen_at.parse().expect("seconds"));
}

fn fixture_or_builtin(s: &str) -> std::path::PathBuf {
    if s.starts_with("builtin:") {
        s.into()
    } else {
        e2e_tests::workspace().join(s)
    }
}

/// Poll until `f` holds or the time is up; whether it held.
fn wait_for_opt(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn mixed_node_with_mig_faults_and_xids_matches_the_simulation() {
    parity("tests/fixtures/golden-node.toml", "60");
}

#[test]
fn plain_eight_gpu_node_matches_the_simulation() {
    parity("builtin:default", "45");
}

/// GB200 NVL72 tray inside its fault window: a link down, an unhealthy fabric route.
#[test]
fn gb200_nvl72_links_and_fabric_match_the_simulation() {
    parity("builtin:gb200-nvl72", "100");
}

#[test]
fn big_mig_node_matches_the_simulation() {
    parity("builtin:big-node", "100");
}

#[test]
fn gpm_less_gpus_match_the_simulation_and_have_no_profiling_series() {
    parity("tests/fixtures/gpm-less.toml", "30");
    let nvml = Exporter::start(
        &["--nvml-lib", fake_nvml().to_str().expect("utf-8")],
        &[
            ("GPU_SIM_SCENARIO", "tests/fixtures/gpm-less.toml"),
            ("GPU_SIM_FROZEN_AT_S", "30"),
        ],
    );
    let body = nvml.metrics_after_samples(3);
    assert!(
        series_values(&body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[]).is_empty(),
        "absent, not zero"
    );
    assert!(series_values(&body, "DCGM_FI_DEV_MEMORY_TEMP", &[("gpu", "2")]).is_empty());
    assert_eq!(
        series_values(&body, "DCGM_FI_DEV_MEMORY_TEMP", &[("gpu", "0")]).len(),
        1
    );
    // Not-supported answers are remembered, not counted as errors.
    assert!(!body.contains("gpu_exporter_field_errors_total"), "{body}");
}

/// From the scenario: how many times each (gpu, GPU instance, code) XID happens, and
/// each GPU's last XID code.
type XidCounts = std::collections::BTreeMap<(u32, Option<u32>, u64), f64>;

fn scenario_xids(path: &str) -> (XidCounts, std::collections::BTreeMap<u32, u64>) {
    let scenario = gpu_sim::Scenario::load(&e2e_tests::workspace().join(path)).expect("scenario");
    let mut xids: Vec<(f64, u32, Option<u32>, u64)> = scenario
        .faults
        .iter()
        .filter_map(|f| match *f {
            gpu_sim::Fault::Xid {
                at_s,
                gpu,
                code,
                gpu_instance,
            } => Some((at_s, gpu, gpu_instance, code)),
            _ => None,
        })
        .collect();
    xids.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut counts = XidCounts::new();
    let mut last = std::collections::BTreeMap::new();
    for (_, gpu, instance, code) in xids {
        *counts.entry((gpu, instance, code)).or_default() += 1.0;
        last.insert(gpu, code);
    }
    (counts, last)
}

#[test]
fn xids_are_counted_once_and_a_lost_gpu_leaves_the_others_flowing() {
    const SCENARIO: &str = "tests/fixtures/events-and-loss.toml";
    let (expected, last_code) = scenario_xids(SCENARIO);
    assert!(
        expected.values().any(|&n| n > 1.0),
        "the scenario repeats an XID, so a counter stuck at 1 fails"
    );
    let e = Exporter::start(
        &[
            "--nvml-lib",
            fake_nvml().to_str().expect("utf-8"),
            "-c",
            "200",
        ],
        &[("GPU_SIM_SCENARIO", SCENARIO)],
    );
    let counted = |body: &str| -> XidCounts {
        expected
            .keys()
            .filter_map(|&(gpu, instance, code)| {
                let gpu_label = gpu.to_string();
                let instance_label = instance.map(|i| i.to_string());
                let code_label = code.to_string();
                let mut labels = vec![("gpu", gpu_label.as_str()), ("xid", code_label.as_str())];
                if let Some(i) = &instance_label {
                    labels.push(("GPU_I_ID", i.as_str()));
                }
                match series_values(body, "gpu_exporter_xid_errors_total", &labels)[..] {
                    [value] => Some(((gpu, instance, code), value)),
                    _ => None,
                }
            })
            .collect()
    };
    let seen_at = wait_for(
        "every XID and the lost GPU",
        Duration::from_secs(20),
        || {
            let body = e.metrics();
            let lost = series_values(&body, "gpu_exporter_gpu_up", &[("gpu", "2")]) == vec![0.0];
            (counted(&body) == expected && lost)
                .then(|| sample_value(&body, "gpu_exporter_samples_total"))
        },
    )
    .expect("samples counter");
    // Several cycles later each XID is still counted as often as it happened.
    let later = wait_for("five more cycles", Duration::from_secs(20), || {
        let body = e.metrics();
        (sample_value(&body, "gpu_exporter_samples_total")? >= seen_at + 5.0).then_some(body)
    });
    assert_eq!(counted(&later), expected);
    // The gauge carries each GPU's last XID code; a MIG instance's XID shows on its
    // parent GPU's gauge, as dcgm-exporter maps it, while the counter keeps the instance.
    for (gpu, code) in &last_code {
        assert_eq!(
            series_values(
                &later,
                "DCGM_FI_DEV_XID_ERRORS",
                &[("gpu", &gpu.to_string()), ("err_code", &code.to_string())]
            ),
            vec![*code as f64],
            "GPU {gpu}"
        );
    }
    // The other GPUs keep flowing; the lost one has no series but its health.
    assert_eq!(
        series_values(&later, "DCGM_FI_DEV_POWER_USAGE", &[("gpu", "0")]).len(),
        1
    );
    assert_eq!(
        series_values(
            &later,
            "DCGM_FI_DEV_FB_USED",
            &[("gpu", "1"), ("GPU_I_ID", "1")]
        )
        .len(),
        1
    );
    assert!(series_values(&later, "DCGM_FI_DEV_POWER_USAGE", &[("gpu", "2")]).is_empty());
    assert_eq!(
        get(&e.url("/readyz")).0,
        200,
        "one lost GPU does not make the node unready"
    );
}

#[test]
fn a_driver_outage_through_nvml_flips_readiness_and_recovers() {
    let e = Exporter::start(
        &[
            "--nvml-lib",
            fake_nvml().to_str().expect("utf-8"),
            "-c",
            "200",
        ],
        &[("GPU_SIM_SCENARIO", "tests/fixtures/driver-outage.toml")],
    );
    let ready = || get(&e.url("/readyz")).0;
    wait_for("ready", Duration::from_secs(10), || {
        (ready() == 200).then_some(())
    });
    wait_for(
        "not ready during the outage",
        Duration::from_secs(10),
        || (ready() == 503).then_some(()),
    );
    assert_eq!(
        sample_value(&e.metrics(), "gpu_exporter_source_up"),
        Some(0.0)
    );
    wait_for("ready again", Duration::from_secs(20), || {
        (ready() == 200).then_some(())
    });
    assert_eq!(
        series_values(&e.metrics(), "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]),
        vec![40.0]
    );
}

#[test]
fn a_hung_nvml_call_is_reported_and_the_exporter_recovers() {
    let e = Exporter::start(
        &[
            "--nvml-lib",
            fake_nvml().to_str().expect("utf-8"),
            "-c",
            "200",
        ],
        &[("GPU_SIM_SCENARIO", "tests/fixtures/driver-hang.toml")],
    );
    let ready = || get(&e.url("/readyz")).0;
    wait_for("ready", Duration::from_secs(10), || {
        (ready() == 200).then_some(())
    });
    wait_for("the source reported hung", Duration::from_secs(10), || {
        let body = e.metrics();
        (sample_value(&body, "gpu_exporter_source_hung")? == 1.0 && ready() == 503).then_some(())
    });
    wait_for("recovered", Duration::from_secs(20), || {
        let body = e.metrics();
        (sample_value(&body, "gpu_exporter_source_hung")? == 0.0 && ready() == 200).then_some(())
    });
    assert_eq!(
        series_values(&e.metrics(), "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]),
        vec![40.0]
    );
}

#[test]
fn a_driver_that_is_not_loaded_is_reported_and_the_exporter_keeps_serving() {
    for (args, env) in [
        (
            vec!["--nvml-lib".to_string(), fake_nvml().display().to_string()],
            vec![("GPU_SIM_SCENARIO", "tests/fixtures/init-failure.toml")],
        ),
        (
            vec![
                "--nvml-lib".to_string(),
                "/nonexistent/libnvidia-ml.so.1".to_string(),
            ],
            vec![],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let e = Exporter::start(&[&args[..], &["-c", "200"]].concat(), &env);
        let body = e.metrics_after_samples(2);
        assert_eq!(sample_value(&body, "gpu_exporter_source_up"), Some(0.0));
        assert!(
            sample_value(&body, "gpu_exporter_sample_failures_total").is_some_and(|v| v >= 1.0)
        );
        assert_eq!(get(&e.url("/readyz")).0, 503);
        assert_eq!(get(&e.url("/healthz")).0, 200);
        let log = e.process.log();
        assert!(log.contains("cannot initialise NVML"), "{log}");
        // Said once, not once per cycle.
        assert_eq!(
            log.matches("GPU driver is not answering").count(),
            1,
            "{log}"
        );
    }
}
