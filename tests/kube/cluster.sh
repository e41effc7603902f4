#!/usr/bin/env bash
# A real Kubernetes control plane on this machine, with simulated GPU nodes, the
# exporters and the metrics adapter registered through deploy/:
#
#   bash tests/kube/cluster.sh up DIR     # then: export KUBECONFIG=DIR/kubeconfig
#   bash tests/kube/cluster.sh down DIR   # stops everything `up` started
#
# `up` starts etcd, kube-apiserver (RBAC, the aggregation layer with its front-proxy
# client certificate and requestheader CA, service-account tokens), the
# kube-controller-manager (HPA sync every 2 s), kube-scheduler and kwok, which plays the
# nodes and the pod lifecycles (there is no kubelet). It adds $GPU_NODES nodes
# (default 2) with capacity nvidia.com/gpu: 8; on each runs a fake kubelet
# (kube-sim's fake-kubelet: the pods the scheduler bound there and the GPUs allocated to
# them, on a PodResources socket) and a gpu-exporter reading simulated GPUs through the
# fake libnvidia-ml with the node's ServiceAccount identity. The adapter runs as a local
# process with the ServiceAccount and RBAC of deploy/, registered by deploy/'s
# APIService objects: deploy/overlays/static-certs is applied with a serving certificate
# from its generate-certs.sh (SAN gpu-metrics-adapter.gpu-monitoring.svc, caBundle set
# by the overlay), its Service replaced by an ExternalName Service to localhost. With
# DEPLOY_WITH=helm, deploy/helm's two charts are installed instead (`helm install`, the
# same certificate, the same Service patch as a post-renderer). Then deploy/examples/hpa
# (the inference Deployment and its HPA).
#
# With WITH_KEDA=1, KEDA runs beside it as a KEDA user installs it: KEDA's operator and
# its metrics API server (built from KEDA's module, tests/kube/keda) as local processes
# with the keda/keda-operator ServiceAccount, KEDA's CRDs, RBAC and APIService
# v1beta1.external.metrics.k8s.io from the same module's config/ (its `minimal`
# kustomization: the Deployments left out, the Services made ExternalNames to localhost,
# the APIService's caBundle that of a KEDA CA made here: the operator's own certificate
# rotation is off). The adapter is installed without its external-metrics APIService
# (KEDA owns it; kustomize: static-certs without components/external-metrics, Helm:
# externalMetrics.enabled=false). Its gRPC port requires KEDA's client certificate, whose
# Secret is made in namespace inference as deploy/examples/keda-external says; so is the
# client certificate of KEDA's metrics-api trigger (a CertificateSigningRequest, signed by
# the cluster's client CA), as deploy/examples/keda-metrics-api says. DIR/examples holds
# deploy/examples/keda-* with the one change a cluster without cluster DNS needs: the
# adapter's addresses gpu-metrics-adapter.gpu-monitoring.svc:9090 (scalerAddress) and
# :443 (the metrics-api url) become localhost:GRPC_PORT and localhost:ADAPTER_PORT (the
# serving certificate, from generate-certs.sh, gets the extra SAN DNS:localhost):
# `kubectl apply -k DIR/examples/keda-external`.
#
# With ADAPTER_REPLICAS=2 (or 3; kustomize, without KEDA), the adapter runs as the
# Deployment's replicas do in a cluster: kwok plays the Deployment's pods, each pod's IP
# is added to the loopback interface (this needs CAP_NET_ADMIN), and one adapter process
# serves on each pod's IP; the aggregator routes to the Service's endpoints
# (--enable-aggregator-routing), which the real EndpointSlice controller keeps from the
# pods' readiness. `cluster.sh adapter DIR POD` starts the process of a new pod (what a
# kubelet would do for a replacement replica); `down` removes the addresses it added.
#
# With CONTROL_PLANE=apiserver, `up` stops once etcd and kube-apiserver serve (the same
# PKI, flags and admin kubeconfig; no controllers, kwok, nodes, exporters or adapter):
# for tests that need pods only as API objects (tests/scale). DIR/env then has
# KUBECONFIG, KUBE_BIN_DIR, API_SERVER and PKI_DIR.
#
# Every GPU's utilisation follows DIR/dial (`*=PERCENT`, or `INDEX=PERCENT` lines; see
# gpu-sim's dial): write it to make the HPA scale. DIR gets kubeconfig (admin), logs/,
# env (ports and paths, sourceable) and pids/. Ports are free ones.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${KUBE_BIN_DIR:-$root/target/kube/bin}
rust=${RUST_BIN_DIR:-$root/target/debug}
# shellcheck source=procs.sh
. "$here/procs.sh"

