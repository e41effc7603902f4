//! The adapter and the exporters in a real control plane (`tests/kube/cluster.sh`):
//! kube-apiserver's aggregation layer in front of the adapter, RBAC, the real HPA
//! controller scaling a Deployment whose pods kwok runs on simulated GPU nodes, and
//! every kustomization of `deploy/` applied server-side. One cluster serves every
//! step; each step is a function named for what it proves.

use e2e_tests::cluster::Cluster;
use e2e_tests::hpa;
use e2e_tests::quantity::milli_value;
use e2e_tests::{Adapter, workspace};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

const NS: &str = "inference";
const SELECTOR: &str = "app=resnet-inference";
/// The examples' HPA target (deploy/examples/hpa/hpa.yaml), in milli-units.
pub(crate) const TARGET_MILLI: i64 = 70_000;
pub(crate) const APISERVICES: [&str; 3] = [
    "v1beta2.custom.metrics.k8s.io",
    "v1beta1.custom.metrics.k8s.io",
    "v1beta1.external.metrics.k8s.io",
];

#[test]
fn a_real_control_plane_aggregates_authorizes_and_scales() {
    let mut c = Cluster::up();
    apiservices_are_available(&c);
    the_aggregator_serves_every_metric_kind(&c);
    rbac_decides_and_the_adapter_sees_the_front_proxy_user(&c);
    the_hpa_scales_on_the_pods_metric(&c);
    the_hpa_scales_on_the_external_metric(&c);
    the_service_accounts_call_only_what_the_code_says_and_rbac_grants(&c);
    pod_security_admits_each_pod_only_in_its_own_namespace(&c);
    every_kustomization_applies_server_side(&c);
    let running = c.down();
    assert!(
        running.len() >= 8,
        "up started the whole cluster: {running:?}"
    );
    assert_eq!(
        c.running(),
        Vec::<u32>::new(),
        "down leaves nothing running"
    );
}

