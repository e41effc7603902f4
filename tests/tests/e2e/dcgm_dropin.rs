//! A drop-in for dcgm-exporter where it is deployed today (issue 17): the exporter
//! starts with the exact argument lists and environment of dcgm-exporter's Helm chart
//! and of the GPU Operator's DaemonSet (tests/fixtures/dcgm-exporter-deployments.yaml),
//! answers their `/health` probe over IPv4 and IPv6 on the default `:PORT`, and serves
//! `/metrics`; `/health` tells the truth; `-d/--devices` narrows what is served; an
//! explicit address stays single-stack.

use e2e_tests::{
    Exporter, Process, binary, fake_nvml, free_port, get, scratch_dir, try_get, wait_for, workspace,
};
use std::collections::BTreeSet;
use std::net::{Ipv6Addr, TcpListener};
use std::process::Command;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(30);

fn host_has_ipv6() -> bool {
    TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_ok()
}

/// `GET /health` → (status, body, Content-Type).
fn health(base: &str) -> Result<(u16, String, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut resp = agent
        .get(format!("{base}/health"))
        .call()
        .map_err(|e| e.to_string())?;
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((resp.status().as_u16(), body, content_type))
}

/// The fake libnvidia-ml under the name the exporter loads by default, so a
/// deployment's argument list runs unchanged (no --nvml-lib).
fn fake_driver_dir() -> std::path::PathBuf {
    let dir = scratch_dir("dcgm-dropin-driver");
    let link = dir.join("libnvidia-ml.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(fake_nvml(), &link).expect("symlink the fake driver");
    dir
}

/// The GPU series' `gpu`/`GPU_I_ID` label pairs of `DCGM_FI_DEV_FB_USED` (served on
/// GPUs and MIG instances alike).
fn served_devices(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
        .map(|l| {
            let label = |name: &str| {
                l.split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .unwrap_or("-")
                    .to_string()
            };
            format!("gpu={} GPU_I_ID={}", label("gpu"), label("GPU_I_ID"))
        })
        .collect()
}

#[test]
fn helm_chart_and_gpu_operator_argument_lists_start_and_answer_over_ipv4_and_ipv6() {
    let fixture = workspace().join("tests/fixtures/dcgm-exporter-deployments.yaml");
    let text = std::fs::read_to_string(&fixture).expect("fixture");
    let deployments: serde_json::Value = serde_saphyr::from_str(&text).expect("fixture YAML");
    let deployments = deployments.as_array().expect("a list");
    assert_eq!(deployments.len(), 4, "chart twice, operator twice");
    assert!(
        !std::path::Path::new("/etc/dcgm-exporter").exists(),
        "this test needs a machine without dcgm-exporter's image files"
    );
    let driver = fake_driver_dir();
    for d in deployments {
        let name = d["name"].as_str().expect("name");
        let args: Vec<&str> = d["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg"))
            .collect();
        let port = free_port();
        let mut cmd = Command::new(binary("gpu-exporter"));
        cmd.current_dir(workspace())
            .env_clear()
            .args(&args)
            .env("LD_LIBRARY_PATH", &driver)
            .env("GPU_SIM_SCENARIO", "tests/fixtures/golden-node.toml");
        for (key, value) in d["env"].as_object().expect("env") {
            let value = value.as_str().expect("string value");
            let value = match (key.as_str(), value) {
                ("DCGM_EXPORTER_LISTEN", ":9400") => format!(":{port}"),
                ("NODE_NAME", "spec.nodeName") => "e2e-node".to_string(),
                _ => value.to_string(),
            };
            cmd.env(key, value);
        }
        let mut exporter = Process::spawn(cmd);
        let line = exporter.wait_for_line("listening address=", PATIENCE);
        assert!(
            line.contains(&format!("address=[::]:{port}")) || !host_has_ipv6(),
            "{name}: the default address listens on every interface of both families: {line}"
        );
        let mut bases = vec![format!("http://127.0.0.1:{port}")];
        if host_has_ipv6() {
            bases.push(format!("http://[::1]:{port}"));
        }
        for base in &bases {
            let (status, body, content_type) =
                wait_for(&format!("{name}: /health over {base}"), PATIENCE, || {
                    health(base).ok().filter(|(status, _, _)| *status == 200)
                });
            assert_eq!(
                (status, body.as_str(), content_type.as_str()),
                (200, "OK", "text/plain; charset=utf-8"),
                "{name}"
            );
            let (status, metrics) = get(&format!("{base}/metrics"));
            assert_eq!(status, 200, "{name}");
            assert_eq!(
                served_devices(&metrics).len(),
                served_devices_of_golden_node(),
                "{name}: every device of the node is served over {base}:\n{metrics}"
            );
        }
        let log = exporter.log();
        if d["env"].get("DCGM_REMOTE_HOSTENGINE_INFO").is_some() {
            let ignored: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("dcgm-exporter flag ignored"))
                .collect();
            assert_eq!(ignored.len(), 1, "{name}: {ignored:#?}");
            assert!(
                ignored[0].contains("--remote-hostengine-info")
                    && ignored[0].contains("hostengine"),
                "{name}: {ignored:#?}"
            );
        }
    }
}

