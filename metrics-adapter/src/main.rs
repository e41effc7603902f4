//! gpu-metrics-adapter: the Kubernetes custom and external metrics API server. It is
//! not built yet (issue 5); this binary says so rather than pretending to serve.

fn main() -> std::process::ExitCode {
    eprintln!(
        "gpu-metrics-adapter {} is not implemented yet; it is tracked as issue 5",
        env!("CARGO_PKG_VERSION")
    );
    std::process::ExitCode::from(2)
}
