//! dcgm-exporter's optional series metadata (issue 17): pod labels by allow-list regex,
//! `pod_uid`, `--kubernetes-virtual-gpus` (`vgpu`) and HPC job mapping (`hpc_job`), on
//! the fake libnvidia-ml and a simulated Kubernetes node (fake kubelet, fake API
//! server), checked on `/metrics` and through a real Prometheus.

use e2e_tests::{
    Exporter, KubeNode, Process, Prometheus, binary, fake_nvml, fixture, line_value, sample_value,
    samples, scratch_dir, wait_for, workspace,
};
use std::process::Command;
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/pods-node.toml";
const T: f64 = 60.0;

fn sim() -> gpu_sim::SimNode {
    let s = gpu_sim::Scenario::load(&fixture("pods-node.toml")).expect("scenario");
    let mut n = gpu_sim::SimNode::new(&s, std::time::SystemTime::now());
    n.freeze_at(T);
    n
}

/// The exporter on the fake NVML with the scenario's GPUs; with `node`, attributing
/// them to its pods.
fn exporter(node: Option<&KubeNode>, extra: &[&str]) -> Exporter {
    let lib = fake_nvml().display().to_string();
    let mut args: Vec<String> = ["--nvml-lib", &lib, "-c", "200"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(node) = node {
        args.extend(
            [
                "-k",
                "--kubernetes-refresh-interval",
                "200ms",
                "--pod-resources-kubelet-socket",
                &node.socket().display().to_string(),
                "--kubeconfig",
                &node.kubeconfig().display().to_string(),
                "--proc-root",
                &node.proc_root().display().to_string(),
            ]
            .map(String::from),
        );
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let scenario = fixture("pods-node.toml").display().to_string();
    Exporter::start(
        &args,
        &[
            ("NODE_NAME", "node-a"),
            ("GPU_SIM_SCENARIO", &scenario),
            ("GPU_SIM_FROZEN_AT_S", "60"),
        ],
    )
}

/// A scrape once the kubelet and the pod watch are up and `pred` holds.
fn scrape_when(e: &Exporter, what: &str, pred: impl Fn(&str) -> bool) -> String {
    wait_for(what, Duration::from_secs(30), || {
        let body = e.metrics();
        (sample_value(&body, "gpu_exporter_kubelet_up") == Some(1.0)
            && sample_value(&body, "gpu_exporter_pod_watch_up") == Some(1.0)
            && pred(&body))
        .then_some(body)
    })
}

/// The samples of `name` on the GPU with `uuid` (its MIG instances left out).
fn on_gpu<'a>(body: &'a str, name: &str, uuid: &str) -> Vec<&'a str> {
    samples(body, name)
        .into_iter()
        .filter(|l| l.contains(&format!("UUID=\"{uuid}\"")) && !l.contains("GPU_I_ID="))
        .collect()
}

/// The pod UID the API server holds for `namespace/name`: the oracle for `pod_uid`.
fn uid_of(node: &KubeNode, namespace: &str, name: &str) -> String {
    node.api()
        .pods()
        .into_iter()
        .find(|p| p.namespace == namespace && p.name == name)
        .unwrap_or_else(|| panic!("pod {namespace}/{name} in the API server"))
        .uid
}

