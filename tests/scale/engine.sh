#!/usr/bin/env bash
# The fleet-scale harness: a synthetic GPU fleet in a sharded Prometheus 3 behind Thanos,
# and (WITH_ADAPTERS=1) gpu-metrics-adapter and prometheus-adapter reading it, on this
# machine:
#
#   bash tests/scale/engine.sh up DIR     # then: . DIR/env
#   bash tests/scale/engine.sh down DIR   # stops everything `up` started
#
# `up` starts:
# - fleet-sim (tests/scale/fleet_sim.rs): $GPUS GPUs (default 100000) in node groups of
#   $NODES_PER_GROUP nodes (50), one scrape endpoint each on one loopback listener;
#   its step (the values) advances every $STEP_SECONDS s (0: only on POST /step?to=N);
# - two Prometheus 3 shards, each keeping the targets whose
#   hashmod(__address__, __metrics_path__) is its number (every endpoint shares one
#   address, so the path tells them apart), every $SCRAPE_INTERVAL (15s), honor_labels
#   as the adapter's docs ask, external label `shard`;
# - a Thanos sidecar beside each shard (gRPC StoreAPI on loopback) and one
#   `thanos query` over both (`--endpoint`).
# It waits until every piece is ready and Thanos answers the fleet's whole series count.
#
# With WITH_ADAPTERS=1 it also starts a Kubernetes API server (tests/kube/cluster.sh with
# CONTROL_PLANE=apiserver, in DIR/kube), creates the fleet's namespaces and pods there
# (API objects only: nothing runs them), and runs both adapters as local processes over
# TLS (a certificate from DIR/certs/ca.crt, for 127.0.0.1) against Thanos query:
# - gpu-metrics-adapter --prometheus-url THANOS, rounds every $ADAPTER_INTERVAL (2s);
# - prometheus-adapter v0.12.0 with tests/scale/prometheus-adapter.yaml (the same five
#   metrics), relisting every $RELIST_INTERVAL (30s).
# Both authenticate as the API server's delegated authentication does: DIR/reader.token
# is a bearer token of ServiceAccount default/fleet-reader, allowed to read the custom
# metrics API; the admin client certificate (DIR/kube/pki/admin.*) works too.
# Extra flags for ours: $OUR_ADAPTER_ARGS (whitespace-separated).
#
# RECORDED=1 loads gpu-metrics-adapter's recording rules (--print-recording-rules,
# evaluated every $SCRAPE_INTERVAL) into both shards and runs ours with
# --prometheus-queries=recorded: the per-pod aggregation happens in each shard as it
# ingests, and a round reads one series per pod and metric through Thanos;
# prometheus-adapter then reads the same recorded series
# (tests/scale/prometheus-adapter-recorded.yaml).
#
# ENGINE_NICE=N runs the fleet and the engine (fleet-sim, shards, sidecars, Thanos
# query) at nice N: on one small machine that stands for the engine having machines
# of its own, as in a cluster, so the adapters' answer latency is not the engine's
# CPU queue (the engine then gets what the adapters leave).
#
# Everything listens on 127.0.0.1 at free ports; DIR gets env (URLs, ports, paths),
# logs/ and pids/. Binaries: $RUST_BIN_DIR (target/debug: fleet-sim,
# gpu-metrics-adapter), $KUBE_BIN_DIR (target/kube/bin: prometheus, thanos,
# prometheus-adapter, etcd, kube-apiserver, kubectl; tests/kube/build.sh builds them).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${KUBE_BIN_DIR:-$root/target/kube/bin}
rust=${RUST_BIN_DIR:-$root/target/debug}
# shellcheck source=../kube/procs.sh
. "$root/tests/kube/procs.sh"

usage() {
    echo "usage: $0 up DIR | down DIR" >&2
    exit 2
}
[ $# -eq 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

down() {
    stop_started
    if [ -d "$dir/kube" ]; then
        bash "$root/tests/kube/cluster.sh" down "$dir/kube"
    fi
}

if [ "$cmd" = down ]; then
    down
    exit 0
fi
[ "$cmd" = up ] || usage

mkdir -p "$dir/logs" "$dir/pids"

gpus=${GPUS:-100000}
per_group=${NODES_PER_GROUP:-50}
scrape_interval=${SCRAPE_INTERVAL:-15s}
step_seconds=${STEP_SECONDS:-0}
with_adapters=${WITH_ADAPTERS:-0}
recorded=${RECORDED:-0}
engine=(nice -n "${ENGINE_NICE:-0}")
needed=("$rust/fleet-sim" "$bin/prometheus" "$bin/thanos")
[ "$with_adapters" = 0 ] || needed+=("$rust/gpu-metrics-adapter" "$bin/prometheus-adapter")
[ "$recorded" = 0 ] || needed+=("$rust/gpu-metrics-adapter")
for b in "${needed[@]}"; do
    [ -x "$b" ] || fail "$b missing (cargo build -p e2e-tests --bin fleet-sim, -p gpu-metrics-adapter; tests/kube/build.sh)"
done

# --- the fleet ----------------------------------------------------------------------

fleet_port=$(free_port)
fleet=http://127.0.0.1:$fleet_port
start fleet-sim "${engine[@]}" "$rust/fleet-sim" --gpus "$gpus" --nodes-per-group "$per_group" \
    --listen "127.0.0.1:$fleet_port" --step-seconds "$step_seconds"
wait_for fleet-sim 30 curl -fs "$fleet/-/ready"
curl -fs "$fleet/shape" >"$dir/shape.json"
curl -fs "$fleet/file-sd" >"$dir/targets.json"
series=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["series"])' "$dir/shape.json")
pods=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pods"])' "$dir/shape.json")

