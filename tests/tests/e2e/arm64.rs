//! arm64 (aarch64: the Grace CPUs of GH200 and GB200 nodes), built here by cross
//! compilation and run under `qemu-aarch64` user-mode emulation, Debian's arm64 glibc
//! (libc6-arm64-cross) as its library root:
//!
//! - the arm64 exporter on the arm64 fake `libnvidia-ml.so.1`, big-node scenario at a
//!   frozen second, says on `/metrics` exactly what the amd64 exporter on the amd64
//!   fake library says (apart from build identity and process-local counters), carries
//!   the scenario's values, and is ready;
//! - the arm64 adapter, scraping an arm64 exporter that attributes GPUs to the pods of a
//!   simulated node, answers the custom metrics API with each pod's value as that
//!   exporter reports it.
//!
//! The arm64 binaries are the release builds of `tests/run.sh` (as deploy/images/build.sh
//! ships them: the exporter without default features), under
//! `target/aarch64-unknown-linux-gnu/release`. User-mode emulation runs the binaries
//! directly, so it needs no binfmt registration; the images under podman do
//! (tests/tests/e2e/images.rs). qemu-user-static, the cross toolchain and the arm64
//! glibc come from `tests/setup.sh`; a missing one fails the tests, never skips them.

use crate::nvml_backend::{comparable, difference};
use e2e_tests::{
    Adapter, Exporter, KubeNode, assert_matches_scenario, fake_nvml, fixture, get, sample_value,
    samples, target_profile_dir, wait_for,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The Rust target of Grace nodes.
pub(crate) const TARGET: &str = "aarch64-unknown-linux-gnu";
/// User-mode emulator (Debian package qemu-user-static).
const QEMU: &str = "qemu-aarch64-static";
/// Debian's arm64 glibc for cross builds (libc6-arm64-cross): the emulated binaries'
/// dynamic loader and libraries.
const SYSROOT: &str = "/usr/aarch64-linux-gnu";
/// ELF `e_machine` of AArch64.
const EM_AARCH64: u16 = 183;

/// `target/aarch64-unknown-linux-gnu/release`, beside the host's `target/debug`.
pub(crate) fn arm64_dir() -> PathBuf {
    target_profile_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .join(TARGET)
        .join("release")
}

/// An arm64 build artifact, checked to be an AArch64 ELF file.
pub(crate) fn arm64_artifact(name: &str) -> PathBuf {
    let path = arm64_dir().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build it first (tests/run.sh does): cargo build --release --target {TARGET} \
             -p gpu-exporter --no-default-features, then -p gpu-metrics-adapter and -p fake-nvml",
            path.display()
        )
    });
    assert!(
        bytes.len() > 20 && bytes.starts_with(b"\x7fELF"),
        "{}: not an ELF file",
        path.display()
    );
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    assert_eq!(
        machine,
        EM_AARCH64,
        "{} is not an arm64 binary",
        path.display()
    );
    path
}

/// A command running the arm64 binary `name` under user-mode emulation.
fn emulated(name: &str) -> Command {
    let binary = arm64_artifact(name);
    let out = Command::new(QEMU)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            panic!("{QEMU}: {e} (Debian package qemu-user-static; tests/setup.sh installs it)")
        });
    assert!(out.status.success(), "{QEMU} --version failed");
    assert!(
        std::path::Path::new(SYSROOT)
            .join("lib/ld-linux-aarch64.so.1")
            .exists(),
        "no arm64 dynamic loader under {SYSROOT} (Debian package libc6-arm64-cross; \
         tests/setup.sh installs it)"
    );
    let mut cmd = Command::new(QEMU);
    cmd.arg("-L").arg(SYSROOT).arg(binary);
    cmd
}

/// The arm64 fake `libnvidia-ml.so.1`.
fn arm64_fake_nvml() -> String {
    arm64_artifact("libnvidia_ml.so").display().to_string()
}

