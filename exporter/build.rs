//! Generates the kubelet PodResources v1 client from `proto/` with protox, so building
//! needs no protoc binary.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "proto/kubelet/podresources/v1";
    let proto = format!("{dir}/api.proto");
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([&proto], [dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
