#!/usr/bin/env python3
"""GPM as a sampler calls it: each cycle one new sample (nvmlGpmSampleGet) and one
nvmlGpmMetricsGet over the pair (last cycle's sample, this one), a fresh pair every
time. nvml-latency.py times the same calls back to back on one pair, which a real
driver answers for less: on the H200 (580.159.04) a sample 38 µs back to back and 300 µs
a second after the last; the graphics activity 1.25 ms on a reused pair and about
1.9 ms, with dcgm-exporter's other four metrics, on a fresh one. The fake's cost model
(GPU_SIM_COST_MODEL) takes this file's `gpm` section over nvml-latency.json's.
Prints one JSON document; CPU times are the calling thread's (CLOCK_THREAD_CPUTIME_ID).

    python3 exporter/benches/gpm-fresh-pairs.py > gpm-fresh-pairs.json
    python3 exporter/benches/gpm-fresh-pairs.py --summarize FILE   # `gpm` again from FILE's rows

- `rows`: per spacing (1 s, 0.1 s, 0.01 s between samples), per cycle: the new sample's
  CPU and wall time; dcgm-exporter's five metrics on the fresh pair (first call), again
  on the same pair, the graphics activity alone, the other four alone; the activity value.
- `gpm`: nvml-latency.py's keys, from the 1 s rows' medians (a sampler at `-c 1000`):
  `nvmlGpmSampleGet` the fresh sample; `nvmlGpmMetricsGet(metric 1)` (graphics activity)
  the five on a fresh pair less the other four alone, since the first call on a pair
  carries what the pair costs and the other metrics cost microseconds either way.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fidelity"))

SPACINGS = (1.0, 0.1, 0.01)
CYCLES = {1.0: 8, 0.1: 10, 0.01: 10}


def measure():
    import sweep  # tests/fidelity/sweep.py: pynvml and its GPM helper

    n = sweep.pynvml
    metrics = sweep.gpm_metrics
    n.nvmlInit()
    g = n.nvmlDeviceGetHandleByIndex(0)
    gr = n.NVML_GPM_METRIC_GRAPHICS_UTIL
    others = [n.NVML_GPM_METRIC_DRAM_BW_UTIL, n.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
              n.NVML_GPM_METRIC_PCIE_RX_PER_SEC, n.NVML_GPM_METRIC_PCIE_TX_PER_SEC]

    def timed(fn, *a):
        c, t = time.thread_time_ns(), time.perf_counter_ns()
        r = fn(*a)
        return (time.thread_time_ns() - c) / 1e3, (time.perf_counter_ns() - t) / 1e3, r

    out = {}
    for spacing in SPACINGS:
        s = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
        n.nvmlGpmSampleGet(g, s[0])
        rows = []
        for i in range(CYCLES[spacing]):
            time.sleep(spacing)
            prev, cur = s[i % 2], s[(i + 1) % 2]
            sample = timed(n.nvmlGpmSampleGet, g, cur)
            first = timed(metrics, prev, cur, [gr] + others)
            again = timed(metrics, prev, cur, [gr] + others)
            alone = timed(metrics, prev, cur, [gr])
            rest = timed(metrics, prev, cur, others)
            rows.append({"sample_cpu_us": sample[0], "sample_wall_us": sample[1],
                         "first5_cpu_us": first[0], "again5_cpu_us": again[0],
                         "gr_cpu_us": alone[0], "others_cpu_us": rest[0],
                         "gr_value": first[2][0]})
        out[f"spacing {spacing}s"] = rows
    return {"rows": out}


def summarize(doc):
    rows = doc["rows"]["spacing 1.0s"]
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    gr = med("first5_cpu_us") - med("others_cpu_us")
    doc["gpm"] = {
        "nvmlGpmSampleGet": {"median_us": round(med("sample_cpu_us"), 1)},
        "nvmlGpmMetricsGet(metric 1)": {"median_us": round(gr, 1)},
    }
    return doc


def main():
    if sys.argv[1:2] == ["--summarize"]:
        with open(sys.argv[2]) as f:
            doc = summarize(json.load(f))
    else:
        doc = summarize(measure())
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    print()
    for k, v in doc["gpm"].items():
        print(f"{v['median_us']:10.1f} µs  {k} (fresh pairs, 1 s apart)", file=sys.stderr)


if __name__ == "__main__":
    main()
