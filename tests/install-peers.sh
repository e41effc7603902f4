#!/usr/bin/env bash
# Install the peer NVML tools that the e2e tests (tests/tests/e2e/peers.rs) and the peer
# benchmark (exporter/benches/peers.sh) run against the fake libnvidia-ml, at pinned
# versions, under PEERS_DIR (default: the cargo target dir's peers/):
#   - nvitop-exporter (PyPI) in a venv: PEERS_DIR/nvitop-venv/bin/nvitop-exporter,
#   - all-smi (crates.io, `cargo install --locked`): PEERS_DIR/all-smi/bin/all-smi.
# Idempotent: an installed pinned version is kept. Called by tests/setup.sh. all-smi's
# release build takes about 10 CPU-minutes: a PEERS_DIR outside the checkout, exported
# for setup.sh and the tests alike, keeps it across fresh clones.
set -euo pipefail

# nvitop-exporter and the exact versions of what it pulls in (its requirements are
# ranges), so a rerun installs the same code.
NVITOP_EXPORTER_VERSION=${NVITOP_EXPORTER_VERSION:-1.7.2}
NVITOP_EXPORTER_PINS=(
    "nvitop-exporter==$NVITOP_EXPORTER_VERSION"
    "nvitop==$NVITOP_EXPORTER_VERSION"
    "nvidia-ml-py==13.615.71"
    "prometheus-client==0.26.0"
    "psutil==7.2.2"
)
# The last all-smi release whose rust-version (1.93) the workspace toolchain (1.95)
# meets; 0.25 and later need Rust 1.96.
ALL_SMI_VERSION=${ALL_SMI_VERSION:-0.22.0}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR=${PEERS_DIR:-${CARGO_TARGET_DIR:-$root/target}/peers}
mkdir -p "$PEERS_DIR"

venv=$PEERS_DIR/nvitop-venv
if [ "$("$venv/bin/nvitop-exporter" --version 2>/dev/null | awk '{ print $2 }')" != "$NVITOP_EXPORTER_VERSION" ]; then
    echo "install-peers.sh: installing nvitop-exporter==$NVITOP_EXPORTER_VERSION into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${NVITOP_EXPORTER_PINS[@]}"
    "$venv/bin/nvitop-exporter" --version >/dev/null
fi

all_smi=$PEERS_DIR/all-smi/bin/all-smi
if [ "$("$all_smi" --version 2>/dev/null | awk '{ print $2 }')" != "$ALL_SMI_VERSION" ]; then
    echo "install-peers.sh: installing all-smi $ALL_SMI_VERSION into $PEERS_DIR/all-smi (a release build: minutes)"
    started=$(date +%s)
    # Its own target dir under PEERS_DIR, so an interrupted install resumes where it
    # stopped instead of starting over in a fresh temporary directory.
    CARGO_TARGET_DIR=$PEERS_DIR/all-smi-build cargo install --locked --quiet \
        --version "$ALL_SMI_VERSION" --root "$PEERS_DIR/all-smi" all-smi
    rm -rf "$PEERS_DIR/all-smi-build"
    echo "install-peers.sh: all-smi built in $(($(date +%s) - started)) s"
fi
