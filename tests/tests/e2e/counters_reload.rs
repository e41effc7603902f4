//! The counters CSV without a restart (issue 17): a changed file, a SIGHUP and a
//! changed ConfigMap (`-m NAMESPACE:NAME`, read through the API server) change the
//! served series; a bad new list keeps the old one, says why with file and line, and
//! `gpu_exporter_config_last_reload_successful` reads 0 in Prometheus until fixed.

use e2e_tests::{
    Exporter, Process, Prometheus, binary, fake_nvml, fixture, sample_value, samples, scratch_dir,
    try_query_value, wait_for, workspace,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::process::Command;
use std::time::Duration;

const TWO: &str = "# temperature and power\n\
DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (C).\n\
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (W).\n";
const THREE: &str = "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (C).\n\
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (W).\n\
DCGM_FI_DEV_FB_USED, gauge, Framebuffer used (MiB).\n";
/// Line 2 names no DCGM field.
const BAD: &str = "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (C).\n\
DCGM_FI_DEV_NO_SUCH_FIELD, gauge, nothing.\n";

fn fake_gpus(args: &[&str]) -> Exporter {
    let lib = fake_nvml().display().to_string();
    let mut all = vec!["--nvml-lib", &lib, "-c", "200"];
    all.extend(args);
    let scenario = fixture("pods-node.toml").display().to_string();
    Exporter::start(
        &all,
        &[
            ("GPU_SIM_SCENARIO", &scenario),
            ("GPU_SIM_FROZEN_AT_S", "60"),
        ],
    )
}

fn sighup(p: &Process) {
    let ok = Command::new("kill")
        .args(["-HUP", &p.pid().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok);
}

/// The metric names Prometheus has series of, among `names`.
fn present(prom: &Prometheus, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|n| !prom.query(&format!("{n}{{job=\"gpu\"}}")).is_empty())
        .map(|n| n.to_string())
        .collect()
}

fn prom_value(prom: &Prometheus, q: &str) -> Option<f64> {
    prom.query(q).first().and_then(try_query_value)
}

const NAMES: [&str; 3] = [
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_FB_USED",
];

#[test]
fn the_counters_file_reloads_on_change_and_sighup_and_a_bad_one_keeps_the_old() {
    let dir = scratch_dir("counters-reload");
    let csv = dir.join("counters.csv");
    std::fs::write(&csv, TWO).unwrap();
    let csv_arg = csv.display().to_string();
    let mut e = fake_gpus(&["-f", &csv_arg]);
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("gpu", &target, "")]);
    wait_for("two metrics in Prometheus", Duration::from_secs(30), || {
        (present(&prom, &NAMES) == NAMES[..2]).then_some(())
    });
    assert_eq!(
        prom_value(&prom, "gpu_exporter_config_last_reload_successful"),
        Some(1.0)
    );

    // A third metric: served without a restart.
    std::fs::write(&csv, THREE).unwrap();
    wait_for(
        "the added metric in Prometheus",
        Duration::from_secs(30),
        || (present(&prom, &NAMES) == NAMES).then_some(()),
    );
    let pid = e.process.pid();

    // A bad list: the old one stays, the log names file and line, the metric says so.
    std::fs::write(&csv, BAD).unwrap();
    let line = e
        .process
        .wait_for_line("DCGM_FI_DEV_NO_SUCH_FIELD", Duration::from_secs(20));
    assert!(line.contains(&format!("{}:2:", csv.display())), "{line}");
    wait_for(
        "the failed reload in Prometheus",
        Duration::from_secs(30),
        || {
            (prom_value(&prom, "gpu_exporter_config_last_reload_successful") == Some(0.0))
                .then_some(())
        },
    );
    let body = e.metrics();
    assert!(
        !samples(&body, "DCGM_FI_DEV_FB_USED").is_empty(),
        "the running counters stay"
    );

    // SIGHUP after a fix that the poll has not seen yet (same content as before the
    // bad one is fine either way): the reload succeeds and the process lives on.
    std::fs::write(&csv, TWO).unwrap();
    sighup(&e.process);
    wait_for("a successful reload", Duration::from_secs(30), || {
        let body = e.metrics();
        (sample_value(&body, "gpu_exporter_config_last_reload_successful") == Some(1.0)
            && samples(&body, "DCGM_FI_DEV_FB_USED").is_empty()
            && !samples(&body, "DCGM_FI_DEV_POWER_USAGE").is_empty())
        .then_some(())
    });
    assert!(
        e.process.exited().is_none(),
        "SIGHUP does not end the exporter"
    );
    assert_eq!(e.process.pid(), pid);
}