/// Issue 20, least privilege, against what really happened: the kube-apiserver's audit
/// log (cluster.sh records the three accounts) lists every request the exporters, the
/// adapter and the HPA controller made so far. None was refused; each is a call
/// rbac.rs read from the binary's source (so deploy/adapter.rs's "grants == calls" holds for
/// the real traffic too); the HPA controller only gets and lists metrics. The
/// bootstrap roles deploy/ binds grant what deploy/mod.rs assumes.
fn the_service_accounts_call_only_what_the_code_says_and_rbac_grants(c: &Cluster) {
    use crate::rbac::{self, Call};
    let exporter = "system:serviceaccount:gpu-exporter:gpu-exporter";
    let adapter = "system:serviceaccount:gpu-monitoring:gpu-metrics-adapter";
    let hpa = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";

    // `up`'s adapter is given --exporter-url and only ever sees the aggregator's
    // front-proxy certificate. A second one, as deploy/ runs it, with the same
    // ServiceAccount, discovers the exporters (--exporter-service's default) and is
    // called with a bearer token, so every call in its source happens for real.
    let certs = Path::new(c.env("ADAPTER_CA")).parent().expect("certs dir");
    let kubeconfig = c.dir().join("adapter.kubeconfig");
    let second = Adapter::start_tls(&[
        "--tls-cert-file",
        certs.join("tls.crt").to_str().unwrap(),
        "--tls-private-key-file",
        certs.join("tls.key").to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    let token = c.ok(&["-n", "default", "create", "token", "default"]);
    let port = second.base.rsplit(':').next().expect("port");
    let host = "gpu-metrics-adapter.gpu-monitoring.svc";
    let status = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(c.env("ADAPTER_CA"))
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .args(["-H", &format!("Authorization: Bearer {}", token.trim())])
        .arg(format!(
            "https://{host}:{port}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/gpu_utilization"
        ))
        .output()
        .expect("curl");
    // 403, not 401: the TokenReview authenticated default/default, whom the
    // SubjectAccessReview then denied.
    assert_eq!(String::from_utf8_lossy(&status.stdout), "403");

    let read_audit = || {
        let audit = std::fs::read_to_string(c.dir().join("audit.jsonl")).expect("audit log");
        audit.lines().map(str::to_string).collect::<Vec<_>>()
    };
    let adapter_calls = rbac::calls_in(&workspace().join("metrics-adapter/src"));
    let discovery = rbac::call("watch", "discovery.k8s.io", "endpointslices");
    assert!(adapter_calls.contains(&discovery), "{adapter_calls:?}");
    c.wait(
        "the second adapter's EndpointSlice watch in the audit log",
        Duration::from_secs(60),
        || {
            read_audit()
                .iter()
                .any(|l| {
                    l.contains(adapter)
                        && l.contains("\"verb\":\"watch\"")
                        && l.contains("\"resource\":\"endpointslices\"")
                })
                .then_some(())
        },
    );
    drop(second);

    let mut seen: std::collections::BTreeMap<&str, BTreeSet<Call>> = Default::default();
    for line in read_audit() {
        let line = line.as_str();
        let e: Value = serde_json::from_str(line).expect("audit event");
        let user = e["user"]["username"].as_str().unwrap_or_default();
        let Some(who) = [exporter, adapter, hpa].into_iter().find(|u| *u == user) else {
            continue;
        };
        let r = &e["objectRef"];
        assert_ne!(e["responseStatus"]["code"], 403, "refused: {line}");
        if r["resource"] == "configmaps" {
            // The one ConfigMap extension-apiserver-authentication-reader names.
            assert_eq!(r["namespace"], "kube-system", "{line}");
            assert_eq!(r["name"], "extension-apiserver-authentication", "{line}");
        }
        seen.entry(who).or_default().insert(rbac::call(
            e["verb"].as_str().unwrap_or_default(),
            r["apiGroup"].as_str().unwrap_or_default(),
            r["resource"].as_str().unwrap_or_default(),
        ));
    }
    let mut exporter_calls = rbac::calls_in(&workspace().join("exporter/src"));
    // The counters ConfigMap `get` is made only with -m/--configmap-data, which the
    // deployed exporters do not use (they mount the CSV; e2e counters_reload runs -m).
    exporter_calls.remove(&rbac::call("get", "", "configmaps"));
    assert_eq!(
        seen.get(exporter),
        Some(&exporter_calls),
        "the exporters' calls"
    );
    assert_eq!(
        seen.get(adapter),
        Some(&adapter_calls),
        "the adapters' calls"
    );
    let hpa_verbs: BTreeSet<&str> = seen
        .get(hpa)
        .into_iter()
        .flatten()
        .filter(|(_, group, _)| group.ends_with(".metrics.k8s.io"))
        .map(|(verb, _, _)| verb.as_str())
        .collect();
    assert_eq!(
        hpa_verbs.into_iter().collect::<Vec<_>>(),
        ["get", "list"],
        "what the HPA controller called on the metrics APIs"
    );

    // The bootstrap roles, as this kube-apiserver defines them.
    for (kind, name, rules) in crate::deploy::BUILTIN_ROLE_RULES {
        let mut args = vec![kind, name];
        if kind == "Role" {
            args.extend(["-n", "kube-system"]);
        }
        let role = c.json(&args);
        let mut real = BTreeSet::new();
        for rule in role["rules"].as_array().expect("rules") {
            for verb in rule["verbs"].as_array().into_iter().flatten() {
                for group in rule["apiGroups"].as_array().into_iter().flatten() {
                    for resource in rule["resources"].as_array().into_iter().flatten() {
                        real.insert(rbac::call(
                            verb.as_str().unwrap_or_default(),
                            group.as_str().unwrap_or_default(),
                            resource.as_str().unwrap_or_default(),
                        ));
                    }
                }
            }
        }
        let assumed: BTreeSet<Call> = rules.iter().map(|(v, g, r)| rbac::call(v, g, r)).collect();
        assert_eq!(real, assumed, "{kind} {name}");
    }
}

/// Issue 20, Pod Security: the kube-apiserver's own admission (server-side dry runs of
/// the pods the workloads would create) admits the adapter under deploy/'s "restricted"
/// namespace and the exporter, with and without hostPID, under its "privileged" one,
/// and refuses the exporter in the adapter's namespace: "restricted" is enforced there.
fn pod_security_admits_each_pod_only_in_its_own_namespace(c: &Cluster) {
    let deploy = workspace().join("deploy");
    let pod_of = |dir: &str, kind: &str, namespace: Option<&str>| -> (String, Value) {
        let yaml = c.ok(&["kustomize", deploy.join(dir).to_str().unwrap()]);
        let objects: Vec<Value> = serde_saphyr::from_multiple(&yaml).expect("kustomize output");
        let w = objects
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {dir}"));
        let ns = namespace
            .or(w["metadata"]["namespace"].as_str())
            .expect("namespace")
            .to_string();
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("pod-security-{}", kind.to_lowercase()),
                "namespace": ns,
                "labels": w["spec"]["template"]["metadata"]["labels"],
            },
            "spec": w["spec"]["template"]["spec"],
        });
        (ns, pod)
    };
    let dry_run = |pod: &Value| {
        let file = c
            .dir()
            .join(format!("pod-security-{}.json", std::process::id()));
        std::fs::write(&file, pod.to_string()).unwrap();
        c.run(&[
            "create",
            "--dry-run=server",
            "-o",
            "name",
            "-f",
            file.to_str().unwrap(),
        ])
    };
    let admitted = |dir: &str, kind: &str| {
        let (ns, pod) = pod_of(dir, kind, None);
        let out = dry_run(&pod);
        assert!(
            out.status.success(),
            "{dir}: the {kind}'s pod refused in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ns
    };
    let adapter_ns = admitted("overlays/default", "Deployment");
    let exporter_ns = admitted("overlays/default", "DaemonSet");
    assert_eq!(
        admitted("overlays/process-attribution", "DaemonSet"),
        exporter_ns
    );
    assert_ne!(adapter_ns, exporter_ns);
    let labels = c.json(&["namespace", &adapter_ns])["metadata"]["labels"].clone();
    assert_eq!(
        labels["pod-security.kubernetes.io/enforce"], "restricted",
        "{labels}"
    );
    // The control: the exporter's pod where the adapter runs (as the adapter's
    // ServiceAccount, which exists there, so only Pod Security can refuse it).
    let (_, adapter_pod) = pod_of("overlays/default", "Deployment", None);
    let (_, mut pod) = pod_of("overlays/default", "DaemonSet", Some(&adapter_ns));
    pod["spec"]["serviceAccountName"] = adapter_pod["spec"]["serviceAccountName"].clone();
    let out = dry_run(&pod);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("violates PodSecurity \"restricted"),
        "the exporter admitted in {adapter_ns}: {stderr}"
    );
    assert!(stderr.contains("hostPath"), "{stderr}");
}

