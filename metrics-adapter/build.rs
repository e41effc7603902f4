//! Generates, with protox (no protoc binary): the Prometheus protobuf exposition types
//! (io.prometheus.client, from the exporter's copy of client_model's metrics.proto) and
//! KEDA's external scaler service (server, plus the client the tests drive it with).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics_dir = "../exporter/proto/prometheus/client_model";
    let metrics = format!("{metrics_dir}/metrics.proto");
    let keda_dir = "proto/keda";
    let keda = format!("{keda_dir}/externalscaler.proto");
    println!("cargo:rerun-if-changed={metrics}");
    println!("cargo:rerun-if-changed={keda}");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(protox::compile([&metrics], [metrics_dir])?)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile([&keda], [keda_dir])?)?;
    Ok(())
}
