//! Issue 7's manifests (`deploy/`): every overlay, component and example builds with
//! `kubectl kustomize` and validates (kubernetes-validate, strict, for built-in kinds;
//! the JSON schemas in tests/fixtures/crd-schemas for custom resources), the objects
//! fit together (Services select their pods, bindings name service accounts that exist,
//! APIServices point at the adapter and trust its certificate, flags name what exists
//! and the binaries run with them until ready), and the KEDA prometheus example's query returns,
//! from a real Prometheus scraping the exporter on a simulated node, the value its
//! metricType and threshold need.

use crate::rbac;
use e2e_tests::hpa;
use e2e_tests::quantity::milli_value;
use e2e_tests::{
    KubeNode, Prometheus, attributed_exporter_with, binary, scratch_dir, try_wait_for, workspace,
};
use gpu_metrics_adapter::fleet::GpuMetric;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Kubernetes versions every built object must validate against: the oldest we claim
/// (deploy/README.md) and the newest kubernetes-validate ships.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31", "1.37"];

const OVERLAYS: [&str; 4] = ["default", "keda", "static-certs", "process-attribution"];
const EXAMPLES: [&str; 6] = [
    "inference",
    "hpa",
    "keda-external",
    "keda-prometheus",
    "composite-hpa",
    "keda-scale-from-zero",
];

/// The scenario for the prometheus-trigger test: the example app's pods on one node.
const SCENARIO: &str = "tests/fixtures/deploy-inference-node.toml";

// ---------------------------------------------------------------------------------
// Building and validating.

/// A private copy of `deploy/` with a freshly generated static-certs key pair (the
/// overlay needs files the user provides; generate-certs.sh is how the README makes
/// them). Built once per test process.
pub(crate) fn tree() -> &'static Path {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let dir = scratch_dir("deploy").join("deploy");
        run(Command::new("cp")
            .arg("-R")
            .arg(workspace().join("deploy"))
            .arg(&dir));
        let certs = dir.join("overlays/static-certs/certs");
        for f in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
            let _ = std::fs::remove_file(certs.join(f));
        }
        run(&mut Command::new(
            dir.join("overlays/static-certs/generate-certs.sh"),
        ));
        dir
    })
}

/// Run a command to success; its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `kubectl kustomize DIR`, failing with kustomize's stderr.
pub(crate) fn kustomize(dir: &Path) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl is installed (tests/setup.sh checks)");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 YAML")
}

/// Validate a YAML stream; (objects, errors).
pub(crate) fn validate_yaml(yaml: &str) -> (Vec<Value>, Vec<String>) {
    let mut cmd = Command::new("python3");
    cmd.arg(workspace().join("tests/deploy/validate_manifests.py"))
        .arg("--crd-schemas")
        .arg(workspace().join("tests/fixtures/crd-schemas"));
    for v in KUBERNETES_VERSIONS {
        cmd.args(["--kubernetes-version", v]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 is installed (tests/setup.sh)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("write manifests");
    let out = child.wait_with_output().expect("validator output");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "validator gave no report ({e}); run tests/setup.sh for kubernetes-validate:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let errors: Vec<String> = report["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        out.status.success(),
        errors.is_empty(),
        "validator exit status and report disagree"
    );
    let objects = report["objects"].as_array().expect("objects").clone();
    (objects, errors)
}

/// Build `deploy/<rel>` (in the private copy) and validate every object; each
/// directory is built once per test process (the tests share the results).
pub(crate) fn build(rel: &str) -> Vec<Value> {
    static BUILT: OnceLock<Mutex<HashMap<String, Vec<Value>>>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    if let Some(objects) = built.lock().expect("build cache").get(rel) {
        return objects.clone();
    }
    let objects = build_uncached(rel);
    built
        .lock()
        .expect("build cache")
        .insert(rel.to_string(), objects.clone());
    objects
}

fn build_uncached(rel: &str) -> Vec<Value> {
    let yaml = kustomize(&tree().join(rel));
    let (objects, errors) = validate_yaml(&yaml);
    assert!(
        errors.is_empty(),
        "deploy/{rel} does not validate:\n{}",
        errors.join("\n")
    );
    assert!(!objects.is_empty(), "deploy/{rel} built nothing");
    objects
}

/// The kustomization directories under `deploy/<parent>`.
pub(crate) fn kustomizations(parent: &str) -> BTreeSet<String> {
    std::fs::read_dir(workspace().join("deploy").join(parent))
        .unwrap_or_else(|e| panic!("deploy/{parent}: {e}"))
        .filter_map(Result::ok)
        .filter(|e| e.path().join("kustomization.yaml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

// ---------------------------------------------------------------------------------
// Reading objects.

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

fn namespace(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or_default()
}

fn all<'a>(objs: &'a [Value], k: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| kind(o) == k).collect()
}

fn find<'a>(objs: &'a [Value], k: &str, n: &str) -> &'a Value {
    objs.iter()
        .find(|o| kind(o) == k && name(o) == n)
        .unwrap_or_else(|| panic!("no {k} {n} among {:?}", ids(objs)))
}

fn ids(objs: &[Value]) -> Vec<String> {
    objs.iter()
        .map(|o| format!("{}/{}", kind(o), name(o)))
        .collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v}"))
}

fn arr<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// `matchLabels` (and `In`/`Exists` expressions) of a label selector against labels.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let plain = selector.get("matchLabels").is_none() && selector.get("matchExpressions").is_none();
    let labels_ok = if plain {
        // A Service's selector is a plain map.
        string_map(selector)
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    } else {
        string_map(&selector["matchLabels"])
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    let exprs_ok = arr(selector, "/matchExpressions").iter().all(|e| {
        let key = str_at(e, "/key");
        let values: Vec<&str> = arr(e, "/values").iter().filter_map(Value::as_str).collect();
        match str_at(e, "/operator") {
            "In" => labels
                .get(key)
                .is_some_and(|v| values.contains(&v.as_str())),
            "NotIn" => !labels
                .get(key)
                .is_some_and(|v| values.contains(&v.as_str())),
            "Exists" => labels.contains_key(key),
            "DoesNotExist" => !labels.contains_key(key),
            op => panic!("unknown operator {op}"),
        }
    });
    let empty = if plain {
        string_map(selector).is_empty()
    } else {
        string_map(&selector["matchLabels"]).is_empty()
            && arr(selector, "/matchExpressions").is_empty()
    };
    !empty && labels_ok && exprs_ok
}

/// Workloads (DaemonSet, Deployment) with their pod-template labels.
fn workloads(objs: &[Value]) -> Vec<(&Value, BTreeMap<String, String>)> {
    objs.iter()
        .filter(|o| matches!(kind(o), "DaemonSet" | "Deployment"))
        .map(|o| (o, string_map(&o["spec"]["template"]["metadata"]["labels"])))
        .collect()
}

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn container<'a>(workload: &'a Value, n: &str) -> &'a Value {
    arr(pod_spec(workload), "/containers")
        .iter()
        .find(|c| c["name"] == n)
        .unwrap_or_else(|| panic!("no container {n} in {}", name(workload)))
}

fn args(c: &Value) -> Vec<String> {
    arr(c, "/args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// The value of `--flag=value` or `--flag value`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&eq) {
            Some(v)
        } else if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            None
        }
    })
}

/// A container port's number by name.
fn container_port(c: &Value, port_name: &str) -> Option<i64> {
    arr(c, "/ports")
        .iter()
        .find(|p| p["name"] == port_name)
        .and_then(|p| p["containerPort"].as_i64())
}

/// A port reference (name or number) resolved against a workload's containers.
fn resolve_port(workload: &Value, port: &Value) -> Option<i64> {
    match port {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => arr(pod_spec(workload), "/containers")
            .iter()
            .find_map(|c| container_port(c, s)),
        _ => None,
    }
}

fn exporter_ds(objs: &[Value]) -> &Value {
    find(objs, "DaemonSet", "gpu-exporter")
}

