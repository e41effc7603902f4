//! The Grafana dashboards (`dashboards/grafana`) and the PrometheusRule
//! (`dashboards/alerts`): the real promtool checks and unit-tests the rules, a linter
//! checks every dashboard, kubectl kustomize builds both, and a real Prometheus scraping
//! the simulated exporter (pods holding GPUs whole, through MIG and shared, plus XIDs,
//! ECC, remap failures, slowdowns and a lost GPU) answers every panel query of every
//! dashboard, every template variable and every recording rule with data.

use e2e_tests::fake_engine::FakeEngines;
use e2e_tests::{Exporter, Prometheus, promtool, scratch_dir, try_get, try_wait_for, urlencode};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const RULES: &str = "dashboards/alerts/prometheusrule.yaml";
const RULE_TESTS: &str = "dashboards/alerts/tests";
const GRAFANA: &str = "dashboards/grafana";
/// The rule file the promtool unit tests name in `rule_files:`.
const RULES_FILE_NAME: &str = "gpu-exporter-rules.yaml";
const SCENARIO: &str = "tests/fixtures/dashboards-node.toml";
/// The simulated node's name (NODE_NAME, the `Hostname` label).
const NODE: &str = "gpu-node-1";
/// Target labels of the test's scrape job: a cluster label, and the exporter pod's own
/// `namespace`/`pod`/`container` as the Prometheus Operator attaches them. With
/// `honor_labels` they land only on series the exporter did not label itself
/// (unallocated GPUs, device-wide series of shared GPUs, self-metrics), which the
/// dashboards must not mistake for workloads.
const CLUSTER: &str = "test-cluster";
const TARGET_LABELS: [(&str, &str); 4] = [
    ("cluster", CLUSTER),
    ("namespace", "gpu-monitoring"),
    ("pod", "gpu-exporter-x7k2p"),
    ("container", "gpu-exporter"),
];

/// Panels allowed to return no data on the test node, with the reason. Kept empty: the
/// scenario makes every panel's series exist (errors, a lost GPU, an idle allocation…)
/// instead of exempting it. Entries are (dashboard uid, panel title).
const NO_DATA_EXEMPT: &[(&str, &str)] = &[];

/// Grafana's built-in variables, replaced as Grafana would for a 10 minute range at a
/// 1 s interval against a 1 s scrape interval.
const BUILTINS: [(&str, &str); 6] = [
    ("__rate_interval", "15s"),
    ("__interval", "1s"),
    ("__interval_ms", "1000"),
    ("__range", "10m"),
    ("__range_s", "600"),
    ("__range_ms", "600000"),
];

fn root() -> PathBuf {
    e2e_tests::workspace()
}

// ---------------------------------------------------------------- loading

/// Every dashboard: (file name, parsed JSON).
fn dashboards() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(GRAFANA))
        .expect("dashboards/grafana")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no dashboards in {GRAFANA}");
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read dashboard");
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), json)
        })
        .collect()
}

/// Every panel of a dashboard, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

fn variables(dashboard: &Value) -> Vec<&Value> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .collect()
}

/// The query of a `query` variable (either form Grafana stores).
fn variable_query(v: &Value) -> Option<&str> {
    v["query"]["query"].as_str().or(v["query"].as_str())
}

fn uid(d: &Value) -> &str {
    d["uid"].as_str().unwrap_or("<no uid>")
}

fn title(v: &Value) -> &str {
    v["title"].as_str().unwrap_or("<untitled>")
}

/// The PrometheusRule, and its `spec`: a plain rule file.
fn prometheus_rule() -> Value {
    let text = std::fs::read_to_string(root().join(RULES)).expect("read the PrometheusRule");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{RULES}: {e}"))
}