usage() {
    echo "usage: $0 up DIR | down DIR | adapter DIR POD" >&2
    exit 2
}
[ $# -eq 2 ] || { [ $# -eq 3 ] && [ "$1" = adapter ]; } || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

# --- down --------------------------------------------------------------------------

down() {
    stop_started
    # The pod IPs `up` added to the loopback interface (ADAPTER_REPLICAS > 1).
    if [ -f "$dir/lo-addresses" ]; then
        while read -r ip; do
            ip addr del "$ip/32" dev lo 2>/dev/null || true
        done <"$dir/lo-addresses"
        rm -f "$dir/lo-addresses"
    fi
}

if [ "$cmd" = down ]; then
    down
    exit 0
fi
[ "$cmd" = up ] || [ "$cmd" = adapter ] || usage

# --- helpers -------------------------------------------------------------------------

mkdir -p "$dir/logs" "$dir/pids" "$dir/pki" "$dir/nodes"
kubectl() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
# Helm with its state under DIR/helm (never the user's ~/.config/helm).
helm_home=$dir/helm
helm() {
    HELM_CACHE_HOME=$helm_home/cache HELM_CONFIG_HOME=$helm_home/config \
        HELM_DATA_HOME=$helm_home/data KUBECONFIG=$dir/kubeconfig "$bin/helm" "$@"
}
with_keda=${WITH_KEDA:-0}
case "$with_keda" in
0 | 1) ;;
*) fail "WITH_KEDA=$with_keda: 0 or 1" ;;
esac
control_plane=${CONTROL_PLANE:-full}
case "$control_plane" in
full | apiserver) ;;
*) fail "CONTROL_PLANE=$control_plane: full or apiserver" ;;
esac
deploy_with=${DEPLOY_WITH:-kustomize}
case "$deploy_with" in
kustomize | helm) ;;
*) fail "DEPLOY_WITH=$deploy_with: kustomize or helm" ;;
esac
adapter_replicas=${ADAPTER_REPLICAS:-1}
case "$adapter_replicas" in
1 | 2 | 3) ;;
*) fail "ADAPTER_REPLICAS=$adapter_replicas: 1, 2 or 3" ;;
esac
# Replicas behind the Service's endpoints need the aggregator to route to endpoints,
# which it cannot do for KEDA's ExternalName Services here; and the Helm path keeps
# its own Service plumbing.
if [ "$adapter_replicas" != 1 ] && { [ "$with_keda" = 1 ] || [ "$deploy_with" = helm ]; }; then
    fail "ADAPTER_REPLICAS=$adapter_replicas runs with DEPLOY_WITH=kustomize and without WITH_KEDA"
fi

# adapter_pod POD: the adapter process of the Deployment's pod POD, serving on the pod's
# IP (added to the loopback interface), as a kubelet starts a replica's container.
adapter_pod() {
    local pod=$1 ip
    ip=$(kubectl -n gpu-monitoring get pod "$pod" -o jsonpath='{.status.podIP}')
    [ -n "$ip" ] || fail "pod $pod has no IP"
    if ! ip -o addr show dev lo | grep -qF " $ip/32 "; then
        ip addr add "$ip/32" dev lo ||
            fail "cannot add $ip to the loopback interface (ADAPTER_REPLICAS > 1 needs CAP_NET_ADMIN)"
        echo "$ip" >>"$dir/lo-addresses"
    fi
    bash "$dir/run-adapter.sh" "$ip" "gpu-metrics-adapter-$pod"
    # The readiness probe: Ready once /readyz answers (a source answers).
    wait_for "the adapter of pod $pod" 60 curl -fsk "https://$ip:$adapter_port/readyz"
    kubectl -n gpu-monitoring patch pod "$pod" --subresource=status --type=strategic -p \
        '{"status":{"conditions":[{"type":"Ready","status":"True"},{"type":"ContainersReady","status":"True"}]}}' >/dev/null
}
if [ "$cmd" = adapter ]; then
    adapter_port=$(sed -n 's/^ADAPTER_PORT=//p' "$dir/env")
    adapter_pod "$3"
    exit 0
fi
# --- binaries ----------------------------------------------------------------------

modules=(kubernetes etcd kwok helm)
[ "$with_keda" = 0 ] || modules+=(keda)
[ "$control_plane" = full ] || modules=(kubernetes etcd)
bash "$here/build.sh" "${modules[@]}"
if [ "$control_plane" = full ] && [ -z "${RUST_BIN_DIR:-}" ]; then
    (cd "$root" && cargo build --locked -q -p gpu-exporter -p gpu-metrics-adapter -p kube-sim \
        -p fake-nvml)
fi
for b in gpu-exporter gpu-metrics-adapter fake-kubelet libnvidia_ml.so; do
    [ "$control_plane" = full ] || break
    [ -e "$rust/$b" ] || fail "$rust/$b missing (cargo build)"
done

# --- PKI ---------------------------------------------------------------------------

