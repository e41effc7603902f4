//! Issue 18 in a real control plane (`tests/kube/cluster.sh`): the adapter started with
//! deploy/examples/composite-hpa's composites.conf, that example's HPA on the composite
//! `pressure` scaling the example Deployment up and back down through the aggregator,
//! each decision checked against the HPA's formula on the value it read, and the
//! composite checked per pod against the formula over the pod's own inputs.

use e2e_tests::cluster::Cluster;
use e2e_tests::hpa;
use e2e_tests::quantity::milli_value;
use e2e_tests::{try_wait_for, workspace};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NS: &str = "inference";
const HPA: &str = "resnet-inference-pressure";
/// The example HPA's target (averageValue "100"), in milli-units.
const TARGET_MILLI: i64 = 100_000;

/// composites.conf's `pressure`, written out here.
fn pressure(util: f64, tensor: f64) -> f64 {
    (util / 70.0).max(tensor / 50.0) * 100.0
}

/// The aggregator's per-pod answer for the example's pods: pod → value.
fn per_pod(c: &Cluster, metric: &str) -> Option<BTreeMap<String, f64>> {
    let list = c
        .raw(&format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/{metric}?labelSelector=app%3Dresnet-inference"
        ))
        .ok()?;
    list["items"]
        .as_array()?
        .iter()
        .map(|i| {
            Some((
                i["describedObject"]["name"].as_str()?.to_string(),
                milli_value(i["value"].as_str()?).ok()? as f64 / 1000.0,
            ))
        })
        .collect()
}

fn running(c: &Cluster) -> usize {
    c.json(&["pods", "-n", NS, "-l", "app=resnet-inference"])["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|p| {
                    p["status"]["phase"] == "Running"
                        && p["metadata"]["deletionTimestamp"].is_null()
                })
                .count()
        })
        .unwrap_or(0)
}

fn hpa_status(c: &Cluster) -> serde_json::Value {
    c.json(&["hpa", "-n", NS, HPA])["status"].clone()
}

/// Set the utilisation and wait until every running pod's composite equals the
/// formula over its own inputs, all pods agree, and the HPA wants what it has.
/// Returns (replicas, the per-pod pressure).
fn settle(c: &Cluster, percent: u32) -> (i64, f64) {
    c.set_utilization(percent);
    c.wait(
        &format!("{HPA} steady at {percent} %"),
        Duration::from_secs(120),
        || {
            let d = c.json(&["deployment", "-n", NS, "resnet-inference"]);
            let replicas = d["spec"]["replicas"].as_i64()?;
            (d["status"]["readyReplicas"].as_i64()? == replicas).then_some(())?;
            (running(c) as i64 == replicas).then_some(())?;
            let util = per_pod(c, "gpu_utilization")?;
            let tensor = per_pod(c, "gpu_tensor_active")?;
            let composite = per_pod(c, "pressure")?;
            (composite.len() as i64 == replicas).then_some(())?;
            (util.values().all(|u| *u == f64::from(percent))).then_some(())?;
            for (pod, value) in &composite {
                let want = pressure(*util.get(pod)?, *tensor.get(pod)?);
                ((value - want).abs() < 0.01).then_some(())?;
            }
            let first = *composite.values().next()?;
            composite
                .values()
                .all(|v| (v - first).abs() < 0.01)
                .then_some(())?;
            let s = hpa_status(c);
            let (current, desired) = (
                s["currentReplicas"].as_i64()?,
                s["desiredReplicas"].as_i64()?,
            );
            (current == replicas && desired == replicas).then_some((replicas, first))
        },
    )
}

