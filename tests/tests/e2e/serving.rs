//! Serving-engine metrics end to end: simulated vLLM engines (real HTTP, vLLM's text
//! exposition, queues following load scripts) given to the real adapter with
//! `--serving-target`, pods and their Deployment from the fake API server; the answers
//! on custom.metrics (per pod and per workload), external.metrics (the sum over a
//! workload's pods or the namespace), metrics-api and KEDA's gRPC checked against the
//! scripts, and never-seen and stale pods answered with errors, never a 0.

use e2e_tests::metrics_api::items;
use e2e_tests::serving_engine::{EngineKind, SimEngine, Step};
use e2e_tests::{Adapter, free_port, scratch_dir, try_wait_for, wait_for};
use kube_sim::apiserver::{FakeApiServer, PodMeta};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

const NS: &str = "llm";

/// A refusal as the API answers it: the code, and the `metav1.Status` body's reason and
/// message (empty when the body is not a Status of that code).
fn refusal(status: u16, body: &Value) -> (u16, &str, String) {
    let reason = if body["kind"] == "Status" && body["code"] == status {
        body["reason"].as_str().unwrap_or_default()
    } else {
        ""
    };
    (
        status,
        reason,
        body["message"].as_str().unwrap_or_default().to_string(),
    )
}
const DEADLINE: Duration = Duration::from_secs(30);

/// A pod of Deployment `vllm` (through ReplicaSet `vllm-7d9f`), labelled `replica`.
fn pod(name: &str, replica: &str) -> PodMeta {
    let mut p = PodMeta::running(NS, name, &format!("uid-{name}"), "node-a");
    p.labels = BTreeMap::from([
        ("app".to_string(), "vllm".to_string()),
        ("replica".to_string(), replica.to_string()),
        ("pod-template-hash".to_string(), "7d9f".to_string()),
    ]);
    p.owner = Some(("ReplicaSet".into(), "vllm-7d9f".into()));
    p
}

