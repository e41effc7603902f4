//! Scale benchmark (issues 5 and 16): 1,250 simulated exporters with 8 GPUs each
//! (10,000 GPUs, each held whole by a pod), served by one axum server with pre-encoded
//! protobuf bodies. Each fake exporter publishes a new snapshot every second at its own
//! phase and speaks the exporter's long poll (`X-Snapshot-Generation`, `?newer_than=`,
//! held until its next publication, `304` after `wait`); the real source loop
//! (`source::scrape::run` at the defaults: 2 s interval, 1.5 s timeout, 2-worker
//! runtime as the adapter) follows them all, and queries go through the real router
//! (`tower::ServiceExt::oneshot`, no socket).
//!
//! Targets: query p99 ≤ 2 ms, RSS ≤ 200 MiB, ≤ 1 core, every exporter's data refreshed
//! within the 2 s interval; and (issue 16) sample → adapter publication well under 1 s.
//!
//! Three processes, all this binary, so each one's CPU and RSS are its own:
//! - `--fake-fleet`: the one server (`/e/{i}/metrics` on 127.0.0.1:0), its own
//!   2-worker runtime; it lives until its stdin closes;
//! - `--baseline-client`: a plain HTTP client fetching the same 1,250 bodies every
//!   second (the bytes the long poll brings), without decoding: the transport floor;
//! - the parent: the adapter's scrape loop, pod index and router, and the measurements.
//!
//! Queries run twice: while scraping goes on (what a client sees), and with the scrape
//! loop stopped (the query path alone; the snapshot is kept fresh by a long staleness).
//!
//! `cargo bench -p gpu-metrics-adapter --bench fleet` (~2 min).

mod common;

use arc_swap::ArcSwap;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use common::{CONTENT_TYPE, Gpu, Holder, Reading, exporter_body, machine, percentile};
use futures_util::StreamExt;
use gpu_metrics_adapter::faces::http;
use gpu_metrics_adapter::fleet;
use gpu_metrics_adapter::query::AppState;
use gpu_metrics_adapter::source::pods::{PodIndex, PodInfo, Workload};
use gpu_metrics_adapter::source::{exposition, scrape};
use http_body_util::{BodyExt, Empty, Limited};
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

const EXPORTERS: usize = 1250;
const GPUS: u32 = 8;
const INTERVAL: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_millis(1500);
/// How often each fake exporter publishes (the exporter's default `-c 1000`).
const SAMPLING: Duration = Duration::from_secs(1);
/// Seconds before measuring (RSS is read after these), then seconds measured.
const WARMUP: Duration = Duration::from_secs(10);
const MEASURED: Duration = Duration::from_secs(20);
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

// ---- /proc ------------------------------------------------------------------------------

/// USER_HZ, the unit of `utime` and `stime` (100 on every Linux ABI in use).
const CLK_TCK: f64 = 100.0;

/// (comm, utime + stime in seconds) from a `stat` line.
fn parse_stat(line: &str) -> Option<(String, f64)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let fields: Vec<&str> = line.get(close + 2..)?.split_whitespace().collect();
    // Fields 14 and 15 of proc_pid_stat(5); the slice starts at field 3.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((line[open + 1..close].to_string(), (utime + stime) / CLK_TCK))
}

/// CPU seconds of a whole process (`self` or a pid), exited threads included.
fn process_cpu(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .map_or(0.0, |(_, s)| s)
}

/// CPU seconds of this process's live threads named `name`.
fn threads_cpu(name: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s))
        .filter(|(comm, _)| comm == name)
        .map(|(_, s)| s)
        .sum()
}

/// A `/proc/{pid}/status` figure in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib * 1024.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

// ---- the fake fleet (child process) ------------------------------------------------------

fn holder(i: usize, g: u32) -> Holder {
    Holder {
        namespace: format!("ns-{}", i % 50),
        pod: format!("pod-{i}-{g}"),
        app: format!("app-{}", i % 200),
    }
}

fn node_body(i: usize) -> Vec<u8> {
    let gpus: Vec<Gpu> = (0..GPUS)
        .map(|g| Gpu::new(i, g, Some(holder(i, g))))
        .collect();
    exporter_body(&format!("gpu-node-{i:04}.example.internal"), &gpus, |g| {
        Reading::varied(i as u64 * 8 + u64::from(g.index))
    })
}

