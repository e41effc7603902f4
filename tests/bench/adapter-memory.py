#!/usr/bin/env python3
"""Peak RSS (VmHWM) of gpu-metrics-adapter against one hostile peer (issue 20).

  tests/bench/adapter-memory.py MODE [--seconds N] [--binary PATH] [-- ADAPTER FLAGS]

MODE: prometheus-json (each query answered with 200 MB of valid Prometheus JSON),
prometheus-random (200 MB of random bytes), exporter-protobuf (one exporter answering a
valid 15 MiB protobuf exposition: 140,000 pod series), quiet (an exporter that never
answers: the baseline). Issue 27: exporter-help-first (--targets N exporters answering
the 15 MiB exposition with each family's help before its name), fleet (100 exporters of
999 pods each, every default limit kept), prometheus-labels (one sample with 140,000
labels per query), signal-promql (a promql: signal answered with 15 MiB of JSON).
Prints VmHWM, VmRSS and the adapter's refusal counters.
"""
import argparse, os, random, re, socket, subprocess, sys, threading, time, urllib.request

HUGE = 200_000_000


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(tag, payload):
    return bytes([tag]) + varint(len(payload)) + payload


def exposition(series, help_first=False, name="DCGM_FI_DEV_GPU_UTIL", node=None):
    """With a node, the labels of a real exporter's series; without, the five of issue 20's."""
    import struct
    metrics = bytearray()
    for i in range(series):
        pairs = (("gpu", str(i)), ("UUID", f"GPU-{node}-{i:08}"), ("device", f"nvidia{i}"),
                 ("modelName", "NVIDIA H100 80GB HBM3"), ("Hostname", node),
                 ("DCGM_FI_DRIVER_VERSION", "550.54.15"), ("container", "main"),
                 ("namespace", "huge"), ("pod", f"p-{node}-{i}")) if node else (
                 ("UUID", f"GPU-{i:08}"), ("container", "main"), ("Hostname", "node-a"),
                 ("namespace", "huge"), ("pod", f"p-{i}"))
        labels = b"".join(
            field(0x0A, field(0x0A, k.encode()) + field(0x12, v.encode())) for k, v in pairs)
        gauge = field(0x12, b"\x09" + struct.pack("<d", 1.0))
        metrics += field(0x22, labels + gauge)
    help_field = field(0x12, b"GPU utilization (in %).")
    name_field = field(0x0A, name.encode())
    head = help_field + name_field if help_first else name_field + help_field
    family = head + b"\x18\x01" + bytes(metrics)
    return varint(len(family)) + family


FAMILIES = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]


def serve(handler):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    def handle(conn):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        try:
            handler(conn)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def answer(content_type, body):
    def handler(conn):
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return handler


PROTOBUF = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"


def chunked(content_type, make_chunk):
    def handler(conn):
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
                     "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode())
        sent, first = 0, True
        while sent < HUGE:
            chunk = make_chunk(first)
            first = False
            conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
        conn.sendall(b"0\r\n\r\n")
    return handler


