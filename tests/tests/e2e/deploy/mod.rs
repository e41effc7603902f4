//! Issue 7's manifests (`deploy/`): every overlay, component and example builds with
//! `kubectl kustomize` and validates (kubernetes-validate, strict, for built-in kinds;
//! the JSON schemas in tests/fixtures/crd-schemas for custom resources), the objects
//! fit together (Services select their pods, bindings name service accounts that exist,
//! APIServices point at the adapter and trust its certificate, flags name what exists
//! and the binaries run with them until ready), and the KEDA prometheus example's query returns,
//! from a real Prometheus scraping the exporter on a simulated node, the value its
//! metricType and threshold need.
//!
//! One file per area: `validation` (everything builds and validates), `exporter`,
//! `adapter` and `examples`; this file holds what they share (building, validating and
//! reading objects).

use e2e_tests::{scratch_dir, workspace};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

mod adapter;
mod examples;
mod exporter;
mod validation;

/// Kubernetes versions every built object must validate against: the oldest we claim
/// (deploy/README.md) and the newest kubernetes-validate ships.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31", "1.37"];

const OVERLAYS: [&str; 4] = ["default", "keda", "static-certs", "process-attribution"];

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

/// The rule file `gpu-metrics-adapter --print-recording-rules` prints, parsed: the
/// rules `--prometheus-queries=recorded` reads, which components/prometheus-recording-rules
/// and the adapter chart ship as a PrometheusRule.
pub(crate) fn printed_recording_rules() -> Value {
    let yaml =
        run(Command::new(e2e_tests::binary("gpu-metrics-adapter")).arg("--print-recording-rules"));
    let rules: Value = serde_saphyr::from_str(&yaml).expect("the printed rules are YAML");
    let groups = rules["groups"].as_array().expect("a rule file's groups");
    assert!(
        !groups.is_empty()
            && groups.iter().all(|g| {
                let rules = g["rules"].as_array().map(Vec::as_slice).unwrap_or(&[]);
                !rules.is_empty()
                    && rules
                        .iter()
                        .all(|r| r["record"].is_string() && r["expr"].is_string())
            }),
        "not a rule file of recording rules:\n{yaml}"
    );
    rules
}

/// Whether `gpu-metrics-adapter` accepts these arguments (parsed up to `--help`).
pub(crate) fn adapter_accepts<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Result<(), String> {
    let out = Command::new(e2e_tests::binary("gpu-metrics-adapter"))
        .args(args)
        .arg("--help")
        .env_remove("KUBECONFIG")
        .output()
        .expect("run gpu-metrics-adapter");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
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