/// The fake fleet: every exporter's body, and when the fleet started (exporter `i`
/// publishes at `start + i / EXPORTERS s + k s`, generation `k + 1`).
struct Bodies {
    bodies: Vec<Bytes>,
    start: tokio::time::Instant,
}

impl Bodies {
    /// Exporter `i`'s generation at `now`, and when the next one is published.
    fn generation(&self, i: usize, now: tokio::time::Instant) -> (u64, tokio::time::Instant) {
        let phase = SAMPLING.mul_f64(i as f64 / EXPORTERS as f64);
        let since = now.saturating_duration_since(self.start + phase);
        let k = (since.as_secs_f64() / SAMPLING.as_secs_f64()).floor() as u64;
        let next = self.start + phase + SAMPLING * (k as u32 + 1);
        (k + 1, next)
    }
}

/// One exporter's `/metrics`, with the long poll as gpu-exporter answers it.
async fn serve_body(
    State(fleet): State<Arc<Bodies>>,
    Path(i): Path<usize>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(body) = fleet.bodies.get(i) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let query = query.unwrap_or_default();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
    };
    let (mut generation, next) = fleet.generation(i, tokio::time::Instant::now());
    if param("newer_than") == Some(generation.to_string().as_str()) {
        let wait = param("wait")
            .and_then(|w| w.strip_suffix("ms")?.parse().ok())
            .map_or(SAMPLING * 2, Duration::from_millis)
            .min(SAMPLING * 2);
        let deadline = tokio::time::Instant::now() + wait;
        if next > deadline {
            tokio::time::sleep_until(deadline).await;
            return (
                StatusCode::NOT_MODIFIED,
                [(scrape::GENERATION_HEADER, generation.to_string())],
            )
                .into_response();
        }
        tokio::time::sleep_until(next).await;
        generation += 1;
    }
    (
        [
            (header::CONTENT_TYPE, CONTENT_TYPE.to_string()),
            (
                header::HeaderName::from_static(scrape::GENERATION_HEADER),
                generation.to_string(),
            ),
        ],
        body.clone(),
    )
        .into_response()
}

/// Serve every exporter's body until stdin closes; first prints `addr bytes start`
/// (start in Unix nanoseconds).
fn fake_fleet_child() {
    let bodies: Vec<Bytes> = (0..EXPORTERS).map(|i| Bytes::from(node_body(i))).collect();
    let bytes: usize = bodies.iter().map(Bytes::len).sum();
    let rt = runtime("fake-fleet");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let (start, wall) = (
        rt.block_on(async { tokio::time::Instant::now() }),
        std::time::SystemTime::now(),
    );
    let app = axum::Router::new()
        .route("/e/{i}/metrics", axum::routing::get(serve_body))
        .with_state(Arc::new(Bodies { bodies, start }));
    rt.spawn(async move { axum::serve(listener, app).await });
    let wall = wall
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    println!("{addr} {bytes} {wall}");
    std::io::stdout().flush().expect("stdout");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

struct FakeFleet {
    child: std::process::Child,
    pid: String,
    urls: Vec<String>,
    body_bytes: usize,
    /// When exporter `i` publishes: `start + i / EXPORTERS s + k s`.
    start: std::time::SystemTime,
}

impl FakeFleet {
    /// When exporter `i` published the snapshot it was serving at `at`.
    fn published_before(&self, i: usize, at: std::time::SystemTime) -> std::time::SystemTime {
        let phase = SAMPLING.mul_f64(i as f64 / EXPORTERS as f64);
        let since = at
            .duration_since(self.start + phase)
            .unwrap_or(Duration::ZERO);
        let k = (since.as_secs_f64() / SAMPLING.as_secs_f64()).floor() as u32;
        self.start + phase + SAMPLING * k
    }
}

fn start_fake_fleet() -> FakeFleet {
    let exe = std::env::current_exe().expect("this benchmark's path");
    let mut child = std::process::Command::new(exe)
        .arg("--fake-fleet")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the fake fleet");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the fake fleet's address");
    let mut fields = line.split_whitespace();
    let (addr, bytes, start) = (
        fields.next().expect("addr"),
        fields.next().expect("bytes"),
        fields.next().expect("start"),
    );
    let start = std::time::UNIX_EPOCH
        + Duration::from_nanos(start.parse::<u64>().expect("Unix nanoseconds"));
    FakeFleet {
        start,
        pid: child.id().to_string(),
        urls: (0..EXPORTERS)
            .map(|i| format!("http://{addr}/e/{i}/metrics"))
            .collect(),
        body_bytes: bytes.parse().expect("a byte count"),
        child,
    }
}

