//! Issue 15's charts (`deploy/helm`), with the real helm (built by tests/kube/build.sh):
//! `helm lint --strict`; for every choice the kustomize overlays and components offer,
//! the charts render the same objects as kustomize, field by field (the one source of
//! truth is `deploy/base`; the chart must not drift from it); a matrix of other values,
//! each validated like the kustomize output and checked where it lands; wrong values
//! refused by the schema with a message naming them; and install, upgrade, a refused
//! upgrade and uninstall in a real cluster (tests/kube/cluster.sh with DEPLOY_WITH=helm).

use crate::cluster::{APISERVICES, apiservices_are_available, scaling_active, settle, step};
use crate::deploy::{
    adapter_accepts, build, kustomizations, kustomize, printed_recording_rules, tree, validate_yaml,
};
use e2e_tests::cluster::Cluster;
use e2e_tests::{binary, hpa, scratch_dir, workspace};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

const EXPORTER: &str = "deploy/helm/gpu-exporter";
const ADAPTER: &str = "deploy/helm/gpu-metrics-adapter";
/// The namespaces deploy/base uses (the adapter's, restricted, and the exporter's own,
/// privileged), and the release names that give its object names.
const NS: &str = "gpu-monitoring";
const EXPORTER_NS: &str = "gpu-exporter";

/// The namespace each chart is installed in, as deploy/base places its objects.
fn namespace_of(chart: &str) -> &'static str {
    if chart == EXPORTER { EXPORTER_NS } else { NS }
}

/// Labels Helm adds that deploy/base has no reason to carry.
const HELM_ONLY_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

// ---------------------------------------------------------------------------------
// Running helm.

fn helm_binary() -> PathBuf {
    std::env::var_os("KUBE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/kube/bin"))
        .join("helm")
}

/// helm with its state in a scratch directory, never the user's.
fn helm() -> Command {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    let home = HOME.get_or_init(|| scratch_dir("helm-home"));
    let mut cmd = Command::new(helm_binary());
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG");
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| {
        panic!("run {cmd:?}: {e} (tests/kube/build.sh builds helm into target/kube/bin)")
    })
}

fn succeed(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `helm template RELEASE CHART -n NAMESPACE ARGS…` from the workspace, in the chart's
/// namespace (`namespace_of`).
fn template(release: &str, chart: &str, args: &[&str]) -> String {
    succeed(
        helm()
            .current_dir(workspace())
            .args(["template", release, chart, "-n", namespace_of(chart)])
            .args(args),
    )
}

/// Both charts rendered with their release names and validated (kubernetes-validate,
/// strict, two Kubernetes versions; the CRD schemas of tests/fixtures/crd-schemas).
fn render(exporter: &[&str], adapter: &[&str]) -> Vec<Value> {
    let yaml = format!(
        "{}\n---\n{}",
        template("gpu-exporter", EXPORTER, exporter),
        template("gpu-metrics-adapter", ADAPTER, adapter)
    );
    validated(&yaml, "helm template")
}

fn validated(yaml: &str, what: &str) -> Vec<Value> {
    let (objects, errors) = validate_yaml(yaml);
    assert!(errors.is_empty(), "{what}:\n{}", errors.join("\n"));
    objects
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

fn find<'a>(objs: &'a [Value], k: &str, n: &str) -> &'a Value {
    objs.iter()
        .find(|o| kind(o) == k && name(o) == n)
        .unwrap_or_else(|| panic!("no {k}/{n} in {:?}", ids(objs)))
}

fn ids(objs: &[Value]) -> Vec<String> {
    objs.iter()
        .map(|o| format!("{}/{}", kind(o), name(o)))
        .collect()
}

fn container<'a>(objs: &'a [Value], k: &str, n: &str) -> &'a Value {
    &find(objs, k, n)["spec"]["template"]["spec"]["containers"][0]
}

fn args(c: &Value) -> Vec<&str> {
    c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect()
}

// ---------------------------------------------------------------------------------
// One source of truth: helm template == kustomize build, for the same choices.

/// The objects keyed by kind, namespace and name, made comparable: kustomize's generated
/// names lose their content hash (Helm rolls the DaemonSet with a checksum annotation
/// instead, dropped here), Helm's own labels go, base64 fields are compared by their
/// bytes (kustomize wraps lines), and the Namespace object, which a chart leaves to
/// `helm install --create-namespace`, is set aside.
fn comparable(objs: &[Value]) -> BTreeMap<String, Value> {
    let mut hashed = BTreeMap::new();
    for o in objs {
        if let ("ConfigMap" | "Secret", Some((stem, hash))) = (kind(o), name(o).rsplit_once('-'))
            && hash.len() == 10
            && hash.chars().all(|c| c.is_ascii_alphanumeric())
        {
            hashed.insert(name(o).to_string(), stem.to_string());
        }
    }
    objs.iter()
        .filter(|o| kind(o) != "Namespace")
        .map(|o| {
            let mut o = normalize(o.clone(), &hashed);
            if kind(&o) == "Secret" {
                for v in o["data"]
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|m| m.values_mut())
                {
                    *v = Value::String(v.as_str().unwrap_or_default().split_whitespace().collect());
                }
            }
            if let Some(b) = o.pointer_mut("/spec/caBundle") {
                *b = Value::String(b.as_str().unwrap_or_default().split_whitespace().collect());
            }
            let key = format!(
                "{}/{}/{}",
                kind(&o),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                name(&o)
            );
            (key, o)
        })
        .collect()
}

