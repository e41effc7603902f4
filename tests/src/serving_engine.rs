//! A simulated LLM serving engine for tests: a real HTTP `/metrics` in the engine's
//! own text exposition (vLLM's, SGLang's or TGI's), whose queue follows a load script the
//! test controls. Test infrastructure only: never linked into a shipped binary.
//!
//! The load script is a list of steps, each holding from its time (since start) until
//! the next; [`SimEngine::state`] is the oracle the tests check the adapter against.
//! Generated tokens grow at a set rate, and time-to-first-token observations are
//! added on demand, so rates and quantiles have known answers too.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whose exposition the engine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// vLLM's V1 engine (`vllm:` families, `engine` and `model_name` labels).
    Vllm,
    /// SGLang (`sglang:` families, `model_name` label).
    Sglang,
    /// Hugging Face TGI (`tgi_` families, no labels): no KV-cache ratio, but the tokens
    /// the batches hold (`tgi_batch_current_max_tokens`, the script's KV-cache use times
    /// [`TGI_CAPACITY`]) and `GET /info` with the capacity (`max_batch_total_tokens`).
    Tgi,
}

/// The simulated TGI's KV-cache capacity in tokens (`/info`'s `max_batch_total_tokens`).
pub const TGI_CAPACITY: u32 = 16384;

/// One step of a load script: from `at` on, until the next step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub at: Duration,
    pub waiting: f64,
    pub running: f64,
    /// KV-cache use, 0 to 1.
    pub kv_cache: f64,
}

impl Step {
    pub fn new(at_secs: f64, waiting: f64, running: f64, kv_cache: f64) -> Step {
        Step {
            at: Duration::from_secs_f64(at_secs),
            waiting,
            running,
            kv_cache,
        }
    }
}

/// vLLM's time-to-first-token bucket bounds (vllm/v1/metrics/loggers.py), seconds.
pub const TTFT_BOUNDS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
];

struct Shared {
    kind: EngineKind,
    model: String,
    started: Instant,
    script: Mutex<Vec<Step>>,
    /// (tokens so far at `since`, tokens per second, since).
    tokens: Mutex<(f64, f64, Instant)>,
    /// Observations per bucket of [`TTFT_BOUNDS`], then +Inf; and their sum.
    ttft: Mutex<(Vec<u64>, f64)>,
    down: AtomicBool,
    /// `/info` answers 500 (TGI).
    info_down: AtomicBool,
    stop: AtomicBool,
    scrapes: AtomicU64,
    info_requests: AtomicU64,
}

impl Shared {
    fn state(&self, at: Duration) -> Step {
        let script = self.script.lock().expect("script");
        script
            .iter()
            .rev()
            .find(|s| s.at <= at)
            .or(script.first())
            .copied()
            .unwrap_or(Step::new(0.0, 0.0, 0.0, 0.0))
    }

    fn tokens_total(&self) -> f64 {
        let (base, rate, since) = *self.tokens.lock().expect("tokens");
        (base + rate * since.elapsed().as_secs_f64()).floor()
    }

    /// TGI's `/metrics`: names and types from its router (router/src/server.rs).
    fn tgi_exposition(&self) -> String {
        let s = self.state(self.started.elapsed());
        let tokens = self.tokens_total();
        format!(
            "# TYPE tgi_queue_size gauge\ntgi_queue_size {:?}\n\
             # TYPE tgi_batch_current_size gauge\ntgi_batch_current_size {:?}\n\
             # TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens {:?}\n\
             # TYPE tgi_request_generated_tokens histogram\n\
             tgi_request_generated_tokens_bucket{{le=\"+Inf\"}} 1.0\n\
             tgi_request_generated_tokens_sum {tokens:?}\n\
             tgi_request_generated_tokens_count 1.0\n",
            s.waiting,
            s.running,
            tgi_held_tokens(s.kv_cache),
        )
    }