#[test]
fn pod_labels_by_regex_and_pod_uid_reach_prometheus() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let n = sim();
    // Only the regex-selected keys: the default --kubernetes-pod-labels keys are
    // emptied, so an `app` label would mean the allow-list is not applied.
    let e = exporter(
        Some(&node),
        &[
            "--kubernetes-enable-pod-labels",
            "--kubernetes-pod-label-allowlist-regex=^team$,hash",
            "--kubernetes-pod-labels=",
            "--kubernetes-enable-pod-uid",
        ],
    );
    let body = scrape_when(&e, "pod labels", |b| b.contains("pod=\"share-b\""));
    let train_uid = uid_of(&node, "ml", "train-0");
    let gpu0 = on_gpu(&body, "DCGM_FI_DEV_POWER_USAGE", &n.gpus[0].uuid);
    assert_eq!(gpu0.len(), 1, "{gpu0:#?}");
    assert!(
        gpu0[0].contains(&format!(
            "DCGM_FI_DRIVER_VERSION=\"580.82.07\",team=\"nlp\",container=\"trainer\",namespace=\"ml\",pod=\"train-0\",pod_uid=\"{train_uid}\"}}"
        )),
        "{}",
        gpu0[0]
    );
    // The shared GPU's per-pod shares: the key matched by `hash`, sanitised.
    let share_a_uid = uid_of(&node, "inference", "share-a");
    let util3 = on_gpu(&body, "DCGM_FI_DEV_GPU_UTIL", &n.gpus[3].uuid);
    assert!(
        util3.iter().any(|l| l.contains(&format!(
            "pod_template_hash=\"7c9f8d6b5\",container=\"server\",namespace=\"inference\",pod=\"share-a\",pod_uid=\"{share_a_uid}\"}}"
        ))),
        "{util3:#?}"
    );
    assert!(
        !body.contains("app=\"") && !body.contains("app_kubernetes_io_name="),
        "keys no pattern matches are not copied"
    );

    // Through Prometheus: the UID selects the pod's series.
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("gpu", &target, "")]);
    let found = wait_for(
        "the pod_uid series in Prometheus",
        Duration::from_secs(30),
        || {
            let r = prom.query(&format!(
                "DCGM_FI_DEV_POWER_USAGE{{pod_uid=\"{train_uid}\"}}"
            ));
            (!r.is_empty()).then_some(r)
        },
    );
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["metric"]["pod"], "train-0");
    assert_eq!(found[0]["metric"]["team"], "nlp");
}

#[test]
fn named_pod_label_keys_and_enabled_pod_labels_combine() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let n = sim();
    // The default key list (app, app.kubernetes.io/name, …) plus keys matching ^team$.
    let e = exporter(
        Some(&node),
        &[
            "--kubernetes-enable-pod-labels",
            "--kubernetes-pod-label-allowlist-regex",
            "^team$",
        ],
    );
    let body = scrape_when(&e, "pod labels", |b| b.contains("pod=\"train-0\""));
    let gpu0 = on_gpu(&body, "DCGM_FI_DEV_POWER_USAGE", &n.gpus[0].uuid);
    assert_eq!(gpu0.len(), 1);
    assert!(
        gpu0[0].contains(
            "DCGM_FI_DRIVER_VERSION=\"580.82.07\",app=\"trainer\",app_kubernetes_io_name=\"bert\",team=\"nlp\",container=\"trainer\",namespace=\"ml\",pod=\"train-0\"}"
        ),
        "{}",
        gpu0[0]
    );
    assert!(!body.contains("pod_uid="), "pod_uid only when asked");
}

#[test]
fn a_bad_allowlist_regex_stops_startup_naming_it() {
    let mut cmd = Command::new(binary("gpu-exporter"));
    cmd.current_dir(workspace())
        .args([
            "--nvml-lib",
            &fake_nvml().display().to_string(),
            "-a",
            "127.0.0.1:0",
            "-k",
            "--kubernetes-enable-pod-labels",
            "--kubernetes-pod-label-allowlist-regex=team,(unclosed",
        ])
        .env("GPU_SIM_SCENARIO", fixture("pods-node.toml"));
    let mut p = Process::spawn(cmd);
    let code = p.wait_exit(Duration::from_secs(20));
    assert_ne!(code, Some(0));
    let log = p.log();
    assert!(
        log.contains("\"(unclosed\"") && log.contains("--kubernetes-pod-label-allowlist-regex"),
        "{log}"
    );
    assert!(!log.contains("listening"), "{log}");
}

