//! gpu-metrics-adapter with the Prometheus-compatible source: a real Prometheus scrapes
//! the exporter (attributed to pods through the simulated Kubernetes node), and the
//! adapter answers from instant queries the same per-pod values as the direct source; a
//! `promql:` signal reads Prometheus 3's annotated answers.

use e2e_tests::metrics_api::items_milli;
use e2e_tests::quantity::milli_value;
use e2e_tests::{
    Adapter, Exporter, KubeNode, Prometheus, attributed_exporter, get, urlencode, wait_for,
};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A pass-through proxy in front of Prometheus that records each request's head, so the
/// test sees what the adapter puts on the wire. One request per connection (it answers
/// with `Connection: close`).
struct RecordingProxy {
    base: String,
    heads: Arc<Mutex<Vec<String>>>,
}

impl RecordingProxy {
    fn start(upstream: &str) -> RecordingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let upstream = upstream.trim_start_matches("http://").to_string();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = heads.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let upstream = upstream.clone();
                let recorded = recorded.clone();
                std::thread::spawn(move || {
                    let _ = relay(client, &upstream, &recorded);
                });
            }
        });
        RecordingProxy { base, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("heads").clone()
    }
}

fn relay(
    mut client: TcpStream,
    upstream: &str,
    recorded: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.extend_from_slice(&byte);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    recorded.lock().expect("heads").push(head.clone());
    // GET requests only: no body to forward. Ask upstream to close, so its answer ends
    // at EOF.
    let mut forwarded: Vec<&str> = head
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    forwarded.push("Connection: close");
    let mut server = TcpStream::connect(upstream)?;
    server.write_all(format!("{}\r\n\r\n", forwarded.join("\r\n")).as_bytes())?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer)?;
    client.write_all(&answer)?;
    client.flush()
}

const SCENARIO: &str = "tests/fixtures/pods-node.toml";

/// The time-sliced pods' utilisation as the direct source derives it, milli-units.
fn shares() -> Vec<(String, i64)> {
    vec![("share-a".into(), 54_000), ("share-b".into(), 18_000)]
}

#[test]
fn the_prometheus_source_gives_the_same_per_pod_values() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let kubeconfig = node.kubeconfig().display().to_string();
    let e = attributed_exporter(&node, SCENARIO);
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("gpu", &target, "")]);
    wait_for("Prometheus has the shares", Duration::from_secs(60), || {
        (!prom
            .query("DCGM_FI_DEV_GPU_UTIL{pod=\"share-b\"}")
            .is_empty())
        .then_some(())
    });
    let proxy = RecordingProxy::start(&prom.base);
    let adapter = Adapter::start(&[
        "--scrape-interval",
        "500ms",
        "--prometheus-url",
        &proxy.base,
        "--prometheus-header",
        "X-Scope-OrgID: tenant-a",
        "--kubeconfig",
        &kubeconfig,
        "--max-staleness",
        "5s",
    ]);
    let base = adapter.base.clone();
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference";
    let v: Value = e2e_tests::try_wait_for(Duration::from_secs(30), || {
        let (status, body) = get(&format!("{base}{path}"));
        (status == 200).then(|| serde_json::from_str(&body).expect("JSON"))
    })
    .unwrap_or_else(|| {
        panic!(
            "the adapter did not answer: {:?}\n{}",
            get(&format!("{base}{path}")),
            adapter.process.log()
        )
    });
    assert_eq!(
        items_milli(&v),
        shares(),
        "the same shares as the direct source"
    );
    // Memory of the whole-GPU pod, through Prometheus.
    let (status, body) = get(&format!(
        "{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/train-0/gpu_memory_used_bytes"
    ));
    assert_eq!(status, 200, "{body}");
    let m: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        milli_value(m["items"][0]["value"].as_str().expect("q")).expect("q"),
        40_960 * 1_048_576 * 1000
    );
    // The engine's load is the round's fixed queries, whatever the clients ask: 200
    // API requests add none. Rounds are counted by the adapter's own metric; one may
    // be in flight when the two are read.
    let rounds = |a: &Adapter| {
        ["success", "failure"]
            .iter()
            .map(|r| {
                crate::faults_adapter::self_metric(
                    a,
                    &format!(r#"gpu_metrics_adapter_source_scrapes_total{{result="{r}"}}"#),
                )
            })
            .sum::<f64>()
    };
    let sent = |p: &RecordingProxy| {
        p.heads()
            .iter()
            .filter(|h| h.starts_with("GET /api/v1/query?"))
            .count()
    };
    for _ in 0..200 {
        let (status, _) = get(&format!("{base}{path}"));
        assert_eq!(status, 200);
    }
    let per_round = gpu_metrics_adapter::source::prometheus::pushdown::queries().len();
    let (before, queries_sent, after) = (rounds(&adapter), sent(&proxy), rounds(&adapter));
    assert!(
        queries_sent as f64 >= before * per_round as f64
            && queries_sent as f64 <= (after + 1.0) * per_round as f64,
        "{queries_sent} queries for {before}..{after} rounds of {per_round}"
    );
    // Every query the adapter sent carried the configured header, and the staleness
    // as the engine's lookback.
    let queries: Vec<String> = proxy
        .heads()
        .into_iter()
        .filter(|h| h.starts_with("GET /api/v1/query?"))
        .collect();
    assert!(!queries.is_empty(), "the adapter queried through the proxy");
    for head in &queries {
        assert!(
            head.lines()
                .next()
                .is_some_and(|l| l.contains("&lookback_delta=5 ")),
            "no lookback_delta=5 in:\n{head}"
        );
        assert!(
            head.lines()
                .any(|l| l.eq_ignore_ascii_case("x-scope-orgid: tenant-a")),
            "no X-Scope-OrgID header in:\n{head}"
        );
    }
}