/// How many GPUs and MIG instances tests/fixtures/golden-node.toml has, from the
/// scenario itself.
fn served_devices_of_golden_node() -> usize {
    let scenario = gpu_sim::Scenario::load(&workspace().join("tests/fixtures/golden-node.toml"))
        .expect("scenario");
    scenario
        .gpus
        .iter()
        .map(|g| 1 + g.mig.iter().map(|m| m.count as usize).sum::<usize>())
        .sum()
}

/// `-a ADDRESS` with the simulated node; waits until it listens.
fn exporter_at(address: &str, extra: &[&str]) -> Process {
    let mut cmd = Command::new(binary("gpu-exporter"));
    cmd.current_dir(workspace())
        .args(["--simulate", "-c", "200", "-a", address])
        .args(extra)
        .env_remove("DCGM_EXPORTER_LISTEN")
        .env("RUST_LOG", "info");
    let mut p = Process::spawn(cmd);
    p.wait_for_line("listening address=", PATIENCE);
    p
}

fn port_of(p: &Process) -> u16 {
    let log = p.log();
    let address = log
        .split("listening address=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("address");
    address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port")
}

#[test]
fn an_explicit_address_stays_single_stack() {
    let v4 = exporter_at("127.0.0.1:0", &[]);
    let port = port_of(&v4);
    assert!(health(&format!("http://127.0.0.1:{port}")).is_ok());
    if !host_has_ipv6() {
        return;
    }
    assert!(
        health(&format!("http://[::1]:{port}")).is_err(),
        "127.0.0.1 is IPv4 only"
    );
    let v6 = exporter_at("[::1]:0", &[]);
    let port = port_of(&v6);
    assert!(health(&format!("http://[::1]:{port}")).is_ok());
    assert!(
        health(&format!("http://127.0.0.1:{port}")).is_err(),
        "[::1] is IPv6 only"
    );
}

#[test]
fn devices_narrows_the_served_gpus_and_mig_instances() {
    let all = Exporter::start(&["--simulate", "-c", "200"], &[]);
    let every = served_devices(&all.metrics_after_samples(2));
    let gpus: BTreeSet<String> = every
        .iter()
        .filter(|d| d.ends_with("GPU_I_ID=-"))
        .cloned()
        .collect();
    let instances: BTreeSet<String> = every.difference(&gpus).cloned().collect();
    assert!(
        gpus.len() >= 3 && instances.len() >= 2,
        "the demo node has GPUs and MIG: {every:?}"
    );
    let first_instance = instances
        .iter()
        .min_by_key(|d| {
            let n = |k: &str| -> u32 {
                d.split(&format!("{k}="))
                    .nth(1)
                    .and_then(|s| s.split(' ').next())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(u32::MAX)
            };
            (n("gpu"), n("GPU_I_ID"))
        })
        .cloned()
        .expect("an instance");

    for (devices, expected) in [
        ("g", gpus.clone()),
        (
            "g:0,2-3",
            gpus.iter()
                .filter(|d| {
                    ["gpu=0 ", "gpu=2 ", "gpu=3 "]
                        .iter()
                        .any(|p| d.starts_with(p))
                })
                .cloned()
                .collect(),
        ),
        ("i", instances.clone()),
        ("i:0", BTreeSet::from([first_instance.clone()])),
        ("f", every.clone()),
    ] {
        let e = Exporter::start(&["--simulate", "-c", "200", "-d", devices], &[]);
        let served = served_devices(&e.metrics_after_samples(2));
        assert_eq!(served, expected, "-d {devices}");
        assert_eq!(get(&e.url("/health")).0, 200, "-d {devices}");
    }

    // A selection that names no device of the node: alive, but not healthy, and says why.
    let none = Exporter::start(&["--simulate", "-c", "200", "-d", "g:70"], &[]);
    none.metrics_after_samples(2);
    let (status, body) = get(&none.url("/health"));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no GPU to report"), "{body}");
    assert_eq!(get(&none.url("/readyz")).0, 503);
    assert_eq!(get(&none.url("/healthz")).0, 200);
    assert!(
        none.process
            .log()
            .contains("--devices names GPUs this node does not have")
    );
}

#[test]
fn health_fails_while_the_driver_hangs_and_recovers() {
    let e = Exporter::start(
        &[
            "--nvml-lib",
            fake_nvml().to_str().expect("utf-8"),
            "-c",
            "200",
        ],
        &[("GPU_SIM_SCENARIO", "tests/fixtures/driver-hang.toml")],
    );
    let status = || try_get(&e.url("/health"), &[]).ok();
    wait_for("healthy", PATIENCE, || status().filter(|(s, _)| *s == 200));
    // Stale data fails it first; once the call is over its budget, it says hung.
    wait_for("unhealthy, saying the driver is hung", PATIENCE, || {
        status().filter(|(s, why)| *s == 503 && why.contains("the driver is hung"))
    });
    wait_for("healthy again", PATIENCE, || {
        status().filter(|(s, _)| *s == 200)
    });
}

#[test]
fn the_adapter_listens_on_ipv4_and_ipv6_by_default() {
    let mut cmd = Command::new(binary("gpu-metrics-adapter"));
    cmd.current_dir(workspace())
        .args([
            "--insecure-serve-http",
            "--secure-port",
            "0",
            "--grpc-port",
            "0",
        ])
        .args(["--exporter-url", "http://127.0.0.1:1/metrics"])
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "info");
    let mut adapter = Process::spawn(cmd);
    let line = adapter.wait_for_line("listening address=", PATIENCE);
    let grpc = adapter.wait_for_line("grpc_address=", PATIENCE);
    let port_in = |line: &str, key: &str| -> u16 {
        let address = line
            .split(key)
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("address");
        address
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port")
    };
    let (http, grpc) = (port_in(&line, "address="), port_in(&grpc, "grpc_address="));
    let mut hosts = vec!["127.0.0.1"];
    if host_has_ipv6() {
        hosts.push("[::1]");
    }
    for host in hosts {
        let (status, _) = wait_for(&format!("/healthz over {host}"), PATIENCE, || {
            try_get(&format!("http://{host}:{http}/healthz"), &[]).ok()
        });
        assert_eq!(status, 200, "{host}");
        let addr = format!("{host}:{grpc}");
        assert!(
            std::net::TcpStream::connect(&addr).is_ok(),
            "gRPC over {addr}"
        );
    }
}

