//! Generates Rust from `proto/` with protox, so building needs no protoc binary. Every
//! crate of the workspace takes its wire types from here, so each protocol is generated
//! once:
//! - the kubelet PodResources v1 service, client (the exporter) and server (kube-sim's
//!   fake kubelet);
//! - the Prometheus client data model, messages only (the exporter's protobuf
//!   exposition, the adapter's decoding of it);
//! - KEDA's external scaler service, server (the adapter) and client (the tests).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // (directory, file, generate client and server, generate google.protobuf types)
    let protos = [
        ("proto/kubelet/podresources/v1", "api.proto", true, false),
        // `google.protobuf.Timestamp` (protox ships it) is generated too rather than
        // taken from prost-types, one more runtime dependency for one struct.
        (
            "proto/prometheus/client_model",
            "metrics.proto",
            false,
            true,
        ),
        ("proto/keda", "externalscaler.proto", true, false),
    ];
    for (dir, file, services, well_known) in protos {
        tonic_prost_build::configure()
            .build_client(services)
            .build_server(services)
            .compile_well_known_types(well_known)
            .compile_fds(protox::compile([format!("{dir}/{file}")], [dir])?)?;
    }
    Ok(())
}
