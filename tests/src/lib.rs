//! Shared infrastructure for the end-to-end tests: run the real exporter binary, a real
//! Prometheus and promtool, and wait on conditions (never on fixed sleeps).

pub mod cluster;
pub mod fake_engine;
pub mod fleet;
pub mod flood;
pub mod hpa;
pub mod https;
pub mod metrics_api;
pub mod pki;
pub mod quantity;
pub mod serving_engine;
pub mod sysfs;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives inside the workspace")
        .to_path_buf()
}

/// `target/<profile>` of the running test binary (it lives in `target/<profile>/deps`).
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary sits in target/<profile>/deps")
        .to_path_buf()
}

/// A Go tool that tests/kube/build.sh builds from its module under tests/kube into
/// `target/kube/bin` (or `$KUBE_BIN_DIR`): the control plane, kwok, helm, and Prometheus 3
/// with promtool (`prometheus`, `promtool`). Every test that runs one finds it here, never
/// on `PATH`, so the version is the one tests/kube pins.
pub fn go_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("KUBE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/kube/bin"))
        .join(name);
    assert!(
        path.exists(),
        "{} is not built; run `bash tests/kube/build.sh` first (tests/run.sh does)",
        path.display()
    );
    path
}

/// Prometheus 3's `promtool` (tests/kube/prometheus).
pub fn promtool() -> Command {
    Command::new(go_tool("promtool"))
}

/// A built workspace artifact (binary or cdylib). `cargo build --workspace` puts it in
/// `target/<profile>`; under plain `cargo test` a cdylib stays in `target/<profile>/deps`.
pub fn binary(name: &str) -> PathBuf {
    let dir = target_profile_dir();
    [dir.join(name), dir.join("deps").join(name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not built under {}; run `cargo build --workspace` first (tests/run.sh does)",
                dir.display()
            )
        })
}

/// A path under `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    workspace().join("tests/fixtures").join(name)
}

