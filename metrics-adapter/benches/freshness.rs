//! Freshness benchmark (issues 5 and 16): from a GPU sample to the adapter answering
//! with it, target ≤ 1 s p99 at the default flags (exporter `-c 1000`, adapter
//! `--scrape-interval 2s`).
//!
//! In process: the gpu-exporter's real HTTP layer (`gpu_exporter::serving::http::router` over a
//! `SnapshotStore`: the cached encoder, the snapshot generation header and the long
//! poll) serves snapshots that a sampler task publishes on its own 1 s tick, each
//! reading the GPU's utilisation at that instant, as the exporter's sampler does; the
//! adapter's real source loop (`source::scrape::run`) follows it; a poller asks the real
//! router (`tower::ServiceExt::oneshot`) for the pod's `gpu_utilization` every
//! millisecond until the new value is answered.
//!
//! Per trial the sampler restarts at a random phase and the value changes at a
//! uniformly random instant. Two latencies per trial:
//! - **sample → answer**: from the publication of the first snapshot carrying the new
//!   value (the end of the sampling cycle that read it) to the adapter answering it:
//!   what the adapter adds, the issue-16 target;
//! - **change → answer**: from the change itself, which also waits U(0, 1 s) for the
//!   exporter's next sample.
//!
//! Rows: the defaults (the adapter long-polls the exporter), and the same exporter
//! behind a layer that drops the long-poll parameter and the generation header, as an
//! exporter from before issue 16 (or dcgm-exporter) answers: the adapter falls back to
//! polling every `--scrape-interval`. Both rows run at the real intervals (the
//! adapter's batching window does not scale); `FRESHNESS_TRIALS` (default 100) long-poll
//! trials, `FRESHNESS_POLL_TRIALS` (default 40) polling ones.
//!
//! `cargo bench -p gpu-metrics-adapter --bench freshness` (~5 min)

mod common;

use arc_swap::ArcSwap;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Rng, machine, percentile};
use gpu_exporter::plan::counters;
use gpu_exporter::snapshot::{EntitySnapshot, Snapshot, SnapshotStore, Value};
use gpu_metrics_adapter::api::format_quantity;
use gpu_metrics_adapter::faces::http;
use gpu_metrics_adapter::fleet;
use gpu_metrics_adapter::query::AppState;
use gpu_metrics_adapter::source::pods::PodIndex;
use gpu_metrics_adapter::source::{exposition, scrape};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tower::ServiceExt;

const SAMPLE: Duration = Duration::from_secs(1);
const DEFAULT_SCRAPE: Duration = Duration::from_secs(2);
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1500);
const TARGET: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(1);
const QUERY: &str =
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/trainer-0/gpu_utilization";

/// The emulated GPU and the exporter's publications.
struct Gpu {
    util: AtomicU64,
    /// For each value: when the first snapshot carrying it was published.
    published: Mutex<Vec<(u64, Instant)>>,
}

