#!/usr/bin/env bash
# Builds the two container images deploy/ runs, with podman, offline, for amd64 and arm64
# (Grace nodes: GH200, GB200), each tag one OCI image index over both architectures:
#   ghcr.io/gpu-exporter/gpu-exporter:VERSION         (deploy/base/exporter/daemonset.yaml)
#   ghcr.io/gpu-exporter/gpu-metrics-adapter:VERSION  (deploy/base/adapter/deployment.yaml)
# VERSION is the crate version (Cargo.toml), never `latest`. The images take the release
# binaries, stripped of their symbol tables: the exporter built without default features
# (no simulators, no test doubles), the adapter as it is; arm64 ones cross-compiled
# (cargo --target aarch64-unknown-linux-gnu; .cargo/config.toml names Debian's cross
# linker). The base is a build argument, by default distroless's glibc image with a
# non-root user, in each architecture's variant; where that cannot be pulled (no registry
# access), a stand-in is built from this machine's glibc and CA files for amd64, and from
# Debian's arm64 glibc (libc6-arm64-cross) for arm64 (base.Containerfile).
#
# Locally, each architecture's image is tagged NAME:VERSION-ARCH and carries the label
# `architecture=ARCH`; NAME:VERSION is this machine's architecture's image, as a pull of
# the multi-architecture tag gives it here. The index itself (podman manifest) is written
# as an OCI image layout, DIR/NAME (index.json), and pushed with --push; podman 4.3
# cannot keep a local index without breaking `podman images`, so none is left behind.
#
# Usage: deploy/images/build.sh [OPTIONS]
#   --registry PREFIX  name the images PREFIX/gpu-exporter and PREFIX/gpu-metrics-adapter
#                      (default ghcr.io/gpu-exporter, the names deploy/ uses)
#   --base IMAGE       base image (default gcr.io/distroless/cc-debian12:nonroot). An IMAGE
#                      given here must exist locally or be pullable: no stand-in for it.
#   --stand-in-base    use the local stand-in base even where the default could be pulled
#   --arch LIST        architectures, comma-separated: amd64, arm64 (default amd64,arm64)
#   --binaries DIR     package DIR/ARCH/gpu-exporter and DIR/ARCH/gpu-metrics-adapter
#                      instead of building them (e.g. from your CI; the exporter without
#                      default features); with a single --arch, DIR/gpu-exporter also does
#   --oci-dir DIR      where the OCI layouts of the indexes go (default: TARGET/images,
#                      TARGET cargo's target directory)
#   --push             push both multi-architecture tags after building them
#   -h, --help         this text
# Environment: PODMAN (default podman), CARGO (default cargo), SOURCE_DATE_EPOCH (image
# creation time; default: the time of the checked-out commit, so a rebuild of the same
# commit gives the same image).
# Prints the two image references (the multi-architecture tags) on stdout, one a line;
# progress goes to stderr.
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
oci_dir=""
arches="amd64,arm64"
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
        --arch) arches="${2:?--arch needs a value}"; shift 2 ;;
        --arch=*) arches="${1#*=}"; shift ;;
        --oci-dir) oci_dir="${2:?--oci-dir needs a value}"; shift 2 ;;
        --oci-dir=*) oci_dir="${1#*=}"; shift ;;
        --push) push=true; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
registry="${registry%/}"
[ -n "$base" ] && $stand_in && die "--base and --stand-in-base exclude each other"
command -v "$PODMAN" >/dev/null 2>&1 || die "$PODMAN is not installed (Debian: apt-get install podman)"
command -v "$CARGO" >/dev/null 2>&1 || die "$CARGO is not installed"

# Go's architecture names (the OCI platform's), and what each needs here: the Rust target,
# strip, and for the arm64 stand-in base and runs under emulation, Debian's arm64 glibc.
host_arch=""
case "$(uname -m)" in
    x86_64) host_arch=amd64 ;;
    aarch64 | arm64) host_arch=arm64 ;;
esac
rust_target() { case "$1" in amd64) echo x86_64-unknown-linux-gnu ;; arm64) echo aarch64-unknown-linux-gnu ;; esac; }
gnu_arch() { case "$1" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; esac; }
strip_for() {
    if [ "$1" = "$host_arch" ]; then echo strip; else echo "$(gnu_arch "$1")-linux-gnu-strip"; fi
}
ARM64_SYSROOT=/usr/aarch64-linux-gnu
IFS=',' read -r -a arch_list <<<"$arches"
[ "${#arch_list[@]}" -gt 0 ] || die "--arch names no architecture"
for arch in "${arch_list[@]}"; do
    case "$arch" in
        amd64 | arm64) ;;
        *) die "unknown architecture $arch (amd64 or arm64)" ;;
    esac
    command -v "$(strip_for "$arch")" >/dev/null 2>&1 ||
        die "$(strip_for "$arch") is not installed (Debian: binutils, or for another architecture binutils-$(gnu_arch "$arch")-linux-gnu)"