fn adapter_deploy(objs: &[Value]) -> &Value {
    find(objs, "Deployment", "gpu-metrics-adapter")
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// ---------------------------------------------------------------------------------
// Everything builds and validates.

#[test]
fn every_overlay_and_example_builds_and_validates() {
    let overlays = kustomizations("overlays");
    let examples = kustomizations("examples");
    for want in OVERLAYS {
        assert!(overlays.contains(want), "deploy/overlays/{want} is missing");
    }
    for want in EXAMPLES {
        assert!(examples.contains(want), "deploy/examples/{want} is missing");
    }
    let cluster_scoped = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "APIService",
    ];
    for rel in overlays
        .iter()
        .map(|o| format!("overlays/{o}"))
        .chain(examples.iter().map(|e| format!("examples/{e}")))
    {
        let objs = build(&rel);
        // No kustomize `namespace:` is used (it would move the kube-system RoleBinding),
        // so every namespaced object must name its namespace, or it lands in `default`.
        for o in &objs {
            if !cluster_scoped.contains(&kind(o)) {
                assert!(
                    !namespace(o).is_empty(),
                    "deploy/{rel}: {}/{} has no namespace",
                    kind(o),
                    name(o)
                );
            }
        }
        let mut seen = BTreeSet::new();
        for o in &objs {
            assert!(
                seen.insert((kind(o), namespace(o), name(o))),
                "deploy/{rel}: {}/{} twice",
                kind(o),
                name(o)
            );
        }
    }
}

/// The validator is not vacuous: a misspelt field in a built-in kind and in each
/// custom resource kind fails, and so does a kind without a schema.
#[test]
fn the_validator_rejects_typos_and_unknown_kinds() {
    let default = kustomize(&tree().join("overlays/default"));
    let examples = kustomize(&tree().join("examples/keda-external"))
        + "---\n"
        + &kustomize(&tree().join("examples/keda-prometheus"));
    let cases = [
        (
            &default,
            "readOnlyRootFilesystem",
            "readOnlyRootFileSystem",
            "DaemonSet/gpu-exporter",
        ),
        (
            &default,
            "honorLabels",
            "honourLabels",
            "ServiceMonitor/gpu-exporter",
        ),
        (
            &default,
            "serverName",
            "servername",
            "ServiceMonitor/gpu-metrics-adapter",
        ),
        (
            &default,
            "dnsNames",
            "dnsName",
            "Certificate/gpu-metrics-adapter-tls",
        ),
        (
            &default,
            "selfSigned",
            "selfsigned",
            "Issuer/gpu-metrics-adapter-selfsigned",
        ),
        (
            &default,
            "versionPriority: 200",
            "versionPriority: high",
            "APIService/v1beta2.custom.metrics.k8s.io",
        ),
        (
            &examples,
            "scalerAddress",
            "scalerAdress",
            "ScaledObject/resnet-inference",
        ),
        (
            &examples,
            "metricType: AverageValue",
            "metricType: Average",
            "ScaledObject/resnet-inference",
        ),
        (
            &examples,
            "secretTargetRef",
            "secretTargetRefs",
            "TriggerAuthentication/gpu-metrics-adapter-tls",
        ),
        (
            &examples,
            "threshold: \"70\"",
            "treshold: \"70\"",
            "ScaledObject/resnet-inference-prometheus",
        ),
    ];
    for (yaml, from, to, culprit) in cases {
        assert!(
            yaml.contains(from),
            "{from:?} is not in the manifests any more"
        );
        let (_, errors) = validate_yaml(&yaml.replace(from, to));
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("{culprit}:"))),
            "{from:?} → {to:?} was not caught for {culprit}: {errors:?}"
        );
    }
    let unknown =
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n  namespace: x\n";
    let (_, errors) = validate_yaml(unknown);
    assert!(errors.iter().any(|e| e.contains("no schema")), "{errors:?}");
}

/// Each component composes with the base on its own (after external-metrics, as the
/// overlays list them), validates, and does what it says.
#[test]
fn every_component_composes_with_the_base() {
    let components = kustomizations("components");
    for want in [
        "external-metrics",
        "cert-manager",
        "service-monitor",
        "process-attribution",
        "nvidia-runtime-class",
        "serving-discovery",
        "composite-metrics",
        "gateway-signal",
    ] {
        assert!(
            components.contains(want),
            "deploy/components/{want} is missing"
        );
    }
    for component in &components {
        let rel = format!("overlays/_component-{component}");
        let dir = tree().join(&rel);
        std::fs::create_dir_all(&dir).expect("component test dir");
        let mut list = vec!["../../components/external-metrics".to_string()];
        if component != "external-metrics" {
            list.push(format!("../../components/{component}"));
        }
        std::fs::write(
            dir.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n{}",
                list.iter().map(|c| format!("  - {c}\n")).collect::<String>()
            ),
        )
        .expect("write kustomization");
        let objs = build(&rel);
        let ds = pod_spec(exporter_ds(&objs));
        let exporter_args = args(container(exporter_ds(&objs), "exporter"));
        match component.as_str() {
            "process-attribution" => {
                assert_eq!(ds["hostPID"], true, "{component}");
                assert_eq!(flag(&exporter_args, "--proc-root"), Some("/proc"));
            }
            "nvidia-runtime-class" => assert_eq!(ds["runtimeClassName"], "nvidia"),
            _ => {
                assert!(ds.get("hostPID").is_none(), "{component} sets hostPID");
                assert!(ds.get("runtimeClassName").is_none());
            }
        }
        let adapter_args = args(container(adapter_deploy(&objs), "adapter"));
        let signal = flag(&adapter_args, "--signal");
        if component == "gateway-signal" {
            // The signal parses as the adapter parses it, and is the one the
            // scale-from-zero example's push trigger asks for, in its namespace.
            let spec = gpu_metrics_adapter::source::signal::parse_spec(signal.expect("--signal"))
                .expect("the adapter accepts the component's --signal");
            let example = build("examples/keda-scale-from-zero");
            let so = all(&example, "ScaledObject")[0];
            let push = arr(so, "/spec/triggers")
                .iter()
                .find(|t| t["type"] == "external-push")
                .expect("a push trigger");
            assert_eq!(push["metadata"]["metric"], spec.name.as_str());
            assert_eq!(namespace(so), spec.namespace);
        } else {
            assert_eq!(signal, None, "{component}");
        }
        assert_eq!(
            flag(&adapter_args, "--serving-service-selector").is_some(),
            component == "serving-discovery",
            "{component}"
        );
        assert_eq!(
            flag(&adapter_args, "--composite-metrics-file").is_some(),
            component == "composite-metrics",
            "{component}"
        );
        let apiservices = all(&objs, "APIService");
        assert_eq!(apiservices.len(), 3, "{component}");
        if component == "cert-manager" {
            for a in apiservices {
                assert!(
                    a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string(),
                    "cert-manager's patch misses {}",
                    name(a)
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The exporter.

#[test]
fn exporter_daemonset_runs_on_gpu_nodes_hardened_and_attributing() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let ds = exporter_ds(&objs);
        let spec = pod_spec(ds);
        let c = container(ds, "exporter");
        let a = args(c);

        // GPU nodes only, tainted ones included; no GPU taken from the workloads.
        let terms = arr(
            spec,
            "/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
        );
        assert!(!terms.is_empty(), "{overlay}: no required node affinity");
        let gpu_node: BTreeMap<String, String> =
            [("nvidia.com/gpu.present".to_string(), "true".to_string())].into();
        let cpu_node: BTreeMap<String, String> =
            [("kubernetes.io/os".to_string(), "linux".to_string())].into();
        let admits = |labels: &BTreeMap<String, String>| {
            terms.iter().any(|t| {
                arr(t, "/matchExpressions")
                    .iter()
                    .all(|e| selects(&serde_json::json!({"matchExpressions": [e]}), labels))
            })
        };
        assert!(
            admits(&gpu_node),
            "{overlay}: a GFD-labelled GPU node is excluded"
        );
        assert!(!admits(&cpu_node), "{overlay}: a CPU node is admitted");
        assert!(
            arr(spec, "/tolerations")
                .iter()
                .any(|t| t["key"] == "nvidia.com/gpu"
                    && t["operator"] == "Exists"
                    && t["effect"] == "NoSchedule"),
            "{overlay}: no toleration for nvidia.com/gpu:NoSchedule"
        );
        for section in ["requests", "limits"] {
            assert!(
                c["resources"][section].get("nvidia.com/gpu").is_none(),
                "{overlay}: the exporter must not take a GPU"
            );
        }
        let env: BTreeMap<&str, &Value> = arr(c, "/env")
            .iter()
            .map(|e| (str_at(e, "/name"), e))
            .collect();
        assert_eq!(
            env.get("NODE_NAME")
                .map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
            Some(&Value::from("spec.nodeName")),
            "{overlay}: NODE_NAME from the downward API"
        );
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"]["value"], "all");
        assert_eq!(env["NVIDIA_DRIVER_CAPABILITIES"]["value"], "utility");

        // Pod attribution, with the pod-resources socket mounted read-only.
        assert!(
            a.iter().any(|x| x == "--kubernetes" || x == "-k"),
            "{overlay}: no --kubernetes"
        );
        let labels = flag(&a, "--kubernetes-pod-labels").expect("--kubernetes-pod-labels");
        assert!(
            labels.split(',').any(|l| l == "app"),
            "{overlay}: `app` not copied"
        );
        let socket = Path::new(
            flag(&a, "--pod-resources-kubelet-socket")
                .unwrap_or("/var/lib/kubelet/pod-resources/kubelet.sock"),
        );
        let mount = arr(c, "/volumeMounts")
            .iter()
            .find(|m| socket.starts_with(str_at(m, "/mountPath")))
            .unwrap_or_else(|| panic!("{overlay}: nothing mounted at {}", socket.display()));
        assert_eq!(
            mount["readOnly"], true,
            "{overlay}: pod-resources mount is writable"
        );
        let volume = arr(spec, "/volumes")
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("the mount's volume");
        assert_eq!(
            Path::new(str_at(volume, "/hostPath/path")),
            socket.parent().expect("socket dir"),
            "{overlay}: the hostPath is not the socket's directory"
        );

        // Hardening.
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{overlay}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{overlay}");
        assert_ne!(sc["privileged"], true, "{overlay}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{overlay}"
        );
        assert!(
            sc["capabilities"].get("add").is_none(),
            "{overlay}: capabilities added"
        );
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        // Root only because the kubelet socket is root's (see the DaemonSet comment);
        // a non-root uid is fine too, never root with runAsNonRoot unset silently.
        let uid = spec["securityContext"]["runAsUser"]
            .as_i64()
            .expect("runAsUser set");
        assert_eq!(
            spec["securityContext"]["runAsNonRoot"],
            Value::from(uid != 0),
            "{overlay}: runAsNonRoot must state what runAsUser does"
        );
        assert!(spec.get("hostNetwork").is_none(), "{overlay}: hostNetwork");
        assert_eq!(spec["priorityClassName"], "system-node-critical");
        assert!(c["resources"]["requests"]["memory"].is_string());
        assert!(c["resources"]["requests"]["cpu"].is_string());
        assert!(c["resources"]["limits"]["memory"].is_string());

        // Probes on the serving port.
        let port = container_port(c, "metrics").expect("metrics port");
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let p = &c[probe]["httpGet"];
            assert_eq!(p["path"], path, "{overlay}: {probe}");
            assert_eq!(
                resolve_port(ds, &p["port"]),
                Some(port),
                "{overlay}: {probe} port"
            );
        }
        let listen = flag(&a, "--address").or(flag(&a, "-a")).unwrap_or(":9400");
        assert!(
            listen.ends_with(&format!(":{port}")),
            "{overlay}: listens on {listen}, container port {port}"
        );
        assert_eq!(
            str_at(c, "/image"),
            "ghcr.io/gpu-exporter/gpu-exporter:0.1.0"
        );
    }
}

/// The serving Secret as cert-manager writes it: the pair and its issuing CA.
struct ServingSecret<'a> {
    leaf: &'a e2e_tests::pki::Leaf,
    ca: &'a e2e_tests::pki::Ca,
}

