//! The README's first command: `gpu-exporter --simulate` with no value serves the demo
//! node (`builtin:demo`) with its pods. Checked against the scenario itself, read
//! through gpu-sim: which GPU each pod holds, and the notebooks' processes.

use e2e_tests::{Exporter, Prometheus, line_value, sample_value, samples, wait_for};
use gpu_sim::{Scenario, SimNode};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A sample line's labels, escapes undone.
fn labels(line: &str) -> BTreeMap<String, String> {
    let set = line
        .split_once('{')
        .and_then(|(_, rest)| rest.rsplit_once('}'))
        .map(|(set, _)| set)
        .unwrap_or("");
    let mut out = BTreeMap::new();
    let mut chars = set.chars().peekable();
    while chars.peek().is_some() {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "label {name} in {line}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => panic!("dangling escape in {line}"),
                },
                c => value.push(c),
            }
        }
        out.insert(name, value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    out
}

/// (pod, namespace, gpu index, MIG slot) for every device of the demo's pods labelled
/// `app=<app>`, from the scenario.
fn held_by(scenario: &Scenario, app: &str) -> BTreeSet<(String, String, u32, Option<usize>)> {
    scenario
        .pods
        .iter()
        .filter(|p| p.labels.get("app").map(String::as_str) == Some(app))
        .flat_map(|p| {
            p.containers.iter().flat_map(|c| &c.devices).map(|d| {
                (
                    p.name.clone(),
                    p.namespace.clone(),
                    d.gpu.expect("demo devices name their GPU"),
                    d.mig,
                )
            })
        })
        .collect()
}

/// The sample lines of `name` whose `app` label is `app`, as label maps.
fn series_of_app(body: &str, name: &str, app: &str) -> Vec<BTreeMap<String, String>> {
    samples(body, name)
        .into_iter()
        .map(labels)
        .filter(|l| l.get("app").map(String::as_str) == Some(app))
        .collect()
}

#[test]
fn simulate_without_a_value_serves_the_demo_pods() {
    let scenario = Scenario::load(Path::new("builtin:demo")).expect("builtin:demo");
    // UUIDs and processes as the exporter's own model of the scenario has them.
    let node = SimNode::new(&scenario, SystemTime::now());
    let exporter = Exporter::start(&["--simulate"], &[]);
    let body = wait_for(
        "pod labels on the demo's GPUs",
        Duration::from_secs(30),
        || {
            let body = exporter.metrics();
            (sample_value(&body, "gpu_exporter_kubelet_up") == Some(1.0)
                && sample_value(&body, "gpu_exporter_pod_watch_up") == Some(1.0)
                && samples(&body, "DCGM_FI_DEV_GPU_UTIL")
                    .iter()
                    .any(|l| l.contains("app=")))
            .then_some(body)
        },
    );

    // resnet-inference: whole GPUs; its GPU_UTIL series are exactly its pods' GPUs.
    let resnet = held_by(&scenario, "resnet-inference");
    assert!(resnet.len() >= 2, "the demo runs several resnet pods");
    let got: BTreeSet<_> = series_of_app(&body, "DCGM_FI_DEV_GPU_UTIL", "resnet-inference")
        .into_iter()
        .map(|l| {
            let gpu: u32 = l["gpu"].parse().expect("gpu index");
            assert_eq!(l["UUID"], node.gpus[gpu as usize].uuid, "{l:?}");
            assert!(!l.contains_key("GPU_I_ID"), "{l:?}");
            (l["pod"].clone(), l["namespace"].clone(), gpu, None)
        })
        .collect();
    assert_eq!(got, resnet);

    // ml-serving: MIG instances, one series per instance, each naming its instance.
    let serving = held_by(&scenario, "ml-serving");
    assert!(serving.iter().all(|(.., mig)| mig.is_some()));
    let got: BTreeSet<_> = series_of_app(&body, "DCGM_FI_DEV_FB_USED", "ml-serving")
        .into_iter()
        .map(|l| {
            let gpu: u32 = l["gpu"].parse().expect("gpu index");
            let slot = node.gpus[gpu as usize]
                .mig
                .iter()
                .position(|m| m.gpu_instance_id.to_string() == l["GPU_I_ID"])
                .unwrap_or_else(|| panic!("no such GPU instance: {l:?}"));
            (l["pod"].clone(), l["namespace"].clone(), gpu, Some(slot))
        })
        .collect();
    assert_eq!(got, serving);

    // The notebooks time-slice one GPU: each pod's share is its processes' memory.
    let notebooks: Vec<_> = scenario
        .pods
        .iter()
        .filter(|p| p.labels.get("app").map(String::as_str) == Some("jupyter-notebook"))
        .collect();
    assert!(notebooks.len() >= 2, "the notebooks share a GPU");
    let shares = series_of_app(&body, "DCGM_FI_DEV_FB_USED", "jupyter-notebook");
    for pod in notebooks {
        let container = &pod.containers[0];
        let gpu = container.devices[0].gpu.expect("gpu");
        assert!(
            container.devices[0].replica.is_some(),
            "a time-sliced replica"
        );
        let mib: u64 = node.gpus[gpu as usize]
            .processes
            .iter()
            .filter(|p| container.pids.contains(&p.pid))
            .map(|p| p.used_memory_bytes >> 20)
            .sum();
        assert!(mib > 0, "{} runs GPU processes", pod.name);
        let line = shares
            .iter()
            .find(|l| l["pod"] == pod.name)
            .unwrap_or_else(|| panic!("no share of {}", pod.name));
        assert_eq!(line["gpu"], gpu.to_string());
        assert_eq!(line["namespace"], pod.namespace);
        let value = samples(&body, "DCGM_FI_DEV_FB_USED")
            .into_iter()
            .find(|l| labels(l) == *line)
            .and_then(line_value);
        assert_eq!(value, Some(mib as f64), "{}", pod.name);
    }

    // The README's seed query answers through Prometheus, over the resnet GPUs.
    let target = exporter.base.trim_start_matches("http://").to_string();
    let prometheus = Prometheus::start(&[("demo", &target, "")]);
    let count = wait_for("the seed query to answer", Duration::from_secs(30), || {
        let result = prometheus.query(r#"avg(DCGM_FI_DEV_GPU_UTIL{app="resnet-inference"})"#);
        result.first()?;
        let count = prometheus.query(r#"count(DCGM_FI_DEV_GPU_UTIL{app="resnet-inference"})"#);
        count.first()?["value"][1].as_str()?.parse::<usize>().ok()
    });
    assert_eq!(count, resnet.len());
}
