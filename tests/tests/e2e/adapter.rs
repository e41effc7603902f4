//! gpu-metrics-adapter end to end, direct source: a real exporter (simulated GPUs,
//! attributed to pods through the simulated Kubernetes node) scraped by the real
//! adapter over the protobuf exposition; answers checked against the scenario, through
//! plain HTTP, through `kubectl get --raw`, and through the HPA's replica formula.

use e2e_tests::metrics_api::items_milli;
use e2e_tests::{
    Adapter, Exporter, KubeNode, Prometheus, attributed_exporter, free_port, get, query_value,
    sample_value, scratch_dir, wait_for,
};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/pods-node.toml";

/// The adapter scraping `exporter`, with `node`'s API server for pods.
fn adapter(exporter: &Exporter, node: &KubeNode, extra: &[&str]) -> Adapter {
    let url = exporter.url("/metrics");
    let kubeconfig = node.kubeconfig().display().to_string();
    let mut args = vec![
        "--exporter-url",
        &url,
        "--scrape-interval",
        "300ms",
        "--kubeconfig",
        &kubeconfig,
    ];
    args.extend(extra);
    Adapter::start(&args)
}

fn exporter(node: &KubeNode) -> Exporter {
    attributed_exporter(node, SCENARIO)
}

/// The HPA's replica count for an `AverageValue` target over the adapter's items.
fn hpa_average_value(current: i64, items: &[(String, i64)], target_milli: i64) -> i64 {
    let milli: Vec<i64> = items.iter().map(|(_, m)| *m).collect();
    e2e_tests::hpa::average_value(current, &milli, target_milli)
}