/// Where a path the manifests name comes from in the test: a ConfigMap's file, the
/// generated serving Secret, the simulated node's kubelet socket or `/proc`.
fn provide_path(
    objs: &[Value],
    path: &str,
    root: &Path,
    node: &KubeNode,
    serving: &ServingSecret<'_>,
) -> PathBuf {
    let file_name = Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if path == "/proc" {
        return node.proc_root().to_path_buf();
    }
    if file_name.ends_with(".sock") {
        // The node's own socket: a socket path must stay short (SUN_LEN).
        return node.socket().to_path_buf();
    }
    let local = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(local.parent().expect("a parent")).expect("mkdir");
    let content = match file_name {
        "tls.crt" => serving.leaf.cert_pem.clone(),
        "tls.key" => serving.leaf.key_pem.clone(),
        "ca.crt" => serving.ca.pem(),
        name => objs
            .iter()
            .filter(|o| kind(o) == "ConfigMap")
            .find_map(|cm| cm["data"][name].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("no ConfigMap provides {path}: the test cannot run it")),
    };
    std::fs::write(&local, content).expect("write a mounted file");
    local
}

/// The container's arguments with each absolute path moved under `root` (and provided
/// there), and listening ports made ephemeral on loopback; nothing else changes, so
/// clap's conflict checks and the binaries' own startup validation see the manifests'
/// flags.
fn runnable_args(
    a: &[String],
    objs: &[Value],
    root: &Path,
    node: &KubeNode,
    serving: &ServingSecret<'_>,
) -> Vec<String> {
    a.iter()
        .map(|arg| match arg.split_once('=') {
            Some((flag, _)) if ["--secure-port", "--grpc-port"].contains(&flag) => {
                format!("{flag}=0")
            }
            Some((flag, _)) if ["--address", "-a"].contains(&flag) => {
                format!("{flag}=127.0.0.1:0")
            }
            Some((flag, value)) if value.starts_with('/') => {
                let local = provide_path(objs, value, root, node, serving);
                format!("{flag}={}", local.display())
            }
            _ => arg.clone(),
        })
        .collect()
}

/// `SCHEME://HOST:PORT` from the first "listening" log line, in text or JSON format
/// (the manifests ask for JSON logs).
fn listening_base(process: &mut e2e_tests::Process, scheme: &str) -> String {
    let line = process.wait_for_line("listening", Duration::from_secs(60));
    let address = match serde_json::from_str::<Value>(&line) {
        Ok(json) => json["fields"]["address"]
            .as_str()
            .or(json["address"].as_str())
            .map(str::to_string),
        Err(_) => line
            .split("address=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .map(str::to_string),
    };
    let address = address.unwrap_or_else(|| panic!("no address in {line:?}"));
    format!("{scheme}://{address}")
}

fn stop(process: &mut e2e_tests::Process, what: &str) {
    let killed = Command::new("kill")
        .args(["-TERM", &process.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert_eq!(
        process.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{what} did not shut down cleanly:\n{}",
        process.log()
    );
}

/// The binaries run with each overlay's flags, as the manifests give them (clap's
/// conflict checks and the binaries' startup validation included): the exporter on
/// simulated GPUs through the fake libnvidia-ml and the simulated node's kubelet and
/// API, the adapter with a generated serving certificate, finding the exporter through
/// its Service's EndpointSlice. Each must report ready, then stop cleanly on SIGTERM.
#[test]
fn the_binaries_run_with_the_manifests_flags_until_ready() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let node = KubeNode::start(SCENARIO, "node-a");
        let root = scratch_dir(&format!("manifest-run-{overlay}"));
        let ca = e2e_tests::pki::Ca::new("manifests-test-ca");
        let leaf = ca.server(&["localhost", "127.0.0.1"]);
        let serving = ServingSecret {
            leaf: &leaf,
            ca: &ca,
        };
        let kubeconfig = node.kubeconfig().display().to_string();

        let ds = exporter_ds(&objs);
        let exporter_args = runnable_args(
            &args(container(ds, "exporter")),
            &objs,
            &root,
            &node,
            &serving,
        );
        let has_address = exporter_args
            .iter()
            .any(|a| a.starts_with("--address") || a.starts_with("-a"));
        // The real library name resolves to the fake one; the manifests carry no
        // library flag.
        let lib = root.join("lib");
        std::fs::create_dir_all(&lib).expect("mkdir lib");
        std::os::unix::fs::symlink(e2e_tests::fake_nvml(), lib.join("libnvidia-ml.so.1"))
            .expect("link libnvidia-ml.so.1");
        let mut cmd = Command::new(binary("gpu-exporter"));
        cmd.current_dir(workspace())
            .args(&exporter_args)
            .args(if has_address {
                vec![]
            } else {
                vec!["--address=127.0.0.1:0"]
            })
            .env("LD_LIBRARY_PATH", &lib)
            .env("GPU_SIM_SCENARIO", SCENARIO)
            .env("NODE_NAME", "node-a")
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("RUST_LOG");
        let mut exporter = e2e_tests::Process::spawn(cmd);
        let exporter_base = listening_base(&mut exporter, "http");
        let ready = try_wait_for(Duration::from_secs(60), || {
            (e2e_tests::get(&format!("{exporter_base}/readyz")).0 == 200).then_some(())
        });
        assert!(
            ready.is_some(),
            "{overlay}: the exporter with {exporter_args:?} never became ready:\n{}",
            exporter.log()
        );

        // The adapter finds the exporter through the Service its flags name.
        let adapter_args = runnable_args(
            &args(container(adapter_deploy(&objs), "adapter")),
            &objs,
            &root,
            &node,
            &serving,
        );
        let service = flag(&adapter_args, "--exporter-service")
            .unwrap_or("gpu-exporter/gpu-exporter")
            .to_string();
        let (namespace, name) = service.split_once('/').expect("namespace/name");
        let port_name = flag(&adapter_args, "--exporter-port-name").unwrap_or("metrics");
        let port: i32 = exporter_base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("exporter port");
        node.api().apply_endpoint_slice(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{name}-manifests"),
                    "namespace": namespace,
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
                "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            }))
            .expect("EndpointSlice"),
        );
        let mut cmd = Command::new(binary("gpu-metrics-adapter"));
        cmd.current_dir(workspace())
            .args(&adapter_args)
            .arg("--bind-address=127.0.0.1")
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("RUST_LOG");
        let mut adapter = e2e_tests::Process::spawn(cmd);
        let adapter_base = listening_base(&mut adapter, "https");
        let client = e2e_tests::https::HttpsClient::new(&ca.pem(), None);
        let ready = try_wait_for(Duration::from_secs(60), || {
            (client.get(&format!("{adapter_base}/readyz"), &[]).ok()?.0 == 200).then_some(())
        });
        assert!(
            ready.is_some(),
            "{overlay}: the adapter with {adapter_args:?} never became ready:\n{}",
            adapter.log()
        );
        stop(&mut adapter, "the adapter");
        stop(&mut exporter, "the exporter");
    }
}

/// The ServiceMonitor `name` and the Service of the same name, after checking that the
/// monitor selects that Service in its namespace.
fn monitor_and_service<'a>(objs: &'a [Value], overlay: &str, name: &str) -> (&'a Value, &'a Value) {
    let sm = find(objs, "ServiceMonitor", name);
    let svc = find(objs, "Service", name);
    assert!(
        selects(
            &sm["spec"]["selector"],
            &string_map(&svc["metadata"]["labels"])
        ),
        "{overlay}: ServiceMonitor {name} does not select its Service"
    );
    assert!(
        arr(sm, "/spec/namespaceSelector/matchNames").contains(&Value::from(namespace(svc))),
        "{overlay}: ServiceMonitor {name} is not in its Service's namespace"
    );
    (sm, svc)
}

