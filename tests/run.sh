#!/usr/bin/env bash
# The project's test command: install what the tests need when it is missing
# (tests/setup.sh: Prometheus and promtool, wrk, binutils, nvidia-ml-py, podman), then
# run every test of the workspace: unit tests, the fake libnvidia-ml's ABI tests, and the
# end-to-end tests against real Prometheus, promtool and nvidia-ml-py, and the container
# images under podman.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
# The end-to-end tests run the built binaries: the exporter and the fake libnvidia-ml.
cargo build --workspace --locked
# And the container images, which take the release binaries as deploy/images/build.sh
# builds them (the exporter without default features). Built here, before the tests, so
# that the script's own cargo runs find them done and no test competes with a release
# build for the CPU.
cargo build --release --locked -p gpu-exporter --no-default-features
cargo build --release --locked -p gpu-metrics-adapter
cargo test --workspace --locked "$@"
