#!/usr/bin/env python3
"""Time NVML calls one by one on whatever libnvidia-ml.so.1 the loader finds: on a real
GPU this says which calls a sampling cycle's time goes to (the fake answers every call
in microseconds, so it cannot). Prints one JSON document.

    python3 exporter/benches/nvml-latency.py > latency.json

- `getters`: every pynvml getter that tests/fidelity/sweep.py can call (handle, index
  and enum arguments), timed on its first argument combination that succeeds: the
  median and minimum of REPEATS calls, in microseconds.
- `field_values`: nvmlDeviceGetFieldValues with one field ID at a time, for every
  NVML_FI_DEV_* ID the driver answers (the exporter batches its IDs in one call, so its
  cost is at most the sum of its fields').
- `gpm`: a GPM sample (nvmlGpmSampleGet) and the metrics of the exporter's default
  counters computed from two samples (nvmlGpmMetricsGet).
- `events`: nvmlEventSetWait_v2 on a set registered for XIDs, with a zero timeout and
  with the exporter's 500 ms.

Each call's `cpu_median_us` is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID):
the fake's cost model takes the wall medians as CPU time except for calls that wait.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fidelity"))
import sweep  # noqa: E402  (sweep.py: pynvml and its getter enumeration)

pynvml = sweep.pynvml
REPEATS = int(os.environ.get("REPEATS", "20"))


def timed(fn, *args):
    """(median, min) wall time of REPEATS calls in µs, and the median of the calling
    thread's CPU time (`cpu_median_us`: a call that waits costs wall time, not CPU);
    the first call is a warm-up."""
    fn(*args)
    ts, cs = [], []
    for _ in range(REPEATS):
        c = time.thread_time_ns()
        t = time.perf_counter_ns()
        fn(*args)
        ts.append((time.perf_counter_ns() - t) / 1e3)
        cs.append((time.thread_time_ns() - c) / 1e3)
    return {"median_us": round(statistics.median(ts), 1), "min_us": round(min(ts), 1),
            "cpu_median_us": round(statistics.median(cs), 1)}


def getters(gpu):
    out = {}
    import itertools

    for name, fn in sweep.getters():
        domains = sweep.arg_domains(name, fn, [gpu], [gpu])
        if domains is None or name == "nvmlDeviceGetFieldValues":
            continue
        for args in itertools.product(*domains):
            if sweep.outcome(fn, args) == "ok":
                out[name] = dict(timed(fn, *args), args=[a if isinstance(a, int) else "handle" for a in args])
                break
    return out


def field_values(gpu):
    out = {}
    for name, fid in sorted(vars(pynvml).items()):
        if not (name.startswith("NVML_FI_DEV_") and isinstance(fid, int)):
            continue
        v = pynvml.nvmlDeviceGetFieldValues(gpu, [fid])[0]
        if v.nvmlReturn == pynvml.NVML_SUCCESS:
            out[name] = dict(timed(pynvml.nvmlDeviceGetFieldValues, gpu, [fid]), id=fid)
    return out


def gpm(gpu):
    out = {}
    try:
        a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        out["nvmlGpmSampleGet"] = timed(pynvml.nvmlGpmSampleGet, gpu, a)
        pynvml.nvmlGpmSampleGet(gpu, b)
        # dcgm-exporter's five defaults first, then the other five the exporter serves.
        ids = [pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
               pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
               pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, pynvml.NVML_GPM_METRIC_SM_UTIL,
               pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, pynvml.NVML_GPM_METRIC_FP64_UTIL,
               pynvml.NVML_GPM_METRIC_FP32_UTIL, pynvml.NVML_GPM_METRIC_FP16_UTIL]

        def metrics(chosen):
            sweep.gpm_metrics(a, b, chosen)

        for n in (1, 5, 10):
            out[f"nvmlGpmMetricsGet({n} metrics)"] = timed(metrics, ids[:n])
        # The cost depends on which metrics, not how many: each alone.
        for mid in ids:
            out[f"nvmlGpmMetricsGet(metric {mid})"] = timed(metrics, [mid])
    except Exception as e:  # noqa: BLE001 - GPM unsupported here, or pynvml differs
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def events(gpu):
    try:
        s = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(gpu, pynvml.nvmlEventTypeXidCriticalError, s)

        def wait():
            try:
                pynvml.nvmlEventSetWait_v2(s, 0)
            except pynvml.NVMLError_Timeout:
                pass

        out = {"nvmlEventSetWait_v2(timeout 0)": timed(wait)}

        # The exporter's XID thread blocks in 500 ms waits: what one costs in CPU.
        def wait_500():
            try:
                pynvml.nvmlEventSetWait_v2(s, 500)
            except pynvml.NVMLError_Timeout:
                pass

        c, t = time.thread_time_ns(), time.perf_counter_ns()
        for _ in range(4):
            wait_500()
        out["nvmlEventSetWait_v2(timeout 500)"] = {
            "median_us": round((time.perf_counter_ns() - t) / 4e3, 1),
            "cpu_median_us": round((time.thread_time_ns() - c) / 4e3, 1),
            "repeats": 4, "note": "means of 4 waits, not medians"}
        return out
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    doc = {
        "repeats": REPEATS,
        "getters": getters(gpu),
        "field_values": field_values(gpu),
        "gpm": gpm(gpu),
        "events": events(gpu),
    }
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    print()
    rows = [(v["median_us"], k) for part in ("getters", "field_values", "gpm", "events")
            for k, v in doc[part].items() if isinstance(v, dict) and "median_us" in v]
    for us, k in sorted(rows, reverse=True)[:40]:
        print(f"{us:10.1f} µs  {k}", file=sys.stderr)


if __name__ == "__main__":
    main()