#[test]
fn the_service_monitor_scrapes_every_exporter_with_honor_labels() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let (sm, svc) = monitor_and_service(&objs, overlay, "gpu-exporter");
        let endpoints = arr(sm, "/spec/endpoints");
        assert!(!endpoints.is_empty());
        let port_names: Vec<&Value> = arr(svc, "/spec/ports").iter().map(|p| &p["name"]).collect();
        for e in endpoints {
            assert_eq!(e["honorLabels"], true, "{overlay}: honorLabels");
            assert!(
                port_names.contains(&&e["port"]),
                "{overlay}: port {}",
                e["port"]
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// The adapter.

/// The adapter's ServiceMonitor reaches its secure port, verifies the serving
/// certificate (the CA from the Secret the adapter serves, the Service's DNS name) and
/// sends a service-account token the adapter can review; the ClusterRole it documents
/// grants exactly `get` on `/metrics`.
#[test]
fn the_adapter_service_monitor_verifies_the_adapter_and_authenticates() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let (sm, svc) = monitor_and_service(&objs, overlay, "gpu-metrics-adapter");
        let adapter = adapter_deploy(&objs);
        let endpoints = arr(sm, "/spec/endpoints");
        assert_eq!(endpoints.len(), 1, "{overlay}");
        let e = &endpoints[0];
        let svc_port = arr(svc, "/spec/ports")
            .iter()
            .find(|p| p["name"] == e["port"])
            .unwrap_or_else(|| panic!("{overlay}: the Service has no port {}", e["port"]));
        let secure: i64 = flag(&args(container(adapter, "adapter")), "--secure-port")
            .unwrap_or("6443")
            .parse()
            .expect("--secure-port number");
        assert_eq!(
            resolve_port(adapter, &svc_port["targetPort"]),
            Some(secure),
            "{overlay}: the scrape does not reach --secure-port"
        );
        assert_eq!(e["scheme"], "https", "{overlay}");
        assert_eq!(e["path"], "/metrics", "{overlay}");
        assert_eq!(
            e["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "{overlay}: the adapter authorizes /metrics by the scraper's token"
        );
        assert_ne!(e["tlsConfig"]["insecureSkipVerify"], true, "{overlay}");
        assert_eq!(
            str_at(e, "/tlsConfig/serverName"),
            format!("{}.{}.svc", name(svc), namespace(svc)),
            "{overlay}"
        );
        let serving_secret = arr(pod_spec(adapter), "/volumes")
            .iter()
            .find_map(|v| v["secret"]["secretName"].as_str())
            .expect("the adapter mounts a serving Secret");
        assert_eq!(
            str_at(e, "/tlsConfig/ca/secret/name"),
            serving_secret,
            "{overlay}: the CA must come from the Secret the adapter serves from"
        );
        assert_eq!(str_at(e, "/tlsConfig/ca/secret/key"), "ca.crt");
        let reader = find(&objs, "ClusterRole", "gpu-metrics-adapter-metrics-reader");
        assert_eq!(
            reader["rules"],
            serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
            "{overlay}"
        );
    }
}

#[test]
fn apiservices_point_at_the_adapter_and_trust_its_certificate() {
    let custom = [
        "v1beta2.custom.metrics.k8s.io",
        "v1beta1.custom.metrics.k8s.io",
    ];
    let external = "v1beta1.external.metrics.k8s.io";
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let apiservices = all(&objs, "APIService");
        let names: BTreeSet<&str> = apiservices.iter().map(|a| name(a)).collect();
        let mut want: BTreeSet<&str> = custom.into();
        // KEDA owns the external metrics API where it is installed.
        if overlay != "keda" {
            want.insert(external);
        }
        assert_eq!(names, want, "{overlay}");
        let adapter = adapter_deploy(&objs);
        let adapter_args = args(container(adapter, "adapter"));
        for a in &apiservices {
            let spec = &a["spec"];
            assert_eq!(
                name(a),
                format!("{}.{}", str_at(spec, "/version"), str_at(spec, "/group")),
                "{overlay}: APIService name"
            );
            assert_eq!(spec["groupPriorityMinimum"], 100);
            let want_priority = if spec["version"] == "v1beta2" {
                200
            } else {
                100
            };
            assert_eq!(spec["versionPriority"], want_priority, "{}", name(a));

            // The Service exists, has the port, and reaches the adapter's secure port.
            let svc_ns = str_at(spec, "/service/namespace");
            let svc_name = str_at(spec, "/service/name");
            let port = spec["service"]["port"].as_i64().unwrap_or(443);
            assert_eq!(port, 443, "{overlay}: {}", name(a));
            let svc = objs
                .iter()
                .find(|o| kind(o) == "Service" && name(o) == svc_name && namespace(o) == svc_ns)
                .unwrap_or_else(|| panic!("{overlay}: no Service {svc_ns}/{svc_name}"));
            assert_ne!(
                svc["spec"]["clusterIP"], "None",
                "the aggregator needs a ClusterIP"
            );
            assert!(selects(
                &svc["spec"]["selector"],
                &string_map(&adapter["spec"]["template"]["metadata"]["labels"])
            ));
            let svc_port = arr(svc, "/spec/ports")
                .iter()
                .find(|p| p["port"] == port)
                .unwrap_or_else(|| panic!("{overlay}: Service {svc_name} has no port {port}"));
            let target = resolve_port(adapter, &svc_port["targetPort"]).expect("target port");
            let secure: i64 = flag(&adapter_args, "--secure-port")
                .unwrap_or("6443")
                .parse()
                .expect("--secure-port number");
            assert_eq!(
                target, secure,
                "{overlay}: 443 does not reach --secure-port"
            );

            // Trust: exactly one way, and never skipping verification.
            assert_ne!(
                spec["insecureSkipTLSVerify"],
                true,
                "{overlay}: {}",
                name(a)
            );
            let inject = a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str();
            let bundle = spec["caBundle"].as_str();
            assert!(
                inject.is_some() != bundle.is_some(),
                "{overlay}: {} needs exactly one of caBundle and inject-ca-from",
                name(a)
            );
            let host = format!("{svc_name}.{svc_ns}.svc");
            let serving_secret = arr(pod_spec(adapter), "/volumes")
                .iter()
                .find_map(|v| v["secret"]["secretName"].as_str())
                .expect("the adapter mounts a serving Secret");
            if let Some(inject) = inject {
                let (cert_ns, cert_name) = inject.split_once('/').expect("ns/name");
                let cert = find(&objs, "Certificate", cert_name);
                assert_eq!(namespace(cert), cert_ns);
                assert_eq!(str_at(cert, "/spec/secretName"), serving_secret);
                let dns: Vec<&str> = arr(cert, "/spec/dnsNames")
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                assert!(
                    dns.contains(&host.as_str()),
                    "{overlay}: {host} not in {dns:?}"
                );
                // Its issuer exists, and a CA issuer's secret is a CA certificate's.
                let issuer = find(&objs, "Issuer", str_at(cert, "/spec/issuerRef/name"));
                if let Some(ca_secret) = issuer["spec"]["ca"]["secretName"].as_str() {
                    let ca = all(&objs, "Certificate")
                        .into_iter()
                        .find(|c| c["spec"]["secretName"] == ca_secret)
                        .expect("a Certificate writes the CA issuer's secret");
                    assert_eq!(ca["spec"]["isCA"], true);
                    find(&objs, "Issuer", str_at(ca, "/spec/issuerRef/name"));
                }
            } else {
                let secret = find(&objs, "Secret", serving_secret);
                assert_eq!(secret["type"], "kubernetes.io/tls");
                let ca_file = tree().join(format!("overlays/{overlay}/certs/ca.crt"));
                let ca = std::fs::read(&ca_file).expect("static-certs ca.crt");
                // kustomize folds long base64 values; the API server's decoder skips
                // the newlines.
                let bundle = bundle.map(|b| b.split_whitespace().collect::<String>());
                assert_eq!(
                    bundle.as_deref(),
                    Some(base64(&ca).as_str()),
                    "{overlay}: caBundle is not ca.crt"
                );
                assert_eq!(
                    secret["data"]["ca.crt"]
                        .as_str()
                        .map(|b| b.split_whitespace().collect::<String>()),
                    bundle
                );
                for key in ["tls.crt", "tls.key"] {
                    assert!(secret["data"][key].is_string(), "{overlay}: no {key}");
                }
                let crt = tree().join(format!("overlays/{overlay}/certs/tls.crt"));
                let sans = run(Command::new("openssl")
                    .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
                    .arg(&crt));
                let want_san = format!("DNS:{host}");
                assert!(
                    sans.split([',', '\n']).any(|s| s.trim() == want_san),
                    "{overlay}: tls.crt lacks {want_san}: {sans}"
                );
                run(Command::new("openssl")
                    .args(["verify", "-CAfile"])
                    .arg(&ca_file)
                    .arg(&crt));
            }
        }
    }
}