/// A value as the adapter's quantities carry it: to the thousandth.
fn milli(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Wait until `f` of the adapter's answer at `path` equals `want()` (both read
/// afresh each time, so a script step between the two only delays the match).
fn converges(
    a: &Adapter,
    path: &str,
    f: impl Fn(&Value) -> Vec<(String, f64)>,
    want: impl Fn() -> Vec<(String, f64)>,
) {
    let mut last = None;
    let ok = try_wait_for(DEADLINE, || {
        let (status, v) = a.get(path);
        let got = (status == 200).then(|| f(&v));
        let want = want();
        if got.as_ref() == Some(&want) {
            return Some(());
        }
        last = Some((status, v, want));
        std::thread::sleep(Duration::from_millis(50));
        None
    });
    assert!(
        ok.is_some(),
        "{path}: never matched the script: last {last:?}"
    );
}

struct Setup {
    a: SimEngine,
    b: SimEngine,
    adapter: Adapter,
    _api: FakeApiServer,
}

fn setup() -> Setup {
    let api = FakeApiServer::start().expect("fake API server");
    for (name, replica) in [
        ("vllm-7d9f-a", "a"),
        ("vllm-7d9f-b", "b"),
        ("vllm-7d9f-c", "c"),
    ] {
        api.apply(pod(name, replica));
    }
    let kubeconfig = scratch_dir("serving").join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    // `a` follows a script whose queue grows after 4 s; `b` is set by the test.
    let a = SimEngine::start(
        EngineKind::Vllm,
        vec![
            Step::new(0.0, 4.0, 2.0, 0.3),
            Step::new(4.0, 12.0, 6.0, 0.7),
        ],
    );
    let b = SimEngine::start(EngineKind::Vllm, vec![Step::new(0.0, 3.0, 1.0, 0.5)]);
    a.set_tokens_per_second(200.0);
    // `c`'s engine never answers: nothing listens on its port.
    let dead = format!("http://127.0.0.1:{}/metrics", free_port());
    let targets = [
        format!("{NS}/vllm-7d9f-a={}", a.url()),
        format!("{NS}/vllm-7d9f-b={}", b.url()),
        format!("{NS}/vllm-7d9f-c={dead}"),
    ];
    let kubeconfig = kubeconfig.display().to_string();
    let mut args = vec![
        "--scrape-interval",
        "400ms",
        "--max-staleness",
        "3s",
        "--kubeconfig",
        &kubeconfig,
        "--serving-metric",
        "sim_waiting_max=vllm:num_requests_waiting{model_name!=\"other\"}:max",
        "--composite-metric",
        "load=max(serving_requests_waiting/10, serving_kv_cache_usage/0.8)",
    ];
    for t in &targets {
        args.extend(["--serving-target", t.as_str()]);
    }
    let adapter = Adapter::start(&args);
    Setup {
        a,
        b,
        adapter,
        _api: api,
    }
}

fn pods_path(metric: &str, selector: &str) -> String {
    format!(
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/{metric}?labelSelector={selector}"
    )
}

#[test]
fn serving_signals_follow_the_engines_on_every_face() {
    let s = setup();
    let a = &s.adapter;
    let (ea, eb) = (&s.a, &s.b);

    // Per pod, custom.metrics: each pod its own engine's queue and KV cache; `c`,
    // never seen, is left out of the list.
    let per_pod = |metric: fn(&Step) -> f64| {
        move || {
            vec![
                ("vllm-7d9f-a".to_string(), milli(metric(&ea.state()))),
                ("vllm-7d9f-b".to_string(), milli(metric(&eb.state()))),
            ]
        }
    };
    converges(
        a,
        &pods_path("serving_requests_waiting", "app%3Dvllm"),
        items,
        per_pod(|s| s.waiting),
    );
    converges(
        a,
        &pods_path("serving_kv_cache_usage", "app%3Dvllm"),
        items,
        per_pod(|s| s.kv_cache),
    );
    converges(
        a,
        &pods_path("serving_requests_running", "app%3Dvllm"),
        items,
        per_pod(|s| s.running),
    );
    converges(
        a,
        &pods_path("sim_waiting_max", "app%3Dvllm"),
        items,
        per_pod(|s| s.waiting),
    );
    // A composite over serving inputs: each pod's own formula.
    converges(
        a,
        &pods_path("load", "app%3Dvllm"),
        items,
        per_pod(|s| f64::max(s.waiting / 10.0, s.kv_cache / 0.8)),
    );
    // The script's step at 4 s reaches the adapter.
    wait_for("a's second step", DEADLINE, || {
        (ea.elapsed() > Duration::from_secs(4)).then_some(())
    });
    assert_eq!(ea.state().waiting, 12.0);
    converges(
        a,
        &pods_path("serving_requests_waiting", "app%3Dvllm"),
        items,
        per_pod(|s| s.waiting),
    );
    eb.set(7.0, 2.0, 0.25);

    // The workload, custom.metrics: the mean over its pods with data.
    let mean = |metric: fn(&Step) -> f64| {
        move || {
            vec![(
                "vllm".to_string(),
                milli((metric(&ea.state()) + metric(&eb.state())) / 2.0),
            )]
        }
    };
    converges(
        a,
        &format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/deployments.apps/vllm/serving_requests_waiting"
        ),
        items,
        mean(|s| s.waiting),
    );
    // external.metrics: one item, the sum over the workload's pods (by label), or the
    // namespace's.
    let sum = |metric: fn(&Step) -> f64| {
        move || {
            vec![(
                String::new(),
                milli(metric(&ea.state()) + metric(&eb.state())),
            )]
        }
    };
    for selector in ["?labelSelector=app%3Dvllm", ""] {
        converges(
            a,
            &format!(
                "/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/serving_requests_waiting{selector}"
            ),
            items,
            sum(|s| s.waiting),
        );
        converges(
            a,
            &format!(
                "/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/serving_kv_cache_usage{selector}"
            ),
            items,
            sum(|s| s.kv_cache),
        );
    }
    // metrics-api: the Deployment's sum.
    let value = |v: &Value| vec![(String::new(), milli(v["value"].as_f64().expect("value")))];
    converges(
        a,
        &format!("/metrics-api/namespaces/{NS}/serving_requests_waiting?deployment=vllm"),
        value,
        sum(|s| s.waiting),
    );
    // Discovery lists the serving metrics for pods and workloads, and the mapping.
    let (_, list) = a.get("/apis/custom.metrics.k8s.io/v1beta2");
    let names: Vec<&str> = list["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for n in [
        "pods/serving_requests_waiting",
        "deployments.apps/serving_kv_cache_usage",
        "pods/serving_time_to_first_token_seconds_p95",
        "pods/sim_waiting_max",
    ] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }

    // Tokens per second: the counter's rate across two scrapes (a: 200/s; b: none).
    let tps = wait_for("a's tokens per second", DEADLINE, || {
        let (status, v) = a.get(&pods_path(
            "serving_generation_tokens_per_second",
            "replica%3Da",
        ));
        (status == 200).then(|| items(&v)[0].1)
    });
    assert!(
        (tps - 200.0).abs() < 200.0 * 0.2,
        "tokens/s {tps}, the engine generates 200/s"
    );

    // Time to first token: requests observed at 70 ms fall in vLLM's (0.06, 0.08]
    // bucket, so every quantile lies in it.
    let ttft = wait_for("b's TTFT p95", DEADLINE, || {
        eb.observe_ttft(0.07, 20);
        let (status, v) = a.get(&pods_path(
            "serving_time_to_first_token_seconds_p95",
            "replica%3Db",
        ));
        std::thread::sleep(Duration::from_millis(100));
        (status == 200).then(|| items(&v)[0].1)
    });
    assert!(ttft > 0.06 && ttft <= 0.08, "p95 {ttft}");

    keda_answers(&s);

    // Never seen (c) is an error on every face, never a 0.
    let (status, body) = a.get(&pods_path("serving_requests_waiting", "replica%3Dc"));
    assert_eq!(
        refusal(status, &body),
        (
            404,
            "NotFound",
            format!(
                "no fresh serving_requests_waiting for pods * in {NS} (0 pods with stale data, 1 without data)"
            )
        ),
        "{body}"
    );
    let (status, body) = a.get(&format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/serving_requests_waiting?labelSelector=replica%3Dc"
    ));
    assert_eq!(
        refusal(status, &body),
        (
            404,
            "NotFound",
            format!(
                "no fresh serving_requests_waiting for pods matching replica=c in {NS} (0 pods with stale data, 1 without data)"
            )
        ),
        "{body}"
    );
    let (status, body) = a.get(&format!(
        "/metrics-api/namespaces/{NS}/serving_requests_waiting?podSelector=replica%3Dc"
    ));
    assert_eq!(
        refusal(status, &body),
        (
            503,
            "ServiceUnavailable",
            "none of the 1 pods has serving_requests_waiting data yet: no exporter has reported them".to_string()
        ),
        "{body}"
    );

    // Stale: b's engine goes down; once past --max-staleness its values are gone.
    eb.set_down(true);
    let scrapes = eb.scrapes();
    wait_for("b scraped while down", DEADLINE, || {
        (eb.scrapes() > scrapes).then_some(())
    });
    let body = wait_for("b stale", DEADLINE, || {
        let (status, body) = a.get(&pods_path("serving_requests_waiting", "replica%3Db"));
        (status == 404).then_some(body)
    });
    assert_eq!(
        refusal(404, &body),
        (
            404,
            "NotFound",
            format!(
                "no fresh serving_requests_waiting for pods * in {NS} (1 pods with stale data, 0 without data)"
            )
        ),
        "{body}"
    );
    let (status, body) = a.get(&format!(
        "/metrics-api/namespaces/{NS}/serving_kv_cache_usage?podSelector=replica%3Db"
    ));
    assert_eq!(
        refusal(status, &body),
        (
            503,
            "ServiceUnavailable",
            "all 1 pods have stale serving_kv_cache_usage data".to_string()
        ),
        "{body}"
    );
    // The workload's sum is now a's alone (b and c left out, as for GPU metrics).
    converges(
        a,
        &format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/serving_requests_waiting?labelSelector=app%3Dvllm"
        ),
        items,
        || vec![(String::new(), milli(ea.state().waiting))],
    );
    // The serving scrapes are counted apart from the exporters'.
    let (_, metrics) = e2e_tests::get(&format!("{}/metrics", a.base));
    assert!(
        metrics.contains("gpu_metrics_adapter_serving_source_scrapes_total{result=\"failure\"}"),
        "{metrics}"
    );
    // Three targets, of which `a` alone answers now; its pod alone is fresh.
    for line in [
        "gpu_metrics_adapter_serving_source_targets 3",
        "gpu_metrics_adapter_serving_source_targets_answering 1",
        "gpu_metrics_adapter_serving_pods_fresh 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in {metrics}"
        );
    }
}