# --- two Prometheus shards, each with a Thanos sidecar ----------------------------------

rule_files=
if [ "$recorded" = 1 ]; then
    # The adapter's own rules, evaluated as often as the fleet is scraped.
    "$rust/gpu-metrics-adapter" --print-recording-rules |
        sed "s/^    interval: .*/    interval: $scrape_interval/" >"$dir/recording-rules.yml"
    grep -q "^    interval: $scrape_interval\$" "$dir/recording-rules.yml" ||
        fail "the printed recording rules have no group interval to set"
    rule_files="rule_files: ['$dir/recording-rules.yml']"
fi
endpoints=()
prom_urls=()
for shard in 0 1; do
    sdir=$dir/shard-$shard
    mkdir -p "$sdir"
    cat >"$sdir/prometheus.yml" <<EOF
global:
  scrape_interval: $scrape_interval
  scrape_timeout: $scrape_interval
  external_labels:
    shard: "$shard"
$rule_files
scrape_configs:
  - job_name: gpu-fleet
    honor_labels: true
    file_sd_configs:
      - files: ['$dir/targets.json']
    relabel_configs:
      - source_labels: [__address__, __metrics_path__]
        modulus: 2
        target_label: __tmp_shard
        action: hashmod
      - source_labels: [__tmp_shard]
        regex: '$shard'
        action: keep
EOF
    port=$(free_port)
    # Equal block durations: no local compaction under the sidecar, as Thanos asks.
    start "prometheus-$shard" "${engine[@]}" "$bin/prometheus" --config.file "$sdir/prometheus.yml" \
        --storage.tsdb.path "$sdir/data" --web.listen-address "127.0.0.1:$port" \
        --storage.tsdb.min-block-duration 2h --storage.tsdb.max-block-duration 2h \
        --storage.tsdb.retention.time 6h --log.level warn
    prom_urls+=("http://127.0.0.1:$port")
    grpc=$(free_port)
    start "sidecar-$shard" "${engine[@]}" "$bin/thanos" sidecar \
        --prometheus.url "http://127.0.0.1:$port" --tsdb.path "$sdir/data" \
        --grpc-address "127.0.0.1:$grpc" --http-address "127.0.0.1:$(free_port)" \
        --log.level warn
    endpoints+=("127.0.0.1:$grpc")
done
for url in "${prom_urls[@]}"; do
    wait_for "Prometheus $url" 60 curl -fs "$url/-/ready"
done
query_port=$(free_port)
thanos=http://127.0.0.1:$query_port
start thanos-query "${engine[@]}" "$bin/thanos" query --http-address "127.0.0.1:$query_port" \
    --grpc-address "127.0.0.1:$(free_port)" --endpoint "${endpoints[0]}" \
    --endpoint "${endpoints[1]}" --log.level warn
wait_for "thanos query" 60 curl -fs "$thanos/-/ready"

# count QUERY URL: the value of a scalar-like instant query, or nothing.
count() {
    curl -fs --get --data-urlencode "query=$1" "$2/api/v1/query" |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)'
}
# Every series of the fleet through Thanos, and both shards holding some.
all_series() {
    [ "$(count 'count({__name__=~"DCGM_FI_.+"})' "$thanos")" = "$series" ] &&
        [ "$(count 'count(count by (shard) ({__name__="DCGM_FI_DEV_GPU_TEMP"}))' "$thanos")" = 2 ]
}
wait_for "all $series series through Thanos query" 300 all_series
if [ "$recorded" = 1 ]; then
    recorded_pods() {
        [ "$(count 'count(namespace_pod:gpu_sample_timestamp_seconds:min)' "$thanos")" = "$pods" ]
    }
    wait_for "every pod's recorded series through Thanos query" 300 recorded_pods
fi
log "engine up: $series series of $gpus GPUs in two shards behind $thanos"

cat >"$dir/env" <<EOF
FLEET_URL=$fleet
PROMETHEUS_URLS="${prom_urls[*]}"
THANOS_URL=$thanos
SIDECARS="${endpoints[*]}"
SERIES=$series
GPUS=$gpus
EOF

[ "$with_adapters" = 1 ] || exit 0

# --- a Kubernetes API server and the fleet's pods -------------------------------------

CONTROL_PLANE=apiserver bash "$root/tests/kube/cluster.sh" up "$dir/kube" 2>"$dir/logs/cluster.log" ||
    fail "the API server did not start (cluster.sh up)"
