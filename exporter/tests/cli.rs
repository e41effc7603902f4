//! The command line: `--help` is snapshot-tested (UPDATE_SNAPSHOTS=1 rewrites it), and
//! bad input stops startup with an error that says where and what.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-exporter");

fn run(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("DCGM_EXPORTER_LISTEN")
        .env_remove("DCGM_EXPORTER_COLLECTORS")
        .env_remove("DCGM_EXPORTER_INTERVAL")
        .env_remove("DCGM_EXPORTER_WEB_CONFIG_FILE")
        .env_remove("RUST_LOG");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run gpu-exporter");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn scratch(name: &str, text: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn help_matches_the_snapshot() {
    let (code, help) = run(&["--help"], &[("COLUMNS", "100")]);
    assert_eq!(code, 0);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/help.txt");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &help).expect("write snapshot");
    }
    let expected =
        std::fs::read_to_string(&path).expect("snapshot (UPDATE_SNAPSHOTS=1 creates it)");
    assert_eq!(help, expected);
}

#[test]
fn a_malformed_log_level_stops_startup_instead_of_becoming_info() {
    let (code, out) = run(&["--simulate", "--log-level", "verbose"], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("\"verbose\" is not a level"), "{out}");
    let (code, out) = run(&["--simulate"], &[("RUST_LOG", "gpu_exporter=loud")]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("is not a log filter"), "{out}");
}