SAMPLE = b'{"metric":{"pod":"p","namespace":"n"},"value":[1,"1"]},' * 1200
START = b'{"status":"success","data":{"resultType":"vector","result":['
RANDOM = random.Random(1).randbytes(64 << 10)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["prometheus-json", "prometheus-random", "exporter-protobuf", "quiet",
                                    "exporter-help-first", "fleet", "prometheus-labels", "signal-promql"])
    p.add_argument("--targets", type=int, default=1)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--binary", default="target/debug/gpu-metrics-adapter")
    a, flags = p.parse_known_args()
    a.flags = [f for f in flags if f != "--"]
    if a.mode == "prometheus-json":
        url = serve(chunked("application/json", lambda first: (START if first else b"") + SAMPLE))
        source = ["--prometheus-url", url]
    elif a.mode == "prometheus-random":
        url = serve(chunked("application/json", lambda first: RANDOM))
        source = ["--prometheus-url", url]
    elif a.mode == "exporter-protobuf":
        body = exposition(140_000)
        print(f"exposition: {len(body)} bytes, 140000 series", file=sys.stderr)

        def handler(conn):
            conn.sendall(("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.google.protobuf; "
                          "proto=io.prometheus.client.MetricFamily; encoding=delimited\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        source = ["--exporter-url", serve(handler)]
    elif a.mode == "exporter-help-first":
        body = exposition(140_000, help_first=True)
        print(f"exposition: {len(body)} bytes, 140000 series, help first", file=sys.stderr)
        source = []
        for _ in range(a.targets):
            source += ["--exporter-url", serve(answer(PROTOBUF, body))]
    elif a.mode == "fleet":
        source = []
        for t in range(100):
            body = b"".join(exposition(999, name=f, node=f"node-{t}") for f in FAMILIES)
            source += ["--exporter-url", serve(answer(PROTOBUF, body))]
        print(f"fleet: 100 exporters, {len(body)} bytes each, 999 pods", file=sys.stderr)
    elif a.mode == "prometheus-labels":
        labels = ",".join(f'"l{i}":"{"v" * 96}"' for i in range(140_000))
        body = ('{"status":"success","data":{"resultType":"vector","result":[{"metric":{'
                + labels + '},"value":[1,"1"]}]}}').encode()
        print(f"answer: {len(body)} bytes, one sample of 140000 labels", file=sys.stderr)
        source = ["--prometheus-url", serve(answer("application/json", body))]
    elif a.mode == "signal-promql":
        sample = '{"metric":{"pod":"p","namespace":"n"},"value":[1,"1"]}'
        n = (15 << 20) // (len(sample) + 1)
        body = ('{"status":"success","data":{"resultType":"vector","result":['
                + ",".join([sample] * n) + ']}}').encode()
        print(f"answer: {len(body)} bytes, {n} samples", file=sys.stderr)
        source = ["--exporter-url", serve(lambda conn: time.sleep(3600)),
                  "--signal", "ns/queue=promql:sum(queue)",
                  "--signal-prometheus-url", serve(answer("application/json", body))]
    else:
        source = ["--exporter-url", serve(lambda conn: time.sleep(3600))]
    # Issue 20's modes scrape every second; issue 27's run at the default flags.
    timing = ["--scrape-interval", "1s", "--scrape-timeout", "5s"] if a.mode in (
        "prometheus-json", "prometheus-random", "exporter-protobuf", "quiet") else []
    cmd = [a.binary, "--insecure-serve-http", "--bind-address", "127.0.0.1", "--secure-port", "0",
           "--grpc-port", "0"] + timing + source + a.flags
    env = dict(os.environ, RUST_LOG="warn,gpu_metrics_adapter=info")
    env.pop("KUBECONFIG", None)
    adapter = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    base = None
    for line in adapter.stderr:
        m = re.search(r"listening address=(\S+)", line)
        if m and "grpc" not in line.lower():
            base = f"http://{m.group(1)}"
            break
    threading.Thread(target=lambda: [None for _ in adapter.stderr], daemon=True).start()
    started = time.time()
    cpu0 = sum(int(x) for x in open(f"/proc/{adapter.pid}/stat").read().rsplit(")", 1)[1].split()[11:13])
    time.sleep(a.seconds)
    cpu = sum(int(x) for x in open(f"/proc/{adapter.pid}/stat").read().rsplit(")", 1)[1].split()[11:13]) - cpu0
    status = open(f"/proc/{adapter.pid}/status").read()
    fields = {k: v.strip() for k, v in (l.split(":", 1) for l in status.splitlines())}
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode() if base else ""
    adapter.kill()
    cores = cpu / 100 / (time.time() - started)
    print(f"{a.mode}: VmHWM {fields['VmHWM']}, VmRSS {fields['VmRSS']}, CPU {cores:.2f} cores")
    for line in metrics.splitlines():
        if line.startswith(("gpu_metrics_adapter_source_target_rejected_total",
                            "gpu_metrics_adapter_source_scrapes_total",
                            "gpu_metrics_adapter_source_series_over_label_limit_total",
                            "gpu_metrics_adapter_signal_reads_total",
                            "gpu_metrics_adapter_pods_fresh")):
            print(" ", line)


main()