pub(crate) fn apiservices_are_available(c: &Cluster) {
    for name in APISERVICES {
        let api = c.json(&["apiservice", name]);
        let available = api["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|cond| cond["type"] == "Available");
        assert_eq!(
            available.map(|cond| &cond["status"]),
            Some(&json!("True")),
            "{name}: {api}"
        );
        // Registered through deploy/overlays/static-certs: its replacement put the CA of
        // the adapter's serving certificate into the caBundle.
        let ca = std::fs::read(c.dir().join("deploy/static-certs/certs/ca.crt")).unwrap();
        let bundle = api["spec"]["caBundle"].as_str().expect("caBundle");
        assert_eq!(base64_decode(bundle), ca, "{name}: caBundle");
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
}

/// The pods of the example Deployment that are Running.
fn running_pods(c: &Cluster) -> Vec<String> {
    let pods = c.json(&["pods", "-n", NS, "-l", SELECTOR]);
    pods["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|p| p["metadata"]["name"].as_str().expect("name").to_string())
        .collect()
}

/// The adapter's per-pod answer for the example's pods: (pod, milli-value).
fn pod_values(c: &Cluster) -> Option<Vec<(String, i64)>> {
    let list = c
        .raw(&format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference"
        ))
        .ok()?;
    list["items"]
        .as_array()?
        .iter()
        .map(|i| {
            Some((
                i["describedObject"]["name"].as_str()?.to_string(),
                milli_value(i["value"].as_str()?).ok()?,
            ))
        })
        .collect()
}

fn the_aggregator_serves_every_metric_kind(c: &Cluster) {
    c.set_utilization(60);
    let pods = running_pods(c);
    assert!(!pods.is_empty(), "the example Deployment runs");
    // Discovery through the aggregator: the group, its preferred version, the metric.
    let groups = c.raw("/apis").expect("/apis");
    let custom = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["name"] == "custom.metrics.k8s.io")
        .unwrap_or_else(|| panic!("custom.metrics.k8s.io not discovered: {groups}"));
    assert_eq!(custom["preferredVersion"]["version"], "v1beta2");
    let resources = c
        .raw("/apis/custom.metrics.k8s.io/v1beta2")
        .expect("discovery");
    let names: Vec<&str> = resources["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(names.contains(&"pods/gpu_utilization"), "{names:?}");
    let api_resources = c.ok(&["api-resources", "--api-group", "external.metrics.k8s.io"]);
    assert!(api_resources.contains("gpu_utilization"), "{api_resources}");

    // One pod's custom metric: the dial's value, from the fake driver through the
    // exporter on the pod's node, the adapter and the aggregator.
    let pod = &pods[0];
    let path =
        format!("/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/{pod}/gpu_utilization");
    let item = c.wait("the pod's metric at 60", Duration::from_secs(30), || {
        let list = c.raw(&path).ok()?;
        let item = list["items"].get(0)?.clone();
        (milli_value(item["value"].as_str()?).ok()? == 60_000).then_some(item)
    });
    assert_eq!(item["describedObject"]["name"], pod.as_str());
    assert_eq!(item["describedObject"]["kind"], "Pod");

    // An Object metric on the Deployment.
    let path = format!(
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/deployments.apps/resnet-inference/gpu_utilization"
    );
    // (Every pod at 60 once the exporters on both nodes have sampled the dial: the one
    // pod above may have been first.)
    let list = c.wait(
        "the Deployment's metric at 60",
        Duration::from_secs(30),
        || {
            let list = c.raw(&path).ok()?;
            (milli_value(list["items"][0]["value"].as_str()?).ok()? == 60_000).then_some(list)
        },
    );
    let item = &list["items"][0];
    assert_eq!(item["describedObject"]["kind"], "Deployment");

    // The external metric: one item per pod of the selector.
    let path = format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/gpu_utilization?labelSelector=app%3Dresnet-inference"
    );
    let list = c.wait(
        "every pod in the external metric",
        Duration::from_secs(30),
        || {
            let list = c.raw(&path).ok()?;
            (list["items"].as_array()?.len() == running_pods(c).len()).then_some(list)
        },
    );
    for item in list["items"].as_array().unwrap() {
        assert_eq!(
            milli_value(item["value"].as_str().unwrap()),
            Ok(60_000),
            "{item}"
        );
    }
}

/// The adapter's own /metrics, read with the admin's client certificate.
fn adapter_counter(c: &Cluster, series: &str) -> f64 {
    let pki = c.dir().join("pki");
    let out = c.ok(&[
        "--server",
        &format!("https://127.0.0.1:{}", c.env("ADAPTER_PORT")),
        "--tls-server-name",
        "gpu-metrics-adapter.gpu-monitoring.svc",
        "--certificate-authority",
        c.env("ADAPTER_CA"),
        "--client-certificate",
        pki.join("admin.crt").to_str().unwrap(),
        "--client-key",
        pki.join("admin.key").to_str().unwrap(),
        "get",
        "--raw",
        "/metrics",
    ]);
    e2e_tests::sample_value(&out, series).unwrap_or(0.0)
}

fn rbac_decides_and_the_adapter_sees_the_front_proxy_user(c: &Cluster) {
    let pod = &running_pods(c)[0];
    let path =
        format!("/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/{pod}/gpu_utilization");
    let out = c.run(&["get", "--raw", &path, "--as", "nobody"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("Forbidden"),
        "{stderr}"
    );
    assert!(stderr.contains("\"nobody\""), "{stderr}");

    // alice may read custom metrics in this namespace only.
    let role = json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "gpu-metrics-reader", "namespace": NS},
             "rules": [{"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "alice-gpu-metrics", "namespace": NS},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpu-metrics-reader"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}
        ]
    });
    apply_json(c, &role);
    let front_proxy = "gpu_metrics_adapter_authentications_total{outcome=\"front-proxy\"}";
    let reviews = "gpu_metrics_adapter_delegated_reviews_total{review=\"SubjectAccessReview\",result=\"allowed\"}";
    let (proxied, allowed) = (adapter_counter(c, front_proxy), adapter_counter(c, reviews));
    // A fresh user: the adapter has no cached decision for alice and asks the API server.
    let item = c.wait("alice's answer", Duration::from_secs(20), || {
        let out = c.run(&["get", "--raw", &path, "--as", "alice"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
    });
    assert_eq!(item["items"][0]["describedObject"]["name"], pod.as_str());
    assert!(
        adapter_counter(c, front_proxy) > proxied,
        "not authenticated as front-proxy"
    );
    assert!(
        adapter_counter(c, reviews) > allowed,
        "alice was not reviewed by the adapter"
    );
    let elsewhere = c.run(&[
        "get",
        "--raw",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/gpu_utilization",
        "--as",
        "alice",
    ]);
    assert!(
        !elsewhere.status.success(),
        "alice's grant is per namespace"
    );
}

fn apply_json(c: &Cluster, v: &Value) {
    let file = c.dir().join(format!("apply-{}.json", std::process::id()));
    std::fs::write(&file, v.to_string()).unwrap();
    c.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        file.to_str().unwrap(),
    ]);
}

