#!/usr/bin/env python3
"""CPU a client spends blocked in nvmlEventSetWait_v2 for 10 s with nothing due.

Run against the fake library (docs/benchmarks/nvml.md, "`nvmlEventSetWait` idle CPU"):

    LD_LIBRARY_PATH=DIR_WITH_libnvidia-ml.so.1 GPU_SIM_SCENARIO=builtin:default \\
        [GPU_SIM_FROZEN_AT_S=60] python3 fake-nvml/benches/event_wait_cpu.py

Registers XID events on every GPU, drains the XIDs already due, then waits 10 s and
prints the process's CPU time over the wait (time.process_time, and the main thread's
/proc/self/schedstat run time).
"""

import time

import pynvml

WAIT_MS = 10_000


def schedstat_ns():
    with open("/proc/self/schedstat") as f:
        return int(f.read().split()[0])


def main():
    pynvml.nvmlInit()
    s = pynvml.nvmlEventSetCreate()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, s)
    while True:
        try:
            pynvml.nvmlEventSetWait_v2(s, 0)
        except pynvml.NVMLError_Timeout:
            break
    c0, w0, s0 = time.process_time(), time.monotonic(), schedstat_ns()
    try:
        e = pynvml.nvmlEventSetWait_v2(s, WAIT_MS)
        outcome = f"XID {e.eventData}"
    except pynvml.NVMLError_Timeout:
        outcome = "timeout"
    c1, w1, s1 = time.process_time(), time.monotonic(), schedstat_ns()
    print(
        f"{outcome}: wall {w1 - w0:.2f} s, CPU {1e3 * (c1 - c0):.2f} ms "
        f"(schedstat {(s1 - s0) / 1e6:.2f} ms), {100 * (c1 - c0) / (w1 - w0):.4f} % of a core"
    )


if __name__ == "__main__":
    main()
