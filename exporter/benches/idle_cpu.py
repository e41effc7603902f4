#!/usr/bin/env python3
"""Idle CPU of a running exporter: the process's on-CPU time over a window with no
scrapes but two (one before, one after), as % of one core and per GPU. CPU time, not
wall time, so a machine loaded by other work reads the same.

The time is every thread's /proc/PID/task/TID/schedstat (nanoseconds) when no thread
that was there at the start has gone by the end (a gone thread takes its time with it);
otherwise /proc/PID/stat utime + stime, which keeps dead threads' time but counts in
clock ticks (10 ms: at 0.2 % of a core a 60 s window is 12 ticks, so ±8 %). Both are
printed; `cpu_source` says which the percentages use.

    python3 exporter/benches/idle_cpu.py --label NAME --gpus N --seconds 60 -- CMD ARGS...

CMD is the exporter with its flags but no address: `-a 127.0.0.1:PORT` is added. The
window starts once its third sampling cycle is published (gpu_exporter_samples_total),
and the cycles in the window are counted the same way. Prints one JSON object.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(url):
    try:
        body = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith("gpu_exporter_samples_total "):
            return int(float(line.split()[1]))
    return None


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command: state is field 3; utime and stime are fields 14 and 15.
    return int(fields[11]) + int(fields[12])


def task_ns(pid):
    """{tid: (name, on-CPU nanoseconds)} of every thread of pid (schedstat's first field)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                out[tid] = (f.read().strip(), ns)
        except (OSError, ValueError, IndexError):
            pass
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--label", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(cmd + ["-a", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (samples(url) or 0) < 3:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"{a.label}: the exporter did not come up: {proc.stderr.read() if proc.poll() is not None else 'timeout'}")
            time.sleep(0.2)
        hz = os.sysconf("SC_CLK_TCK")
        s0, t0, n0, w0 = samples(url), cpu_ticks(proc.pid), task_ns(proc.pid), time.monotonic()
        time.sleep(a.seconds)
        t1, n1, w1 = cpu_ticks(proc.pid), task_ns(proc.pid), time.monotonic()
        s1 = samples(url)
        ticks_s = (t1 - t0) / hz
        # Per thread name (the exporter names its threads: sampler, sampler-worker,
        # nvml-events, http), so a run says where the time went.
        threads_ms = {}
        for t, (name, ns) in n1.items():
            threads_ms[name] = threads_ms.get(name, 0) + (ns - n0.get(t, (name, 0))[1]) / 1e6
        if n0 and set(n0) <= set(n1):
            cpu_s, source = sum(threads_ms.values()) / 1e3, "schedstat"
        else:
            cpu_s, source = ticks_s, "stat-ticks"
        pct = 100 * cpu_s / (w1 - w0)
        print(json.dumps({
            "label": a.label,
            "gpus": a.gpus,
            "window_s": round(w1 - w0, 2),
            "cycles": s1 - s0,
            "cpu_s": round(cpu_s, 4),
            "cpu_source": source,
            "cpu_s_stat_ticks": round(ticks_s, 3),
            "cpu_pct_of_core": round(pct, 3),
            "cpu_pct_of_core_per_gpu": round(pct / a.gpus, 3),
            "cpu_ms_per_cycle": round(1000 * cpu_s / max(s1 - s0, 1), 3),
            "threads_ms": {k: round(v, 2) for k, v in sorted(threads_ms.items())},
        }), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