done

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
    target_dir="$(cd "$root" && "$CARGO" metadata --offline --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
    [ -n "$target_dir" ] || die "cannot find cargo's target directory"
    [ -n "$oci_dir" ] || oci_dir="$target_dir/images"
fi
[ -n "$oci_dir" ] || oci_dir="$root/target/images"

# bin_dir ARCH: where that architecture's binaries are, built first unless --binaries.
bin_dir() {
    local arch="$1" target_args=()
    if [ -n "$binaries" ]; then
        if [ -x "$binaries/$arch/gpu-exporter" ] || [ "${#arch_list[@]}" -gt 1 ]; then
            echo "$binaries/$arch"
        else
            echo "$binaries"
        fi
        return
    fi
    if [ "$arch" = "$host_arch" ]; then
        say "building the release binaries for $arch (the exporter without default features)"
    else
        target_args=(--target "$(rust_target "$arch")")
        say "cross-building the release binaries for $arch (the exporter without default features)"
    fi
    (cd "$root" && "$CARGO" build --release --locked "${target_args[@]}" -p gpu-exporter --no-default-features) >&2
    (cd "$root" && "$CARGO" build --release --locked "${target_args[@]}" -p gpu-metrics-adapter) >&2
    if [ "$arch" = "$host_arch" ]; then
        echo "$target_dir/release"
    else
        echo "$target_dir/$(rust_target "$arch")/release"
    fi
}

# run_bin ARCH BINARY ARGS…: run it here, under qemu-aarch64 for arm64 on another host.
run_bin() {
    local arch="$1"
    shift
    if [ "$arch" = "$host_arch" ]; then
        "$@"
    elif [ "$arch" = arm64 ] && command -v qemu-aarch64-static >/dev/null 2>&1 && [ -d "$ARM64_SYSROOT" ]; then
        qemu-aarch64-static -L "$ARM64_SYSROOT" "$@"
    else
        return 127
    fi
}

# check_binaries ARCH EXPORTER ADAPTER: what they are, where they can run here: the
# crate version, an exporter without the demo feature (which brings --simulate), and
# the architecture ELF says.
check_binaries() {
    local arch="$1" exporter_bin="$2" adapter_bin="$3" b machine got
    for b in "$exporter_bin" "$adapter_bin"; do
        [ -x "$b" ] || die "$b is missing or not executable"
        # ELF e_machine, little-endian, at byte 18: 62 x86-64, 183 AArch64.
        machine="$(od -An -tu2 -j18 -N2 "$b" | tr -d ' ')"
        case "$arch:$machine" in
            amd64:62 | arm64:183) ;;
            *) die "$b is not an $arch binary (ELF machine $machine)" ;;
        esac
    done
    if run_bin "$arch" "$exporter_bin" --version >/dev/null 2>&1; then
        got="$(run_bin "$arch" "$exporter_bin" --version)"
        [ "$got" = "gpu-exporter $exporter_version" ] ||
            die "$exporter_bin says '$got', the crate is $exporter_version: stale binary?"
        if run_bin "$arch" "$exporter_bin" --help | grep -q -- '--simulate'; then
            die "$exporter_bin has --simulate: built with the demo feature; build it with --no-default-features"
        fi
        got="$(run_bin "$arch" "$adapter_bin" --version)"
        [ "$got" = "gpu-metrics-adapter $adapter_version" ] ||
            die "$adapter_bin says '$got', the crate is $adapter_version: stale binary?"
    else
        say "cannot run the $arch binaries here to check their version (arm64: qemu-user-static and libc6-arm64-cross)"
    fi
}

# The newest glibc symbol version a binary needs (its .dynstr names them).
glibc_needed() { grep -aoE 'GLIBC_2\.[0-9]+' "$1" | sed 's/GLIBC_//' | sort -uV | tail -n 1; }

# --- The base -----------------------------------------------------------------------------

