#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU and driver: capture the exporter's /metrics against
# real NVML as golden fixtures, each bracketed by an independent reading (pynvml), sweep
# pynvml's getter surface for the fake library's fidelity, time real sampling cycles, and
# measure the peers on the same driver.
#
#   bash exporter/benches/real-gpu.sh [OUTDIR]     (default: $OUT if set, else ./real-gpu-out)
#
# The device tool's machines have no cargo: set GPU_EXPORTER_BIN (a release build,
# `--no-default-features`, as the image ships it) and NVML_BENCH_BIN (`cargo bench
# --no-run -p gpu-exporter --bench nvml_cycle`) to binaries built elsewhere; without them
# both are built here. PEERS="NVITOP_EXPORTER ALL_SMI" (paths) adds the peer comparison.
#
# Writes into OUTDIR:
#   real-gpu.prom                default counters, idle GPU
#   real-gpu-all-fields.prom     every field, processes, a GPU load running
#   *.pynvml-before/after.json   tests/fidelity/read_nvml.py just before and after each
#   sweep.json                   tests/fidelity/sweep.py (every pynvml getter's outcome)
#   nvidia-smi-q.xml, machine.txt, peers.json
#   nvml-latency.json, .txt      exporter/benches/nvml-latency.py (each NVML call timed)
#   gpm-fresh-pairs.json         exporter/benches/gpm-fresh-pairs.py (GPM on fresh sample pairs)
#   nvml-cycle-under-load.txt, nvml-cycle-idle.txt   criterion, with and without the load
#   idle-cpu.json                exporter/benches/idle_cpu.py at -c 1000: default counters and
#                                every field, each read every cycle and at the read periods
# Identifiers are scrubbed the same way in every file: GPU and MIG UUIDs become
# placeholders numbered in `nvidia-smi -L` order, serials and the hostname are replaced.
# Talks to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${1:-${OUT:-real-gpu-out}}
mkdir -p "$out"
raw=$(mktemp -d)

lib=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 / { print $NF; exit }')
lib=${NVML_LIB:-$lib}
[[ -n $lib && -e $lib ]] || { echo "no libnvidia-ml.so.1 found; set NVML_LIB" >&2; exit 1; }

if [[ -z ${GPU_EXPORTER_BIN:-} ]]; then
    cargo build --release --locked -p gpu-exporter --no-default-features
    GPU_EXPORTER_BIN=target/release/gpu-exporter
fi
bin=$GPU_EXPORTER_BIN
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# One sed script for every file, so a placeholder names the same device everywhere.
scrub_script=$raw/scrub.sed
nvidia-smi -L | grep -oE '(GPU|MIG)-[0-9a-fA-F-]{36}' | awk '
    { kind = substr($0, 1, 3); n[kind]++
      printf "s/%s/%s-00000000-0000-0000-0000-%012d/g\n", $0, kind, n[kind] }' >"$scrub_script"
{
    echo 's/DCGM_FI_DEV_SERIAL="[^"]*"/DCGM_FI_DEV_SERIAL="0000000000000"/g'
    echo 's/Hostname="[^"]*"/Hostname="gpu-node"/g'
    echo 's#<serial>[^<]*</serial>#<serial>0000000000000</serial>#g'
} >>"$scrub_script"
scrub() { sed -f "$scrub_script"; }
# GET URL to stdout; curl where there is one, else Python's standard library.
get() {
    if command -v curl >/dev/null; then
        curl -sf "$1"
    else
        python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"
    fi
}

read_nvml() { python3 tests/fidelity/read_nvml.py | scrub >"$out/$1.json"; }