#[test]
fn the_adapter_serves_per_pod_gpu_metrics_from_the_exporters() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node);
    let a = adapter(&e, &node, &[]);

    // Discovery, as the aggregator's availability probe asks it.
    let (status, disc) = a.get("/apis/custom.metrics.k8s.io/v1beta2");
    assert_eq!(status, 200);
    assert!(
        disc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "pods/gpu_utilization")
    );
    assert_eq!(a.get("/apis/external.metrics.k8s.io/v1beta1").0, 200);

    // Pods metric over the time-sliced GPU: each pod's own share (54 and 18 of the
    // device's 90 at the frozen second), not the device's value copied.
    let v = a.ok("/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference");
    assert_eq!(v["kind"], "MetricValueList");
    assert_eq!(v["apiVersion"], "custom.metrics.k8s.io/v1beta2");
    assert_eq!(
        items_milli(&v),
        vec![
            ("share-a".to_string(), 54_000),
            ("share-b".to_string(), 18_000)
        ]
    );
    assert_eq!(v["items"][0]["describedObject"]["kind"], "Pod");
    assert_eq!(v["items"][0]["metric"]["name"], "gpu_utilization");
    assert!(v["items"][0]["timestamp"].as_str().unwrap().ends_with('Z'));
    // HPA: Pods AverageValue target 30 % per pod, from 2 replicas: the replicas the
    // HPA formula gives on the adapter's answer are the ones it gives on the exporter's
    // own per-pod values (usage 72 over 2 pods, r = 1.2: a scale-up).
    let samples = parse_exposition(&e.metrics());
    let oracle: Vec<(String, i64)> = exporter_pods(&samples, "inference")
        .into_iter()
        .map(|pod| {
            let value = exporter_pod_value(&samples, "inference", &pod, "gpu_utilization");
            (pod, to_milli(value))
        })
        .collect();
    let oracle_milli: Vec<i64> = oracle.iter().map(|(_, m)| *m).collect();
    let scale_up = hpa_average_value(2, &oracle, 30_000);
    assert!(scale_up > 2, "the target makes the HPA scale up");
    assert_eq!(hpa_average_value(2, &items_milli(&v), 30_000), scale_up);
    // The classic mistake would be one pre-averaged value with AverageValue: the HPA
    // would divide 36 by the replicas again. Per-pod items keep the formula right.

    // v1beta1 differs only in field names.
    let v1 = a.ok(
        "/apis/custom.metrics.k8s.io/v1beta1/namespaces/inference/pods/share-a/gpu_utilization",
    );
    assert_eq!(v1["items"][0]["metricName"], "gpu_utilization");
    assert_eq!(items_milli(&v1), vec![("share-a".to_string(), 54_000)]);

    // Memory of a pod holding a whole GPU: its 40 GiB process.
    let m = a
        .ok("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/train-0/gpu_memory_used_bytes");
    assert_eq!(
        items_milli(&m),
        vec![("train-0".to_string(), 40_960 * 1_048_576 * 1000)]
    );

    // External: one item per pod, so AverageValue keeps "average per pod".
    let x = a.ok("/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/gpu_utilization?labelSelector=app%3Dresnet-inference");
    assert_eq!(x["kind"], "ExternalMetricValueList");
    assert_eq!(items_milli(&x).len(), 2);
    // On target (the exporter's mean): the HPA stays.
    let on_target = oracle_milli.iter().sum::<i64>() / oracle_milli.len() as i64;
    assert_eq!(
        hpa_average_value(2, &items_milli(&x), on_target),
        e2e_tests::hpa::average_value(2, &oracle_milli, on_target),
    );
    assert_eq!(
        hpa_average_value(2, &items_milli(&x), on_target),
        2,
        "on target: stays"
    );

    // Object metric: the Deployment `resnet` (through its ReplicaSet and the pods'
    // template hash), the mean over its pods. An HPA Object target with `Value` 30
    // compares 36 with 30: r = 1.2 → ceil(1.2 × 2 ready pods) = 3.
    let d = a.ok("/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/deployments.apps/resnet/gpu_utilization");
    assert_eq!(d["items"][0]["describedObject"]["kind"], "Deployment");
    assert_eq!(items_milli(&d), vec![("resnet".to_string(), 36_000)]);
    let object: Vec<i64> = items_milli(&d).iter().map(|(_, m)| *m).collect();
    assert_eq!(
        e2e_tests::hpa::value(2, 2, &object, 30_000),
        e2e_tests::hpa::value(2, 2, &[on_target], 30_000),
    );
    // And a Pods AverageValue target over the same pods gives the same answer.
    let per_pod: Vec<i64> = items_milli(&v).iter().map(|(_, m)| *m).collect();
    assert_eq!(
        e2e_tests::hpa::pods_average_value(2, &per_pod, 0, 30_000),
        e2e_tests::hpa::pods_average_value(2, &oracle_milli, 0, 30_000),
    );
    assert_eq!(
        e2e_tests::hpa::pods_average_value(2, &per_pod, 0, 30_000),
        e2e_tests::hpa::value(2, 2, &object, 30_000),
        "Pods and Object targets over the same pods agree"
    );

    // metrics-api JSON for KEDA's metrics-api trigger: the sum over the Deployment's
    // pods, for KEDA's default AverageValue.
    let j = a.ok("/metrics-api/namespaces/inference/gpu_utilization?deployment=resnet");
    assert_eq!(j["value"], 72.0);

    // The namespace object: the mean over its pods.
    let ns =
        a.ok("/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/metrics/gpu_utilization");
    assert_eq!(items_milli(&ns), vec![("inference".to_string(), 36_000)]);
}

