#!/usr/bin/env bash
# Footprint of release builds: binary size, and resident memory 8 s after start with
# 10 scrapes (the method of the memory rows in docs/benchmarks/attribution.md).
#
#   bash exporter/benches/footprint.sh BINDIR [LIBDIR]
#
# BINDIR holds gpu-exporter and gpu-metrics-adapter (release builds); LIBDIR holds the
# fake libnvidia_ml.so (default BINDIR). The exporter reads the fake driver's big node
# (8 GPUs, 28 MIG instances, 200 processes) through real nvml-wrapper, so a build
# without the `demo` feature is measured the same way as one with it; the adapter
# scrapes that exporter over plain HTTP, with no Kubernetes API. Loopback only.
set -euo pipefail
bin=${1:?usage: footprint.sh BINDIR [LIBDIR]}
lib=${2:-$bin}/libnvidia_ml.so
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 100); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done; echo "no answer from $1" >&2; exit 1; }
mem() { awk '/^(VmRSS|VmHWM|RssAnon|RssFile):/ { printf "%s %.1f MiB  ", $1, $2/1024 }' "/proc/$1/status"; echo; }

ep=$(free_port)
GPU_SIM_SCENARIO=builtin:big-node GPU_SIM_FROZEN_AT_S=100 \
    "$bin/gpu-exporter" --nvml-lib "$lib" --address "127.0.0.1:$ep" --log-level warn &
pids+=($!)
exporter=$!
started=$(date +%s.%N)
wait_http "http://127.0.0.1:$ep/metrics"
for _ in $(seq 10); do curl -fs -o /dev/null "http://127.0.0.1:$ep/metrics"; done

ap=$(free_port)
"$bin/gpu-metrics-adapter" --insecure-serve-http --bind-address 127.0.0.1 --secure-port "$ap" \
    --grpc-port "$(free_port)" --exporter-url "http://127.0.0.1:$ep/metrics" 2>/dev/null &
pids+=($!)
adapter=$!
wait_http "http://127.0.0.1:$ap/healthz"
for _ in $(seq 10); do curl -fs -o /dev/null "http://127.0.0.1:$ap/apis/custom.metrics.k8s.io/v1beta2" || true; done

sleep "$(python3 -c "print(max(0, 8 - ($(date +%s.%N) - $started)))")"
echo "gpu-exporter         $(stat -c %s "$bin/gpu-exporter") bytes  $(mem "$exporter")"
echo "gpu-metrics-adapter  $(stat -c %s "$bin/gpu-metrics-adapter") bytes  $(mem "$adapter")"
