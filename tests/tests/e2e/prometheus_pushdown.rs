//! The Prometheus source's queries (per-pod aggregation pushed into the engine) hold to
//! the direct source's derivation: on one set of dcgm-exporter series (whole GPUs,
//! shared GPUs with their unlabelled remainder, MIG instances, values that are negative
//! or NaN, a device without `FB_FREE`, series scraped with `honorLabels: false`, and
//! series that went stale), Prometheus 3's own engine (`promtool test rules`) must
//! answer every query with what `source::derive::pod_values` computes in Rust from the
//! fresh series, pod by pod.
//!
//! The same holds for `--prometheus-queries=recorded`: the adapter's printed recording
//! rules are loaded into the same engine, and each recorded series it then selects
//! must answer the same samples, under its recorded name.
//!
//! The adapter sends each query with `lookback_delta` = `--max-staleness`; `promtool`
//! evaluates with the engine's default lookback, 5 minutes, so the staleness here is
//! 5 minutes and the same queries see the same samples. That the parameter is sent is
//! `adapter_prometheus`'s to check.

use e2e_tests::promtool;
use gpu_metrics_adapter::fleet::GpuMetric;
use gpu_metrics_adapter::source::derive::{Series, pod_values};
use gpu_metrics_adapter::source::prometheus::pushdown::{
    Answer, Queries, queries, queries_for, recording_rules,
};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// One input series: its family, labels, and a sample each minute from 0 up to and
/// including `last_minute` (so its newest sample is that old at the evaluation time).
struct Input {
    family: &'static str,
    labels: Vec<(&'static str, String)>,
    value: f64,
    last_minute: u32,
}

/// Evaluation time, minutes; staleness 300 s, the lookback `promtool` evaluates with:
/// a series whose last sample is at minute 9 is fresh (60 s old), one ending at minute
/// 4 is stale (360 s).
const EVAL_MINUTE: u32 = 10;
const STALENESS: Duration = Duration::from_secs(300);

fn fleet() -> Vec<Input> {
    let mut out = Vec::new();
    let mut add = |family, labels: &[(&'static str, &str)], value, last_minute| {
        out.push(Input {
            family,
            labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            value,
            last_minute,
        })
    };
    // Pod ml/a holds two whole GPUs; one sample of GPU-1 is a minute older.
    for (uuid, util, power, used, free, last) in [
        ("GPU-0", 80.0, 300.0, 1024.0, 3072.0, 10),
        ("GPU-1", 61.5, 200.0, 2048.0, 2048.0, 9),
    ] {
        let l = [("UUID", uuid), ("namespace", "ml"), ("pod", "a")];
        add("DCGM_FI_DEV_GPU_UTIL", &l, util, last);
        add("DCGM_FI_DEV_POWER_USAGE", &l, power, 10);
        add("DCGM_FI_DEV_FB_USED", &l, used, 10);
        add("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", &l, 0.25, 10);
        add("DCGM_FI_DEV_FB_FREE", &[("UUID", uuid)], free, 10);
    }
    // GPU-2 shared by ml/b and ml/c, with the device's unlabelled remainder; power is
    // the device's only.
    let (b, c) = (
        [("UUID", "GPU-2"), ("namespace", "ml"), ("pod", "b")],
        [("UUID", "GPU-2"), ("namespace", "ml"), ("pod", "c")],
    );
    let rest = [("UUID", "GPU-2")];
    add("DCGM_FI_DEV_GPU_UTIL", &b, 30.0, 10);
    add("DCGM_FI_DEV_GPU_UTIL", &c, 12.0, 10);
    add("DCGM_FI_DEV_GPU_UTIL", &rest, 10.0, 10);
    add("DCGM_FI_DEV_FB_USED", &b, 500.0, 10);
    add("DCGM_FI_DEV_FB_USED", &c, 250.0, 10);
    add("DCGM_FI_DEV_FB_USED", &rest, 250.0, 10);
    add("DCGM_FI_DEV_FB_FREE", &rest, 1000.0, 10);
    add("DCGM_FI_DEV_POWER_USAGE", &rest, 250.0, 10);
    // MIG: ml/d on two instances of GPU-3 (graphics engine activity, no GPU_UTIL), and
    // a GR series on a whole GPU, which is not utilisation.
    for (gi, gr, used) in [("1", 0.42, 4096.0), ("2", 0.1, 1024.0)] {
        let l = [
            ("UUID", "GPU-3"),
            ("GPU_I_ID", gi),
            ("namespace", "ml"),
            ("pod", "d"),
        ];
        add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &l, gr, 10);
        add("DCGM_FI_DEV_FB_USED", &l, used, 10);
        add(
            "DCGM_FI_DEV_FB_FREE",
            &[("UUID", "GPU-3"), ("GPU_I_ID", gi)],
            8192.0 - used,
            10,
        );
    }
    let e = [("UUID", "GPU-4"), ("namespace", "ml"), ("pod", "e")];
    add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &e, 0.9, 10);
    add("DCGM_FI_DEV_GPU_UTIL", &e, 5.0, 10);
    // Garbage is skipped: a negative utilisation, a NaN power; a device without
    // FB_FREE has its FB_USED series as its capacity.
    let f = [("UUID", "GPU-5"), ("namespace", "ml"), ("pod", "f")];
    add("DCGM_FI_DEV_GPU_UTIL", &f, -5.0, 10);
    add("DCGM_FI_DEV_POWER_USAGE", &f, f64::NAN, 10);
    add("DCGM_FI_DEV_FB_USED", &f, 100.0, 10);
    // honorLabels: false: Prometheus's own pod/namespace name the exporter's pod.
    let g = [
        ("UUID", "GPU-6"),
        ("namespace", "gpu-monitoring"),
        ("pod", "gpu-exporter-x7k2p"),
        ("exported_namespace", "inference"),
        ("exported_pod", "g"),
    ];
    add("DCGM_FI_DEV_GPU_UTIL", &g, 44.0, 10);
    add("DCGM_FI_DEV_POWER_USAGE", &g, 410.0, 10);
    // Stale: ml/h's exporter stopped at minute 4; ml/a's utilisation series on a third
    // GPU too (its other series stay fresh).
    let h = [("UUID", "GPU-7"), ("namespace", "ml"), ("pod", "h")];
    add("DCGM_FI_DEV_GPU_UTIL", &h, 99.0, 4);
    let a_old = [("UUID", "GPU-8"), ("namespace", "ml"), ("pod", "a")];
    add("DCGM_FI_DEV_GPU_UTIL", &a_old, 1.0, 4);
    out
}