#[test]
fn bad_requests_get_kubernetes_status_errors() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node);
    let a = adapter(&e, &node, &[]);
    a.ok("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization");
    let long = "a".repeat(10_000);
    let cases: Vec<(String, u16, &str)> = vec![
        ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/no_such_metric".into(), 404, "NotFound"),
        ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization?labelSelector=app%3D%3D%3D".into(), 400, "BadRequest"),
        ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/bar".into(), 404, "NotFound"),
        ("/apis/custom.metrics.k8s.io/v9/namespaces/ml/pods/*/gpu_utilization".into(), 404, "NotFound"),
        ("/apis/external.metrics.k8s.io/v1beta1/nonexistent-metric".into(), 404, "NotFound"),
        ("/apis/external.metrics.k8s.io/v1beta1/namespaces/foo".into(), 404, "NotFound"),
        ("/apis/external.metrics.k8s.io/v1beta1/namespaces/foo/group/metric".into(), 404, "NotFound"),
        ("/apis/external.metrics.k8s.io/v1beta1/namespaces/nobody/gpu_utilization".into(), 404, "NotFound"),
        ("/apis/nope.example.com/v1/a/b/c/d/e".into(), 404, "NotFound"),
        ("/openapi/v2".into(), 404, "NotFound"),
        ("/openapi/v3".into(), 404, "NotFound"),
        (format!("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization?labelSelector={long}"), 400, "BadRequest"),
    ];
    let post = ureq_post(&format!(
        "{}/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization",
        a.base
    ));
    assert_eq!(post.0, 405, "{}", post.1);
    assert!(post.1.contains("\"kind\":\"Status\""), "{}", post.1);
    for (path, code, reason) in cases {
        let (status, body) = a.get(&path);
        assert_eq!(status, code, "{path}: {body}");
        assert_eq!(body["kind"], "Status", "{path}: {body}");
        assert_eq!(body["reason"], reason, "{path}: {body}");
        assert_eq!(body["code"], code, "{path}: {body}");
    }
}

#[test]
fn stale_data_is_never_served_and_readyz_follows_the_source() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node);
    let a = adapter(&e, &node, &["--max-staleness", "1s"]);
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/train-0/gpu_utilization";
    a.ok(path);
    assert_eq!(get(&format!("{}/readyz", a.base)).0, 200);
    let killed = Command::new("kill")
        .arg(e.process.pid().to_string())
        .status()
        .expect("kill");
    assert!(killed.success());
    let (status, body) = wait_for("stale → 404", Duration::from_secs(30), || {
        let (s, b) = a.get(path);
        (s == 404).then_some((s, b))
    });
    assert_eq!(body["reason"], "NotFound", "{status}: {body}");
    wait_for("not ready", Duration::from_secs(30), || {
        (get(&format!("{}/readyz", a.base)).0 == 503).then_some(())
    });
    assert_eq!(get(&format!("{}/healthz", a.base)).0, 200);
    assert!(a.process.log().contains("exporter scrape failed"));
}

#[test]
fn values_survive_a_short_outage_then_age_out() {
    const STALENESS: Duration = Duration::from_secs(10);
    let node = KubeNode::start(SCENARIO, "node-a");
    let mut e = exporter(&node);
    let a = adapter(&e, &node, &["--max-staleness", "10s"]);
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization";
    let before = items_milli(&a.ok(path));
    assert_eq!(before.len(), 2, "{before:?}");
    let killed_at = std::time::Instant::now();
    let killed = Command::new("kill")
        .arg(e.process.pid().to_string())
        .status()
        .expect("kill");
    assert!(killed.success());
    e.process.wait_exit(Duration::from_secs(10));
    // The adapter has noticed the outage...
    wait_for("a failed scrape", Duration::from_secs(10), || {
        a.process
            .log()
            .contains("exporter scrape failed")
            .then_some(())
    });
    // ...and still serves the last values while they are younger than the limit.
    let (status, during) = a.get(path);
    assert!(
        killed_at.elapsed() < STALENESS - Duration::from_secs(2),
        "the outage was noticed too late to test the first half: {:?}",
        killed_at.elapsed()
    );
    assert_eq!(status, 200, "{during}");
    assert_eq!(
        items_milli(&during),
        before,
        "the last values survive a short outage"
    );
    // Then they age out: not before the limit (less the last sample's age, at most one
    // exporter interval and a scrape), and refused from then on.
    wait_for("aged out", Duration::from_secs(30), || {
        (a.get(path).0 == 404).then_some(())
    });
    let aged_after = killed_at.elapsed();
    assert!(
        aged_after >= STALENESS - Duration::from_secs(3),
        "values aged out after {aged_after:?}, before the {STALENESS:?} limit"
    );
    let (status, body) = a.get(path);
    assert_eq!(status, 404, "{body}");
    wait_for("not ready", Duration::from_secs(10), || {
        (get(&format!("{}/readyz", a.base)).0 == 503).then_some(())
    });
}

