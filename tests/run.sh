#!/usr/bin/env bash
# The project's test command: install what the tests need when it is missing
# (tests/setup.sh: wrk, binutils, nvidia-ml-py, gpustat, nvitop, nvitop-exporter and
# all-smi, Go, podman, the arm64 cross toolchain and qemu), build the real Kubernetes
# control plane and Prometheus 3 with promtool (tests/kube/build.sh), then run every
# test of the workspace: unit tests, the fake libnvidia-ml's ABI tests, the end-to-end
# tests against real Prometheus 3, promtool, nvidia-ml-py, gpustat, nvitop,
# nvitop-exporter, all-smi and the real control plane, the arm64 binaries under qemu, and
# the container images (amd64 and arm64) under podman. Before the tests, every fuzz target runs briefly.
set -euo pipefail
cd "$(dirname "$0")/.."
# Free disk, said first: a run that fails for want of it then says why in its first
# lines. A cold run peaks at about 10 GiB (docs/benchmarks/images-and-ci.md).
df -Pk . | awk 'NR == 2 { printf "tests/run.sh: %.1f GiB free on %s; a cold run needs about 10 GiB\n", $4 / 1048576, $6 }'
bash tests/setup.sh
# The real control plane (tests/kube): kube-apiserver, controller-manager, scheduler,
# kubectl (Kubernetes 1.37), etcd, kwok, helm, KEDA, and Prometheus 3 with promtool,
# from their Go modules, cached in target/kube/bin.
bash tests/kube/build.sh
# The end-to-end tests run the built binaries: the exporter and the fake libnvidia-ml.
cargo build --workspace --locked
# Each end-to-end test keeps its scratch directory (logs, data) for post-mortems; the
# last run's are enough, so they go now rather than piling up run after run.
rm -rf "${CARGO_TARGET_DIR:-target}/debug/e2e-scratch"
# And the container images, which take the release binaries as deploy/images/build.sh
# builds them (the exporter without default features). Built here, before the tests, so
# that the script's own cargo runs find them done and no test competes with a release
# build for the CPU.
cargo build --release --locked -p gpu-exporter --no-default-features
cargo build --release --locked -p gpu-metrics-adapter
# The same for arm64 (Grace nodes), cross-compiled (.cargo/config.toml names the linker),
# with the arm64 fake libnvidia-ml: the arm64 images and the emulated runs
# (tests/tests/e2e/arm64.rs) take them from target/aarch64-unknown-linux-gnu/release.
cargo build --release --locked --target aarch64-unknown-linux-gnu -p gpu-exporter --no-default-features
cargo build --release --locked --target aarch64-unknown-linux-gnu -p gpu-metrics-adapter
cargo build --release --locked --target aarch64-unknown-linux-gnu -p fake-nvml
# Every fuzz target for a bounded time (FUZZ_SECONDS each, default 15), from its
# committed seeds; any crash fails the run (tests/fuzz/run.sh).
bash tests/fuzz/run.sh "${FUZZ_SECONDS:-15}"
cargo test --workspace --locked "$@"