fn normalize(v: Value, hashed: &BTreeMap<String, String>) -> Value {
    match v {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                if HELM_ONLY_LABELS.contains(&k.as_str()) || k.starts_with("checksum/") {
                    continue;
                }
                let v = normalize(v, hashed);
                if k == "annotations" && v.as_object().is_some_and(|m| m.is_empty()) {
                    continue;
                }
                out.insert(k, v);
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| normalize(v, hashed)).collect())
        }
        Value::String(s) => Value::String(hashed.get(&s).cloned().unwrap_or(s)),
        other => other,
    }
}

/// Assert that the two renderings hold the same objects, naming every difference.
fn assert_same(case: &str, kustomized: &[Value], helmed: &[Value]) {
    let k = comparable(kustomized);
    let h = comparable(helmed);
    let mut problems = Vec::new();
    for key in k.keys().filter(|key| !h.contains_key(*key)) {
        problems.push(format!("only kustomize renders {key}"));
    }
    for key in h.keys().filter(|key| !k.contains_key(*key)) {
        problems.push(format!("only helm renders {key}"));
    }
    for (key, ko) in &k {
        if let Some(ho) = h.get(key)
            && ko != ho
        {
            problems.push(format!(
                "{key} differs:\n  kustomize: {ko}\n  helm:      {ho}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{case}: the charts and deploy/ drifted apart:\n{}",
        problems.join("\n")
    );
    assert!(k.len() >= 10, "{case}: compared only {:?}", k.keys());
}

/// A kustomization in the private deploy/ copy: the base with these components.
fn composed(rel: &str, components: &[&str]) -> PathBuf {
    let dir = tree().join(rel);
    std::fs::create_dir_all(&dir).expect("kustomization dir");
    let list: String = components
        .iter()
        .map(|c| format!("  - ../../components/{c}\n"))
        .collect();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n{list}"),
    )
    .expect("write kustomization");
    dir
}

/// The static-certs overlay's files, as `--set-file` arguments.
fn static_cert_args() -> Vec<String> {
    let certs = tree().join("overlays/static-certs/certs");
    let mut a = vec!["--set".to_string(), "tls.source=static".to_string()];
    for (key, file) in [("cert", "tls.crt"), ("key", "tls.key"), ("ca", "ca.crt")] {
        a.push("--set-file".into());
        a.push(format!("tls.static.{key}={}", certs.join(file).display()));
    }
    a
}

#[test]
fn the_charts_render_what_kustomize_renders_for_every_choice() {
    let statics = static_cert_args();
    let statics: Vec<&str> = statics.iter().map(String::as_str).collect();
    let runtime = composed(
        "overlays/_helm-nvidia-runtime-class",
        &[
            "external-metrics",
            "cert-manager",
            "service-monitor",
            "nvidia-runtime-class",
        ],
    );
    let without_monitors = composed(
        "overlays/_helm-no-monitor",
        &["external-metrics", "cert-manager"],
    );
    let cases: Vec<(&str, PathBuf, Vec<&str>, Vec<&str>)> = vec![
        ("default", tree().join("overlays/default"), vec![], vec![]),
        (
            "llm-serving",
            tree().join("overlays/llm-serving"),
            vec![],
            vec![
                "--set",
                "servingDiscovery.enabled=true",
                "--set",
                "composites.configMap.name=gpu-metrics-adapter-composites",
            ],
        ),
        (
            "keda",
            tree().join("overlays/keda"),
            vec![],
            vec!["--set", "externalMetrics.enabled=false"],
        ),
        (
            "process-attribution",
            tree().join("overlays/process-attribution"),
            vec!["--set", "processAttribution.enabled=true"],
            vec![],
        ),
        (
            "static-certs",
            tree().join("overlays/static-certs"),
            vec![],
            statics,
        ),
        (
            "nvidia-runtime-class",
            runtime,
            vec!["--set", "runtimeClassName=nvidia"],
            vec![],
        ),
        (
            "without service-monitor",
            without_monitors,
            vec!["--set", "serviceMonitor.enabled=false"],
            vec!["--set", "serviceMonitor.enabled=false"],
        ),
    ];
    for (case, dir, exporter, adapter) in cases {
        let kustomized = validated(&kustomize(&dir), case);
        let helmed = render(&exporter, &adapter);
        assert_same(case, &kustomized, &helmed);
    }
}

// ---------------------------------------------------------------------------------
// Architectures: the images are amd64 and arm64 (Grace nodes), one tag.

/// What would pin a CPU architecture in `v`: the node label `kubernetes.io/arch` (or its
/// beta form) anywhere (nodeSelector, node affinity, topology keys), or an amd64 name in
/// any string (an image tag, a selector value), as JSON pointers.
fn architecture_pins(v: &Value, at: &str, out: &mut Vec<String>) {
    let pinned = |s: &str| {
        let s = s.to_ascii_lowercase();
        s.contains("kubernetes.io/arch")
            || ["amd64", "x86_64", "x86-64"].iter().any(|a| s.contains(a))
    };
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let here = format!("{at}/{k}");
                if pinned(k) {
                    out.push(here.clone());
                }
                architecture_pins(v, &here, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                architecture_pins(v, &format!("{at}/{i}"), out);
            }
        }
        Value::String(s) if pinned(s) => out.push(format!("{at} = {s}")),
        _ => {}
    }
}

