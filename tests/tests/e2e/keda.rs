//! KEDA in a real control plane (`WITH_KEDA=1 tests/kube/cluster.sh up`): KEDA's operator
//! and metrics server, built from KEDA's own module (tests/kube/keda), reading the
//! ScaledObjects of deploy/examples/keda-* as a user applies them (`kubectl apply -k`),
//! with the real HPA controller deciding; and, without KEDA, a plain HPA taking a
//! Deployment to zero and back on the adapter's external metric (Kubernetes 1.37's
//! HPAScaleToZero). Each path's time from a change of the signal to a changed decision
//! is printed (docs/benchmarks/autoscaling.md has the figures).

use crate::adapter_composite::FakeGateway;
use crate::cluster::{settle, step};
use base64::Engine;
use e2e_tests::cluster::Cluster;
use e2e_tests::https::HttpsClient;
use e2e_tests::pki::Leaf;
use e2e_tests::quantity::milli_value;
use e2e_tests::{Prometheus, hpa, try_wait_for, workspace};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const NS: &str = "inference";
const DEPLOYMENT: &str = "resnet-inference";
/// deploy/examples/keda-external's targetValue, in milli-units.
const TARGET_MILLI: i64 = 70_000;

/// KEDA's binaries, as tests/kube/build.sh builds them; without them (the KEDA module
/// not built) the KEDA test says so and does nothing.
fn keda_built() -> bool {
    let bin = std::env::var_os("KUBE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/kube/bin"));
    ["keda", "keda-adapter"]
        .iter()
        .all(|b| bin.join(b).is_file())
}

