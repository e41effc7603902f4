//! Scale benchmark (issue 5): 1,250 simulated exporters with 8 GPUs each (10,000 GPUs,
//! each held whole by a pod), served by one in-process axum server with pre-encoded
//! protobuf bodies; the real scrape loop (`source::run`, 2 s interval, 1.5 s timeout,
//! 2-worker runtime as the adapter) scrapes them, and queries go through the real
//! router (`tower::ServiceExt::oneshot`, no socket) while scraping goes on.
//!
//! Targets: query p99 ≤ 2 ms, RSS ≤ 200 MiB, a scrape round within the interval on
//! ≤ 1 core.
//!
//! The fake fleet shares the process, so costs are split by thread: every runtime names
//! its threads (`adapter`, `fake-fleet`, `client`) and CPU time is read per thread from
//! `/proc/self/task/*/stat`. A child process (this binary again, `--baseline-child`)
//! runs the same fake fleet with a plain HTTP client fetching the same 1,250 bodies per
//! round without decoding them: the transport floor the adapter's cost is compared with.
//!
//! `cargo bench -p gpu-metrics-adapter --bench fleet` (~70 s).

mod common;

use arc_swap::ArcSwap;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use common::{CONTENT_TYPE, Gpu, Holder, Reading, exporter_body, machine, percentile};
use futures_util::StreamExt;
use gpu_metrics_adapter::pods::{PodIndex, PodInfo, Workload};
use gpu_metrics_adapter::{exposition, http, source};
use http_body_util::{BodyExt, Empty, Limited};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

const EXPORTERS: usize = 1250;
const GPUS: u32 = 8;
const INTERVAL: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_millis(1500);
/// Rounds before measuring (RSS is read after these), then rounds measured.
const WARMUP_ROUNDS: usize = 5;
const MEASURED_ROUNDS: usize = 10;
const BASELINE_WARMUP: usize = 2;
const BASELINE_ROUNDS: usize = 5;
const QUERIES: usize = 10_000;
/// As the adapter's scrape loop.
const CONCURRENCY: usize = 256;
const MIB: f64 = 1024.0 * 1024.0;

fn runtime(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

// ---- the fake fleet -------------------------------------------------------------------

fn holder(i: usize, g: u32) -> Holder {
    Holder {
        namespace: format!("ns-{}", i % 50),
        pod: format!("pod-{i}-{g}"),
        app: format!("app-{}", i % 200),
    }
}

struct FakeFleet {
    _runtime: tokio::runtime::Runtime,
    urls: Vec<String>,
    body_bytes: usize,
}

async fn serve_body(State(bodies): State<Arc<Vec<Bytes>>>, Path(i): Path<usize>) -> Response {
    match bodies.get(i) {
        Some(b) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], b.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn fake_fleet() -> FakeFleet {
    let bodies: Vec<Bytes> = (0..EXPORTERS)
        .map(|i| {
            let gpus: Vec<Gpu> = (0..GPUS)
                .map(|g| Gpu::new(i, g, Some(holder(i, g))))
                .collect();
            let body = exporter_body(&format!("gpu-node-{i:04}.example.internal"), &gpus, |g| {
                Reading::varied(i as u64 * 8 + u64::from(g.index))
            });
            Bytes::from(body)
        })
        .collect();
    let body_bytes = bodies.iter().map(Bytes::len).sum();
    let rt = runtime("fake-fleet");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let app = axum::Router::new()
        .route("/e/{i}/metrics", axum::routing::get(serve_body))
        .with_state(Arc::new(bodies));
    rt.spawn(async move { axum::serve(listener, app).await });
    FakeFleet {
        _runtime: rt,
        urls: (0..EXPORTERS)
            .map(|i| format!("http://{addr}/e/{i}/metrics"))
            .collect(),
        body_bytes,
    }
}

// ---- /proc ------------------------------------------------------------------------------

/// USER_HZ, the unit of `utime` and `stime` (100 on every Linux ABI in use).
const CLK_TCK: f64 = 100.0;

/// (comm, utime + stime in seconds) from a `stat` line.
fn parse_stat(line: &str) -> Option<(String, f64)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let fields: Vec<&str> = line.get(close + 2..)?.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); the slice starts at field 3.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((line[open + 1..close].to_string(), (utime + stime) / CLK_TCK))
}

/// CPU seconds per thread name, and of the whole process (exited threads included).
#[derive(Debug, Clone, Default)]
struct Cpu {
    by_name: HashMap<String, f64>,
    process: f64,
}

