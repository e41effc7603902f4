//! Issue 18, composite metrics, percentiles and scale from zero, end to end: the real
//! adapter scraping a real exporter (simulated GPUs attributed to pods), its composite
//! and aggregated answers checked against the formula computed here from its own
//! per-pod base answers; and a signal without pods (a fake gateway's queue) reaching a
//! KEDA client's `StreamIsActive` within a second of the first waiting request.

use e2e_tests::metrics_api::items_by_name;
use e2e_tests::{
    Adapter, KubeNode, Prometheus, attributed_exporter, get, try_query_value, wait_for,
};
use gpu_metrics_adapter::faces::keda::proto::external_scaler_client::ExternalScalerClient;
use gpu_metrics_adapter::faces::keda::proto::{GetMetricsRequest, ScaledObjectRef};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SCENARIO: &str = "tests/fixtures/pods-node.toml";
const PRESSURE: &str = "pressure=max(gpu_utilization/70, gpu_memory_utilization/80) * 100";

/// The same formula, here.
fn pressure(util: f64, mem: f64) -> f64 {
    (util / 70.0).max(mem / 80.0) * 100.0
}

fn close(a: f64, b: f64) -> bool {
    // Quantities carry milli-units.
    (a - b).abs() <= 0.0011
}

/// The q-quantile as Prometheus' quantile() defines it, written out here.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let rank = q * (v.len() - 1) as f64;
    let below = rank.floor() as usize;
    let above = (below + 1).min(v.len() - 1);
    v[below] * (1.0 - rank.fract()) + v[above] * rank.fract()
}

#[test]
fn composite_and_percentile_answers_match_the_formula_over_each_pod() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = attributed_exporter(&node, SCENARIO);
    let url = e.url("/metrics");
    let kubeconfig = node.kubeconfig().display().to_string();
    let a = Adapter::start(&[
        "--exporter-url",
        &url,
        "--scrape-interval",
        "300ms",
        "--kubeconfig",
        &kubeconfig,
        "--composite-metric",
        PRESSURE,
    ]);
    let pods = |ns: &str, metric: &str| {
        items_by_name(&a.ok(&format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/{metric}"
        )))
    };
    for ns in ["serve", "inference", "ml"] {
        let util = pods(ns, "gpu_utilization");
        let mem = pods(ns, "gpu_memory_utilization");
        let composite = pods(ns, "pressure");
        let want: BTreeMap<String, f64> = util
            .iter()
            .filter_map(|(pod, u)| Some((pod.clone(), pressure(*u, *mem.get(pod)?))))
            .collect();
        assert!(!want.is_empty(), "{ns} has pods with both inputs");
        assert_eq!(
            composite.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{ns}: one value per pod with both inputs"
        );
        for (pod, w) in &want {
            // The inputs are served rounded to milli-units; the formula amplifies that by
            // at most 100/70.
            assert!(
                (composite[pod] - w).abs() < 0.01,
                "{ns}/{pod}: {} vs {w}",
                composite[pod]
            );
        }

        // Percentiles and the other aggregations over the namespace's pods, as one
        // external item, against the per-pod items of the same metric.
        let per_pod: Vec<f64> = items_by_name(&a.ok(&format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/pressure"
        )))
        .into_values()
        .collect();
        let sum: f64 = per_pod.iter().sum();
        for (suffix, want) in [
            ("p50", quantile(&per_pod, 0.5)),
            ("p95", quantile(&per_pod, 0.95)),
            ("p99", quantile(&per_pod, 0.99)),
            ("max", per_pod.iter().copied().fold(f64::MIN, f64::max)),
            ("avg", sum / per_pod.len() as f64),
            ("sum", sum),
        ] {
            let path =
                format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/pressure:{suffix}");
            let v = a.ok(&path);
            let got = items_by_name(&v);
            assert_eq!(got.len(), 1, "{path}: one item: {v}");
            assert_eq!(v["items"][0]["metricName"], format!("pressure:{suffix}"));
            let got = got[""];
            assert!(close(got, want), "{path}: {got} vs {want} over {per_pod:?}");
            // metrics-api answers the same number.
            let j = a.ok(&format!(
                "/metrics-api/namespaces/{ns}/pressure?podSelector=&aggregation={suffix}"
            ));
            let api = j["value"].as_f64().expect("value");
            assert!(close(api, want), "metrics-api {suffix}: {api} vs {want}");
        }
    }

    // The workload: the mean of its pods' composites, or the suffix's aggregation.
    let resnet = pods("inference", "pressure");
    let values: Vec<f64> = resnet.values().copied().collect();
    assert_eq!(values.len(), 2, "share-a and share-b");
    let object = |metric: &str| {
        let v = a.ok(&format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/deployments.apps/resnet/{metric}"
        ));
        items_by_name(&v)["resnet"]
    };
    let mean = values.iter().sum::<f64>() / 2.0;
    assert!(
        close(object("pressure"), mean),
        "{} vs {mean}",
        object("pressure")
    );
    let p95 = quantile(&values, 0.95);
    assert!(close(object("pressure:p95"), p95));
    // A KEDA trigger asks the same with its aggregation key.
    let rt = runtime();
    let grpc = a.grpc_address();
    rt.block_on(async {
        let mut client = ExternalScalerClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect");
        let so = scaled_object(&[
            ("metric", "pressure"),
            ("targetValue", "100"),
            ("deployment", "resnet"),
            ("aggregation", "p95"),
        ]);
        let m = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(so),
                metric_name: "pressure".into(),
            })
            .await
            .expect("metrics")
            .into_inner();
        let got = m.metric_values[0].metric_value_float;
        assert!((got - p95).abs() < 0.01, "KEDA p95 {got} vs {p95}");
    });

    // Discovery lists the composite next to the built-in metrics; asking an aggregation
    // of single pods, or one that does not exist, is refused with a reason.
    let (_, list) = a.get("/apis/custom.metrics.k8s.io/v1beta2");
    assert!(
        list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .any(|r| r["name"] == "deployments.apps/pressure"),
        "{list}"
    );
    let (status, body) =
        a.get("/apis/custom.metrics.k8s.io/v1beta2/namespaces/serve/pods/*/pressure:p95");
    assert_eq!(status, 400, "{body}");
    let (status, body) =
        a.get("/apis/external.metrics.k8s.io/v1beta1/namespaces/serve/pressure:median");
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap_or("").contains("median"),
        "{body}"
    );
}

