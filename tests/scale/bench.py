#!/usr/bin/env python3
"""The fleet-scale bench's measurements (tests/scale/bench.sh runs it on an engine that
tests/scale/engine.sh brought up with WITH_ADAPTERS=1):

  python3 tests/scale/bench.py DIR [SECONDS]

For gpu-metrics-adapter and prometheus-adapter in turn, the other stopped (SIGSTOP, so
it sends the engine nothing): an idle window, then wrk on loopback for 1 HPA (one
connection, one workload's pods/*?labelSelector=app=X), then 1,000 workloads at the
HPAs' own pace (each once every 15 s, 67 requests a second, open loop: vegeta, built
by tests/kube/build.sh), then wrk for 1,000 HPAs (1,000 connections, 1,000 distinct workloads, closed
loop: as fast as it answers), SECONDS (30) each. Per window: the adapter's RSS
(VmRSS at the end, VmHWM) and CPU (utime+stime from /proc), queries per second and
response bytes per second at Thanos query (its own /metrics: http_requests_total and
http_response_size_bytes_sum, every handler), and for ours its round time (its own
/metrics). Then freshness, both adapters running: the fleet's step advances, and per
adapter the time from the first sample of the new step (its timestamp in the engine)
to the adapter's first answer with the new step's value. Prints a JSON report and a
Markdown table. ONLY=NAME (gpu-metrics-adapter or prometheus-adapter) measures that one
alone, the other stopped throughout (to rerun one on an engine kept up with KEEP=1).
"""

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

DIR = sys.argv[1]
SECONDS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
env = {}
for line in open(os.path.join(DIR, "env")):
    if "=" in line:
        k, v = line.rstrip("\n").split("=", 1)
        env[k] = v.strip('"')
TOKEN = open(env["READER_TOKEN_FILE"]).read().strip()
CTX = ssl.create_default_context(cafile=env["ADAPTER_CA"])
ADAPTERS = {
    "gpu-metrics-adapter": (env["OURS_URL"], int(open(os.path.join(DIR, "pids/gpu-metrics-adapter")).read())),
    "prometheus-adapter": (env["THEIRS_URL"], int(open(os.path.join(DIR, "pids/prometheus-adapter")).read())),
}
ONLY = os.environ.get("ONLY")
if ONLY:
    ADAPTERS = {ONLY: ADAPTERS[ONLY]}
TICK = os.sysconf("SC_CLK_TCK")


def get(url, auth=False, timeout=60):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(req, timeout=timeout, context=CTX if url.startswith("https") else None) as r:
        return r.read()


def proc(pid):
    status = open(f"/proc/{pid}/status").read()
    kb = lambda k: int(re.search(rf"^{k}:\s+(\d+) kB", status, re.M).group(1))
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return {"rss_kib": kb("VmRSS"), "hwm_kib": kb("VmHWM"), "cpu_s": (int(stat[11]) + int(stat[12])) / TICK}


def thanos():
    """Requests and response bytes Thanos query has served, over every handler."""
    text = get(env["THANOS_URL"] + "/metrics").decode()
    req = sum(float(m.group(2)) for m in re.finditer(r'^http_requests_total\{([^}]*)\} (\S+)$', text, re.M))
    size = sum(float(m.group(2)) for m in re.finditer(r'^http_response_size_bytes_sum\{([^}]*)\} (\S+)$', text, re.M))
    by = {}
    for m in re.finditer(r'^http_requests_total\{([^}]*)\} (\S+)$', text, re.M):
        h = re.search(r'handler="([^"]*)"', m.group(1))
        if h:
            by[h.group(1)] = by.get(h.group(1), 0) + float(m.group(2))
    return req, size, by


def rounds():
    text = get(env["OURS_URL"] + "/metrics", auth=True).decode()
    val = lambda n: float(re.search(rf"^{n} (\S+)$", text, re.M).group(1))
    return val("gpu_metrics_adapter_source_round_duration_seconds_sum"), val(
        "gpu_metrics_adapter_source_round_duration_seconds_count"
    )


def workloads():
    truth = json.loads(get(env["FLEET_URL"] + "/truth"))
    apps = {}
    for p in truth["pods"]:
        apps.setdefault(p["app"], p["namespace"])
    return sorted(apps.items())


def path(ns, app):
    return f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/gpu_utilization?labelSelector=app%3D{app}"