/// KEDA's gRPC scaler on the serving metrics: the Deployment's KV cache averaged, the
/// queue summed, and an error for pods never seen.
fn keda_answers(s: &Setup) {
    use gpu_metrics_adapter::faces::keda::proto::external_scaler_client::ExternalScalerClient;
    use gpu_metrics_adapter::faces::keda::proto::{GetMetricsRequest, ScaledObjectRef};
    let grpc = s.adapter.grpc_address();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = ExternalScalerClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect");
        let so = |pairs: &[(&str, &str)]| ScaledObjectRef {
            name: "vllm".into(),
            namespace: NS.into(),
            scaler_metadata: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let kv = so(&[
            ("metric", "serving_kv_cache_usage"),
            ("targetValue", "0.8"),
            ("deployment", "vllm"),
            ("aggregation", "average"),
        ]);
        let queue = so(&[
            ("metric", "serving_requests_waiting"),
            ("targetValue", "10"),
            ("activationTargetValue", "1"),
            ("deployment", "vllm"),
        ]);
        let (ea, eb) = (&s.a, &s.b);
        for (r, want) in [
            (
                kv.clone(),
                Box::new(|| (ea.state().kv_cache + eb.state().kv_cache) / 2.0)
                    as Box<dyn Fn() -> f64>,
            ),
            (
                queue.clone(),
                Box::new(|| ea.state().waiting + eb.state().waiting),
            ),
        ] {
            let deadline = std::time::Instant::now() + DEADLINE;
            loop {
                let got = client
                    .get_metrics(GetMetricsRequest {
                        scaled_object_ref: Some(r.clone()),
                        metric_name: r.scaler_metadata["metric"].clone(),
                    })
                    .await
                    .expect("metrics")
                    .into_inner();
                let got = got.metric_values[0].metric_value_float;
                if (got - want()).abs() < 1e-9 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{:?}: {got} != {}",
                    r.scaler_metadata,
                    want()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(
            client
                .is_active(queue)
                .await
                .expect("active")
                .into_inner()
                .result
        );
        let never = so(&[
            ("metric", "serving_requests_waiting"),
            ("targetValue", "10"),
            ("podSelector", "replica=c"),
        ]);
        let e = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(never),
                metric_name: "serving_requests_waiting".into(),
            })
            .await
            .expect_err("never seen is an error");
        assert_eq!(
            (e.code(), e.message()),
            (
                tonic::Code::Unavailable,
                "none of the 1 pods has serving_requests_waiting data yet: no exporter has reported them"
            ),
            "{e:?}"
        );
    });
}

