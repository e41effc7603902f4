#!/usr/bin/env bash
# Idle CPU on the cost-modelled fake NVML (GPU_SIM_COST_MODEL=h100-580 or h200-580: every
# call spends the real H100's or H200's (driver 580) median CPU time, docs/simulation.md):
# ours with dcgm-exporter's default counters and with every field, each with every field read
# every cycle (`--field-periods '*=0'`, before read periods) and with the default read
# periods, then the peers (exporter/benches/peers.py --parts native) on the same fake.
# The figures are modelled, not measured on a GPU.
#
#   bash exporter/benches/cost-model.sh            # JSON lines on stdout
#
# Knobs: COST_MODEL (h100-580, or h200-580), SECONDS_IDLE (60), SCENARIO (the model's
# own machine: tests/fixtures/real-gpu/<its directory>/scenario.toml, one GPU), GPUS (1),
# PEERS_DIR (target/peers),
# ONLY_OURS=1 (skip the peers). Builds the release fake and exporter unless
# GPU_EXPORTER_BIN and FAKE_NVML_LIB are set.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
seconds=${SECONDS_IDLE:-60}
model=${COST_MODEL:-h100-580}
case $model in
    h100-580) machine=h100-80gb-hbm3-580.159.04 ;;
    h200-580) machine=h200-141gb-hbm3e-580.159.04 ;;
    *) echo "COST_MODEL=$model: not a model (h100-580, h200-580)" >&2; exit 2 ;;
esac
scenario=${SCENARIO:-$root/tests/fixtures/real-gpu/$machine/scenario.toml}
gpus=${GPUS:-1}
target_dir=${CARGO_TARGET_DIR:-$root/target}
if [[ -z ${GPU_EXPORTER_BIN:-} || -z ${FAKE_NVML_LIB:-} ]]; then
    cargo build --release --locked -p fake-nvml >&2
    cargo build --release --locked -p gpu-exporter --no-default-features >&2
fi
bin=${GPU_EXPORTER_BIN:-$target_dir/release/gpu-exporter}
fake=${FAKE_NVML_LIB:-$target_dir/release/libnvidia_ml.so}
lib_dir=$(mktemp -d)
trap 'rm -rf "$lib_dir"' EXIT
ln -s "$(readlink -f "$fake")" "$lib_dir/libnvidia-ml.so.1"
ln -s "$(readlink -f "$fake")" "$lib_dir/libnvidia-ml.so"

export GPU_SIM_COST_MODEL=$model GPU_SIM_SCENARIO=$scenario GPU_SIM_FROZEN_AT_S=100
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
idle() { python3 exporter/benches/idle_cpu.py --gpus "$gpus" --seconds "$seconds" --label "$1" -- "${@:2}"; }
ours=("$bin" --nvml-lib "$lib_dir/libnvidia-ml.so.1" -c 1000)
idle "defaults, every field every cycle" "${ours[@]}" --field-periods '*=0'
idle "defaults, read periods" "${ours[@]}"
idle "all fields, every field every cycle" "${ours[@]}" -f tests/fixtures/all-fields.csv --field-periods '*=0'
idle "all fields, read periods" "${ours[@]}" -f tests/fixtures/all-fields.csv

if [[ -z ${ONLY_OURS:-} ]]; then
    peers_dir=${PEERS_DIR:-$target_dir/peers}
    export PATH="$root/tests/fake-bin:$PATH"
    python3 exporter/benches/peers.py --ours "$bin" \
        --nvitop-exporter "$peers_dir/nvitop-venv/bin/nvitop-exporter" \
        --all-smi "$peers_dir/all-smi/bin/all-smi" \
        --parts native --load-s 0 --idle-s "$seconds"
fi
