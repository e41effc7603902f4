#!/usr/bin/env bash
# Scrape-load and resource benchmark for gpu-exporter on simulated GPUs.
#
#   exporter/benches/scrape-load.sh
#
# 1. Builds the release binary and starts it on builtin:big-node (8 GPUs, 4 in MIG mode
#    with 7 instances each, 200 processes) with --process-metrics, 1 s sampling.
# 2. Scrape latency: wrk -t2 -c50 -d15s --latency against /metrics, then /healthz on the
#    same server as the in-session baseline (trivial handler, same HTTP stack).
# 3. Resources: a fresh exporter, 5 s settle, 60 s with no scrapes (RSS, CPU % of one
#    core), then 30 s scraped once per second; the same for builtin:default (8 GPUs, no
#    MIG) as the smaller baseline, so figures also read as big-node/default ratios.
# 4. Prints a Markdown table of metric, value, target, pass/fail, and the machine.
#
# Talks to 127.0.0.1 only. Requires: cargo, wrk, curl, awk. wrk and the exporter share
# the machine's cores: on a 2-core box wrk's own CPU use is part of what is measured, so
# the script reports it alongside.
#
# Durations can be shortened for a quick check (defaults are the benchmark's):
#   WRK_DURATION_S=15 SETTLE_S=5 IDLE_S=60 SCRAPE_S=30
set -euo pipefail

WRK_DURATION_S=${WRK_DURATION_S:-15}
SETTLE_S=${SETTLE_S:-5}
IDLE_S=${IDLE_S:-60}
SCRAPE_S=${SCRAPE_S:-30}
LISTEN_TIMEOUT_S=20

# Targets.
P99_TARGET_MS=1
RSS_TARGET_MIB=16
IDLE_CPU_TARGET_PCT=0.5

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$script_dir/../.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
bin=$target_dir/release/gpu-exporter

for tool in cargo wrk curl awk getconf; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool is required" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/scrape-load.XXXXXX")
pids=()

cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
    for pid in "${pids[@]}"; do
        # Bounded wait for a graceful exit, then KILL.
        local i
        for i in $(seq 1 20); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() {
    echo "error: $*" >&2
    exit 1
}

clk_tck=$(getconf CLK_TCK)

# --- helpers ---------------------------------------------------------------------------

# start_exporter NAME SCENARIO: starts the exporter, sets $exporter_pid and $exporter_addr.
start_exporter() {
    local name=$1 scenario=$2
    local log=$work/$name.log
    "$bin" --simulate="$scenario" --process-metrics -a 127.0.0.1:0 -c 1000 \
        >"$work/$name.stdout" 2>"$log" &
    exporter_pid=$!
    pids+=("$exporter_pid")
    exporter_addr=
    local i
    for i in $(seq 1 $((LISTEN_TIMEOUT_S * 10))); do
        exporter_addr=$(sed -n 's/.*listening address=\(127\.0\.0\.1:[0-9][0-9]*\).*/\1/p' "$log" | head -n 1)
        [[ -n $exporter_addr ]] && break
        if ! kill -0 "$exporter_pid" 2>/dev/null; then
            cat "$log" >&2
            die "exporter ($name, $scenario) exited before listening"
        fi
        sleep 0.1
    done
    if [[ -z $exporter_addr ]]; then
        cat "$log" >&2
        die "no 'listening address=' line in $log after ${LISTEN_TIMEOUT_S} s (iteration $i)"
    fi
    echo "started $name: pid $exporter_pid, scenario $scenario, $exporter_addr" >&2
}

stop_exporter() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    # Forget it, so that the exit trap never signals a recycled pid.
    local kept=() p
    for p in "${pids[@]}"; do
        [[ $p == "$pid" ]] || kept+=("$p")
    done
    pids=("${kept[@]}")
}

# cpu_ticks PID: utime + stime in clock ticks (fields 14 and 15 of /proc/PID/stat; the
# command name in field 2 may hold spaces, so count from after its closing parenthesis).
cpu_ticks() {
    local rest
    rest=$(sed 's/^.*) //' "/proc/$1/stat")
    awk '{ print $12 + $13 }' <<<"$rest"
}