# capture NAME ARGS...: run the exporter, wait for 3 samples, save a scrubbed scrape
# between two independent readings.
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
        n=$(get "http://$addr/metrics" | awk '/^gpu_exporter_samples_total / { print $2 }' || true)
        [[ ${n:-0} -ge 3 ]] && break
        sleep 0.5
    done
    read_nvml "$name.pynvml-before"
    get "http://$addr/metrics" | scrub >"$out/$name.prom"
    read_nvml "$name.pynvml-after"
    scrub <"$log" >"$out/$name.log"
    kill "${pids[-1]}"
    echo "$name: $(grep -vc '^#' "$out/$name.prom") series"
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo "${COMMIT:-unknown}")"
    echo "library: $lib ($(readlink -f "$lib"))"
    nvidia-smi --query-gpu=index,name,driver_version,vbios_version,mig.mode.current,pstate,power.limit --format=csv
    echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores"
    echo "kernel: $(uname -r)"
    echo "python: $(python3 --version), nvidia-ml-py $(python3 -c 'from importlib.metadata import version; print(version("nvidia-ml-py"))')"
} | scrub >"$out/machine.txt"
nvidia-smi -q -x | scrub >"$out/nvidia-smi-q.xml"

capture real-gpu
# A load on the GPU for the second capture: processes, memory in use, SM activity.
load_s=${LOAD_S:-120}
python3 - "$load_s" <<'PY' &
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
PY
load_pid=$!
pids+=("$load_pid")
sleep 5 # the load's CUDA context comes up (a process and its memory are then visible)
capture real-gpu-all-fields -f tests/fixtures/all-fields.csv --process-metrics

# bench NAME: criterion's real-driver cycles (default counters; all fields + processes).
bench() {
    if [[ -z ${NVML_BENCH_BIN:-} ]]; then
        NVML_BENCH_LIB=$lib cargo bench -p gpu-exporter --bench nvml_cycle 2>&1 | tee "$raw/$1.txt"
    else
        NVML_BENCH_LIB=$lib "$NVML_BENCH_BIN" --bench --warm-up-time 2 --measurement-time 8 2>&1 | tee "$raw/$1.txt"
    fi
    grep -E '^(real-gpu-cycle|default-counters|all-fields)|time:' "$raw/$1.txt" >"$out/$1.txt" || true
}
bench nvml-cycle-under-load || echo "bench failed: $?"
kill "$load_pid" 2>/dev/null || true
wait "$load_pid" 2>/dev/null || true
bench nvml-cycle-idle || echo "bench failed: $?"
timeout 300 python3 tests/fidelity/sweep.py | scrub >"$out/sweep.json" || echo "sweep.py failed: $?"
# Where a cycle's time goes: each NVML call timed alone, idle GPU.
timeout 300 python3 exporter/benches/nvml-latency.py >"$out/nvml-latency.json" 2>"$out/nvml-latency.txt" ||
    echo "nvml-latency.py failed: $?"
# GPM as the sampler calls it (a fresh sample pair a second apart), which costs more
# than nvml-latency.py's back-to-back calls; the cost model takes these over them.
timeout 120 python3 exporter/benches/gpm-fresh-pairs.py >"$out/gpm-fresh-pairs.json" 2>>"$out/nvml-latency.txt" ||
    echo "gpm-fresh-pairs.py failed: $?"

# Idle CPU at -c 1000, the measure exporter/benches/cost-model.sh takes on the
# cost-modelled fake: these confirm or correct the model (docs/benchmarks/cost-model.md).
gpus=$(nvidia-smi -L | grep -c '^GPU ')
idle() {
    python3 exporter/benches/idle_cpu.py --gpus "$gpus" --seconds "${IDLE_CPU_S:-60}" --label "$1" -- \
        "$bin" --nvml-lib "$lib" -c 1000 "${@:2}" >>"$out/idle-cpu.json" || echo "idle_cpu.py failed: $?"
}
: >"$out/idle-cpu.json"
idle "defaults, every field every cycle" --field-periods '*=0'
idle "defaults, read periods"
idle "all fields, every field every cycle" -f tests/fixtures/all-fields.csv --field-periods '*=0'
idle "all fields, read periods" -f tests/fixtures/all-fields.csv
cat "$out/idle-cpu.json"

if [[ -n ${PEERS:-} ]]; then
    read -r nvitop all_smi <<<"$PEERS"
    python3 exporter/benches/peers.py --ours "$bin" --nvitop-exporter "$nvitop" --all-smi "$all_smi" \
        --parts native --load-s 0 --idle-s "${IDLE_S:-20}" >"$out/peers.json" || echo "peers.py failed: $?"
fi
cat "$out/machine.txt" "$out"/nvml-cycle-*.txt