/// The HPA's status: (currentReplicas, desiredReplicas).
fn hpa_replicas(c: &Cluster, name: &str) -> (i64, i64) {
    let h = c.json(&["hpa", "-n", NS, name]);
    (
        h["status"]["currentReplicas"].as_i64().unwrap_or(-1),
        h["status"]["desiredReplicas"].as_i64().unwrap_or(-1),
    )
}

/// Wait until the Deployment, its pods' metrics and the HPA agree at `percent`: every
/// running pod has a value, all at `percent`, and the HPA wants what it has.
pub(crate) fn settle(c: &Cluster, hpa_name: &str, percent: i64) -> i64 {
    c.set_utilization(percent as u32);
    c.wait(
        &format!("{hpa_name} steady at {percent} %"),
        Duration::from_secs(90),
        || {
            let d = c.json(&["deployment", "-n", NS, "resnet-inference"]);
            let replicas = d["spec"]["replicas"].as_i64()?;
            (d["status"]["readyReplicas"].as_i64()? == replicas).then_some(())?;
            let values = pod_values(c)?;
            let all_there =
                values.len() as i64 == replicas && values.iter().all(|(_, v)| *v == percent * 1000);
            let (current, desired) = hpa_replicas(c, hpa_name);
            // The HPA's status must come from these values: right after the change it
            // still shows the decision it took on the old ones (a steady 3 replicas
            // at 100 % once read as settled there, then "scaled down" to 4).
            let status = c.json(&["hpa", "-n", NS, hpa_name])["status"].clone();
            let read_now = reported_average(&status) == Some(percent * 1000);
            (all_there && read_now && current == replicas && desired == replicas)
                .then_some(replicas)
        },
    )
}