/// A fresh, unique scratch directory under the target dir, kept for post-mortems until
/// the next `tests/run.sh` clears them.
pub fn scratch_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = target_profile_dir().join("e2e-scratch").join(format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Poll `f` until it returns `Some`, or panic after `timeout` naming `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Poll `f` until it returns `Some`, or give `None` after `timeout`.
pub fn try_wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An HTTP GET: (status, body). Never fails on 4xx/5xx; panics only on transport errors.
pub fn get(url: &str) -> (u16, String) {
    get_with(url, &[])
}

/// A GET with extra headers.
pub fn get_with(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    try_get(url, headers).unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// A GET request that treats every status as an answer, with a 10 s limit.
fn request(
    url: &str,
    headers: &[(&str, &str)],
) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    headers
        .iter()
        .fold(agent.get(url), |req, (k, v)| req.header(*k, *v))
}

/// A GET that reports transport errors instead of panicking.
pub fn try_get(url: &str, headers: &[(&str, &str)]) -> Result<(u16, String), String> {
    let req = request(url, headers);
    let mut resp = req.call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// A GET returning (status, raw body, Content-Encoding), for compressed responses.
pub fn get_bytes_with(url: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>, Option<String>) {
    let req = request(url, headers);
    let mut resp = req.call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let encoding = resp
        .headers()
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (resp.status().as_u16(), body, encoding)
}

/// A response as it came: status, `Content-Type`, `Content-Encoding` and raw body.
pub struct RawResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub body: Vec<u8>,
}

/// A GET returning the raw response, for binary and compressed bodies.
pub fn get_raw(url: &str, headers: &[(&str, &str)]) -> RawResponse {
    let req = request(url, headers);
    let mut resp = req.call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (content_type, content_encoding) = (header("content-type"), header("content-encoding"));
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    RawResponse {
        status: resp.status().as_u16(),
        content_type,
        content_encoding,
        body,
    }
}

/// The sample lines of a text-format body as (series as written, value).
pub fn text_series(body: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (series, v) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("no value in {l:?}"));
            let v = match v {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|e| panic!("{l:?}: {e}")),
            };
            (series.to_string(), v)
        })
        .collect()
}

/// Decompress a (possibly multi-member) gzip stream.
pub fn gunzip(data: &[u8]) -> String {
    use std::io::Read;
    let mut s = String::new();
    flate2::read::MultiGzDecoder::new(data)
        .read_to_string(&mut s)
        .expect("valid gzip");
    s
}

/// A free loopback port (bound then released; the tiny race is acceptable in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A running process whose stderr and stdout lines are collected; killed on drop.
pub struct Process {
    child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Process {
    pub fn spawn(mut cmd: Command) -> Process {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().expect("log lock").push(line);
                }
            });
        }
        Process { child, lines }
    }

    /// Wait for a log line containing `needle`; returns it.
    /// Waits for the `listening address=HOST:PORT` log line both binaries write, and
    /// returns `SCHEME://HOST:PORT`.
    pub fn listening_base(&mut self, scheme: &str) -> String {
        let line = self.wait_for_line("listening address=", Duration::from_secs(30));
        let addr = line
            .split("address=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("address in the listening line");
        format!("{scheme}://{addr}")
    }

    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> String {
        let lines = self.lines.clone();
        wait_for(
            &format!("a log line containing {needle:?}"),
            timeout,
            || {
                if let Ok(Some(status)) = self.child.try_wait() {
                    panic!(
                        "process exited ({status}) before logging {needle:?}; log:\n{}",
                        lines.lock().expect("log lock").join("\n")
                    );
                }
                lines
                    .lock()
                    .expect("log lock")
                    .iter()
                    .find(|l| l.contains(needle))
                    .cloned()
            },
        )
    }

    pub fn log(&self) -> String {
        self.lines.lock().expect("log lock").join("\n")
    }

    /// Wait for exit and return the status code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let child = &mut self.child;
        wait_for("process exit", timeout, || child.try_wait().ok().flatten()).code()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running gpu-exporter on a loopback port.
pub struct Exporter {
    pub process: Process,
    pub base: String,
}

impl Exporter {
    /// Start the exporter with `args` (plus `-a 127.0.0.1:0`) and `envs`, from the
    /// workspace root, and wait until it listens.
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Exporter {
        Exporter::start_with(Command::new(binary("gpu-exporter")), args, envs)
    }

    /// [`Exporter::start`] through `cmd`: another build of the exporter, or an emulator
    /// whose arguments so far name one (the arm64 tests run it under qemu-aarch64).
    pub fn start_with(mut cmd: Command, args: &[&str], envs: &[(&str, &str)]) -> Exporter {
        cmd.current_dir(workspace())
            .args(args)
            .args(["-a", "127.0.0.1:0"])
            .env_remove("DCGM_EXPORTER_LISTEN")
            .env_remove("DCGM_EXPORTER_COLLECTORS")
            .env_remove("DCGM_EXPORTER_INTERVAL")
            .env("RUST_LOG", "info")
            .env("NODE_NAME", "e2e-node");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut process = Process::spawn(cmd);
        let base = process.listening_base("http");
        Exporter { process, base }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn metrics(&self) -> String {
        let (status, body) = get(&self.url("/metrics"));
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Wait until `gpu_exporter_samples_total` reaches `n`, and return that scrape.
    pub fn metrics_after_samples(&self, n: u64) -> String {
        wait_for(&format!("{n} samples"), Duration::from_secs(30), || {
            let body = self.metrics();
            (sample_value(&body, "gpu_exporter_samples_total")? >= n as f64).then_some(body)
        })
    }
}

/// The value of the first sample whose name and labels start with `prefix`
/// (e.g. `DCGM_FI_DEV_GPU_UTIL{gpu="3"`), or of an unlabelled metric.
pub fn sample_value(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.starts_with(prefix)
                && matches!(
                    l.as_bytes().get(prefix.len()),
                    Some(b' ') | Some(b'{') | Some(b',') | Some(b'}')
                )
        })
        .and_then(line_value)
}

/// The value of one text-exposition sample line (its last space-separated field).
pub fn line_value(line: &str) -> Option<f64> {
    line.rsplit(' ').next()?.parse().ok()
}

/// Every sample line of a family (exact metric name).
pub fn samples<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .collect()
}

/// Run `promtool check metrics` on `text`: (exit code, findings).
pub fn promtool_check_metrics(text: &str) -> (i32, String) {
    let mut child = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

const PROMTOOL_LABEL_CASE: &str = " label names should be written in 'snake_case' not 'camelCase'";
const PROMTOOL_COUNTER_TOTAL: &str = " counter metrics should have \"_total\" suffix";
/// dcgm's `DCGM_FI_DEV_PCIE_REPLAY_COUNTER` and `DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY` name
/// a type.
const PROMTOOL_NAMES_TYPE: [&str; 2] = [
    " metric name should not include type 'counter'",
    " metric name should not include type 'summary'",
];

/// `promtool check metrics` parses `body`, and its linter finds nothing but what
/// dcgm-exporter's compatible names cause: camelCase/uppercase identity labels (`UUID`,
/// `modelName`, …) on series that carry them, and `DCGM_*` counters without `_total`.
pub fn assert_promtool_accepts_dcgm_exposition(body: &str) {
    let (code, findings) = promtool_check_metrics(body);
    assert!(
        code == 0 || code == 3,
        "promtool failed to parse (exit {code}):\n{findings}"
    );
    for f in findings.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(metric) = f.strip_suffix(PROMTOOL_LABEL_CASE) {
            // Only series that carry dcgm's identity labels may trip the case lint.
            // GPU series (`UUID`, `modelName`) or NVLink series (`gpu_uuid`, `model_name`
            // with the `Hostname` and label-field labels).
            let carries_dcgm_labels = body.lines().any(|l| {
                l.starts_with(metric)
                    && ((l.contains("UUID=\"") && l.contains("modelName=\""))
                        || (l.contains("gpu_uuid=\"") && l.contains("model_name=\"")))
            });
            assert!(carries_dcgm_labels, "unexpected label-case finding: {f}");
        } else if let Some(metric) = f
            .strip_suffix(PROMTOOL_COUNTER_TOTAL)
            .or_else(|| PROMTOOL_NAMES_TYPE.iter().find_map(|t| f.strip_suffix(t)))
        {
            assert!(
                metric.starts_with("DCGM_"),
                "our own metric breaks a naming rule: {f}"
            );
        } else {
            panic!("unexpected promtool finding: {f}\nall findings:\n{findings}");
        }
    }
}

/// A real Prometheus server (Prometheus 3, [`go_tool`]`("prometheus")`) on loopback with the
/// given scrape jobs (name, target host:port, extra YAML lines for the job).
pub struct Prometheus {
    pub process: Process,
    pub base: String,
}

impl Prometheus {
    pub fn start(jobs: &[(&str, &str, &str)]) -> Prometheus {
        Prometheus::start_with_args(jobs, &[])
    }

    /// [`Prometheus::start`] with extra command-line flags (e.g. feature flags).
    pub fn start_with_args(jobs: &[(&str, &str, &str)], args: &[&str]) -> Prometheus {
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for (name, target, extra) in jobs {
            config.push_str(&format!(
                "  - job_name: {name}\n    honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n{extra}"
            ));
        }
        Prometheus::start_with_config(&config, args)
    }

    /// Prometheus with `config` as its whole `prometheus.yml` and extra flags; returns
    /// once it is ready.
    pub fn start_with_config(config: &str, args: &[&str]) -> Prometheus {
        let dir = scratch_dir("prometheus");
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        let port = free_port();
        let mut cmd = Command::new(go_tool("prometheus"));
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=info")
        .args(args);
        let mut process = Process::spawn(cmd);
        process.wait_for_line(
            "Server is ready to receive web requests",
            Duration::from_secs(60),
        );
        Prometheus {
            process,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// An instant query; returns the `data.result` array.
    pub fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let url = format!("{}/api/v1/query?query={}", self.base, urlencode(promql));
        let (status, body) = get(&url);
        assert_eq!(status, 200, "query {promql}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("Prometheus JSON");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

/// The value of one sample of an `/api/v1/query` instant vector (`"value": [time,
/// "number"]`), if it has one.
pub fn try_query_value(sample: &serde_json::Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

/// [`try_query_value`], for a sample that must have a value.
pub fn query_value(sample: &serde_json::Value) -> f64 {
    try_query_value(sample).unwrap_or_else(|| panic!("no numeric value in {sample}"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// Values of the samples of `name` whose labels include every `(key, value)`; a MIG
/// series (with `GPU_I_ID`) matches only when `GPU_I_ID` is among the labels asked for.
pub fn series_values(body: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let want_mig = labels.iter().any(|(k, _)| *k == "GPU_I_ID");
    samples(body, name)
        .into_iter()
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter(|l| want_mig || !l.contains("GPU_I_ID="))
        .filter_map(line_value)
        .collect()
}

/// Assert that a scrape carries the values the scenario implies at scenario time `t`:
/// per GPU power, energy, memory, utilisation (absent on MIG GPUs), GR-engine activity
/// (absent without GPM); per MIG instance memory and GR-engine activity, and no
/// device-wide fields; lost GPUs only in `gpu_exporter_gpu_up`.
pub fn assert_matches_scenario(body: &str, scenario: &gpu_sim::Scenario, t: f64) {
    let node = gpu_sim::SimNode::new(scenario, std::time::UNIX_EPOCH);
    for g in &node.gpus {
        let idx = g.index.to_string();
        let labels = [("gpu", idx.as_str())];
        if node.gpu_lost(g.index, t) {
            assert_eq!(
                series_values(body, "gpu_exporter_gpu_up", &labels),
                vec![0.0],
                "GPU {idx} is lost"
            );
            assert!(
                series_values(body, "DCGM_FI_DEV_POWER_USAGE", &labels).is_empty(),
                "lost GPU {idx} has no series"
            );
            continue;
        }
        assert_eq!(
            series_values(body, "gpu_exporter_gpu_up", &labels),
            vec![1.0],
            "GPU {idx} is up"
        );
        let r = node.gpu_reading(g.index, t);
        let check = |name: &str, want: Vec<f64>| {
            let got = series_values(body, name, &labels);
            assert_eq!(
                got.len(),
                want.len(),
                "{name} on GPU {idx}: {got:?} vs {want:?}"
            );
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{name} on GPU {idx}: {a} vs {b}"
                );
            }
        };
        check(
            "DCGM_FI_DEV_POWER_USAGE",
            vec![f64::from(r.power_mw) / 1000.0],
        );
        check(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            vec![r.energy_mj as f64],
        );
        check("DCGM_FI_DEV_FB_USED", vec![(r.memory.used >> 20) as f64]);
        check("DCGM_FI_DEV_GPU_TEMP", vec![f64::from(r.gpu_temp_c)]);
        check("DCGM_FI_DEV_SM_CLOCK", vec![f64::from(r.sm_clock_mhz)]);
        check(
            "DCGM_FI_DEV_GPU_UTIL",
            r.gpu_util_percent.map(f64::from).into_iter().collect(),
        );
        check(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            r.gpm.map(|m| m.graphics_util / 100.0).into_iter().collect(),
        );
        for (m, mig) in g.mig.iter().enumerate() {
            let gi = mig.gpu_instance_id.to_string();
            let labels = [
                ("gpu", idx.as_str()),
                ("GPU_I_ID", gi.as_str()),
                ("GPU_I_PROFILE", mig.profile.name),
            ];
            let mr = node.mig_reading(g.index, m, t);
            assert_eq!(
                series_values(body, "DCGM_FI_DEV_FB_USED", &labels),
                vec![(mr.memory.used >> 20) as f64],
                "memory of MIG {idx}/{gi}"
            );
            assert!(
                series_values(body, "DCGM_FI_DEV_POWER_USAGE", &labels).is_empty(),
                "device-wide power is not copied onto MIG {idx}/{gi}"
            );
            let gr = series_values(body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", &labels);
            let want: Vec<f64> = mr
                .gpm
                .map(|x| x.graphics_util / 100.0)
                .into_iter()
                .collect();
            assert_eq!(gr.len(), want.len(), "GPM presence on MIG {idx}/{gi}");
            for (a, b) in gr.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-6,
                    "GR engine of MIG {idx}/{gi}: {a} vs {b}"
                );
            }
        }
    }
}

/// The fake libnvidia-ml built by this workspace.
pub fn fake_nvml() -> PathBuf {
    binary("libnvidia_ml.so")
}

/// A simulated Kubernetes node for a scenario file: a fake kubelet on a unix socket, a
/// fake API server with the scenario's pods, and a fake `/proc` with their processes'
/// cgroups (see the `kube-sim` crate).
pub struct KubeNode {
    pub sim: kube_sim::node::SimKubeNode,
}

impl KubeNode {
    /// Start the node for `scenario` (a path relative to the workspace), its pods
    /// scheduled on `node_name`.
    pub fn start(scenario: &str, node_name: &str) -> KubeNode {
        let s = gpu_sim::Scenario::load(&workspace().join(scenario)).expect("scenario");
        let node = gpu_sim::SimNode::new(&s, std::time::SystemTime::now());
        let dir = scratch_dir("kube-node");
        let sim = kube_sim::node::SimKubeNode::start(s, node, &dir, node_name)
            .expect("start the simulated Kubernetes node");
        KubeNode { sim }
    }

    pub fn socket(&self) -> &Path {
        self.sim.kubelet_socket()
    }

    pub fn kubeconfig(&self) -> &Path {
        self.sim.kubeconfig_path()
    }

    pub fn proc_root(&self) -> &Path {
        self.sim.proc_root()
    }

    pub fn kubelet(&self) -> &kube_sim::kubelet::FakeKubelet {
        self.sim.kubelet()
    }

    pub fn api(&self) -> &kube_sim::apiserver::FakeApiServer {
        self.sim.apiserver()
    }
}

/// A running gpu-metrics-adapter serving plain HTTP (`--insecure-serve-http`) on
/// loopback, its HTTP and gRPC ports ephemeral.
pub struct Adapter {
    pub process: Process,
    pub base: String,
}

impl Adapter {
    /// The adapter command with `args` after the serving flags.
    pub fn command(args: &[&str]) -> Command {
        Adapter::command_with(Command::new(binary("gpu-metrics-adapter")), args)
    }

    /// [`Adapter::command`] through `cmd`: another build of the adapter, or an emulator
    /// whose arguments so far name one.
    pub fn command_with(mut cmd: Command, args: &[&str]) -> Command {
        cmd.current_dir(workspace())
            .args(["--insecure-serve-http", "--bind-address", "127.0.0.1"])
            .args(["--secure-port", "0", "--grpc-port", "0"])
            .args(args)
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "info");
        cmd
    }

    /// Start it with `args` and wait until it listens.
    pub fn start(args: &[&str]) -> Adapter {
        Adapter::spawn(Adapter::command(args), "http")
    }

    /// Start `cmd` (from [`Adapter::command_with`]) and wait until it listens.
    pub fn start_command(cmd: Command) -> Adapter {
        Adapter::spawn(cmd, "http")
    }

    /// The adapter serving TLS with authentication and authorization (no
    /// `--insecure-serve-http`), `args` after the address flags; waits until it
    /// listens. `base` is `https://127.0.0.1:PORT`.
    pub fn start_tls(args: &[&str]) -> Adapter {
        let mut cmd = Command::new(binary("gpu-metrics-adapter"));
        cmd.current_dir(workspace())
            .args(["--bind-address", "127.0.0.1"])
            .args(["--secure-port", "0", "--grpc-port", "0"])
            .args(args)
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "info,gpu_metrics_adapter::auth=debug");
        Adapter::spawn(cmd, "https")
    }

    fn spawn(cmd: Command, scheme: &str) -> Adapter {
        let mut process = Process::spawn(cmd);
        let base = process.listening_base(scheme);
        Adapter { process, base }
    }

    /// GET `path`: (status, body as JSON, or as a JSON string when it is not JSON).
    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let (status, body) = get(&format!("{}{path}", self.base));
        let json = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
        (status, json)
    }

    /// Wait for a 200 answer to `path` and return its body.
    pub fn ok(&self, path: &str) -> serde_json::Value {
        wait_for(path, Duration::from_secs(30), || {
            let (status, v) = self.get(path);
            (status == 200).then_some(v)
        })
    }

    /// The KEDA gRPC service's address, from the log.
    pub fn grpc_address(&self) -> String {
        self.process
            .log()
            .split("grpc_address=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("gRPC address in the log")
            .to_string()
    }
}

/// The exporter on the golden-file node (`tests/fixtures/golden-node.toml`, every field of
/// `tests/fixtures/all-fields.csv`, processes, OpenMetrics, sampling every 100 ms) as
/// `NODE_NAME=golden-node`, with `extra_env`.
pub fn golden_node_exporter(extra_env: &[(&str, &str)]) -> Exporter {
    let mut env = vec![("NODE_NAME", "golden-node")];
    env.extend_from_slice(extra_env);
    Exporter::start(
        &[
            "--simulate=tests/fixtures/golden-node.toml",
            "-f",
            "tests/fixtures/all-fields.csv",
            "--process-metrics",
            "--openmetrics",
            "-c",
            "100",
        ],
        &env,
    )
}

/// An exporter on `scenario`'s simulated GPUs, attributing them to pods through `node`
/// (kubelet socket, pod watch, /proc), sampling every 200 ms.
pub fn attributed_exporter(node: &KubeNode, scenario: &str) -> Exporter {
    attributed_exporter_with(node, scenario, &[])
}

/// [`attributed_exporter`] with `extra` flags after the attribution ones.
pub fn attributed_exporter_with(node: &KubeNode, scenario: &str, extra: &[&str]) -> Exporter {
    let socket = node.socket().display().to_string();
    let kubeconfig = node.kubeconfig().display().to_string();
    let proc_root = node.proc_root().display().to_string();
    let simulate = format!("--simulate={scenario}");
    let mut args = vec![
        simulate.as_str(),
        "-c",
        "200",
        "-k",
        "--kubernetes-refresh-interval",
        "200ms",
        "--pod-resources-kubelet-socket",
        &socket,
        "--kubeconfig",
        &kubeconfig,
        "--proc-root",
        &proc_root,
    ];
    args.extend(extra);
    Exporter::start(&args, &[("NODE_NAME", "node-a")])
}