#[test]
fn virtual_gpus_repeat_a_shared_gpus_series_per_pod_with_vgpu() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let n = sim();
    let e = exporter(
        Some(&node),
        &["--kubernetes-virtual-gpus", "--kubernetes-enable-pod-uid"],
    );
    let body = scrape_when(&e, "vgpu series", |b| b.contains("vgpu=\"1\""));
    // GPU 3 is time-sliced: replicas 0 and 1 held by share-a and share-b.
    let power = on_gpu(&body, "DCGM_FI_DEV_POWER_USAGE", &n.gpus[3].uuid);
    assert_eq!(
        power.len(),
        2,
        "one series per pod, none for the device alone: {power:#?}"
    );
    for (line, (pod, replica)) in power.iter().zip([("share-a", 0), ("share-b", 1)]) {
        let uid = uid_of(&node, "inference", pod);
        assert!(
            line.contains(&format!(
                "DCGM_FI_DRIVER_VERSION=\"580.82.07\",container=\"server\",namespace=\"inference\",pod=\"{pod}\",pod_uid=\"{uid}\",vgpu=\"{replica}\"}}"
            )),
            "{line}"
        );
    }
    assert_eq!(
        line_value(power[0]).expect("a value"),
        line_value(power[1]).expect("a value"),
        "copies of one device value"
    );
    // The split metrics keep their per-pod shares and the remainder: they still sum
    // to the device's utilisation in the scenario.
    let util: f64 = on_gpu(&body, "DCGM_FI_DEV_GPU_UTIL", &n.gpus[3].uuid)
        .iter()
        .map(|l| line_value(l).expect("a value"))
        .sum();
    assert_eq!(
        util,
        f64::from(n.gpu_reading(3, T).gpu_util_percent.expect("utilisation"))
    );
    // A GPU no pod uses keeps its one unlabelled series; a GPU held whole has no vgpu.
    let gpu2 = on_gpu(&body, "DCGM_FI_DEV_POWER_USAGE", &n.gpus[2].uuid);
    assert_eq!(gpu2.len(), 1);
    assert!(!gpu2[0].contains("pod="));
    let gpu0 = on_gpu(&body, "DCGM_FI_DEV_POWER_USAGE", &n.gpus[0].uuid);
    assert!(gpu0.len() == 1 && gpu0[0].contains("pod=\"train-0\"") && !gpu0[0].contains("vgpu="));
}

#[test]
fn hpc_jobs_label_series_and_follow_the_mapping_files() {
    let n = sim();
    let dir = scratch_dir("hpc-jobs");
    let gi = n.gpus[2].mig[0].gpu_instance_id;
    std::fs::write(dir.join("0"), "1001\n1002\n").unwrap();
    std::fs::write(dir.join(format!("2.{gi}")), "2001\n").unwrap();
    let dir_arg = dir.display().to_string();
    let mut e = exporter(None, &["--hpc-job-mapping-dir", &dir_arg]);
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("gpu", &target, "")]);
    let jobs_of = |query: &str| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = prom
            .query(query)
            .iter()
            .map(|r| {
                (
                    r["metric"]["gpu"].as_str().unwrap_or_default().to_string(),
                    r["metric"]["hpc_job"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let q = "DCGM_FI_DEV_FB_USED{hpc_job!=\"\"}";
    let want = vec![
        ("0".to_string(), "1001".to_string()),
        ("0".to_string(), "1002".to_string()),
        ("2".to_string(), "2001".to_string()),
    ];
    wait_for("jobs in Prometheus", Duration::from_secs(30), || {
        (jobs_of(q) == want).then_some(())
    });
    // The MIG instance's series carries the job, its parent GPU's does not.
    let body = e.metrics();
    let mig_line = samples(&body, "DCGM_FI_DEV_FB_USED")
        .into_iter()
        .find(|l| l.contains("hpc_job=\"2001\""))
        .expect("the MIG job series");
    assert!(
        mig_line.contains(&format!("GPU_I_ID=\"{gi}\"")),
        "{mig_line}"
    );
    // GPU 0's two copies carry its one value.
    let gpu0 = on_gpu(&body, "DCGM_FI_DEV_FB_USED", &n.gpus[0].uuid);
    assert_eq!(gpu0.len(), 2);
    assert_eq!(
        line_value(gpu0[0]).expect("a value"),
        line_value(gpu0[1]).expect("a value")
    );

    // Job 1002 ends, a job starts on GPU 1, and GPU 0's file turns malformed: GPU 0
    // keeps its last good jobs, GPU 1 is picked up, no restart.
    std::fs::write(dir.join("1"), "3001\n").unwrap();
    std::fs::write(dir.join("0"), "1001\nnot one job\n").unwrap();
    let want = vec![
        ("0".to_string(), "1001".to_string()),
        ("0".to_string(), "1002".to_string()),
        ("1".to_string(), "3001".to_string()),
        ("2".to_string(), "2001".to_string()),
    ];
    wait_for("the new job in Prometheus", Duration::from_secs(30), || {
        (jobs_of(q) == want).then_some(())
    });
    let line = e.process.wait_for_line(
        "HPC job mapping file does not read",
        Duration::from_secs(10),
    );
    assert!(
        line.contains(&format!("{}:2:", dir.join("0").display())),
        "{line}"
    );
    // Fixed: GPU 0 has one job now.
    std::fs::write(dir.join("0"), "1001\n").unwrap();
    wait_for("GPU 0 down to one job", Duration::from_secs(30), || {
        (on_gpu(&e.metrics(), "DCGM_FI_DEV_FB_USED", &n.gpus[0].uuid).len() == 1).then_some(())
    });
}