pki=$dir/pki
umask 077
# ca NAME CN
ca() {
    [ -s "$pki/$1.crt" ] && return 0
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$1.key"
    openssl req -x509 -new -key "$pki/$1.key" -sha256 -days 30 -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$pki/$1.crt"
}
# cert NAME CA SUBJECT USAGE [SANS]
cert() {
    local name=$1 ca=$2 subject=$3 usage=$4 sans=${5:-}
    [ -s "$pki/$name.crt" ] && return 0
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key"
    openssl req -new -key "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr"
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature"
        echo "extendedKeyUsage=$usage"
        [ -z "$sans" ] || echo "subjectAltName=$sans"
    } >"$pki/$name.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" \
        -CAcreateserial -sha256 -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
    rm -f "$pki/$name.csr" "$pki/$name.ext"
}
ca ca kubernetes-ca
ca front-proxy-ca front-proxy-ca
cert apiserver ca /CN=kube-apiserver serverAuth \
    "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1"
cert admin ca "/O=system:masters/CN=kubernetes-admin" clientAuth
cert controller-manager ca /CN=system:kube-controller-manager clientAuth
cert scheduler ca /CN=system:kube-scheduler clientAuth
cert front-proxy-client front-proxy-ca /CN=front-proxy-client clientAuth
[ -s "$pki/sa.key" ] || {
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key"
    openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}
umask 022

# --- etcd --------------------------------------------------------------------------

etcd_port=$(free_port)
etcd_peer=$(free_port)
start etcd "$bin/etcd" --name default --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "default=http://127.0.0.1:$etcd_peer" \
    --listen-metrics-urls "" --log-level warn
wait_for etcd 60 curl -fs "http://127.0.0.1:$etcd_port/health"

# --- kube-apiserver ----------------------------------------------------------------

api_port=$(free_port)
server=https://127.0.0.1:$api_port
# The audit log records every request of the exporters' and the adapter's
# ServiceAccounts and the HPA controller's (metadata only): the cluster test holds the
# calls they really make to deploy/'s RBAC and to the calls read from the source.
cat >"$dir/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users:
      - system:serviceaccount:gpu-exporter:gpu-exporter
      - system:serviceaccount:gpu-monitoring:gpu-metrics-adapter
      - system:serviceaccount:kube-system:horizontal-pod-autoscaler
  - level: None
EOF
start kube-apiserver "$bin/kube-apiserver" \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.jsonl" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$dir/apiserver" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --endpoint-reconciler-type none \
    --requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --requestheader-uid-headers X-Remote-Uid \
    --proxy-client-cert-file "$pki/front-proxy-client.crt" \
    --proxy-client-key-file "$pki/front-proxy-client.key" \
    --allow-privileged=true --profiling=false \
    --enable-aggregator-routing="$([ "$adapter_replicas" = 1 ] && echo false || echo true)"

# kubeconfig NAME USER: a kubeconfig for a client certificate.
kubeconfig() {
    local file=$dir/$1 user=$2
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: gpu-sim
    cluster:
      server: $server
      certificate-authority: $pki/ca.crt
users:
  - name: $user
    user:
      client-certificate: $pki/$user.crt
      client-key: $pki/$user.key
contexts:
  - name: gpu-sim
    context: {cluster: gpu-sim, user: $user}
current-context: gpu-sim
EOF
}
kubeconfig kubeconfig admin
kubeconfig controller-manager.kubeconfig controller-manager
kubeconfig scheduler.kubeconfig scheduler
wait_for kube-apiserver 120 kubectl get --raw /readyz
if [ "$control_plane" = apiserver ]; then
    cat >"$dir/env" <<EOF
KUBECONFIG=$dir/kubeconfig
KUBE_BIN_DIR=$bin
API_SERVER=$server
PKI_DIR=$pki
EOF
    log "up (API server only): export KUBECONFIG=$dir/kubeconfig"
    exit 0
fi

# --- controller-manager, scheduler, kwok -------------------------------------------

start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --horizontal-pod-autoscaler-sync-period 2s
start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" \
    --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false
kwok_port=$(free_port)
# kwok's own "fast" stages (nodes Ready at once, leases renewed; pods Running and Ready
# once bound, completed and deleted as a kubelet would), from its pinned module (copied
# beside the binaries by build.sh).
stages=$bin/share/kwok/kustomize/stage
[ -d "$stages" ] || fail "kwok's stages not found in $stages (tests/kube/build.sh kwok)"
pod_ready=("$stages/pod/fast/pod-ready.yaml")
if [ "$adapter_replicas" != 1 ]; then
    # The adapter's pods are Running with an IP but not Ready until their process
    # answers /readyz (adapter_pod plays the readiness probe); every other pod as before.
    pod_ready=("$dir/kwok/pod-ready.yaml" "$dir/kwok/adapter-pod-started.yaml")
    mkdir -p "$dir/kwok"
    python3 - "$stages/pod/fast/pod-ready.yaml" "$dir/kwok" <<'PY'
