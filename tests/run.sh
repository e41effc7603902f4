#!/usr/bin/env bash
# The project's test command: install what the tests need when it is missing
# (tests/setup.sh: Prometheus and promtool, wrk, binutils, nvidia-ml-py, gpustat, nvitop,
# nvitop-exporter and all-smi, Go, podman), build the real Kubernetes control plane
# (tests/kube/build.sh), then run every test of the workspace: unit tests, the fake
# libnvidia-ml's ABI tests, the end-to-end tests against real Prometheus, promtool,
# nvidia-ml-py, gpustat, nvitop, nvitop-exporter, all-smi and the real control plane, and
# the container images under podman. Before the tests, every fuzz target runs briefly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
# The real control plane (tests/kube): kube-apiserver, controller-manager, scheduler,
# kubectl (Kubernetes 1.37), etcd, kwok, helm and KEDA from their Go modules, cached in
# target/kube/bin.
bash tests/kube/build.sh
# The end-to-end tests run the built binaries: the exporter and the fake libnvidia-ml.
cargo build --workspace --locked
# And the container images, which take the release binaries as deploy/images/build.sh
# builds them (the exporter without default features). Built here, before the tests, so
# that the script's own cargo runs find them done and no test competes with a release
# build for the CPU.
cargo build --release --locked -p gpu-exporter --no-default-features
cargo build --release --locked -p gpu-metrics-adapter
# Every fuzz target for a bounded time (FUZZ_SECONDS each, default 15), from its
# committed seeds; any crash fails the run (tests/fuzz/run.sh).
bash tests/fuzz/run.sh "${FUZZ_SECONDS:-15}"
cargo test --workspace --locked "$@"
