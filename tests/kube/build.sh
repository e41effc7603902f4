#!/usr/bin/env bash
# Build the tests' control plane from the Go modules beside this script, into
# target/kube/bin (or $KUBE_BIN_DIR): kube-apiserver, kube-controller-manager,
# kube-scheduler and kubectl of one Kubernetes release (kubernetes/), etcd (etcd/), kwok
# (kwok/), helm (helm/), Prometheus 3 with promtool (prometheus/), which the end-to-end
# tests run as "a real Prometheus", KEDA's operator and metrics API server (keda/:
# keda and keda-adapter), and the fleet-scale harness's engine and yardstick (tests/scale):
# Thanos (thanos/), prometheus-adapter (prometheus-adapter/) and the load generator
# vegeta (vegeta/). One module per tool keeps their dependency graphs apart. A module is
# rebuilt only when its go.mod, go.sum or sources change (a stamp beside the binaries).
#   bash tests/kube/build.sh [MODULE...]     (default: every module)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${KUBE_BIN_DIR:-$root/target/kube/bin}
mkdir -p "$out"
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
only=" $* "

# Go's build and module caches: under target/kube unless the environment names others,
# and removed after each module is built. Nothing reads them again until a go.mod
# changes, the modules share little (their versions differ), and CI's disk is shared:
# kept for the whole build they peaked at 17 GiB, one module's at a time at 5 GiB
# (KEDA's), for 18 % more build time (docs/benchmarks/images-and-ci.md).
# KUBE_KEEP_GO_CACHE=1 keeps them (when iterating on a module); a failed build keeps
# them too, so the next try resumes.
caches=()
if [ -z "${GOCACHE:-}" ]; then
    export GOCACHE="$root/target/kube/go-build"
    caches+=("$GOCACHE")
fi
if [ -z "${GOMODCACHE:-}" ]; then
    export GOMODCACHE="$root/target/kube/go-mod"
    caches+=("$GOMODCACHE")