#[test]
fn the_arm64_exporter_says_what_the_amd64_one_says_on_the_frozen_big_node() {
    const SCENARIO: &str = "builtin:big-node";
    const FROZEN_AT_S: &str = "100";
    let common = [
        "-f",
        "tests/fixtures/all-fields.csv",
        "--process-metrics",
        "-c",
        "200",
    ];
    let env = [
        ("GPU_SIM_SCENARIO", SCENARIO),
        ("GPU_SIM_FROZEN_AT_S", FROZEN_AT_S),
    ];
    let host_lib = fake_nvml().display().to_string();
    let amd64 = Exporter::start(&[&["--nvml-lib", &host_lib][..], &common].concat(), &env);
    let arm64_lib = arm64_fake_nvml();
    let arm64 = Exporter::start_with(
        emulated("gpu-exporter"),
        &[&["--nvml-lib", &arm64_lib][..], &common].concat(),
        &env,
    );

    // The arm64 build is the shipped one: no simulators.
    let help = Command::new(QEMU)
        .arg("-L")
        .arg(SYSROOT)
        .arg(arm64_artifact("gpu-exporter"))
        .arg("--help")
        .output()
        .expect("--help");
    assert!(help.status.success());
    assert!(
        !String::from_utf8_lossy(&help.stdout).contains("--simulate"),
        "the arm64 exporter was built with the demo feature"
    );

    let expected = comparable(&amd64.metrics_after_samples(3));
    assert!(
        expected.len() > 1000,
        "the big node gives thousands of series, not {}",
        expected.len()
    );
    // XIDs reach both through their event threads: poll until the arm64 one caught up.
    let mut last = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        last = comparable(&arm64.metrics_after_samples(3));
        if last == expected {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        last == expected,
        "arm64 and amd64 exporters differ on {SCENARIO} at {FROZEN_AT_S} s:\n{}\narm64 log:\n{}",
        difference(&expected, &last),
        arm64.process.log()
    );

    // Its values are the scenario's (an oracle independent of the amd64 build), and its
    // build identity names the same version.
    let body = arm64.metrics();
    let scenario = gpu_sim::Scenario::builtin("big-node").expect("built-in scenario");
    assert_matches_scenario(&body, &scenario, FROZEN_AT_S.parse().expect("seconds"));
    let build = samples(&body, "gpu_exporter_build_info");
    assert_eq!(build.len(), 1, "{build:?}");
    assert!(
        build[0].contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{build:?}"
    );

    let (status, text) = get(&arm64.url("/readyz"));
    assert_eq!(status, 200, "/readyz: {text}");
}

#[test]
fn the_arm64_adapter_answers_the_custom_metrics_api_from_the_arm64_exporter() {
    const SCENARIO: &str = "pods-node.toml";
    let node = KubeNode::start(&format!("tests/fixtures/{SCENARIO}"), "node-a");
    let socket = node.socket().display().to_string();
    let kubeconfig = node.kubeconfig().display().to_string();
    let proc_root = node.proc_root().display().to_string();
    let lib = arm64_fake_nvml();
    let scenario = fixture(SCENARIO).display().to_string();
    let exporter = Exporter::start_with(
        emulated("gpu-exporter"),
        &[
            "--nvml-lib",
            &lib,
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
        ],
        &[
            ("NODE_NAME", "node-a"),
            ("GPU_SIM_SCENARIO", &scenario),
            ("GPU_SIM_FROZEN_AT_S", "60"),
        ],
    );
    let exporter_body = crate::attribution::scrape_when(&exporter, "pods of namespace ml", |b| {
        b.contains("pod=\"train-0\"") && b.contains("pod=\"idx-0\"")
    });

    let url = exporter.url("/metrics");
    let adapter = Adapter::start_command(Adapter::command_with(
        emulated("gpu-metrics-adapter"),
        &[
            "--exporter-url",
            &url,
            "--scrape-interval",
            "300ms",
            "--kubeconfig",
            &kubeconfig,
        ],
    ));
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization";
    let v = wait_for(
        "the arm64 adapter's answer",
        Duration::from_secs(60),
        || {
            let (status, v) = adapter.get(path);
            (status == 200 && v["items"].as_array().is_some_and(|i| i.len() == 2)).then_some(v)
        },
    );
    assert_eq!(v["kind"], "MetricValueList", "{v}");
    let items: BTreeMap<String, i64> = e2e_tests::metrics_api::items_milli(&v)
        .into_iter()
        .collect();
    // Each pod's GPU utilisation as the arm64 exporter reports it.
    let expected: BTreeMap<String, i64> = ["train-0", "idx-0"]
        .iter()
        .map(|pod| {
            let util = samples(&exporter_body, "DCGM_FI_DEV_GPU_UTIL")
                .into_iter()
                .find(|l| l.contains(&format!("pod=\"{pod}\"")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no utilisation of {pod}"));
            (pod.to_string(), (util * 1000.0) as i64)
        })
        .collect();
    assert_eq!(items, expected, "{v}");
    assert!(
        sample_value(&exporter_body, "gpu_exporter_kubelet_up") == Some(1.0),
        "the arm64 exporter reached the kubelet"
    );
}