    fn exposition(&self) -> String {
        if self.kind == EngineKind::Tgi {
            return self.tgi_exposition();
        }
        let s = self.state(self.started.elapsed());
        let tokens = self.tokens_total();
        let (counts, sum) = self.ttft.lock().expect("ttft").clone();
        // TGI's own exposition returned above.
        let (prefix, labels) = match self.kind {
            EngineKind::Vllm => (
                "vllm",
                format!("engine=\"0\",model_name=\"{}\"", self.model),
            ),
            EngineKind::Sglang | EngineKind::Tgi => {
                ("sglang", format!("model_name=\"{}\"", self.model))
            }
        };
        let (waiting, running, kv) = match self.kind {
            EngineKind::Vllm => (
                "num_requests_waiting",
                "num_requests_running",
                "kv_cache_usage_perc",
            ),
            EngineKind::Sglang | EngineKind::Tgi => {
                ("num_queue_reqs", "num_running_reqs", "token_usage")
            }
        };
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, value: f64| {
            out.push_str(&format!(
                "# HELP {prefix}:{name} {help}\n# TYPE {prefix}:{name} gauge\n{prefix}:{name}{{{labels}}} {value:?}\n"
            ));
        };
        gauge(
            running,
            "Number of requests in model execution batches.",
            s.running,
        );
        gauge(
            waiting,
            "Number of requests waiting to be processed.",
            s.waiting,
        );
        gauge(kv, "KV-cache usage. 1 means 100 percent usage.", s.kv_cache);
        out.push_str(&format!(
            "# HELP {prefix}:generation_tokens_total Number of generation tokens processed.\n# TYPE {prefix}:generation_tokens_total counter\n{prefix}:generation_tokens_total{{{labels}}} {tokens:?}\n"
        ));
        out.push_str(&format!(
            "# HELP {prefix}:time_to_first_token_seconds Histogram of time to first token in seconds.\n# TYPE {prefix}:time_to_first_token_seconds histogram\n{prefix}:time_to_first_token_seconds_sum{{{labels}}} {sum:?}\n"
        ));
        let mut cumulative = 0u64;
        for (i, count) in counts.iter().enumerate() {
            cumulative += count;
            let le = TTFT_BOUNDS
                .get(i)
                .map_or("+Inf".to_string(), |b| format!("{b:?}"));
            out.push_str(&format!(
                "{prefix}:time_to_first_token_seconds_bucket{{le=\"{le}\",{labels}}} {:?}\n",
                cumulative as f64
            ));
        }
        out.push_str(&format!(
            "{prefix}:time_to_first_token_seconds_count{{{labels}}} {:?}\n",
            cumulative as f64
        ));
        out
    }
}

/// The tokens a simulated TGI's batches hold at KV-cache use `kv_cache` (whole tokens,
/// as TGI counts them): the adapter's usage is this over [`TGI_CAPACITY`].
pub fn tgi_held_tokens(kv_cache: f64) -> f64 {
    (kv_cache * f64::from(TGI_CAPACITY)).round()
}

/// A running simulated engine; stops when dropped.
pub struct SimEngine {
    shared: Arc<Shared>,
    port: u16,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimEngine {
    /// Serve `kind`'s exposition on a free loopback port, the queue following
    /// `script` (at least one step; the first applies from the start).
    pub fn start(kind: EngineKind, script: Vec<Step>) -> SimEngine {
        assert!(!script.is_empty(), "a load script needs a step");
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let port = listener.local_addr().expect("address").port();
        let shared = Arc::new(Shared {
            kind,
            model: "sim/llama-3-8b".into(),
            started: Instant::now(),
            script: Mutex::new(script),
            tokens: Mutex::new((0.0, 0.0, Instant::now())),
            ttft: Mutex::new((vec![0; TTFT_BOUNDS.len() + 1], 0.0)),
            down: AtomicBool::new(false),
            info_down: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            scrapes: AtomicU64::new(0),
            info_requests: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if serving.stop.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(stream) = stream {
                    answer(&serving, stream);
                }
            }
        });
        SimEngine {
            shared,
            port,
            thread: Some(thread),
        }
    }