# run_ns PID: nanoseconds on CPU summed over the process's threads (first field of
# /proc/PID/task/*/schedstat): a finer cross-check of the tick-based figure, whose
# resolution over 60 s is one tick = 1/CLK_TCK s (0.017 % of a core at 100 Hz).
run_ns() {
    cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'
}

ns_pct() {
    awk -v a="$1" -v b="$2" -v t0="$3" -v t1="$4" 'BEGIN { printf "%.4f", (b - a) / 1e9 / (t1 - t0) * 100 }'
}

# status_mib PID FIELD: VmRSS / VmHWM in MiB.
status_mib() {
    awk -v f="$2:" '$1 == f { printf "%.2f", $2 / 1024 }' "/proc/$1/status"
}

now_s() { date +%s.%N; }

# busy_ticks: machine-wide non-idle clock ticks (first line of /proc/stat), to tell how
# much CPU other processes (e.g. someone else's compile) took during a window.
busy_ticks() {
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

# cpu_pct TICKS0 TICKS1 T0 T1: % of one core over the wall window.
cpu_pct() {
    awk -v a="$1" -v b="$2" -v t0="$3" -v t1="$4" -v hz="$clk_tck" \
        'BEGIN { printf "%.3f", (b - a) / hz / (t1 - t0) * 100 }'
}

# to_ms VALUE-WITH-UNIT (wrk's us/ms/s/m/h) -> milliseconds.
to_ms() {
    awk -v v="$1" 'BEGIN {
        n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
        if (u == "us") n /= 1000; else if (u == "ms") n = n
        else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
        else if (u == "h") n *= 3600000; else { print "NaN"; exit }
        printf "%.3f", n
    }'
}

# wrk_pct FILE PCT -> latency at that percentile in ms, from the "Latency Distribution".
wrk_pct() {
    local raw
    raw=$(awk -v p="$2%" '/Latency Distribution/ { d = 1; next } d && $1 == p { print $2; exit }' "$1")
    [[ -n $raw ]] || die "no $2% line in wrk output $1"
    to_ms "$raw"
}

wrk_rps() {
    awk '/^Requests\/sec:/ { print $2; exit }' "$1"
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}

le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

pass_fail() {
    if le "$1" "$2"; then echo "pass"; else echo "**FAIL**"; fi
}

# children_cpu_s FILE: user+sys seconds of children from bash `times` output saved in FILE
# (line 2). `times` must write to a file: in a pipe or $(...) it runs in a fresh subshell
# whose children's times are zero.
children_cpu_s() {
    awk 'NR == 2 {
        s = 0
        for (i = 1; i <= 2; i++) { split($i, p, "m"); sub(/s$/, "", p[2]); s += p[1] * 60 + p[2] }
        printf "%.2f", s
    }' "$1"
}

# run_wrk NAME PATH [HEADER]: wrk against the current exporter; prints raw output, saves
# it, and records the exporter's and wrk's CPU over the run.
run_wrk() {
    local name=$1 path=$2 header=${3:-X-Bench: plain} out=$work/wrk-$1.txt
    local t0 t1 k0 k1 b0 b1 wrk_cpu
    k0=$(cpu_ticks "$exporter_pid")
    b0=$(busy_ticks)
    t0=$(now_s)
    # wrk runs in a subshell so that `times` there reports wrk's CPU alone.
    (
        wrk -t2 -c50 -d"${WRK_DURATION_S}s" --timeout 5s --latency -H "$header" "http://$exporter_addr$path" >"$out"
        times >"$out.times"
    )
    wrk_cpu=$(children_cpu_s "$out.times")
    t1=$(now_s)
    k1=$(cpu_ticks "$exporter_pid")
    b1=$(busy_ticks)
    echo
    echo "### raw wrk output: $path"
    echo '```'
    cat "$out"
    echo '```'
    declare -g "wrk_${name}_p50=$(wrk_pct "$out" 50)"
    declare -g "wrk_${name}_p90=$(wrk_pct "$out" 90)"
    declare -g "wrk_${name}_p99=$(wrk_pct "$out" 99)"
    declare -g "wrk_${name}_rps=$(wrk_rps "$out")"
    declare -g "wrk_${name}_server_cpu=$(cpu_pct "$k0" "$k1" "$t0" "$t1")"
    declare -g "wrk_${name}_wrk_cpu=$(awk -v c="$wrk_cpu" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.1f", c / (t1 - t0) * 100 }')"
    declare -g "wrk_${name}_other_cpu=$(awk -v b0="$b0" -v b1="$b1" -v k0="$k0" -v k1="$k1" -v w="$wrk_cpu" \
        -v t0="$t0" -v t1="$t1" -v hz="$clk_tck" \
        'BEGIN { o = ((b1 - b0) - (k1 - k0)) / hz - w; if (o < 0) o = 0; printf "%.1f", o / (t1 - t0) * 100 }')"
    declare -g "wrk_${name}_errors=$(grep -E 'Socket errors|Non-2xx' "$out" | tr '\n' ' ' || true)"
}