import sys
src, out = sys.argv[1], sys.argv[2]
stage = open(src).read()
select = "    matchExpressions:\n"
assert select in stage and "  name: pod-ready\n" in stage
def only(op):
    return select + ("    - key: '.metadata.labels.\"app.kubernetes.io/name\"'\n"
                     f"      operator: '{op}'\n      values:\n      - 'gpu-metrics-adapter'\n")
open(f"{out}/pod-ready.yaml", "w").write(stage.replace(select, only("NotIn")))
started = stage.replace(select, only("In")).replace("  name: pod-ready\n", "  name: adapter-pod-started\n")
for kind in ("Ready", "ContainersReady"):
    ready = f'        status: "True"\n        type: {kind}\n'
    assert ready in started, kind
    started = started.replace(ready, ready.replace('"True"', '"False"'))
started = started.replace("        ready: true\n        restartCount: 0\n        state:\n          running:",
                          "        ready: false\n        restartCount: 0\n        state:\n          running:", 1)
open(f"{out}/adapter-pod-started.yaml", "w").write(started)
PY
fi
start kwok "$bin/kwok" --kubeconfig "$dir/kubeconfig" \
    --config "$stages/node/fast/node-initialize.yaml" \
    --config "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
    "${pod_ready[@]/#/--config=}" \
    --config "$stages/pod/fast/pod-complete.yaml" \
    --config "$stages/pod/fast/pod-delete.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --server-address "127.0.0.1:$kwok_port" \
    --node-ip 127.0.0.1 --node-lease-duration-seconds 40 \
    --cidr "$([ "$adapter_replicas" = 1 ] && echo 10.0.0.1/24 || echo 10.254.0.1/24)"
wait_for "the default ServiceAccount" 60 kubectl -n default get serviceaccount default

# --- GPU nodes ---------------------------------------------------------------------

nodes=${GPU_NODES:-2}
for i in $(seq 0 $((nodes - 1))); do
    cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: gpu-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    nvidia.com/gpu.present: "true"
    type: kwok
status:
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
  nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: fake}
---
EOF
done | kubectl apply -f - >/dev/null
wait_for "kwok's nodes" 60 kubectl wait --for=condition=Ready node --all --timeout=1s

# --- deploy/: the adapter's and exporter's identities, RBAC and APIServices ----------
# (Pod Security admission, on by default, enforces what deploy/'s namespaces say.)

adapter_port=$(free_port)
adapter_grpc=$(free_port)
overlay=$dir/deploy
mkdir -p "$overlay/static-certs/certs"
# deploy/overlays/static-certs, as a user would use it: its certificates made by its own
# script, its kustomization copied beside them (the certs/ it names are per cluster).
# With KEDA, the serving certificate is also valid for localhost, the scalerAddress KEDA's
# operator (a local process, without cluster DNS) dials.
sans=
[ "$with_keda" = 0 ] || sans=DNS:localhost
EXTRA_SANS=$sans bash "$root/deploy/overlays/static-certs/generate-certs.sh" "$overlay/static-certs/certs" >/dev/null
# (kustomize takes relative paths only.)
deploy_rel=$(realpath --relative-to "$overlay/static-certs" "$root/deploy")
# Beside KEDA, the overlay without its external-metrics component, as its comment says.
without_external=
[ "$with_keda" = 0 ] || without_external='/components\/external-metrics/d'
sed -e "s|\.\./\.\./|$deploy_rel/|g" -e "$without_external" \
    "$root/deploy/overlays/static-certs/kustomization.yaml" >"$overlay/static-certs/kustomization.yaml"