#[test]
fn a_counters_path_that_is_no_regular_file_is_refused_at_once() {
    let fifo = std::env::temp_dir().join(format!("gpu-exporter-cli-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    // A FIFO without a writer would block the read forever; /dev/zero would never end.
    for (path, says) in [
        ("/dev/zero", "a character device"),
        (fifo.to_str().expect("utf-8"), "a FIFO"),
    ] {
        let (code, out) = run(&["--simulate", "-f", path, "-a", "127.0.0.1:0"], &[]);
        assert_eq!(code, 1, "{path}: {out}");
        assert!(
            out.contains(&format!(
                "cannot read counters file {path}: not a regular file (it is {says})"
            )),
            "{out}"
        );
    }
    std::fs::remove_file(&fifo).expect("remove fifo");
}

#[test]
fn a_malformed_counters_line_names_file_line_and_fix() {
    let csv = scratch(
        "bad.csv",
        "# ok\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n\nDCGM_FI_DEV_GPU_UTILISATION, gauge, u\n",
    );
    let (code, out) = run(
        &[
            "--simulate",
            "-f",
            csv.to_str().expect("utf-8"),
            "-a",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{}:4:", csv.display())), "{out}");
    assert!(
        out.contains("DCGM_FI_DEV_GPU_UTIL"),
        "closest name suggested: {out}"
    );

    let csv = scratch("short.csv", "DCGM_FI_DEV_GPU_TEMP, gauge\n");
    let (code, out) = run(&["--simulate", "-f", csv.to_str().expect("utf-8")], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("short.csv:1:") && out.contains("expected 3 fields"),
        "{out}"
    );
}

#[test]
fn a_bad_scenario_or_address_is_a_clear_error() {
    let (code, out) = run(&["--simulate=/nonexistent/scenario.toml"], &[]);
    assert_eq!(code, 1);
    assert!(out.contains("/nonexistent/scenario.toml"), "{out}");
    let s = scratch(
        "bad.toml",
        "[[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\nload = { kind = \"constant\", percent = 150 }\n",
    );
    let arg = format!("--simulate={}", s.display());
    let (code, out) = run(&[arg.as_str()], &[]);
    assert_eq!(code, 1);
    assert!(out.contains("0..=100"), "{out}");
    let (code, out) = run(&["--simulate", "-a", "not-an-address"], &[]);
    assert_eq!(code, 1);
    assert!(out.contains("not-an-address"), "{out}");
}

#[test]
fn dcgm_exporter_environment_variables_are_honoured() {
    let csv = scratch("env.csv", "DCGM_FI_DEV_GPU_TEMP, gauge, temperature\n");
    let mut child = Command::new(BIN)
        .arg("--simulate")
        .env("DCGM_EXPORTER_LISTEN", "127.0.0.1:0")
        .env("DCGM_EXPORTER_INTERVAL", "250")
        .env("DCGM_EXPORTER_COLLECTORS", &csv)
        // Empty: no web config, as in dcgm-exporter.
        .env("DCGM_EXPORTER_WEB_CONFIG_FILE", "")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut address = None;
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.split("listening address=").nth(1) {
            address = rest.split_whitespace().next().map(str::to_string);
            seen.push(line);
            break;
        }
        seen.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = seen.join("\n");
    assert!(
        address.is_some_and(|a| a.starts_with("127.0.0.1:")),
        "{log}"
    );
    assert!(log.contains("interval_ms=250"), "{log}");
    assert!(log.contains("tls=false"), "{log}");
    assert!(
        log.contains("metrics=1"),
        "collectors file from the environment: {log}"
    );
}

/// Start the exporter on the simulated node with `args` and `envs`, wait until it
/// listens, stop it, and return its log.
fn startup_log(args: &[&str], envs: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(["--simulate", "-a", "127.0.0.1:0"])
        .args(args)
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let mut seen = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        let done = line.contains("listening address=");
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen.join("\n")
}

#[test]
fn each_ignored_dcgm_exporter_flag_is_logged_once_with_its_reason() {
    let log = startup_log(
        &[
            "-r",
            "nvidia-dcgm:5555",
            "--enable-pprof",
            "-dump-enabled",
            "--switch-devices=g:0",
        ],
        &[
            ("DCGM_EXPORTER_ENABLE_DCGM_LOG", "1"),
            ("DCGM_EXPORTER_USE_OLD_NAMESPACE", "false"),
        ],
    );
    let ignored: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dcgm-exporter flag ignored"))
        .collect();
    for (flag, reason) in [
        ("--remote-hostengine-info", "no DCGM hostengine"),
        ("--enable-pprof", "pprof"),
        ("--dump-enabled", "no DCGM objects to dump"),
        ("--switch-devices", "NVSwitch"),
        ("--enable-dcgm-log", "no DCGM library"),
    ] {
        let lines: Vec<&&str> = ignored
            .iter()
            .filter(|l| {
                l.contains(&format!("flag=\"{flag}\"")) || l.contains(&format!("flag={flag} "))
            })
            .collect();
        assert_eq!(lines.len(), 1, "{flag}: {log}");
        assert!(lines[0].contains(reason), "{flag}: {}", lines[0]);
    }
    // `-o` is served (the 1.x label names), not ignored.
    assert_eq!(ignored.len(), 5, "nothing else is reported: {ignored:#?}");
    // Not given: not reported.
    let quiet = startup_log(&[], &[]);
    assert!(!quiet.contains("dcgm-exporter flag ignored"), "{quiet}");
}

#[test]
fn dcgm_exporter_spellings_of_flags_and_values_are_accepted() {
    // Go's flag syntax: single-dash long names (and the -rbmn alias), =BOOL values,
    // Go's boolean spellings in the environment.
    let log = startup_log(
        &[
            "-collect-interval",
            "250",
            "-rbmn",
            "--no-hostname=false",
            "-k=false",
        ],
        &[("DCGM_EXPORTER_DEBUG", "1")],
    );
    assert!(log.contains("interval_ms=250"), "{log}");
    assert!(
        log.contains("DEBUG gpu_exporter: debug output is enabled"),
        "DCGM_EXPORTER_DEBUG=1 turns on debug logging: {log}"
    );
    // An explicit --log-level wins over --debug.
    let log = startup_log(&["--debug", "--log-level", "info"], &[]);
    assert!(!log.contains("debug output is enabled"), "{log}");
    assert!(log.contains("listening"), "{log}");

    let (code, out) = run(&["-v"], &[]);
    assert_eq!(
        (code, out.trim()),
        (0, concat!("gpu-exporter ", env!("CARGO_PKG_VERSION")))
    );
}

#[test]
fn invalid_values_of_dcgm_exporter_flags_stop_startup_clearly() {
    for (args, says) in [
        (&["-d", "g:0:1"][..], "only be one specified range"),
        (&["-d", "x"][..], "expected f, g[:IDS] or i[:IDS]"),
        (&["--cpu-devices", "g:a"][..], "invalid device ID \"a\""),
        (
            &["--kubernetes-gpu-id-type", "uuid"][..],
            "possible values: uid, device-name",
        ),
        (&["--dcgm-log-level", "LOUD"][..], "possible values: NONE"),
        (&["--kubernetes=yes"][..], "\"yes\" is not a boolean"),
        (&["-x", "five"][..], "five"),
    ] {
        let (code, out) = run(&[&["--simulate"][..], args].concat(), &[]);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(out.contains(says), "{args:?}: {out}");
    }
    let (code, out) = run(&["--simulate"], &[("DCGM_EXPORTER_DEBUG", "maybe")]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("\"maybe\" is not a boolean"), "{out}");
}

#[test]
fn a_bad_field_periods_value_stops_startup_naming_the_item_and_why() {
    let long = format!("*={}", "0".repeat(20_000));
    for (value, says) in [
        (
            "DCGM_FI_DEV_GPU_UTIL=1s,DCGM_FI_DEV_TOTAL_ENERGY=10s",
            "item 2: \"DCGM_FI_DEV_TOTAL_ENERGY\" is not a field this exporter reads (did you mean",
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "item 1 (\"DCGM_FI_DEV_GPU_UTIL\") is not FIELD=DURATION",
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL=fast",
            "item 1: DCGM_FI_DEV_GPU_UTIL: \"fast\" is not a duration",
        ),
        (
            "device-set=2h",
            "item 1: device-set: \"2h\" is longer than 3600s",
        ),
        (
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL=10s",
            "served as a per-second rate of two consecutive readings",
        ),
        ("DCGM_FI_DRIVER_VERSION=10s", "is not read from the GPU"),
        (long.as_str(), "at most 16384 are accepted"),
    ] {
        let (code, out) = run(&["--simulate", "--field-periods", value], &[]);
        assert_eq!(code, 2, "{value:.80}: {out}");
        assert!(out.contains(says), "{value:.80}: {out}");
        // clap quotes the value itself once; our message adds a bounded part.
        assert!(
            out.len() < 2048 + value.len(),
            "{} bytes of error",
            out.len()
        );
    }
    let (code, out) = run(
        &["--simulate"],
        &[("DCGM_EXPORTER_FIELD_PERIODS", "*=1s,*=2s")],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("item 2: * is given twice"), "{out}");
}

/// systemd's side of socket activation, in Python (tests only): bind a listening socket,
/// print its port, hand it over as descriptor 3 with LISTEN_FDS=1 and LISTEN_PID set to
/// the process itself, and exec the exporter (the same process, as systemd's child is).
const ACTIVATE: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
os.execve(sys.argv[1], sys.argv[1:], env)
"#;

#[test]
fn web_systemd_socket_serves_on_the_socket_systemd_passes() {
    // An --address already in use: binding it would stop startup, so it must not be.
    let occupied = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = occupied.local_addr().expect("address").to_string();
    let mut child = Command::new("python3")
        .args(["-c", ACTIVATE, BIN, "--simulate", "--web-systemd-socket"])
        .args(["-a", &taken])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let mut port = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut port)
        .expect("port");
    let address = format!("127.0.0.1:{}", port.trim());
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let answer = std::net::TcpStream::connect(&address).and_then(|mut c| {
            use std::io::{Read, Write};
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
            let mut text = String::new();
            c.read_to_string(&mut text)?;
            Ok(text)
        });
        match answer {
            Ok(text) if text.contains("DCGM_FI_DEV_GPU_TEMP{") => break text,
            _ if Instant::now() > deadline => panic!("no metrics on the passed socket {address}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
}

#[test]
fn web_systemd_socket_without_a_passed_socket_stops_startup_clearly() {
    let (code, out) = run(
        &["--simulate", "--web-systemd-socket", "-a", "127.0.0.1:0"],
        &[],
    );
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("no socket was passed"), "{out}");
}
