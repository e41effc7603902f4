#!/usr/bin/env bash
# Scrape latency with and without pod attribution, same node, same session.
#
#   exporter/benches/attribution-scrape.sh
#
# Starts the release exporter twice on the big node (8 GPUs, 4 in MIG mode with 7
# instances each, 200 processes), 1 s sampling:
#   baseline:    --simulate=builtin:big-node                       (no attribution)
#   attributed:  --simulate=exporter/benches/scenarios/big-node-pods.toml
#                (the same GPUs with 120 pods; the demo's simulated Kubernetes node
#                serves them through the real PodResources gRPC, pod watch and cgroup
#                paths, so every series is attributed and 92 pod shares are split)
# and for each: wrk -t2 -c50 -d${WRK_DURATION_S}s with gzip against /metrics (client
# side), the exporter's own scrape histogram (server side), the body size, and the
# sampler's attribution time per cycle. Talks to 127.0.0.1 only. Requires cargo, wrk,
# curl, awk.
set -euo pipefail

WRK_DURATION_S=${WRK_DURATION_S:-15}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/release/gpu-exporter
cd "$root"
cargo build --release --locked -q -p gpu-exporter

value() { awk -v m="$1" '$1 == m { print $2 }'; }

run() {
    local label=$1 scenario=$2 log port pid body
    log=$(mktemp)
    "$bin" --simulate="$scenario" -a 127.0.0.1:0 -c 1000 >"$log" 2>&1 &
    pid=$!
    trap 'kill $pid 2>/dev/null || true' RETURN
    for _ in $(seq 100); do
        port=$(sed -n 's/.*listening address=127.0.0.1:\([0-9]*\).*/\1/p' "$log")
        [[ -n $port ]] && break
        sleep 0.1
    done
    [[ -n ${port:-} ]] || { cat "$log" >&2; exit 1; }
    # Settle: the pod watch syncs and the cgroup cache fills in the first cycles.
    sleep 4
    body=$(curl -s "http://127.0.0.1:$port/metrics")
    local series pods bytes gz attribution sample
    series=$(grep -vc '^#' <<<"$body")
    pods=$(grep -v '^#' <<<"$body" | grep -c 'pod="' || true)
    bytes=$(wc -c <<<"$body")
    gz=$(curl -s -H 'Accept-Encoding: gzip' "http://127.0.0.1:$port/metrics" | wc -c)
    attribution=$(value gpu_exporter_attribution_duration_seconds <<<"$body")
    sample=$(value gpu_exporter_sample_duration_seconds <<<"$body")
    local wrk_out
    wrk_out=$(wrk -t2 -c50 -d"${WRK_DURATION_S}s" --latency -H 'Accept-Encoding: gzip' \
        "http://127.0.0.1:$port/metrics")
    local p50 p99 rps
    p50=$(awk '$1 == "50%" { print $2 }' <<<"$wrk_out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$wrk_out")
    rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$wrk_out")
    # Server side: the smallest bucket holding 99 % of the scrapes.
    local hist server_p99
    hist=$(curl -s "http://127.0.0.1:$port/metrics" | grep '^gpu_exporter_scrape_duration_seconds_bucket')
    server_p99=$(awk -F'[{}" ]+' '
        { le[NR] = $3; n[NR] = $NF } END {
            total = n[NR]
            for (i = 1; i <= NR; i++) if (n[i] >= 0.99 * total) { print "<= " le[i] " s"; exit }
        }' <<<"$hist")
    printf '| %s | %s | %s | %s B (%s B gzip) | %s | %s | %s | %s | %s |\n' \
        "$label" "$series" "$pods" "$bytes" "$gz" "${attribution:-n/a}" "$sample" \
        "$p50 / $p99" "$rps" "$server_p99"
}

echo "machine: $(nproc) cores, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
echo
echo '| run | series | pod-labelled series | body | attribution s/cycle | sample s/cycle | wrk p50 / p99 | scrapes/s | server p99 |'
echo '|---|---|---|---|---|---|---|---|---|'
run baseline builtin:big-node
run attributed exporter/benches/scenarios/big-node-pods.toml