kubectl() { "$bin/kubectl" --kubeconfig "$dir/kube/kubeconfig" "$@"; }
curl -fs "$fleet/kube-objects" >"$dir/kube-objects.json"
# Namespaces and ServiceAccounts first, then the pods in 4 parallel streams.
python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
items = json.load(open(f"{d}/kube-objects.json"))["items"]
first = [i for i in items if i["kind"] != "Pod"]
pods = [i for i in items if i["kind"] == "Pod"]
json.dump({"apiVersion": "v1", "kind": "List", "items": first}, open(f"{d}/objects-0.json", "w"))
for k in range(4):
    json.dump({"apiVersion": "v1", "kind": "List", "items": pods[k::4]}, open(f"{d}/pods-{k}.json", "w"))
EOF
kubectl create -f "$dir/objects-0.json" >/dev/null 2>"$dir/logs/create.log" ||
    fail "creating the namespaces failed"
creating=()
for k in 0 1 2 3; do
    kubectl create -f "$dir/pods-$k.json" >/dev/null 2>>"$dir/logs/create.log" &
    creating+=($!)
done
for p in "${creating[@]}"; do
    wait "$p" || fail "creating the pods failed"
done
log "pods created"
created=$(kubectl get pods -A --no-headers 2>/dev/null | wc -l)
[ "$created" = "$pods" ] || fail "$created of $pods pods created"
# A reader of the custom metrics API, for both adapters' delegated auth.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: fleet-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: fleet-metrics-reader}
rules:
  - apiGroups: [custom.metrics.k8s.io]
    resources: ["*"]
    verbs: [get, list]
  - nonResourceURLs: ["*"]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: fleet-metrics-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: fleet-metrics-reader}
subjects: [{kind: ServiceAccount, name: fleet-reader, namespace: default}]
EOF
kubectl -n default create token fleet-reader --duration 24h >"$dir/reader.token"

# --- both adapters ----------------------------------------------------------------------

EXTRA_SANS=DNS:localhost,IP:127.0.0.1 bash "$root/deploy/overlays/static-certs/generate-certs.sh" \
    "$dir/certs" >/dev/null
ours_port=$(free_port)
theirs_port=$(free_port)
read -r -a our_extra <<<"${OUR_ADAPTER_ARGS:-}"
their_rules=$here/prometheus-adapter.yaml
if [ "$recorded" = 1 ]; then
    our_extra+=(--prometheus-queries recorded)
    their_rules=$here/prometheus-adapter-recorded.yaml
fi
# MALLOC_ARENA_MAX as the adapter's image sets it (deploy/images/adapter.Containerfile).
start gpu-metrics-adapter env RUST_LOG=info MALLOC_ARENA_MAX=2 "$rust/gpu-metrics-adapter" \
    --bind-address 127.0.0.1 --secure-port "$ours_port" --grpc-port "$(free_port)" \
    --tls-cert-file "$dir/certs/tls.crt" --tls-private-key-file "$dir/certs/tls.key" \
    --kubeconfig "$dir/kube/kubeconfig" --prometheus-url "$thanos" \
    --scrape-interval "${ADAPTER_INTERVAL:-2s}" "${our_extra[@]}"
start prometheus-adapter "$bin/prometheus-adapter" \
    --bind-address 127.0.0.1 --secure-port "$theirs_port" --cert-dir "$dir/certs-pa" \
    --tls-cert-file "$dir/certs/tls.crt" --tls-private-key-file "$dir/certs/tls.key" \
    --lister-kubeconfig "$dir/kube/kubeconfig" \
    --authentication-kubeconfig "$dir/kube/kubeconfig" \
    --authorization-kubeconfig "$dir/kube/kubeconfig" \
    --prometheus-url "$thanos/" --config "$their_rules" \
    --metrics-relist-interval "${RELIST_INTERVAL:-30s}" --v=1
token=$(cat "$dir/reader.token")
# One pod's utilisation from each adapter.
probe=/apis/custom.metrics.k8s.io/v1beta2/namespaces/team-00/pods/w00000-0/gpu_utilization
answers() {
    curl -fs --cacert "$dir/certs/ca.crt" -H "Authorization: Bearer $token" \
        "https://127.0.0.1:$1$probe" | grep -q '"value"'
}
wait_for "gpu-metrics-adapter's first answer" 300 answers "$ours_port"
wait_for "prometheus-adapter's first answer" 300 answers "$theirs_port"
cat >>"$dir/env" <<EOF
KUBECONFIG=$dir/kube/kubeconfig
KUBE_BIN_DIR=$bin
OURS_URL=https://127.0.0.1:$ours_port
THEIRS_URL=https://127.0.0.1:$theirs_port
ADAPTER_CA=$dir/certs/ca.crt
READER_TOKEN_FILE=$dir/reader.token
PODS=$pods
EOF
log "adapters up: ours https://127.0.0.1:$ours_port, prometheus-adapter https://127.0.0.1:$theirs_port"