# stand_in_libs ARCH EXPORTER ADAPTER: "LIBRARY REAL-FILE" lines, the libraries the
# binaries load (the dynamic loader included) and the rest of glibc's runtime libraries
# (the host's libnvidia-ml.so.1 links libpthread, libdl, librt and libm), with libgcc_s.
# amd64 (this machine's): as ldd resolves them here. arm64: Debian's arm64 glibc for
# cross builds (libc6-arm64-cross, $ARM64_SYSROOT/lib), at the paths an arm64 Debian
# has them (/lib/ld-linux-aarch64.so.1, /lib/aarch64-linux-gnu/…).
glibc_runtime="libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1 libnss_files.so.2 libnss_dns.so.2 libgcc_s.so.1"
stand_in_libs() {
    local arch="$1" exporter_bin="$2" adapter_bin="$3" libs lib dir name needed
    if [ "$arch" = "$host_arch" ]; then
        command -v ldd >/dev/null 2>&1 || die "ldd is needed to build the stand-in base"
        libs="$(for b in "$exporter_bin" "$adapter_bin"; do ldd "$b"; done |
            awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | sort -u)"
        lib="$(printf '%s\n' "$libs" | grep '/libc\.so\.6$' | head -n 1)"
        [ -n "$lib" ] || die "the binaries do not link glibc's libc.so.6: no stand-in base for them"
        dir="$(dirname "$(readlink -f "$lib")")"
        for name in $glibc_runtime; do
            [ -e "$dir/$name" ] && libs="$libs"$'\n'"$dir/$name"
        done
        for lib in $(printf '%s\n' "$libs" | sort -u); do
            echo "$lib $(readlink -f "$lib")"
        done
    elif [ "$arch" = arm64 ]; then
        dir="$ARM64_SYSROOT/lib"
        [ -e "$dir/libc.so.6" ] && [ -e "$dir/ld-linux-aarch64.so.1" ] ||
            die "no arm64 glibc in $dir for the stand-in base (Debian: apt-get install libc6-arm64-cross)"
        command -v readelf >/dev/null 2>&1 || die "readelf is needed (Debian: apt-get install binutils)"
        needed="$(for b in "$exporter_bin" "$adapter_bin"; do readelf -d "$b"; done |
            sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
        printf '%s\n' "$needed" | grep -qx 'libc\.so\.6' ||
            die "the arm64 binaries do not link glibc's libc.so.6: no stand-in base for them"
        echo "/lib/ld-linux-aarch64.so.1 $(readlink -f "$dir/ld-linux-aarch64.so.1")"
        for name in $(printf '%s\n' $needed $glibc_runtime | sort -u); do
            [ -e "$dir/$name" ] || die "the arm64 binaries need $name, not in $dir"
            echo "/lib/aarch64-linux-gnu/$name $(readlink -f "$dir/$name")"
        done
    else
        die "no stand-in base for $arch on this $(uname -m) machine"
    fi
}

# build_stand_in ARCH EXPORTER ADAPTER: glibc's runtime libraries and libgcc_s of that
# architecture (stand_in_libs), this machine's CA bundle, and distroless's users and
# directories; prints its tag.
build_stand_in() {
    local arch="$1" ctx="$work/base-$1" os_id os_version tag lib real dest ca
    mkdir -p "$ctx/rootfs/etc/ssl/certs" "$ctx/rootfs/tmp" "$ctx/rootfs/home/nonroot"
    chmod 1777 "$ctx/rootfs/tmp"
    chmod 0700 "$ctx/rootfs/home/nonroot"
    # Each file where its architecture's Debian has it (under /usr/lib, merged /usr), a
    # link from the path the loader and the binaries name.
    stand_in_libs "$arch" "$2" "$3" >"$ctx/libs"
    while read -r lib real; do
        case "$arch" in
            "$host_arch") dest="$real" ;;
            arm64) dest="/usr/lib/aarch64-linux-gnu/$(basename "$real")" ;;
        esac
        mkdir -p "$ctx/rootfs$(dirname "$dest")"
        cp "$real" "$ctx/rootfs$dest"
        if [ "$lib" != "$dest" ]; then
            mkdir -p "$ctx/rootfs$(dirname "$lib")"
            ln -sfn "$dest" "$ctx/rootfs$lib"
        fi
    done <"$ctx/libs"
    for ca in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
        [ -s "$ca" ] && break
    done
    [ -s "$ca" ] || die "no CA bundle on this machine (Debian: apt-get install ca-certificates)"
    cp "$(readlink -f "$ca")" "$ctx/rootfs/etc/ssl/certs/ca-certificates.crt"
    # distroless's users and groups.
    cat >"$ctx/rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
    cat >"$ctx/rootfs/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