fn rules() -> Vec<Value> {
    let spec = prometheus_rule()["spec"].clone();
    spec["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .collect()
}

/// Write the PrometheusRule's spec as a rule file (JSON is YAML) into `dir`.
pub(super) fn write_rule_file(dir: &Path) -> PathBuf {
    let path = dir.join(RULES_FILE_NAME);
    let spec = &prometheus_rule()["spec"];
    std::fs::write(&path, serde_json::to_string_pretty(spec).unwrap()).expect("write rules");
    path
}

fn run(cmd: &mut Command) -> (i32, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e} (tests/setup.sh installs it)"));
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

// ---------------------------------------------------------------- rules

#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    let dir = scratch_dir("rules");
    let rules_file = write_rule_file(&dir);
    let (code, out) = run(promtool().arg("check").arg("rules").arg(&rules_file));
    assert_eq!(code, 0, "promtool check rules:\n{out}");

    let mut test_files = Vec::new();
    for entry in std::fs::read_dir(root().join(RULE_TESTS)).expect(RULE_TESTS) {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let copy = dir.join(path.file_name().unwrap());
            std::fs::copy(&path, &copy).expect("copy rule test");
            test_files.push(copy);
        }
    }
    test_files.sort();
    assert!(!test_files.is_empty(), "no promtool tests in {RULE_TESTS}");
    let (code, out) = run(promtool()
        .current_dir(&dir)
        .args(["test", "rules"])
        .args(&test_files));
    assert_eq!(code, 0, "promtool test rules:\n{out}");

    // Every alert has a case where it fires and one where it must stay quiet.
    let mut cases: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for f in &test_files {
        let text = std::fs::read_to_string(f).unwrap();
        let t: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{f:?}: {e}"));
        for test in t["tests"].as_array().into_iter().flatten() {
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = case["alertname"].as_str().expect("alertname").to_string();
                let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
                let entry = cases.entry(name).or_default();
                entry.0 |= fires;
                entry.1 |= !fires;
            }
        }
    }
    let mut missing = Vec::new();
    for r in rules() {
        if let Some(alert) = r["alert"].as_str() {
            match cases.get(alert) {
                Some((true, true)) => {}
                Some((fires, quiet)) => {
                    missing.push(format!("{alert}: firing case {fires}, quiet case {quiet}"))
                }
                None => missing.push(format!("{alert}: no promtool test")),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "alerts without both cases:\n{}",
        missing.join("\n")
    );
}

#[test]
fn rules_are_labelled_and_annotated() {
    let mut problems = Vec::new();
    let spec = prometheus_rule()["spec"].clone();
    for g in spec["groups"].as_array().expect("groups") {
        let group = g["name"].as_str().unwrap_or_default();
        for r in g["rules"].as_array().expect("rules") {
            if let Some(record) = r["record"].as_str() {
                if record.matches(':').count() != 2 {
                    problems.push(format!("{record}: not level:metric:operations"));
                }
                continue;
            }
            let alert = r["alert"].as_str().expect("alert or record");
            let severity = r["labels"]["severity"].as_str().unwrap_or_default();
            if !["critical", "warning", "info"].contains(&severity) {
                problems.push(format!("{alert}: severity {severity:?}"));
            }
            if r["for"].as_str().is_none() {
                problems.push(format!("{alert}: no explicit for:"));
            }
            for key in ["summary", "description"] {
                let text = r["annotations"][key].as_str().unwrap_or_default();
                // GPU alerts name the node and the GPU; exporter and adapter alerts the
                // target (and its node when known) or the APIService.
                let names = if group.starts_with("gpu-exporter.hardware")
                    || group.starts_with("gpu-exporter.health")
                    || group.starts_with("gpu-exporter.waste")
                {
                    text.contains("$labels.Hostname") && text.contains("$labels.gpu")
                } else {
                    text.contains("$labels.instance") || text.contains("$labels.name")
                };
                if !names {
                    problems.push(format!("{alert}: {key} names no node/GPU/target: {text:?}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------- dashboard lint

/// Collect the path and value of every `datasource` field under `v`.
fn datasources<'a>(v: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{path}.{k}");
                if k == "datasource" {
                    out.push((p.clone(), x));
                }
                datasources(x, &p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                datasources(x, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Names of the `$var` / `${var}` references in `text`.
fn references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        let after = &rest[i + 1..];
        let name = match after.strip_prefix('{') {
            Some(inner) => inner.split('}').next().unwrap_or_default(),
            None => after
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default(),
        };
        if !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) {
            out.push(name.to_string());
        }
        rest = after;
    }
    out
}

/// The enabled fields of the exporter's default counters CSV (dcgm-exporter's list).
fn default_fields() -> BTreeSet<String> {
    let csv =
        std::fs::read_to_string(root().join("exporter/src/plan/catalog/default-counters.csv"))
            .expect("default counters");
    csv.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(',').next())
        .map(|f| f.trim().to_string())
        .collect()
}

fn dcgm_fields(expr: &str) -> Vec<&str> {
    expr.match_indices("DCGM_")
        .map(|(i, _)| {
            let tail = &expr[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            &tail[..end]
        })
        // `DCGM_FR_*` are health error codes (label values), not fields.
        .filter(|f| !f.starts_with("DCGM_FR_"))
        .collect()
}

/// Dashboards that may use fields outside dcgm-exporter's default counters, and why.
const EXTENDED_FIELDS: &[(&str, &str)] = &[(
    "gpu-health",
    "ECC, retired pages, clock-event reasons, violations, NVLink errors and per-link state, thermal limits, fans and fabric are off in the default CSV",
)];

#[test]
fn dashboards_pass_the_lint() {
    let all = dashboards();
    let defaults = default_fields();
    let builtins: BTreeSet<&str> = BUILTINS.iter().map(|(k, _)| *k).collect();
    let mut problems = Vec::new();
    let mut uids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for (file, d) in &all {
        let uid = uid(d).to_string();
        let mut fail = |what: String| problems.push(format!("{file}: {what}"));
        if uid.is_empty() || uid.len() > 40 {
            fail(format!("uid {uid:?} must be 1-40 characters"));
        }
        if *file != format!("{uid}.json") {
            fail(format!("file should be named {uid}.json"));
        }
        if !uids.insert(uid.clone()) {
            fail(format!("duplicate uid {uid}"));
        }
        if !titles.insert(title(d).to_string()) {
            fail(format!("duplicate title {}", title(d)));
        }
        if d["schemaVersion"].as_u64().unwrap_or(0) < 36 {
            fail(format!("schemaVersion {} (want 36+)", d["schemaVersion"]));
        }
        if d.get("__inputs").is_some() {
            fail("has __inputs: export it without 'share externally'".into());
        }

        // Data source: a template variable, never a hard-coded UID.
        let vars = variables(d);
        let names: BTreeSet<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
        if !vars.iter().any(|v| {
            v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"
        }) {
            fail("no `datasource` variable of type datasource (query prometheus)".into());
        }
        let mut ds = Vec::new();
        datasources(d, "", &mut ds);
        for (path, v) in ds {
            let ok =
                v == "${datasource}" || (v["type"] == "prometheus" && v["uid"] == "${datasource}");
            if !ok {
                fail(format!("{path} is {v}, not the ${{datasource}} variable"));
            }
        }

        // Variables: cluster and node filters are regex matchers with an All of `.*`
        // (single-cluster setups have no cluster label at all).
        if uid != "dcgm-exporter-compatible" && !names.contains("cluster") {
            fail("no cluster variable".into());
        }
        for v in &vars {
            let name = v["name"].as_str().unwrap_or_default();
            if v["type"] == "query" {
                let q = variable_query(v).unwrap_or_default();
                if !q.starts_with("label_values(") {
                    fail(format!(
                        "variable {name}: query {q:?} is not label_values(...)"
                    ));
                }
                for r in references(q) {
                    if !names.contains(r.as_str()) {
                        fail(format!("variable {name} refers to undefined ${r}"));
                    }
                }
            }
            if ["cluster", "node", "namespace", "workload", "pod"].contains(&name)
                && (v["includeAll"] != true || v["allValue"] != ".*")
            {
                fail(format!("variable {name} needs includeAll with allValue .*"));
            }
        }

        // Panels.
        let mut ids = BTreeSet::new();
        for p in panels(d) {
            let t = title(p);
            if !ids.insert(p["id"].as_u64().unwrap_or(u64::MAX)) {
                fail(format!("panel {t:?}: duplicate or missing id {}", p["id"]));
            }
            if p["type"] == "row" || p["type"] == "text" {
                continue;
            }
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            if targets.is_empty() {
                fail(format!("panel {t:?} has no query"));
            }
            if p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .is_none_or(str::is_empty)
            {
                fail(format!("panel {t:?} has no unit"));
            }
            for tg in &targets {
                let expr = tg["expr"].as_str().unwrap_or_default();
                if expr.trim().is_empty() {
                    fail(format!("panel {t:?} {} has an empty query", tg["refId"]));
                }
                for r in references(expr) {
                    if !names.contains(r.as_str()) && !builtins.contains(r.as_str()) {
                        fail(format!("panel {t:?} refers to undefined ${r}"));
                    }
                }
                let legend = tg["legendFormat"].as_str().unwrap_or_default();
                if legend.contains("{{gpu}}")
                    && !legend.contains("{{Hostname}}")
                    && !legend.contains("{{UUID}}")
                {
                    fail(format!(
                        "panel {t:?}: legend {legend:?} names the GPU index without its node"
                    ));
                }
                if !EXTENDED_FIELDS.iter().any(|(u, _)| *u == uid) {
                    for f in dcgm_fields(expr) {
                        if !defaults.contains(f) {
                            fail(format!(
                                "panel {t:?} uses {f}, not in the default counters CSV"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------- kustomize

fn kustomize(dir: &str) -> Vec<Value> {
    let (code, out) = run(Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join(dir)));
    assert_eq!(code, 0, "kubectl kustomize {dir}:\n{out}");
    serde_saphyr::from_str_multiple(&out).unwrap_or_else(|e| panic!("{dir} output: {e}\n{out}"))
}

/// The deployed exporter must export every DCGM field a dashboard or alert reads: the
/// DaemonSet passes `--collectors` pointing at the mounted counters CSV of the
/// `gpu-exporter-counters` ConfigMap, and that CSV enables each field.
#[test]
fn the_deployed_counters_enable_every_field_the_dashboards_and_alerts_read() {
    let objects = kustomize("deploy/overlays/default");
    let daemonset = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "gpu-exporter")
        .expect("the exporter DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("exporter args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let csv_path = args
        .iter()
        .find_map(|a| a.strip_prefix("--collectors="))
        .expect("--collectors=PATH in the exporter args");
    let (dir, file) = csv_path.rsplit_once('/').expect("an absolute path");
    let mount = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let config_map_name = volume["configMap"]["name"]
        .as_str()
        .expect("a ConfigMap volume");
    let config_map = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == config_map_name)
        .unwrap_or_else(|| panic!("ConfigMap {config_map_name} is not in the build"));
    let csv = config_map["data"][file]
        .as_str()
        .unwrap_or_else(|| panic!("{config_map_name} has no key {file}"));
    let enabled: BTreeSet<&str> = csv
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(',').next())
        .map(str::trim)
        .collect();

    let mut used: BTreeMap<String, String> = BTreeMap::new();
    for (name, dashboard) in dashboards() {
        let text = dashboard.to_string();
        for field in dcgm_fields(&text) {
            used.entry(field.to_string())
                .or_insert_with(|| format!("dashboard {name}"));
        }
    }
    let rules = std::fs::read_to_string(root().join("dashboards/alerts/prometheusrule.yaml"))
        .expect("rules");
    for field in dcgm_fields(&rules) {
        used.entry(field.to_string())
            .or_insert_with(|| "the alert rules".into());
    }
    assert!(used.len() > 10, "the field scan found too little: {used:?}");
    let missing: Vec<String> = used
        .iter()
        .filter(|(field, _)| !enabled.contains(field.as_str()))
        .map(|(field, by)| format!("{field} (used by {by})"))
        .collect();
    assert!(
        missing.is_empty(),
        "fields the dashboards or alerts read but the deployed counters CSV does not enable:\n{}",
        missing.join("\n")
    );
}

#[test]
fn kustomize_builds_the_dashboard_configmaps_and_the_rule() {
    let built = kustomize(GRAFANA);
    let mut packed = BTreeMap::new();
    for cm in &built {
        assert_eq!(cm["kind"], "ConfigMap", "{cm}");
        let name = cm["metadata"]["name"].as_str().expect("name");
        assert_eq!(
            cm["metadata"]["labels"]["grafana_dashboard"], "1",
            "{name} needs the sidecar label"
        );
        assert!(name.starts_with("gpu-dashboard-"), "{name}: no name hash");
        for (key, text) in cm["data"].as_object().expect("data") {
            let json: Value = serde_json::from_str(text.as_str().expect("string"))
                .unwrap_or_else(|e| panic!("{name}/{key}: {e}"));
            assert!(
                packed.insert(key.clone(), json).is_none(),
                "{key} packed twice"
            );
        }
    }
    let files: BTreeMap<String, Value> = dashboards().into_iter().collect();
    assert_eq!(
        packed.keys().collect::<Vec<_>>(),
        files.keys().collect::<Vec<_>>(),
        "every dashboard file is packed exactly once"
    );
    assert_eq!(packed, files, "ConfigMaps carry the files unchanged");

    let built = kustomize("dashboards/alerts");
    assert_eq!(built.len(), 1, "one resource: {built:?}");
    assert_eq!(built[0]["kind"], "PrometheusRule");
    assert_eq!(built[0]["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(built[0]["spec"], prometheus_rule()["spec"]);
}

// ---------------------------------------------------------------- full stack

/// A Prometheus API call: the `data` field, or the error.
fn api(prom: &Prometheus, path: &str) -> Result<Value, String> {
    let (status, body) = try_get(&format!("{}{path}", prom.base), &[])?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if status != 200 || v["status"] != "success" {
        return Err(format!("{status} {}", v["error"].as_str().unwrap_or(&body)));
    }
    Ok(v["data"].clone())
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Run `expr` as Grafana would (instant, or a range over the last 30 s): the series.
fn query(prom: &Prometheus, expr: &str, instant: bool) -> Result<Vec<Value>, String> {
    let path = if instant {
        format!("/api/v1/query?query={}", urlencode(expr))
    } else {
        let now = now_s();
        format!(
            "/api/v1/query_range?query={}&start={:.3}&end={now:.3}&step=1",
            urlencode(expr),
            now - 30.0
        )
    };
    Ok(api(prom, &path)?["result"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Replace `$var`, `${var}` and Grafana's built-ins; an unknown variable is an error.
fn substitute(text: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(inner) => {
                let end = inner
                    .find('}')
                    .ok_or_else(|| format!("unclosed ${{ in {text}"))?;
                (&inner[..end], end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            out.push('$');
            rest = after;
            continue;
        }
        let value = BUILTINS
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
            .or_else(|| vars.get(name).cloned())
            .ok_or_else(|| format!("unknown variable ${name}"))?;
        out.push_str(&value);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The values of a `label_values(selector, label)` variable query.
fn label_values(prom: &Prometheus, q: &str) -> Result<Vec<String>, String> {
    let inner = q
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("not label_values(...): {q}"))?;
    let (selector, label) = match inner.rsplit_once(',') {
        Some((s, l)) => (Some(s.trim()), l.trim()),
        None => (None, inner.trim()),
    };
    let mut path = format!("/api/v1/label/{label}/values");
    if let Some(s) = selector {
        path.push_str(&format!("?match[]={}", urlencode(s)));
    }
    let data = api(prom, &path)?;
    Ok(data
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect())
}

/// A multi-value selection as Grafana writes it into a Prometheus regex matcher.
fn regex_of(values: &[String]) -> String {
    let escaped: Vec<String> = values
        .iter()
        .map(|v| {
            v.chars()
                .flat_map(|c| {
                    let special = "\\^$.|?*+()[]{}".contains(c);
                    special.then_some('\\').into_iter().chain([c])
                })
                .collect()
        })
        .collect();
    match escaped.as_slice() {
        [one] => one.replace('\\', "\\\\"),
        many => format!("({})", many.join("|")).replace('\\', "\\\\"),
    }
}

/// How the template variables are set for one pass over the dashboards.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Selection {
    /// Every variable at All (`.*`, or every value where the variable has no allValue).
    All,
    /// Every value the variable's own query offers, picked explicitly: a multi-value
    /// selection, which Grafana writes as `(a|b|…)`. Proves each variable query and the
    /// label it reads exist.
    EveryValue,
}

/// The variable values of `d` for a pass; variable queries that return nothing are
/// failures.
fn resolve_variables(
    prom: &Prometheus,
    d: &Value,
    selection: Selection,
    failures: &mut Vec<String>,
    seen: &mut BTreeMap<(String, String), Vec<String>>,
) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for v in variables(d) {
        let name = v["name"].as_str().unwrap_or_default().to_string();
        if v["type"] == "datasource" {
            continue;
        }
        let q = variable_query(v).unwrap_or_default();
        let values = substitute(q, &vars).and_then(|q| label_values(prom, &q));
        let values = match values {
            Ok(vals) if !vals.is_empty() => vals,
            Ok(_) => {
                failures.push(format!("{}: variable {name}: {q} has no values", uid(d)));
                vec![]
            }
            Err(e) => {
                failures.push(format!("{}: variable {name}: {q}: {e}", uid(d)));
                vec![]
            }
        };
        seen.insert((uid(d).to_string(), name.clone()), values.clone());
        let all = v["allValue"].as_str().map(str::to_string);
        let value = match (selection, all) {
            (Selection::All, Some(all)) => all,
            _ if values.is_empty() => "__no_value__".into(),
            _ => regex_of(&values),
        };
        vars.insert(name, value);
    }
    vars
}

/// Every panel query, variable query and recording rule that returns no data or fails.
fn failing_queries(
    prom: &Prometheus,
    seen: &mut BTreeMap<(String, String), Vec<String>>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for selection in [Selection::All, Selection::EveryValue] {
        for (_, d) in dashboards() {
            let vars = resolve_variables(prom, &d, selection, &mut failures, seen);
            for p in panels(&d) {
                let exempt = NO_DATA_EXEMPT
                    .iter()
                    .any(|(u, t)| *u == uid(&d) && *t == title(p));
                for tg in p["targets"].as_array().into_iter().flatten() {
                    let expr = tg["expr"].as_str().unwrap_or_default();
                    let instant = tg["instant"] == true;
                    let at = format!(
                        "{} / {:?} / {} ({selection:?})",
                        uid(&d),
                        title(p),
                        tg["refId"].as_str().unwrap_or("?")
                    );
                    match substitute(expr, &vars).and_then(|e| query(prom, &e, instant)) {
                        Err(e) => failures.push(format!("{at}: {e}")),
                        Ok(r) if r.is_empty() && !exempt => {
                            failures.push(format!("{at}: no data"));
                        }
                        Ok(_) => {}
                    }
                }
            }
        }
    }
    for r in rules() {
        let expr = r["expr"].as_str().expect("expr");
        match (r["record"].as_str(), query(prom, expr, true)) {
            (_, Err(e)) => failures.push(format!(
                "rule {}: {e}",
                r["record"].as_str().or(r["alert"].as_str()).unwrap_or("?")
            )),
            (Some(record), Ok(res)) if res.is_empty() => {
                failures.push(format!("recording rule {record}: no data"));
            }
            _ => {}
        }
    }
    failures
}

/// Prometheus scraping `exporter` and the serving `engines` every second, with the
/// PrometheusRule's rules.
fn prometheus_with_rules(exporter: &Exporter, engines: &FakeEngines) -> Prometheus {
    let dir = scratch_dir("prometheus-dashboards");
    let rules = write_rule_file(&dir);
    let target = exporter.base.trim_start_matches("http://");
    let labels: String = TARGET_LABELS
        .iter()
        .map(|(k, v)| format!("          {k}: {v}\n"))
        .collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {}\n\
         scrape_configs:\n  - job_name: gpu-exporter\n    honor_labels: true\n    \
         static_configs:\n      - targets: ['{target}']\n        labels:\n{labels}\
         \x20 - job_name: serving-engines\n    honor_labels: true\n    \
         static_configs:\n      - targets: ['127.0.0.1:{}']\n        labels:\n          cluster: {CLUSTER}\n",
        rules.display(),
        engines.port
    );
    Prometheus::start_with_config(&config, &[])
}

/// (alertname, gpu, xid, NVLink, reason or pod) of every pending or firing alert.
fn active_alerts(prom: &Prometheus) -> BTreeSet<(String, String, String)> {
    let data = api(prom, "/api/v1/alerts").unwrap_or_default();
    data["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let l = &a["labels"];
            let s = |k: &str| l[k].as_str().unwrap_or_default().to_string();
            let detail = if l["xid"].is_string() {
                s("xid")
            } else if l["nvlink"].is_string() {
                s("nvlink")
            } else if l["reason"].is_string() {
                s("reason")
            } else {
                s("pod")
            };
            (s("alertname"), s("gpu"), detail)
        })
        .collect()
}

/// `tests/fixtures/all-fields.csv` plus the health-signal rows of
/// `tests/fixtures/health-signals.csv` it lacks, in a scratch file.
fn all_fields_and_health_signals() -> PathBuf {
    let all = std::fs::read_to_string(root().join("tests/fixtures/all-fields.csv")).unwrap();
    let health = std::fs::read_to_string(root().join("tests/fixtures/health-signals.csv")).unwrap();
    let field = |l: &str| l.split(',').next().unwrap_or("").trim().to_string();
    let have: BTreeSet<String> = all
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(field)
        .collect();
    let mut csv = all.clone();
    for l in health.lines() {
        if !l.trim_start().starts_with('#') && !l.trim().is_empty() && !have.contains(&field(l)) {
            csv.push_str(l);
            csv.push('\n');
        }
    }
    let path = scratch_dir("dashboards-csv").join("counters.csv");
    std::fs::write(&path, csv).unwrap();
    path
}

#[test]
fn every_panel_query_returns_data_on_a_simulated_node() {
    let csv = all_fields_and_health_signals();
    let exporter = Exporter::start(
        &[
            &format!("--simulate={SCENARIO}"),
            "-f",
            csv.to_str().expect("utf-8"),
            "--kubernetes-pod-labels",
            "app",
            "-c",
            "250",
        ],
        &[("NODE_NAME", NODE)],
    );
    // The serving dashboard's engines: vLLM on the scenario's llm pods.
    let engines = FakeEngines::start(&[("serve", "llm-0"), ("serve", "llm-1")]);
    let prom = prometheus_with_rules(&exporter, &engines);

    // Every query answers with data once the scenario's events have happened and
    // Prometheus holds enough samples for rate() and the rules have run.
    let mut last = Vec::new();
    let mut seen = BTreeMap::new();
    let done = try_wait_for(Duration::from_secs(90), || {
        seen.clear();
        last = failing_queries(&prom, &mut seen);
        last.is_empty().then_some(())
    });
    assert!(
        done.is_some(),
        "{} queries fail or return no data:\n{}",
        last.len(),
        last.join("\n")
    );

    // The variables offer exactly the scenario's values: the exporter pod's own target
    // labels (namespace gpu-monitoring, pod gpu-exporter-…) are no workload.
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let values = |d: &str, v: &str| {
        seen.get(&(d.to_string(), v.to_string()))
            .unwrap_or_else(|| panic!("variable {v} of {d} not resolved"))
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(values("gpu-workloads", "cluster"), set(&[CLUSTER]));
    assert_eq!(values("gpu-workloads", "node"), set(&[NODE]));
    assert_eq!(
        values("gpu-workloads", "namespace"),
        set(&["inference", "ml", "research", "serve"])
    );
    assert_eq!(
        values("gpu-workloads", "workload"),
        set(&["llm", "notebook", "resnet-inference", "trainer"])
    );
    assert_eq!(
        values("gpu-workloads", "pod"),
        set(&[
            "llm-0",
            "llm-1",
            "notebook-0",
            "resnet-a",
            "resnet-b",
            "train-0"
        ])
    );
    assert_eq!(values("gpu-mig", "profile"), set(&["1g.10gb", "3g.40gb"]));
    assert_eq!(
        values("gpu-waste", "namespace"),
        set(&["inference", "ml", "research", "serve"])
    );

    // Every rule evaluates without error on real series (no many-to-many matches…).
    let rules = try_wait_for(Duration::from_secs(30), || {
        let data = api(&prom, "/api/v1/rules").ok()?;
        let rules: Vec<Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        rules
            .iter()
            .all(|r| r["health"] != "unknown")
            .then_some(rules)
    })
    .expect("every rule evaluated");
    assert_eq!(rules.len(), self::rules().len());
    for r in &rules {
        assert_eq!(
            r["health"], "ok",
            "rule {} failed: {}",
            r["name"], r["lastError"]
        );
    }

    // The alerts that the scenario's faults call for, on the GPUs they hit, and no
    // other: healthy GPUs and the healthy exporter raise nothing.
    let want: BTreeSet<(String, String, String)> = [
        ("GPUCriticalXid", "4", "48"),
        ("GPUCriticalXid", "2", "94"),
        ("GPUCriticalXid", "5", "79"),
        ("GPUXidError", "0", "13"),
        ("GPULost", "5", ""),
        ("GPUUncorrectableECCErrors", "4", ""),
        ("GPURowRemapFailure", "4", ""),
        ("GPUClocksSlowedDown", "4", ""),
        ("GPUNVLinkDown", "4", "7"),
        ("GPUFabricUnhealthy", "4", "registration failed"),
        ("GPUAllocatedButIdle", "1", "notebook-0"),
        // GPU 4's recovery action (and its XID 154), pending row remap, failing MEM
        // watch (DBE), and the thermal and power-brake warnings of its clock events
        // (pending: 15 minutes).
        ("GPURecoveryActionRequired", "4", ""),
        ("GPUXidError", "4", "154"),
        ("GPURowRemapPending", "4", ""),
        ("GPUUnhealthy", "4", ""),
        ("GPUHealthWarning", "4", ""),
    ]
    .into_iter()
    .map(|(a, g, d)| (a.to_string(), g.to_string(), d.to_string()))
    .collect();
    let mut got = BTreeSet::new();
    let matched = try_wait_for(Duration::from_secs(30), || {
        got = active_alerts(&prom);
        (got == want).then_some(())
    });
    assert!(matched.is_some(), "active alerts {got:?}, want {want:?}");

    // The exporter goes away: GPUExporterDown goes pending, naming the node.
    let instance = exporter.base.trim_start_matches("http://").to_string();
    drop(exporter);
    let down = try_wait_for(Duration::from_secs(30), || {
        let data = api(&prom, "/api/v1/alerts").ok()?;
        data["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == "GPUExporterDown")
            .cloned()
    });
    let down = down.expect("GPUExporterDown once the exporter is gone");
    assert_eq!(down["labels"]["instance"], instance.as_str(), "{down}");
    assert_eq!(down["labels"]["Hostname"], NODE, "{down}");
    assert_eq!(
        down["annotations"]["summary"],
        format!("gpu-exporter on {NODE} is down"),
        "{down}"
    );
}
