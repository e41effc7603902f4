#!/usr/bin/env python3
"""Side-by-side measurements of gpu-exporter, nvitop-exporter and all-smi (`all-smi api`)
on the same fake libnvidia-ml.so.1 and scenario. Driven by exporter/benches/peers.sh,
which builds and installs everything and explains the method; run that, not this.

Each tool is started three times, alone on the machine (never two at once):

1. Native, with GPU_SIM_CALL_COUNTS: NVML calls per sampling cycle. The fake rewrites a
   file of per-function counts every 50 ms while they change. This polls it every 10 ms;
   a tool's cycle shows up as a burst of changes followed by quiet. Reading A is taken in
   a quiet gap, reading B in the quiet gap after N further bursts: calls/cycle = (B-A)/N.
   `nvmlEventSetWait*` (ours waits for XID events on its own thread, 500 ms at a time) is
   left out of the burst detection and reported apart, as per-second background calls.
2. Native, without call counting: idle CPU (on-CPU nanoseconds of every thread, from
   /proc/PID/task/*/schedstat, over IDLE_S seconds with no scrapes), RSS, then
   `wrk -t2 -c50 --latency` for LOAD_S seconds (p50/p99, requests/s) and VmHWM after it.
3. Under `valgrind --tool=callgrind`, with no sampling cycle in the window (see
   per_scrape_instructions): counters zeroed (`callgrind_control -z`), K scrapes of
   /metrics over one keep-alive connection, dump (`-d`); zeroed again, the same wall time
   with no scrape, dump. Instructions per scrape = (scrape window - idle window) / K.

Prints a JSON document of all figures on stdout; the shell script renders the table.
"""

import argparse
import glob
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Functions left out of cycle detection: a blocking wait runs on its own clock.
BACKGROUND = re.compile(r"^nvmlEventSetWait")


def log(msg):
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path="/metrics", timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": "text/plain"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


class Tool:
    """How to start one exporter: argv for a port and a collection interval (seconds)."""

    def __init__(self, name, argv, ready_metric, env=None, samples_metric=None):
        self.name = name
        self.argv = argv
        self.ready_metric = ready_metric
        self.env = env or {}
        # A counter of completed sampling cycles, where the tool serves one.
        self.samples_metric = samples_metric

    def command(self, port, interval_s):
        return [a.format(port=port, interval_s=interval_s, interval_ms=interval_s * 1000)
                for a in self.argv]


class Running:
    def __init__(self, tool, port, proc, logfile):
        self.tool, self.port, self.proc, self.logfile = tool, port, proc, logfile

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self):
        with open(self.logfile, errors="replace") as f:
            return f.read()


def start(tool, args, interval_s, workdir, extra_env=None, wrapper=()):
    port = free_port()
    env = dict(os.environ)
    env.update(tool.env)
    env.update(extra_env or {})
    logfile = os.path.join(workdir, f"{tool.name}.{len(os.listdir(workdir))}.log")
    with open(logfile, "w") as out:
        proc = subprocess.Popen(list(wrapper) + tool.command(port, interval_s), env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    running = Running(tool, port, proc, logfile)
    deadline = time.monotonic() + args.ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{tool.name} exited ({proc.returncode}) before serving:\n"
                             f"{running.log_text()[-4000:]}")
        try:
            status, body = http_get(port)
            if status == 200 and tool.ready_metric in body:
                return running
        except OSError:
            pass
        time.sleep(0.2)
    running.stop()
    raise SystemExit(f"{tool.name} served no {tool.ready_metric} within "
                     f"{args.ready_timeout_s} s:\n{running.log_text()[-4000:]}")


# --------------------------------------------------------------------------------------
# 1. NVML calls per cycle.

def read_counts(path):
    counts = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    counts[parts[1]] = int(parts[0])
    except FileNotFoundError:
        pass
    return counts


def foreground(counts):
    return {k: v for k, v in counts.items() if not BACKGROUND.match(k)}