/// dcgm-exporter's own `1.x-compatibility-metrics.csv` (a fixture from its repository,
/// shipped in its image beside `default-counters.csv`) loads, and every field of it is
/// served under the row's own DCGM 1.x name, as dcgm-exporter names each family after
/// its CSV row. With `-o/--use-old-namespace` the series carry dcgm-exporter's 1.x
/// label names: `uuid` for `UUID`, and `pod_name`, `pod_namespace`, `container_name`
/// for a pod's `pod`, `namespace`, `container`. The oracle is the fixture, read here
/// line by line, and the scenario's pod (`train-0` in `ml`, container `trainer`, on
/// GPU 0), not the exporter's output.
#[test]
fn dcgm_exporters_1x_counters_file_is_served_and_o_serves_the_1x_label_names() {
    let csv = e2e_tests::fixture("dcgm-exporter/1.x-compatibility-metrics.csv");
    let text = std::fs::read_to_string(&csv).expect("the 1.x fixture");
    let names: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(',').next().unwrap_or_default().trim())
        .collect();
    assert_eq!(names.len(), 20, "{names:?}");
    let csv = csv.to_str().expect("UTF-8 path");
    for old in [false, true] {
        let mut args = vec![
            "--simulate=tests/fixtures/pods-node.toml",
            "-f",
            csv,
            "-c",
            "200",
        ];
        if old {
            args.push("-o");
        }
        let e = Exporter::start(&args, &[]);
        let (uuid, not_uuid, pod) = if old {
            (
                ",uuid=\"GPU-",
                ",UUID=",
                "container_name=\"trainer\",pod_name=\"train-0\",pod_namespace=\"ml\"",
            )
        } else {
            (
                ",UUID=\"GPU-",
                ",uuid=",
                "container=\"trainer\",namespace=\"ml\",pod=\"train-0\"",
            )
        };
        // Rates (dcgm_nvlink_bandwidth_total) need two cycles: wait for every family.
        let body = wait_for(
            "every family, and GPU 0's pod on its series",
            PATIENCE,
            || {
                let body = e.metrics();
                (body
                    .lines()
                    .any(|l| l.starts_with("dcgm_sm_clock{gpu=\"0\",") && l.contains(pod))
                    && names.iter().all(|n| body.contains(&format!("\n{n}{{"))))
                .then_some(body)
            },
        );
        for name in &names {
            assert!(
                body.contains(&format!("\n# TYPE {name} ")),
                "-o={old}: {name}"
            );
            let series: Vec<&str> = body
                .lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .collect();
            assert!(!series.is_empty(), "-o={old}: no {name} series");
            for line in series {
                assert!(
                    line.contains(uuid) && !line.contains(not_uuid),
                    "-o={old}: {line}"
                );
                if old {
                    for now in [",pod=", ",namespace=", ",container="] {
                        assert!(!line.contains(now), "-o: {line}");
                    }
                }
            }
        }
        // Served under the file's names only: no family under the current DCGM names.
        assert!(
            !body.lines().any(|l| l.starts_with("DCGM_FI_")),
            "-o={old}: {body}"
        );
    }
}