/// One sample of the exporter's text exposition: its name, labels and value.
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a text exposition (label values here carry no escapes).
fn parse_exposition(body: &str) -> Vec<Sample> {
    e2e_tests::text_series(body)
        .into_iter()
        .map(|(series, value)| {
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').expect("closing brace");
                    let labels = inner
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").expect("label pair");
                            (k.to_string(), v.trim_end_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
                None => (series.clone(), Vec::new()),
            };
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect()
}

/// The oracle for the adapter's answers: what the exporter's own exposition says of one
/// pod's metric, per the adapter's documented definitions (mean of percentages, sum of
/// bytes and watts over the pod's devices).
fn exporter_pod_value(samples: &[Sample], namespace: &str, pod: &str, metric: &str) -> f64 {
    let of_pod = |name: &str| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| {
                s.name == name
                    && s.label("namespace") == Some(namespace)
                    && s.label("pod") == Some(pod)
            })
            .collect()
    };
    let mean = |v: Vec<f64>| {
        assert!(!v.is_empty(), "{namespace}/{pod} has no {metric}");
        v.iter().sum::<f64>() / v.len() as f64
    };
    match metric {
        "gpu_utilization" => {
            let util: Vec<f64> = of_pod("DCGM_FI_DEV_GPU_UTIL")
                .iter()
                .map(|s| s.value)
                .collect();
            if util.is_empty() {
                mean(
                    of_pod("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
                        .iter()
                        .map(|s| s.value * 100.0)
                        .collect(),
                )
            } else {
                mean(util)
            }
        }
        "gpu_power_watts" => of_pod("DCGM_FI_DEV_POWER_USAGE")
            .iter()
            .map(|s| s.value)
            .sum(),
        "gpu_memory_used_bytes" => of_pod("DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|s| s.value * 1_048_576.0)
            .sum(),
        "gpu_memory_utilization" => mean(
            of_pod("DCGM_FI_DEV_FB_USED")
                .iter()
                .map(|used| {
                    let device = (used.label("UUID"), used.label("GPU_I_ID"));
                    let capacity: f64 = samples
                        .iter()
                        .filter(|s| {
                            (s.name == "DCGM_FI_DEV_FB_USED" || s.name == "DCGM_FI_DEV_FB_FREE")
                                && (s.label("UUID"), s.label("GPU_I_ID")) == device
                        })
                        .map(|s| s.value)
                        .sum();
                    used.value / capacity * 100.0
                })
                .collect(),
        ),
        other => panic!("no oracle for {other}"),
    }
}

/// The pods of `namespace` the exporter attributes a GPU to, sorted.
fn exporter_pods(samples: &[Sample], namespace: &str) -> Vec<String> {
    let mut pods: Vec<String> = samples
        .iter()
        .filter(|s| s.name == "DCGM_FI_DEV_FB_USED" && s.label("namespace") == Some(namespace))
        .filter_map(|s| s.label("pod").map(str::to_string))
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

fn to_milli(value: f64) -> i64 {
    (value * 1000.0).round() as i64
}

/// Equal within the quantity's rounding (one milli-unit, or one part in 10^9 of large
/// byte counts).
fn assert_items_close(path: &str, got: &[(String, i64)], want: &[(String, i64)]) {
    assert_eq!(
        got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        want.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "{path}"
    );
    for ((name, g), (_, w)) in got.iter().zip(want) {
        let slack = 1.max(w.abs() / 1_000_000_000);
        assert!((g - w).abs() <= slack, "{path}: {name} is {g}m, want {w}m");
    }
}

#[test]
fn kubectl_get_raw_reads_every_way_in() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node);
    let a = adapter(&e, &node, &[]);
    a.ok("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization");
    // Time is frozen in the scenario, so the exporter's snapshot is the adapter's input.
    let samples = parse_exposition(&e.metrics());
    let dir = scratch_dir("kubectl");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: adapter\n  cluster:\n    server: {}\ncontexts:\n- name: adapter\n  context:\n    cluster: adapter\n    user: nobody\nusers:\n- name: nobody\n  user: {{}}\ncurrent-context: adapter\n",
            a.base
        ),
    )
    .expect("kubeconfig");
    let raw = |path: &str| -> Value {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "--raw", path])
            .output()
            .expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl get --raw {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let per_pod = |namespace: &str, metric: &str| -> Vec<(String, f64)> {
        exporter_pods(&samples, namespace)
            .into_iter()
            .map(|pod| {
                let v = exporter_pod_value(&samples, namespace, &pod, metric);
                (pod, v)
            })
            .collect()
    };
    let mean =
        |values: &[(String, f64)]| values.iter().map(|(_, v)| v).sum::<f64>() / values.len() as f64;

    let discovery = raw("/apis/custom.metrics.k8s.io/v1beta2");
    assert_eq!(discovery["kind"], "APIResourceList");
    let names: Vec<&str> = discovery["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for metric in [
        "gpu_utilization",
        "gpu_memory_used_bytes",
        "gpu_memory_utilization",
        "gpu_power_watts",
        "gpu_tensor_active",
    ] {
        assert!(
            names.contains(&format!("pods/{metric}").as_str()),
            "{names:?}"
        );
    }

    let inference = per_pod("inference", "gpu_utilization");
    assert_eq!(inference.len(), 2, "both shares attributed: {inference:?}");
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization";
    let want: Vec<(String, i64)> = inference
        .iter()
        .map(|(p, v)| (p.clone(), to_milli(*v)))
        .collect();
    assert_items_close(path, &items_milli(&raw(path)), &want);

    let path = "/apis/custom.metrics.k8s.io/v1beta1/namespaces/ml/pods/train-0/gpu_power_watts";
    let want = exporter_pod_value(&samples, "ml", "train-0", "gpu_power_watts");
    assert!(want > 0.0, "train-0 holds a whole GPU and has its power");
    assert_items_close(
        path,
        &items_milli(&raw(path)),
        &[("train-0".to_string(), to_milli(want))],
    );

    let path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/gpu_memory_utilization";
    let want: Vec<(String, i64)> = per_pod("ml", "gpu_memory_utilization")
        .iter()
        .map(|(p, v)| (p.clone(), to_milli(*v)))
        .collect();
    assert_eq!(want.len(), 2, "train-0 and idx-0: {want:?}");
    assert_items_close(path, &items_milli(&raw(path)), &want);

    // Objects: the mean over their pods; the Deployment `resnet` owns both shares.
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/deployments.apps/resnet/gpu_utilization";
    assert_items_close(
        path,
        &items_milli(&raw(path)),
        &[("resnet".to_string(), to_milli(mean(&inference)))],
    );
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/serve/metrics/gpu_memory_used_bytes";
    let serve = per_pod("serve", "gpu_memory_used_bytes");
    assert_eq!(serve.len(), 4, "the four MIG pods: {serve:?}");
    assert_items_close(
        path,
        &items_milli(&raw(path)),
        &[("serve".to_string(), to_milli(mean(&serve)))],
    );

    // metrics-api: the sum over the Deployment's pods.
    let v = raw("/metrics-api/namespaces/inference/gpu_utilization?deployment=resnet");
    let sum: f64 = inference.iter().map(|(_, v)| v).sum();
    let got = v["value"].as_f64().expect("value");
    assert!((got - sum).abs() < 1e-6, "metrics-api {got} vs {sum}");
}