/// A snapshot of one GPU held whole by pod ml/trainer-0, utilisation `util`.
fn snapshot(plan: &Arc<counters::ExportPlan>, util: u64) -> Snapshot {
    let mut snap = Snapshot::empty(plan.clone(), Arc::from(r#"version="bench""#));
    let now = Instant::now();
    snap.taken = now;
    snap.taken_at = SystemTime::now();
    snap.last_success = Some((now, snap.taken_at));
    snap.source_up = true;
    snap.entities.push(EntitySnapshot {
        labels: Arc::from(
            r#"gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-0",container="main",namespace="ml",pod="trainer-0""#,
        ),
        copies: None,
        is_gpu: true,
        up: true,
        last_xid: None,
        xids: Default::default(),
        processes: Vec::new(),
        exporter: None,
        shares: Vec::new(),
    });
    snap.values = plan
        .metrics
        .iter()
        .map(|m| match m.name {
            "DCGM_FI_DEV_GPU_UTIL" => Some(Value::Int(util as i64)),
            _ => Some(Value::Int(1)),
        })
        .collect();
    snap
}

/// The exporter's sampling loop: on every tick, read the GPU and publish a snapshot.
async fn sampler(
    gpu: Arc<Gpu>,
    store: Arc<SnapshotStore>,
    plan: Arc<counters::ExportPlan>,
    first: tokio::time::Instant,
    period: Duration,
) {
    let mut ticker = tokio::time::interval_at(first, period);
    loop {
        ticker.tick().await;
        let util = gpu.util.load(Ordering::SeqCst);
        store.store(Arc::new(snapshot(&plan, util)));
        let mut published = gpu.published.lock().expect("not poisoned");
        if published.last().is_none_or(|(v, _)| *v != util) {
            published.push((util, Instant::now()));
        }
    }
}

/// The pod's value as the adapter answers it now.
async fn answer(router: &axum::Router) -> Option<String> {
    let request = Request::get(QUERY).body(Body::empty()).ok()?;
    let response = router.clone().oneshot(request).await.ok()?;
    if response.status() != StatusCode::OK {
        return None;
    }
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v["items"][0]["value"].as_str().map(str::to_string)
}

/// Poll until the adapter answers `want`; the instant it did.
async fn wait_for(router: &axum::Router, want: u64, limit: Duration) -> Instant {
    let want = format_quantity(want as f64).expect("finite");
    let start = Instant::now();
    loop {
        if answer(router).await.as_deref() == Some(want.as_str()) {
            return Instant::now();
        }
        assert!(
            start.elapsed() < limit,
            "the adapter did not answer {want} within {limit:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

struct Config {
    name: &'static str,
    /// Whether the exporter speaks the long poll (else it answers as before issue 16).
    long_poll: bool,
    /// Divide the intervals by `FRESHNESS_SCALE`.
    scaled: bool,
}

struct Trial {
    from_sample: Duration,
    from_change: Duration,
}

/// An exporter on loopback serving `store`, as gpu-exporter does or (`long_poll`
/// false) as an exporter without the long poll would; its `/metrics` URL.
async fn start_exporter(store: Arc<SnapshotStore>, sample: Duration, long_poll: bool) -> String {
    let state = Arc::new(gpu_exporter::serving::http::AppState::new(
        store, sample, false,
    ));
    let mut app = gpu_exporter::serving::http::router(state);
    if !long_poll {
        app = app
            .layer(axum::middleware::map_request(
                |mut request: Request<Body>| async move {
                    let path = request.uri().path().to_string();
                    *request.uri_mut() = path.parse().expect("a path");
                    request
                },
            ))
            .layer(axum::middleware::map_response(
                |mut response: axum::response::Response| async move {
                    response
                        .headers_mut()
                        .remove(gpu_exporter::serving::http::GENERATION_HEADER);
                    response
                },
            ));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}/metrics", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// `trials` value changes with `cfg`, at intervals divided by `scale`.
async fn run_config(cfg: &Config, scale: u32, trials: usize, rng: &mut Rng) -> Vec<Trial> {
    let (sample, scrape, timeout) = (
        SAMPLE / scale,
        DEFAULT_SCRAPE / scale,
        DEFAULT_TIMEOUT / scale,
    );
    let (plan, _) = counters::plan(counters::DEFAULT_COUNTERS, "default").expect("plan");
    let plan = Arc::new(plan);
    let gpu = Arc::new(Gpu {
        util: AtomicU64::new(9),
        published: Mutex::new(Vec::new()),
    });
    let store = Arc::new(SnapshotStore::new(snapshot(&plan, 9)));
    let url = start_exporter(store.clone(), sample, cfg.long_poll).await;
    let fleet = Arc::new(ArcSwap::from_pointee(fleet::Fleet::default()));
    let opts = scrape::ScrapeOptions {
        targets: Arc::new(ArcSwap::from_pointee(vec![url])),
        interval: scrape,
        timeout,
        accept: exposition::ACCEPT,
        auth: Default::default(),
        metrics: Default::default(),
        limits: Default::default(),
    };
    let client = scrape::client(&opts).expect("scrape client");
    let scraper = tokio::spawn(scrape::run(opts, client, exposition::decode, fleet.clone()));
    let router = http::router(Arc::new(AppState {
        fleet,
        serving: Default::default(),
        pods: Arc::new(ArcSwap::from_pointee(PodIndex::default())),
        staleness: scrape * 3,
        window_seconds: scrape.as_secs().max(1),
        catalog: Default::default(),
        signals: gpu_metrics_adapter::source::signal::handle(),
    }));
    let limit = (sample + scrape) * 5;
    let start_sampler = |first| {
        tokio::spawn(sampler(
            gpu.clone(),
            store.clone(),
            plan.clone(),
            first,
            sample,
        ))
    };
    let mut task = start_sampler(tokio::time::Instant::now());
    wait_for(&router, 9, limit * 4).await;
    let mut out = Vec::with_capacity(trials);
    for t in 0..trials {
        // A sampler at a random phase, and a change at a random instant over a whole
        // period of the pattern (the scrape interval is a multiple of the sampling one).
        task.abort();
        task = start_sampler(tokio::time::Instant::now() + sample.mul_f64(rng.unit()));
        let pattern = if cfg.long_poll { sample } else { scrape };
        tokio::time::sleep(pattern.mul_f64(rng.unit())).await;
        let value = 10 + (t as u64 % 80);
        gpu.util.store(value, Ordering::SeqCst);
        let changed = Instant::now();
        let seen = wait_for(&router, value, limit).await;
        let sampled = gpu
            .published
            .lock()
            .expect("not poisoned")
            .iter()
            .rev()
            .find(|(v, at)| *v == value && *at >= changed)
            .map(|(_, at)| *at)
            .expect("the value was published before it was answered");
        out.push(Trial {
            from_sample: seen - sampled,
            from_change: seen - changed,
        });
    }
    task.abort();
    scraper.abort();
    out
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

fn main() {
    let scale = env_number("FRESHNESS_SCALE", 10) as u32;
    let trials = env_number("FRESHNESS_TRIALS", 100) as usize;
    let poll_trials = env_number("FRESHNESS_POLL_TRIALS", 40) as usize;
    let configs = [
        Config {
            name: "defaults (`-c 1000`, `--scrape-interval 2s`): long poll",
            long_poll: true,
            scaled: false,
        },
        Config {
            name: "the same flags, exporter without the long poll (before issue 16; dcgm-exporter): polled every 2 s",
            long_poll: false,
            // The adapter's 200 ms batching does not scale with the intervals: at 1/10
            // it would weigh 10 times too much.
            scaled: false,
        },
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("adapter")
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let results = rt
        .block_on(rt.spawn(async move {
            let mut rng = Rng(0x00f7_e540);
            let mut out = Vec::new();
            for cfg in &configs {
                let s = if cfg.scaled { scale } else { 1 };
                let trials = if cfg.long_poll { trials } else { poll_trials };
                eprintln!(
                    "freshness: {} ({trials} trials at 1/{s} of the intervals)…",
                    cfg.name
                );
                out.push((cfg.name, s, run_config(cfg, s, trials, &mut rng).await));
            }
            out
        }))
        .expect("benchmark task");

    println!("\n## gpu-metrics-adapter freshness: GPU sample → adapter answer\n");
    println!("Machine: {}", machine());
    println!(
        "In process: gpu-exporter's `http::router` over a `SnapshotStore` (1 GPU, default counters, a sampler task publishing every {SAMPLE:?}) → `source::scrape::run` (defaults: interval {DEFAULT_SCRAPE:?}, timeout {DEFAULT_TIMEOUT:?}) → `http::router` polled every {POLL:?} via `oneshot`. {trials} long-poll and {poll_trials} polling trials; sampler phase and change instant random per trial. Scaled rows ran at 1/N of the intervals and are shown × N.\n"
    );
    println!(
        "| Exporter, adapter flags | Sample → answer: p50 / p99 / max | Change → answer: p50 / p99 / max | Target: sample → answer p99 ≤ 1 s | "
    );
    println!("|---|---|---|---|");
    for (name, s, trials) in results {
        let up = |d: Duration| d.as_secs_f64() * f64::from(s);
        let stats = |mut v: Vec<Duration>| {
            v.sort();
            (
                up(percentile(&v, 50.0)),
                up(percentile(&v, 99.0)),
                up(*v.last().expect("trials")),
            )
        };
        let from_sample = stats(trials.iter().map(|t| t.from_sample).collect());
        let from_change = stats(trials.iter().map(|t| t.from_change).collect());
        println!(
            "| {name}{} | {:.3} / {:.3} / {:.3} s | {:.3} / {:.3} / {:.3} s | {} |",
            if s > 1 {
                format!(" (at 1/{s}, × {s})")
            } else {
                String::new()
            },
            from_sample.0,
            from_sample.1,
            from_sample.2,
            from_change.0,
            from_change.1,
            from_change.2,
            if from_sample.1 <= TARGET.as_secs_f64() {
                "pass"
            } else {
                "FAIL"
            }
        );
    }
    println!(
        "\nPolling, a sample waits U(0, scrape interval) for the next scrape: p99 ≈ 0.99 × 2 s at the defaults, whatever the adapter costs. Long-polling, the exporter answers the held request when it publishes, so a sample costs one response, one decode, at most {:?} of batching and the query.",
        scrape::COALESCE
    );
}