/// The status of a condition of ScaledObject `name`.
fn condition(c: &Cluster, name: &str, kind: &str) -> Option<String> {
    let so = c.json(&["scaledobject", "-n", NS, name]);
    so["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|x| x["type"] == kind)
        .and_then(|x| x["status"].as_str().map(str::to_string))
}

fn replicas(c: &Cluster) -> i64 {
    c.json(&["deployment", "-n", NS, DEPLOYMENT])["spec"]["replicas"]
        .as_i64()
        .unwrap_or(-1)
}

/// The signal of a process `up` started (SIGSTOP/SIGCONT: an exporter that stops
/// answering, and comes back).
fn signal(c: &Cluster, process: &str, sig: &str) {
    let pid = std::fs::read_to_string(c.dir().join("pids").join(process)).expect("pid");
    let ok = Command::new("kill")
        .args([sig, pid.trim()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {sig} {process}");
}

/// deploy/examples/NAME as `up` wrote it for this cluster (the scaler address its one
/// substitution), applied as a user applies it.
fn apply_example(c: &Cluster, name: &str) {
    let dir = c.dir().join("examples").join(name);
    c.ok(&["apply", "-k", dir.to_str().expect("path")]);
}

/// Short periods for a test (the examples poll every 15 s and cool down for 300 s, as
/// production should): KEDA polls every second, its HPA scales down at once.
fn quicken(c: &Cluster, name: &str, cooldown: u32) {
    let patch = format!(
        r#"{{"spec":{{"pollingInterval":1,"cooldownPeriod":{cooldown},"advanced":{{"horizontalPodAutoscalerConfig":{{"behavior":{{"scaleDown":{{"stabilizationWindowSeconds":0}}}}}}}}}}}}"#
    );
    c.ok(&[
        "patch",
        "scaledobject",
        "-n",
        NS,
        name,
        "--type",
        "merge",
        "-p",
        &patch,
    ]);
}

#[test]
fn keda_scales_the_examples_through_the_adapter() {
    if !keda_built() {
        eprintln!(
            "SKIPPED keda::keda_scales_the_examples_through_the_adapter: KEDA is not built \
             (bash tests/kube/build.sh keda)"
        );
        return;
    }
    let gateway = FakeGateway::start();
    let conf = workspace().join("deploy/examples/composite-hpa/composites.conf");
    let args = format!(
        "--composite-metrics-file {} --signal inference/gateway_requests_waiting=http://127.0.0.1:{}/metrics#gateway_requests_waiting{{route=\"llm\"}}",
        conf.display(),
        gateway.port
    );
    let c = Cluster::up_with(&[("WITH_KEDA", "1"), ("ADAPTER_ARGS", args.as_str())]);
    keda_owns_the_external_metrics_api(&c);
    // The example ScaledObjects replace examples/hpa's HPA: KEDA refuses a target that
    // another HPA scales.
    c.ok(&["delete", "hpa", "-n", NS, DEPLOYMENT]);
    the_external_scaler_drives_kedas_hpa(&c);
    fallback_holds_the_replicas_while_the_adapter_has_no_data(&c);
    external_push_wakes_from_zero_and_cools_down_to_zero(&c, &gateway);
    the_prometheus_trigger_follows_the_dial(&c);
    the_metrics_api_trigger_drives_kedas_hpa(&c);
}

/// KEDA's metrics server serves external.metrics.k8s.io, registered as KEDA registers
/// it, and Available; the adapter serves the custom metrics APIs beside it.
fn keda_owns_the_external_metrics_api(c: &Cluster) {
    let api = c.json(&["apiservice", "v1beta1.external.metrics.k8s.io"]);
    assert_eq!(
        api["spec"]["service"]["name"], "keda-metrics-apiserver",
        "{api}"
    );
    assert_eq!(api["spec"]["service"]["namespace"], "keda", "{api}");
    for name in [
        "v1beta1.external.metrics.k8s.io",
        "v1beta2.custom.metrics.k8s.io",
        "v1beta1.custom.metrics.k8s.io",
    ] {
        let a = c.json(&["apiservice", name]);
        let available = a["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|x| x["type"] == "Available" && x["status"] == "True");
        assert!(available, "{name}: {a}");
    }
}

/// deploy/examples/keda-external: the ScaledObject Ready and Active, KEDA's external
/// metric the adapter's sum over the Deployment's pods, and the HPA KEDA made deciding
/// what the HPA formula gives on it (AverageValue: sum / replicas against 70).
fn the_external_scaler_drives_kedas_hpa(c: &Cluster) {
    apply_example(c, "keda-external");
    quicken(c, DEPLOYMENT, 300);
    c.wait(
        "the ScaledObject Ready and Active",
        Duration::from_secs(120),
        || {
            (condition(c, DEPLOYMENT, "Ready")? == "True"
                && condition(c, DEPLOYMENT, "Active")? == "True")
                .then_some(())
        },
    );
    let hpa_name = format!("keda-hpa-{DEPLOYMENT}");
    let formula = |current, values: &[i64]| hpa::average_value(current, values, TARGET_MILLI);
    let start = settle(c, &hpa_name, 70);
    // What KEDA's metrics server answers the HPA: the adapter's sum over the pods, each
    // pod's GPUs at the dial's 70 %.
    let spec = c.json(&["hpa", "-n", NS, &hpa_name]);
    let metric = spec["spec"]["metrics"][0]["external"]["metric"].clone();
    let name = metric["name"].as_str().expect("metric name");
    let selector = metric["selector"]["matchLabels"]
        .as_object()
        .expect("selector")
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",");
    let value = c
        .raw(&format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/{name}?labelSelector={}",
            e2e_tests::urlencode(&selector)
        ))
        .expect("KEDA's external metric");
    let items = value["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{value}");
    let served = milli_value(items[0]["value"].as_str().expect("value")).expect("quantity");
    assert_eq!(served, start * 70_000, "{start} pods at 70 %: {value}");

    let (_, up, latency) = step(c, &hpa_name, 70, 100, formula);
    assert!(up > start, "scaled up: {start} → {up}");
    eprintln!("timing keda-external scale-up: {latency:.2} s");
    // Down from 100 % (the maximum, 8): at 70 % KEDA's HPA may settle at its minimum, 1
    // (the sum covers only the pods with data, so a new pod not yet reported makes it
    // scale back), and from 1 there is no way down.
    let now = settle(c, &hpa_name, 100);
    let (_, down, latency) = step(c, &hpa_name, 100, 35, formula);
    assert!(down < now, "scaled down: {now} → {down}");
    eprintln!("timing keda-external scale-down: {latency:.2} s");
}

/// KEDA's fallback: while the adapter answers Unavailable for the Deployment's pods
/// (their exporters stopped answering, so their data goes stale), KEDA holds the
/// example's fallback.replicas (2) and says Fallback=True; when data returns it leaves
/// fallback.
fn fallback_holds_the_replicas_while_the_adapter_has_no_data(c: &Cluster) {
    settle(c, &format!("keda-hpa-{DEPLOYMENT}"), 35);
    let exporters: Vec<String> = std::fs::read_dir(c.dir().join("pids"))
        .expect("pids")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gpu-exporter-"))
        .collect();
    assert!(!exporters.is_empty());
    for e in &exporters {
        signal(c, e, "-STOP");
    }
    let stopped = Instant::now();
    c.wait("Fallback=True", Duration::from_secs(120), || {
        (condition(c, DEPLOYMENT, "Fallback")? == "True").then_some(())
    });
    eprintln!(
        "timing keda-external fallback: {:.2} s after the exporters stopped",
        stopped.elapsed().as_secs_f64()
    );
    c.wait("the fallback replicas (2)", Duration::from_secs(60), || {
        (replicas(c) == 2).then_some(())
    });
    for e in &exporters {
        signal(c, e, "-CONT");
    }
    c.wait("Fallback=False", Duration::from_secs(120), || {
        (condition(c, DEPLOYMENT, "Fallback")? == "False").then_some(())
    });
    c.ok(&["delete", "scaledobject", "-n", NS, DEPLOYMENT]);
    c.wait("KEDA's HPA gone", Duration::from_secs(60), || {
        (!c.run(&["get", "hpa", "-n", NS, &format!("keda-hpa-{DEPLOYMENT}")])
            .status
            .success())
        .then_some(())
    });
}

/// deploy/examples/keda-scale-from-zero: idle (no request waiting, the GPUs idle), KEDA
/// takes the Deployment to 0 after the cooldown; the first waiting request at the
/// gateway is pushed down `StreamIsActive` and KEDA asks for the first replica (the
/// time it took is printed for the benchmark page); drained and idle, back to 0 after
/// the cooldown, three times.
fn external_push_wakes_from_zero_and_cools_down_to_zero(c: &Cluster, gateway: &FakeGateway) {
    let name = "resnet-inference-from-zero";
    c.set_utilization(0);
    gateway.waiting.store(0, Ordering::SeqCst);
    apply_example(c, "keda-scale-from-zero");
    let cooldown = 5;
    quicken(c, name, cooldown);
    c.wait("the ScaledObject Ready", Duration::from_secs(120), || {
        (condition(c, name, "Ready")? == "True").then_some(())
    });
    let idle = Instant::now();
    c.wait("scaled to zero", Duration::from_secs(120), || {
        (replicas(c) == 0).then_some(())
    });
    eprintln!(
        "timing keda-scale-from-zero to 0: {:.2} s after the ScaledObject was Ready and idle (cooldown {cooldown} s)",
        idle.elapsed().as_secs_f64()
    );
    c.wait("Active=False", Duration::from_secs(30), || {
        (condition(c, name, "Active")? == "False").then_some(())
    });

    let mut latencies = Vec::new();
    for round in 1..=3 {
        let queued = Instant::now();
        gateway.waiting.store(1, Ordering::SeqCst);
        let woke = try_wait_for(Duration::from_secs(30), || (replicas(c) >= 1).then_some(()));
        let latency = queued.elapsed().as_secs_f64();
        assert!(
            woke.is_some(),
            "round {round}: still at 0 replicas after 30 s"
        );
        latencies.push(latency);
        eprintln!(
            "timing keda-scale-from-zero 0 → 1: {latency:.2} s after the first queued request"
        );
        c.wait("Active", Duration::from_secs(30), || {
            (condition(c, name, "Active")? == "True").then_some(())
        });
        gateway.waiting.store(0, Ordering::SeqCst);
        c.wait(
            "back to zero after the cooldown",
            Duration::from_secs(120),
            || (replicas(c) == 0).then_some(()),
        );
    }
    // The latencies are figures for docs/benchmarks/autoscaling.md, not a verdict: a
    // wall-clock bound fails on a loaded machine without anything being wrong (one
    // round took 1.06 s while the whole suite ran beside it).
    eprintln!("timing keda-scale-from-zero 0 → 1, all rounds: {latencies:?} s");
    c.ok(&["delete", "scaledobject", "-n", NS, name]);
}

/// Kubernetes 1.37 (HPAScaleToZero, beta and on by default): an HPA with minReplicas 0
/// on the adapter's external metric, here a signal without pods (a gateway's queue), takes
/// the Deployment to 0 when nothing waits and back to 1 on the first waiting request,
/// without KEDA. (Before 1.37 the API server refuses minReplicas 0.)
#[test]
fn a_plain_hpa_scales_to_and_from_zero() {
    let gateway = FakeGateway::start();
    let args = format!(
        "--signal inference/gateway_requests_waiting=http://127.0.0.1:{}/metrics#gateway_requests_waiting{{route=\"llm\"}}",
        gateway.port
    );
    let c = Cluster::up_with(&[("ADAPTER_ARGS", args.as_str())]);
    c.ok(&["delete", "hpa", "-n", NS, DEPLOYMENT]);
    let name = "resnet-inference-from-zero";
    let hpa = serde_json::json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": DEPLOYMENT},
            "minReplicas": 0, "maxReplicas": 8,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": "gateway_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "8"}}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}
        }
    });
    let file = c.dir().join("hpa-from-zero.json");
    std::fs::write(&file, hpa.to_string()).expect("write");
    c.ok(&["apply", "-f", file.to_str().expect("path")]);
    let status = |c: &Cluster| -> Value { c.json(&["hpa", "-n", NS, name])["status"].clone() };
    let idle = Instant::now();
    c.wait("scaled to zero", Duration::from_secs(120), || {
        (replicas(&c) == 0).then_some(())
    });
    eprintln!(
        "timing plain HPA to 0: {:.2} s after the HPA was made",
        idle.elapsed().as_secs_f64()
    );
    for waiting in [4u64, 20] {
        let before = status(&c)["desiredReplicas"].as_i64().unwrap_or(-1);
        let queued = Instant::now();
        gateway.waiting.store(waiting, Ordering::SeqCst);
        let s = c.wait("a decision on the queue", Duration::from_secs(60), || {
            let s = status(&c);
            (s["desiredReplicas"].as_i64()? != before).then_some(s)
        });
        let latency = queued.elapsed().as_secs_f64();
        // (A field at 0 is left out of the status.)
        let current = s["currentReplicas"].as_i64().unwrap_or(0);
        let desired = s["desiredReplicas"].as_i64().expect("desired");
        // The HPA's formula on the queue (AverageValue 8): from 0, ceil(queue / 8).
        let want = hpa::average_value(current, &[waiting as i64 * 1000], 8_000);
        assert_eq!(desired, want, "{waiting} waiting: {s}");
        eprintln!("timing plain HPA {current} → {desired} on {waiting} waiting: {latency:.2} s");
    }
    gateway.waiting.store(0, Ordering::SeqCst);
    let drained = Instant::now();
    c.wait("back to zero", Duration::from_secs(120), || {
        (replicas(&c) == 0).then_some(())
    });
    eprintln!(
        "timing plain HPA back to 0: {:.2} s after the queue drained",
        drained.elapsed().as_secs_f64()
    );
}