# What differs from a cluster with real nodes: the adapter and the exporters run as
# processes on this machine, so the adapter's Service is an ExternalName to localhost on
# the adapter's port (which the APIServices name). Both install paths get that patch.
if [ "$adapter_replicas" != 1 ]; then
    # Replicas: the Service as deploy/ has it (its selector finds the pods kwok plays),
    # the pods' ports free ones on this machine.
    plumbing=$(cat <<EOF
  - target: {kind: Deployment, name: gpu-metrics-adapter}
    patch: |
      - op: replace
        path: /spec/template/spec/containers/0/ports
        value:
          - {name: https, containerPort: $adapter_port, protocol: TCP}
          - {name: grpc, containerPort: $adapter_grpc, protocol: TCP}
      - {op: replace, path: /spec/replicas, value: $adapter_replicas}
EOF
)
else
plumbing=$(cat <<EOF
  - target: {kind: Service, name: gpu-metrics-adapter}
    patch: |
      - {op: replace, path: /spec/type, value: ExternalName}
      - {op: add, path: /spec/externalName, value: localhost}
      - {op: remove, path: /spec/selector}
      - op: replace
        path: /spec/ports
        value:
          - {name: https, port: $adapter_port, targetPort: $adapter_port, protocol: TCP}
          - {name: grpc, port: $adapter_grpc, targetPort: $adapter_grpc, protocol: TCP}
  - target: {group: apiregistration.k8s.io, kind: APIService}
    patch: |
      - op: replace
        path: /spec/service/port
        value: $adapter_port
EOF
)
fi
certs=$overlay/static-certs/certs
case "$deploy_with" in
kustomize)
    # deploy/overlays/static-certs, with the plumbing; besides, the Deployment has no
    # replicas (unless they are what runs the adapter) and the DaemonSet is not created
    # (kwok would play pods for them that do nothing), and there is no Prometheus
    # Operator for the ServiceMonitors.
    no_replicas=
    [ "$adapter_replicas" != 1 ] || no_replicas=$(cat <<EOF
  - target: {kind: Deployment, name: gpu-metrics-adapter}
    patch: |
      - op: replace
        path: /spec/replicas
        value: 0
EOF
)
    cat >"$overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - static-certs
patches:
$plumbing
$no_replicas
  - target: {kind: DaemonSet, name: gpu-exporter}
    patch: |
      \$patch: delete
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: gpu-exporter, namespace: gpu-exporter}
  - target: {kind: ServiceMonitor}
    patch: |
      \$patch: delete
      apiVersion: monitoring.coreos.com/v1
      kind: ServiceMonitor
      metadata: {name: gpu-exporter, namespace: gpu-exporter}
EOF
    kubectl kustomize "$overlay" >"$overlay/rendered.yaml"
    kubectl apply --server-side --field-manager cluster.sh -f "$overlay/rendered.yaml" >/dev/null
    ;;
helm)
    # deploy/helm's charts as a user installs them, with the static-certs certificate;
    # the plumbing goes in as a Helm post-renderer plugin (kustomize over Helm's output).
    # The DaemonSet and Deployment stay: kwok plays their pods. No ServiceMonitors (no
    # Prometheus Operator CRDs here).
    plugin=$helm_home/data/plugins/cluster-plumbing
    mkdir -p "$plugin"
    cat >"$plugin/plugin.yaml" <<EOF
name: cluster-plumbing
version: 0.1.0
type: postrenderer/v1
apiVersion: v1
runtime: subprocess
runtimeConfig:
  platformCommand:
    - command: \${HELM_PLUGIN_DIR}/render.sh
EOF
    {
        echo "patches:"
        echo "$plumbing"
    } >"$plugin/patches.yaml"
    cat >"$plugin/render.sh" <<EOF
#!/usr/bin/env bash
# Helm's rendered manifests on stdin, the same manifests with the plumbing on stdout.
set -euo pipefail
work=\$(mktemp -d)
trap 'rm -rf "\$work"' EXIT
cat >"\$work/rendered.yaml"
{ echo "resources: [rendered.yaml]"; cat "$plugin/patches.yaml"; } >"\$work/kustomization.yaml"
"$bin/kubectl" kustomize "\$work"
EOF
    chmod +x "$plugin/render.sh"
    # The namespaces as deploy/README.md has a Helm user make them: the exporter's
    # privileged (hostPath), the adapter's restricted, so Pod Security admission checks
    # the adapter's pods (kwok plays them) against "restricted".
    kubectl create namespace gpu-exporter >/dev/null
    kubectl label namespace gpu-exporter pod-security.kubernetes.io/enforce=privileged >/dev/null
    kubectl create namespace gpu-monitoring >/dev/null
    kubectl label namespace gpu-monitoring pod-security.kubernetes.io/enforce=restricted >/dev/null
    helm install gpu-exporter "$root/deploy/helm/gpu-exporter" -n gpu-exporter \
        --set serviceMonitor.enabled=false --wait --timeout 120s \
        >>"$dir/logs/helm.log" 2>&1 ||
        fail "helm install gpu-exporter failed"
    helm install gpu-metrics-adapter "$root/deploy/helm/gpu-metrics-adapter" -n gpu-monitoring \
        --set serviceMonitor.enabled=false --set tls.source=static \
        --set-file tls.static.cert="$certs/tls.crt" --set-file tls.static.key="$certs/tls.key" \
        --set-file tls.static.ca="$certs/ca.crt" --post-renderer cluster-plumbing \
        --set externalMetrics.enabled="$([ "$with_keda" = 1 ] && echo false || echo true)" \
        --wait --timeout 120s >>"$dir/logs/helm.log" 2>&1 || fail "helm install gpu-metrics-adapter failed"
    ;;
esac

