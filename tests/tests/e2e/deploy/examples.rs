//! The examples: they scale the inference Deployment on metrics that exist, and the KEDA
//! prometheus trigger's query returns what its metric type needs.

use super::*;
use e2e_tests::hpa;
use e2e_tests::quantity::milli_value;
use e2e_tests::{KubeNode, Prometheus, attributed_exporter_with, query_value, try_wait_for};
use gpu_metrics_adapter::fleet::GpuMetric;
use std::time::Duration;

#[test]
fn examples_scale_the_inference_deployment_on_metrics_that_exist() {
    let served: Vec<&str> = GpuMetric::served().into_iter().map(|m| m.name()).collect();
    let default = build("overlays/default");
    let adapter_svc = find(&default, "Service", "gpu-metrics-adapter");
    let grpc_port = arr(adapter_svc, "/spec/ports")
        .iter()
        .find(|p| p["name"] == "grpc")
        .and_then(|p| p["port"].as_i64())
        .expect("gRPC port on the adapter Service");
    let cert = find(&default, "Certificate", "gpu-metrics-adapter-tls");

    let deployment_of = |objs: &[Value], target: &Value| -> Value {
        assert_eq!(target["kind"], "Deployment");
        find(objs, "Deployment", str_at(target, "/name")).clone()
    };
    let check_inference = |d: &Value| {
        let spec = pod_spec(d);
        let c = &spec["containers"][0];
        let gpu_req = &c["resources"]["requests"]["nvidia.com/gpu"];
        assert!(!gpu_req.is_null(), "the example requests a GPU");
        assert_eq!(
            gpu_req, &c["resources"]["limits"]["nvidia.com/gpu"],
            "GPU requests = limits"
        );
        assert!(
            arr(spec, "/tolerations")
                .iter()
                .any(|t| t["key"] == "nvidia.com/gpu")
        );
        assert!(c["readinessProbe"].is_object());
        let labels = string_map(&d["spec"]["template"]["metadata"]["labels"]);
        assert!(labels.contains_key("app"), "pods carry `app`");
        assert!(selects(&d["spec"]["selector"], &labels));
    };

    // Plain HPA on the custom metrics API.
    let objs = build("examples/hpa");
    let hpa_obj = &all(&objs, "HorizontalPodAutoscaler")[0];
    check_inference(&deployment_of(&objs, &hpa_obj["spec"]["scaleTargetRef"]));
    let metric = &arr(hpa_obj, "/spec/metrics")[0];
    assert_eq!(metric["type"], "Pods");
    let metric_name = str_at(metric, "/pods/metric/name");
    assert!(
        served.contains(&metric_name),
        "{metric_name} is not served: {served:?}"
    );
    assert_eq!(metric["pods"]["target"]["type"], "AverageValue");
    let hpa_target = str_at(metric, "/pods/target/averageValue");

    // KEDA external scaler.
    let objs = build("examples/keda-external");
    let so = &all(&objs, "ScaledObject")[0];
    check_inference(&deployment_of(&objs, &so["spec"]["scaleTargetRef"]));
    let t = &arr(so, "/spec/triggers")[0];
    assert_eq!(t["type"], "external");
    let m = &t["metadata"];
    let want_address = format!(
        "{}.{}.svc:{grpc_port}",
        name(adapter_svc),
        namespace(adapter_svc)
    );
    assert_eq!(str_at(m, "/scalerAddress"), want_address);
    let host = want_address.split(':').next().unwrap();
    assert!(
        arr(cert, "/spec/dnsNames").contains(&Value::from(host)),
        "the serving certificate does not name {host}"
    );
    assert_eq!(m["enableTLS"], "true");
    let auth = find(
        &objs,
        "TriggerAuthentication",
        str_at(t, "/authenticationRef/name"),
    );
    assert!(
        arr(auth, "/spec/secretTargetRef")
            .iter()
            .any(|r| r["parameter"] == "caCert")
    );
    assert!(served.contains(&str_at(m, "/metric")));
    assert_eq!(m["deployment"], so["spec"]["scaleTargetRef"]["name"]);
    // sum ÷ replicas (AverageValue) or an average compared as is (Value).
    let metric_type = t["metricType"].as_str().unwrap_or("AverageValue");
    let aggregation = m["aggregation"].as_str().unwrap_or("sum");
    assert!(
        matches!(
            (aggregation, metric_type),
            ("sum", "AverageValue") | ("average", "Value")
        ),
        "aggregation {aggregation} with metricType {metric_type} divides wrongly"
    );
    assert_eq!(
        str_at(m, "/targetValue"),
        hpa_target,
        "the examples keep the same target"
    );

    // KEDA metrics-api trigger, on the adapter Service's https port: the same pods, sum
    // with AverageValue, TLS client-certificate auth, and RBAC that lets the
    // certificate's user get the url's path.
    let https_port = arr(adapter_svc, "/spec/ports")
        .iter()
        .find(|p| p["name"] == "https")
        .and_then(|p| p["port"].as_i64())
        .expect("https port on the adapter Service");
    let objs = build("examples/keda-metrics-api");
    let so = &all(&objs, "ScaledObject")[0];
    check_inference(&deployment_of(&objs, &so["spec"]["scaleTargetRef"]));
    let t = &arr(so, "/spec/triggers")[0];
    assert_eq!(t["type"], "metrics-api");
    let m = &t["metadata"];
    let url = str_at(m, "/url");
    let origin = format!(
        "https://{}.{}.svc:{https_port}/",
        name(adapter_svc),
        namespace(adapter_svc)
    );
    let rest = url
        .strip_prefix(&origin)
        .unwrap_or_else(|| panic!("{url} is not on {origin}"));
    let (path, query) = rest.split_once('?').expect("a query");
    let path = format!("/{path}");
    let segments: Vec<&str> = path.split('/').collect();
    assert_eq!(
        segments[..4],
        ["", "metrics-api", "namespaces", namespace(so)],
        "{path}"
    );
    assert!(
        served.contains(&segments[4]),
        "{} is not served",
        segments[4]
    );
    let params: BTreeMap<&str, &str> = query
        .split('&')
        .map(|kv| kv.split_once('=').expect("key=value"))
        .collect();
    assert_eq!(params["deployment"], so["spec"]["scaleTargetRef"]["name"]);
    let metric_type = t["metricType"].as_str().unwrap_or("AverageValue");
    let aggregation = params.get("aggregation").copied().unwrap_or("sum");
    assert!(
        matches!(
            (aggregation, metric_type),
            ("sum", "AverageValue") | ("average", "Value")
        ),
        "aggregation {aggregation} with metricType {metric_type} divides wrongly"
    );
    assert_eq!(m["valueLocation"], "value");
    assert_eq!(str_at(m, "/targetValue"), hpa_target, "the same target");
    assert_eq!(m["authModes"], "tls");
    assert!(m["unsafeSsl"].is_null(), "the adapter's CA verifies it");
    let auth = find(
        &objs,
        "TriggerAuthentication",
        str_at(t, "/authenticationRef/name"),
    );
    let params: BTreeSet<&str> = arr(auth, "/spec/secretTargetRef")
        .iter()
        .map(|r| str_at(r, "/parameter"))
        .collect();
    assert_eq!(params, BTreeSet::from(["ca", "cert", "key"]));
    // Some ClusterRole bound to a User lets it `get` the path (RBAC's non-resource
    // match: exact, or a prefix ending in `*`).
    let allowed = all(&objs, "ClusterRoleBinding").iter().any(|b| {
        let role = find(&objs, "ClusterRole", str_at(b, "/roleRef/name"));
        arr(b, "/subjects").iter().any(|s| s["kind"] == "User")
            && arr(role, "/rules").iter().any(|r| {
                arr(r, "/verbs").iter().any(|v| v == "get")
                    && arr(r, "/nonResourceURLs").iter().any(|u| {
                        let u = u.as_str().unwrap_or_default();
                        match u.strip_suffix('*') {
                            Some(prefix) => path.starts_with(prefix),
                            None => path == u,
                        }
                    })
            })
    });
    assert!(allowed, "no ClusterRole lets a user get {path}");

    // KEDA prometheus trigger (its query is checked against Prometheus below).
    let objs = build("examples/keda-prometheus");
    let so = &all(&objs, "ScaledObject")[0];
    check_inference(&deployment_of(&objs, &so["spec"]["scaleTargetRef"]));
    let t = &arr(so, "/spec/triggers")[0];
    assert_eq!(t["type"], "prometheus");
    assert_eq!(str_at(t, "/metadata/threshold"), hpa_target);
}