#[test]
fn bad_serving_flags_stop_the_adapter_with_a_clear_error() {
    for (args, says) in [
        (
            vec!["--serving-target", "vllm-0=http://x/metrics"],
            "NAMESPACE/POD=URL",
        ),
        (
            vec![
                "--serving-target",
                "llm/a=http://127.0.0.1:1/metrics",
                "--serving-metric",
                "q=x:median",
            ],
            "not one of sum",
        ),
        (
            vec![
                "--serving-target",
                "llm/a=http://127.0.0.1:1/metrics",
                "--serving-metric",
                "serving_requests_waiting=x:sum",
            ],
            "built-in",
        ),
    ] {
        let out = Adapter::command(&args).output().expect("run the adapter");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// An EndpointSlice of Service `service`, labelled as its Service (`labels`), with one
/// ready endpoint on loopback for `pod`, port `metrics` = `port`.
fn engine_slice(
    service: &str,
    labels: &[(&str, &str)],
    pod: &str,
    port: u16,
) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{
        Endpoint, EndpointConditions, EndpointPort, EndpointSlice,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let mut all_labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    all_labels.insert("kubernetes.io/service-name".into(), service.into());
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("{service}-{pod}")),
            namespace: Some(NS.into()),
            labels: Some(all_labels),
            ..ObjectMeta::default()
        },
        endpoints: vec![Endpoint {
            addresses: vec!["127.0.0.1".into()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some(NS.into()),
                name: Some(pod.into()),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }],
        ports: Some(vec![
            EndpointPort {
                name: Some("http".into()),
                port: Some(1),
                ..EndpointPort::default()
            },
            EndpointPort {
                name: Some("metrics".into()),
                port: Some(i32::from(port)),
                ..EndpointPort::default()
            },
        ]),
    }
}

