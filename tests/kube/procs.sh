# The process plumbing shared by tests/kube/cluster.sh and tests/scale/engine.sh
# (sourced, not run): each process in its own session, its pid in DIR/pids/NAME and its
# output in DIR/logs/NAME.log, and bounded waits. The sourcing script sets $dir and
# defines down(), which `fail` runs.

log() { echo "$(basename "$0"): $*" >&2; }
# fail MESSAGE: say it, show the end of every log, take everything down, exit 1.
fail() {
    log "$*"
    for f in "$dir"/logs/*.log; do
        [ -s "$f" ] || continue
        echo "--- $f (last 15 lines)" >&2
        tail -n 15 "$f" >&2
    done
    down
    exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start NAME COMMAND...: run in its own session, output to logs/NAME.log.
start() {
    local name=$1
    shift
    setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$dir/pids/$name"
}
# wait_for WHAT SECONDS COMMAND...: poll until COMMAND succeeds.
wait_for() {
    local what=$1 limit=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || fail "$what not ready within ${limit}s"
        sleep 0.2
    done
}
# stop_started: SIGTERM every process in DIR/pids that still runs, SIGKILL what is left
# after 20 s. Only a live pid from the file is signalled (pids are reused).
stop_started() {
    local pids=() p f
    for f in "$dir"/pids/*; do
        [ -e "$f" ] || continue
        p=$(cat "$f")
        if kill -0 "$p" 2>/dev/null; then
            pids+=("$p")
            kill -TERM "$p" 2>/dev/null || true
        fi
        rm -f "$f"
    done
    local deadline=$((SECONDS + 20))
    for p in "${pids[@]}"; do
        while kill -0 "$p" 2>/dev/null; do
            if [ $SECONDS -ge $deadline ]; then
                kill -KILL "$p" 2>/dev/null || true
                break
            fi
            sleep 0.1
        done
    done
}