// ---- the transport floor (child process) -------------------------------------------------

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Empty<Bytes>,
>;

/// What `source::scrape_one` does, less decoding: GET, check, read the whole body.
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

/// `--baseline-client FLEET_PID URL…` (URLs on stdin): prints `key value` lines.
fn baseline_child(fleet_pid: String) {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .expect("URLs on stdin");
    let urls: Vec<String> = input.lines().map(str::to_string).collect();
    let rt = runtime("client");
    let (rounds, cpu, fleet_cpu, wall, failures) = rt
        .block_on(rt.spawn(async move {
            let client: Client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_idle_timeout(INTERVAL * 4)
                    .build_http();
            let mut ticker = tokio::time::interval(INTERVAL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut rounds = Vec::new();
            let (mut cpu_a, mut fleet_a, mut t_a) = (0.0, 0.0, Instant::now());
            let mut failures = 0;
            for r in 1..=BASELINE_WARMUP + BASELINE_ROUNDS {
                ticker.tick().await;
                let start = Instant::now();
                let results: Vec<Result<usize, String>> =
                    futures_util::stream::iter(urls.iter().cloned())
                        .map(|url| {
                            let client = &client;
                            async move { fetch(client, &url).await }
                        })
                        .buffer_unordered(CONCURRENCY)
                        .collect()
                        .await;
                let end = Instant::now();
                if r > BASELINE_WARMUP {
                    rounds.push(end - start);
                    failures += results.iter().filter(|r| r.is_err()).count();
                }
                if r == BASELINE_WARMUP {
                    (cpu_a, fleet_a, t_a) = (process_cpu("self"), process_cpu(&fleet_pid), end);
                }
            }
            (
                rounds,
                process_cpu("self") - cpu_a,
                process_cpu(&fleet_pid) - fleet_a,
                t_a.elapsed(),
                failures,
            )
        }))
        .expect("baseline rounds");
    let wall = wall.as_secs_f64();
    let max_round = rounds.iter().max().copied().unwrap_or_default();
    println!("client_cores {}", cpu / wall);
    println!("fleet_cores {}", fleet_cpu / wall);
    println!("max_round_s {}", max_round.as_secs_f64());
    println!("failures {failures}");
    println!("rss {}", status_bytes("self", "VmRSS"));
    println!("hwm {}", status_bytes("self", "VmHWM"));
}

fn run_baseline(fleet: &FakeFleet) -> HashMap<String, f64> {
    let exe = std::env::current_exe().expect("this benchmark's path");
    let mut child = std::process::Command::new(exe)
        .args(["--baseline-client", &fleet.pid])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the baseline client");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(fleet.urls.join("\n").as_bytes())
        .expect("URLs to the baseline client");
    let out = child.wait_with_output().expect("the baseline client");
    assert!(out.status.success(), "the baseline client failed");
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

/// The four queries of step `n`, rotating over apps, namespaces and pods.
fn uris(n: usize) -> [String; 4] {
    let k = (n * 7) % 200;
    let ns = format!("ns-{}", k % 50);
    let i = k + 200 * (n % (EXPORTERS / 200));
    let g = n % GPUS as usize;
    [
        format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/gpu_utilization?labelSelector=app%3Dapp-{k}"
        ),
        format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/pod-{i}-{g}/gpu_utilization"
        ),
        format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/gpu_utilization?labelSelector=app%3Dapp-{k}"
        ),
        format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/deployments.apps/app-{k}/gpu_utilization"
        ),
    ]
}