#[test]
fn engines_behind_labelled_services_are_discovered() {
    let api = FakeApiServer::start().expect("fake API server");
    for (name, replica) in [("vllm-7d9f-a", "a"), ("sglang-0", "s"), ("other-0", "o")] {
        api.apply(pod(name, replica));
    }
    let kubeconfig = scratch_dir("serving-discovery").join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let vllm = SimEngine::start(EngineKind::Vllm, vec![Step::new(0.0, 6.0, 2.0, 0.4)]);
    let sglang = SimEngine::start(EngineKind::Sglang, vec![Step::new(0.0, 9.0, 3.0, 0.6)]);
    let other = SimEngine::start(EngineKind::Vllm, vec![Step::new(0.0, 100.0, 1.0, 0.1)]);
    let port = |e: &SimEngine| {
        e.url()
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .expect("port")
    };
    let serving = [("gpu-metrics.io/serving", "true")];
    api.apply_endpoint_slice(engine_slice("vllm", &serving, "vllm-7d9f-a", port(&vllm)));
    api.apply_endpoint_slice(engine_slice("sglang", &serving, "sglang-0", port(&sglang)));
    // Not labelled: not a serving engine for the adapter.
    api.apply_endpoint_slice(engine_slice("other", &[], "other-0", port(&other)));
    let kubeconfig = kubeconfig.display().to_string();
    let a = Adapter::start(&[
        "--scrape-interval",
        "400ms",
        "--kubeconfig",
        &kubeconfig,
        "--serving-service-selector",
        "gpu-metrics.io/serving=true",
    ]);
    converges(
        &a,
        &pods_path("serving_requests_waiting", ""),
        items,
        || {
            vec![
                ("sglang-0".to_string(), sglang.state().waiting),
                ("vllm-7d9f-a".to_string(), vllm.state().waiting),
            ]
        },
    );
    converges(
        &a,
        &pods_path("serving_kv_cache_usage", "replica%3Ds"),
        items,
        || vec![("sglang-0".to_string(), milli(sglang.state().kv_cache))],
    );
    assert_eq!(
        other.scrapes(),
        0,
        "an unlabelled Service's engine is not scraped"
    );
}