#[test]
fn sighup_with_the_built_in_counters_reloads_and_keeps_serving() {
    let mut e = fake_gpus(&[]);
    e.metrics_after_samples(2);
    sighup(&e.process);
    e.process.wait_for_line(
        "SIGHUP: built-in counters reloaded",
        Duration::from_secs(20),
    );
    let body = e.metrics_after_samples(4);
    assert_eq!(
        sample_value(&body, "gpu_exporter_config_last_reload_successful"),
        Some(1.0)
    );
    assert!(e.process.exited().is_none());
}

fn counters_map(text: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("counters".into()),
            namespace: Some("gpu-exporter".into()),
            ..ObjectMeta::default()
        },
        data: Some([("metrics".to_string(), text.to_string())].into()),
        ..ConfigMap::default()
    }
}

#[test]
fn counters_come_from_a_configmap_over_the_file_and_follow_its_changes() {
    let api = kube_sim::apiserver::FakeApiServer::start().expect("fake API server");
    let dir = scratch_dir("counters-configmap");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    // The file says three metrics; the ConfigMap, which wins, two.
    let csv = dir.join("counters.csv");
    std::fs::write(&csv, THREE).unwrap();
    let csv = csv.display().to_string();
    api.apply_config_map(counters_map(TWO));
    let mut e = fake_gpus(&[
        "-m",
        "gpu-exporter:counters",
        "-f",
        &csv,
        "--kubeconfig",
        &kubeconfig,
    ]);
    let body = e.metrics_after_samples(2);
    assert!(!samples(&body, "DCGM_FI_DEV_POWER_USAGE").is_empty());
    assert!(
        samples(&body, "DCGM_FI_DEV_FB_USED").is_empty(),
        "the ConfigMap wins over -f"
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/gpu-exporter/configmaps/counters")),
        "{:?}",
        api.requests()
    );

    // Changed in the API server: picked up by the poll, no restart, no signal.
    api.apply_config_map(counters_map(THREE));
    wait_for(
        "the ConfigMap's new metric",
        Duration::from_secs(40),
        || (!samples(&e.metrics(), "DCGM_FI_DEV_FB_USED").is_empty()).then_some(()),
    );

    // The key removed: the running counters stay and the reload is reported failed
    // (a SIGHUP asks at once).
    let mut broken = counters_map(THREE);
    broken.data = Some([("other".to_string(), THREE.to_string())].into());
    api.apply_config_map(broken);
    sighup(&e.process);
    let line = e
        .process
        .wait_for_line("has no \"metrics\" key", Duration::from_secs(20));
    assert!(line.contains("configmap/gpu-exporter/counters"), "{line}");
    let body = e.metrics_after_samples(1);
    wait_for("the failed reload", Duration::from_secs(20), || {
        (sample_value(&e.metrics(), "gpu_exporter_config_last_reload_successful") == Some(0.0))
            .then_some(())
    });
    assert!(!samples(&body, "DCGM_FI_DEV_FB_USED").is_empty());
}

#[test]
fn a_missing_configmap_stops_startup() {
    let api = kube_sim::apiserver::FakeApiServer::start().expect("fake API server");
    let dir = scratch_dir("counters-configmap-missing");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let mut cmd = Command::new(binary("gpu-exporter"));
    cmd.current_dir(workspace())
        .args([
            "--nvml-lib",
            &fake_nvml().display().to_string(),
            "-a",
            "127.0.0.1:0",
            "-m",
            "gpu-exporter:absent",
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ])
        .env("GPU_SIM_SCENARIO", fixture("pods-node.toml"));
    let mut p = Process::spawn(cmd);
    assert_ne!(p.wait_exit(Duration::from_secs(30)), Some(0));
    let log = p.log();
    assert!(
        log.contains("configmap/gpu-exporter/absent does not exist"),
        "{log}"
    );
    assert!(!log.contains("listening"), "{log}");
}
