//! Generates the kubelet PodResources v1 server types from the exporter's copy of the
//! proto, with protox (no protoc binary).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../exporter/proto/kubelet/podresources/v1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../exporter/proto/kubelet/podresources/v1"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