/// The average the HPA reports having read last (its first metric, Pods or External
/// `averageValue`), milli-units.
fn reported_average(status: &Value) -> Option<i64> {
    let metric = &status["currentMetrics"][0];
    let kind = if metric["type"] == "Pods" {
        "pods"
    } else {
        "external"
    };
    milli_value(metric[kind]["current"]["averageValue"].as_str()?).ok()
}

/// Set the utilisation to `percent` (from `settled`) and wait for the HPA to want
/// another replica count; check its decision against the upstream formula on the
/// metric it reports having read (the exporters sample independently, so the HPA may
/// act on a mix of old and new values: the reported metric must lie between them).
/// Returns (replicas before, after, seconds from the change to the decision).
pub(crate) fn step(
    c: &Cluster,
    hpa_name: &str,
    settled: i64,
    percent: i64,
    formula: impl Fn(i64, &[i64]) -> i64,
) -> (i64, i64, f64) {
    let (before, _) = hpa_replicas(c, hpa_name);
    c.set_utilization(percent as u32);
    let changed = Instant::now();
    let acted = e2e_tests::try_wait_for(Duration::from_secs(60), || {
        let status = c.json(&["hpa", "-n", NS, hpa_name])["status"].clone();
        (status["desiredReplicas"].as_i64()? != before).then_some(status)
    });
    let latency = changed.elapsed().as_secs_f64();
    let Some(status) = acted else {
        panic!(
            "{hpa_name} did not act on {percent} % from {before} replicas within 60 s: {}\nadapter: {:?}",
            c.json(&["hpa", "-n", NS, hpa_name])["status"],
            pod_values(c)
        );
    };
    let current = status["currentReplicas"].as_i64().expect("currentReplicas");
    let desired = status["desiredReplicas"].as_i64().expect("desiredReplicas");
    let average = reported_average(&status).expect("the HPA's averageValue");
    let (low, high) = (settled.min(percent) * 1000, settled.max(percent) * 1000);
    assert!(
        (low..=high).contains(&average) && average != settled * 1000,
        "{hpa_name} read {average}m, not on the way from {settled} to {percent}: {status}"
    );
    let read = vec![average; current as usize];
    assert_eq!(
        desired,
        formula(current, &read),
        "{hpa_name}: {current} replicas averaging {average}m: {status}"
    );
    eprintln!(
        "{hpa_name}: {settled} → {percent} %: {current} → {desired} replicas, {latency:.2} s after the change"
    );
    (current, desired, latency)
}