/// TGI exports no KV-cache ratio: the adapter divides the tokens its batches hold
/// (`tgi_batch_current_max_tokens`) by `/info`'s `max_batch_total_tokens`. While
/// `/info` answers 500 the pod has no value (never a 0), the failures are counted, and
/// the value appears once `/info` recovers; `/info` is not asked once per scrape.
#[test]
fn tgi_kv_cache_usage_comes_from_its_info_capacity() {
    use e2e_tests::serving_engine::{TGI_CAPACITY, tgi_held_tokens};
    let api = FakeApiServer::start().expect("fake API server");
    api.apply(pod("tgi-0", "t"));
    let kubeconfig = scratch_dir("serving-tgi").join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let tgi = SimEngine::start(
        EngineKind::Tgi,
        vec![
            Step::new(0.0, 3.0, 2.0, 0.3),
            Step::new(8.0, 5.0, 4.0, 0.55),
        ],
    );
    tgi.set_info_down(true);
    let kubeconfig = kubeconfig.display().to_string();
    let target = format!("{NS}/tgi-0={}", tgi.url());
    let a = Adapter::start(&[
        "--scrape-interval",
        "400ms",
        "--kubeconfig",
        &kubeconfig,
        "--serving-target",
        &target,
    ]);
    let kv = pods_path("serving_kv_cache_usage", "replica%3Dt");
    // The pod is scraped (its queue is served) ...
    converges(
        &a,
        &pods_path("serving_requests_waiting", "replica%3Dt"),
        items,
        || vec![("tgi-0".to_string(), tgi.state().waiting)],
    );
    // ... and /info asked again after a failure: still no KV-cache usage.
    wait_for("two failed /info requests", DEADLINE, || {
        (tgi.info_requests() >= 2).then_some(())
    });
    let (status, body) = a.get(&kv);
    assert_eq!(
        refusal(status, &body),
        (
            404,
            "NotFound",
            format!(
                "no fresh serving_kv_cache_usage for pods * in {NS} (0 pods with stale data, 1 without data)"
            )
        ),
        "no capacity, no value: {body}"
    );
    let (_, metrics) = e2e_tests::get(&format!("{}/metrics", a.base));
    let failures = e2e_tests::sample_value(
        &metrics,
        "gpu_metrics_adapter_serving_source_info_fetches_total{result=\"failure\"}",
    );
    assert!(failures.is_some_and(|n| n >= 1.0), "{metrics}");

    // /info recovers: held tokens over the capacity, following the script.
    tgi.set_info_down(false);
    let want = || {
        let held = tgi_held_tokens(tgi.state().kv_cache);
        vec![("tgi-0".to_string(), milli(held / f64::from(TGI_CAPACITY)))]
    };
    converges(&a, &kv, items, want);
    // external.metrics: the one pod's value is the selector's sum.
    converges(
        &a,
        &format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/serving_kv_cache_usage?labelSelector=replica%3Dt"
        ),
        items,
        || {
            let held = tgi_held_tokens(tgi.state().kv_cache);
            vec![(String::new(), milli(held / f64::from(TGI_CAPACITY)))]
        },
    );
    wait_for("the script's second step", DEADLINE, || {
        (tgi.elapsed() > Duration::from_secs(8)).then_some(())
    });
    assert_eq!(tgi.state().kv_cache, 0.55);
    converges(&a, &kv, items, want);
    // Known: no more /info requests while the pod is scraped on.
    let (asked, scrapes) = (tgi.info_requests(), tgi.scrapes());
    wait_for("five more scrapes", DEADLINE, || {
        (tgi.scrapes() >= scrapes + 5).then_some(())
    });
    assert_eq!(tgi.info_requests(), asked, "/info is not asked per scrape");
}
