#!/usr/bin/env python3
"""Idle-connection flood against the exporter (issue 20, "Listener limits").

    python3 exporter/benches/idle-flood.py [--binary target/release/gpu-exporter]
        [--connections 15000] [--seconds 45] [--nofile 1024] [-- EXTRA EXPORTER FLAGS]

Starts the exporter on simulated GPUs under `ulimit -n NOFILE` (the manifests' worst
case), opens CONNECTIONS plain TCP connections that never send a byte (this script
raises its own soft limit to fit them), and for SECONDS:
- probes /healthz every 0.5 s on a new connection with a 2 s timeout (the manifests'
  probe timeout), as the kubelet does;
- counts how many of the idle connections the exporter has closed;
- samples the exporter's open file descriptors and resident memory.
Prints one summary line per second and a final summary. Loopback only; stdlib only.
"""

import argparse
import os
import resource
import selectors
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def probe(port, timeout=2.0):
    """One GET /healthz on a new connection: (ok, seconds)."""
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(max(0.01, timeout - (time.monotonic() - start)))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        return data.startswith(b"HTTP/1.1 200"), time.monotonic() - start
    except OSError:
        return False, time.monotonic() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/release/gpu-exporter")
    parser.add_argument("--connections", type=int, default=15000)
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.connections + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

    port = free_port()
    cmd = (
        f"ulimit -n {args.nofile} && exec {args.binary} --simulate "
        f"-a 127.0.0.1:{port} --log-level warn " + " ".join(args.extra)
    )
    exporter = subprocess.Popen(["bash", "-c", cmd], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not probe(port)[0]:
            if time.monotonic() > deadline or exporter.poll() is not None:
                sys.exit("the exporter did not start")
            time.sleep(0.1)
        pid = exporter.pid
        base_fds, base_rss = fds(pid), status_kib(pid, "VmRSS")
        print(f"exporter pid {pid}, nofile {args.nofile}: {base_fds} fds, RSS {base_rss} KiB before")

        sel = selectors.DefaultSelector()
        opened = failed = 0
        start = time.monotonic()
        for _ in range(args.connections):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            except OSError:
                failed += 1
                s.close()
                continue
            sel.register(s, selectors.EVENT_READ)
            opened += 1
            # In bursts of 200: a faster burst overflows the kernel's queues, and the
            # kernel, not the exporter, drops the rest (the client sees them
            # established; the server never does).
            if opened % 200 == 0:
                time.sleep(0.02)
        print(f"opened {opened} idle connections in {time.monotonic() - start:.1f} s ({failed} failed)")

        open_now = opened
        closed_at = {}
        probes = ok = 0
        worst = 0.0
        max_fds, max_rss = 0, 0
        next_probe = next_report = time.monotonic()
        end = start + args.seconds
        while time.monotonic() < end:
            for key, _ in sel.select(timeout=0.05):
                s = key.fileobj
                try:
                    data = s.recv(1)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    continue
                sel.unregister(s)
                s.close()
                open_now -= 1
                if open_now == 0 and "all" not in closed_at:
                    closed_at["all"] = time.monotonic() - start
            now = time.monotonic()
            if now >= next_probe:
                good, took = probe(port)
                probes += 1
                ok += good
                worst = max(worst, took)
                next_probe = now + 0.5
            max_fds = max(max_fds, fds(pid))
            max_rss = max(max_rss, status_kib(pid, "VmRSS"))
            if now >= next_report:
                print(
                    f"t={now - start:5.1f}s  held by exporter ≤ {open_now:5d}  "
                    f"fds {fds(pid):4d}  RSS {status_kib(pid, 'VmRSS')} KiB  "
                    f"/healthz {ok}/{probes} ok, worst {worst * 1000:.0f} ms"
                )
                next_report = now + 1
        # Where the connections the exporter never saw are: the client's side of each
        # (a SYN dropped while the accept queue was full is retried by the kernel; a
        # syncookie'd one is established here and unknown there).
        ss = subprocess.run(["ss", "-tanH", f"( dport = :{port} or sport = :{port} )"],
                            capture_output=True, text=True).stdout.splitlines()
        states = {}
        for line in ss:
            fields = line.split()
            side = "server" if fields[3].endswith(f":{port}") else "client"
            states[(side, fields[0])] = states.get((side, fields[0]), 0) + 1
        print("sockets by side and state:", dict(sorted(states.items())))
        print(
            f"summary: {opened} idle connections, still open after {args.seconds:.0f} s: {open_now}; "
            f"all closed after {closed_at.get('all', float('nan')):.1f} s; "
            f"/healthz {ok}/{probes} answered (worst {worst * 1000:.0f} ms); "
            f"exporter fds max {max_fds} (before {base_fds}); RSS max {max_rss} KiB "
            f"(before {base_rss}), VmHWM {status_kib(pid, 'VmHWM')} KiB; alive: {exporter.poll() is None}"
        )
    finally:
        exporter.terminate()
        exporter.wait(timeout=15)


if __name__ == "__main__":
    main()