#[test]
fn adapter_is_highly_available_hardened_and_finds_the_exporters() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let d = adapter_deploy(&objs);
        let labels = string_map(&d["spec"]["template"]["metadata"]["labels"]);
        assert!(selects(&d["spec"]["selector"], &labels));
        let replicas = d["spec"]["replicas"].as_i64().expect("replicas");
        assert_eq!(replicas, 2, "{overlay}");
        let pdb = all(&objs, "PodDisruptionBudget")
            .into_iter()
            .find(|p| selects(&p["spec"]["selector"], &labels))
            .unwrap_or_else(|| panic!("{overlay}: no PodDisruptionBudget for the adapter"));
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        let anti = arr(
            pod_spec(d),
            "/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution",
        );
        assert!(
            anti.iter().any(
                |t| t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
                    && selects(&t["podAffinityTerm"]["labelSelector"], &labels)
            ),
            "{overlay}: no preferred anti-affinity by hostname"
        );

        let spec = pod_spec(d);
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_ne!(spec["securityContext"]["runAsUser"], 0);
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let c = container(d, "adapter");
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert!(c["resources"]["requests"]["memory"].is_string());
        assert!(c["resources"]["limits"]["memory"].is_string());
        assert_eq!(
            str_at(c, "/image"),
            "ghcr.io/gpu-exporter/gpu-metrics-adapter:0.1.0"
        );

        let a = args(c);
        let secure: i64 = flag(&a, "--secure-port").unwrap_or("6443").parse().unwrap();
        let grpc: i64 = flag(&a, "--grpc-port").unwrap_or("9090").parse().unwrap();
        assert_eq!(container_port(c, "https"), Some(secure));
        assert_eq!(container_port(c, "grpc"), Some(grpc));
        for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
            let p = &c[probe]["httpGet"];
            assert_eq!(p["scheme"], "HTTPS", "{overlay}: {probe}");
            assert_eq!(p["path"], path, "{overlay}: {probe}");
            assert_eq!(
                resolve_port(d, &p["port"]),
                Some(secure),
                "{overlay}: {probe}"
            );
        }

        // The serving pair lies in the mounted serving Secret.
        for f in ["--tls-cert-file", "--tls-private-key-file"] {
            let path = Path::new(flag(&a, f).unwrap_or_else(|| panic!("{overlay}: no {f}")));
            let m = arr(c, "/volumeMounts")
                .iter()
                .find(|m| path.parent() == Some(Path::new(str_at(m, "/mountPath"))))
                .unwrap_or_else(|| panic!("{overlay}: {} is not mounted", path.display()));
            let v = arr(spec, "/volumes")
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap();
            assert!(
                v["secret"]["secretName"].is_string(),
                "{overlay}: {f} not from a Secret"
            );
        }

        // The exporter Service and port name the adapter discovers exist.
        let (svc_ns, svc_name) = flag(&a, "--exporter-service")
            .unwrap_or("gpu-exporter/gpu-exporter")
            .split_once('/')
            .expect("NAMESPACE/NAME");
        let port_name = flag(&a, "--exporter-port-name").unwrap_or("metrics");
        let svc = objs
            .iter()
            .find(|o| kind(o) == "Service" && name(o) == svc_name && namespace(o) == svc_ns)
            .unwrap_or_else(|| {
                panic!("{overlay}: --exporter-service {svc_ns}/{svc_name} does not exist")
            });
        let exporter = exporter_ds(&objs);
        assert!(selects(
            &svc["spec"]["selector"],
            &string_map(&exporter["spec"]["template"]["metadata"]["labels"])
        ));
        assert!(
            arr(svc, "/spec/ports")
                .iter()
                .any(|p| p["name"] == port_name),
            "{overlay}: Service {svc_name} has no port {port_name}"
        );
    }
}

