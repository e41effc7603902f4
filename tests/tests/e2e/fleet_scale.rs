//! The fleet-scale check in CI size: a synthetic fleet of 10,000 GPUs (1,250 nodes,
//! 126,448 series, 5,173 pods: tests/src/fleet.rs) scraped by two Prometheus 3 shards
//! behind Thanos query, read by gpu-metrics-adapter (`--prometheus-url` = Thanos query)
//! and by prometheus-adapter v0.12.0 with rules for the same five metrics, both against a
//! real kube-apiserver holding the fleet's pods (tests/scale/engine.sh).
//!
//! The shards evaluate gpu-metrics-adapter's recording rules (`--print-recording-rules`)
//! and both adapters read the recorded per-pod series (`--prometheus-queries=recorded`;
//! tests/scale/prometheus-adapter-recorded.yaml): the setup the fleet-scale docs give
//! for a fleet this size. The inline queries are held to the direct source's derivation
//! by `prometheus_pushdown` and served end to end by `adapter_prometheus`.
//!
//! For two steps of the fleet's values in turn, every pod the fleet's truth names must be
//! answered by both adapters through the custom metrics API (called on their secure
//! ports with a bearer token, TokenReview and SubjectAccessReview as in a cluster), with
//! the truth's value, and no pod the truth gives no value (power of a MIG or time-sliced
//! pod); after the step changes, nothing of the old step may still be served once a
//! bounded wait is over. Tolerance: one milli-unit (the custom metrics API's
//! `resource.Quantity` carries milli-units, which either adapter may round or
//! truncate), plus 1e-9 relative for the order of floating-point sums.
//!
//! About 6 minutes on the project's 2-core VM (the engine and both adapters up in
//! 50 s; most of the rest is prometheus-adapter, which asks Thanos at every request) and
//! 3 GiB of memory. Figures of the same setup: docs/benchmarks/fleet-scale.md.

use e2e_tests::https::HttpsClient;
use e2e_tests::{go_tool, target_profile_dir, try_wait_for, workspace};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const METRICS: [&str; 5] = [
    "gpu_utilization",
    "gpu_memory_used_bytes",
    "gpu_memory_utilization",
    "gpu_power_watts",
    "gpu_tensor_active",
];

/// tests/scale/engine.sh up in a scratch directory; down on drop.
struct Engine {
    dir: PathBuf,
    env: HashMap<String, String>,
}

impl Engine {
    fn up(settings: &[(&str, &str)]) -> Engine {
        let dir = e2e_tests::scratch_dir("fleet-scale");
        let kube_bin = go_tool("prometheus")
            .parent()
            .expect("the Go tools' directory")
            .to_path_buf();
        // Made before `up`, so that a failed `up` is still taken down.
        let mut engine = Engine {
            dir: dir.clone(),
            env: HashMap::new(),
        };
        let out = Command::new("bash")
            .arg(workspace().join("tests/scale/engine.sh"))
            .arg("up")
            .arg(&dir)
            .env("RUST_BIN_DIR", target_profile_dir())
            .env("KUBE_BIN_DIR", kube_bin)
            .envs(settings.iter().copied())
            .output()
            .expect("run tests/scale/engine.sh");
        assert!(
            out.status.success(),
            "engine.sh up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(dir.join("env")).expect("DIR/env");
        engine.env = env
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect();
        engine
    }

    fn env(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("{key} not in DIR/env"))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(workspace().join("tests/scale/engine.sh"))
            .arg("down")
            .arg(&self.dir)
            .status();
    }
}

/// The truth at a step: (namespace, pod) → metric → value.
type Truth = BTreeMap<(String, String), BTreeMap<String, f64>>;

fn truth(fleet: &str, step: u64) -> Truth {
    let (status, body) = e2e_tests::get(&format!("{fleet}/truth?step={step}"));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("truth JSON");
    v["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .map(|p| {
            let key = (
                p["namespace"].as_str().expect("ns").to_string(),
                p["pod"].as_str().expect("pod").to_string(),
            );
            let values = METRICS
                .iter()
                .filter_map(|m| Some((m.to_string(), p[*m].as_f64()?)))
                .collect();
            (key, values)
        })
        .collect()
}

/// A one-sample instant query's value.
fn instant(base: &str, query: &str) -> Option<f64> {
    let (status, body) = e2e_tests::get(&format!(
        "{base}/api/v1/query?query={}",
        e2e_tests::urlencode(query)
    ));
    let v: Value = serde_json::from_str(&body).ok()?;
    (status == 200).then_some(())?;
    e2e_tests::try_query_value(&v["data"]["result"][0])
}

