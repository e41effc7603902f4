#!/usr/bin/env bash
# Peer benchmark: gpu-exporter against nvitop-exporter and all-smi (`all-smi api`), all
# three on the same fake libnvidia-ml.so.1 and the same scenario, in one run.
#
#   bash exporter/benches/peers.sh            # prints a Markdown table and the raw JSON
#
# What it does:
#   1. Builds the fake NVML (`cargo build --release -p fake-nvml`) and our exporter as
#      release images ship it (`-p gpu-exporter --no-default-features`, no simulator in
#      the binary: it reads the fake through real NVML calls, as on a GPU node).
#   2. Installs the peers at pinned versions under target/peers/ (once; reruns reuse
#      them): nvitop-exporter from PyPI into a venv, all-smi from crates.io with
#      `cargo install --locked`. tests/setup.sh installs the same versions for the e2e
#      tests (tests/tests/e2e/peers.rs) into the same place.
#   3. Points every tool at the fake through LD_LIBRARY_PATH (a directory with
#      libnvidia-ml.so.1 and libnvidia-ml.so symlinks) with GPU_SIM_SCENARIO=$SCENARIO
#      frozen at GPU_SIM_FROZEN_AT_S, so all read identical values. all-smi loads NVML
#      only when `lspci` shows an NVIDIA controller: tests/fake-bin/lspci (test
#      infrastructure) goes first on PATH and lists the scenario's GPUs.
#   4. Runs exporter/benches/peers.py, which measures each tool alone, every tool at the
#      same 1 s collection interval (nvitop-exporter's and ours' default; all-smi's is 3 s):
#      - NVML calls per sampling cycle: the fake's per-function counts
#        (GPU_SIM_CALL_COUNTS), two readings in quiet gaps N cycles apart.
#        "Shared" restricts the count to the functions both ours and all-smi call (by
#        name: ours also reads memory on MIG instances, which all-smi does not).
#      - Idle CPU: on-CPU time of all threads (/proc/PID/task/*/schedstat) over IDLE_S
#        seconds with no scrapes, as % of one core; it includes the fake library's own
#        work inside the tool's threads.
#      - RSS: VmRSS after the idle window; VmHWM after the load test.
#      - Latency under load: wrk -t2 -c50 -dLOAD_S --latency on /metrics (plain text, no
#        gzip); wrk shares the 2 cores with the server.
#      - CPU per scrape: the tool under valgrind --tool=callgrind, with no sampling cycle
#        in the window (ours at a 20 s interval after its second cycle, GPM needing two
#        samples, re-measured if its cycle counter moved; a peer at a one-hour interval
#        once its body is complete); counters zeroed with callgrind_control, K keep-alive
#        scrapes of /metrics, dumped; zeroed again, the same wall time without scrapes,
#        dumped; (scrapes - idle) / K instructions. This is the cost of serving a scrape;
#        each tool's sampling cost is in the idle CPU row.
#   5. Prints ratios as ours/peer (below 1 means ours uses less) and the peer/ours factor.
#
# Talks to 127.0.0.1 only. Requires cargo, python3 (with venv), valgrind, wrk.
# Knobs (environment): SCENARIO (builtin:big-node), FROZEN_AT_S (100), IDLE_S (30),
# LOAD_S (10), CYCLES (5), SCRAPES_OURS (200), SCRAPES_PEERS (10), ONLY (a comma list of
# ours,nvitop-exporter,all-smi), JSON_OUT (file for the raw figures), PEERS_DIR (where
# the peers are installed; default target/peers).
set -euo pipefail

NVITOP_EXPORTER_VERSION=1.7.2
# The last all-smi release whose rust-version (1.93) the workspace toolchain (1.95)
# meets; 0.25 and later need 1.96.
ALL_SMI_VERSION=0.22.0

SCENARIO=${SCENARIO:-builtin:big-node}
FROZEN_AT_S=${FROZEN_AT_S:-100}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$script_dir/../.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
peers_dir=${PEERS_DIR:-$target_dir/peers}

for tool in cargo python3 valgrind callgrind_control wrk; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool is required (bash tests/setup.sh installs wrk)" >&2; exit 1; }
done

echo "peers.sh: building the fake NVML and gpu-exporter (release)" >&2
(cd "$root" && cargo build --release --locked -p fake-nvml >&2 &&
    cargo build --release --locked -p gpu-exporter --no-default-features >&2)

# The peers, at the versions tests/setup.sh installs.
NVITOP_EXPORTER_VERSION=$NVITOP_EXPORTER_VERSION ALL_SMI_VERSION=$ALL_SMI_VERSION \
    PEERS_DIR=$peers_dir bash "$root/tests/install-peers.sh" >&2

lib_dir=$peers_dir/lib
mkdir -p "$lib_dir"
ln -sfn "$target_dir/release/libnvidia_ml.so" "$lib_dir/libnvidia-ml.so.1"
ln -sfn "$target_dir/release/libnvidia_ml.so" "$lib_dir/libnvidia-ml.so"

json_out=${JSON_OUT:-$peers_dir/peers.json}
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$root/tests/fake-bin:$PATH"
export GPU_SIM_SCENARIO=$SCENARIO GPU_SIM_FROZEN_AT_S=$FROZEN_AT_S
python3 "$script_dir/peers.py" \
    --ours "$target_dir/release/gpu-exporter" \
    --nvitop-exporter "$peers_dir/nvitop-venv/bin/nvitop-exporter" \
    --all-smi "$peers_dir/all-smi/bin/all-smi" \
    --idle-s "${IDLE_S:-30}" --load-s "${LOAD_S:-10}" --cycles "${CYCLES:-5}" \
    --scrapes-ours "${SCRAPES_OURS:-200}" --scrapes-peers "${SCRAPES_PEERS:-10}" \
    --only "${ONLY:-ours,nvitop-exporter,all-smi}" >"$json_out"

machine="$(nproc)-core $(uname -m), $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
versions="gpu-exporter $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown), nvitop-exporter $NVITOP_EXPORTER_VERSION, all-smi $ALL_SMI_VERSION, $(valgrind --version)"
python3 "$script_dir/peers_report.py" "$json_out" "$SCENARIO" "$FROZEN_AT_S" "$machine" "$versions"
echo "raw figures: $json_out" >&2