/// Every binding names a ServiceAccount and a role that exist (or are Kubernetes' own),
/// and each component gets what its code asks the API for, read-only.
#[test]
fn rbac_grants_what_the_code_needs_to_accounts_that_exist() {
    // Roles Kubernetes bootstraps itself, and the HPA controller's account.
    let builtin_roles = [
        ("ClusterRole", "system:auth-delegator"),
        ("Role", "extension-apiserver-authentication-reader"),
    ];
    let builtin_accounts = [("kube-system", "horizontal-pod-autoscaler")];
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let accounts: BTreeSet<(&str, &str)> = all(&objs, "ServiceAccount")
            .into_iter()
            .map(|s| (namespace(s), name(s)))
            .collect();
        for (w, _) in workloads(&objs) {
            let sa = str_at(pod_spec(w), "/serviceAccountName");
            assert!(
                accounts.contains(&(namespace(w), sa)),
                "{overlay}: {} runs as missing {sa}",
                name(w)
            );
        }
        let bindings: Vec<&Value> = objs
            .iter()
            .filter(|o| matches!(kind(o), "RoleBinding" | "ClusterRoleBinding"))
            .collect();
        for b in &bindings {
            for s in arr(b, "/subjects") {
                assert_eq!(s["kind"], "ServiceAccount", "{overlay}: {}", name(b));
                let who = (str_at(s, "/namespace"), str_at(s, "/name"));
                assert!(
                    accounts.contains(&who) || builtin_accounts.contains(&who),
                    "{overlay}: {} binds missing ServiceAccount {who:?}",
                    name(b)
                );
            }
            let role_kind = str_at(b, "/roleRef/kind");
            let role_name = str_at(b, "/roleRef/name");
            let exists = objs.iter().any(|o| {
                kind(o) == role_kind
                    && name(o) == role_name
                    && (role_kind == "ClusterRole" || namespace(o) == namespace(b))
            });
            assert!(
                exists || builtin_roles.contains(&(role_kind, role_name)),
                "{overlay}: {} refers to missing {role_kind} {role_name}",
                name(b)
            );
        }
        // Our roles only read.
        for r in objs
            .iter()
            .filter(|o| matches!(kind(o), "Role" | "ClusterRole"))
        {
            for rule in arr(r, "/rules") {
                for verb in arr(rule, "/verbs") {
                    assert!(
                        ["get", "list", "watch"].contains(&verb.as_str().unwrap_or_default()),
                        "{overlay}: {} grants {verb}",
                        name(r)
                    );
                }
            }
        }

        // Whether `who` may `verb` `group/resource` in `ns` (None: cluster-wide), through
        // the roles in the build.
        let may = |who: (&str, &str), verb: &str, group: &str, resource: &str, ns: Option<&str>| {
            bindings.iter().any(|b| {
                let bound = arr(b, "/subjects")
                    .iter()
                    .any(|s| (str_at(s, "/namespace"), str_at(s, "/name")) == who);
                let in_scope = match (kind(b), ns) {
                    ("ClusterRoleBinding", _) => true,
                    ("RoleBinding", Some(ns)) => namespace(b) == ns,
                    _ => false,
                };
                let role = objs.iter().find(|o| {
                    kind(o) == str_at(b, "/roleRef/kind")
                        && name(o) == str_at(b, "/roleRef/name")
                        && (kind(o) == "ClusterRole" || namespace(o) == namespace(b))
                });
                bound
                    && in_scope
                    && role.is_some_and(|r| {
                        arr(r, "/rules").iter().any(|rule| {
                            let has = |field: &str, want: &str| {
                                arr(rule, field).iter().any(|v| v == want || v == "*")
                            };
                            has("/verbs", verb)
                                && has("/apiGroups", group)
                                && has("/resources", resource)
                        })
                    })
            })
        };
        let binds_builtin = |who: (&str, &str), role: (&str, &str), ns: &str| {
            bindings.iter().any(|b| {
                (kind(b) == "ClusterRoleBinding" || namespace(b) == ns)
                    && (str_at(b, "/roleRef/kind"), str_at(b, "/roleRef/name")) == role
                    && arr(b, "/subjects")
                        .iter()
                        .any(|s| (str_at(s, "/namespace"), str_at(s, "/name")) == who)
            })
        };

        let exporter = exporter_ds(&objs);
        let exporter_sa = (
            namespace(exporter),
            str_at(pod_spec(exporter), "/serviceAccountName"),
        );
        for verb in ["list", "watch"] {
            assert!(
                may(exporter_sa, verb, "", "pods", None),
                "{overlay}: exporter {verb} pods"
            );
        }
        let adapter = adapter_deploy(&objs);
        let adapter_sa = (
            namespace(adapter),
            str_at(pod_spec(adapter), "/serviceAccountName"),
        );
        let exporter_ns = flag(&args(container(adapter, "adapter")), "--exporter-service")
            .unwrap_or("gpu-exporter/gpu-exporter")
            .split_once('/')
            .map(|(ns, _)| ns.to_string())
            .unwrap();
        for verb in ["list", "watch"] {
            assert!(
                may(adapter_sa, verb, "", "pods", None),
                "{overlay}: adapter {verb} pods (all namespaces)"
            );
            assert!(
                may(
                    adapter_sa,
                    verb,
                    "discovery.k8s.io",
                    "endpointslices",
                    Some(&exporter_ns)
                ),
                "{overlay}: adapter {verb} EndpointSlices in {exporter_ns}"
            );
        }
        assert!(binds_builtin(
            adapter_sa,
            ("ClusterRole", "system:auth-delegator"),
            ""
        ));
        assert!(binds_builtin(
            adapter_sa,
            ("Role", "extension-apiserver-authentication-reader"),
            "kube-system"
        ));
        let hpa_sa = builtin_accounts[0];
        for group in ["custom.metrics.k8s.io", "external.metrics.k8s.io"] {
            assert!(
                may(hpa_sa, "get", group, "gpu_utilization", None),
                "{overlay}: HPA reads {group}"
            );
        }
        // Not more than needed: the adapter cannot read Secrets.
        assert!(!may(
            adapter_sa,
            "get",
            "",
            "secrets",
            Some("gpu-monitoring")
        ));
    }
}