/// The seeds' path, deploy/examples/keda-prometheus: the exporters scraped by a real
/// Prometheus (honor_labels, as the ServiceMonitor does), KEDA's `prometheus` trigger on
/// the example's query over `DCGM_FI_DEV_GPU_UTIL`, and KEDA's HPA deciding what the
/// formula gives on it. The example's serverAddress (the Prometheus Operator's Service)
/// is this Prometheus on loopback.
fn the_prometheus_trigger_follows_the_dial(c: &Cluster) {
    let targets: Vec<String> = c
        .env("EXPORTER_URLS")
        .split_whitespace()
        .map(|u| {
            u.trim_start_matches("http://")
                .trim_end_matches("/metrics")
                .to_string()
        })
        .collect();
    let names: Vec<String> = (0..targets.len()).map(|i| format!("gpu-{i}")).collect();
    let jobs: Vec<(&str, &str, &str)> = names
        .iter()
        .zip(&targets)
        .map(|(n, t)| (n.as_str(), t.as_str(), ""))
        .collect();
    let prometheus = Prometheus::start(&jobs);
    c.set_utilization(70);
    // Scraping every exporter (the Deployment may be at 0 here: the query has no pods
    // until KEDA brings it to minReplicaCount).
    c.wait(
        "Prometheus scraping the exporters",
        Duration::from_secs(60),
        || {
            let up = prometheus.query("up == 1");
            (up.len() == targets.len()).then_some(())
        },
    );
    let example = c.dir().join("examples/keda-prometheus/rendered.yaml");
    let rendered = std::fs::read_to_string(&example).expect("rendered example");
    assert!(rendered.contains("http://prometheus-operated.monitoring.svc:9090"));
    let local = c.dir().join("keda-prometheus-local.yaml");
    std::fs::write(
        &local,
        rendered.replace(
            "http://prometheus-operated.monitoring.svc:9090",
            &prometheus.base,
        ),
    )
    .expect("write");
    c.ok(&["apply", "-f", local.to_str().expect("path")]);
    let name = "resnet-inference-prometheus";
    quicken(c, name, 300);
    c.wait(
        "the ScaledObject Ready and Active",
        Duration::from_secs(120),
        || {
            (condition(c, name, "Ready")? == "True" && condition(c, name, "Active")? == "True")
                .then_some(())
        },
    );
    let hpa_name = format!("keda-hpa-{name}");
    let formula = |current, values: &[i64]| hpa::average_value(current, values, TARGET_MILLI);
    let start = settle(c, &hpa_name, 70);
    let (_, up, latency) = step(c, &hpa_name, 70, 100, formula);
    assert!(up > start, "scaled up: {start} → {up}");
    eprintln!("timing keda-prometheus scale-up: {latency:.2} s");
    c.ok(&["delete", "scaledobject", "-n", NS, name]);
}