/// KEDA's side of the external scaler protocol, driven by a gRPC client generated from
/// the same message definitions: all four RPCs, and a `StreamIsActive` stream that sees
/// activation flip when the workload's pods go away and come back.
#[test]
fn the_keda_external_scaler_answers_all_four_rpcs() {
    use gpu_metrics_adapter::faces::keda::proto::external_scaler_client::ExternalScalerClient;
    use gpu_metrics_adapter::faces::keda::proto::{GetMetricsRequest, ScaledObjectRef};

    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node);
    let a = adapter(&e, &node, &[]);
    a.ok("/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference");
    let grpc = a.grpc_address();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = ExternalScalerClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect");
        let so = |extra: &[(&str, &str)]| {
            let mut meta: std::collections::HashMap<String, String> = [
                ("metric", "gpu_utilization"),
                ("targetValue", "30"),
                ("activationTargetValue", "10"),
                ("podSelector", "app=resnet-inference"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            for (k, v) in extra {
                meta.insert(k.to_string(), v.to_string());
            }
            ScaledObjectRef {
                name: "resnet".into(),
                namespace: "inference".into(),
                scaler_metadata: meta,
            }
        };
        let spec = client
            .get_metric_spec(so(&[]))
            .await
            .expect("spec")
            .into_inner();
        assert_eq!(spec.metric_specs.len(), 1);
        assert_eq!(spec.metric_specs[0].metric_name, "gpu_utilization");
        assert_eq!(spec.metric_specs[0].target_size_float, 30.0);

        // Default aggregation `sum`: 54 + 18. With KEDA's default AverageValue the HPA
        // divides by the 2 replicas: 36 per pod against the target 30 → 3 replicas.
        let metrics = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(so(&[])),
                metric_name: "gpu_utilization".into(),
            })
            .await
            .expect("metrics")
            .into_inner();
        assert_eq!(metrics.metric_values[0].metric_value_float, 72.0);
        let items = vec![("".to_string(), 72_000)];
        assert_eq!(hpa_average_value(2, &items, 30_000), 3);
        let avg = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(so(&[("aggregation", "average")])),
                metric_name: "gpu_utilization".into(),
            })
            .await
            .expect("metrics")
            .into_inner();
        assert_eq!(avg.metric_values[0].metric_value_float, 36.0);

        assert!(
            client
                .is_active(so(&[]))
                .await
                .expect("active")
                .into_inner()
                .result
        );
        let bad = client
            .is_active(so(&[("metric", "gpu_magic")]))
            .await
            .expect_err("unknown metric");
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);

        let mut stream = client
            .stream_is_active(so(&[]))
            .await
            .expect("stream")
            .into_inner();
        let first = stream.message().await.expect("first").expect("open");
        assert!(first.result, "active at once");

        // The workload scales to zero: its pods leave the kubelet and the API server.
        let s = gpu_sim::Scenario::load(&e2e_tests::fixture("pods-node.toml")).expect("scenario");
        let mut sim = gpu_sim::SimNode::new(&s, std::time::SystemTime::now());
        sim.freeze_at(60.0);
        let all = kube_sim::node::pod_resources_on(&s, &sim, "node-a", 60.0, false);
        let without: Vec<_> = all
            .iter()
            .filter(|p| !p.name.starts_with("share-"))
            .cloned()
            .collect();
        node.kubelet().set_pods(without);
        assert!(node.api().delete("inference", "share-a"));
        assert!(node.api().delete("inference", "share-b"));
        let flipped = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("flip within 30 s")
            .expect("stream")
            .expect("open");
        assert!(!flipped.result, "inactive once the pods are gone");

        // And back: the pods return.
        node.kubelet().set_pods(all);
        for p in kube_sim::node::pod_meta(&s, 60.0, "node-a") {
            node.api().apply(p);
        }
        let back = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("flip back within 30 s")
            .expect("stream")
            .expect("open");
        assert!(back.result, "active again");
    });

    // Every call above was counted by method and gRPC code (streams when they open).
    let (status, text) = get(&format!("{}/metrics", a.base));
    assert_eq!(status, 200, "{text}");
    for (method, code, want) in [
        ("GetMetricSpec", "OK", 1.0),
        ("GetMetrics", "OK", 2.0),
        ("IsActive", "OK", 1.0),
        ("IsActive", "InvalidArgument", 1.0),
        ("StreamIsActive", "OK", 1.0),
    ] {
        let sample = format!(
            "gpu_metrics_adapter_grpc_requests_total{{method=\"{method}\",grpc_code=\"{code}\"}}"
        );
        assert_eq!(sample_value(&text, &sample), Some(want), "{sample}\n{text}");
    }
}