# measure_resources NAME SCENARIO: fresh exporter, settle, idle window, scraped window.
measure_resources() {
    local name=$1 scenario=$2
    local t0 t1 k0 k1 b0 b1 n0 n1 i next
    start_exporter "$name" "$scenario"
    sleep "$SETTLE_S"
    echo "$name: idle for ${IDLE_S} s (no scrapes)" >&2
    k0=$(cpu_ticks "$exporter_pid")
    n0=$(run_ns "$exporter_pid")
    b0=$(busy_ticks)
    t0=$(now_s)
    sleep "$IDLE_S"
    t1=$(now_s)
    k1=$(cpu_ticks "$exporter_pid")
    n1=$(run_ns "$exporter_pid")
    b1=$(busy_ticks)
    declare -g "${name}_idle_ns_cpu=$(ns_pct "$n0" "$n1" "$t0" "$t1")"
    declare -g "${name}_idle_other=$(awk -v b0="$b0" -v b1="$b1" -v k0="$k0" -v k1="$k1" \
        -v t0="$t0" -v t1="$t1" -v hz="$clk_tck" \
        'BEGIN { printf "%.1f", ((b1 - b0) - (k1 - k0)) / hz / (t1 - t0) * 100 }')"
    declare -g "${name}_idle_cpu=$(cpu_pct "$k0" "$k1" "$t0" "$t1")"
    declare -g "${name}_idle_rss=$(status_mib "$exporter_pid" VmRSS)"
    declare -g "${name}_idle_hwm=$(status_mib "$exporter_pid" VmHWM)"

    echo "$name: scraping once per second for ${SCRAPE_S} s" >&2
    k0=$(cpu_ticks "$exporter_pid")
    n0=$(run_ns "$exporter_pid")
    t0=$(now_s)
    for i in $(seq 1 "$SCRAPE_S"); do
        curl -sf --max-time 2 -o /dev/null "http://$exporter_addr/metrics" ||
            echo "warning: scrape $i failed" >&2
        # Sleep to the next whole second of the window (bounded: at most 1 s).
        next=$(awk -v t0="$t0" -v i="$i" -v now="$(now_s)" \
            'BEGIN { d = t0 + i - now; if (d < 0) d = 0; if (d > 1) d = 1; printf "%.3f", d }')
        sleep "$next"
    done
    t1=$(now_s)
    k1=$(cpu_ticks "$exporter_pid")
    n1=$(run_ns "$exporter_pid")
    declare -g "${name}_scrape_ns_cpu=$(ns_pct "$n0" "$n1" "$t0" "$t1")"
    declare -g "${name}_scrape_cpu=$(cpu_pct "$k0" "$k1" "$t0" "$t1")"
    declare -g "${name}_scrape_rss=$(status_mib "$exporter_pid" VmRSS)"
    declare -g "${name}_scrape_hwm=$(status_mib "$exporter_pid" VmHWM)"
    stop_exporter "$exporter_pid"
}