/// The pods' composite once every pod's utilisation reads `percent`, checked against
/// the formula over each pod's own inputs.
fn pressure_at(c: &Cluster, percent: u32) -> f64 {
    c.wait(
        &format!("the composite at {percent} %"),
        Duration::from_secs(60),
        || {
            let util = per_pod(c, "gpu_utilization")?;
            let tensor = per_pod(c, "gpu_tensor_active")?;
            let composite = per_pod(c, "pressure")?;
            util.values()
                .all(|u| *u == f64::from(percent))
                .then_some(())?;
            let (pod, value) = composite.iter().next()?;
            let want = pressure(*util.get(pod)?, *tensor.get(pod)?);
            ((value - want).abs() < 0.01).then_some(want)
        },
    )
}

/// Change the utilisation from a settled state and wait for the HPA's next decision;
/// check it against the HPA formula on the average it reports having read, which must
/// lie between the old and the new pressure. Returns (before, after, seconds).
fn step(c: &Cluster, settled: f64, percent: u32) -> (i64, i64, f64) {
    let before = hpa_status(c)["desiredReplicas"].as_i64().expect("desired");
    c.set_utilization(percent);
    let changed = Instant::now();
    let status = try_wait_for(Duration::from_secs(90), || {
        let s = hpa_status(c);
        (s["desiredReplicas"].as_i64()? != before).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "{HPA} did not act on {percent} % from {before} replicas within 90 s: {}\nadapter: {:?}",
            hpa_status(c),
            per_pod(c, "pressure")
        )
    });
    let latency = changed.elapsed().as_secs_f64();
    let new_pressure = pressure_at(c, percent);
    let current = status["currentReplicas"].as_i64().expect("current");
    let desired = status["desiredReplicas"].as_i64().expect("desired");
    let metric = &status["currentMetrics"][0]["pods"];
    assert_eq!(metric["metric"]["name"], "pressure", "{status}");
    let average = milli_value(metric["current"]["averageValue"].as_str().expect("average"))
        .expect("quantity");
    let (low, high) = (
        (settled.min(new_pressure) * 1000.0).floor() as i64,
        (settled.max(new_pressure) * 1000.0).ceil() as i64,
    );
    assert!(
        (low..=high).contains(&average),
        "{HPA} read {average}m, not on the way from {settled} to {new_pressure}: {status}"
    );
    let read = vec![average; current as usize];
    assert_eq!(
        desired,
        hpa::pods_average_value(current, &read, 0, TARGET_MILLI),
        "{HPA}: {current} replicas averaging {average}m: {status}"
    );
    eprintln!(
        "{HPA}: pressure {settled:.1} → {new_pressure:.1}: {current} → {desired} replicas, {latency:.2} s after the change"
    );
    (current, desired, latency)
}

#[test]
fn a_real_hpa_scales_on_the_composite_metric_up_and_back_down() {
    let conf = workspace().join("deploy/examples/composite-hpa/composites.conf");
    let args = format!("--composite-metrics-file {}", conf.display());
    let c = Cluster::up_with(&[("ADAPTER_ARGS", args.as_str())]);
    // The example replaces examples/hpa's HPA: two on one Deployment would both stop.
    c.ok(&["delete", "hpa", "-n", NS, "resnet-inference"]);
    // The example's HPA (its Deployment is the one `up` runs, adapted to the nodes).
    let hpa_file = workspace().join("deploy/examples/composite-hpa/hpa.yaml");
    c.ok(&[
        "apply",
        "--server-side",
        "-f",
        hpa_file.to_str().expect("path"),
    ]);
    // Immediate scale-down for the test (the example waits 300 s, as production should).
    c.ok(&[
        "patch",
        "hpa",
        "-n",
        NS,
        HPA,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":0}}}}"#,
    ]);
    let (start, p70) = settle(&c, 70);
    let (_, up, _) = step(&c, p70, 100);
    assert!(up > start, "scaled up on the composite: {start} → {up}");
    let (now, p70) = settle(&c, 70);
    let (_, down, _) = step(&c, p70, 35);
    assert!(down < now, "scaled down on the composite: {now} → {down}");
    let active = hpa_status(&c)["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|cond| cond["type"] == "ScalingActive")
        .map(|cond| cond["status"].clone());
    assert_eq!(active, Some(serde_json::json!("True")));
}