/// The adapter's own `/metrics`: what it served, by API and status, and the source's
/// health (one live exporter and one that never answers), read by a real Prometheus.
#[test]
fn the_adapter_reports_its_traffic_and_source_health_to_prometheus() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node);
    let dead = format!("http://127.0.0.1:{}/metrics", free_port());
    let a = adapter(&e, &node, &["--exporter-url", &dead]);
    let pods = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization";
    a.ok(pods);
    let metrics = || {
        let (status, text) = get(&format!("{}/metrics", a.base));
        assert_eq!(status, 200, "{text}");
        text
    };
    let value = |text: &str, sample: &str| sample_value(text, sample).unwrap_or(0.0);
    let custom_ok = "gpu_metrics_adapter_http_requests_total{api=\"custom\",code=\"200\"}";
    let external_missing = "gpu_metrics_adapter_http_requests_total{api=\"external\",code=\"404\"}";
    let before = metrics();
    for _ in 0..3 {
        assert_eq!(a.get(pods).0, 200);
    }
    for _ in 0..2 {
        let (status, body) =
            a.get("/apis/external.metrics.k8s.io/v1beta1/namespaces/nobody/gpu_utilization");
        assert_eq!(status, 404, "{body}");
    }
    let after = metrics();
    assert_eq!(
        value(&after, custom_ok) - value(&before, custom_ok),
        3.0,
        "{after}"
    );
    assert_eq!(
        value(&after, external_missing) - value(&before, external_missing),
        2.0,
        "{after}"
    );
    assert!(
        value(
            &after,
            "gpu_metrics_adapter_http_request_duration_seconds_count{api=\"custom\"}"
        ) >= 3.0,
        "{after}"
    );

    // The source: two targets, one answering; the dead one counted as failures.
    let text = wait_for(
        "a failed and a good scrape",
        Duration::from_secs(30),
        || {
            let text = metrics();
            let failed = value(
                &text,
                "gpu_metrics_adapter_source_scrapes_total{result=\"failure\"}",
            );
            let good = value(
                &text,
                "gpu_metrics_adapter_source_scrapes_total{result=\"success\"}",
            );
            (failed >= 1.0 && good >= 1.0).then_some(text)
        },
    );
    assert_eq!(
        sample_value(&text, "gpu_metrics_adapter_source_up"),
        Some(1.0)
    );
    assert_eq!(
        sample_value(&text, "gpu_metrics_adapter_source_targets"),
        Some(2.0)
    );
    assert_eq!(
        sample_value(&text, "gpu_metrics_adapter_source_targets_answering"),
        Some(1.0)
    );
    // Every pod the scenario gives GPU values is fresh: the gauge converges on what the
    // custom API lists over the scenario's namespaces (the scenario is frozen).
    let listed: usize = ["ml", "serve", "inference", "default"]
        .iter()
        .map(|ns| {
            items_milli(&a.ok(&format!(
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/gpu_utilization"
            )))
            .len()
        })
        .sum();
    assert!(listed >= 8, "{listed}");
    wait_for(
        "pods_fresh = the listed pods",
        Duration::from_secs(30),
        || {
            let text = metrics();
            (sample_value(&text, "gpu_metrics_adapter_pods_fresh") == Some(listed as f64))
                .then_some(())
        },
    );

    // A real Prometheus parses the OpenMetrics text and stores it.
    let target = a.base.trim_start_matches("http://");
    let prometheus = Prometheus::start(&[("adapter", target, "")]);
    let answered = wait_for(
        "the adapter's metrics in Prometheus",
        Duration::from_secs(30),
        || {
            let r =
                prometheus.query("gpu_metrics_adapter_source_targets_answering{job=\"adapter\"}");
            r.first()
                .map(|s| s["value"][1].as_str().unwrap_or("").to_string())
        },
    );
    assert_eq!(answered, "1");
    let up = prometheus.query("up{job=\"adapter\"}");
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let served = prometheus.query(
        "gpu_metrics_adapter_http_requests_total{job=\"adapter\",api=\"custom\",code=\"200\"}",
    );
    let served = query_value(&served[0]);
    assert!(served >= 3.0, "{served}");
}