nonroot:x:65532:
GROUP
    printf 'hosts: files dns\n' >"$ctx/rootfs/etc/nsswitch.conf"
    os_id=linux os_version=""
    if [ -r /etc/os-release ]; then
        cp "$(readlink -f /etc/os-release)" "$ctx/rootfs/etc/os-release"
        os_id="$(. /etc/os-release && echo "${ID:-linux}")"
        os_version="$(. /etc/os-release && echo "${VERSION_ID:-}")"
    fi
    tag="localhost/gpu-exporter-stand-in-base:$os_id$os_version-$(gnu_arch "$arch")"
    # Owned by root, but nonroot's home by nonroot (65532), whoever runs this.
    tar -C "$ctx/rootfs" --create --file "$ctx/rootfs.tar" --sort=name --numeric-owner \
        --owner=0 --group=0 --exclude=./home/nonroot .
    tar -C "$ctx/rootfs" --append --file "$ctx/rootfs.tar" --numeric-owner \
        --owner=65532 --group=65532 --no-recursion ./home/nonroot
    rm -rf "$ctx/rootfs"
    cp "$here/base.Containerfile" "$ctx/Containerfile"
    local from="this machine's glibc, libgcc_s"
    [ "$arch" = "$host_arch" ] || from="Debian's $arch glibc and libgcc_s (libc6-$arch-cross)"
    "$PODMAN" build --quiet --platform "linux/$arch" ${created_epoch:+--timestamp "$created_epoch"} \
        --label "org.opencontainers.image.description=Local stand-in for $DEFAULT_BASE: $from and CA certificates (deploy/images/base.Containerfile)" \
        --label "architecture=$arch" \
        --tag "$tag" "$ctx" >/dev/null
    echo "$tag"
}

image_arch() { "$PODMAN" image inspect --format '{{.Architecture}}' "$1" 2>/dev/null; }

# base_for ARCH EXPORTER ADAPTER: "FROM NAME" — what to build on (an image ID where a
# name may point at another architecture's variant) and the name the label gives.
base_for() {
    local arch="$1" id need b
    if [ -n "$base" ]; then
        if [ "$(image_arch "$base")" = "$arch" ]; then
            id="$("$PODMAN" image inspect --format '{{.Id}}' "$base")"
        else
            id="$("$PODMAN" pull --quiet --arch "$arch" "$base")" ||
                die "cannot find or pull the $arch variant of the base image $base"
        fi
        echo "$id $base"
        return
    fi
    if ! $stand_in; then
        if [ "$(image_arch "$DEFAULT_BASE")" = "$arch" ]; then
            id="$("$PODMAN" image inspect --format '{{.Id}}' "$DEFAULT_BASE")"
        else
            id="$("$PODMAN" pull --quiet --arch "$arch" "$DEFAULT_BASE" 2>/dev/null)" || id=""
        fi
        if [ -n "$id" ]; then
            for b in "$2" "$3"; do
                need="$(glibc_needed "$b")"
                if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$DEFAULT_BASE_GLIBC" | sort -V | tail -n 1)" != "$DEFAULT_BASE_GLIBC" ]; then
                    die "$b needs glibc $need, $DEFAULT_BASE has $DEFAULT_BASE_GLIBC: build on Debian 12 (or older), or pass --base"
                fi
            done
            echo "$id $DEFAULT_BASE"
            return
        fi
        say "cannot pull the $arch variant of $DEFAULT_BASE (no registry access?): building a stand-in"
    fi
    local tag
    tag="$(build_stand_in "$arch" "$2" "$3")"
    say "base for $arch: $tag (stand-in for $DEFAULT_BASE)"
    echo "$tag $tag"
}

# --- The images ---------------------------------------------------------------------------

created=""
[ -n "$created_epoch" ] && created="$(date -u -d "@$created_epoch" +%Y-%m-%dT%H:%M:%SZ)"