impl Cpu {
    fn now() -> Cpu {
        let mut by_name = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for task in dir.flatten() {
                let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                if let Some((name, s)) = parse_stat(&stat) {
                    *by_name.entry(name).or_insert(0.0) += s;
                }
            }
        }
        let process = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .map_or(0.0, |(_, s)| s);
        Cpu { by_name, process }
    }

    fn of(&self, name: &str) -> f64 {
        self.by_name.get(name).copied().unwrap_or(0.0)
    }

    /// Seconds spent between `self` and `later` by threads named `name`.
    fn spent(&self, later: &Cpu, name: &str) -> f64 {
        later.of(name) - self.of(name)
    }
}

/// A `/proc/self/status` figure in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib * 1024.0)
}

// ---- the transport baseline (child process) -------------------------------------------

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Empty<Bytes>,
>;

/// What `source::scrape_one` does, less decoding: GET, check, read the body.
async fn fetch(client: &Client, url: &str) -> Result<usize, String> {
    let request = Request::get(url)
        .header(header::ACCEPT, exposition::ACCEPT)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let work = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let body = Limited::new(response.into_body(), 16 * 1024 * 1024)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(body.len())
    };
    tokio::time::timeout(TIMEOUT, work)
        .await
        .map_err(|_| "timeout".to_string())?
}

fn baseline_child() {
    let fleet = fake_fleet();
    let rss_fleet = status_bytes("VmRSS");
    let rt = runtime("client");
    let urls = fleet.urls.clone();
    let (rounds, cpu_a, cpu_b, wall, failures) = rt
        .block_on(rt.spawn(async move {
            let client: Client = hyper_util::client::legacy::Client::builder(
                hyper_util::rt::TokioExecutor::new(),
            )
            .pool_idle_timeout(INTERVAL * 4)
            .build_http();
            let mut ticker = tokio::time::interval(INTERVAL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut rounds = Vec::new();
            let (mut cpu_a, mut t_a) = (Cpu::default(), Instant::now());
            let mut failures = 0;
            for r in 0..BASELINE_WARMUP + BASELINE_ROUNDS {
                ticker.tick().await;
                let start = Instant::now();
                let results: Vec<Result<usize, String>> = futures_util::stream::iter(&urls)
                    .map(|url| fetch(&client, url))
                    .buffer_unordered(CONCURRENCY)
                    .collect()
                    .await;
                let end = Instant::now();
                if r + 1 > BASELINE_WARMUP {
                    rounds.push(end - start);
                    failures += results.iter().filter(|r| r.is_err()).count();
                }
                if r + 1 == BASELINE_WARMUP {
                    (cpu_a, t_a) = (Cpu::now(), end);
                }
                if r + 1 == BASELINE_WARMUP + BASELINE_ROUNDS {
                    return (rounds, cpu_a, Cpu::now(), end - t_a, failures);
                }
            }
            unreachable!()
        }))
        .expect("baseline rounds");
    let wall = wall.as_secs_f64();
    let max_round = rounds.iter().max().copied().unwrap_or_default();
    println!("client_cores {}", cpu_a.spent(&cpu_b, "client") / wall);
    println!("server_cores {}", cpu_a.spent(&cpu_b, "fake-fleet") / wall);
    println!("process_cores {}", (cpu_b.process - cpu_a.process) / wall);
    println!("max_round_s {}", max_round.as_secs_f64());
    println!("failures {failures}");
    println!("rss_fleet {rss_fleet}");
    println!("hwm {}", status_bytes("VmHWM"));
}

fn run_baseline() -> HashMap<String, f64> {
    let exe = std::env::current_exe().expect("this benchmark's path");
    let out = std::process::Command::new(exe)
        .arg("--baseline-child")
        .output()
        .expect("run the baseline child");
    assert!(
        out.status.success(),
        "baseline child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

// ---- queries ----------------------------------------------------------------------------

const KINDS: [&str; 4] = [
    "pods/* labelSelector (custom v1beta2)",
    "one pod (custom v1beta2)",
    "external, labelSelector",
    "deployments.apps object (custom v1beta2)",
];

/// The four queries of round `n`, rotating over apps, namespaces and pods.
fn uris(n: usize) -> [String; 4] {
    let k = (n * 7) % 200;
    let ns = format!("ns-{}", k % 50);
    let i = k + 200 * (n % (EXPORTERS / 200));
    let g = n % GPUS as usize;
    [
        format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/gpu_utilization?labelSelector=app%3Dapp-{k}"
        ),
        format!("/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/pod-{i}-{g}/gpu_utilization"),
        format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/gpu_utilization?labelSelector=app%3Dapp-{k}"
        ),
        format!("/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/deployments.apps/app-{k}/gpu_utilization"),
    ]
}

/// Items each query of round `n` must answer with.
fn expected_items(n: usize) -> [usize; 4] {
    let k = (n * 7) % 200;
    let selected = (0..EXPORTERS).filter(|i| i % 200 == k).count() * GPUS as usize;
    [selected, 1, selected, 1]
}

async fn run_queries(router: axum::Router) -> Result<[Vec<Duration>; 4], String> {
    let mut latencies: [Vec<Duration>; 4] = Default::default();
    for n in 0..QUERIES {
        let expected = expected_items(n);
        for (kind, uri) in uris(n).into_iter().enumerate() {
            let request = Request::get(&uri).body(Body::empty()).expect("a request");
            let start = Instant::now();
            let response = router.clone().oneshot(request).await.expect("infallible");
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .map_err(|e| e.to_string())?;
            let elapsed = start.elapsed();
            if status != StatusCode::OK {
                return Err(format!(
                    "{uri}: {status}: {}",
                    String::from_utf8_lossy(&body)
                ));
            }
            if n < 200 {
                let v: serde_json::Value =
                    serde_json::from_slice(&body).map_err(|e| e.to_string())?;
                let items = v["items"].as_array().map_or(0, Vec::len);
                if items != expected[kind] {
                    return Err(format!("{uri}: {items} items, not {}", expected[kind]));
                }
            }
            latencies[kind].push(elapsed);
        }
    }
    Ok(latencies)
}

fn pod_index() -> PodIndex {
    let mut index = PodIndex {
        synced: true,
        up: true,
        ..PodIndex::default()
    };
    for i in 0..EXPORTERS {
        let app = format!("app-{}", i % 200);
        let hash = format!("{:x}", 0x5c0f_fee0 + i % 200);
        for g in 0..GPUS {
            let h = holder(i, g);
            index.pods.insert(
                (h.namespace, h.pod),
                PodInfo {
                    labels: [
                        ("app".to_string(), app.clone()),
                        ("pod-template-hash".to_string(), hash.clone()),
                    ]
                    .into(),
                    workloads: vec![
                        Workload {
                            resource: "replicasets.apps",
                            name: format!("{app}-{hash}"),
                        },
                        Workload {
                            resource: "deployments.apps",
                            name: app.clone(),
                        },
                    ],
                },
            );
        }
    }
    index
}

// ---- the run --------------------------------------------------------------------------

struct Round {
    published: Instant,
    last_answer: Option<Instant>,
    answered: usize,
    targets: usize,
    pods: usize,
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "pass" } else { "FAIL" }
}

