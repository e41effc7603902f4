//! gpu-metrics-adapter with the Prometheus-compatible source: a real Prometheus scrapes
//! the exporter (attributed to pods through the simulated Kubernetes node), and the
//! adapter answers from instant queries the same per-pod values as the direct source.

use e2e_tests::{Exporter, KubeNode, Process, Prometheus, binary, get, wait_for, workspace};
use gpu_metrics_adapter::api::quantity::milli_value;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/pods-node.toml";

fn start_adapter(args: &[&str]) -> (Process, String) {
    let mut cmd = Command::new(binary("gpu-metrics-adapter"));
    cmd.current_dir(workspace())
        .args(["--insecure-serve-http", "--bind-address", "127.0.0.1"])
        .args([
            "--secure-port",
            "0",
            "--grpc-port",
            "0",
            "--scrape-interval",
            "500ms",
        ])
        .args(args)
        .env("RUST_LOG", "info");
    let mut process = Process::spawn(cmd);
    let line = process.wait_for_line("listening address=", Duration::from_secs(30));
    let addr = line
        .split("address=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("address")
        .to_string();
    (process, format!("http://{addr}"))
}

#[test]
fn the_prometheus_source_gives_the_same_per_pod_values() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let socket = node.socket().display().to_string();
    let kubeconfig = node.kubeconfig().display().to_string();
    let proc_root = node.proc_root().display().to_string();
    let e = Exporter::start(
        &[
            &format!("--simulate={SCENARIO}"),
            "-c",
            "200",
            "-k",
            "--kubernetes-refresh-interval",
            "200ms",
            "--pod-resources-kubelet-socket",
            &socket,
            "--kubeconfig",
            &kubeconfig,
            "--proc-root",
            &proc_root,
        ],
        &[("NODE_NAME", "node-a")],
    );
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("gpu", &target, "")]);
    wait_for("Prometheus has the shares", Duration::from_secs(60), || {
        (!prom
            .query("DCGM_FI_DEV_GPU_UTIL{pod=\"share-b\"}")
            .is_empty())
        .then_some(())
    });
    let (adapter, base) = start_adapter(&[
        "--prometheus-url",
        &prom.base,
        "--prometheus-header",
        "X-Scope-OrgID: tenant-a",
        "--kubeconfig",
        &kubeconfig,
        "--max-staleness",
        "5s",
    ]);
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference";
    let v: Value = e2e_tests::try_wait_for(Duration::from_secs(30), || {
        let (status, body) = get(&format!("{base}{path}"));
        (status == 200).then(|| serde_json::from_str(&body).expect("JSON"))
    })
    .unwrap_or_else(|| {
        panic!(
            "the adapter did not answer: {:?}\n{}",
            get(&format!("{base}{path}")),
            adapter.log()
        )
    });
    let items: Vec<(String, i64)> = v["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["describedObject"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                milli_value(i["value"].as_str().expect("quantity")).expect("quantity"),
            )
        })
        .collect();
    assert_eq!(
        items,
        vec![
            ("share-a".to_string(), 54_000),
            ("share-b".to_string(), 18_000)
        ],
        "the same shares as the direct source"
    );
    // Memory of the whole-GPU pod, through Prometheus.
    let (status, body) = get(&format!(
        "{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/train-0/gpu_memory_used_bytes"
    ));
    assert_eq!(status, 200, "{body}");
    let m: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        milli_value(m["items"][0]["value"].as_str().expect("q")).expect("q"),
        40_960 * 1_048_576 * 1000
    );
}
