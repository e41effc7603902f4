//! The command line: `--help` is snapshot-tested (UPDATE_SNAPSHOTS=1 rewrites it), and
//! bad flags and unsafe setups stop startup with a message that says what to do.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-metrics-adapter");

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("COLUMNS", "100")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        // No ~/.kube/config either: the failure below must not depend on the machine.
        .env("HOME", "/nonexistent")
        .env_remove("RUST_LOG")
        .output()
        .expect("run gpu-metrics-adapter");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn help_matches_the_snapshot() {
    let (code, help) = run(&["--help"]);
    assert_eq!(code, 0);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/help.txt");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &help).expect("write snapshot");
    }
    let want = std::fs::read_to_string(&path).expect("snapshot (UPDATE_SNAPSHOTS=1 writes it)");
    assert_eq!(help, want, "--help changed; UPDATE_SNAPSHOTS=1 to accept");
}

#[test]
fn tls_serving_without_the_kubernetes_api_says_why_it_cannot_start() {
    // TLS is the default and brings delegated authentication, which needs TokenReview
    // and SubjectAccessReview: with no kubeconfig and no cluster, a clear error.
    let (code, out) = run(&["--exporter-url", "http://127.0.0.1:1/metrics"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("authentication needs the Kubernetes API"),
        "{out}"
    );
    assert!(out.contains("--insecure-serve-http"), "{out}");
}

#[test]
fn bad_flags_name_what_is_wrong() {
    for (args, says) in [
        (vec!["--scrape-interval", "2x"], "is not a duration"),
        (vec!["--scrape-interval", "2h"], "outside 10ms..1h"),
        (vec!["--prometheus-header", "no colon"], "Name: value"),
        (vec!["--log-level", "verbose"], "\"verbose\" is not a level"),
        (
            vec!["--exporter-service", "just-a-name"],
            "exporter-service",
        ),
        (
            vec![
                "--exporter-url",
                "http://a/metrics",
                "--prometheus-url",
                "http://p",
            ],
            "cannot be used with",
        ),
    ] {
        let (code, out) = run(&args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(out.contains(says), "{args:?}: {out}");
    }
}