/// (verb, API group, resource).
pub(crate) type RuleTriple = (&'static str, &'static str, &'static str);

/// The rules of Kubernetes' bootstrap roles that deploy/ binds (its bootstrap policy;
/// cluster.rs checks these against a real kube-apiserver's).
pub(crate) const BUILTIN_ROLE_RULES: [(&str, &str, &[RuleTriple]); 2] = [
    (
        "ClusterRole",
        "system:auth-delegator",
        &[
            ("create", "authentication.k8s.io", "tokenreviews"),
            ("create", "authorization.k8s.io", "subjectaccessreviews"),
        ],
    ),
    (
        "Role",
        "extension-apiserver-authentication-reader",
        &[
            ("get", "", "configmaps"),
            ("list", "", "configmaps"),
            ("watch", "", "configmaps"),
        ],
    ),
];

/// What `who` (namespace, name) is granted in `objs`, through every binding and the
/// roles (deploy/'s own or bootstrap ones) they refer to: (verb, group, resource).
pub(crate) fn granted(objs: &[Value], who: (&str, &str)) -> BTreeSet<rbac::Call> {
    let mut out = BTreeSet::new();
    for b in objs
        .iter()
        .filter(|o| matches!(kind(o), "RoleBinding" | "ClusterRoleBinding"))
    {
        if !arr(b, "/subjects")
            .iter()
            .any(|s| (str_at(s, "/namespace"), str_at(s, "/name")) == who)
        {
            continue;
        }
        let (role_kind, role_name) = (str_at(b, "/roleRef/kind"), str_at(b, "/roleRef/name"));
        if let Some((_, _, rules)) = BUILTIN_ROLE_RULES
            .iter()
            .find(|(k, n, _)| (*k, *n) == (role_kind, role_name))
        {
            out.extend(rules.iter().map(|(v, g, r)| rbac::call(v, g, r)));
            continue;
        }
        let role = objs
            .iter()
            .find(|o| {
                kind(o) == role_kind
                    && name(o) == role_name
                    && (role_kind == "ClusterRole" || namespace(o) == namespace(b))
            })
            .unwrap_or_else(|| panic!("{} refers to missing {role_kind} {role_name}", name(b)));
        for rule in arr(role, "/rules") {
            for verb in arr(rule, "/verbs") {
                for group in arr(rule, "/apiGroups") {
                    for resource in arr(rule, "/resources") {
                        out.insert(rbac::call(
                            verb.as_str().unwrap_or_default(),
                            group.as_str().unwrap_or_default(),
                            resource.as_str().unwrap_or_default(),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// Issue 20, least privilege: each ServiceAccount is granted exactly the calls its
/// binary's source makes (rbac.rs reads them), not one verb more and none missing; the
/// HPA controller only `get` and `list` on the metrics APIs (cluster.rs checks what it
/// really calls).
#[test]
fn rbac_grants_exactly_the_calls_in_the_code() {
    let exporter_calls = rbac::calls_in(&workspace().join("exporter/src"));
    let adapter_calls = rbac::calls_in(&workspace().join("metrics-adapter/src"));
    // kube-support's plumbing calls only what it is handed, and only to list and watch.
    let plumbing = rbac::calls_by_type(&workspace().join("kube-support/src"));
    assert_eq!(
        plumbing.keys().collect::<Vec<_>>(),
        ["<generic>"],
        "{plumbing:?}"
    );
    assert_eq!(
        plumbing["<generic>"].iter().collect::<Vec<_>>(),
        ["list", "watch"]
    );
    // The scanner found the calls the binaries are known to make (a scanner that found
    // nothing would pass every comparison below).
    assert!(
        exporter_calls.contains(&rbac::call("watch", "", "pods")),
        "{exporter_calls:?}"
    );
    assert!(
        adapter_calls.contains(&rbac::call(
            "create",
            "authorization.k8s.io",
            "subjectaccessreviews"
        )),
        "{adapter_calls:?}"
    );
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        for (workload, calls) in [
            (exporter_ds(&objs), &exporter_calls),
            (adapter_deploy(&objs), &adapter_calls),
        ] {
            let who = (
                namespace(workload),
                str_at(pod_spec(workload), "/serviceAccountName"),
            );
            let grants = granted(&objs, who);
            let unused: Vec<_> = grants.difference(calls).collect();
            let unpermitted: Vec<_> = calls.difference(&grants).collect();
            assert!(
                unused.is_empty() && unpermitted.is_empty(),
                "{overlay}: {who:?}: granted but never called {unused:?}; called but not granted {unpermitted:?}"
            );
        }
        let hpa: BTreeSet<String> = granted(&objs, ("kube-system", "horizontal-pod-autoscaler"))
            .into_iter()
            .map(|(verb, group, resource)| {
                assert!(
                    group.ends_with(".metrics.k8s.io") && resource == "*",
                    "{overlay}: HPA granted {verb} {group}/{resource}"
                );
                verb
            })
            .collect();
        assert_eq!(
            hpa.iter().collect::<Vec<_>>(),
            ["get", "list"],
            "{overlay}: the HPA controller reads, never watches"
        );
    }
}

/// Issue 18, least privilege: serving-engine discovery lists and watches EndpointSlices
/// in every namespace, so components/serving-discovery grants exactly those calls of
/// metrics-adapter/src/source/serving cluster-wide, and no overlay without it grants
/// EndpointSlices beyond the exporters' namespace. llm-serving's adapter carries the
/// flags, and mounts the ConfigMap examples/composite-hpa ships at the file it reads.
#[test]
fn serving_discovery_is_granted_cluster_wide_only_with_its_component() {
    let adapter_calls = rbac::calls_in(&workspace().join("metrics-adapter/src"));
    let slices = |calls: &BTreeSet<rbac::Call>| -> BTreeSet<rbac::Call> {
        calls
            .iter()
            .filter(|(_, g, r)| (g.as_str(), r.as_str()) == ("discovery.k8s.io", "endpointslices"))
            .cloned()
            .collect()
    };
    let serving_calls = slices(&rbac::calls_in(
        &workspace().join("metrics-adapter/src/source/serving"),
    ));
    assert!(
        serving_calls.contains(&rbac::call("watch", "discovery.k8s.io", "endpointslices")),
        "{serving_calls:?}"
    );
    // Grants through ClusterRoleBindings only: those that reach every namespace.
    let cluster_wide = |objs: &[Value]| {
        let cluster: Vec<Value> = objs
            .iter()
            .filter(|o| kind(o) != "RoleBinding")
            .cloned()
            .collect();
        let adapter = adapter_deploy(objs);
        let who = (
            namespace(adapter),
            str_at(pod_spec(adapter), "/serviceAccountName"),
        );
        (slices(&granted(&cluster, who)), granted(objs, who))
    };
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let (wide, _) = cluster_wide(&objs);
        assert!(wide.is_empty(), "{overlay}: {wide:?}");
        let a = args(container(adapter_deploy(&objs), "adapter"));
        assert_eq!(flag(&a, "--serving-service-selector"), None, "{overlay}");
        assert_eq!(flag(&a, "--composite-metrics-file"), None, "{overlay}");
    }
    let objs = build("overlays/llm-serving");
    let (wide, all_grants) = cluster_wide(&objs);
    assert_eq!(wide, serving_calls, "cluster-wide EndpointSlice grants");
    assert_eq!(
        all_grants, adapter_calls,
        "llm-serving: the adapter's grants"
    );
    let adapter = adapter_deploy(&objs);
    let a = args(container(adapter, "adapter"));
    assert_eq!(
        flag(&a, "--serving-service-selector"),
        Some("gpu-metrics.io/serving=true")
    );
    assert_eq!(flag(&a, "--serving-port-name"), Some("metrics"));
    let file = flag(&a, "--composite-metrics-file").expect("--composite-metrics-file");
    let mounts = arr(container(adapter, "adapter"), "/volumeMounts");
    let mount = mounts
        .iter()
        .find(|m| file.starts_with(&format!("{}/", str_at(m, "/mountPath"))))
        .unwrap_or_else(|| panic!("{file} is not under a mount: {mounts:?}"));
    assert_eq!(mount["readOnly"], true);
    let volume = arr(pod_spec(adapter), "/volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    let example = build("examples/composite-hpa");
    let cm = all(&example, "ConfigMap")
        .into_iter()
        .find(|c| name(c) == str_at(volume, "/configMap/name"))
        .expect("examples/composite-hpa ships the mounted ConfigMap");
    assert_eq!(namespace(cm), namespace(adapter));
    let key = Path::new(file)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("file name");
    assert!(
        cm["data"][key].is_string(),
        "the ConfigMap has no key {key}"
    );
    // The engines' pods are reachable: an egress rule to the label in any namespace.
    let policy = find(&objs, "NetworkPolicy", "gpu-metrics-adapter");
    assert!(
        arr(policy, "/spec/egress")
            .iter()
            .any(|r| r["to"][0]["namespaceSelector"] == serde_json::json!({})
                && r["to"][0]["podSelector"]["matchLabels"]["gpu-metrics.io/serving"] == "true"),
        "{policy}"
    );
}

/// Pod Security (issue 20): the adapter's namespace enforces "restricted"; the
/// exporter's, "privileged" because of its hostPath, holds the exporter and nothing
/// else. (cluster.rs has the real kube-apiserver admit and refuse the pods.)
#[test]
fn only_the_exporter_runs_in_a_privileged_namespace() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let enforce = |ns: &str| {
            let n = find(&objs, "Namespace", ns);
            str_at(n, "/metadata/labels/pod-security.kubernetes.io~1enforce").to_string()
        };
        let exporter = exporter_ds(&objs);
        let adapter = adapter_deploy(&objs);
        assert_ne!(namespace(exporter), namespace(adapter), "{overlay}");
        assert_eq!(enforce(namespace(adapter)), "restricted", "{overlay}");
        assert_eq!(enforce(namespace(exporter)), "privileged", "{overlay}");
        let in_privileged: Vec<String> = workloads(&objs)
            .into_iter()
            .filter(|(w, _)| namespace(w) == namespace(exporter))
            .map(|(w, _)| format!("{}/{}", kind(w), name(w)))
            .collect();
        assert_eq!(in_privileged, ["DaemonSet/gpu-exporter"], "{overlay}");
        // Every namespace an object names is one the overlay creates (or kube-system).
        for o in &objs {
            let ns = namespace(o);
            assert!(
                ns.is_empty()
                    || ns == "kube-system"
                    || objs.iter().any(|n| kind(n) == "Namespace" && name(n) == ns),
                "{overlay}: {}/{} in namespace {ns}, which is not created",
                kind(o),
                name(o)
            );
        }
    }
}

/// KEDA's gRPC port requires a client certificate in every overlay (issue 20): the
/// adapter gets --grpc-client-ca-file from its serving Secret, never --grpc-insecure;
/// each TLS source issues KEDA a client-only certificate from that CA; the example's
/// TriggerAuthentication presents it.
#[test]
fn keda_grpc_requires_a_client_certificate_by_default() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let d = adapter_deploy(&objs);
        let spec = pod_spec(d);
        let c = container(d, "adapter");
        let a = args(c);
        assert!(
            !a.iter().any(|x| x == "--grpc-insecure"),
            "{overlay}: {a:?}"
        );
        let ca = Path::new(
            flag(&a, "--grpc-client-ca-file")
                .unwrap_or_else(|| panic!("{overlay}: no --grpc-client-ca-file")),
        );
        let m = arr(c, "/volumeMounts")
            .iter()
            .find(|m| ca.parent() == Some(Path::new(str_at(m, "/mountPath"))))
            .unwrap_or_else(|| panic!("{overlay}: {} is not mounted", ca.display()));
        let secret = arr(spec, "/volumes")
            .iter()
            .find(|v| v["name"] == m["name"])
            .map(|v| str_at(v, "/secret/secretName"))
            .expect("the CA's volume");
        let key = ca.file_name().and_then(|f| f.to_str()).expect("file name");
        // The Secret holds that key: generated with it, or issued by cert-manager's CA
        // Issuer (which writes ca.crt), as KEDA's client certificate is.
        if let Some(s) = objs
            .iter()
            .find(|o| kind(o) == "Secret" && name(o) == secret)
        {
            assert!(
                s["data"][key].is_string(),
                "{overlay}: {secret} has no {key}"
            );
        } else {
            let serving = all(&objs, "Certificate")
                .into_iter()
                .find(|x| str_at(x, "/spec/secretName") == secret)
                .unwrap_or_else(|| panic!("{overlay}: nothing makes Secret {secret}"));
            let issuer = str_at(serving, "/spec/issuerRef/name");
            assert!(
                find(&objs, "Issuer", issuer)["spec"]["ca"].is_object(),
                "{overlay}: {issuer} is no CA Issuer (no ca.crt)"
            );
            assert_eq!(key, "ca.crt", "{overlay}");
            let client = find(&objs, "Certificate", "gpu-metrics-adapter-keda-client");
            assert_eq!(str_at(client, "/spec/issuerRef/name"), issuer, "{overlay}");
            let usages: Vec<&str> = arr(client, "/spec/usages")
                .iter()
                .map(|u| u.as_str().unwrap_or_default())
                .collect();
            assert!(
                usages.contains(&"client auth") && !usages.contains(&"server auth"),
                "{overlay}: {usages:?}"
            );
        }
    }

    // generate-certs.sh (static-certs): KEDA's certificate chains to the CA the adapter
    // trusts and is for clients only; the serving one is for servers only (openssl).
    let certs = tree().join("overlays/static-certs/certs");
    let verify = |cert: &str, purpose: &str| {
        Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(certs.join("ca.crt"))
            .args(["-purpose", purpose])
            .arg(certs.join(cert))
            .output()
            .expect("openssl")
            .status
            .success()
    };
    assert!(verify("keda-client.crt", "sslclient"));
    assert!(!verify("keda-client.crt", "sslserver"));
    assert!(!verify("tls.crt", "sslclient"));

    // The example presents the certificate, its key and the CA, from one Secret.
    let example = build("examples/keda-external");
    let auth = all(&example, "TriggerAuthentication")[0];
    let refs: BTreeMap<&str, (&str, &str)> = arr(auth, "/spec/secretTargetRef")
        .iter()
        .map(|r| {
            (
                str_at(r, "/parameter"),
                (str_at(r, "/name"), str_at(r, "/key")),
            )
        })
        .collect();
    let secret = "gpu-metrics-adapter-keda-client";
    assert_eq!(
        refs,
        BTreeMap::from([
            ("caCert", (secret, "ca.crt")),
            ("tlsClientCert", (secret, "tls.crt")),
            ("tlsClientKey", (secret, "tls.key")),
        ])
    );
    let so = all(&example, "ScaledObject")[0];
    assert_eq!(so["spec"]["triggers"][0]["metadata"]["enableTLS"], "true");
    assert_eq!(
        so["spec"]["triggers"][0]["authenticationRef"]["name"],
        name(auth)
    );
}

/// Services select their workload's pods and name its ports; the PodDisruptionBudget
/// and the NetworkPolicy select the adapter and open what it uses.
#[test]
fn services_and_policies_select_the_right_pods_and_ports() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let loads = workloads(&objs);
        for svc in all(&objs, "Service") {
            let matching: Vec<&Value> = loads
                .iter()
                .filter(|(w, labels)| {
                    namespace(w) == namespace(svc) && selects(&svc["spec"]["selector"], labels)
                })
                .map(|(w, _)| *w)
                .collect();
            assert_eq!(
                matching.len(),
                1,
                "{overlay}: Service {} selects {matching:?}",
                name(svc)
            );
            for p in arr(svc, "/spec/ports") {
                assert!(
                    resolve_port(matching[0], &p["targetPort"]).is_some(),
                    "{overlay}: Service {} targets missing port {}",
                    name(svc),
                    p["targetPort"]
                );
            }
        }

        let adapter = adapter_deploy(&objs);
        let adapter_labels = string_map(&adapter["spec"]["template"]["metadata"]["labels"]);
        let c = container(adapter, "adapter");
        let https = container_port(c, "https").unwrap();
        let grpc = container_port(c, "grpc").unwrap();
        let exporter = exporter_ds(&objs);
        let exporter_labels = string_map(&exporter["spec"]["template"]["metadata"]["labels"]);
        let metrics = container_port(container(exporter, "exporter"), "metrics").unwrap();
        let policy = all(&objs, "NetworkPolicy")
            .into_iter()
            .find(|p| selects(&p["spec"]["podSelector"], &adapter_labels))
            .unwrap_or_else(|| panic!("{overlay}: no NetworkPolicy for the adapter"));
        let ports = |rule: &Value| -> Vec<(String, i64)> {
            arr(rule, "/ports")
                .iter()
                .map(|p| {
                    (
                        p["protocol"].as_str().unwrap_or("TCP").to_string(),
                        p["port"].as_i64().expect("numeric port"),
                    )
                })
                .collect()
        };
        let ingress = arr(policy, "/spec/ingress");
        // The aggregator is not a pod: the secure port must be open to every source.
        assert!(
            ingress
                .iter()
                .any(|r| r.get("from").is_none() && ports(r).contains(&("TCP".into(), https))),
            "{overlay}: {https} not open to the aggregator"
        );
        assert!(
            !ingress
                .iter()
                .any(|r| r.get("from").is_none() && ports(r).contains(&("TCP".into(), grpc))),
            "{overlay}: gRPC open to everyone"
        );
        assert!(
            ingress.iter().any(|r| arr(r, "/from").iter().any(|f| {
                f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "keda"
            }) && ports(r).contains(&("TCP".into(), grpc))),
            "{overlay}: gRPC not open to the keda namespace"
        );
        let egress = arr(policy, "/spec/egress");
        // A peer that selects `pod` in namespace `ns` (the namespaces are told apart by
        // the label the API server sets on every namespace).
        let selects_in = |peer: &Value, ns: &str, pod: &BTreeMap<String, String>| {
            let ns_labels =
                BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())]);
            peer.get("namespaceSelector")
                .is_some_and(|s| selects(s, &ns_labels))
                && selects(&peer["podSelector"], pod)
        };
        assert!(
            egress
                .iter()
                .any(|r| arr(r, "/to").iter().any(|t| selects_in(
                    t,
                    namespace(exporter),
                    &exporter_labels
                )) && ports(r).contains(&("TCP".into(), metrics))),
            "{overlay}: no egress to the exporters in {} on {metrics}",
            namespace(exporter)
        );

        // The exporter's /metrics (pod names and labels): Prometheus and the adapter
        // only, on the metrics port only, from no other pod.
        let policy = all(&objs, "NetworkPolicy")
            .into_iter()
            .find(|p| {
                namespace(p) == namespace(exporter)
                    && selects(&p["spec"]["podSelector"], &exporter_labels)
            })
            .unwrap_or_else(|| panic!("{overlay}: no NetworkPolicy for the exporter"));
        assert!(
            arr(policy, "/spec/policyTypes").contains(&Value::from("Ingress")),
            "{overlay}: {policy}"
        );
        let rules = arr(policy, "/spec/ingress");
        assert!(!rules.is_empty(), "{overlay}: {policy}");
        let prometheus = BTreeMap::from([(
            "app.kubernetes.io/name".to_string(),
            "prometheus".to_string(),
        )]);
        for r in rules {
            assert_eq!(ports(r), [("TCP".to_string(), metrics)], "{overlay}: {r}");
            let peers = arr(r, "/from");
            assert!(
                !peers.is_empty(),
                "{overlay}: /metrics open to everyone: {r}"
            );
            for peer in peers {
                assert!(
                    selects_in(peer, namespace(adapter), &adapter_labels)
                        || selects_in(peer, "monitoring", &prometheus),
                    "{overlay}: a peer that is neither Prometheus nor the adapter: {peer}"
                );
            }
            // Not another pod of the adapter's namespace, nor the adapter elsewhere.
            let other = BTreeMap::from([("app".to_string(), "web".to_string())]);
            assert!(
                !peers
                    .iter()
                    .any(|p| selects_in(p, namespace(adapter), &other)
                        || selects_in(p, "default", &adapter_labels)),
                "{overlay}: {r}"
            );
        }
        for (ns, labels, who) in [
            (namespace(adapter), &adapter_labels, "the adapter"),
            (
                "monitoring",
                &prometheus,
                "kube-prometheus-stack's Prometheus",
            ),
        ] {
            assert!(
                rules
                    .iter()
                    .any(|r| arr(r, "/from").iter().any(|p| selects_in(p, ns, labels))),
                "{overlay}: {who} cannot scrape the exporters"
            );
        }
        assert!(
            egress
                .iter()
                .any(|r| ports(r).contains(&("UDP".into(), 53))),
            "{overlay}: no DNS"
        );
        assert!(
            egress
                .iter()
                .any(|r| r.get("to").is_none() && ports(r).contains(&("TCP".into(), 443))),
            "{overlay}: no egress to the API server"
        );
    }
}

// ---------------------------------------------------------------------------------
// Examples.

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
    let got: f64 = result[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a sample value");
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
