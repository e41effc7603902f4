#!/usr/bin/env bash
# Builds the two container images deploy/ runs, with podman, offline:
#   ghcr.io/gpu-exporter/gpu-exporter:VERSION         (deploy/base/exporter/daemonset.yaml)
#   ghcr.io/gpu-exporter/gpu-metrics-adapter:VERSION  (deploy/base/adapter/deployment.yaml)
# VERSION is the crate version (Cargo.toml), never `latest`. The images take the release
# binaries, stripped of their symbol tables: the exporter built without default features
# (no simulators, no test doubles), the adapter as it is. The base is a build argument,
# by default distroless's glibc image with a non-root user; where that cannot be pulled
# (no registry access), a stand-in is built from this machine's glibc and CA files
# (base.Containerfile).
#
# Usage: deploy/images/build.sh [OPTIONS]
#   --registry PREFIX  name the images PREFIX/gpu-exporter and PREFIX/gpu-metrics-adapter
#                      (default ghcr.io/gpu-exporter, the names deploy/ uses)
#   --base IMAGE       base image (default gcr.io/distroless/cc-debian12:nonroot). An IMAGE
#                      given here must exist locally or be pullable: no stand-in for it.
#   --stand-in-base    use the local stand-in base even where the default could be pulled
#   --binaries DIR     package DIR/gpu-exporter and DIR/gpu-metrics-adapter instead of
#                      building them (e.g. from your CI; the exporter without default features)
#   --push             push both images after building them
#   -h, --help         this text
# Environment: PODMAN (default podman), CARGO (default cargo), SOURCE_DATE_EPOCH (image
# creation time; default: the time of the checked-out commit, so a rebuild of the same
# commit gives the same image).
# Prints the two image references on stdout, one a line; progress goes to stderr.
# Images are for this machine's architecture; README.md ("Container images") shows how to
# combine an amd64 and an arm64 build into one multi-architecture tag.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
PODMAN="${PODMAN:-podman}"
CARGO="${CARGO:-cargo}"
DEFAULT_BASE="gcr.io/distroless/cc-debian12:nonroot"
# The glibc of the default base (Debian 12): binaries needing a newer one cannot run on it.
DEFAULT_BASE_GLIBC="2.36"

registry="ghcr.io/gpu-exporter"
base=""
stand_in=false
binaries=""
push=false

say() { echo "build.sh: $*" >&2; }
die() {
    echo "build.sh: error: $*" >&2
    exit 1
}
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --registry) registry="${2:?--registry needs a value}"; shift 2 ;;
        --registry=*) registry="${1#*=}"; shift ;;
        --base) base="${2:?--base needs a value}"; shift 2 ;;
        --base=*) base="${1#*=}"; shift ;;
        --stand-in-base) stand_in=true; shift ;;
        --binaries) binaries="${2:?--binaries needs a value}"; shift 2 ;;
        --binaries=*) binaries="${1#*=}"; shift ;;
        --push) push=true; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
registry="${registry%/}"
[ -n "$base" ] && $stand_in && die "--base and --stand-in-base exclude each other"
command -v "$PODMAN" >/dev/null 2>&1 || die "$PODMAN is not installed (Debian: apt-get install podman)"
command -v "$CARGO" >/dev/null 2>&1 || die "$CARGO is not installed"
command -v strip >/dev/null 2>&1 || die "strip is not installed (Debian: apt-get install binutils)"

work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-exporter-images.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# --- Versions, revision, creation time --------------------------------------------------

# `cargo pkgid` prints path+file:///…/exporter#gpu-exporter@0.1.0 (older cargo: …#0.1.0).
crate_version() {
    local id
    id="$(cd "$root" && "$CARGO" pkgid --offline -p "$1")" || die "cargo pkgid -p $1 failed"
    id="${id##*#}"
    echo "${id##*@}"
}
exporter_version="$(crate_version gpu-exporter)"
adapter_version="$(crate_version gpu-metrics-adapter)"

revision=""
created_epoch="${SOURCE_DATE_EPOCH:-}"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
    revision="$(git -C "$root" rev-parse HEAD)"
    git -C "$root" diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
    [ -n "$created_epoch" ] || created_epoch="$(git -C "$root" log -1 --format=%ct)"
fi

# --- The binaries -------------------------------------------------------------------------