#[test]
fn a_bad_composite_definition_stops_startup_naming_it() {
    let mut cmd = Adapter::command(&[
        "--exporter-url",
        "http://127.0.0.1:1/metrics",
        "--composite-metric",
        "pressure=max(gpu_utilization/70, vllm_queue/50)",
    ]);
    let out = cmd.output().expect("run the adapter");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pressure=max(gpu_utilization/70, vllm_queue/50)")
            && stderr.contains("\"vllm_queue\" is not a per-pod metric"),
        "{stderr}"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn scaled_object(meta: &[(&str, &str)]) -> ScaledObjectRef {
    ScaledObjectRef {
        name: "llm".into(),
        namespace: "inference".into(),
        scaler_metadata: meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}

/// A gateway's `/metrics` in the text exposition: the requests waiting per route,
/// `waiting` for route "llm" and a constant 7 for another route; 503 while `broken`.
pub(crate) struct FakeGateway {
    pub(crate) port: u16,
    pub(crate) waiting: Arc<AtomicU64>,
    pub(crate) broken: Arc<AtomicBool>,
}

impl FakeGateway {
    pub(crate) fn start() -> FakeGateway {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let waiting = Arc::new(AtomicU64::new(0));
        let broken = Arc::new(AtomicBool::new(false));
        let (w, b) = (waiting.clone(), broken.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let (status, body) = if b.load(Ordering::SeqCst) {
                    ("503 Service Unavailable", String::new())
                } else {
                    let body = format!(
                        "# HELP gateway_requests_waiting Requests queued at the gateway.\n# TYPE gateway_requests_waiting gauge\ngateway_requests_waiting{{route=\"llm\"}} {}\ngateway_requests_waiting{{route=\"other\"}} 7\n",
                        w.load(Ordering::SeqCst)
                    );
                    ("200 OK", body)
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        FakeGateway {
            port,
            waiting,
            broken,
        }
    }
}

/// Scale from zero: at zero replicas there is no pod to read, so the trigger reads the
/// gateway's queue. `StreamIsActive` says inactive at once, active within a second of
/// the first waiting request (measured five times), inactive again when the queue
/// drains; a failing gateway is an error, never "inactive".
#[test]
fn a_gateway_queue_wakes_keda_within_a_second() {
    let gw = FakeGateway::start();
    let signal = format!(
        "inference/gateway_requests_waiting=http://127.0.0.1:{}/metrics#gateway_requests_waiting{{route=\"llm\"}}",
        gw.port
    );
    // No exporter and no API server: the signal needs neither.
    let a = Adapter::start(&[
        "--exporter-url",
        "http://127.0.0.1:1/metrics",
        "--signal",
        &signal,
    ]);
    let path =
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/gateway_requests_waiting";
    assert_eq!(items_by_name(&a.ok(path))[""], 0.0, "the queue is empty");
    let (status, _) =
        a.get("/apis/external.metrics.k8s.io/v1beta1/namespaces/other/gateway_requests_waiting");
    assert_eq!(status, 404, "a signal is served in its own namespace only");

    let grpc = a.grpc_address();
    let so = || {
        scaled_object(&[
            ("metric", "gateway_requests_waiting"),
            ("targetValue", "4"),
            ("activationTargetValue", "0"),
        ])
    };
    let mut latencies = Vec::new();
    runtime().block_on(async {
        let mut client = ExternalScalerClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect");
        let mut stream = client
            .stream_is_active(so())
            .await
            .expect("stream")
            .into_inner();
        let first = stream.message().await.expect("first").expect("open");
        assert!(!first.result, "inactive while nothing waits");
        for round in 1..=5u64 {
            let changed = Instant::now();
            gw.waiting.store(round, Ordering::SeqCst);
            // Only a push that never comes reaches this; the one-second promise is
            // checked on the measured latencies below.
            let up = tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .unwrap_or_else(|_| panic!("round {round}: no push within 10 s"))
                .expect("stream")
                .expect("open");
            latencies.push(changed.elapsed());
            assert!(up.result, "active once requests wait");
            let m = client
                .get_metrics(GetMetricsRequest {
                    scaled_object_ref: Some(so()),
                    metric_name: "gateway_requests_waiting".into(),
                })
                .await
                .expect("metrics")
                .into_inner();
            assert_eq!(m.metric_values[0].metric_value_float, round as f64);
            gw.waiting.store(0, Ordering::SeqCst);
            let down = tokio::time::timeout(Duration::from_secs(2), stream.message())
                .await
                .expect("pushed when the queue drains")
                .expect("stream")
                .expect("open");
            assert!(!down.result, "inactive once drained");
        }
        // The gateway fails: an error (KEDA keeps its state, or applies its fallback),
        // not a made-up "inactive".
        gw.broken.store(true, Ordering::SeqCst);
        let refused = async {
            loop {
                match client.is_active(so()).await {
                    Err(status) => return status,
                    Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        };
        let status = tokio::time::timeout(Duration::from_secs(5), refused)
            .await
            .expect("an error once the gateway fails");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains("gateway_requests_waiting"),
            "{status:?}"
        );
        gw.broken.store(false, Ordering::SeqCst);
        // A pod selector on a signal is a mistake, said so.
        let mut meta = so();
        meta.scaler_metadata
            .insert("podSelector".into(), "app=llm".into());
        let bad = client.is_active(meta).await.expect_err("refused");
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    });
    // The reads are counted, the failed ones apart.
    let (status, text) = get(&format!("{}/metrics", a.base));
    assert_eq!(status, 200, "{text}");
    let count = |result: &str| {
        e2e_tests::sample_value(
            &text,
            &format!(
                "gpu_metrics_adapter_signal_reads_total{{namespace=\"inference\",signal=\"gateway_requests_waiting\",result=\"{result}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert!(count("success") >= 10.0, "{text}");
    assert!(count("failure") >= 1.0, "{text}");
    let worst = latencies.iter().max().expect("five rounds");
    eprintln!("gateway queue → StreamIsActive push: {latencies:?}, worst {worst:?}");
    assert!(
        *worst < Duration::from_secs(1),
        "a waiting request wakes KEDA within a second: {latencies:?}"
    );
}

/// The same signal through a Prometheus query: a real Prometheus scrapes the gateway,
/// the adapter asks it `sum(gateway_requests_waiting)` over both routes.
#[test]
fn a_promql_signal_reads_a_real_prometheus() {
    let gw = FakeGateway::start();
    let target = format!("127.0.0.1:{}", gw.port);
    let prom = Prometheus::start(&[("gateway", &target, "")]);
    wait_for(
        "Prometheus scraped the gateway",
        Duration::from_secs(30),
        || (!prom.query("gateway_requests_waiting").is_empty()).then_some(()),
    );
    let signal = "inference/waiting=promql:sum(gateway_requests_waiting)";
    let a = Adapter::start(&[
        "--exporter-url",
        "http://127.0.0.1:1/metrics",
        "--signal-prometheus-url",
        &prom.base,
        "--signal",
        signal,
    ]);
    let path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/waiting";
    gw.waiting.store(5, Ordering::SeqCst);
    // Prometheus' own answer is the oracle: the adapter serves what it says.
    wait_for(
        "the adapter serves Prometheus' sum",
        Duration::from_secs(30),
        || {
            let want = try_query_value(&prom.query("sum(gateway_requests_waiting)")[0])?;
            let (status, v) = a.get(path);
            (status == 200 && want == 12.0 && items_by_name(&v)[""] == want).then_some(())
        },
    );
    let (status, text) = get(&format!("{}/apis/external.metrics.k8s.io/v1beta1", a.base));
    assert_eq!(status, 200);
    assert!(
        text.contains("\"waiting\""),
        "discovery lists the signal: {text}"
    );
}
