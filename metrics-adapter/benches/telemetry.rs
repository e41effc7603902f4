//! What the adapter's self-metrics cost.
//!
//! - Per request: the real `telemetry::track_http` layer (a counter and a histogram per
//!   request) in front of a handler that answers at once, against the same router
//!   without it (the baseline), in the same process.
//! - Per `/metrics` scrape: encoding every family, with the source gauges computed over
//!   a fleet of 10,000 fresh pods (the issue-5 scale target) and 4 API label sets in use.
//!
//! `cargo bench -p gpu-metrics-adapter --bench telemetry`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use gpu_metrics_adapter::faces::telemetry::{self, Telemetry};
use gpu_metrics_adapter::fleet::{Fleet, Observed};
use gpu_metrics_adapter::fleet::{GpuMetric, PodValues};
use tower::ServiceExt;

const PATH: &str =
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization";
const PODS: usize = 10_000;

fn fleet() -> Fleet {
    let now = Instant::now();
    let pods: BTreeMap<_, _> = (0..PODS)
        .map(|i| {
            let values = PodValues {
                values: BTreeMap::from([(GpuMetric::ALL[0], 50.0)]),
            };
            let observed = Observed {
                values,
                at: SystemTime::now(),
                seen: now,
            };
            ((format!("ns-{}", i % 50), format!("pod-{i}")), observed)
        })
        .collect();
    Fleet {
        pods,
        targets: 1_250,
        answered: 1_250,
        last_answer: Some(now),
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fleet = Arc::new(ArcSwap::from_pointee(fleet()));
    let t = Arc::new(Telemetry::new(fleet, Duration::from_secs(6)));
    let plain = axum::Router::new().route(
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/{name}/{metric}",
        get(|| async { "ok" }),
    );
    let tracked = plain.clone().layer(axum::middleware::from_fn_with_state(
        t.clone(),
        telemetry::track_http,
    ));
    let request = || Request::get(PATH).body(Body::empty()).expect("request");
    for router in [&plain, &tracked] {
        let status = runtime
            .block_on(router.clone().oneshot(request()))
            .expect("infallible")
            .status();
        assert_eq!(status, 200);
    }
    // Label sets a running adapter has: several APIs and codes.
    for path in ["/readyz", "/apis", "/metrics", "/nope"] {
        runtime
            .block_on(
                tracked
                    .clone()
                    .oneshot(Request::get(path).body(Body::empty()).expect("r")),
            )
            .expect("infallible");
    }

    let mut group = c.benchmark_group("telemetry");
    group.bench_function("request_baseline_no_layer", |b| {
        b.iter(|| {
            runtime
                .block_on(plain.clone().oneshot(request()))
                .expect("infallible")
        })
    });
    group.bench_function("request_with_track_http", |b| {
        b.iter(|| {
            runtime
                .block_on(tracked.clone().oneshot(request()))
                .expect("infallible")
        })
    });
    group.bench_function("encode_metrics_10k_pods", |b| {
        b.iter(|| t.encode().expect("encodes"))
    });
    group.finish();
    let text = t.encode().expect("encodes");
    assert!(
        text.contains(&format!("gpu_metrics_adapter_pods_fresh {PODS}\n")),
        "{text}"
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