/// A Secret's key, decoded.
fn secret_key(c: &Cluster, secret: &str, key: &str) -> String {
    let s = c.json(&["secret", "-n", NS, secret]);
    let data = s["data"][key].as_str().expect("the Secret's key");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64");
    String::from_utf8(bytes).expect("PEM")
}

/// A client certificate for user `cn`, as deploy/examples/keda-metrics-api has a user
/// get one: a CertificateSigningRequest for kubernetes.io/kube-apiserver-client,
/// approved, signed by the cluster's client CA.
fn cluster_signed_client(c: &Cluster, cn: &str) -> Leaf {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let csr = params
        .serialize_request(&key)
        .expect("CSR")
        .pem()
        .expect("PEM");
    let object = serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": cn},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["digital signature", "client auth"]
        }
    });
    let file = c.dir().join(format!("csr-{cn}.json"));
    std::fs::write(&file, object.to_string()).expect("write");
    c.ok(&["apply", "-f", file.to_str().expect("path")]);
    c.ok(&["certificate", "approve", cn]);
    let cert = c.wait("the CSR signed", Duration::from_secs(60), || {
        let issued = c.json(&["csr", cn])["status"]["certificate"]
            .as_str()
            .map(str::to_string)?;
        base64::engine::general_purpose::STANDARD
            .decode(issued)
            .ok()
    });
    Leaf {
        cert_pem: String::from_utf8(cert).expect("PEM"),
        key_pem: key.serialize_pem(),
    }
}