# build_image ARCH NAME VERSION BINARY CONTAINERFILE BASE-FROM BASE-NAME: builds and
# tags REGISTRY/NAME:VERSION-ARCH; prints the tag.
build_image() {
    local arch="$1" name="$2" version="$3" bin="$4" containerfile="$5" from="$6" base_name="$7"
    local ctx="$work/$arch-$name" ref base_digest
    ref="$registry/$name:$version-$arch"
    mkdir -p "$ctx"
    # Without the symbol table: 3 MiB less each, and panics still name file and line.
    "$(strip_for "$arch")" --strip-all -o "$ctx/$name" "$bin" ||
        die "cannot strip $bin"
    chmod 0755 "$ctx/$name"
    cp "$here/$containerfile" "$ctx/Containerfile"
    base_digest="$("$PODMAN" image inspect --format '{{.Digest}}' "$from" 2>/dev/null || true)"
    local labels=(--label "architecture=$arch" --label "org.opencontainers.image.base.name=$base_name")
    [ -n "$revision" ] && labels+=(--label "org.opencontainers.image.revision=$revision")
    [ -n "$created" ] && labels+=(--label "org.opencontainers.image.created=$created")
    [ -n "$base_digest" ] && labels+=(--label "org.opencontainers.image.base.digest=$base_digest")
    say "building $ref on $base_name"
    "$PODMAN" build --quiet --platform "linux/$arch" ${created_epoch:+--timestamp "$created_epoch"} \
        --build-arg "BASE_IMAGE=$from" --build-arg "VERSION=$version" \
        "${labels[@]}" --tag "$ref" "$ctx" >/dev/null
    local size base_size
    size="$("$PODMAN" image inspect --format '{{.Size}}' "$ref")"
    base_size="$("$PODMAN" image inspect --format '{{.Size}}' "$from")"
    say "$ref: $size bytes, $((size - base_size)) bytes over its base"
    echo "$ref"
}

# The host's architecture last: where a base image is pulled per architecture under one
# name, the name then stays on the host's variant.
ordered=()
for arch in "${arch_list[@]}"; do [ "$arch" = "$host_arch" ] || ordered+=("$arch"); done
for arch in "${arch_list[@]}"; do [ "$arch" = "$host_arch" ] && ordered+=("$arch"); done

declare -A exporter_refs adapter_refs
for arch in "${ordered[@]}"; do
    dir="$(bin_dir "$arch")" || exit 1
    check_binaries "$arch" "$dir/gpu-exporter" "$dir/gpu-metrics-adapter"
    bases="$(base_for "$arch" "$dir/gpu-exporter" "$dir/gpu-metrics-adapter")" || exit 1
    read -r from base_name <<<"$bases"
    exporter_refs[$arch]="$(build_image "$arch" gpu-exporter "$exporter_version" "$dir/gpu-exporter" exporter.Containerfile "$from" "$base_name")"
    adapter_refs[$arch]="$(build_image "$arch" gpu-metrics-adapter "$adapter_version" "$dir/gpu-metrics-adapter" adapter.Containerfile "$from" "$base_name")"
done

# index NAME VERSION: the OCI image index over the architectures' images, written to
# $oci_dir/NAME and pushed with --push; NAME:VERSION tagged on this machine's image and
# added to refs.
index_list=""
trap 'rm -rf "$work"; [ -z "$index_list" ] || "$PODMAN" manifest rm "$index_list" >/dev/null 2>&1 || true' EXIT
index() {
    local name="$1" version="$2" ref="$registry/$1:$2" arch local_arch=""
    index_list="localhost/gpu-exporter-index-$$/$name:$version"
    "$PODMAN" manifest rm "$index_list" >/dev/null 2>&1 || true
    "$PODMAN" manifest create "$index_list" >/dev/null
    for arch in "${arch_list[@]}"; do
        local arch_ref
        [ "$name" = gpu-exporter ] && arch_ref="${exporter_refs[$arch]}" || arch_ref="${adapter_refs[$arch]}"
        "$PODMAN" manifest add "$index_list" "containers-storage:$arch_ref" >/dev/null
        [ -n "$local_arch" ] && [ "$arch" != "$host_arch" ] || local_arch="$arch_ref"
    done
    mkdir -p "$oci_dir"
    rm -rf "${oci_dir:?}/$name"
    "$PODMAN" manifest push --all --quiet "$index_list" "oci:$oci_dir/$name:$version" >&2
    say "$ref: index of ${arch_list[*]} in $oci_dir/$name"
    if $push; then
        say "pushing $ref (${arch_list[*]})"
        "$PODMAN" manifest push --all "$index_list" "docker://$ref" >&2
    fi
    "$PODMAN" manifest rm "$index_list" >/dev/null
    index_list=""
    "$PODMAN" tag "$local_arch" "$ref"
    refs+=("$ref")
}

refs=()
index gpu-exporter "$exporter_version"
index gpu-metrics-adapter "$adapter_version"
printf '%s\n' "${refs[@]}"
