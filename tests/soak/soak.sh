#!/usr/bin/env bash
# Soak run (issue 20): the release exporter on the fake libnvidia-ml, attributed through
# kube-sim's fake kubelet and API server whose pods churn, scraped throughout, and the
# release adapter answering custom-metrics and metrics-api queries throughout. Prints a
# summary; exits non-zero if a goal is missed (see tests/soak/main.rs).
#
#   tests/soak/soak.sh                          # 1 h, 1,000 pod churns per hour
#   SOAK_DURATION_S=120 SOAK_CHURN_PER_HOUR=3600 tests/soak/soak.sh
#
# Settings are environment variables, listed in tests/soak/main.rs. Output (summary,
# RSS/fd samples as CSV, both logs) goes to SOAK_OUT, default target/soak/<time>.
# Loopback and a temporary directory only.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
# The processes under test are release builds; the driver (which only counts and
# compares) is a debug build, like the e2e tests.
cargo build --release --locked -q -p gpu-exporter -p gpu-metrics-adapter -p fake-nvml
cargo build --locked -q -p e2e-tests --bin soak
export SOAK_BIN_DIR=${SOAK_BIN_DIR:-$target/release}
echo "machine: $(nproc) cores, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(awk '/MemTotal/ { printf "%.0f GiB", $2/1048576 }' /proc/meminfo)"
exec "$target/debug/soak"