/// The prometheus trigger's query, run by a real Prometheus scraping the exporter on a
/// simulated node with the example's pods (and others it must leave out), returns
/// what the trigger's metricType needs: with AverageValue the sum over the app's pods of
/// each pod's mean GPU utilisation (KEDA's HPA divides it by the replicas), with Value
/// their average; and the HPA then decides as the adapter-backed HPA example would.
#[test]
fn the_prometheus_trigger_query_returns_what_its_metric_type_needs() {
    let objs = build("examples/keda-prometheus");
    let so = all(&objs, "ScaledObject")[0];
    let trigger = arr(so, "/spec/triggers")
        .iter()
        .find(|t| t["type"] == "prometheus")
        .expect("a prometheus trigger");
    let query = str_at(trigger, "/metadata/query");
    let threshold = milli_value(str_at(trigger, "/metadata/threshold")).expect("threshold");
    let metric_type = trigger["metricType"].as_str().unwrap_or("AverageValue");
    let deployment = find(&objs, "Deployment", str_at(so, "/spec/scaleTargetRef/name"));
    let app_ns = namespace(deployment).to_string();
    let app = string_map(&deployment["spec"]["template"]["metadata"]["labels"])["app"].clone();

    // The exporter with the deployed pod-label flags.
    let default = build("overlays/default");
    let deployed = args(container(exporter_ds(&default), "exporter"));
    let pod_labels = flag(&deployed, "--kubernetes-pod-labels")
        .expect("pod labels")
        .to_string();

    // What the scenario implies: per pod of the app, the mean of its GPUs' utilisation.
    let scenario = gpu_sim::Scenario::load(&workspace().join(SCENARIO)).expect("scenario");
    let t = scenario.clock.frozen_at_s.expect("a frozen scenario");
    let sim = gpu_sim::SimNode::new(&scenario, std::time::UNIX_EPOCH);
    let util = |gpu: u32| -> f64 {
        f64::from(
            sim.gpu_reading(gpu, t)
                .gpu_util_percent
                .expect("whole-GPU utilisation"),
        )
    };
    let mut per_pod = Vec::new();
    let mut app_gpus = Vec::new();
    let mut holders = BTreeMap::new();
    for pod in scenario.pods.iter().filter(|p| p.started(t) && !p.ended(t)) {
        let gpus: Vec<u32> = pod
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .map(|d| {
                assert!(
                    d.mig.is_none() && d.replica.is_none(),
                    "whole GPUs only here"
                );
                d.gpu.expect("GPU index")
            })
            .collect();
        for g in &gpus {
            holders.insert(*g, pod.name.clone());
        }
        if pod.namespace == app_ns && pod.labels.get("app") == Some(&app) {
            per_pod.push(gpus.iter().map(|g| util(*g)).sum::<f64>() / gpus.len() as f64);
            app_gpus.extend(gpus.iter().map(|g| util(*g)));
        }
    }
    assert!(
        per_pod.len() >= 2,
        "the scenario needs several pods of {app}"
    );
    assert!(
        app_gpus.len() > per_pod.len(),
        "…and a pod with several GPUs"
    );
    let want = match metric_type {
        "AverageValue" => per_pod.iter().sum::<f64>(),
        "Value" => per_pod.iter().sum::<f64>() / per_pod.len() as f64,
        other => panic!("metricType {other}"),
    };

    let node = KubeNode::start(SCENARIO, "node-a");
    let labels_flag = format!("--kubernetes-pod-labels={pod_labels}");
    let exporter = attributed_exporter_with(&node, SCENARIO, &[&labels_flag]);
    let target = exporter.base.trim_start_matches("http://").to_string();
    let prometheus = Prometheus::start(&[("gpu-exporter", &target, "")]);

    // Wait until Prometheus holds every GPU's series with its final pod label (earlier
    // scrapes may predate attribution; their series go stale on the next scrape).
    let n_gpus = sim.gpus.len();
    let settled = try_wait_for(Duration::from_secs(60), || {
        let series = prometheus.query("DCGM_FI_DEV_GPU_UTIL");
        let pods: BTreeMap<u32, String> = series
            .iter()
            .filter_map(|s| {
                let gpu = s["metric"]["gpu"].as_str()?.parse().ok()?;
                Some((gpu, s["metric"]["pod"].as_str()?.to_string()))
            })
            .collect();
        (series.len() == n_gpus && pods == holders).then_some(())
    });
    assert!(
        settled.is_some(),
        "Prometheus never held the scenario's {n_gpus} GPUs with their pods; it has {:?}",
        prometheus.query("DCGM_FI_DEV_GPU_UTIL")
    );

    let result = prometheus.query(query);
    assert_eq!(
        result.len(),
        1,
        "KEDA needs exactly one element from {query}: {result:?}"
    );
    let got = query_value(&result[0]);
    assert!(
        (got - want).abs() < 1e-9,
        "{query} = {got}, the scenario implies {want} for {metric_type} (per pod {per_pod:?})"
    );

    // KEDA hands the value to its HPA as an External metric of that type; the decision
    // must be the one the per-pod target means (the Pods-metric HPA on the same values).
    let current = per_pod.len() as i64;
    let milli = |v: f64| (v * 1000.0).ceil() as i64;
    let per_pod_milli: Vec<i64> = per_pod.iter().map(|v| milli(*v)).collect();
    let intended = hpa::pods_average_value(current, &per_pod_milli, 0, threshold);
    let keda = match metric_type {
        "AverageValue" => hpa::average_value(current, &[milli(got)], threshold),
        _ => hpa::value(current, current, &[milli(got)], threshold),
    };
    assert_eq!(
        keda, intended,
        "KEDA would scale to {keda}, the per-pod target to {intended}"
    );
    assert_ne!(
        intended, current,
        "the scenario should call for scaling, or this proves little"
    );
    // The classic mistake on the same data: an average over GPUs with AverageValue.
    let gpu_avg = app_gpus.iter().sum::<f64>() / app_gpus.len() as f64;
    assert_ne!(
        hpa::average_value(current, &[milli(gpu_avg)], threshold),
        intended,
        "the scenario does not tell the right query from the classic mistake"
    );
}