# sa_kubeconfig FILE NAMESPACE NAME: a kubeconfig with a token of that ServiceAccount.
sa_kubeconfig() {
    local token
    token=$(kubectl -n "$2" create token "$3" --duration 24h)
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: gpu-sim
    cluster:
      server: $server
      certificate-authority: $pki/ca.crt
users:
  - name: $3
    user:
      token: $token
contexts:
  - name: gpu-sim
    context: {cluster: gpu-sim, user: $3}
current-context: gpu-sim
EOF
}
sa_kubeconfig "$dir/exporter.kubeconfig" gpu-exporter gpu-exporter
sa_kubeconfig "$dir/adapter.kubeconfig" gpu-monitoring gpu-metrics-adapter

# --- per node: fake kubelet and exporter -------------------------------------------

dial=$dir/dial
[ -e "$dial" ] || echo "*=50" >"$dial"
scenario=${GPU_SCENARIO:-builtin:default}
exporter_urls=()
for i in $(seq 0 $((nodes - 1))); do
    node=gpu-node-$i
    socket=$dir/nodes/$node/pod-resources/kubelet.sock
    start "fake-kubelet-$node" "$rust/fake-kubelet" --kubeconfig "$dir/kubeconfig" \
        --node-name "$node" --socket "$socket" --scenario "$scenario"
    port=$(free_port)
    # The DaemonSet's arguments (deploy/base/exporter/daemonset.yaml), with this node's
    # socket, address and identity, and a 1 s sampling interval for the autoscaling tests;
    # plus the opt-in ResourceSlice watch, so the audit log covers every call RBAC grants.
    start "gpu-exporter-$node" env NODE_NAME="$node" GPU_SIM_SCENARIO="$scenario" \
        GPU_SIM_DIAL="$dial" \
        "$rust/gpu-exporter" --nvml-lib "$rust/libnvidia_ml.so" \
        --address "127.0.0.1:$port" --collect-interval 1000 \
        --kubernetes --pod-resources-kubelet-socket "$socket" \
        --kubernetes-pod-labels app,app.kubernetes.io/name,app.kubernetes.io/instance \
        --kubernetes-enable-dra \
        --kubeconfig "$dir/exporter.kubeconfig" \
        --collectors "$root/deploy/base/exporter/counters.csv" --log-format json
    exporter_urls+=("http://127.0.0.1:$port/metrics")
done
for url in "${exporter_urls[@]}"; do
    wait_for "exporter $url" 60 curl -fs "$url"
done

# --- the adapter -------------------------------------------------------------------

adapter_args=()
for url in "${exporter_urls[@]}"; do adapter_args+=(--exporter-url "$url"); done
# Extra adapter flags, whitespace-separated (e.g. --composite-metrics-file PATH).
if [ -n "${ADAPTER_ARGS:-}" ]; then
    read -r -a extra_adapter_args <<<"$ADAPTER_ARGS"
    adapter_args+=("${extra_adapter_args[@]}")
fi
# DIR/run-adapter.sh ADDRESS NAME: one adapter process on ADDRESS, pid in pids/NAME.
{
    echo 'set -eu'
    printf 'setsid %q --bind-address "$1" ' "$rust/gpu-metrics-adapter"
    printf '%q ' --secure-port "$adapter_port" --grpc-port "$adapter_grpc" \
        --tls-cert-file "$certs/tls.crt" --tls-private-key-file "$certs/tls.key" \
        --grpc-client-ca-file "$certs/ca.crt" \
        --kubeconfig "$dir/adapter.kubeconfig" "${adapter_args[@]}"
    printf '>%q/logs/"$2".log 2>&1 </dev/null &\n' "$dir"
    printf 'echo $! >%q/pids/"$2"\n' "$dir"
} >"$dir/run-adapter.sh"
if [ "$adapter_replicas" = 1 ]; then
    bash "$dir/run-adapter.sh" 127.0.0.1 gpu-metrics-adapter
else
    pods_have_ips() {
        local n
        n=$(kubectl -n gpu-monitoring get pods -l app.kubernetes.io/name=gpu-metrics-adapter \
            -o jsonpath='{range .items[*]}{.status.podIP}{"\n"}{end}' | grep -c .)
        [ "$n" -ge "$adapter_replicas" ]
    }
    wait_for "the adapter's $adapter_replicas pods" 120 pods_have_ips
    for pod in $(kubectl -n gpu-monitoring get pods -l app.kubernetes.io/name=gpu-metrics-adapter \
        -o jsonpath='{.items[*].metadata.name}'); do
        adapter_pod "$pod"
    done
fi

# --- KEDA (WITH_KEDA=1) -------------------------------------------------------------