fn assert_unpinned(case: &str, objs: &[Value]) {
    let mut pins = Vec::new();
    for o in objs {
        architecture_pins(o, &format!("{}/{}", kind(o), name(o)), &mut pins);
    }
    assert!(
        pins.is_empty(),
        "{case} pins a CPU architecture (the images are amd64 and arm64):\n{}",
        pins.join("\n")
    );
}

#[test]
fn nothing_rendered_pins_a_cpu_architecture_unless_a_user_asks() {
    // kustomize: every overlay and example, and the base with each component.
    let mut renders = 0;
    for parent in ["overlays", "examples"] {
        for k in kustomizations(parent) {
            let rel = format!("{parent}/{k}");
            assert_unpinned(&format!("deploy/{rel}"), &build(&rel));
            renders += 1;
        }
    }
    for component in kustomizations("components") {
        let mut list = vec!["external-metrics"];
        if component != "external-metrics" {
            list.push(&component);
        }
        let dir = composed(&format!("overlays/_arch-{component}"), &list);
        let objs = validated(&kustomize(&dir), &component);
        assert_unpinned(&format!("deploy/base with {component}"), &objs);
        renders += 1;
    }
    assert!(renders >= 10, "only {renders} kustomize renders");

    // helm: the charts' defaults and the choices that change the pod specs.
    for (case, exporter, adapter) in [
        ("the charts' defaults", vec![], vec![]),
        (
            "process attribution, serving discovery, the NVIDIA runtime class",
            vec![
                "--set",
                "processAttribution.enabled=true",
                "--set",
                "runtimeClassName=nvidia",
            ],
            vec!["--set", "servingDiscovery.enabled=true"],
        ),
    ] {
        assert_unpinned(&format!("helm, {case}"), &render(&exporter, &adapter));
    }

    // A user who wants one architecture says so, and it lands in the pod spec.
    let objs = render(
        &["--set", "nodeSelector.kubernetes\\.io/arch=arm64"],
        &["--set", "nodeSelector.kubernetes\\.io/arch=arm64"],
    );
    for (k, n) in [
        ("DaemonSet", "gpu-exporter"),
        ("Deployment", "gpu-metrics-adapter"),
    ] {
        assert_eq!(
            find(&objs, k, n)["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/arch"],
            "arm64",
            "{k}/{n}"
        );
    }
}

/// Issue 18's values: the flags land in the adapter's arguments, the composites file is
/// mounted read-only where the flag points, and the cluster-wide EndpointSlice grant
/// appears only with serving discovery on.
#[test]
fn serving_composite_and_signal_values_land_in_the_adapter() {
    let serving_grant = |objs: &[Value]| {
        objs.iter()
            .filter(|o| kind(o) == "ClusterRole")
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
            .any(|rule| rule["resources"] == json!(["endpointslices"]))
    };
    let off = render(&[], &[]);
    assert!(
        !serving_grant(&off),
        "off: no cluster-wide EndpointSlice grant"
    );
    let a = args(container(&off, "Deployment", "gpu-metrics-adapter"));
    assert!(
        !a.iter().any(|x| x.starts_with("--serving")
            || x.starts_with("--composite")
            || x.starts_with("--signal")),
        "{a:?}"
    );
    let on = render(
        &[],
        &[
            "--set",
            "servingDiscovery.enabled=true,servingDiscovery.serviceSelector=team=llm,servingDiscovery.portName=http",
            "--set",
            "composites.configMap.name=my-composites,composites.configMap.key=c.conf",
            "--set-string",
            "composites.metrics[0]=hot=max(gpu_utilization/70\\,serving_requests_waiting/50)",
            "--set-string",
            "signals.sources[0]=inference/gateway_requests_waiting=promql:sum(q),signals.interval=1s",
        ],
    );
    let binding = find(
        &on,
        "ClusterRoleBinding",
        "gpu-metrics-adapter-serving-discovery",
    );
    assert_eq!(
        binding["roleRef"]["name"],
        "gpu-metrics-adapter-serving-discovery"
    );
    let role = find(&on, "ClusterRole", "gpu-metrics-adapter-serving-discovery");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}])
    );
    let c = container(&on, "Deployment", "gpu-metrics-adapter");
    let a = args(c);
    for want in [
        "--serving-service-selector=team=llm",
        "--serving-port-name=http",
        "--composite-metrics-file=/etc/gpu-metrics-adapter/c.conf",
        "--composite-metric=hot=max(gpu_utilization/70,serving_requests_waiting/50)",
        "--signal=inference/gateway_requests_waiting=promql:sum(q)",
        "--signal-interval=1s",
    ] {
        assert!(a.contains(&want), "{want} not in {a:?}");
    }
    assert!(c["volumeMounts"].as_array().expect("mounts").contains(
        &json!({"name": "composites", "mountPath": "/etc/gpu-metrics-adapter", "readOnly": true})
    ));
    let d = find(&on, "Deployment", "gpu-metrics-adapter");
    assert!(
        d["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .contains(&json!({"name": "composites", "configMap": {"name": "my-composites"}}))
    );
}