    /// The `/metrics` URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.port)
    }

    /// Time since start, on the script's clock.
    pub fn elapsed(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// The script's state at `at` (the oracle).
    pub fn state_at(&self, at: Duration) -> Step {
        self.shared.state(at)
    }

    /// The script's state now.
    pub fn state(&self) -> Step {
        self.state_at(self.elapsed())
    }

    /// Replace the script by one constant step.
    pub fn set(&self, waiting: f64, running: f64, kv_cache: f64) {
        *self.shared.script.lock().expect("script") =
            vec![Step::new(0.0, waiting, running, kv_cache)];
    }

    /// Generate tokens at `rate` per second from now on.
    pub fn set_tokens_per_second(&self, rate: f64) {
        let mut t = self.shared.tokens.lock().expect("tokens");
        let now = Instant::now();
        let so_far = t.0 + t.1 * now.duration_since(t.2).as_secs_f64();
        *t = (so_far, rate, now);
    }

    /// Record `n` requests whose first token took `seconds`.
    pub fn observe_ttft(&self, seconds: f64, n: u64) {
        let mut h = self.shared.ttft.lock().expect("ttft");
        let i = TTFT_BOUNDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(TTFT_BOUNDS.len());
        h.0[i] += n;
        h.1 += seconds * n as f64;
    }

    /// Answer 503 to every scrape (down) or serve again.
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }

    /// Answer 500 to `GET /info` (TGI), or serve it again.
    pub fn set_info_down(&self, down: bool) {
        self.shared.info_down.store(down, Ordering::SeqCst);
    }

    /// `GET /info` requests answered so far (500s included).
    pub fn info_requests(&self) -> u64 {
        self.shared.info_requests.load(Ordering::SeqCst)
    }

    /// Scrapes answered so far (503s included).
    pub fn scrapes(&self) -> u64 {
        self.shared.scrapes.load(Ordering::SeqCst)
    }

    /// The exposition as served now.
    pub fn exposition(&self) -> String {
        self.shared.exposition()
    }
}

impl Drop for SimEngine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP/1.1 exchange, then close.
fn answer(shared: &Shared, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    if shared.kind == EngineKind::Tgi && request.starts_with(b"GET /info ") {
        shared.info_requests.fetch_add(1, Ordering::SeqCst);
        let (status, body) = if shared.info_down.load(Ordering::SeqCst) {
            ("500 Internal Server Error", "{}".to_string())
        } else {
            // A subset of TGI's Info (router/src/lib.rs).
            (
                "200 OK",
                format!(
                    "{{\"model_id\":\"{}\",\"max_input_tokens\":4095,\"max_total_tokens\":4096,\"max_batch_total_tokens\":{TGI_CAPACITY},\"version\":\"3.3.0\"}}",
                    shared.model
                ),
            )
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(body.as_bytes());
        return;
    }
    shared.scrapes.fetch_add(1, Ordering::SeqCst);
    let path_ok = request.starts_with(b"GET /metrics");
    let (status, body) = if shared.down.load(Ordering::SeqCst) {
        ("503 Service Unavailable", "engine down\n".to_string())
    } else if !path_ok {
        ("404 Not Found", "not found\n".to_string())
    } else {
        ("200 OK", shared.exposition())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_follows_the_script_and_the_controls() {
        let e = SimEngine::start(
            EngineKind::Vllm,
            vec![
                Step::new(0.0, 5.0, 2.0, 0.25),
                Step::new(3600.0, 50.0, 8.0, 0.9),
            ],
        );
        assert_eq!(e.state().waiting, 5.0);
        assert_eq!(e.state_at(Duration::from_secs(3601)).waiting, 50.0);
        e.observe_ttft(0.07, 3);
        let (status, body) = crate::get(&e.url());
        assert_eq!(status, 200);
        assert!(
            body.contains(
                "vllm:num_requests_waiting{engine=\"0\",model_name=\"sim/llama-3-8b\"} 5.0"
            ),
            "{body}"
        );
        assert!(
            body.contains("vllm:time_to_first_token_seconds_bucket{le=\"0.06\","),
            "{body}"
        );
        assert!(body.contains("vllm:time_to_first_token_seconds_bucket{le=\"0.08\",engine=\"0\",model_name=\"sim/llama-3-8b\"} 3.0"), "{body}");
        e.set_down(true);
        assert_eq!(crate::get(&e.url()).0, 503);
        assert_eq!(e.scrapes(), 2);
    }

    #[test]
    fn tgi_serves_its_held_tokens_and_its_capacity_on_info() {
        let e = SimEngine::start(EngineKind::Tgi, vec![Step::new(0.0, 5.0, 2.0, 0.25)]);
        let (status, body) = crate::get(&e.url());
        assert_eq!(status, 200);
        assert!(body.contains("tgi_queue_size 5.0\n"), "{body}");
        assert!(
            body.contains("tgi_batch_current_max_tokens 4096.0\n"),
            "{body}"
        );
        let info = e.url().replace("/metrics", "/info");
        let (status, body) = crate::get(&info);
        assert_eq!(status, 200);
        assert!(body.contains("\"max_batch_total_tokens\":16384"), "{body}");
        e.set_info_down(true);
        assert_eq!(crate::get(&info).0, 500);
        assert_eq!((e.info_requests(), e.scrapes()), (2, 1));
    }
}