# --- 1. build and start ----------------------------------------------------------------

echo "building: cargo build --release -p gpu-exporter" >&2
(cd "$root" && cargo build --release -p gpu-exporter) >&2
[[ -x $bin ]] || die "no binary at $bin after the build"

echo "## gpu-exporter scrape-load benchmark"
echo
echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "- git commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD -- 2>/dev/null || echo ' (working tree modified)')"
echo "- uname -m: $(uname -m)"
echo "- nproc: $(nproc)"
echo "- CPU: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
echo "- wrk: $(wrk -v 2>&1 | head -n 1 || true)"
echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- note: wrk (2 threads) and the exporter (2 HTTP worker threads, the sampler and its worker thread) share these $(nproc) cores"

start_exporter load builtin:big-node
load_pid=$exporter_pid
sleep 2 # one sample in hand

# --- 2. scrape latency -----------------------------------------------------------------

curl -sf --max-time 5 -o "$work/metrics.txt" "http://$exporter_addr/metrics" || die "GET /metrics failed"
body_bytes=$(wc -c <"$work/metrics.txt")
series=$(grep -vc '^#' "$work/metrics.txt" || true)
families=$(grep -c '^# TYPE' "$work/metrics.txt" || true)
echo "- /metrics body: $body_bytes bytes, $series series, $families families"

# Single-connection latency for context (service time without queueing): 20 GETs.
single=$(for _ in $(seq 1 20); do
    curl -sf --max-time 5 -o /dev/null -w '%{time_total}\n' "http://$exporter_addr/metrics"
done | sort -n | awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] * 1000 }')
echo "- single curl GET /metrics, median of 20: $single ms"

run_wrk metrics /metrics
# What Prometheus sends: the gzip body is compressed once per snapshot.
run_wrk gzip /metrics "Accept-Encoding: gzip"
run_wrk healthz /healthz

# 50 concurrent scrapers at a fixed rate (20 scrapes/s each, 1000/s in all, far above what
# a node sees) instead of wrk's saturating closed loop. hey is Go's HTTP client, which
# asks for gzip as Prometheus does.
# scrape_hist: the exporter's own scrape-duration histogram buckets, "le count" per line.
scrape_hist() {
    curl -sf "http://$exporter_addr/metrics" |
        awk -F'[{}" ]+' '/^gpu_exporter_scrape_duration_seconds_bucket/ { print $3, $5 }'
}

# server_p99 BEFORE AFTER: upper bound of the bucket holding the 99th percentile of the
# scrapes between two histogram readings, in ms.
server_p99() {
    paste "$1" "$2" | awk '{ le[NR] = $1; d[NR] = $4 - $2 } END {
        n = d[NR]; for (i = 1; i <= NR; i++) if (d[i] >= 0.99 * n) { printf "%s", (le[i] == "+Inf" ? "+Inf" : le[i] * 1000); exit } }'
}

run_hey() {
    local name=$1 path=$2 out=$work/hey-$1.txt
    scrape_hist >"$work/hist-before-$name"
    hey -z "${WRK_DURATION_S}s" -c 50 -q 20 "http://$exporter_addr$path" >"$out"
    scrape_hist >"$work/hist-after-$name"
    declare -g "hey_${name}_server_p99=$(server_p99 "$work/hist-before-$name" "$work/hist-after-$name")"
    echo
    echo "### raw hey output: $path (50 scrapers x 20/s)"
    echo '```'
    grep -E 'Requests/sec|Slowest|Fastest|Average|% in|\[200\]|Error' "$out" || true
    echo '```'
    declare -g "hey_${name}_p50=$(awk '/50% in/ { printf "%.3f", $3 * 1000 }' "$out")"
    declare -g "hey_${name}_p99=$(awk '/99% in/ { printf "%.3f", $3 * 1000 }' "$out")"
    declare -g "hey_${name}_rps=$(awk '/Requests\/sec/ { print $2 }' "$out")"
}
if command -v hey >/dev/null 2>&1; then
    run_hey metrics /metrics
    run_hey healthz /healthz