/// Within the lookback, which excludes its start: (eval - staleness, eval].
fn fresh(i: &Input) -> bool {
    i.last_minute * 60 + STALENESS.as_secs() as u32 > EVAL_MINUTE * 60
}

/// An input series in `promtool`'s notation: `name{k="v"}` and a sample a minute.
fn series_yaml(i: &Input) -> String {
    let labels: Vec<String> = i
        .labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{v}\""))
        .collect();
    let value = if i.value.is_nan() {
        "NaN".to_string()
    } else {
        i.value.to_string()
    };
    format!(
        "      - series: '{}{{{}}}'\n        values: '{}'\n",
        i.family,
        labels.join(", "),
        vec![value; i.last_minute as usize + 1].join(" ")
    )
}

/// The labels the queries group a pod's answer by.
const GROUP: [&str; 4] = ["namespace", "pod", "exported_namespace", "exported_pod"];

fn group_labels_named(k: &str) -> Option<&str> {
    GROUP.iter().copied().find(|g| *g == k)
}

type Labels = Vec<(&'static str, String)>;

/// The labels a pod's answer carries.
fn group_labels(i: &Input) -> Labels {
    i.labels
        .iter()
        .filter(|(k, _)| group_labels_named(k).is_some())
        .cloned()
        .collect()
}

/// A pod's key as the adapter serves it: the renamed labels win.
fn pod_of(labels: &[(&'static str, String)]) -> Option<(String, String)> {
    let get = |k: &str| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    Some((
        get("exported_namespace").or_else(|| get("namespace"))?,
        get("exported_pod").or_else(|| get("pod"))?,
    ))
}

#[test]
fn the_pushed_down_queries_answer_what_the_direct_source_derives() {
    let inputs = fleet();
    // The oracle: the direct source's derivation over the fresh series, with the
    // exporter's own pod labels.
    let series: Vec<Series> = inputs
        .iter()
        .filter(|i| fresh(i))
        .map(|i| {
            let mut labels: Vec<(String, String)> = i
                .labels
                .iter()
                .filter(|(k, _)| group_labels_named(k).is_none())
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            if let Some((ns, pod)) = pod_of(&i.labels) {
                labels.push(("namespace".into(), ns));
                labels.push(("pod".into(), pod));
            }
            Series {
                name: i.family.to_string(),
                labels,
                value: i.value,
            }
        })
        .collect();
    let derived = pod_values(&series);
    // Each pod's answer labels, and its oldest fresh sample time.
    let mut pods: BTreeMap<(String, String), (Labels, u32)> = BTreeMap::new();
    for i in inputs
        .iter()
        .filter(|i| fresh(i) && i.labels.iter().any(|(k, _)| *k == "pod"))
    {
        let key = pod_of(&i.labels).expect("pod");
        let entry = pods.entry(key).or_insert((group_labels(i), u32::MAX));
        entry.1 = entry.1.min(i.last_minute * 60);
    }
    assert!(
        !pods.contains_key(&("ml".to_string(), "h".to_string())),
        "the stale pod is the oracle's too"
    );
    assert!(derived.len() >= 6, "{derived:?}");

    let dir = std::env::temp_dir().join(format!("pushdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let rules = dir.join("recording-rules.yml");
    std::fs::write(&rules, recording_rules()).expect("write rules");
    let mut yaml = format!(
        "rule_files: ['{}']\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
        rules.display()
    );
    for i in &inputs {
        yaml.push_str(&series_yaml(i));
    }
    yaml.push_str("    promql_expr_test:\n");
    let mut checked = 0;
    // The recorded series carry the rule's name beside the pod's labels.
    let recorded = queries_for(Queries::Recorded)
        .into_iter()
        .map(|q| (q.clone(), Some(q.promql)));
    for (q, name) in queries().into_iter().map(|q| (q, None)).chain(recorded) {
        writeln!(
            yaml,
            "      - expr: '{}'\n        eval_time: {EVAL_MINUTE}m\n        exp_samples:",
            q.promql.replace('\'', "''")
        )
        .expect("write");
        for (pod, (labels, oldest)) in &pods {
            let value = match q.answers {
                Answer::Value(metric) => match derived.get(pod).and_then(|v| v.values.get(&metric))
                {
                    Some(v) => *v,
                    None => continue,
                },
                Answer::Oldest => f64::from(*oldest),
            };
            let labels: Vec<String> = name
                .iter()
                .map(|n| format!("__name__=\"{n}\""))
                .chain(labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")))
                .collect();
            writeln!(
                yaml,
                "          - labels: '{{{}}}'\n            value: {value:?}",
                labels.join(", ")
            )
            .expect("write");
            checked += 1;
        }
    }
    // Every metric has at least one pod to hold it to.
    for m in &GpuMetric::ALL {
        assert!(
            derived.values().any(|v| v.values.contains_key(m)),
            "no pod has {m:?}: the fleet does not test it"
        );
    }
    assert!(checked > 40, "{checked} samples checked");
    let file = dir.join("pushdown.yml");
    std::fs::write(&file, &yaml).expect("write");
    let out = promtool()
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "Prometheus' engine disagrees with the derivation:\n{}\n{}\n--- test file:\n{yaml}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The queries the docs show an operator are the ones the adapter sends.
#[test]
fn the_docs_show_the_queries_as_sent() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/adapter/prometheus-source.md"),
    )
    .expect("docs/adapter/prometheus-source.md");
    for q in queries() {
        if !page.contains(&q.promql) {
            panic!(
                "docs/adapter/prometheus-source.md lacks the query for {:?}:\n{}",
                q.answers, q.promql
            );
        }
    }
}
