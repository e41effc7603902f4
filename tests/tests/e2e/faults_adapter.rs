//! The adapter against hostile peers and files (issue 20): a Prometheus or an exporter
//! answering huge, garbage, dripping, silent or not at all, and file flags given a
//! device or a FIFO. The adapter must survive, say what is wrong (an error for the
//! query, a refusal counted by reason, one log line), keep serving the targets that
//! answer, tell the truth on /readyz, and keep its memory within what its flags allow:
//! its peak RSS (VmHWM) is compared with the same adapter's against peers that send
//! nothing, plus a margin derived from --max-in-flight-size.

use e2e_tests::{Adapter, Process, binary, free_port, get, scratch_dir, wait_for, workspace};
use gpu_metrics_adapter::source::exposition::proto;
use prost::Message;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The limits the adapters here run with: small, so the margins are small too.
const MAX_RESPONSE: &str = "4Mi";
const MAX_IN_FLIGHT: &str = "8Mi";
const MAX_IN_FLIGHT_BYTES: u64 = 8 << 20;
const MAX_SERIES: &str = "5000";
const MAX_SERIES_COUNT: u64 = 5000;
/// Generous for one decoded series: its name, four labels, their allocations.
const SERIES_BYTES: u64 = 1 << 10;

/// What the issue saw: 200 MB per answer.
const HUGE: usize = 200_000_000;

/// How a fake peer answers each request.
type Behaviour = Arc<dyn Fn(&mut TcpStream) + Send + Sync>;

/// A loopback server answering every connection as `behaviour` says; its base URL.
pub(crate) fn serve(behaviour: Behaviour) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let behaviour = behaviour.clone();
            std::thread::spawn(move || {
                // The request head, up to its blank line.
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                behaviour(&mut stream);
            });
        }
    });
    format!("http://{address}")
}

/// A chunked 200 answer of `content_type`, `total` bytes made by `fill`, written until
/// the peer hangs up.
fn chunked(content_type: &'static str, total: usize, fill: fn(&mut [u8], usize)) -> Behaviour {
    Arc::new(move |stream: &mut TcpStream| {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        );
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut chunk = vec![0u8; 64 << 10];
        let mut sent = 0;
        while sent < total {
            fill(&mut chunk, sent);
            let frame = format!("{:x}\r\n", chunk.len());
            if stream.write_all(frame.as_bytes()).is_err()
                || stream.write_all(&chunk).is_err()
                || stream.write_all(b"\r\n").is_err()
            {
                return;
            }
            sent += chunk.len();
        }
        let _ = stream.write_all(b"0\r\n\r\n");
    })
}

/// Valid Prometheus JSON, endless samples: `{"status":"success","data":{…"result":[`
/// first, then `{"metric":{"pod":"p"},"value":[1,"1"]},` repeated (the closing
/// brackets never come within the limits).
fn json_fill(chunk: &mut [u8], sent: usize) {
    const START: &[u8] = br#"{"status":"success","data":{"resultType":"vector","result":["#;
    const SAMPLE: &[u8] = br#"{"metric":{"pod":"p","namespace":"n"},"value":[1,"1"]},"#;
    let mut at = 0;
    if sent == 0 {
        chunk[..START.len()].copy_from_slice(START);
        at = START.len();
    }
    while at < chunk.len() {
        let n = SAMPLE.len().min(chunk.len() - at);
        chunk[at..at + n].copy_from_slice(&SAMPLE[..n]);
        at += n;
    }
}