/// Move the fleet's values to `step`.
fn set_step(fleet: &str, step: u64) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let resp = agent
        .post(&format!("{fleet}/step?to={step}"))
        .send_empty()
        .expect("POST /step");
    assert_eq!(resp.status().as_u16(), 200, "POST /step?to={step}");
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 0.001 + 1e-9 * want.abs()
}

/// Every disagreement of one adapter with the truth, at most `limit` of them described
/// (an empty list: it answers the truth exactly).
fn disagreements(client: &HttpsClient, base: &str, token: &str, truth: &Truth) -> Vec<String> {
    let namespaces: BTreeSet<&str> = truth.keys().map(|(ns, _)| ns.as_str()).collect();
    let auth = format!("Bearer {token}");
    let mut out = Vec::new();
    for ns in namespaces {
        for metric in METRICS {
            let url = format!(
                "{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/{metric}"
            );
            let answered: BTreeMap<String, f64> =
                match client.get(&url, &[("Authorization", &auth)]) {
                    Ok((200, body)) => {
                        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                        if v["items"].is_array() {
                            e2e_tests::metrics_api::items(&v).into_iter().collect()
                        } else {
                            BTreeMap::new()
                        }
                    }
                    Ok((404, _)) => BTreeMap::new(),
                    other => {
                        out.push(format!("{ns} {metric}: {other:?}"));
                        continue;
                    }
                };
            for ((pns, pod), values) in truth.range((ns.to_string(), String::new())..) {
                if pns != ns {
                    break;
                }
                match (values.get(metric), answered.get(pod)) {
                    (Some(want), Some(got)) if close(*got, *want) => {}
                    (None, None) => {}
                    (want, got) => out.push(format!(
                        "{ns}/{pod} {metric}: answered {got:?}, truth {want:?}"
                    )),
                }
            }
            let unknown = answered
                .keys()
                .filter(|p| !truth.contains_key(&(ns.to_string(), (*p).clone())))
                .count();
            if unknown > 0 {
                out.push(format!(
                    "{ns} {metric}: {unknown} pods the fleet does not have"
                ));
            }
        }
    }
    out
}

#[test]
fn both_adapters_answer_every_pod_of_a_10000_gpu_fleet_through_thanos() {
    let started = Instant::now();
    let engine = Engine::up(&[
        ("GPUS", "10000"),
        ("SCRAPE_INTERVAL", "5s"),
        ("WITH_ADAPTERS", "1"),
        ("RECORDED", "1"),
        // A round through Thanos takes about 5 s at this size on 2 busy cores.
        ("ADAPTER_INTERVAL", "5s"),
        ("RELIST_INTERVAL", "30s"),
        (
            "OUR_ADAPTER_ARGS",
            "--scrape-timeout 20s --max-staleness 30s",
        ),
    ]);
    let up = started.elapsed();
    let fleet = engine.env("FLEET_URL").to_string();
    let ca = std::fs::read_to_string(engine.env("ADAPTER_CA")).expect("adapter CA");
    let token = std::fs::read_to_string(engine.env("READER_TOKEN_FILE")).expect("token");
    let token = token.trim();
    let client = HttpsClient::new(&ca, None);
    let adapters = [
        ("gpu-metrics-adapter", engine.env("OURS_URL").to_string()),
        ("prometheus-adapter", engine.env("THEIRS_URL").to_string()),
    ];
    for step in [1u64, 2] {
        set_step(&fleet, step);
        // Every node group's samples of this step in the engine (fleet-sim serves its
        // step beside the series), so what follows waits on the adapters alone.
        let thanos = engine.env("THANOS_URL");
        e2e_tests::wait_for(
            &format!("step {step} in every shard"),
            Duration::from_secs(60),
            || {
                let v = instant(thanos, "min(fleet_sim_step) + 1000 * count(fleet_sim_step)")?;
                (v == step as f64 + 1000.0 * 25.0).then_some(())
            },
        );
        let truth = truth(&fleet, step);
        assert_eq!(truth.len(), 5_173, "the fleet's pods");
        for (name, base) in &adapters {
            let mut last = Vec::new();
            let agreed = try_wait_for(Duration::from_secs(90), || {
                last = disagreements(&client, base, token, &truth);
                last.is_empty().then_some(())
            });
            assert!(
                agreed.is_some(),
                "{name} at step {step}: {} disagreements with the truth after 90 s, e.g.\n{}",
                last.len(),
                last.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
            );
        }
    }
    eprintln!(
        "fleet_scale: engine and adapters up in {:.0?}, whole test {:.0?}",
        up,
        started.elapsed()
    );
}