if [ "$with_keda" = 1 ]; then
    keda_src=$bin/share/keda
    [ -d "$keda_src/config/minimal" ] || fail "KEDA's config/ not found in $keda_src (tests/kube/build.sh keda)"
    umask 077
    ca keda-ca keda-ca
    # One certificate for both KEDA processes, as KEDA's own rotation makes it: the
    # metrics API server serves it to the aggregator, and the operator's gRPC metrics
    # service and the metrics server present it to each other (mutual TLS, KEDA's CA).
    cert keda keda-ca /CN=keda serverAuth,clientAuth \
        "DNS:keda-operator.keda.svc,DNS:keda-operator.keda.svc.cluster.local,DNS:keda-metrics-apiserver.keda.svc,DNS:keda-metrics-apiserver.keda.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
    keda_certs=$dir/keda/certs
    mkdir -p "$keda_certs"
    cp "$pki/keda-ca.crt" "$keda_certs/ca.crt"
    cp "$pki/keda.crt" "$keda_certs/tls.crt"
    cp "$pki/keda.key" "$keda_certs/tls.key"
    umask 022
    keda_port=$(free_port)
    keda_grpc=$(free_port)
    keda_rel=$(realpath --relative-to "$dir/keda" "$keda_src/config/minimal")
    cat >"$dir/keda/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $keda_rel
patches:
  - target: {kind: Deployment, name: keda-operator}
    patch: |
      \$patch: delete
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: keda-operator, namespace: keda}
  - target: {kind: Deployment, name: keda-metrics-apiserver}
    patch: |
      \$patch: delete
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: keda-metrics-apiserver, namespace: keda}
  - target: {kind: Service, name: keda-metrics-apiserver}
    patch: |
      - {op: replace, path: /spec/type, value: ExternalName}
      - {op: add, path: /spec/externalName, value: localhost}
      - {op: remove, path: /spec/selector}
      - op: replace
        path: /spec/ports
        value: [{name: https, port: $keda_port, targetPort: $keda_port, protocol: TCP}]
  - target: {kind: Service, name: keda-operator}
    patch: |
      - {op: replace, path: /spec/type, value: ExternalName}
      - {op: add, path: /spec/externalName, value: localhost}
      - {op: remove, path: /spec/selector}
      - op: replace
        path: /spec/ports
        value: [{name: metricsservice, port: $keda_grpc, targetPort: $keda_grpc, protocol: TCP}]
  - target: {group: apiregistration.k8s.io, kind: APIService, name: v1beta1.external.metrics.k8s.io}
    patch: |
      - {op: add, path: /spec/service/port, value: $keda_port}
      - {op: add, path: /spec/caBundle, value: $(base64 -w0 "$keda_certs/ca.crt")}
EOF
    kubectl kustomize "$dir/keda" >"$dir/keda/rendered.yaml"
    kubectl apply --server-side --field-manager cluster.sh -f "$dir/keda/rendered.yaml" \
        >/dev/null 2>"$dir/logs/keda-apply.log" || fail "applying KEDA's config failed"
    wait_for "KEDA's CRDs" 60 kubectl wait --for=condition=Established --timeout=1s \
        crd/scaledobjects.keda.sh crd/triggerauthentications.keda.sh
    sa_kubeconfig "$dir/keda.kubeconfig" keda keda-operator
    # KEDA's Deployments' environment (config/manager, config/metrics-server).
    keda_env=(env KUBECONFIG="$dir/keda.kubeconfig" POD_NAMESPACE=keda WATCH_NAMESPACE=
        KEDA_CLUSTER_OBJECT_NAMESPACE=keda)
    start keda-operator "${keda_env[@]}" "$bin/keda" --leader-elect=false \
        --zap-log-level=info --zap-encoder=console --enable-cert-rotation=false \
        --cert-dir "$keda_certs" --ca-dir "$keda_certs" \
        --metrics-bind-address "127.0.0.1:$(free_port)" \
        --health-probe-bind-address "127.0.0.1:$(free_port)" \
        --metrics-service-bind-address "127.0.0.1:$keda_grpc"
    # (Its --port, the Prometheus endpoint, binds every interface: KEDA has no address
    # flag for it.)
    start keda-adapter "${keda_env[@]}" "$bin/keda-adapter" \
        --bind-address 127.0.0.1 --secure-port "$keda_port" --zap-log-level=info \
        --client-ca-file "$keda_certs/ca.crt" --tls-cert-file "$keda_certs/tls.crt" \
        --tls-private-key-file "$keda_certs/tls.key" --cert-dir "$keda_certs" \
        --lister-kubeconfig "$dir/keda.kubeconfig" \
        --authentication-kubeconfig "$dir/keda.kubeconfig" \
        --authorization-kubeconfig "$dir/keda.kubeconfig" \
        --metrics-service-address "127.0.0.1:$keda_grpc" --port "$(free_port)"
    # KEDA's client certificate for the adapter's gRPC port, as
    # deploy/examples/keda-external has a static-certs user make it.
    kubectl create namespace inference --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    kubectl -n inference create secret generic gpu-metrics-adapter-keda-client \
        --from-file=ca.crt="$certs/ca.crt" --from-file=tls.crt="$certs/keda-client.crt" \
        --from-file=tls.key="$certs/keda-client.key" >/dev/null
    # KEDA's client certificate for the adapter's metrics-api face, as
    # deploy/examples/keda-metrics-api has a user get it: a CertificateSigningRequest for
    # signer kubernetes.io/kube-apiserver-client (the controller-manager signs with the
    # cluster's CA, the kube-apiserver's --client-ca-file, which the adapter trusts from
    # kube-system/extension-apiserver-authentication), approved; CN = the user its
    # ClusterRoleBinding names.
    if [ ! -s "$pki/keda-metrics-api.crt" ]; then
        (umask 077 && openssl ecparam -name prime256v1 -genkey -noout -out "$pki/keda-metrics-api.key")
        openssl req -new -key "$pki/keda-metrics-api.key" -subj /CN=keda-metrics-api \
            -out "$pki/keda-metrics-api.csr"
        kubectl apply -f - >/dev/null <<EOF
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata: {name: keda-metrics-api}
spec:
  request: $(base64 -w0 "$pki/keda-metrics-api.csr")
  signerName: kubernetes.io/kube-apiserver-client
  usages: [digital signature, client auth]
