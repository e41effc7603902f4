#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU and driver: capture the exporter's /metrics against
# real NVML as a scrubbed golden fixture, and time real sampling cycles.
#
#   bash exporter/benches/real-gpu.sh [OUTDIR]     (default: $OUT if set, else ./real-gpu-out)
#
# Writes OUTDIR/real-gpu.prom (default counters), OUTDIR/real-gpu-all-fields.prom (every
# field, processes), OUTDIR/nvml-cycle.txt (criterion, real driver) and OUTDIR/machine.txt.
# Identifiers are scrubbed: GPU and MIG UUIDs become stable placeholders (in order of
# appearance), serials and the hostname are replaced. Talks to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-real-gpu-out}}
mkdir -p "$out"

lib=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 / { print $NF; exit }')
lib=${NVML_LIB:-$lib}
[[ -n $lib && -e $lib ]] || { echo "no libnvidia-ml.so.1 found; set NVML_LIB" >&2; exit 1; }

cargo build --release -p gpu-exporter
bin=target/release/gpu-exporter
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

scrub() {
    # Spelled out: Debian's default awk (mawk) has no {n} intervals.
    local h='[0-9a-fA-F]' h4
    h4="$h$h$h$h"
    awk -v re="(GPU|MIG)-$h4$h4-$h4-$h4-$h4-$h4$h4$h4" '{
        # Scan forward: the placeholders are UUID-shaped themselves.
        rest = $0; line = ""
        while (match(rest, re)) {
            u = substr(rest, RSTART, RLENGTH)
            if (!(u in seen)) { n[substr(u, 1, 3)]++; seen[u] = sprintf("%s-00000000-0000-0000-0000-%012d", substr(u, 1, 3), n[substr(u, 1, 3)]) }
            line = line substr(rest, 1, RSTART - 1) seen[u]
            rest = substr(rest, RSTART + RLENGTH)
        }
        $0 = line rest
        gsub(/DCGM_FI_DEV_SERIAL="[^"]*"/, "DCGM_FI_DEV_SERIAL=\"0000000000000\"")
        gsub(/Hostname="[^"]*"/, "Hostname=\"gpu-node\"")
        print
    }'
}

# capture NAME ARGS...: run the exporter, wait for 3 samples, save a scrubbed scrape.
capture() {
    local name=$1 log
    shift
    log=$(mktemp)
    NODE_NAME=gpu-node "$bin" --nvml-lib "$lib" -a 127.0.0.1:0 -c 1000 "$@" 2>"$log" &
    pids+=($!)
    local addr="" n
    for _ in $(seq 100); do
        addr=$(grep -o 'address=[0-9.:]*' "$log" | head -n1 | cut -d= -f2 || true)
        [[ -n $addr ]] && break
        sleep 0.1
    done
    [[ -n $addr ]] || { cat "$log" >&2; echo "exporter did not start" >&2; exit 1; }
    for _ in $(seq 60); do
        n=$(curl -sf "http://$addr/metrics" | awk '/^gpu_exporter_samples_total / { print $2 }')
        [[ ${n:-0} -ge 3 ]] && break
        sleep 0.5
    done
    curl -sf "http://$addr/metrics" | scrub >"$out/$name.prom"
    cp "$log" "$out/$name.log"
    kill "${pids[-1]}"
    echo "$name: $(grep -vc '^#' "$out/$name.prom") series, sample duration $(awk '/^gpu_exporter_sample_duration_seconds / { print $2 }' "$out/$name.prom") s"
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse --short HEAD)"
    echo "library: $lib"
    nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current --format=csv 2>/dev/null || echo "nvidia-smi: not available"
    echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores"
} >"$out/machine.txt"

capture real-gpu
capture real-gpu-all-fields -f tests/fixtures/all-fields.csv --process-metrics
NVML_BENCH_LIB=$lib cargo bench -p gpu-exporter --bench nvml_cycle 2>&1 |
    grep -E '^(real-gpu-cycle|default-counters|all-fields)|time:' >"$out/nvml-cycle.txt" || true
cat "$out/machine.txt" "$out/nvml-cycle.txt"