/// Prometheus 3 annotates answers: `rate()` over dcgm-exporter's counters, whose names
/// lack `_total`, comes with an `infos` entry ("metric might not be a counter"). A
/// `promql:` signal on such a query is still read, and is what Prometheus answers.
#[test]
fn a_promql_signal_reads_prometheus_3_answers_with_annotations() {
    let e = Exporter::start(&["--simulate=builtin:default", "-c", "500"], &[]);
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("gpu", &target, "")]);
    let query = "count(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10s]))";
    // The raw answer: eight GPUs, and the annotation Prometheus 3 adds.
    let raw = wait_for(
        "Prometheus has two samples of every GPU's energy",
        Duration::from_secs(60),
        || {
            let (status, body) = get(&format!(
                "{}/api/v1/query?query={}",
                prom.base,
                urlencode(query)
            ));
            let v: Value = serde_json::from_str(&body).ok()?;
            (status == 200 && v["data"]["result"][0]["value"][1] == "8").then_some(v)
        },
    );
    let infos = raw["infos"].as_array().cloned().unwrap_or_default();
    assert!(
        infos.iter().any(|i| i
            .as_str()
            .is_some_and(|s| s.contains("might not be a counter"))),
        "Prometheus 3 annotates rate() on a name without _total: {raw}"
    );
    let a = Adapter::start(&[
        "--exporter-url",
        "http://127.0.0.1:1/metrics",
        "--signal-prometheus-url",
        &prom.base,
        "--signal",
        &format!("inference/gpus=promql:{query}"),
    ]);
    let path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/gpus";
    let v = wait_for(
        "the adapter serves the signal",
        Duration::from_secs(30),
        || {
            let (status, v) = a.get(path);
            (status == 200).then_some(v)
        },
    );
    let value = milli_value(v["items"][0]["value"].as_str().expect("quantity")).expect("quantity");
    assert_eq!(value, 8_000, "{v}");
}

/// `--prometheus-queries=recorded` against a real Prometheus evaluating the adapter's
/// own printed rules serves the same per-pod values as the inline queries; against one
/// without the rules it serves no pod and says why once in its log.
#[test]
fn recorded_queries_read_the_printed_rules_and_say_when_they_are_missing() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let kubeconfig = node.kubeconfig().display().to_string();
    let e = attributed_exporter(&node, SCENARIO);
    let target = e.base.trim_start_matches("http://").to_string();
    let rules_dir = e2e_tests::scratch_dir("recording-rules");
    let rules = rules_dir.join("rules.yml");
    let printed = std::process::Command::new(e2e_tests::binary("gpu-metrics-adapter"))
        .arg("--print-recording-rules")
        .output()
        .expect("gpu-metrics-adapter --print-recording-rules");
    assert!(printed.status.success());
    let printed = String::from_utf8(printed.stdout).expect("UTF-8");
    // Evaluated every second here, as the test's Prometheus scrapes.
    let fast = printed.replace("    interval: 15s\n", "    interval: 1s\n");
    assert_ne!(fast, printed, "the printed group has its interval");
    std::fs::write(&rules, fast).expect("write rules");
    let scrape = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpu\n    honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n"
    );
    let with_rules = Prometheus::start_with_config(
        &format!("rule_files: ['{}']\n{scrape}", rules.display()),
        &[],
    );
    let without = Prometheus::start_with_config(&scrape, &[]);
    let start = |prom: &Prometheus| {
        Adapter::start(&[
            "--scrape-interval",
            "500ms",
            "--prometheus-url",
            &prom.base,
            "--prometheus-queries",
            "recorded",
            "--kubeconfig",
            &kubeconfig,
            "--max-staleness",
            "5s",
        ])
    };
    let (recorded, missing) = (start(&with_rules), start(&without));
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference";
    let v: Value = e2e_tests::try_wait_for(Duration::from_secs(60), || {
        let (status, body) = get(&format!("{}{path}", recorded.base));
        let v: Value = serde_json::from_str(&body).ok()?;
        (status == 200 && v["items"].as_array()?.len() == 2).then_some(v)
    })
    .unwrap_or_else(|| panic!("no recorded answer:\n{}", recorded.process.log()));
    assert_eq!(
        items_milli(&v),
        shares(),
        "the same shares as the inline queries"
    );
    let mut missing = missing;
    missing
        .process
        .wait_for_line("are the recording rules loaded", Duration::from_secs(30));
    let (status, body) = get(&format!("{}{path}", missing.base));
    assert!(
        status == 404 || !body.contains("share-a"),
        "served without rules: {status} {body}"
    );
}
