#!/usr/bin/env bash
# The project's test command: install what the tests need when it is missing
# (tests/setup.sh: Prometheus and promtool, wrk, binutils, nvidia-ml-py, Go), build the
# real Kubernetes control plane (tests/kube/build.sh), then run
# every test of the workspace: unit tests, the fake libnvidia-ml's ABI tests, and the
# end-to-end tests against real Prometheus, promtool and nvidia-ml-py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
# The real control plane (tests/kube): kube-apiserver, controller-manager, scheduler,
# kubectl, etcd and kwok from their Go modules, cached in target/kube/bin.
bash tests/kube/build.sh
# The end-to-end tests run the built binaries: the exporter and the fake libnvidia-ml.
cargo build --workspace --locked
cargo test --workspace --locked "$@"