#[test]
fn the_dashboards_and_rules_are_dashboards_folders_own() {
    // dashboards/alerts and dashboards/grafana, in the release namespace, against the
    // exporter chart's switches for them.
    let dir = scratch_dir("helm-dashboards");
    let rel = |p: &str| {
        let from = dir.canonicalize().expect("scratch dir");
        let to = workspace().join(p);
        let up = from.components().count() - 1;
        format!(
            "{}{}",
            "../".repeat(up),
            to.strip_prefix("/").expect("absolute").display()
        )
    };
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {EXPORTER_NS}\nresources:\n  - {}\n  - {}\n",
            rel("dashboards/alerts"),
            rel("dashboards/grafana")
        ),
    )
    .expect("write kustomization");
    let kustomized = validated(&kustomize(&dir), "dashboards/");
    let helmed = validated(
        &template(
            "gpu-exporter",
            EXPORTER,
            &[
                "--set",
                "prometheusRule.enabled=true",
                "--set",
                "dashboards.enabled=true",
                "--show-only",
                "templates/prometheusrule.yaml",
                "--show-only",
                "templates/dashboards.yaml",
            ],
        ),
        "helm template",
    );
    let k = comparable(&kustomized);
    let h = comparable(&helmed);
    assert_eq!(
        k.keys().collect::<Vec<_>>(),
        h.keys().collect::<Vec<_>>(),
        "the same dashboards and rules"
    );
    assert!(k.len() >= 8, "{:?}", k.keys());
    for (key, ko) in &k {
        assert_eq!(ko, &h[key], "{key} drifted from dashboards/");
    }
}

/// prometheus.queries and prometheus.recordingRules: with a Prometheus URL, `recorded`
/// lands in the adapter's flags (which the adapter accepts), and the rules render as
/// the very PrometheusRule of deploy/components/prometheus-recording-rules, whose groups
/// are what `gpu-metrics-adapter --print-recording-rules` prints, in the namespace and
/// with the labels asked for; by default, neither.
#[test]
fn recorded_queries_and_their_rules_render_only_when_asked() {
    let queries = |objs: &[Value]| -> Vec<String> {
        args(container(objs, "Deployment", "gpu-metrics-adapter"))
            .into_iter()
            .filter(|a| a.starts_with("--prometheus-queries"))
            .map(String::from)
            .collect()
    };
    let rules = |objs: &[Value]| -> Vec<Value> {
        objs.iter()
            .filter(|o| kind(o) == "PrometheusRule")
            .cloned()
            .collect()
    };
    let url = "prometheus.url=http://prometheus.monitoring:9090";

    let defaults = render(&[], &[]);
    assert!(queries(&defaults).is_empty(), "{:?}", queries(&defaults));
    assert!(rules(&defaults).is_empty(), "{:?}", ids(&defaults));
    // A URL alone: inline queries, said explicitly; no rules.
    let inline = render(&[], &["--set", url]);
    assert_eq!(queries(&inline), ["--prometheus-queries=inline"]);
    assert!(rules(&inline).is_empty(), "{:?}", ids(&inline));

    let on = render(
        &[],
        &[
            "--set",
            url,
            "--set",
            "prometheus.queries=recorded,prometheus.recordingRules.enabled=true",
        ],
    );
    assert_eq!(queries(&on), ["--prometheus-queries=recorded"]);
    let a = args(container(&on, "Deployment", "gpu-metrics-adapter"));
    adapter_accepts(&a).unwrap_or_else(|e| panic!("the adapter rejects {a:?}: {e}"));
    let rule = find(&on, "PrometheusRule", "gpu-metrics-adapter-recording-rules");
    assert_eq!(rule["metadata"]["namespace"], NS);
    assert_eq!(rule["spec"]["groups"], printed_recording_rules()["groups"]);
    // The object the kustomize component renders, field by field.
    let dir = composed(
        "overlays/_helm-recording-rules",
        &["external-metrics", "prometheus-recording-rules"],
    );
    let kustomized = rules(&validated(&kustomize(&dir), "prometheus-recording-rules"));
    assert_eq!(kustomized.len(), 1, "the component's PrometheusRule");
    assert_eq!(comparable(&kustomized), comparable(&rules(&on)));

    // Rules without recorded queries (loaded ahead of the switch), in Prometheus's
    // namespace, with the label its ruleSelector asks for.
    let elsewhere = validated(
        &template(
            "gpu-metrics-adapter",
            ADAPTER,
            &[
                "--set",
                "prometheus.recordingRules.enabled=true,prometheus.recordingRules.namespace=monitoring",
                "--set",
                "prometheus.recordingRules.additionalLabels.release=kube-prometheus-stack",
                "--show-only",
                "templates/prometheusrule.yaml",
            ],
        ),
        "helm template",
    );
    let rule = find(
        &elsewhere,
        "PrometheusRule",
        "gpu-metrics-adapter-recording-rules",
    );
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(
        rule["metadata"]["labels"]["app.kubernetes.io/component"],
        "recording-rules"
    );
}