EOF
        kubectl certificate approve keda-metrics-api >/dev/null
        issued() { [ -n "$(kubectl get csr keda-metrics-api -o jsonpath='{.status.certificate}')" ]; }
        wait_for "the signed keda-metrics-api certificate" 60 issued
        kubectl get csr keda-metrics-api -o jsonpath='{.status.certificate}' | base64 -d \
            >"$pki/keda-metrics-api.crt"
        rm -f "$pki/keda-metrics-api.csr"
    fi
    kubectl -n inference create secret generic gpu-metrics-adapter-metrics-api-client \
        --from-file=ca.crt="$certs/ca.crt" --from-file=tls.crt="$pki/keda-metrics-api.crt" \
        --from-file=tls.key="$pki/keda-metrics-api.key" >/dev/null
    # deploy/examples/keda-*, with the adapter's addresses this cluster has.
    for example in "$root"/deploy/examples/keda-*; do
        name=$(basename "$example")
        mkdir -p "$dir/examples/$name"
        kubectl kustomize "$example" |
            sed -e "s|gpu-metrics-adapter\.gpu-monitoring\.svc:9090|localhost:$adapter_grpc|" \
                -e "s|gpu-metrics-adapter\.gpu-monitoring\.svc:443/|localhost:$adapter_port/|" \
                >"$dir/examples/$name/rendered.yaml"
        echo "resources: [rendered.yaml]" >"$dir/examples/$name/kustomization.yaml"
    done
fi

wait_for "the APIServices" 120 kubectl wait --for=condition=Available --timeout=1s \
    apiservice v1beta2.custom.metrics.k8s.io v1beta1.custom.metrics.k8s.io \
    v1beta1.external.metrics.k8s.io
if [ "$with_keda" = 1 ]; then
    owner=$(kubectl get apiservice v1beta1.external.metrics.k8s.io \
        -o jsonpath='{.spec.service.namespace}/{.spec.service.name}')
    [ "$owner" = keda/keda-metrics-apiserver ] ||
        fail "v1beta1.external.metrics.k8s.io is served by $owner, not KEDA"
fi

# --- the example workload ----------------------------------------------------------

if [ "${DEPLOY_EXAMPLES:-1}" = 1 ]; then
    kubectl apply --server-side --field-manager cluster.sh -k "$root/deploy/examples/hpa" >/dev/null
    # `up` returns a cluster whose example is running: its pods bound by the scheduler
    # and Running under kwok (on a busy machine that takes seconds after the apply).
    wait_for "the example Deployment" 120 kubectl -n inference wait --for=condition=Available \
        --timeout=1s deployment/resnet-inference
fi

cat >"$dir/env" <<EOF
KUBECONFIG=$dir/kubeconfig
KUBE_BIN_DIR=$bin
API_SERVER=$server
ADAPTER_PORT=$adapter_port
ADAPTER_GRPC_PORT=$adapter_grpc
ADAPTER_CA=$certs/ca.crt
ADAPTER_REPLICAS=$adapter_replicas
EXPORTER_URLS="${exporter_urls[*]}"
DIAL=$dial
DEPLOY_WITH=$deploy_with
WITH_KEDA=$with_keda
HELM_CACHE_HOME=$helm_home/cache
HELM_CONFIG_HOME=$helm_home/config
HELM_DATA_HOME=$helm_home/data
EOF
log "up: export KUBECONFIG=$dir/kubeconfig (kubectl: $bin/kubectl); GPU load: echo '*=90' > $dial"