/// Two replicas of the adapter over the same exporter answer the same values: the
/// aggregation and rounding are deterministic (timestamps are each one's own scrape).
#[test]
fn two_replicas_answer_identically() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node);
    let a = adapter(&e, &node, &[]);
    let b = adapter(&e, &node, &[]);
    for path in [
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_memory_utilization",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/serve/metrics/gpu_memory_used_bytes",
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/gpu_power_watts",
    ] {
        let strip = |mut v: Value| {
            for i in v["items"].as_array_mut().expect("items") {
                i.as_object_mut().expect("item").remove("timestamp");
            }
            v
        };
        assert_eq!(strip(a.ok(path)), strip(b.ok(path)), "{path}");
    }
}

/// A POST: (status, body), whatever the status.
fn ureq_post(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-X", "POST", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.trim().parse().expect("status code"), body.to_string())
}

/// Issue 16: the adapter follows a gpu-exporter sample by sample through the long poll.
/// With `--scrape-interval 1h` a polling adapter would fetch once; instead every
/// sample (every 200 ms here) arrives, through requests the exporter holds until it
/// publishes.
#[test]
fn the_adapter_long_polls_the_exporter_sample_by_sample() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = e2e_tests::attributed_exporter_with(
        &node,
        SCENARIO,
        &["--log-level", "info,gpu_exporter::serving::http=debug"],
    );
    let a = adapter_with_interval(&e, &node, "1h");
    let successes = || {
        let (status, text) = get(&format!("{}/metrics", a.base));
        assert_eq!(status, 200, "{text}");
        sample_value(
            &text,
            "gpu_metrics_adapter_source_scrapes_total{result=\"success\"}",
        )
        .unwrap_or(0.0)
    };
    wait_for(
        "the adapter to receive 10 samples",
        Duration::from_secs(30),
        || (successes() >= 10.0).then_some(()),
    );
    let pods = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization";
    assert_eq!(a.get(pods).0, 200);
    let log = e.process.log();
    let held = log
        .lines()
        .filter(|l| l.contains("served /metrics") && l.contains("held=true"))
        .count();
    // Each request after the first names the snapshot the adapter holds; the exporter
    // holds it unless a newer one was published meanwhile (a loaded machine).
    assert!(held >= 1, "no held answer in the exporter's log:\n{log}");
}

/// The adapter scraping `exporter` with `--scrape-interval interval`.
fn adapter_with_interval(exporter: &Exporter, node: &KubeNode, interval: &str) -> Adapter {
    let url = exporter.url("/metrics");
    let kubeconfig = node.kubeconfig().display().to_string();
    Adapter::start(&[
        "--exporter-url",
        &url,
        "--scrape-interval",
        interval,
        "--kubeconfig",
        &kubeconfig,
    ])
}