fn main() {
    if std::env::args().any(|a| a == "--baseline-child") {
        baseline_child();
        return;
    }
    eprintln!("fleet: transport baseline in a child process (~15 s)…");
    let baseline = run_baseline();
    let b = |k: &str| baseline.get(k).copied().unwrap_or(f64::NAN);

    eprintln!("fleet: encoding {EXPORTERS} exporter bodies and serving them…");
    let fake = fake_fleet();
    let rss_fleet = status_bytes("VmRSS");

    let rt = runtime("adapter");
    let fleet = Arc::new(ArcSwap::from_pointee(source::Fleet::default()));
    let state = Arc::new(http::AppState {
        fleet: fleet.clone(),
        pods: Arc::new(ArcSwap::from_pointee(pod_index())),
        staleness: INTERVAL * 3,
        window_seconds: INTERVAL.as_secs(),
    });
    let opts = source::ScrapeOptions {
        targets: fake.urls.clone(),
        interval: INTERVAL,
        timeout: TIMEOUT,
        accept: exposition::ACCEPT,
    };
    eprintln!(
        "fleet: scraping {} rounds of {EXPORTERS} exporters…",
        WARMUP_ROUNDS + MEASURED_ROUNDS
    );
    let t0 = Instant::now();
    let _scraper = rt.spawn(source::run(opts, exposition::decode, fleet.clone()));

    // Watch publications from this (main) thread; a round starts on the loop's tick.
    let mut rounds: Vec<Round> = Vec::new();
    let mut seen = Arc::as_ptr(&*fleet.load());
    let (mut cpu_a, mut cpu_b) = (Cpu::default(), Cpu::default());
    let (mut rss_5, mut hwm_5) = (0.0, 0.0);
    while rounds.len() < WARMUP_ROUNDS + MEASURED_ROUNDS {
        std::thread::sleep(Duration::from_millis(1));
        let f = fleet.load();
        let p = Arc::as_ptr(&*f);
        if p == seen {
            continue;
        }
        seen = p;
        rounds.push(Round {
            published: Instant::now(),
            last_answer: f.last_answer,
            answered: f.answered,
            targets: f.targets,
            pods: f.pods.len(),
        });
        drop(f);
        if rounds.len() == WARMUP_ROUNDS {
            cpu_a = Cpu::now();
            rss_5 = status_bytes("VmRSS");
            hwm_5 = status_bytes("VmHWM");
        }
        if rounds.len() == WARMUP_ROUNDS + MEASURED_ROUNDS {
            cpu_b = Cpu::now();
        }
    }
    // The loop's ticker (Delay on missed ticks): start_k = max(end_{k-1}, start_{k-1} + interval).
    let mut starts = vec![t0];
    for k in 1..rounds.len() {
        starts.push(rounds[k - 1].published.max(starts[k - 1] + INTERVAL));
    }
    let durations: Vec<Duration> = rounds
        .iter()
        .zip(&starts)
        .map(|(r, s)| r.published - *s)
        .collect();
    let fetch_phase: Vec<Duration> = rounds
        .iter()
        .zip(&starts)
        .map(|(r, s)| r.last_answer.map_or(Duration::ZERO, |a| a - *s))
        .collect();
    let measured = &rounds[WARMUP_ROUNDS..];
    let wall = (rounds.last().expect("rounds").published - rounds[WARMUP_ROUNDS - 1].published)
        .as_secs_f64();
    let adapter_cores = cpu_a.spent(&cpu_b, "adapter") / wall;
    let server_cores = cpu_a.spent(&cpu_b, "fake-fleet") / wall;
    let process_cores = (cpu_b.process - cpu_a.process) / wall;
    let all_answered = measured
        .iter()
        .all(|r| r.answered == EXPORTERS && r.targets == EXPORTERS);
    let pods = measured.last().map_or(0, |r| r.pods);
    let mut sorted: Vec<Duration> = durations[WARMUP_ROUNDS..].to_vec();
    sorted.sort();
    let max_round = *sorted.last().expect("rounds");
    let mut fetch_sorted: Vec<Duration> = fetch_phase[WARMUP_ROUNDS..].to_vec();
    fetch_sorted.sort();

    eprintln!(
        "fleet: {} queries through the router while scraping goes on…",
        QUERIES * 4
    );
    let router = http::router(state);
    let q_start = Instant::now();
    let latencies = rt
        .block_on(rt.spawn(run_queries(router)))
        .expect("query task")
        .unwrap_or_else(|e| panic!("query failed: {e}"));
    let q_wall = q_start.elapsed();
    let hwm_end = status_bytes("VmHWM");
    let rss_end = status_bytes("VmRSS");
    let after_queries = fleet.load();
    let fresh_at_end = after_queries.answered == EXPORTERS;
    drop(after_queries);

    // ---- report ----
    let adapter_rss = rss_5 - rss_fleet;
    let adapter_hwm = hwm_end - rss_fleet;
    println!("\n## gpu-metrics-adapter fleet scale (issue 5)\n");
    println!("Machine: {}", machine());
    println!(
        "Fleet: {EXPORTERS} exporters × {GPUS} GPUs = {} GPUs, each held whole by a pod; {} families × {GPUS} series per body, {:.1} KB per body, {:.1} MB per round; one in-process axum server on 127.0.0.1, {CONCURRENCY} concurrent scrapes (connections are pooled per host, so ≤ {CONCURRENCY} loopback connections).",
        EXPORTERS * GPUS as usize,
        common::FAMILIES.len(),
        fake.body_bytes as f64 / EXPORTERS as f64 / 1e3,
        fake.body_bytes as f64 / 1e6
    );
    println!(
        "Scrape: `source::run`, interval {INTERVAL:?}, timeout {TIMEOUT:?}, 2-worker runtime; {WARMUP_ROUNDS} warm-up rounds, then {MEASURED_ROUNDS} measured ({wall:.1} s). Queries: `http::router` via `tower::ServiceExt::oneshot` (no socket), body read to the end, on the adapter runtime while scraping goes on, kinds interleaved, {QUERIES} each.\n"
    );
    println!("| Figure | Measured | Target | Result |");
    println!("|---|---|---|---|");
    println!(
        "| Exporters answered, pods in snapshot | {}/{EXPORTERS} every measured round, {pods} pods | all | {} |",
        measured.iter().map(|r| r.answered).min().unwrap_or(0),
        verdict(all_answered && pods == EXPORTERS * GPUS as usize)
    );
    println!(
        "| Scrape round, tick → publication: p50 / max | {:.3} s / {:.3} s (first, cold: {:.3} s) | ≤ 2 s | {} |",
        percentile(&sorted, 50.0).as_secs_f64(),
        max_round.as_secs_f64(),
        durations[0].as_secs_f64(),
        verdict(max_round <= INTERVAL)
    );
    println!(
        "| … of which fetch + decode (tick → last answer): p50 / max | {:.3} s / {:.3} s | — | — |",
        percentile(&fetch_sorted, 50.0).as_secs_f64(),
        fetch_sorted.last().expect("rounds").as_secs_f64(),
    );
    println!(
        "| Adapter CPU (`adapter` threads ÷ wall) | {adapter_cores:.3} cores ({:.3} core-s per round) | ≤ 1 core | {} |",
        adapter_cores * INTERVAL.as_secs_f64(),
        verdict(adapter_cores <= 1.0)
    );
    println!(
        "| Transport floor: plain client, same fetches, no decode (child process) | {:.3} cores, max round {:.3} s, {} failures | — | adapter ÷ floor = {:.1}× |",
        b("client_cores"),
        b("max_round_s"),
        b("failures"),
        adapter_cores / b("client_cores")
    );
    println!(
        "| Fake fleet server (`fake-fleet` threads; not the adapter) | {server_cores:.3} cores (baseline run: {:.3}) | — | — |",
        b("server_cores")
    );
    println!(
        "| Whole process (adapter + fake fleet + probe) | {process_cores:.3} cores (baseline process: {:.3}) | — | — |",
        b("process_cores")
    );
    println!(
        "| RSS of the fake fleet alone (bodies + server, before scraping) | {:.1} MiB | — | — |",
        rss_fleet / MIB
    );
    println!(
        "| Adapter RSS after {WARMUP_ROUNDS} rounds (process VmRSS {:.1} MiB − fake fleet) | {:.1} MiB | ≤ 200 MiB | {} |",
        rss_5 / MIB,
        adapter_rss / MIB,
        verdict(adapter_rss <= 200.0 * MIB)
    );
    println!(
        "| Adapter peak (process VmHWM {:.1} MiB at the end − fake fleet; VmHWM after {WARMUP_ROUNDS} rounds {:.1} MiB; baseline process VmHWM {:.1} MiB) | {:.1} MiB | ≤ 200 MiB | {} |",
        hwm_end / MIB,
        hwm_5 / MIB,
        b("hwm") / MIB,
        adapter_hwm / MIB,
        verdict(adapter_hwm <= 200.0 * MIB)
    );
    let mut all_ok = true;
    for (kind, lat) in KINDS.iter().zip(latencies) {
        let mut l = lat;
        l.sort();
        let p99 = percentile(&l, 99.0);
        all_ok &= p99 <= Duration::from_millis(2);
        println!(
            "| Query {kind}: p50 / p99 / max | {} / {} / {} | p99 ≤ 2 ms | {} |",
            ms(percentile(&l, 50.0)),
            ms(p99),
            ms(*l.last().expect("queries")),
            verdict(p99 <= Duration::from_millis(2))
        );
    }
    println!(
        "\nQueries took {:.1} s in all ({:.0} queries/s, {} scrape rounds overlapped them); process VmRSS at the end {:.1} MiB; every query answered 200 with the expected item count{}.",
        q_wall.as_secs_f64(),
        (QUERIES * 4) as f64 / q_wall.as_secs_f64(),
        (q_wall.as_secs_f64() / INTERVAL.as_secs_f64()).floor(),
        rss_end / MIB,
        if fresh_at_end {
            ", and the last round still had every exporter"
        } else {
            "; the last round did NOT have every exporter"
        }
    );
    if !all_ok {
        println!("Some query kind missed its p99 target.");
    }
}
