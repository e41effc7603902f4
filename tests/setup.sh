#!/usr/bin/env bash
# Install what the end-to-end tests need on a fresh Debian machine, and nothing else:
#   - wrk (Debian package `wrk`) for the load tests,
#   - nm and readelf (Debian package `binutils`) for fake-nvml's exported-symbol tests,
#   - pynvml (PyPI package `nvidia-ml-py`, pinned) for the NVML fidelity test, and gpustat
#     and nvitop (PyPI, pinned) for the NVML breadth test,
#   - prometheus-client (PyPI, pinned) whose parsers read the golden exposition files
#     independently of this workspace (tests/tests/e2e/golden.rs),
#   - kubernetes-validate (PyPI, pinned; brings jsonschema and PyYAML) and openssl (Debian)
#     for the manifest tests (tests/tests/e2e/deploy/),
#   - go (Debian package `golang-go`) to build the real control plane of tests/kube and
#     Prometheus 3 with promtool (tests/kube/prometheus), which every Prometheus and
#     promtool test runs from target/kube/bin (their Go modules come through the Go
#     module proxy),
#   - podman and runc (Debian; runc, not crun, which fails on some hosts' cgroup layout)
#     and ca-certificates for the container image tests (tests/tests/e2e/images.rs),
#   - the peer NVML tools nvitop-exporter (PyPI, in a venv) and all-smi (crates.io, built
#     with cargo install), pinned, under the target dir's peers/ (tests/install-peers.sh),
#     for tests/tests/e2e/peers.rs and exporter/benches/peers.sh; python3-venv (Debian)
#     for the venv, protobuf-compiler, libprotobuf-dev and libdrm-dev (Debian) for
#     all-smi's build,
#   - the nightly Rust toolchain and cargo-fuzz (crates.io, pinned) for the fuzz targets
#     (tests/fuzz/run.sh),
#   - for arm64 (Grace nodes): the Rust target aarch64-unknown-linux-gnu, Debian's cross
#     linker and arm64 glibc (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross; .cargo/config.toml
#     names the linker), qemu-user-static for the emulated runs (tests/tests/e2e/arm64.rs)
#     and binfmt-support, which registers qemu-aarch64 with the kernel so podman runs the
#     arm64 images (tests/tests/e2e/images.rs).
# Idempotent and silent when everything is present; prints what it installs. Runs as
# root, or through sudo otherwise.
set -euo pipefail

# The pynvml release the fidelity test is written against (latest 13.x at the time).
NVIDIA_ML_PY_VERSION="13.615.71"
# The kubernetes-validate release the manifest tests use (schemas up to Kubernetes 1.37).
KUBERNETES_VALIDATE_VERSION="1.37.0"
# NVML peer tools the breadth test runs against the fake library (tests/tests/e2e/nvml_breadth.rs).
GPUSTAT_VERSION="1.1.1"
NVITOP_VERSION="1.7.2"
# Prometheus' Python client, for its exposition parsers (tests/tests/e2e/golden.rs).
PROMETHEUS_CLIENT_VERSION="0.26.0"
# cargo-fuzz, which builds and runs the fuzz targets (tests/fuzz/run.sh).
CARGO_FUZZ_VERSION="0.13.2"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "tests/setup.sh: need root or sudo to run: $*" >&2
        exit 1
    fi
}

apt_packages=()
if ! command -v wrk >/dev/null 2>&1; then
    apt_packages+=(wrk)
fi
if ! command -v curl >/dev/null 2>&1; then
    apt_packages+=(curl)
fi
if ! command -v nm >/dev/null 2>&1 || ! command -v readelf >/dev/null 2>&1; then
    apt_packages+=(binutils)
fi
if ! command -v openssl >/dev/null 2>&1; then
    apt_packages+=(openssl)
fi
# `ip` adds the adapter replicas' pod IPs to the loopback interface (cluster_ha).
if ! command -v ip >/dev/null 2>&1; then
    apt_packages+=(iproute2)