/// deploy/examples/keda-metrics-api: KEDA's metrics-api trigger on the adapter's HTTPS
/// metrics-api face, KEDA presenting the client certificate the cluster signed (cluster.sh
/// asks for it as the example says), the example's ClusterRole letting that user in.
/// The ScaledObject Ready and Active, the adapter answering KEDA's request with the sum
/// over the Deployment's pods, KEDA's HPA deciding what the HPA formula gives on it. The
/// same face refuses (403) a user from the same CA that the example does not bind, no
/// certificate at all, and KEDA's user outside the namespace its ClusterRole names.
fn the_metrics_api_trigger_drives_kedas_hpa(c: &Cluster) {
    let name = "resnet-inference-metrics-api";
    apply_example(c, "keda-metrics-api");
    quicken(c, name, 300);
    // Active alone does not say KEDA reads the adapter: while every read fails, KEDA
    // serves the fallback (2 replicas, Active). Its health record says whether the
    // reads succeed.
    let reads_succeed = || {
        let so = c.json(&["scaledobject", "-n", NS, name]);
        let health = so["status"]["health"].as_object()?;
        (!health.is_empty() && health.values().all(|h| h["status"] == "Happy")).then_some(())
    };
    e2e_tests::try_wait_for(Duration::from_secs(120), || {
        // Fallback is `Unknown` until KEDA first decides on it, then `False`.
        (condition(c, name, "Ready")? == "True"
            && condition(c, name, "Active")? == "True"
            && condition(c, name, "Fallback").as_deref() != Some("True"))
            .then_some(())?;
        reads_succeed()
    })
    .unwrap_or_else(|| {
        let so = c.json(&["scaledobject", "-n", NS, name]);
        panic!(
            "the ScaledObject is not Ready and Active with KEDA's reads succeeding within 120 s: {}",
            so["status"]
        )
    });
    let hpa_name = format!("keda-hpa-{name}");
    let formula = |current, values: &[i64]| hpa::average_value(current, values, TARGET_MILLI);
    let start = settle(c, &hpa_name, 70);
    assert!(reads_succeed().is_some(), "KEDA's reads fail");

    // The request KEDA makes (the example's url as rendered for this cluster), with the
    // certificate and CA of the Secret its TriggerAuthentication names.
    let so = c.json(&["scaledobject", "-n", NS, name]);
    let url = so["spec"]["triggers"][0]["metadata"]["url"]
        .as_str()
        .expect("url")
        .to_string();
    let secret = "gpu-metrics-adapter-metrics-api-client";
    let ca = secret_key(c, secret, "ca.crt");
    let keda = Leaf {
        cert_pem: secret_key(c, secret, "tls.crt"),
        key_pem: secret_key(c, secret, "tls.key"),
    };
    let (status, body) = HttpsClient::new(&ca, Some(&keda))
        .get(&url, &[])
        .expect("the metrics-api face");
    assert_eq!(status, 200, "{url}: {body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        answer["value"].as_f64(),
        Some(start as f64 * 70.0),
        "{start} pods at 70 %: {answer}"
    );
    let refused = |client: &HttpsClient, url: &str, who: &str| {
        let (status, body) = client.get(url, &[]).expect("the metrics-api face");
        assert_eq!(status, 403, "{who} on {url}: {body}");
    };
    let stranger = cluster_signed_client(c, "not-bound-to-metrics-api");
    refused(
        &HttpsClient::new(&ca, Some(&stranger)),
        &url,
        "a user the example does not bind",
    );
    refused(&HttpsClient::new(&ca, None), &url, "no certificate");
    refused(
        &HttpsClient::new(&ca, Some(&keda)),
        &url.replace("/namespaces/inference/", "/namespaces/kube-system/"),
        "KEDA's user outside its namespace",
    );

    let (_, up, latency) = step(c, &hpa_name, 70, 100, formula);
    assert!(up > start, "scaled up: {start} → {up}");
    eprintln!("timing keda-metrics-api scale-up ({start} → {up} replicas): {latency:.2} s");
    c.ok(&["delete", "scaledobject", "-n", NS, name]);
}