WRK_LUA = r"""
local paths = {}
for line in io.lines("%s") do paths[#paths + 1] = line end
local counter = 0
local thread_id = 0
local threads = {}
function setup(thread)
  thread:set("id", thread_id)
  thread_id = thread_id + 1
  table.insert(threads, thread)
end
function init(args)
  counter = id * 7919
  codes = {}
end
response = function(status, headers, body)
  codes[status] = (codes[status] or 0) + 1
end
request = function()
  counter = counter + 1
  return wrk.format("GET", paths[(counter %% #paths) + 1], {["Authorization"] = "Bearer %s"})
end
function done(summary, latency, requests)
  local e = summary.errors
  local all = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("codes") or {}) do all[k] = (all[k] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(all) do parts[#parts + 1] = string.format('"%%d": %%d', k, v) end
  io.write('CODES {' .. table.concat(parts, ", ") .. '}\n')
  io.write(string.format('WRK {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, "max_us": %%d, "non2xx": %%d, "timeouts": %%d, "connect": %%d, "read": %%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    e.status, e.timeout, e.connect, e.read))
end
"""


def wrk(base, paths, connections, seconds):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(paths) + "\n")
        plist = f.name
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_LUA % (plist, TOKEN))
        script = f.name
    threads = min(2, connections)
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "30s", "-s", script, base],
        capture_output=True, text=True, check=False,
    )
    m = re.search(r"^WRK (.*)$", out.stdout, re.M)
    if not m:
        return {"error": out.stdout[-500:] + out.stderr[-500:]}
    r = json.loads(m.group(1))
    c = re.search(r"^CODES (.*)$", out.stdout, re.M)
    if c:
        r["status_codes"] = json.loads(c.group(1))
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def paced(base, paths, seconds, period=15.0):
    """Open loop at the HPAs' own pace: each of `paths` asked once every `period`
    seconds (an HPA's default sync), spread evenly, by vegeta (requests leave at the
    rate whatever the answers' latency, so a slow answer cannot hide those behind it);
    latency from request to the whole answer, over keep-alive connections. A request
    unanswered after 30 s is an error, which bounds the window."""
    vegeta = os.path.join(env["KUBE_BIN_DIR"], "vegeta")
    with tempfile.TemporaryDirectory() as d:
        targets = os.path.join(d, "targets")
        with open(targets, "w") as f:
            for p in paths:
                f.write(f"GET {base}{p}\nAuthorization: Bearer {TOKEN}\n\n")
        results = os.path.join(d, "results.bin")
        subprocess.run(
            [vegeta, "attack", f"-targets={targets}", f"-rate={len(paths)}/{period:g}s", f"-duration={seconds}s",
             f"-root-certs={env['ADAPTER_CA']}", "-timeout=30s", "-max-workers=2000", f"-output={results}"],
            check=True, capture_output=True,
        )
        out = subprocess.run([vegeta, "report", "-type=json", results], check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    lat = r["latencies"]
    codes = r.get("status_codes", {})
    return {
        "requests": r["requests"],
        "rate_per_s": round(r["rate"], 1),
        "p50_us": round(lat["50th"] / 1e3),
        "p99_us": round(lat["99th"] / 1e3),
        "max_us": round(lat["max"] / 1e3),
        "errors": r["requests"] - codes.get("200", 0),
        "status_codes": codes,
    }


def window(name, pid, action):
    t0, p0, (q0, b0, h0) = time.time(), proc(pid), thanos()
    r0 = rounds() if name == "gpu-metrics-adapter" else None
    result = action()
    t1, p1, (q1, b1, h1) = time.time(), proc(pid), thanos()
    dt = t1 - t0
    out = {
        "seconds": round(dt, 1),
        "rss_mib": round(p1["rss_kib"] / 1024, 1),
        "peak_rss_mib": round(p1["hwm_kib"] / 1024, 1),
        "cpu_cores": round((p1["cpu_s"] - p0["cpu_s"]) / dt, 3),
        "thanos_qps": round((q1 - q0) / dt, 2),
        "thanos_bytes_per_s": round((b1 - b0) / dt),
        "thanos_requests_by_handler": {k: v - h0.get(k, 0) for k, v in h1.items() if v - h0.get(k, 0) > 0},
    }
    if r0:
        s1, c1 = rounds()
        out["rounds"] = c1 - r0[1]
        out["round_s_mean"] = round((s1 - r0[0]) / max(c1 - r0[1], 1), 3)
    if result is not None:
        out["load"] = result
    return out


def value(base, ns, pod):
    body = json.loads(get(f"{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/{pod}/gpu_utilization", auth=True, timeout=30))
    q = body["items"][0]["value"]
    if q.endswith("m"):
        return float(q[:-1]) / 1000
    return float(q)


def query(q):
    url = env["THANOS_URL"] + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    r = json.loads(get(url))["data"]["result"]
    return float(r[0]["value"][1]) if r else None


def freshness(rounds_n=3):
    """Per step advance and adapter: seconds from the new step's first sample to the
    adapter's first answer with its value (pod w00000-0, in node group 0)."""
    step = int(json.loads(get(env["FLEET_URL"] + "/step"))["step"])
    truth_pod = lambda s: next(p for p in json.loads(get(f"{env['FLEET_URL']}/truth?step={s}"))["pods"] if p["pod"] == "w00000-0")
    results = {n: [] for n in ADAPTERS}
    for _ in range(rounds_n):
        step += 1
        want = truth_pod(step)
        req = urllib.request.Request(f"{env['FLEET_URL']}/step?to={step}", method="POST")
        urllib.request.urlopen(req, timeout=10).read()
        seen = {}
        sample_ts = [None]

        def watch_engine():
            deadline = time.time() + 300
            while time.time() < deadline:
                v = query('fleet_sim_step{node_group="0"}')
                if v == step:
                    sample_ts[0] = query('timestamp(fleet_sim_step{node_group="0"})')
                    return
                time.sleep(0.2)

        def watch(name, base):
            deadline = time.time() + 300
            while time.time() < deadline:
                try:
                    if abs(value(base, want["namespace"], "w00000-0") - want["gpu_utilization"]) < 0.002:
                        seen[name] = time.time()
                        return
                except Exception:
                    pass
                time.sleep(0.2)

        threads = [threading.Thread(target=watch_engine)] + [
            threading.Thread(target=watch, args=(n, b)) for n, (b, _) in ADAPTERS.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for n in ADAPTERS:
            if n in seen and sample_ts[0] is not None:
                results[n].append(round(seen[n] - sample_ts[0], 2))
            else:
                results[n].append(None)
    return results


def main():
    apps = workloads()
    thousand = [path(ns, app) for app, ns in apps[:1000]]
    while len(thousand) < 1000:
        thousand += thousand[: 1000 - len(thousand)]
    report = {"gpus": env.get("GPUS"), "series": env.get("SERIES"), "pods": env.get("PODS"), "workloads": len(apps), "adapters": {}}
    everyone = {n: int(open(os.path.join(DIR, f"pids/{n}")).read()) for n in ("gpu-metrics-adapter", "prometheus-adapter")}
    for name, (base, pid) in ADAPTERS.items():
        others = [p for n, p in everyone.items() if n != name]
        for p in others:
            os.kill(p, signal.SIGSTOP)
        try:
            time.sleep(2)
            r = {}
            r["idle"] = window(name, pid, lambda: time.sleep(SECONDS))
            r["hpa_1"] = window(name, pid, lambda: wrk(base, thousand[:1], 1, SECONDS))
            # At their pace first, then the closed-loop flood: a saturation test whose
            # 1,000 TLS connections (in a cluster requests come through the
            # aggregator's few) would otherwise leave their memory in the paced figure.
            r["hpa_1000_paced"] = window(name, pid, lambda: paced(base, thousand, SECONDS))
            r["hpa_1000"] = window(name, pid, lambda: wrk(base, thousand, 1000, SECONDS))
            report["adapters"][name] = r
        finally:
            for p in others:
                os.kill(p, signal.SIGCONT)
        print(json.dumps({name: report["adapters"][name]}), file=sys.stderr)
    time.sleep(5)
    # ONLY: the other adapter stays stopped while ours is timed, too.
    held = [p for n, p in everyone.items() if ONLY and n != ONLY]
    for p in held:
        os.kill(p, signal.SIGSTOP)
    try:
        report["freshness_s"] = freshness()
    finally:
        for p in held:
            os.kill(p, signal.SIGCONT)
    print(json.dumps(report, indent=1))
    json.dump(report, open(os.path.join(DIR, "bench.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
