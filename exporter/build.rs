//! Generates Rust from `proto/` with protox, so building needs no protoc binary: the
//! kubelet PodResources v1 client, and the Prometheus client data model (messages only)
//! for the protobuf exposition format.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "proto/kubelet/podresources/v1";
    let proto = format!("{dir}/api.proto");
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([&proto], [dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;

    // `google.protobuf.Timestamp` (protox ships it) is generated too rather than taken
    // from prost-types, which would be one more runtime dependency for one struct.
    let dir = "proto/prometheus/client_model";
    let proto = format!("{dir}/metrics.proto");
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([&proto], [dir])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_well_known_types(true)
        .compile_fds(fds)?;
    Ok(())
}