def calls_per_cycle(tool, args, workdir):
    counts_file = os.path.join(workdir, f"{tool.name}.calls")
    running = start(tool, args, args.interval_s, workdir,
                    extra_env={"GPU_SIM_CALL_COUNTS": counts_file})
    try:
        quiet_s = 0.4 * args.interval_s
        deadline = time.monotonic() + 30 + 3 * args.cycles * args.interval_s

        def poll_until_quiet(last):
            """Poll until the foreground counts stay unchanged for quiet_s; returns
            (counts, whether they changed at all while polling, when changes started)."""
            changed_at = None
            stable_since = time.monotonic()
            while time.monotonic() < deadline:
                time.sleep(0.01)
                now_counts = read_counts(counts_file)
                if foreground(now_counts) != foreground(last):
                    if changed_at is None:
                        changed_at = time.monotonic()
                    last = now_counts
                    stable_since = time.monotonic()
                elif time.monotonic() - stable_since >= quiet_s:
                    return last, changed_at
            raise SystemExit(f"{tool.name}: NVML calls never paused for {quiet_s:.1f} s")

        # Let the first cycles pass, then settle on a quiet gap.
        time.sleep(2 * args.interval_s)
        first, _ = poll_until_quiet(read_counts(counts_file))
        t_first = time.monotonic()
        burst_starts = []
        last = first
        while len(burst_starts) < args.cycles:
            # Wait for the next burst to begin.
            while time.monotonic() < deadline:
                time.sleep(0.01)
                now_counts = read_counts(counts_file)
                if foreground(now_counts) != foreground(last):
                    burst_starts.append(time.monotonic())
                    break
            else:
                raise SystemExit(f"{tool.name}: no sampling cycle within the deadline")
            last, _ = poll_until_quiet(now_counts)
        t_last = time.monotonic()
        second = last
    finally:
        running.stop()
    names = sorted(set(first) | set(second))
    per_cycle = {n: (second.get(n, 0) - first.get(n, 0)) / args.cycles
                 for n in names if not BACKGROUND.match(n)}
    background = {n: (second.get(n, 0) - first.get(n, 0)) / (t_last - t_first)
                  for n in names if BACKGROUND.match(n)}
    period = ((burst_starts[-1] - burst_starts[0]) / (len(burst_starts) - 1)
              if len(burst_starts) > 1 else args.interval_s)
    return {
        "per_cycle": {n: c for n, c in per_cycle.items() if c},
        "total_per_cycle": sum(per_cycle.values()),
        "background_per_s": {n: c for n, c in background.items() if c},
        "cycles": args.cycles,
        "cycle_period_s": period,
        "log": running.log_text(),
    }


# --------------------------------------------------------------------------------------
# 2. Idle CPU, RSS, latency under load.

def cpu_ns(pid):
    total = 0
    for stat in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(stat) as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended between glob and open
    return total


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def ms(value):
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", value)
    if not m:
        raise ValueError(value)
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def load(port, args):
    out = subprocess.run(
        ["wrk", "-t2", f"-c{args.connections}", f"-d{args.load_s}s", "--latency",
         "--timeout", "10s", "-H", "Accept: text/plain", f"http://127.0.0.1:{port}/metrics"],
        capture_output=True, text=True, check=True).stdout
    pct = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M))
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    errors = re.search(r"Socket errors: (.*)$", out, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "p50_ms": ms(pct["50"]),
        "p99_ms": ms(pct["99"]),
        "requests_per_s": float(rps.group(1)) if rps else None,
        "socket_errors": errors.group(1) if errors else None,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
    }