/// Items each query of step `n` must answer with.
fn expected_items(n: usize) -> [usize; 4] {
    let k = (n * 7) % 200;
    let selected = (0..EXPORTERS).filter(|i| i % 200 == k).count() * GPUS as usize;
    [selected, 1, selected, 1]
}

/// Nanoseconds this thread has spent runnable but waiting for a CPU (schedstat's
/// `run_delay`, updated whenever the thread is scheduled back in).
fn run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// Latencies of one query kind: as measured, and less the time the thread waited for a
/// CPU meanwhile (preemption by other processes); how many queries waited at all.
#[derive(Default)]
struct Latencies {
    wall: Vec<Duration>,
    on_cpu: Vec<Duration>,
    preempted: usize,
}

async fn run_queries(router: axum::Router) -> Result<[Latencies; 4], String> {
    let mut latencies: [Latencies; 4] = Default::default();
    for n in 0..QUERIES {
        let expected = expected_items(n);
        for (kind, uri) in uris(n).into_iter().enumerate() {
            let request = Request::get(&uri).body(Body::empty()).expect("a request");
            // The router's futures never wait, so one query runs within one poll, on one
            // thread: the run-queue delay read around it is the query's.
            let waited_before = run_delay_ns();
            let start = Instant::now();
            let response = router.clone().oneshot(request).await.expect("infallible");
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .map_err(|e| e.to_string())?;
            let elapsed = start.elapsed();
            let waited = Duration::from_nanos(run_delay_ns() - waited_before);
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
            let l = &mut latencies[kind];
            l.wall.push(elapsed);
            l.on_cpu.push(elapsed.saturating_sub(waited));
            l.preempted += usize::from(!waited.is_zero());
            // As a server's per-request tasks would, give the worker back between queries.
            tokio::task::yield_now().await;
        }
    }
    for l in &mut latencies {
        l.wall.sort();
        l.on_cpu.sort();
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

/// Heap bytes (allocations rounded up to glibc's 16-byte chunks plus an 8-byte header)
/// and allocations of one exporter's decoded series, as the scrape loop holds them.
fn decoded_footprint() -> (f64, usize) {
    let chunk = |n: usize| {
        if n == 0 {
            0
        } else {
            (n + 8).max(32).div_ceil(16) * 16
        }
    };
    let series = exposition::decode(CONTENT_TYPE, &node_body(0), usize::MAX)
        .expect("decodes")
        .series;
    let mut bytes = chunk(
        series.capacity() * std::mem::size_of::<gpu_metrics_adapter::source::derive::Series>(),
    );
    let mut allocs = 1;
    for s in &series {
        bytes += chunk(s.name.capacity())
            + chunk(s.labels.capacity() * std::mem::size_of::<(String, String)>());
        allocs += 2;
        for (k, v) in &s.labels {
            bytes += chunk(k.capacity()) + chunk(v.capacity());
            allocs += 2;
        }
    }
    (bytes as f64, allocs)
}

// ---- the run --------------------------------------------------------------------------

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "pass" } else { "FAIL" }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--fake-fleet") {
        fake_fleet_child();
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--baseline-client") {
        baseline_child(args[i + 1].clone());
        return;
    }
    let load_start = load_average();
    eprintln!("fleet: encoding {EXPORTERS} exporter bodies in the fake-fleet process…");
    let mut fake = start_fake_fleet();
    let fleet_rss = status_bytes(&fake.pid, "VmRSS");
    eprintln!("fleet: transport floor, a plain client in a child process (~15 s)…");
    let baseline = run_baseline(&fake);
    let b = |k: &str| baseline.get(k).copied().unwrap_or(f64::NAN);

    let rt = runtime("adapter");
    let fleet = Arc::new(ArcSwap::from_pointee(fleet::Fleet::default()));
    let pods = Arc::new(ArcSwap::from_pointee(pod_index()));
    let state = Arc::new(AppState {
        fleet: fleet.clone(),
        serving: Default::default(),
        pods: pods.clone(),
        staleness: INTERVAL * 3,
        window_seconds: INTERVAL.as_secs(),
        catalog: Default::default(),
        signals: gpu_metrics_adapter::source::signal::handle(),
    });
    let opts = scrape::ScrapeOptions {
        targets: Arc::new(ArcSwap::from_pointee(fake.urls.clone())),
        interval: INTERVAL,
        timeout: TIMEOUT,
        accept: exposition::ACCEPT,
        auth: Default::default(),
        metrics: Default::default(),
        limits: Default::default(),
    };
    let rss_before = status_bytes("self", "VmRSS");
    eprintln!(
        "fleet: the adapter follows the fleet for {:?} + {:?}…",
        WARMUP, MEASURED
    );
    let t0 = Instant::now();
    let client = scrape::client(&opts).expect("scrape client");
    let scraper = rt.spawn(scrape::run(opts, client, exposition::decode, fleet.clone()));

    // Watch publications from this (main) thread. Per exporter (its GPU 0 pod): the
    // arrival time of the data last seen, to spot new data in each publication.
    let keys: Vec<(String, String)> = (0..EXPORTERS)
        .map(|i| {
            let h = holder(i, 0);
            (h.namespace, h.pod)
        })
        .collect();
    let mut last_at: Vec<Option<std::time::SystemTime>> = vec![None; EXPORTERS];
    let mut last_update: Vec<Option<Instant>> = vec![None; EXPORTERS];
    // Sample → adapter publication, per exporter snapshot that reached the fleet view;
    // longest gap between two updates of one exporter; publications.
    let mut lags: Vec<Duration> = Vec::new();
    let mut max_gap = Duration::ZERO;
    let mut updates = 0usize;
    let mut publications = 0usize;
    let mut seen = Arc::as_ptr(&*fleet.load());
    let (mut cpu_a, mut proc_a, mut fleet_a) = (0.0, 0.0, 0.0);
    let mut rss_warm = 0.0;
    let mut measuring = false;
    let mut first_complete = None;
    let mut all_answered = true;
    let mut min_answered = EXPORTERS;
    let sample = || {
        (
            threads_cpu("adapter"),
            process_cpu("self"),
            process_cpu(&fake.pid),
        )
    };
    let window_start;
    loop {
        std::thread::sleep(Duration::from_millis(1));
        if !measuring && t0.elapsed() >= WARMUP {
            measuring = true;
            (cpu_a, proc_a, fleet_a) = sample();
            rss_warm = status_bytes("self", "VmRSS");
        }
        if t0.elapsed() >= WARMUP + MEASURED {
            window_start = t0 + WARMUP;
            break;
        }
        let f = fleet.load();
        let p = Arc::as_ptr(&*f);
        if p == seen {
            continue;
        }
        seen = p;
        let (now, wall_now) = (Instant::now(), std::time::SystemTime::now());
        if first_complete.is_none() && f.pods.len() == EXPORTERS * GPUS as usize {
            first_complete = Some(now - t0);
        }
        if measuring {
            publications += 1;
            all_answered &= f.answered == EXPORTERS && f.targets == EXPORTERS;
            min_answered = min_answered.min(f.answered);
        }
        for (i, key) in keys.iter().enumerate() {
            let Some(o) = f.pods.get(key) else { continue };
            if last_at[i] == Some(o.at) {
                continue;
            }
            last_at[i] = Some(o.at);
            if measuring {
                updates += 1;
                let sampled = fake.published_before(i, o.at);
                lags.push(wall_now.duration_since(sampled).unwrap_or(Duration::ZERO));
                if let Some(prev) = last_update[i] {
                    max_gap = max_gap.max(now - prev);
                }
            }
            last_update[i] = Some(now);
        }
    }
    let (cpu_b, proc_b, fleet_b) = sample();
    // An exporter whose data never changed in the window counts as the whole window.
    for u in &last_update {
        max_gap = max_gap.max(u.map_or(MEASURED, |u| {
            (Instant::now() - u).min(Instant::now() - window_start)
        }));
    }
    lags.sort();
    let wall = MEASURED.as_secs_f64();
    let adapter_cores = (cpu_b - cpu_a) / wall;
    let process_cores = (proc_b - proc_a) / wall;
    let fleet_cores = (fleet_b - fleet_a) / wall;
    let pods_seen = fleet.load().pods.len();
    let hwm_rounds = status_bytes("self", "VmHWM");

    eprintln!(
        "fleet: {} queries through the router while scraping goes on…",
        QUERIES * 4
    );
    let q_start = Instant::now();
    let busy = rt
        .block_on(rt.spawn(run_queries(http::router(state))))
        .expect("query task")
        .unwrap_or_else(|e| panic!("query failed: {e}"));
    let busy_wall = q_start.elapsed();
    let complete_at_end = fleet.load().answered == EXPORTERS;
    let hwm_scraping = status_bytes("self", "VmHWM");
    let rss_end = status_bytes("self", "VmRSS");

    eprintln!(
        "fleet: {} queries with the scrape loop stopped…",
        QUERIES * 4
    );
    scraper.abort();
    std::thread::sleep(Duration::from_millis(200));
    let quiet_state = Arc::new(AppState {
        fleet: fleet.clone(),
        serving: Default::default(),
        pods,
        staleness: Duration::from_secs(3600),
        window_seconds: INTERVAL.as_secs(),
        catalog: Default::default(),
        signals: gpu_metrics_adapter::source::signal::handle(),
    });
    let quiet = rt
        .block_on(rt.spawn(run_queries(http::router(quiet_state))))
        .expect("query task")
        .unwrap_or_else(|e| panic!("query failed: {e}"));
    let load_end = load_average();
    drop(fake.child.stdin.take());
    let _ = fake.child.wait();

    // ---- report ----
    let (one_body_heap, one_body_allocs) = decoded_footprint();
    println!("\n## gpu-metrics-adapter fleet scale (issues 5 and 16)\n");
    println!(
        "Machine: {}; 1-min load average {load_start} at the start, {load_end} at the end (other builds share this machine).",
        machine()
    );
    println!(
        "Fleet: {EXPORTERS} exporters × {GPUS} GPUs = {} GPUs, each held whole by a pod; {} families × {GPUS} series per body ({:.1} KB; {:.1} MB per round), pre-encoded, one axum server on 127.0.0.1 in its own process; one pooled loopback connection per exporter.",
        EXPORTERS * GPUS as usize,
        common::FAMILIES.len(),
        fake.body_bytes as f64 / EXPORTERS as f64 / 1e3,
        fake.body_bytes as f64 / 1e6
    );
    println!(
        "Adapter (this process): `source::scrape::run` at the defaults (interval {INTERVAL:?}, timeout {TIMEOUT:?}: each exporter long-polled, publications batched per {:?}), 2-worker runtime, {WARMUP:?} warm-up then {MEASURED:?} measured; pod index of {} pods (labels, ReplicaSet and Deployment owners). Each fake exporter publishes every {SAMPLING:?} at its own phase. Queries: `http::router` via `tower::ServiceExt::oneshot` (no socket; response body read to the end) from a task on the adapter runtime, kinds interleaved, {QUERIES} each per phase.\n",
        scrape::COALESCE,
        EXPORTERS * GPUS as usize
    );
    println!("| Figure | Measured | Target | Result |");
    println!("|---|---|---|---|");
    println!(
        "| Exporters answering in every publication; pods in the snapshot | {min_answered}/{EXPORTERS}; {pods_seen} (all first in the view after {:.3} s) | all | {} |",
        first_complete.map_or(f64::NAN, |d| d.as_secs_f64()),
        verdict(all_answered && pods_seen == EXPORTERS * GPUS as usize)
    );
    println!(
        "| Exporter sample → adapter publication, per snapshot: p50 / p99 / max | {:.3} / {:.3} / {:.3} s ({updates} snapshots, {:.2} per exporter per second; {publications} publications, {:.1}/s) | ≤ 1 s p99 | {} |",
        percentile(&lags, 50.0).as_secs_f64(),
        percentile(&lags, 99.0).as_secs_f64(),
        lags.last().map_or(f64::NAN, |d| d.as_secs_f64()),
        updates as f64 / EXPORTERS as f64 / wall,
        publications as f64 / wall,
        verdict(!lags.is_empty() && percentile(&lags, 99.0) <= Duration::from_secs(1))
    );
    println!(
        "| Longest gap between two updates of one exporter (was: scrape round) | {:.3} s | ≤ 2 s | {} |",
        max_gap.as_secs_f64(),
        verdict(max_gap <= INTERVAL)
    );
    println!(
        "| Adapter CPU: `adapter` threads ÷ wall (whole process) | {adapter_cores:.3} cores ({process_cores:.3}); {:.2} ms per exporter snapshot | ≤ 1 core | {} |",
        process_cores * wall * 1e3 / updates.max(1) as f64,
        verdict(process_cores <= 1.0)
    );
    println!(
        "| Transport floor: plain client, same fetches, no decode | {:.3} cores; max round {:.3} s; {} failures | — | adapter ÷ floor = {:.1}× |",
        b("client_cores"),
        b("max_round_s"),
        b("failures"),
        process_cores / b("client_cores")
    );
    println!(
        "| Fake fleet process (not the adapter): CPU during adapter / floor runs | {fleet_cores:.3} / {:.3} cores | — | — |",
        b("fleet_cores")
    );
    println!(
        "| Adapter RSS after the {WARMUP:?} warm-up (before scraping: {:.1} MiB) | {:.1} MiB | ≤ 200 MiB | {} |",
        rss_before / MIB,
        rss_warm / MIB,
        verdict(rss_warm <= 200.0 * MIB)
    );
    println!(
        "| Adapter peak RSS (VmHWM) after {:?}; after the busy queries too; RSS then | {:.1} MiB; {:.1} MiB; {:.1} MiB | ≤ 200 MiB | {} |",
        WARMUP + MEASURED,
        hwm_rounds / MIB,
        hwm_scraping / MIB,
        rss_end / MIB,
        verdict(hwm_scraping <= 200.0 * MIB)
    );
    println!(
        "| Transport floor's RSS / VmHWM (plain client process) | {:.1} / {:.1} MiB | — | — |",
        b("rss") / MIB,
        b("hwm") / MIB
    );
    println!(
        "| Decoded series of one body (`source::run` decodes one body at a time and keeps only per-pod values; all {EXPORTERS} at once would be ≈ {:.1} MiB) | {:.1} KiB in {one_body_allocs} allocations | — | — |",
        one_body_heap * EXPORTERS as f64 / MIB,
        one_body_heap / 1024.0
    );
    println!(
        "| Fake fleet process RSS (bodies + server) | {:.1} MiB | — | — |",
        fleet_rss / MIB
    );
    let mut all_ok = true;
    for (phase, lat) in [("while scraping", &busy), ("scrape loop stopped", &quiet)] {
        for (kind, l) in KINDS.iter().zip(lat) {
            let p99 = percentile(&l.wall, 99.0);
            let ok = p99 <= Duration::from_millis(2);
            if phase == "while scraping" {
                all_ok &= ok;
            }
            println!(
                "| Query, {phase}: {kind}: p50 / p99 / max [p99 less CPU wait; queries preempted] | {} / {} / {} [{}; {:.1} %] | p99 ≤ 2 ms | {}{} |",
                ms(percentile(&l.wall, 50.0)),
                ms(p99),
                ms(*l.wall.last().expect("queries")),
                ms(percentile(&l.on_cpu, 99.0)),
                100.0 * l.preempted as f64 / l.wall.len() as f64,
                verdict(ok),
                if ok {
                    ""
                } else if percentile(&l.on_cpu, 99.0) <= Duration::from_millis(2) {
                    " (pass less CPU wait)"
                } else {
                    ""
                }
            );
        }
    }
    println!(
        "\nBusy query phase: {:.1} s ({:.0} queries/s, ~{:.0} exporter snapshots followed meanwhile); every query answered 200 with the expected item count; the view at the end {} every exporter.",
        busy_wall.as_secs_f64(),
        (QUERIES * 4) as f64 / busy_wall.as_secs_f64(),
        busy_wall.as_secs_f64() * EXPORTERS as f64 / SAMPLING.as_secs_f64(),
        if complete_at_end {
            "had"
        } else {
            "did NOT have"
        }
    );
    if !all_ok {
        println!("Some query kind missed its p99 target while scraping.");
    }
}