/// Pseudo-random bytes (xorshift).
fn random_fill(chunk: &mut [u8], sent: usize) {
    let mut x = (sent as u64) | 1;
    for b in chunk.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// A 200 head, then one byte of body every 100 ms, forever.
fn dripping() -> Behaviour {
    Arc::new(|stream: &mut TcpStream| {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        while stream.write_all(b"1\r\n{\r\n").is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Reads the request, never answers, holds the connection until the peer leaves.
fn silent() -> Behaviour {
    Arc::new(|stream: &mut TcpStream| {
        let mut sink = [0u8; 1024];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    })
}

/// A URL nothing listens on.
fn down() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// A protobuf exposition answer of `body`, with its Content-Length.
pub(crate) fn protobuf(body: Vec<u8>) -> Behaviour {
    let body = Arc::new(body);
    Arc::new(move |stream: &mut TcpStream| {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(&body));
    })
}

/// One GPU_UTIL family with `series` series, spread over `pods` pods of `namespace`
/// (each on its own GPU), every value `value`.
fn exposition(namespace: &str, pods: usize, series: usize, value: f64) -> Vec<u8> {
    let label = |name: &str, value: String| proto::LabelPair {
        name: Some(name.into()),
        value: Some(value),
    };
    let family = proto::MetricFamily {
        name: Some("DCGM_FI_DEV_GPU_UTIL".into()),
        r#type: Some(proto::MetricType::Gauge as i32),
        metric: (0..series)
            .map(|i| proto::Metric {
                label: vec![
                    label("UUID", format!("GPU-{i:08}")),
                    label("container", "main".into()),
                    label("namespace", namespace.into()),
                    label("pod", format!("p-{}", i % pods)),
                ],
                gauge: Some(proto::Gauge { value: Some(value) }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut body = Vec::new();
    family
        .encode_length_delimited(&mut body)
        .expect("encode into a Vec");
    body
}

/// The value of a custom metrics answer for one pod, in thousandths.
fn utilization_milli(body: &str) -> i64 {
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
    let quantity = v["items"][0]["value"].as_str().expect("a quantity");
    e2e_tests::quantity::milli_value(quantity).expect("a quantity")
}

/// The message of a `NotFound` Status body (empty for any other body).
fn not_found_message(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    match (&v["kind"], &v["reason"]) {
        (serde_json::Value::String(k), serde_json::Value::String(r))
            if k == "Status" && r == "NotFound" =>
        {
            v["message"].as_str().unwrap_or_default().to_string()
        }
        _ => String::new(),
    }
}

/// A kB field of /proc/PID/status, in bytes.
pub(crate) fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no {field} in the status"))
}

/// A sample of the adapter's own /metrics, 0 when absent.
pub(crate) fn self_metric(adapter: &Adapter, series: &str) -> f64 {
    let (status, body) = get(&format!("{}/metrics", adapter.base));
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn failures(adapter: &Adapter) -> f64 {
    self_metric(
        adapter,
        r#"gpu_metrics_adapter_source_scrapes_total{result="failure"}"#,
    )
}

pub(crate) fn rejected(adapter: &Adapter, reason: &str) -> f64 {
    self_metric(
        adapter,
        &format!(r#"gpu_metrics_adapter_source_target_rejected_total{{reason="{reason}"}}"#),
    )
}

fn limit_flags() -> Vec<&'static str> {
    vec![
        "--scrape-interval",
        "300ms",
        "--scrape-timeout",
        "1s",
        "--max-response-size",
        MAX_RESPONSE,
        "--max-in-flight-size",
        MAX_IN_FLIGHT,
        "--max-series-per-target",
        MAX_SERIES,
    ]
}

/// The adapter against a Prometheus at `url`, after `rounds` failed query rounds:
/// its VmHWM, and the adapter (still running).
fn against_prometheus(url: &str, rounds: f64) -> (u64, Adapter) {
    let mut args = limit_flags();
    args.extend(["--prometheus-url", url]);
    let adapter = Adapter::start(&args);
    wait_for("failed query rounds", Duration::from_secs(60), || {
        (failures(&adapter) >= rounds).then_some(())
    });
    (status_bytes(adapter.process.pid(), "VmHWM"), adapter)
}

/// The peak RSS allowed against hostile peers: the peak against peers that send
/// nothing, plus four times the in-flight budget (what is read, a copy while a buffer
/// grows, with the allocator's slack) and one body's decoded series at their limit.
/// Without the limits a single 200 MB answer would pass it many times over.
fn allowed_peak(baseline: u64) -> u64 {
    baseline + 4 * MAX_IN_FLIGHT_BYTES + MAX_SERIES_COUNT * SERIES_BYTES
}

#[test]
fn a_prometheus_answering_huge_garbage_dripping_or_not_at_all_costs_an_error_not_memory() {
    let (baseline, quiet) = against_prometheus(&down(), 2.0);
    drop(quiet);
    let down = down();
    let silent = serve(silent());
    let huge_json = serve(chunked("application/json", HUGE, json_fill));
    let huge_random = serve(chunked("application/json", HUGE, random_fill));
    let dripping = serve(dripping());
    for (what, url, too_large) in [
        ("down", down.as_str(), false),
        ("silent", silent.as_str(), false),
        ("dripping", dripping.as_str(), false),
        ("200 MB of valid JSON", huge_json.as_str(), true),
        ("200 MB of random bytes", huge_random.as_str(), true),
    ] {
        let (peak, mut adapter) = against_prometheus(url, 3.0);
        eprintln!("Prometheus {what}: VmHWM {peak} bytes (baseline {baseline})");
        assert!(
            adapter.process.exited().is_none(),
            "{what}: the adapter exited"
        );
        assert!(
            peak <= allowed_peak(baseline),
            "{what}: VmHWM {peak} bytes, over the {} allowed (baseline {baseline})",
            allowed_peak(baseline)
        );
        if too_large {
            assert!(rejected(&adapter, "too_large") >= 3.0, "{what}");
        }
        // Never answered: not ready, and a query says why instead of inventing a value.
        let (status, body) = get(&format!("{}/readyz", adapter.base));
        assert_eq!(
            (status, body.as_str()),
            (503, "no exporter has answered yet"),
            "{what}"
        );
        let (status, body) = get(&format!(
            "{}/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/a/gpu_utilization",
            adapter.base
        ));
        assert_eq!(
            (status, not_found_message(&body).as_str()),
            (
                404,
                "no fresh gpu_utilization for pods a in ml (0 pods with stale data, 1 without data)"
            ),
            "{what}: {body}"
        );
        // One warning when the source starts failing, not one per round.
        let warnings = adapter
            .process
            .log()
            .matches("Prometheus query failed")
            .count();
        assert_eq!(warnings, 1, "{what}:\n{}", adapter.process.log());
    }
}

#[test]
fn exporters_answering_huge_garbage_dripping_or_not_at_all_are_dropped_and_the_rest_served() {
    let good = serve(protobuf(exposition("ml", 1, 1, 42.0)));
    // The issue's 15 MiB answer: 140,000 pod series from one exporter.
    let huge = serve(protobuf(exposition("huge", 140_000, 140_000, 1.0)));
    // Under the size limit, over the series limit.
    let many_series = serve(protobuf(exposition("series", 100, 6_000, 1.0)));
    // Under both, over the pod limit (1,000 by default).
    let many_pods = serve(protobuf(exposition("pods", 1_500, 1_500, 1.0)));
    let garbage = serve(chunked(
        "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited",
        1 << 20,
        random_fill,
    ));
    let dripping = serve(dripping());
    let slow = serve(silent());
    let down = down();
    let start = |targets: &[&str]| {
        let mut args = limit_flags();
        for t in targets {
            args.extend(["--exporter-url", t]);
        }
        Adapter::start(&args)
    };
    let served = |adapter: &Adapter, namespace: &str, pod: &str| {
        get(&format!(
            "{}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/{pod}/gpu_utilization",
            adapter.base
        ))
    };
    let until_good = |adapter: &Adapter| {
        wait_for("the good exporter's pod", Duration::from_secs(60), || {
            let (status, body) = served(adapter, "ml", "p-0");
            (status == 200).then_some(body)
        })
    };
    // The baseline: the good exporter and targets that send nothing.
    let quiet = start(&[&good, &slow, &down]);
    until_good(&quiet);
    wait_for("failed scrapes", Duration::from_secs(60), || {
        (failures(&quiet) >= 6.0).then_some(())
    });
    let baseline = status_bytes(quiet.process.pid(), "VmHWM");
    drop(quiet);

    let targets = [
        &good,
        &huge,
        &many_series,
        &many_pods,
        &garbage,
        &dripping,
        &slow,
        &down,
    ];
    let targets: Vec<&str> = targets.iter().map(|s| s.as_str()).collect();
    let mut adapter = start(&targets);
    assert_eq!(utilization_milli(&until_good(&adapter)), 42_000);
    for reason in ["too_large", "series_limit", "pod_limit"] {
        wait_for(
            &format!("refusals for {reason}"),
            Duration::from_secs(60),
            || (rejected(&adapter, reason) >= 3.0).then_some(()),
        );
    }
    wait_for("failed scrapes", Duration::from_secs(60), || {
        (failures(&adapter) >= 30.0).then_some(())
    });
    assert!(adapter.process.exited().is_none(), "the adapter exited");
    let peak = status_bytes(adapter.process.pid(), "VmHWM");
    eprintln!("exporters: VmHWM {peak} bytes (baseline {baseline})");
    assert!(
        peak <= allowed_peak(baseline),
        "VmHWM {peak} bytes, over the {} allowed (baseline {baseline})",
        allowed_peak(baseline)
    );
    // The good target keeps the adapter ready and served; the refused ones' pods are not.
    let (status, body) = get(&format!("{}/readyz", adapter.base));
    assert_eq!(status, 200, "{body}");
    let (status, body) = served(&adapter, "ml", "p-0");
    assert_eq!(status, 200, "{body}");
    assert_eq!(utilization_milli(&body), 42_000);
    for namespace in ["huge", "series", "pods"] {
        let (status, body) = served(&adapter, namespace, "p-0");
        assert_eq!(
            (status, not_found_message(&body)),
            (
                404,
                format!(
                    "no fresh gpu_utilization for pods p-0 in {namespace} (0 pods with stale data, 1 without data)"
                )
            ),
            "{namespace}: {body}"
        );
    }
    // One log line per refused target, however many times it is refused.
    let log = adapter.process.log();
    for url in [&huge, &many_series, &many_pods] {
        let lines = log
            .lines()
            .filter(|l| l.contains("exporter answer refused") && l.contains(url.as_str()))
            .count();
        assert_eq!(lines, 1, "{url}:\n{log}");
    }
}

/// A FIFO in a fresh scratch folder.
fn fifo(name: &str) -> std::path::PathBuf {
    let dir = scratch_dir(name);
    let path = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
    assert!(made.success());
    path
}

/// Run `cmd` to its exit: it must fail within a few seconds, saying `says` and naming
/// `path`.
fn fails_quickly(mut cmd: Command, path: &str, says: &str) {
    cmd.current_dir(workspace());
    let shown = format!("{cmd:?}");
    let started = Instant::now();
    let mut process = Process::spawn(cmd);
    let code = process.wait_exit(Duration::from_secs(20));
    let log = process.log();
    assert_ne!(code, Some(0), "{shown}:\n{log}");
    assert!(
        log.contains(says) && log.contains(path),
        "{shown} did not say {says:?} about {path}:\n{log}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{shown} took {:?}",
        started.elapsed()
    );
}

/// Each file flag, given a device or a FIFO, stops startup at once. Every other flag
/// is one that lets startup reach the file: a kubeconfig for an API server that is
/// never called (nothing listens there), an exporter URL, no ConfigMap lookup.
#[test]
fn adapter_file_flags_refuse_devices_and_fifos_at_startup() {
    let fifo = fifo("faults-adapter-fifo");
    let kubeconfig = fifo.with_file_name("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: c, context: {cluster: k, user: u}}]\n",
    )
    .expect("write the kubeconfig");
    let kubeconfig = kubeconfig.to_str().expect("UTF-8 path");
    let fifo = fifo.to_str().expect("UTF-8 path");
    let reaches_the_files = [
        "--kubeconfig",
        kubeconfig,
        "--exporter-url",
        "http://127.0.0.1:1/metrics",
        "--authentication-skip-lookup",
    ];
    for path in ["/dev/zero", fifo] {
        let cases: Vec<Vec<&str>> = vec![
            vec!["--insecure-serve-http", "--kubeconfig", path],
            vec![
                "--insecure-serve-http",
                "--exporter-url",
                "https://127.0.0.1:1/metrics",
                "--exporter-ca-file",
                path,
            ],
            vec![
                "--insecure-serve-http",
                "--prometheus-url",
                "https://127.0.0.1:1",
                "--prometheus-ca-file",
                path,
            ],
            [
                &reaches_the_files[..],
                &["--tls-cert-file", path, "--tls-private-key-file", path],
            ]
            .concat(),
            // Issue 27: the composite metrics file too.
            vec![
                "--insecure-serve-http",
                "--exporter-url",
                "http://127.0.0.1:1/metrics",
                "--composite-metrics-file",
                path,
            ],
            [&reaches_the_files[..], &["--client-ca-file", path]].concat(),
            [
                &reaches_the_files[..],
                &["--requestheader-client-ca-file", path],
            ]
            .concat(),
            [&reaches_the_files[..], &["--grpc-client-ca-file", path]].concat(),
            [
                &reaches_the_files[..],
                &["--authentication-kubeconfig", path],
            ]
            .concat(),
            [
                &reaches_the_files[..],
                &["--authorization-kubeconfig", path],
            ]
            .concat(),
        ];
        for flags in cases {
            let mut cmd = Command::new(binary("gpu-metrics-adapter"));
            cmd.args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                "0",
                "--grpc-port",
                "0",
            ])
            .args(&flags)
            .env_remove("KUBECONFIG");
            fails_quickly(cmd, path, "not a regular file");
        }
    }
}

/// Issue 27: a composite metrics file with a 20,000-term chain (or a megabyte of
/// `*1`) stops startup at once, naming the file, line and column where the term past
/// the cap starts; before, the first query (or startup) overflowed the stack.
#[test]
fn a_composite_file_past_the_term_cap_stops_startup_naming_line_and_column() {
    let dir = scratch_dir("faults-composite-cap");
    let sum = format!("c = {}gpu_utilization", "gpu_utilization+".repeat(19_999));
    let product = format!("c = gpu_utilization{}", "*1".repeat(500_000));
    for (text, column) in [
        // Term 1001 starts after 1000 of `gpu_utilization+`.
        (&sum, "c = ".len() + 1000 * "gpu_utilization+".len() + 1),
        // After `gpu_utilization` and 999 of `*1`, at the `1` of the next.
        (&product, "c = gpu_utilization".len() + 999 * 2 + 2),
    ] {
        let file = dir.join("composites.conf");
        std::fs::write(&file, format!("# issue 27\n{text}\n")).expect("write");
        let path = file.to_str().expect("UTF-8 path");
        let cmd = Adapter::command(&[
            "--exporter-url",
            "http://127.0.0.1:1/metrics",
            "--composite-metrics-file",
            path,
        ]);
        fails_quickly(
            cmd,
            path,
            &format!("{path}:2:{column}: \"c = gpu_utilization"),
        );
    }
}

#[test]
fn the_exporters_simulate_flag_refuses_devices_and_fifos() {
    let fifo = fifo("faults-exporter-fifo");
    let fifo = fifo.to_str().expect("UTF-8 path");
    for path in ["/dev/zero", fifo] {
        let mut cmd = Command::new(binary("gpu-exporter"));
        cmd.arg(format!("--simulate={path}"))
            .args(["-a", "127.0.0.1:0"]);
        fails_quickly(cmd, path, "not a regular file");
    }
}

/// A kubeconfig whose `client-key` (or CA, certificate, token file) is a FIFO or a link
/// to `/dev/zero` stops either binary at startup, naming that file: kube-rs read these
/// itself, unbounded, and a FIFO blocked startup for good with no log line.
#[test]
fn files_a_kubeconfig_names_that_are_devices_or_fifos_stop_startup_at_once() {
    let fifo = fifo("faults-kubeconfig-files");
    let dir = fifo.parent().expect("scratch folder").to_path_buf();
    let zero = dir.join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("link to /dev/zero");
    let pem = dir.join("ok.pem");
    std::fs::write(
        &pem,
        "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n",
    )
    .expect("write a PEM file");
    let pem = pem.to_str().expect("UTF-8 path");
    for bad in [
        fifo.to_str().expect("UTF-8 path"),
        zero.to_str().expect("UTF-8 path"),
    ] {
        for key in ["client-key", "certificate-authority", "tokenFile"] {
            let pick = |k: &str| if k == key { bad } else { pem };
            let user = if key == "tokenFile" {
                format!("{{tokenFile: '{bad}'}}")
            } else {
                format!(
                    "{{client-certificate: '{pem}', client-key: '{}'}}",
                    pick("client-key")
                )
            };
            let kubeconfig = dir.join(format!("kubeconfig-{key}"));
            std::fs::write(
                &kubeconfig,
                format!(
                    "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                     clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:1', certificate-authority: '{}'}}}}]\n\
                     users: [{{name: u, user: {user}}}]\n\
                     contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n",
                    pick("certificate-authority")
                ),
            )
            .expect("write the kubeconfig");
            let kubeconfig = kubeconfig.to_str().expect("UTF-8 path");

            let mut adapter = Command::new(binary("gpu-metrics-adapter"));
            adapter
                .args([
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    "0",
                    "--grpc-port",
                    "0",
                    "--insecure-serve-http",
                    "--kubeconfig",
                    kubeconfig,
                ])
                .env_remove("KUBECONFIG");
            fails_quickly(adapter, bad, "not a regular file");

            // The exporter needs the API at startup for `-m` (counters from a ConfigMap).
            let mut exporter = Command::new(binary("gpu-exporter"));
            exporter
                .args(["--simulate", "-a", "127.0.0.1:0", "-m", "gpu:counters"])
                .args(["--kubeconfig", kubeconfig]);
            fails_quickly(exporter, bad, "not a regular file");
        }
    }
}

/// A gauge sample of `family` on GPU `uuid`, held by pod `pod` of namespace "ml".
fn gauge(uuid: &str, pod: &str, value: f64) -> proto::Metric {
    let label = |name: &str, value: &str| proto::LabelPair {
        name: Some(name.into()),
        value: Some(value.into()),
    };
    proto::Metric {
        label: vec![
            label("UUID", uuid),
            label("container", "main"),
            label("namespace", "ml"),
            label("pod", pod),
        ],
        gauge: Some(proto::Gauge { value: Some(value) }),
        ..Default::default()
    }
}

/// Issue 27: an exporter reports pod `bad` on two GPUs at 1e308 W (and 1e308 % and
/// MiB): finite samples whose sum, mean and bytes overflow. Before, +Inf was served:
/// KEDA's GetMetrics answered +Inf and IsActive true, p95 NaN, metrics-api null, the
/// namespace's mean 500 for every pod. Now `bad` is missing on every face, exactly
/// like a pod without data, and its neighbours `ok-0` (100 W) and `ok-1` (200 W) are
/// served as if it were not there.
#[test]
fn values_that_overflow_are_one_pods_missing_data_on_every_face() {
    use gpu_metrics_adapter::faces::keda::proto::external_scaler_client::ExternalScalerClient;
    use gpu_metrics_adapter::faces::keda::proto::{GetMetricsRequest, ScaledObjectRef};
    let family = |name: &str, bad: f64, ok: [f64; 2]| proto::MetricFamily {
        name: Some(name.into()),
        r#type: Some(proto::MetricType::Gauge as i32),
        metric: vec![
            gauge("GPU-0", "bad", bad),
            gauge("GPU-1", "bad", bad),
            gauge("GPU-2", "ok-0", ok[0]),
            gauge("GPU-3", "ok-1", ok[1]),
        ],
        ..Default::default()
    };
    let mut body = Vec::new();
    for f in [
        family("DCGM_FI_DEV_POWER_USAGE", 1e308, [100.0, 200.0]),
        family("DCGM_FI_DEV_GPU_UTIL", 1e308, [0.0, 0.0]),
        family("DCGM_FI_DEV_FB_USED", 1e308, [1024.0, 1024.0]),
    ] {
        f.encode_length_delimited(&mut body).expect("encode");
    }
    let exporter = serve(protobuf(body));
    let mut adapter = Adapter::start(&[
        "--exporter-url",
        &format!("{exporter}/metrics"),
        "--scrape-interval",
        "300ms",
        "--composite-metric",
        "heat=gpu_power_watts + gpu_utilization",
    ]);
    let custom = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml";
    let external = "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml";
    let value = |v: &serde_json::Value, i: usize| {
        let q = v["items"][i]["value"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        e2e_tests::quantity::milli_value(q).expect("a quantity") as f64 / 1000.0
    };
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|i| {
                i["describedObject"]["name"]
                    .as_str()
                    .or_else(|| i["metricLabels"]["pod"].as_str())
                    .unwrap_or("")
                    .to_string()
            })
            .collect()
    };
    for metric in ["gpu_power_watts", "heat"] {
        let pods = adapter.ok(&format!("{custom}/pods/*/{metric}"));
        assert_eq!(names(&pods), ["ok-0", "ok-1"], "{metric}: {pods}");
        let (status, body) = adapter.get(&format!("{custom}/pods/bad/{metric}"));
        assert_eq!(status, 404, "{metric}: like a pod without data: {body}");
        let per_pod = adapter.ok(&format!("{external}/{metric}"));
        assert_eq!(names(&per_pod), ["ok-0", "ok-1"], "{metric}: {per_pod}");
    }
    // The aggregates are over the neighbours alone (oracle: 100 and 200).
    let mean = adapter.ok(&format!("{custom}/metrics/gpu_power_watts"));
    assert_eq!(value(&mean, 0), 150.0, "{mean}");
    for (suffix, want) in [
        ("sum", 300.0),
        ("p95", 100.0 + 0.95 * 100.0),
        ("max", 200.0),
    ] {
        let v = adapter.ok(&format!("{external}/gpu_power_watts:{suffix}"));
        assert_eq!(value(&v, 0), want, "{suffix}: {v}");
    }
    let api = adapter.ok("/metrics-api/namespaces/ml/gpu_power_watts?podSelector=&aggregation=sum");
    assert_eq!(api["value"].as_f64(), Some(300.0), "{api}");
    // KEDA: the value is the neighbours' sum, under the activation threshold.
    let grpc = adapter.grpc_address();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut client = ExternalScalerClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect");
        let so = ScaledObjectRef {
            name: "bad".into(),
            namespace: "ml".into(),
            scaler_metadata: [
                ("metric", "gpu_power_watts"),
                ("targetValue", "100"),
                ("activationTargetValue", "1000"),
                ("podSelector", ""),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        };
        let active = client.is_active(so.clone()).await.expect("IsActive");
        assert!(!active.into_inner().result, "300 W is not over 1000");
        let m = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(so),
                metric_name: "gpu_power_watts".into(),
            })
            .await
            .expect("GetMetrics")
            .into_inner();
        assert_eq!(m.metric_values[0].metric_value_float, 300.0);
    });
    assert!(adapter.process.exited().is_none(), "the adapter exited");
}

/// Issue 27: serving engines. Pod `bad`'s engine reports two waiting queues at 1e308
/// (their sum overflows), a KV-cache usage of -3 and a duplicate series; `ok`'s engine
/// 3 waiting, 0.5 KV-cache usage. Before, the namespace's sum of waiting requests
/// answered 500 for both pods and -3 was served. Now `bad` is missing those values,
/// the sum is `ok`'s, and each refusal is counted for `bad`'s target by reason.
#[test]
fn serving_values_out_of_range_are_refused_counted_and_the_neighbours_served() {
    let text = |body: &'static str| -> Behaviour {
        Arc::new(move |stream: &mut TcpStream| {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream
                .write_all(head.as_bytes())
                .and_then(|()| stream.write_all(body.as_bytes()));
        })
    };
    let bad = serve(text(
        "vllm:num_requests_waiting{engine=\"0\"} 1e308\n\
         vllm:num_requests_waiting{engine=\"1\"} 1e308\n\
         vllm:kv_cache_usage_perc{engine=\"0\"} -3\n\
         vllm:num_requests_running{engine=\"0\"} 2\n\
         vllm:num_requests_running{engine=\"0\"} 2\n",
    ));
    let ok = serve(text(
        "vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running 1\n",
    ));
    let bad_target = format!("{bad}/metrics");
    let adapter = Adapter::start(&[
        "--scrape-interval",
        "300ms",
        "--serving-target",
        &format!("llm/bad={bad_target}"),
        "--serving-target",
        &format!("llm/ok={ok}/metrics"),
    ]);
    let external = "/apis/external.metrics.k8s.io/v1beta1/namespaces/llm";
    let value = |v: &serde_json::Value| {
        let q = v["items"][0]["value"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        e2e_tests::quantity::milli_value(q).expect("a quantity") as f64 / 1000.0
    };
    // Both engines answered: the running requests are both pods' (2, counted once
    // though `bad` repeats the series, and 1).
    wait_for("both engines", Duration::from_secs(30), || {
        let v = adapter.ok(&format!("{external}/serving_requests_running"));
        (value(&v) == 3.0).then_some(())
    });
    let waiting = adapter.ok(&format!("{external}/serving_requests_waiting"));
    assert_eq!(value(&waiting), 3.0, "ok's queue alone: {waiting}");
    let custom = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm";
    let (status, body) = adapter.get(&format!("{custom}/pods/bad/serving_kv_cache_usage"));
    assert_eq!(status, 404, "-3 is refused: {body}");
    let kv = adapter.ok(&format!("{custom}/pods/ok/serving_kv_cache_usage"));
    assert_eq!(value(&kv), 0.5, "{kv}");
    let refused = |reason: &str| {
        self_metric(
            &adapter,
            &format!(
                "gpu_metrics_adapter_serving_source_samples_refused_total{{target=\"{bad_target}\",reason=\"{reason}\"}}"
            ),
        )
    };
    wait_for("counted refusals", Duration::from_secs(30), || {
        (refused("not_finite") >= 1.0
            && refused("out_of_range") >= 1.0
            && refused("duplicate") >= 1.0)
            .then_some(())
    });
}