fi
drop_caches() {
    [ "${KUBE_KEEP_GO_CACHE:-}" != 1 ] && [ ${#caches[@]} -gt 0 ] || return 0
    echo "tests/kube/build.sh: removing Go's caches ($(du -sch "${caches[@]}" 2>/dev/null | tail -1 | cut -f1))" >&2
    # The module cache is read-only by design.
    chmod -R u+w "${caches[@]}" 2>/dev/null || true
    rm -rf "${caches[@]}"
}

# Module files the tests read at run time, copied out of the module cache into
# $out/share/MODULE/ before the cache goes: kwok's stages (tests/kube/cluster.sh starts
# kwok with them) and KEDA's config/ (its CRDs, RBAC and APIService).
#   MODULE → "GO_MODULE DIR..."
declare -A share=(
    [kwok]="sigs.k8s.io/kwok kustomize/stage"
    [keda]="github.com/kedacore/keda/v2 config"
)

# build MODULE LDFLAGS PACKAGE...    (a PACKAGE written NAME=PACKAGE is built as NAME)
build() {
    local module=$1 ldflags=$2
    shift 2
    [ "$only" = "  " ] || [[ "$only" == *" $module "* ]] || return 0
    local stamp="$out/.$module.stamp" want
    want=$(cd "$here/$module" && find . -maxdepth 1 -type f \( -name 'go.*' -o -name '*.go' \) \
        -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-32)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
        { [ -z "${share[$module]:-}" ] || [ -d "$out/share/$module" ]; }; then
        return 0
    fi
    echo "tests/kube/build.sh: building $module" >&2
    local started=$SECONDS
    local pkg plain=()
    for pkg in "$@"; do
        case "$pkg" in
        *=*) (cd "$here/$module" && go build -ldflags "-s -w $ldflags" -o "$out/${pkg%%=*}" "${pkg#*=}") ;;
        *) plain+=("$pkg") ;;
        esac
    done
    [ ${#plain[@]} -eq 0 ] || (cd "$here/$module" && go build -ldflags "-s -w $ldflags" -o "$out/" "${plain[@]}")
    if [ -n "${share[$module]:-}" ]; then
        local files gomod dir src
        read -r gomod files <<<"${share[$module]}"
        src=$(cd "$here/$module" && go list -m -f '{{.Dir}}' "$gomod")
        [ -d "$src" ] || { echo "tests/kube/build.sh: $gomod not in the module cache" >&2; exit 1; }
        rm -rf "$out/share/$module"
        for dir in $files; do
            mkdir -p "$out/share/$module/$(dirname "$dir")"
            cp -R --no-preserve=mode "$src/$dir" "$out/share/$module/$dir"
        done
    fi
    echo "$want" >"$stamp"
    echo "tests/kube/build.sh: $module built in $((SECONDS - started)) s" >&2
    drop_caches
}

# The release the binaries report (kubectl version, discovery), from go.mod.
kube=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/kubernetes/go.mod")
minor=$(echo "$kube" | cut -d. -f2)
v=k8s.io/component-base/version
build kubernetes "-X $v.gitVersion=$kube -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
build etcd "" .
build kwok "" sigs.k8s.io/kwok/cmd/kwok
helm=$(awk '$1 == "helm.sh/helm/v4" { print $2 }' "$here/helm/go.mod")
build helm "-X helm.sh/helm/v4/internal/version.version=$helm -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    helm.sh/helm/v4/cmd/helm
# Prometheus' release from its module version: v0.316.0 is Prometheus 3.16.0. Only the
# static, file and http service discoveries are built in (the tests scrape loopback
# targets), which keeps the cloud providers' SDKs and client-go out of the build; add
# enable_<name>_sd to the tags for another.
prom=$(awk '$1 == "github.com/prometheus/prometheus" { print $2 }' "$here/prometheus/go.mod")
prom_minor=${prom#v0.}
prom_minor=${prom_minor%%.*}
prom_version="$((prom_minor / 100)).$((prom_minor % 100)).${prom##*.}"
pv=github.com/prometheus/common/version
build prometheus "-X $pv.Version=$prom_version -X $pv.Branch=HEAD -X $pv.Revision=$prom" \
    -tags netgo,remove_all_sd \
    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
# KEDA's operator and metrics API server, named as KEDA's Makefile names them.
keda=$(awk '$1 == "github.com/kedacore/keda/v2" { print $2 }' "$here/keda/go.mod")
build keda "-X github.com/kedacore/keda/v2/version.Version=${keda#v} -X github.com/kedacore/keda/v2/version.GitCommit=$keda" \
    keda=github.com/kedacore/keda/v2/cmd/operator keda-adapter=github.com/kedacore/keda/v2/cmd/adapter
# Thanos (sidecars and querier in one binary) and prometheus-adapter, for tests/scale.
thanos=$(awk '$1 == "github.com/thanos-io/thanos" { print $2 }' "$here/thanos/go.mod")
# Built with Thanos' own build tag (its .promu.yml): without slicelabels, Prometheus'
# default string labels meet Thanos' unsafe ZLabel casts and the sidecar panics in its
# first gRPC answer ("makeslice: len out of range").
build thanos "-X $pv.Version=${thanos#v} -X $pv.Branch=HEAD -X $pv.Revision=$thanos" \
    -tags slicelabels github.com/thanos-io/thanos/cmd/thanos
build prometheus-adapter "" prometheus-adapter=sigs.k8s.io/prometheus-adapter/cmd/adapter
# vegeta, the fleet-scale bench's paced load (requests at a fixed rate, open model).
vegeta=$(awk '$1 == "github.com/tsenart/vegeta/v12" { print $2 }' "$here/vegeta/go.mod")
build vegeta "-X main.Version=$vegeta" vegeta=github.com/tsenart/vegeta/v12