fi
# Go builds the real control plane (tests/kube/build.sh). Debian's go may be older than
# the modules' `go` line: it then fetches the toolchain they name through the Go module
# proxy (GOTOOLCHAIN=auto, the default).
if ! command -v go >/dev/null 2>&1; then
    apt_packages+=(golang-go)
fi
if ! command -v podman >/dev/null 2>&1; then
    apt_packages+=(podman)
fi
if ! command -v runc >/dev/null 2>&1; then
    apt_packages+=(runc)
fi
if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
    apt_packages+=(ca-certificates)
fi
if ! command -v python3 >/dev/null 2>&1; then
    apt_packages+=(python3 python3-pip python3-venv)
elif ! python3 -m pip --version >/dev/null 2>&1 && ! python3 -c 'import pynvml, kubernetes_validate' >/dev/null 2>&1; then
    apt_packages+=(python3-pip)
fi

# all-smi's build script compiles .proto files with protoc, importing protobuf's
# well-known types (libprotobuf-dev).
if ! command -v protoc >/dev/null 2>&1; then
    apt_packages+=(protobuf-compiler)
fi
if [ ! -f /usr/include/google/protobuf/timestamp.proto ]; then
    apt_packages+=(libprotobuf-dev)
fi
# all-smi links libdrm and libdrm_amdgpu (its AMD reader) whatever the machine has.
if ! dpkg-query -W -f='${Status}' libdrm-dev 2>/dev/null | grep -q 'install ok installed'; then
    apt_packages+=(libdrm-dev)
fi
# Debian's python3 has no ensurepip (so no `python3 -m venv`) without python3-venv.
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    apt_packages+=(python3-venv)
fi

# arm64: the cross linker with its sysroot (libc6-dev-arm64-cross, which brings
# libc6-arm64-cross: the loader and libraries qemu runs the binaries on), the user-mode
# emulator, and update-binfmts to register it.
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
    apt_packages+=(gcc-aarch64-linux-gnu)
fi
if [ ! -e /usr/aarch64-linux-gnu/lib/libc.so ]; then
    apt_packages+=(libc6-dev-arm64-cross)
fi
if ! command -v qemu-aarch64-static >/dev/null 2>&1; then
    apt_packages+=(qemu-user-static)
fi
if ! command -v update-binfmts >/dev/null 2>&1; then
    apt_packages+=(binfmt-support)
fi

if [ "${#apt_packages[@]}" -gt 0 ]; then
    echo "tests/setup.sh: installing Debian packages: ${apt_packages[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${apt_packages[@]}" >/dev/null
fi

if ! python3 -c 'import pynvml' >/dev/null 2>&1; then
    echo "tests/setup.sh: installing nvidia-ml-py==${NVIDIA_ML_PY_VERSION} (pynvml)"
    pip_args=(install --quiet --disable-pip-version-check "nvidia-ml-py==${NVIDIA_ML_PY_VERSION}")
    # Debian's own python3 is "externally managed" (PEP 668); a pyenv/venv python is not.
    if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
        pip_args+=(--break-system-packages)
    fi
    if python3 -m pip "${pip_args[@]}" 2>/dev/null; then
        :
    else
        as_root python3 -m pip "${pip_args[@]}"
    fi
    python3 -c 'import pynvml' || {
        echo "tests/setup.sh: pynvml still cannot be imported after installing nvidia-ml-py" >&2
        exit 1
    }
fi

if ! python3 -c "import importlib.metadata as m, sys; sys.exit(0 if (m.version('gpustat'), m.version('nvitop')) == ('${GPUSTAT_VERSION}', '${NVITOP_VERSION}') else 1)" >/dev/null 2>&1; then
    echo "tests/setup.sh: installing gpustat==${GPUSTAT_VERSION} and nvitop==${NVITOP_VERSION}"
    # nvidia-ml-py named again so pip keeps the pinned release.
    pip_args=(install --quiet --disable-pip-version-check "gpustat==${GPUSTAT_VERSION}" "nvitop==${NVITOP_VERSION}" "nvidia-ml-py==${NVIDIA_ML_PY_VERSION}")
    if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
        pip_args+=(--break-system-packages)
    fi
    if python3 -m pip "${pip_args[@]}" 2>/dev/null; then
        :
    else
        as_root python3 -m pip "${pip_args[@]}"
    fi
    python3 -c 'import gpustat, nvitop' || {
        echo "tests/setup.sh: gpustat or nvitop still cannot be imported" >&2
        exit 1
    }