if [ -z "$binaries" ]; then
    # Run from inside a cargo process (a test, a build script), the package variables
    # cargo set for it would reach dependencies' build scripts (ring's reads
    # CARGO_MANIFEST_DIR) and make cargo rebuild what is already built.
    for v in $(compgen -e); do
        case "$v" in
            CARGO_PKG_* | CARGO_MANIFEST_* | CARGO_CRATE_NAME | CARGO_BIN_NAME | \
                CARGO_PRIMARY_PACKAGE | CARGO_TARGET_TMPDIR | CARGO_RUSTC_CURRENT_DIR | OUT_DIR)
                unset "$v" ;;
        esac
    done
    say "building the release binaries (the exporter without default features)"
    (cd "$root" && "$CARGO" build --release --locked -p gpu-exporter --no-default-features) >&2
    (cd "$root" && "$CARGO" build --release --locked -p gpu-metrics-adapter) >&2
    target_dir="$(cd "$root" && "$CARGO" metadata --offline --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
    [ -n "$target_dir" ] || die "cannot find cargo's target directory"
    binaries="$target_dir/release"
fi
exporter_bin="$binaries/gpu-exporter"
adapter_bin="$binaries/gpu-metrics-adapter"
for b in "$exporter_bin" "$adapter_bin"; do
    [ -x "$b" ] || die "$b is missing or not executable"
done

# Where the binaries run here (same architecture), check what they are: the crate
# version, and an exporter without the demo feature (which brings --simulate).
if "$exporter_bin" --version >/dev/null 2>&1; then
    got="$("$exporter_bin" --version)"
    [ "$got" = "gpu-exporter $exporter_version" ] ||
        die "$exporter_bin says '$got', the crate is $exporter_version: stale binary?"
    if "$exporter_bin" --help | grep -q -- '--simulate'; then
        die "$exporter_bin has --simulate: built with the demo feature; build it with --no-default-features"
    fi
    got="$("$adapter_bin" --version)"
    [ "$got" = "gpu-metrics-adapter $adapter_version" ] ||
        die "$adapter_bin says '$got', the crate is $adapter_version: stale binary?"
fi

# The newest glibc symbol version a binary needs (its .dynstr names them).
glibc_needed() { grep -aoE 'GLIBC_2\.[0-9]+' "$1" | sed 's/GLIBC_//' | sort -uV | tail -n 1; }

# --- The base -----------------------------------------------------------------------------

# The stand-in: this machine's glibc runtime libraries and libgcc_s, CA bundle, and
# distroless's users and directories.
build_stand_in() {
    local ctx="$work/base" os_id os_version tag libs lib real dir name ca
    mkdir -p "$ctx/rootfs/etc/ssl/certs" "$ctx/rootfs/tmp" "$ctx/rootfs/home/nonroot"
    chmod 1777 "$ctx/rootfs/tmp"
    chmod 0700 "$ctx/rootfs/home/nonroot"
    command -v ldd >/dev/null 2>&1 || die "ldd is needed to build the stand-in base"
    # What the binaries load (the dynamic loader included), as ldd resolves it here…
    libs="$(for b in "$exporter_bin" "$adapter_bin"; do ldd "$b"; done |
        awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | sort -u)"
    lib="$(printf '%s\n' "$libs" | grep '/libc\.so\.6$' | head -n 1)"
    [ -n "$lib" ] || die "the binaries do not link glibc's libc.so.6: no stand-in base for them"
    dir="$(dirname "$(readlink -f "$lib")")"
    # …and the rest of glibc's runtime libraries: the host's libnvidia-ml.so.1 links
    # libpthread, libdl, librt and libm.
    for name in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 \
        libutil.so.1 libanl.so.1 libnss_files.so.2 libnss_dns.so.2 libgcc_s.so.1; do
        [ -e "$dir/$name" ] && libs="$libs"$'\n'"$dir/$name"
    done
    for lib in $(printf '%s\n' "$libs" | sort -u); do
        real="$(readlink -f "$lib")"
        mkdir -p "$ctx/rootfs$(dirname "$real")"
        cp "$real" "$ctx/rootfs$real"
        if [ "$lib" != "$real" ]; then
            mkdir -p "$ctx/rootfs$(dirname "$lib")"
            ln -sfn "$real" "$ctx/rootfs$lib"
        fi
    done
    for ca in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
        [ -s "$ca" ] && break
    done
    [ -s "$ca" ] || die "no CA bundle on this machine (Debian: apt-get install ca-certificates)"
    cp "$(readlink -f "$ca")" "$ctx/rootfs/etc/ssl/certs/ca-certificates.crt"
    # distroless's users and groups.
    cat >"$ctx/rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
    cat >"$ctx/rootfs/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
