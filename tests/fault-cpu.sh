#!/usr/bin/env bash
# CPU an exporter uses while a fault lasts (docs/benchmarks/robustness.md, "Fault recovery").
#
#   tests/fault-cpu.sh [EXPORTER] [CASE] [SECONDS] [INTERVAL_MS]
#
# CASE: healthy | nvml-lost | nvml-missing | kubelet-missing. Starts EXPORTER (default
# target/debug/gpu-exporter) on the fake libnvidia-ml with one GPU, the fault on from the
# start, waits 5 s, then prints the CPU (utime + stime from /proc/PID/stat) it used over
# SECONDS. Build first: cargo build --workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/gpu-exporter}
case=${2:-nvml-lost}
window=${3:-30}
interval=${4:-1000}
dir=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
lib=$PWD/target/debug/libnvidia_ml.so
args=(-c "$interval" -a 127.0.0.1:0)
: >"$dir/cue"
case $case in
healthy) args+=(--nvml-lib "$lib") ;;
nvml-lost) args+=(--nvml-lib "$lib"); echo unavailable >"$dir/cue" ;;
nvml-missing) args+=(--nvml-lib "$dir/absent/libnvidia-ml.so.1") ;;
kubelet-missing)
	args+=(--nvml-lib "$lib" -k --kubernetes-refresh-interval "${interval}ms"
		--pod-resources-kubelet-socket "$dir/absent.sock")
	;;
*) echo "unknown case $case" >&2; exit 2 ;;
esac
GPU_SIM_SCENARIO=$PWD/tests/fixtures/fault-cue.toml GPU_SIM_FAULT_FILE=$dir/cue \
	RUST_LOG=warn "$bin" "${args[@]}" >"$dir/log" 2>&1 &
pid=$!
sleep 5
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
a=$(ticks)
sleep "$window"
b=$(ticks)
awk -v c="$case" -v t=$((b - a)) -v hz="$hz" -v w="$window" -v i="$interval" \
	'BEGIN { printf "%s interval=%sms cpu=%.3fs over %ss = %.3f%% of a core\n", c, i, t / hz, w, 100 * t / hz / w }'