def native(tool, args, workdir):
    running = start(tool, args, args.interval_s, workdir)
    try:
        time.sleep(args.settle_s)
        c0, t0 = cpu_ns(running.pid), time.monotonic()
        time.sleep(args.idle_s)
        c1, t1 = cpu_ns(running.pid), time.monotonic()
        rss_idle = status_kib(running.pid, "VmRSS")
        # After some cycles, so the body is complete (a peer serves partial cycles).
        _, body = http_get(running.port)
        # Sequential keep-alive-free scrapes: the latency one Prometheus sees.
        seq = []
        for _ in range(args.sequential_scrapes):
            t = time.monotonic()
            http_get(running.port)
            seq.append(1e3 * (time.monotonic() - t))
        seq.sort()
        # wrk is not everywhere (a GPU machine may have none): --load-s 0 skips it.
        loaded = load(running.port, args) if args.load_s > 0 else None
        rss_loaded = status_kib(running.pid, "VmRSS")
        hwm = status_kib(running.pid, "VmHWM")
    finally:
        running.stop()
    return {
        "idle_cpu_pct": 100.0 * (c1 - c0) / 1e9 / (t1 - t0),
        "idle_cpu_ns_per_s": (c1 - c0) / (t1 - t0),
        "rss_idle_kib": rss_idle,
        "rss_after_load_kib": rss_loaded,
        "hwm_kib": hwm,
        "sequential_scrape_ms": {"p50": seq[len(seq) // 2], "max": seq[-1]} if seq else None,
        "body_bytes": len(body.encode()),
        "series": series_count(body),
        "load": loaded,
        "log": running.log_text(),
    }


# --------------------------------------------------------------------------------------
# 3. Callgrind instructions per scrape.

def callgrind_total(path):
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def callgrind_dump(pid, prefix, action):
    # Forked children (all-smi's Command spawns) write files of their own pids.
    prefix = f"{prefix}.{pid}."
    before = set(glob.glob(prefix + "*"))
    subprocess.run(["callgrind_control", action, str(pid)], check=True,
                   capture_output=True, timeout=120)
    if action != "-d":
        return None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = sorted(set(glob.glob(prefix + "*")) - before)
        if new:
            time.sleep(0.5)  # let valgrind finish writing the file
            return callgrind_total(new[0])
        time.sleep(0.1)
    raise SystemExit(f"callgrind_control -d {pid} wrote no dump")


def scrapes(port, k):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        for _ in range(k):
            conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise SystemExit(f"scrape answered {resp.status}")
    finally:
        conn.close()


def series_count(body):
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def sample_value(body, name):
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def per_scrape_instructions(tool, args, workdir, k, full_series):
    """Ours publishes only complete cycles, but its GPM and NVLink-bandwidth series need
    two samples: it runs at a 20 s interval, is measured after its second cycle, and a
    window that a cycle fell into is measured again. A peer serves a cycle while it is
    being gathered, and needs one: it runs at a one-hour interval and is measured once
    its body is as complete as it was natively."""
    prefix = os.path.join(workdir, f"callgrind.{tool.name}")
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={prefix}.%p"]
    interval = 20 if tool.samples_metric else 3600
    running = start(tool, args, interval, workdir, wrapper=wrapper)

    def samples():
        return sample_value(http_get(running.port, timeout=120)[1], tool.samples_metric)

    try:
        deadline = time.monotonic() + args.ready_timeout_s
        history = []

        def complete():
            if tool.samples_metric:
                return (samples() or 0) >= 2
            # As many series as natively, or (series that need two cycles, like
            # all-smi's energy counters, never come at a one-hour interval) a count
            # that has not moved for 20 s.
            history.append((time.monotonic(), series_count(http_get(running.port, timeout=120)[1])))
            now, count = history[-1]
            if count >= full_series:
                return True
            stable = [c for t, c in history if t >= now - 20]
            return (history[0][0] <= now - 20 and count >= full_series / 2
                    and all(c == count for c in stable))

        while not complete():
            if time.monotonic() > deadline:
                raise SystemExit(f"{tool.name} under valgrind never served a complete body")
            time.sleep(1)
        for _attempt in range(5):
            before = samples() if tool.samples_metric else None
            scrapes(running.port, 3)  # warm caches, connection pools, lazy statics
            body_seen = http_get(running.port, timeout=120)[1]
            callgrind_dump(running.pid, prefix, "-z")
            t0 = time.monotonic()
            scrapes(running.port, k)
            wall = time.monotonic() - t0
            busy = callgrind_dump(running.pid, prefix, "-d")
            callgrind_dump(running.pid, prefix, "-z")
            time.sleep(wall)
            idle = callgrind_dump(running.pid, prefix, "-d")
            if before is None or samples() == before:
                break
            log(f"{tool.name}: a sampling cycle fell into the window; measuring again")
        else:
            raise SystemExit(f"{tool.name}: every window had a sampling cycle in it")
    finally:
        running.stop()
    return {
        "scrapes": k,
        "window_s": wall,
        "instructions_scrape_window": busy,
        "instructions_idle_window": idle,
        "instructions_per_scrape": (busy - idle) / k,
        "series_under_valgrind": series_count(body_seen),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True)
    p.add_argument("--nvitop-exporter", required=True)
    p.add_argument("--all-smi", required=True)
    p.add_argument("--interval-s", type=int, default=1)
    p.add_argument("--cycles", type=int, default=5)
    p.add_argument("--settle-s", type=float, default=3)
    p.add_argument("--idle-s", type=float, default=30)
    p.add_argument("--load-s", type=int, default=10)
    p.add_argument("--connections", type=int, default=50)
    p.add_argument("--scrapes-ours", type=int, default=200)
    p.add_argument("--scrapes-peers", type=int, default=10)
    p.add_argument("--ready-timeout-s", type=float, default=600)
    p.add_argument("--only", default="ours,nvitop-exporter,all-smi")
    p.add_argument("--sequential-scrapes", type=int, default=20)
    # Which measurements: calls (needs the fake's call counts), native (idle CPU, RSS,
    # latency), callgrind (needs valgrind). Against a real driver only `native` applies.
    p.add_argument("--parts", default="calls,native,callgrind")
    args = p.parse_args()
    # The tools run in a scratch directory: their paths must not be relative.
    args.ours, args.nvitop_exporter, args.all_smi = (
        os.path.abspath(x) for x in (args.ours, args.nvitop_exporter, args.all_smi))

    tools = [
        Tool("ours", [args.ours, "--address", "127.0.0.1:{port}",
                      "--collect-interval", "{interval_ms}", "--log-level", "warn"],
             "DCGM_FI_DEV_GPU_UTIL", samples_metric="gpu_exporter_samples_total"),
        Tool("nvitop-exporter", [args.nvitop_exporter, "--bind-address", "127.0.0.1",
                                 "--port", "{port}", "--interval", "{interval_s}"],
             "gpu_utilization"),
        # `all-smi api` keeps an energy journal under the cache directory: a scratch one.
        Tool("all-smi", [args.all_smi, "api", "--port", "{port}",
                         "--interval", "{interval_s}"],
             "all_smi_gpu_utilization",
             env={"XDG_CACHE_HOME": tempfile.mkdtemp(prefix="peers-cache-"),
                  "XDG_CONFIG_HOME": tempfile.mkdtemp(prefix="peers-config-")}),
    ]
    wanted = args.only.split(",")
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="peers-") as workdir:
            for tool in tools:
                if tool.name not in wanted:
                    continue
                parts = args.parts.split(",")
                results[tool.name] = {}
                if "calls" in parts:
                    log(f"{tool.name}: NVML calls per cycle")
                    results[tool.name]["calls"] = calls_per_cycle(tool, args, workdir)
                log(f"{tool.name}: idle CPU, RSS, load")
                nat = native(tool, args, workdir)
                results[tool.name]["native"] = nat
                if "callgrind" in parts:
                    log(f"{tool.name}: callgrind instructions per scrape")
                    k = args.scrapes_ours if tool.name == "ours" else args.scrapes_peers
                    results[tool.name]["callgrind"] = per_scrape_instructions(
                        tool, args, workdir, k, nat["series"])
    finally:
        # What was measured before a failure is kept.
        json.dump(results, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
