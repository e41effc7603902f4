//! gpu-metrics-adapter with the Prometheus-compatible source: a real Prometheus scrapes
//! the exporter (attributed to pods through the simulated Kubernetes node), and the
//! adapter answers from instant queries the same per-pod values as the direct source.

use e2e_tests::quantity::milli_value;
use e2e_tests::{Adapter, KubeNode, Prometheus, attributed_exporter, get, wait_for};
use serde_json::Value;
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/pods-node.toml";

#[test]
fn the_prometheus_source_gives_the_same_per_pod_values() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let kubeconfig = node.kubeconfig().display().to_string();
    let e = attributed_exporter(&node, SCENARIO);
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("gpu", &target, "")]);
    wait_for("Prometheus has the shares", Duration::from_secs(60), || {
        (!prom
            .query("DCGM_FI_DEV_GPU_UTIL{pod=\"share-b\"}")
            .is_empty())
        .then_some(())
    });
    let adapter = Adapter::start(&[
        "--scrape-interval",
        "500ms",
        "--prometheus-url",
        &prom.base,
        "--prometheus-header",
        "X-Scope-OrgID: tenant-a",
        "--kubeconfig",
        &kubeconfig,
        "--max-staleness",
        "5s",
    ]);
    let base = adapter.base.clone();
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference";
    let v: Value = e2e_tests::try_wait_for(Duration::from_secs(30), || {
        let (status, body) = get(&format!("{base}{path}"));
        (status == 200).then(|| serde_json::from_str(&body).expect("JSON"))
    })
    .unwrap_or_else(|| {
        panic!(
            "the adapter did not answer: {:?}\n{}",
            get(&format!("{base}{path}")),
            adapter.process.log()
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
