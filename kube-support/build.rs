//! Generates Rust from `proto/` with protox, so building needs no protoc binary. Every
//! crate of the workspace takes its wire types from here, so each protocol is generated
//! once:
//! - the kubelet PodResources v1 service, client (the exporter) and server (kube-sim's
//!   fake kubelet);
//! - the Prometheus client data model, messages only (the exporter's protobuf
//!   exposition, the adapter's decoding of it);
//! - KEDA's external scaler service, server (the adapter) and client (the tests).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kubelet = "proto/kubelet/podresources/v1";
    let prometheus = "proto/prometheus/client_model";
    let keda = "proto/keda";
    println!("cargo:rerun-if-changed=proto");

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(
            [format!("{kubelet}/api.proto")],
            [kubelet],
        )?)?;
    // `google.protobuf.Timestamp` (protox ships it) is generated too rather than taken
    // from prost-types, which would be one more runtime dependency for one struct.
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_well_known_types(true)
        .compile_fds(protox::compile(
            [format!("{prometheus}/metrics.proto")],
            [prometheus],
        )?)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(
            [format!("{keda}/externalscaler.proto")],
            [keda],
        )?)?;
    Ok(())
}