pub(crate) fn scaling_active(c: &Cluster, hpa_name: &str) {
    let h = c.json(&["hpa", "-n", NS, hpa_name]);
    let active = h["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|cond| cond["type"] == "ScalingActive")
        .cloned();
    assert_eq!(
        active.map(|a| a["status"].clone()),
        Some(json!("True")),
        "{h}"
    );
}

fn the_hpa_scales_on_the_pods_metric(c: &Cluster) {
    // The example's HPA, with the immediate scale-down a test needs (the example waits
    // 300 s, as production should).
    c.ok(&[
        "patch",
        "hpa",
        "-n",
        NS,
        "resnet-inference",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":0}}}}"#,
    ]);
    let formula =
        |current, values: &[i64]| hpa::pods_average_value(current, values, 0, TARGET_MILLI);
    let start = settle(c, "resnet-inference", 70);
    let (_, up, _) = step(c, "resnet-inference", 70, 100, formula);
    assert!(up > start, "scaled up: {start} → {up}");
    scaling_active(c, "resnet-inference");
    let now = settle(c, "resnet-inference", 70);
    let (_, down, _) = step(c, "resnet-inference", 70, 35, formula);
    assert!(down < now, "scaled down: {now} → {down}");
    c.ok(&["delete", "hpa", "-n", NS, "resnet-inference"]);
}

fn the_hpa_scales_on_the_external_metric(c: &Cluster) {
    let name = "resnet-inference-external";
    let hpa = json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "resnet-inference"},
            "minReplicas": 1, "maxReplicas": 8,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": "gpu_utilization", "selector": {"matchLabels": {"app": "resnet-inference"}}},
                "target": {"type": "AverageValue", "averageValue": "70"}}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}
        }
    });
    apply_json(c, &hpa);
    let formula = |current, values: &[i64]| hpa::average_value(current, values, TARGET_MILLI);
    let start = settle(c, name, 70);
    let (_, up, _) = step(c, name, 70, 100, formula);
    assert!(up > start, "scaled up: {start} → {up}");
    scaling_active(c, name);
    // Down from 100 % (the maximum, 8): at 70 % the HPA may settle at its minimum, 1, as
    // an External metric sums only the pods with data, so a new pod not yet reported
    // makes it scale back; from 1 there is no way down.
    let now = settle(c, name, 100);
    let (_, down, _) = step(c, name, 100, 35, formula);
    assert!(down < now, "scaled down: {now} → {down}");
}