else
    echo "hey is not installed (apt-get install hey); skipping the fixed-rate run" >&2
    hey_metrics_p99=n/a hey_healthz_p99=n/a hey_metrics_p50=n/a hey_metrics_rps=n/a hey_metrics_server_p99=n/a
fi
load_hwm=$(status_mib "$load_pid" VmHWM)
stop_exporter "$load_pid"

# shellcheck disable=SC2154 # set by run_wrk via declare -g
{
    p99_ratio=$(ratio "$wrk_metrics_p99" "$wrk_healthz_p99")
    echo
    echo "### scrape latency (wrk -t2 -c50 -d${WRK_DURATION_S}s)"
    echo
    echo "| endpoint | p50 ms | p90 ms | p99 ms | req/s | exporter CPU % of a core | wrk CPU % of a core | other processes CPU % of a core | errors |"
    echo "|---|---|---|---|---|---|---|---|---|"
    echo "| /metrics | $wrk_metrics_p50 | $wrk_metrics_p90 | $wrk_metrics_p99 | $wrk_metrics_rps | $wrk_metrics_server_cpu | $wrk_metrics_wrk_cpu | $wrk_metrics_other_cpu | ${wrk_metrics_errors:-none} |"
    echo "| /metrics (gzip) | $wrk_gzip_p50 | $wrk_gzip_p90 | $wrk_gzip_p99 | $wrk_gzip_rps | $wrk_gzip_server_cpu | $wrk_gzip_wrk_cpu | $wrk_gzip_other_cpu | ${wrk_gzip_errors:-none} |"
    echo "| /healthz | $wrk_healthz_p50 | $wrk_healthz_p90 | $wrk_healthz_p99 | $wrk_healthz_rps | $wrk_healthz_server_cpu | $wrk_healthz_wrk_cpu | $wrk_healthz_other_cpu | ${wrk_healthz_errors:-none} |"
    echo
    echo "/metrics p99: $wrk_metrics_p99 ms absolute; ${p99_ratio}x the /healthz p99 ($wrk_healthz_p99 ms)"
    echo "/metrics throughput: $(awk -v r="$wrk_metrics_rps" -v b="$body_bytes" 'BEGIN { printf "%.1f", r * b / 1048576 }') MiB/s of body; Little's law mean latency at 50 connections: $(awk -v r="$wrk_metrics_rps" 'BEGIN { printf "%.3f", 50 / r * 1000 }') ms"
}

# --- 3. resources ----------------------------------------------------------------------

measure_resources big builtin:big-node
measure_resources def builtin:default