fi

if ! python3 -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('prometheus-client') == '${PROMETHEUS_CLIENT_VERSION}' else 1)" >/dev/null 2>&1; then
    echo "tests/setup.sh: installing prometheus-client==${PROMETHEUS_CLIENT_VERSION}"
    pip_args=(install --quiet --disable-pip-version-check "prometheus-client==${PROMETHEUS_CLIENT_VERSION}")
    if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
        pip_args+=(--break-system-packages)
    fi
    if python3 -m pip "${pip_args[@]}" 2>/dev/null; then
        :
    else
        as_root python3 -m pip "${pip_args[@]}"
    fi
    python3 -c 'import prometheus_client.parser, prometheus_client.openmetrics.parser' || {
        echo "tests/setup.sh: prometheus-client still cannot be imported after installing it" >&2
        exit 1
    }
fi

if ! python3 -c 'import kubernetes_validate' >/dev/null 2>&1; then
    echo "tests/setup.sh: installing kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}"
    pip_args=(install --quiet --disable-pip-version-check "kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}")
    if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
        pip_args+=(--break-system-packages)
    fi
    if python3 -m pip "${pip_args[@]}" 2>/dev/null; then
        :
    else
        as_root python3 -m pip "${pip_args[@]}"
    fi
    python3 -c 'import kubernetes_validate, jsonschema, yaml' || {
        echo "tests/setup.sh: kubernetes-validate still cannot be imported after installing it" >&2
        exit 1
    }
fi

# The fuzz targets (tests/fuzz/run.sh) build with cargo-fuzz on the nightly toolchain:
# libFuzzer's instrumentation needs nightly-only rustc flags.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "tests/setup.sh: installing the nightly Rust toolchain (for cargo-fuzz)"
    rustup toolchain install nightly --profile minimal
fi
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz ${CARGO_FUZZ_VERSION}" ]; then
    echo "tests/setup.sh: installing cargo-fuzz ${CARGO_FUZZ_VERSION}"
    cargo install --locked --quiet cargo-fuzz --version "${CARGO_FUZZ_VERSION}"
fi

# The arm64 standard library, for the cross builds of tests/run.sh.
if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    echo "tests/setup.sh: adding the Rust target aarch64-unknown-linux-gnu"
    rustup target add aarch64-unknown-linux-gnu
fi

# podman runs the arm64 images through the kernel's binfmt_misc, qemu-aarch64-static as
# their interpreter (flag F: loaded now, so it works inside containers). In a container
# without systemd nothing mounts binfmt_misc or registers the emulator; do both. Where
# the kernel or the container forbids it, say so: the arm64 image test then skips,
# naming what is missing.
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/register" ]; then
    as_root mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
fi
if [ -e "$binfmt/register" ] && ! grep -qx enabled "$binfmt/qemu-aarch64" 2>/dev/null; then
    echo "tests/setup.sh: registering qemu-aarch64 with binfmt_misc"
    as_root update-binfmts --enable qemu-aarch64 || true
fi
if ! grep -qx enabled "$binfmt/qemu-aarch64" 2>/dev/null; then
    echo "tests/setup.sh: warning: qemu-aarch64 is not registered with binfmt_misc" \
        "(cannot mount $binfmt or register it here): the arm64 image test will skip" >&2
fi

bash "$(dirname "${BASH_SOURCE[0]}")/install-peers.sh"

# kubectl comes with the machine (the tests run `kubectl get --raw` against the adapter);
# say so plainly rather than fail deep inside a test.
if ! command -v kubectl >/dev/null 2>&1; then
    echo "tests/setup.sh: kubectl is not installed; install it (https://kubernetes.io/docs/tasks/tools/) and rerun" >&2
    exit 1
fi
