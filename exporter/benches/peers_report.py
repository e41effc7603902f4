#!/usr/bin/env python3
"""Render exporter/benches/peers.py's JSON as the Markdown of docs/benchmarks/nvml.md's peer
section: one row per measure, each peer's figure, and the ratio ours/peer.

    python3 peers_report.py peers.json SCENARIO FROZEN_AT_S MACHINE VERSIONS
"""

import json
import sys


def main():
    path, scenario, frozen_at, machine, versions = sys.argv[1:6]
    with open(path) as f:
        r = json.load(f)
    peers = [p for p in ("nvitop-exporter", "all-smi") if p in r]
    ours = r.get("ours")
    if not ours:
        raise SystemExit("no figures for ours")

    def factor(x):
        return f"{x:,.0f}" if x >= 100 else f"{x:.2g}" if x >= 10 else f"{x:.2f}"

    def ratio(a, b):
        """ours/peer, and how many times less (or more) that is."""
        if not b:
            return "n/a"
        x = a / b
        if x < 1:
            return f"{x:.3g} ({factor(b / a)}× less)" if a else "0"
        return f"{x:.3g} ({factor(x)}× more)"

    rows = [
        ("CPU per scrape, callgrind instructions",
         lambda t: t["callgrind"]["instructions_per_scrape"], "{:,.0f}"),
        ("Idle CPU, % of one core (1 s cycles, no scrapes)",
         lambda t: t["native"]["idle_cpu_pct"], "{:.3f}"),
        ("RSS idle, MiB", lambda t: t["native"]["rss_idle_kib"] / 1024, "{:.1f}"),
        ("Peak RSS (VmHWM) after load, MiB", lambda t: t["native"]["hwm_kib"] / 1024, "{:.1f}"),
        ("p50 under 50 connections, ms", lambda t: t["native"]["load"]["p50_ms"], "{:.3g}"),
        ("p99 under 50 connections, ms", lambda t: t["native"]["load"]["p99_ms"], "{:.3g}"),
        ("Scrapes/s under 50 connections",
         lambda t: t["native"]["load"]["requests_per_s"] or 0, "{:,.0f}"),
        ("NVML calls per cycle, all", lambda t: t["calls"]["total_per_cycle"], "{:.1f}"),
    ]
    print(f"Scenario `{scenario}` frozen at {frozen_at} s; machine: {machine}.  ")
    print(f"Versions: {versions}.\n")
    header = "| measure | ours | " + " | ".join(
        f"{p} | ours/{p}" for p in peers) + " |"
    print(header)
    print("|" + "---|" * (2 + 2 * len(peers)))
    for label, get, fmt in rows:
        cells = [label, fmt.format(get(ours))]
        for p in peers:
            cells += [fmt.format(get(r[p])), ratio(get(ours), get(r[p]))]
        print("| " + " | ".join(cells) + " |")

    if "all-smi" in r:
        a = r["all-smi"]["calls"]["per_cycle"]
        o = ours["calls"]["per_cycle"]
        shared = sorted(set(a) & set(o))
        sa, so = sum(a[n] for n in shared), sum(o[n] for n in shared)
        print(f"| NVML calls per cycle, functions both ours and all-smi call "
              f"({len(shared)}) | {so:.1f} | | | {sa:.1f} | {ratio(so, sa)} |")
        print("\nPer function, calls per cycle (ours / all-smi), for the functions both call:\n")
        print("| function | ours | all-smi |")
        print("|---|---|---|")
        for n in shared:
            print(f"| `{n}` | {o[n]:g} | {a[n]:g} |")
    print("\nEvery tool's calls per cycle, per function:\n")
    for name in ["ours"] + peers:
        calls = r[name]["calls"]
        per = ", ".join(f"{n} {c:g}" for n, c in sorted(calls["per_cycle"].items()))
        bg = ", ".join(f"{n} {c:.2f}/s" for n, c in sorted(calls["background_per_s"].items()))
        print(f"- {name} ({calls['cycle_period_s']:.2f} s period): {per}"
              + (f"; background: {bg}" if bg else ""))
    print("\nLoad details:", "; ".join(
        f"{n}: socket errors {r[n]['native']['load']['socket_errors'] or 'none'}, "
        f"non-2xx {r[n]['native']['load']['non_2xx']}, body {r[n]['native']['body_bytes']:,} "
        f"bytes, {r[n]['native']['series']:,} series"
        for n in ["ours"] + peers))


if __name__ == "__main__":
    main()