# shellcheck disable=SC2154 # set by measure_resources via declare -g
{
    echo
    echo "### resources (fresh exporter, ${SETTLE_S} s settle, ${IDLE_S} s idle, then ${SCRAPE_S} s at 1 scrape/s; -c 1000 --process-metrics)"
    echo
    echo "CPU % is of one core: utime+stime ticks (resolution $(awk -v hz="$clk_tck" -v t="$IDLE_S" 'BEGIN { printf "%.3f", 100 / hz / t }') % over ${IDLE_S} s), and in parentheses schedstat ns over all threads."
    echo
    echo "| scenario | idle VmRSS MiB | idle VmHWM MiB | idle CPU % | scraped VmRSS MiB | scraped VmHWM MiB | scraped CPU % | other processes CPU % during idle window |"
    echo "|---|---|---|---|---|---|---|---|"
    echo "| big-node | $big_idle_rss | $big_idle_hwm | $big_idle_cpu ($big_idle_ns_cpu) | $big_scrape_rss | $big_scrape_hwm | $big_scrape_cpu ($big_scrape_ns_cpu) | $big_idle_other |"
    echo "| default | $def_idle_rss | $def_idle_hwm | $def_idle_cpu ($def_idle_ns_cpu) | $def_scrape_rss | $def_scrape_hwm | $def_scrape_cpu ($def_scrape_ns_cpu) | $def_idle_other |"
    echo "| big-node/default | $(ratio "$big_idle_rss" "$def_idle_rss") | $(ratio "$big_idle_hwm" "$def_idle_hwm") | $(ratio "$big_idle_cpu" "$def_idle_cpu") ($(ratio "$big_idle_ns_cpu" "$def_idle_ns_cpu")) | $(ratio "$big_scrape_rss" "$def_scrape_rss") | $(ratio "$big_scrape_hwm" "$def_scrape_hwm") | $(ratio "$big_scrape_cpu" "$def_scrape_cpu") ($(ratio "$big_scrape_ns_cpu" "$def_scrape_ns_cpu")) | |"
    echo
    echo "scraping cost (big-node): $(awk -v a="$big_scrape_ns_cpu" -v b="$big_idle_ns_cpu" 'BEGIN { printf "%+.4f", a - b }') % of a core (schedstat) at 1 scrape/s over idle"

    # --- 4. summary ----------------------------------------------------------------------

    echo
    echo "### summary (builtin:big-node, --process-metrics, -c 1000)"
    echo
    echo "| metric | value | target | pass/fail |"
    echo "|---|---|---|---|"
    echo "| /metrics p99, 50 concurrent scrapers | $wrk_metrics_p99 ms (${p99_ratio}x /healthz p99 $wrk_healthz_p99 ms) | <= $P99_TARGET_MS ms | $(pass_fail "$wrk_metrics_p99" "$P99_TARGET_MS") |"
    echo "| /metrics p99, 50 concurrent scrapers, gzip (as Prometheus asks) | $wrk_gzip_p99 ms ($(ratio "$wrk_gzip_p99" "$wrk_healthz_p99")x /healthz p99) | <= $P99_TARGET_MS ms | $(pass_fail "$wrk_gzip_p99" "$P99_TARGET_MS") |"
    echo "| /metrics p99, 50 concurrent scrapers at 20/s each (hey, gzip), client-observed | $hey_metrics_p99 ms (p50 $hey_metrics_p50 ms, $hey_metrics_rps req/s; /healthz p99 $hey_healthz_p99 ms) | <= $P99_TARGET_MS ms | $(pass_fail "$hey_metrics_p99" "$P99_TARGET_MS") |"
    echo "| same run, server-side p99 (the exporter's own histogram, bucket upper bound) | <= ${hey_metrics_server_p99} ms | <= $P99_TARGET_MS ms | $(pass_fail "$hey_metrics_server_p99" "$P99_TARGET_MS") |"
    echo "| /metrics p50 / p90, 50 concurrent | $wrk_metrics_p50 / $wrk_metrics_p90 ms | — | — |"
    echo "| /metrics requests/s | $wrk_metrics_rps ($body_bytes B, $series series each) | — | — |"
    echo "| RSS idle (VmRSS) | $big_idle_rss MiB ($(ratio "$big_idle_rss" "$def_idle_rss")x default) | <= $RSS_TARGET_MIB MiB | $(pass_fail "$big_idle_rss" "$RSS_TARGET_MIB") |"
    echo "| RSS peak, idle + 1 scrape/s (VmHWM) | $big_scrape_hwm MiB ($(ratio "$big_scrape_hwm" "$def_scrape_hwm")x default) | <= $RSS_TARGET_MIB MiB | $(pass_fail "$big_scrape_hwm" "$RSS_TARGET_MIB") |"
    echo "| RSS peak under wrk -c50 (VmHWM) | $load_hwm MiB | <= $RSS_TARGET_MIB MiB | $(pass_fail "$load_hwm" "$RSS_TARGET_MIB") |"
    echo "| idle CPU, 1 s sampling | $big_idle_cpu % of a core, schedstat $big_idle_ns_cpu % ($(ratio "$big_idle_ns_cpu" "$def_idle_ns_cpu")x default) | <= $IDLE_CPU_TARGET_PCT % | $(pass_fail "$big_idle_cpu" "$IDLE_CPU_TARGET_PCT") |"
    echo "| CPU at 1 scrape/s, 1 s sampling | $big_scrape_cpu % of a core, schedstat $big_scrape_ns_cpu % | — | — |"
}