/// Every kustomization of deploy/ (static-certs is what `up` applied), rendered by the
/// cluster's kubectl and applied server-side: built-in kinds are created for real;
/// objects of CRD kinds (Prometheus Operator, KEDA, cert-manager) are left out here and
/// validated against their schemas by deploy/validation.rs.
fn every_kustomization_applies_server_side(c: &Cluster) {
    let served: BTreeSet<String> = c
        .ok(&["api-resources", "--no-headers"])
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect();
    // The ExternalName Service that `up` put in place of the adapter's Service lists
    // other ports under the same names; server-side apply would merge the two lists.
    c.ok(&[
        "delete",
        "service",
        "-n",
        "gpu-monitoring",
        "gpu-metrics-adapter",
    ]);
    let deploy = workspace().join("deploy");
    let dirs = [
        "base",
        "overlays/default",
        "overlays/keda",
        "overlays/process-attribution",
        "examples/inference",
        "examples/hpa",
        "examples/keda-external",
        "examples/keda-prometheus",
        "examples/composite-hpa",
        "examples/keda-scale-from-zero",
    ];
    let mut crd_kinds = BTreeSet::new();
    for dir in dirs {
        let yaml = c.ok(&["kustomize", deploy.join(dir).to_str().unwrap()]);
        let objects: Vec<Value> = serde_saphyr::from_multiple(&yaml).expect("kustomize output");
        let (builtin, crd): (Vec<Value>, Vec<Value>) = objects
            .into_iter()
            .partition(|o| served.contains(o["kind"].as_str().unwrap_or_default()));
        crd_kinds.extend(
            crd.iter()
                .map(|o| o["kind"].as_str().unwrap_or_default().to_string()),
        );
        assert!(!builtin.is_empty(), "{dir}: nothing to apply");
        let list = json!({"apiVersion": "v1", "kind": "List", "items": builtin});
        apply_json(c, &list);
        for o in &builtin {
            let kind = o["kind"].as_str().unwrap();
            let name = o["metadata"]["name"].as_str().unwrap();
            let mut args = vec!["get", kind, name, "-o", "name"];
            if let Some(ns) = o["metadata"]["namespace"].as_str() {
                args.extend_from_slice(&["-n", ns]);
            }
            c.ok(&args);
        }
    }
    let expected: BTreeSet<String> = [
        "Certificate",
        "Issuer",
        "PrometheusRule",
        "ScaledObject",
        "ServiceMonitor",
        "TriggerAuthentication",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert!(
        crd_kinds.is_subset(&expected),
        "unexpected kinds left out: {crd_kinds:?}"
    );
}