nonroot:x:65532:
EOF
    printf 'hosts: files dns\n' >"$ctx/rootfs/etc/nsswitch.conf"
    os_id=linux os_version=""
    if [ -r /etc/os-release ]; then
        cp "$(readlink -f /etc/os-release)" "$ctx/rootfs/etc/os-release"
        os_id="$(. /etc/os-release && echo "${ID:-linux}")"
        os_version="$(. /etc/os-release && echo "${VERSION_ID:-}")"
    fi
    tag="localhost/gpu-exporter-stand-in-base:$os_id$os_version-$(uname -m)"
    # Owned by root, but nonroot's home by nonroot (65532), whoever runs this.
    tar -C "$ctx/rootfs" --create --file "$ctx/rootfs.tar" --sort=name --numeric-owner \
        --owner=0 --group=0 --exclude=./home/nonroot .
    tar -C "$ctx/rootfs" --append --file "$ctx/rootfs.tar" --numeric-owner \
        --owner=65532 --group=65532 --no-recursion ./home/nonroot
    rm -rf "$ctx/rootfs"
    cp "$here/base.Containerfile" "$ctx/Containerfile"
    "$PODMAN" build --quiet ${created_epoch:+--timestamp "$created_epoch"} \
        --label "org.opencontainers.image.description=Local stand-in for $DEFAULT_BASE: this machine's glibc, libgcc_s and CA certificates (deploy/images/base.Containerfile)" \
        --tag "$tag" "$ctx" >/dev/null
    echo "$tag"
}

if [ -n "$base" ]; then
    "$PODMAN" image exists "$base" || "$PODMAN" pull --quiet "$base" >/dev/null ||
        die "cannot find or pull the base image $base"
elif $stand_in; then
    base="$(build_stand_in)"
    say "base: $base (stand-in for $DEFAULT_BASE, as asked)"
elif "$PODMAN" image exists "$DEFAULT_BASE" || "$PODMAN" pull --quiet "$DEFAULT_BASE" >/dev/null 2>&1; then
    base="$DEFAULT_BASE"
    for b in "$exporter_bin" "$adapter_bin"; do
        need="$(glibc_needed "$b")"
        if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$DEFAULT_BASE_GLIBC" | sort -V | tail -n 1)" != "$DEFAULT_BASE_GLIBC" ]; then
            die "$b needs glibc $need, $DEFAULT_BASE has $DEFAULT_BASE_GLIBC: build on Debian 12 (or older), or pass --base"
        fi
    done
else
    say "cannot pull $DEFAULT_BASE (no registry access?): building a stand-in from this machine's glibc and CA files"
    base="$(build_stand_in)"
    say "base: $base"
fi
base_digest="$("$PODMAN" image inspect --format '{{.Digest}}' "$base" 2>/dev/null || true)"

# --- The images ---------------------------------------------------------------------------

created=""
[ -n "$created_epoch" ] && created="$(date -u -d "@$created_epoch" +%Y-%m-%dT%H:%M:%SZ)"

# build_image NAME VERSION BINARY CONTAINERFILE: builds and tags REGISTRY/NAME:VERSION.
build_image() {
    local name="$1" version="$2" bin="$3" containerfile="$4" ctx="$work/$1" ref
    ref="$registry/$name:$version"
    mkdir -p "$ctx"
    # Without the symbol table: 3 MiB less each, and panics still name file and line.
    strip --strip-all -o "$ctx/$name" "$bin" ||
        die "cannot strip $bin (strip comes with binutils; for another architecture's binaries, that architecture's binutils)"
    chmod 0755 "$ctx/$name"
    cp "$here/$containerfile" "$ctx/Containerfile"
    local labels=()
    [ -n "$revision" ] && labels+=(--label "org.opencontainers.image.revision=$revision")
    [ -n "$created" ] && labels+=(--label "org.opencontainers.image.created=$created")
    [ -n "$base_digest" ] && labels+=(--label "org.opencontainers.image.base.digest=$base_digest")
    say "building $ref on $base"
    "$PODMAN" build --quiet ${created_epoch:+--timestamp "$created_epoch"} \
        --build-arg "BASE_IMAGE=$base" --build-arg "VERSION=$version" \
        "${labels[@]}" --tag "$ref" "$ctx" >/dev/null
    local size base_size
    size="$("$PODMAN" image inspect --format '{{.Size}}' "$ref")"
    base_size="$("$PODMAN" image inspect --format '{{.Size}}' "$base")"
    say "$ref: $size bytes, $((size - base_size)) bytes over its base"
    echo "$ref"
}

refs=()
refs+=("$(build_image gpu-exporter "$exporter_version" "$exporter_bin" exporter.Containerfile)")
refs+=("$(build_image gpu-metrics-adapter "$adapter_version" "$adapter_bin" adapter.Containerfile)")

if $push; then
    for ref in "${refs[@]}"; do
        say "pushing $ref"
        "$PODMAN" push "$ref" >&2
    done
fi
printf '%s\n' "${refs[@]}"
