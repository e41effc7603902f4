#!/usr/bin/env bash
# End-to-end freshness on a cluster from cluster.sh: seconds from a change of the GPUs'
# utilisation (the dial) to the real HPA controller changing desiredReplicas, through
# the fake driver, the exporters' sampling, the adapter's scrape, the aggregator and
# the HPA's sync. Alternates 70 % → 100 % (scale up) and 70 % → 35 % (scale down) on
# the example HPA, with its scale-down window set to 0.
#
#   bash tests/kube/freshness.sh DIR [TRIALS]     (default 10; prints one line a trial
#                                                  and p50/p90/max)
set -euo pipefail
dir=$(cd "${1:?usage: freshness.sh DIR [TRIALS]}" && pwd)
trials=${2:-10}
# shellcheck disable=SC1091
source "$dir/env"
kubectl() { "$KUBE_BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
hpa=(-n inference hpa resnet-inference)
kubectl patch "${hpa[@]}" --type merge \
    -p '{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":0}}}}' >/dev/null
dial() { echo "*=$1" >"$DIAL.tmp" && mv "$DIAL.tmp" "$DIAL"; }
now() { date +%s.%N; }
# status: "current desired average"
status() {
    kubectl get "${hpa[@]}" -o \
        jsonpath='{.status.currentReplicas} {.status.desiredReplicas} {.status.currentMetrics[0].pods.current.averageValue}'
}
settle() {
    dial 70
    local deadline=$((SECONDS + 120)) s
    while :; do
        s=$(status)
        read -r current desired average <<<"$s"
        ready=$(kubectl get -n inference deployment resnet-inference -o jsonpath='{.status.readyReplicas}')
        [ "$current" = "$desired" ] && [ "$average" = 70 ] && [ "$ready" = "$current" ] && return 0
        [ $SECONDS -lt $deadline ] || { echo "not steady at 70 %: $s" >&2; exit 1; }
        sleep 0.2
    done
}
results=()
for i in $(seq "$trials"); do
    settle
    read -r before _ _ <<<"$(status)"
    if [ $((i % 2)) -eq 1 ]; then to=100; else to=35; fi
    started=$(now)
    dial "$to"
    deadline=$((SECONDS + 60))
    while :; do
        read -r _ desired _ <<<"$(status)"
        [ "$desired" != "$before" ] && break
        [ $SECONDS -lt $deadline ] || { echo "no decision within 60 s" >&2; exit 1; }
        sleep 0.05
    done
    took=$(echo "$(now) - $started" | bc)
    results+=("$took")
    printf 'trial %2d: 70 -> %3d %%: %d -> %d replicas after %.2f s\n' "$i" "$to" "$before" "$desired" "$took"
done
printf '%s\n' "${results[@]}" | sort -n | awk '{ v[NR] = $1 } END {
    p50 = v[int((NR + 1) / 2)]; p90 = v[int(NR * 0.9 + 0.999)]
    printf "trials %d: p50 %.2f s, p90 %.2f s, max %.2f s\n", NR, p50, p90, v[NR] }'
dial 70