// ---------------------------------------------------------------------------------
// Lint, schema, values.

#[test]
fn every_chart_lints_strictly() {
    for chart in [EXPORTER, ADAPTER] {
        succeed(
            helm()
                .current_dir(workspace())
                .args(["lint", "--strict", chart]),
        );
    }
    // And with the choices that render other templates.
    succeed(helm().current_dir(workspace()).args([
        "lint",
        "--strict",
        EXPORTER,
        "--set",
        "prometheusRule.enabled=true,dashboards.enabled=true,processAttribution.enabled=true",
    ]));
    succeed(helm().current_dir(workspace()).args([
        "lint",
        "--strict",
        ADAPTER,
        "--set",
        "tls.source=selfSigned,prometheus.url=http://prometheus.monitoring:9090",
        "--set",
        "prometheus.queries=recorded,prometheus.recordingRules.enabled=true",
    ]));
}

#[test]
fn a_wrong_value_is_refused_with_a_message_that_names_it() {
    for (chart, set, names) in [
        (EXPORTER, "serviceMonitor.enable=true", "enable"),
        (EXPORTER, "image.pullPolicy=Sometimes", "pullPolicy"),
        (EXPORTER, "logFormat=yaml", "logFormat"),
        (EXPORTER, "service.port=70000", "port"),
        (EXPORTER, "serviceMonitor.interval=15", "interval"),
        (ADAPTER, "replicas=-1", "replicas"),
        (ADAPTER, "tls.source=vault", "source"),
        (ADAPTER, "tls.source=static", "static"),
        (ADAPTER, "exporters.service=gpu-exporter", "service"),
        (ADAPTER, "prometheus.url=prometheus:9090", "url"),
        (ADAPTER, "prometheus.queries=aggregated", "queries"),
        // Recorded queries read Prometheus: without its URL they would do nothing.
        (ADAPTER, "prometheus.queries=recorded", "url"),
        (ADAPTER, "prometheus.recordingRules.enable=true", "enable"),
    ] {
        let out = output(
            helm()
                .current_dir(workspace())
                .args(["template", "x", chart, "--set", set]),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{chart} accepted {set}");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(names),
            "{chart} --set {set}: {stderr}"
        );
    }
    // A typed string where a number belongs, from a values file as users write them.
    let values = scratch_dir("helm-values").join("values.yaml");
    std::fs::write(&values, "replicas: two\n").expect("values file");
    let out = output(
        helm()
            .current_dir(workspace())
            .args(["template", "x", ADAPTER, "-f"])
            .arg(&values),
    );
    assert!(!out.status.success(), "replicas: two accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("replicas"));
}

#[test]
fn values_land_where_they_say_and_still_validate() {
    let csv = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n";
    let csv_file = scratch_dir("helm-counters").join("counters.csv");
    std::fs::write(&csv_file, csv).expect("write counters");
    let csv_arg = format!("counters.csv={}", csv_file.display());
    let objs = render(
        &[
            "--set",
            "image.repository=registry.example.com/gpu/gpu-exporter,image.tag=9.9.9",
            "--set",
            "arguments={--collect-interval=5000,--no-hostname}",
            "--set",
            "nodeSelector.pool=gpu,priorityClassName=,runtimeClassName=nvidia",
            "--set",
            "tolerations[0].operator=Exists",
            "--set",
            "extraEnv[0].name=RUST_LOG,extraEnv[0].value=debug",
            "--set",
            "extraVolumes[0].name=scratch,extraVolumes[0].emptyDir.medium=Memory",
            "--set",
            "extraVolumeMounts[0].name=scratch,extraVolumeMounts[0].mountPath=/scratch",
            "--set",
            "podAnnotations.team=ml,podLabels.tier=monitoring",
            "--set",
            "resources.limits.memory=64Mi",
            "--set",
            "serviceMonitor.additionalLabels.release=kube-prometheus-stack,serviceMonitor.interval=30s",
            "--set",
            "kubeletPath=/var/lib/k0s/kubelet/pod-resources",
            "--set-file",
            &csv_arg,
            "--set",
            "networkPolicy.prometheus.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=observability",
            "--set",
            "networkPolicy.adapter.namespace=autoscaling,networkPolicy.extraFrom[0].ipBlock.cidr=10.0.0.0/8",
        ],
        &[
            "--set",
            "replicas=3,prometheus.url=http://prometheus.monitoring:9090",
            "--set",
            "tls.source=selfSigned",
            "--set",
            "networkPolicy.kedaNamespace=autoscaling",
            "--set",
            "arguments={--scrape-interval=5s}",
            "--set",
            "grpc.clientAuth=plaintext",
        ],
    );
    let ds = find(&objs, "DaemonSet", "gpu-exporter");
    let pod = &ds["spec"]["template"];
    let c = container(&objs, "DaemonSet", "gpu-exporter");
    assert_eq!(c["image"], "registry.example.com/gpu/gpu-exporter:9.9.9");
    let a = args(c);
    assert_eq!(
        a[a.len() - 2..],
        ["--collect-interval=5000", "--no-hostname"],
        "{a:?}"
    );
    assert_eq!(pod["spec"]["nodeSelector"], json!({"pool": "gpu"}));
    assert!(pod["spec"].get("priorityClassName").is_none(), "emptied");
    assert_eq!(pod["spec"]["runtimeClassName"], "nvidia");
    assert_eq!(pod["spec"]["tolerations"], json!([{"operator": "Exists"}]));
    assert!(
        c["env"]
            .as_array()
            .expect("env")
            .contains(&json!({"name": "RUST_LOG", "value": "debug"}))
    );
    assert!(
        pod["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == "scratch")
    );
    assert!(
        c["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["mountPath"] == "/scratch")
    );
    assert_eq!(pod["metadata"]["annotations"]["team"], "ml");
    assert!(pod["metadata"]["annotations"]["checksum/counters"].is_string());
    assert_eq!(pod["metadata"]["labels"]["tier"], "monitoring");
    assert_eq!(c["resources"]["limits"]["memory"], "64Mi");
    let host = pod["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "pod-resources")
        .expect("pod-resources volume");
    assert_eq!(
        host["hostPath"]["path"],
        "/var/lib/k0s/kubelet/pod-resources"
    );
    assert_eq!(
        find(&objs, "ConfigMap", "gpu-exporter-counters")["data"]["counters.csv"],
        csv
    );
    // Who may scrape: the Prometheus and adapter namespaces given, the extra peer, port
    // 9400 only.
    let np = find(&objs, "NetworkPolicy", "gpu-exporter");
    let rule = &np["spec"]["ingress"][0];
    assert_eq!(
        np["spec"]["ingress"].as_array().map(Vec::len),
        Some(1),
        "{np}"
    );
    assert_eq!(rule["ports"], json!([{"protocol": "TCP", "port": 9400}]));
    let peers = rule["from"].as_array().expect("from");
    let ns_of =
        |p: &Value| p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"].clone();
    assert_eq!(
        peers.iter().map(ns_of).collect::<Vec<_>>(),
        [json!("observability"), json!("autoscaling"), Value::Null],
        "{peers:?}"
    );
    assert_eq!(peers[2], json!({"ipBlock": {"cidr": "10.0.0.0/8"}}));
    let sm = find(&objs, "ServiceMonitor", "gpu-exporter");
    assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "30s");

    let deploy = find(&objs, "Deployment", "gpu-metrics-adapter");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let a = args(container(&objs, "Deployment", "gpu-metrics-adapter"));
    assert!(
        a.contains(&"--prometheus-url=http://prometheus.monitoring:9090"),
        "{a:?}"
    );
    assert!(
        !a.iter().any(|x| x.starts_with("--exporter-service")),
        "{a:?}"
    );
    assert_eq!(a.last(), Some(&"--scrape-interval=5s"));
    // grpc.clientAuth=plaintext: the explicit opt-out, and no client certificate issued.
    assert!(a.contains(&"--grpc-insecure"), "{a:?}");
    assert!(
        !a.iter().any(|x| x.starts_with("--grpc-client-ca-file")),
        "{a:?}"
    );
    assert!(
        !objs.iter().any(|o| name(o).ends_with("keda-client")),
        "no KEDA client certificate without mutual TLS"
    );
    assert!(
        !objs.iter().any(|o| name(o).ends_with("exporter-discovery")),
        "no EndpointSlice grant without exporter discovery"
    );
    let np = find(&objs, "NetworkPolicy", "gpu-metrics-adapter");
    assert_eq!(
        np["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "autoscaling"
    );
    // selfSigned: the Secret's CA is what every APIService trusts, and it signed a
    // certificate for the Service's name.
    let secret = find(&objs, "Secret", "gpu-metrics-adapter-tls");
    let ca = secret["data"]["ca.crt"].as_str().expect("ca.crt");
    for api in APISERVICES {
        assert_eq!(
            find(&objs, "APIService", api)["spec"]["caBundle"],
            ca,
            "{api}"
        );
    }
    verify_serving_cert(secret, "gpu-metrics-adapter.gpu-monitoring.svc");

    // The binaries accept what the charts pass.
    for (bin, a) in [
        ("gpu-exporter", args(c)),
        (
            "gpu-metrics-adapter",
            args(container(&objs, "Deployment", "gpu-metrics-adapter")),
        ),
    ] {
        let out = Command::new(binary(bin))
            .args(&a)
            .arg("--help")
            .env_remove("KUBECONFIG")
            .output()
            .expect("run the binary");
        assert!(
            out.status.success(),
            "{bin} rejects {a:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Without attribution: no socket, no root-only volume, no pod watch grant.
    let objs = render(
        &[
            "--set",
            "kubernetes.enabled=false,serviceAccount.create=false,serviceAccount.name=default",
            "--set",
            "counters.existingConfigMap=my-counters",
        ],
        &[
            "--set",
            "tls.source=existingSecret,tls.existingSecret.name=my-tls",
            "--set-string",
            "tls.existingSecret.ca=PEM",
            "--set",
            "exporters.service=monitoring/dcgm-exporter,rbac.aggregateToViewRoles=false",
        ],
    );
    let c = container(&objs, "DaemonSet", "gpu-exporter");
    assert!(!args(c).contains(&"--kubernetes"));
    let ds = find(&objs, "DaemonSet", "gpu-exporter");
    let volumes = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    assert!(
        !volumes.iter().any(|v| v["name"] == "pod-resources"),
        "{volumes:?}"
    );
    assert!(
        volumes
            .iter()
            .any(|v| v["configMap"]["name"] == "my-counters")
    );
    assert_eq!(
        ds["spec"]["template"]["spec"]["serviceAccountName"],
        "default"
    );
    assert!(
        !objs
            .iter()
            .any(|o| kind(o) == "ServiceAccount" && name(o) == "gpu-exporter")
    );
    assert!(
        !objs
            .iter()
            .any(|o| kind(o) == "ClusterRole" && name(o) == "gpu-exporter")
    );
    assert!(
        !objs
            .iter()
            .any(|o| kind(o) == "ConfigMap" && name(o) == "gpu-exporter-counters")
    );
    let d = find(&objs, "Deployment", "gpu-metrics-adapter");
    assert_eq!(
        d["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "my-tls"
    );
    assert!(
        !objs.iter().any(|o| kind(o) == "Secret"),
        "existingSecret: no Secret made"
    );
    assert!(
        !objs
            .iter()
            .any(|o| kind(o) == "ClusterRole" && name(o).ends_with("api-viewer"))
    );
    let role = find(&objs, "Role", "gpu-metrics-adapter-exporter-discovery");
    assert_eq!(role["metadata"]["namespace"], "monitoring");
    // The adapter may reach the exporters in the namespace of their Service only.
    let np = find(&objs, "NetworkPolicy", "gpu-metrics-adapter");
    assert_eq!(
        np["spec"]["egress"][0]["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring",
        "{np}"
    );
    assert!(
        args(container(&objs, "Deployment", "gpu-metrics-adapter"))
            .contains(&"--exporter-service=monitoring/dcgm-exporter")
    );
    for api in APISERVICES {
        assert_eq!(
            find(&objs, "APIService", api)["spec"]["caBundle"],
            "UEVN",
            "{api}"
        );
    }
}

#[test]
fn self_signed_issues_keda_a_client_certificate_the_adapter_trusts() {
    // The default grpc.clientAuth (mutualTLS) with a Helm-made CA: the adapter requires
    // client certificates from the CA in its serving Secret, and the chart issues KEDA
    // one from that CA, valid for client authentication (openssl's purpose check).
    let objs = validated(
        &template(
            "gpu-metrics-adapter",
            ADAPTER,
            &["--set", "tls.source=selfSigned"],
        ),
        "helm template",
    );
    let a = args(container(&objs, "Deployment", "gpu-metrics-adapter"));
    assert!(
        a.contains(&"--grpc-client-ca-file=/var/run/serving-cert/ca.crt"),
        "{a:?}"
    );
    let serving = find(&objs, "Secret", "gpu-metrics-adapter-tls");
    let client = find(&objs, "Secret", "gpu-metrics-adapter-keda-client");
    assert_eq!(client["data"]["ca.crt"], serving["data"]["ca.crt"]);
    verify_cert(client, &["-purpose", "sslclient"]);
}

/// The Secret's tls.crt chains to its ca.crt and names `host` (openssl, an independent
/// X.509 implementation).
fn verify_serving_cert(secret: &Value, host: &str) {
    verify_cert(secret, &["-verify_hostname", host]);
}

/// The Secret's tls.crt chains to its ca.crt, with openssl's `checks`.
fn verify_cert(secret: &Value, checks: &[&str]) {
    use base64::Engine;
    let dir = scratch_dir("helm-selfsigned");
    for key in ["ca.crt", "tls.crt"] {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(secret["data"][key].as_str().expect("PEM"))
            .expect("base64");
        std::fs::write(dir.join(key), pem).expect("write PEM");
    }
    succeed(
        Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(dir.join("ca.crt"))
            .args(checks)
            .arg(dir.join("tls.crt")),
    );
}

// ---------------------------------------------------------------------------------
// The real cluster.

#[test]
fn helm_installs_upgrades_and_uninstalls_in_a_real_cluster() {
    let mut c = Cluster::up_with(&[("DEPLOY_WITH", "helm")]);
    let releases = |c: &Cluster, ns: &str| -> Value {
        serde_json::from_slice(&output(c.helm().args(["list", "-n", ns, "-o", "json"])).stdout)
            .expect("helm list -o json")
    };
    for (r, ns) in [("gpu-exporter", EXPORTER_NS), ("gpu-metrics-adapter", NS)] {
        let listed = releases(&c, ns);
        let release = listed
            .as_array()
            .expect("releases")
            .iter()
            .find(|x| x["name"] == r)
            .unwrap_or_else(|| panic!("{r} not installed: {listed}"));
        assert_eq!(release["status"], "deployed", "{release}");
    }

    // What the kustomize path is checked for: the APIServices Available with the
    // certificate's CA, and the HPA active and scaling on what the adapter serves.
    apiservices_are_available(&c);
    let formula = |current, values: &[i64]| {
        hpa::pods_average_value(current, values, 0, crate::cluster::TARGET_MILLI)
    };
    let start = settle(&c, "resnet-inference", 70);
    let (_, up, _) = step(&c, "resnet-inference", 70, 100, formula);
    assert!(up > start, "scaled up: {start} → {up}");
    scaling_active(&c, "resnet-inference");

    // An upgrade that changes a value: KEDA takes over external metrics.
    let upgrade = |c: &Cluster, extra: &[&str]| {
        let mut cmd = c.helm();
        cmd.current_dir(workspace())
            .args([
                "upgrade",
                "gpu-metrics-adapter",
                ADAPTER,
                "-n",
                NS,
                "--reuse-values",
            ])
            .args([
                "--post-renderer",
                "cluster-plumbing",
                "--wait",
                "--timeout",
                "120s",
            ])
            .args(extra);
        output(&mut cmd)
    };
    let out = upgrade(&c, &["--set", "externalMetrics.enabled=false"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !c.run(&["get", "apiservice", "v1beta1.external.metrics.k8s.io"])
            .status
            .success(),
        "the upgrade removed the external metrics APIService"
    );
    c.wait(
        "custom metrics still Available",
        Duration::from_secs(60),
        || {
            let a = c.json(&["apiservice", "v1beta2.custom.metrics.k8s.io"]);
            a["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|x| x["type"] == "Available" && x["status"] == "True")
                .then_some(())
        },
    );
    // A second owner of external.metrics.k8s.io is refused, naming the owner and the
    // switch, before anything changes: KEDA's metrics server registered it meanwhile.
    let keda = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                 "groupPriorityMinimum": 100, "versionPriority": 100,
                 "service": {"name": "keda-metrics-apiserver", "namespace": "keda", "port": 443},
                 "insecureSkipTLSVerify": true}
    });
    let file = c.dir().join("keda-apiservice.json");
    std::fs::write(&file, keda.to_string()).expect("write");
    c.ok(&["apply", "-f", file.to_str().expect("path")]);
    let out = upgrade(&c, &["--set", "externalMetrics.enabled=true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "took KEDA's APIService over");
    assert!(
        err.contains("already served by keda/keda-metrics-apiserver")
            && err.contains("externalMetrics.enabled=false"),
        "{err}"
    );
    let api = c.json(&["apiservice", "v1beta1.external.metrics.k8s.io"]);
    assert_eq!(api["spec"]["service"]["namespace"], "keda", "{api}");
    // (Unavailable, it would hold namespace deletion up: gone before that part.)
    c.ok(&["delete", "apiservice", "v1beta1.external.metrics.k8s.io"]);
    // A wrong value is refused before anything changes.
    let out = upgrade(&c, &["--set", "replicas=-1"]);
    assert!(!out.status.success(), "replicas=-1 accepted");
    let history: Value = serde_json::from_slice(
        &output(
            c.helm()
                .args(["history", "gpu-metrics-adapter", "-n", NS, "-o", "json"]),
        )
        .stdout,
    )
    .expect("helm history");
    assert_eq!(history.as_array().map(Vec::len), Some(2), "{history}");
    assert_eq!(history[1]["status"], "deployed", "{history}");

    // Uninstall leaves nothing behind. First the harm an orphaned APIService does: with
    // the adapter gone, discovery of its groups fails, and the namespace controller
    // cannot delete any namespace anywhere in the cluster.
    let pid = std::fs::read_to_string(c.dir().join("pids/gpu-metrics-adapter")).expect("pid");
    Command::new("kill").arg(pid.trim()).status().expect("kill");
    c.wait(
        "the aggregator to see the adapter gone",
        Duration::from_secs(90),
        || {
            let a = c.json(&["apiservice", "v1beta2.custom.metrics.k8s.io"]);
            a["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|x| x["type"] == "Available" && x["status"] == "False")
                .then_some(())
        },
    );
    c.ok(&["create", "namespace", "victim"]);
    c.ok(&["delete", "namespace", "victim", "--wait=false"]);
    c.wait(
        "namespace deletion stuck on discovery",
        Duration::from_secs(90),
        || {
            let ns = c.json(&["namespace", "victim"]);
            ns["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|x| x["type"] == "NamespaceDeletionDiscoveryFailure" && x["status"] == "True")
                .then_some(())
        },
    );
    for (release, ns) in [("gpu-metrics-adapter", NS), ("gpu-exporter", EXPORTER_NS)] {
        let out = output(c.helm().args(["uninstall", release, "-n", ns, "--wait"]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    c.wait("the namespace deleted", Duration::from_secs(120), || {
        (!c.run(&["get", "namespace", "victim"]).status.success()).then_some(())
    });
    let out = c.run(&["api-resources"]);
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("metrics.k8s.io"),
        "kubectl api-resources after uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for api in APISERVICES {
        assert!(
            !c.run(&["get", "apiservice", api]).status.success(),
            "{api} left behind"
        );
    }
    let leftovers = c.ok(&[
        "get",
        "all,configmaps,secrets,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,networkpolicies,poddisruptionbudgets,resourcequotas",
        "-A",
        "-l",
        "app.kubernetes.io/part-of=gpu-exporter",
        "-o",
        "name",
    ]);
    assert_eq!(leftovers.trim(), "", "uninstall left these behind");
    let helm_owned = c.ok(&[
        "get",
        "rolebindings,clusterroles,clusterrolebindings",
        "-A",
        "-l",
        "app.kubernetes.io/managed-by=Helm",
        "-o",
        "name",
    ]);
    assert_eq!(helm_owned.trim(), "", "uninstall left these behind");
    c.down();
}
