#!/usr/bin/env bash
# The fleet-scale bench (opt-in, not in CI): gpu-metrics-adapter and prometheus-adapter
# side by side on one engine (two Prometheus 3 shards, Thanos sidecars and query), one
# synthetic fleet and one set of metric rules:
#
#   bash tests/scale/bench.sh [DIR]     (GPUS=100000 by default; GPUS=10000 for a
#                                        quicker run)
#
# It brings the engine and both adapters up with tests/scale/engine.sh (WITH_ADAPTERS=1),
# runs tests/scale/bench.py (RSS, CPU, metric-API latency for 1 and 1,000 HPAs with wrk,
# queries and bytes at Thanos query, freshness, our round time; BENCH_SECONDS per window,
# default 30), writes DIR/bench.json and takes everything down (KEEP=1 leaves it up).
# Needs: the binaries engine.sh names (release builds recommended:
# RUST_BIN_DIR=target/release after `cargo build --release -p gpu-metrics-adapter
# -p e2e-tests --bin fleet-sim`), wrk, vegeta (tests/kube/build.sh), python3.
#
# Settings (environment): GPUS (100000), SCRAPE_INTERVAL (15s), ADAPTER_INTERVAL (5s),
# RELIST_INTERVAL (30s, prometheus-adapter's), BENCH_SECONDS (30), ENGINE_NICE (0; see
# engine.sh), RECORDED (0; 1: both adapters read the per-pod series of
# gpu-metrics-adapter's recording rules, evaluated in the shards, see engine.sh),
# MAX_STALENESS (3 scrapes), QUERY_TIMEOUT (30s) and OUR_ADAPTER_ARGS (default: the
# bounds a fleet this size needs, below).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=${1:-$root/target/scale-bench}
gpus=${GPUS:-100000}
command -v wrk >/dev/null || { echo "bench.sh: wrk is needed" >&2; exit 1; }
[ -x "${KUBE_BIN_DIR:-$root/target/kube/bin}/vegeta" ] ||
    { echo "bench.sh: vegeta is needed (bash tests/kube/build.sh vegeta)" >&2; exit 1; }
# Our adapter's bounds, sized for the fleet: pods (5,173 per 10,000 GPUs), samples of
# a round (six queries, one sample per pod each), answers (one sample per pod, about
# 200 bytes), the query timeout on a busy engine, and staleness above the scrape
# interval (three scrapes). And connections: wrk's 1,000 come from one loopback address,
# past the default 64 per address (in a cluster they come through the aggregator).
pods_bound=$((gpus * 6 / 10 + 1000))
# At 100,000 GPUs on 2 cores a round takes 30-50 s of engine time: values then need
# MAX_STALENESS=90s and QUERY_TIMEOUT=60s to outlive a round.
scrape=${SCRAPE_INTERVAL:-15s}
staleness=${MAX_STALENESS:-$((${scrape%s} * 3))s}
export OUR_ADAPTER_ARGS=${OUR_ADAPTER_ARGS:---max-pods $pods_bound --prometheus-max-series $((pods_bound * 6)) --max-response-size 64Mi --max-in-flight-size 128Mi --scrape-timeout ${QUERY_TIMEOUT:-30s} --max-staleness $staleness --max-connections 1100 --max-connections-per-address 1100}
rm -rf "$dir"
cleanup() { [ "${KEEP:-0}" = 1 ] || bash "$here/engine.sh" down "$dir"; }
trap cleanup EXIT
GPUS=$gpus SCRAPE_INTERVAL=$scrape ADAPTER_INTERVAL=${ADAPTER_INTERVAL:-5s} \
    RELIST_INTERVAL=${RELIST_INTERVAL:-30s} WITH_ADAPTERS=1 bash "$here/engine.sh" up "$dir"
# Let both settle: a few of our rounds and one relist of prometheus-adapter.
python3 - "$dir" <<'EOF'
import re, ssl, sys, time, urllib.request
d = sys.argv[1]
env = dict(l.rstrip("\n").split("=", 1) for l in open(f"{d}/env") if "=" in l)
ctx = ssl.create_default_context(cafile=env["ADAPTER_CA"])
token = open(env["READER_TOKEN_FILE"]).read().strip()
deadline = time.time() + 600
while time.time() < deadline:
    req = urllib.request.Request(env["OURS_URL"] + "/metrics", headers={"Authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(req, context=ctx, timeout=30).read().decode()
    m = re.search(r'^gpu_metrics_adapter_source_scrapes_total\{result="success"\} (\S+)$', text, re.M)
    if m and float(m.group(1)) >= 3:
        break
    time.sleep(1)
EOF
python3 "$here/bench.py" "$dir" "${BENCH_SECONDS:-30}"
