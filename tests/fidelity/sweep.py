#!/usr/bin/env python3
"""Sweep nvidia-ml-py's whole getter surface against whatever libnvidia-ml.so.1 the
dynamic loader finds, and print one JSON document.

Used by tests/tests/e2e/nvml_fidelity.rs. Three parts:

- `symbols`: every NVML symbol pynvml binds (`_nvmlGetFunctionPointer("…")` in its
  source), looked up in the library; `missing` lists those it lacks.
- `calls`: every pynvml getter (a `nvml*` function with Get/Query/Is/Read in its name
  and no Set/Clear/Reset/Create/Destroy) whose required arguments are handles (each
  GPU, each MIG device, a second GPU), indices, or enums enumerable from pynvml's
  constants, called with every combination. Per function: the outcome of each call —
  "ok", the NVML error name, or "skipped: <why>" for a Python-level refusal (pynvml
  wants a struct the sweep cannot build). Any "FunctionNotFound" is a failure.
- `values`: a sample of answers, which the Rust test checks against the gpu-sim model.

With `--summary`, prints one line of counts instead (the figures in docs/benchmarks/nvml.md).
"""

import inspect
import itertools
import json
import re
import sys
from ctypes import byref

try:
    import pynvml
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"cannot import pynvml ({e}); run tests/setup.sh", file=sys.stderr)
    sys.exit(2)

GETTER = re.compile(r"^nvml\w*(Get|Query|Is|Read)")
NOT_GETTER = re.compile(r"(Set|Clear|Reset|Create|Destroy|Register|Free|Wait|Remove|Modify|Discover)")
DEVICE_ARGS = {"handle", "device", "dev", "migDevice"}
# Struct versions of functions that take one as an argument.
VERSIONS = {"nvmlDeviceGetRunningProcessDetailList": [pynvml.nvmlProcessDetailList_v1]}


def gpm_metrics(sample1, sample2, ids):
    """nvmlGpmMetricsGet over two samples for the metric IDs given: their values."""
    m = pynvml.c_nvmlGpmMetricsGet_t()
    m.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    m.numMetrics = len(ids)
    m.sample1, m.sample2 = sample1, sample2
    for i, mid in enumerate(ids):
        m.metrics[i].metricId = mid
    pynvml.nvmlGpmMetricsGet(m)
    return [m.metrics[i].value for i in range(len(ids))]


def constants(prefix, exclude=("COUNT",)):
    """Values of pynvml constants starting with prefix (the enum's members)."""
    return sorted(
        {
            v
            for k, v in vars(pynvml).items()
            if k.startswith(prefix) and isinstance(v, int) and not k.endswith(exclude)
        }
    )


# Enum-valued arguments, by parameter name.
ENUMS = {
    "type": constants("NVML_CLOCK_", ("COUNT", "_ID_COUNT"))[:4],
    "clockType": constants("NVML_CLOCK_", ("COUNT",))[:4],
    "clockId": [0, 1, 2, 3],
    "id": [0, 1, 2, 3],  # nvmlDeviceGetClock's clock ID
    "sampling_type": list(range(pynvml.NVML_SAMPLINGTYPE_COUNT)),
    "fieldIds": [sorted({v for k, v in vars(pynvml).items() if k.startswith("NVML_FI_DEV_") and isinstance(v, int)})],
    # No vGPU instance or type exists on a bare-metal node: any ID must be refused.
    "vgpuInstance": [0, 1],
    "vgpuTypeId": [0, 1],
    "sensor": [pynvml.NVML_TEMPERATURE_GPU],
    "counter": constants("NVML_NVLINK_ERROR_DL_"),
    "link": [0, 17],
    "capability": constants("NVML_NVLINK_CAP_"),
    "errorType": [0, 1],
    "counterType": [0, 1],
    "locationType": constants("NVML_MEMORY_LOCATION_"),
    "thresholdType": list(range(pynvml.NVML_TEMPERATURE_THRESHOLD_COUNT)),
    "threshold": list(range(pynvml.NVML_TEMPERATURE_THRESHOLD_COUNT)),
    "apiType": [0, 1],
    "pstate": [0],
    "encoderQueryType": [0, 1, 2],
    "infoRomObject": [0, 1, 2],
    "level": [0, 40, 50],
    "p2pIndex": list(range(5)),
    "sourceFilter": [0],
    "perfPolicyType": list(range(8)),
    "policyType": list(range(8)),
    "counterId": [0, 1],
    "profile": [0],
    "profileId": [0],
    "index": [0],
    "fan": [0],
    "cause": [0, 1],
    "version": None,  # per function: VERSIONS
    "pid": [1],
    "timeStamp": [0],
    "lastSeenTimeStamp": [0],
    "cpuSetSize": [4],
    "nodeSetSize": [4],
    "scope": [0],
    "mode": [0, 1, 2],
    "memoryClockMHz": None,  # filled from the supported memory clocks
}


def outcome(fn, args):
    try:
        fn(*args)
        return "ok"
    except pynvml.NVMLError_FunctionNotFound:
        return "FunctionNotFound"
    except pynvml.NVMLError as e:
        return type(e).__name__.replace("NVMLError_", "") or f"code {e.value}"
    except Exception as e:  # pynvml itself refused the arguments
        return f"skipped: {type(e).__name__}: {e}"


def symbols():
    text = open(pynvml.__file__).read()
    names = sorted(set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', text)))
    missing = []
    for n in names:
        try:
            pynvml._nvmlGetFunctionPointer(n)
        except pynvml.NVMLError_FunctionNotFound:
            missing.append(n)
    return {"bound": len(names), "missing": missing}


def identity(gpu, kind):
    """GPU 0's serial, UUID or PCI bus ID, to look it up by."""
    try:
        if kind == "serial":
            return pynvml.nvmlDeviceGetSerial(gpu)
        if kind == "uuid":
            return pynvml.nvmlDeviceGetUUID(gpu)
        return pynvml.nvmlDeviceGetPciInfo_v3(gpu).busId
    except pynvml.NVMLError:
        return "0"


def memory_clocks(gpu):
    """The first supported memory clock (a stand-in when the library cannot say)."""
    try:
        return pynvml.nvmlDeviceGetSupportedMemoryClocks(gpu)[:1]
    except pynvml.NVMLError:
        return [0]


def getters():
    """(name, function) of every pynvml getter, by name."""
    for name in sorted(dir(pynvml)):
        fn = getattr(pynvml, name)
        if callable(fn) and GETTER.match(name) and not NOT_GETTER.search(name):
            yield name, fn


def arg_domains(name, fn, devices, gpus):
    """The values to try for each required argument of getter `name` (the first,
    a device, from `devices`), or None where one cannot be built."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values() if p.default is inspect._empty]
    except (TypeError, ValueError):
        return None
    domains = []
    for i, p in enumerate(params):
        if i == 0 and p.name in DEVICE_ARGS:
            domains.append(devices)
        elif p.name in ("device1", "device2"):
            domains.append(gpus[:2])
        elif p.name == "version" and name in VERSIONS:
            domains.append(VERSIONS[name])
        elif p.name in ENUMS and ENUMS[p.name] is not None:
            domains.append(ENUMS[p.name])
        elif p.name in ("serial", "uuid", "pciBusId"):
            domains.append([identity(gpus[0], p.name)])
        elif p.name == "memoryClockMHz":
            domains.append(memory_clocks(gpus[0]))
        else:
            return None
    return domains


def sweep(gpus, migs):
    calls = {}
    for name, fn in getters():
        domains = arg_domains(name, fn, gpus + migs, gpus)
        if domains is None:
            continue
        results = {}
        for args in itertools.product(*domains):
            o = outcome(fn, args)
            results[o] = results.get(o, 0) + 1
        calls[name] = results
    return calls


def values(gpus):
    out = []
    for h in gpus:
        g = {}

        def put(key, fn, *args):
            try:
                v = fn(h, *args)
            except Exception as e:  # an NVML error, or pynvml refusing the library
                v = {"error": type(e).__name__}
            if isinstance(v, bytes):
                v = v.decode()
            g[key] = v

        put("name", pynvml.nvmlDeviceGetName)
        put("max_sm_clock", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM)
        put("max_video_clock", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_VIDEO)
        put("boost_clock", pynvml.nvmlDeviceGetMaxCustomerBoostClock, pynvml.NVML_CLOCK_GRAPHICS)
        put("app_clock_mem", pynvml.nvmlDeviceGetClock, pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET)
        put("current_sm_clock", pynvml.nvmlDeviceGetClock, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_CURRENT)
        put("clock_info_sm", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        put("pcie_gen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration)
        put("pcie_gen_max", pynvml.nvmlDeviceGetMaxPcieLinkGeneration)
        put("pcie_width", pynvml.nvmlDeviceGetCurrPcieLinkWidth)
        put("shutdown_temp", pynvml.nvmlDeviceGetTemperatureThreshold, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        put("slowdown_temp", pynvml.nvmlDeviceGetTemperatureThreshold, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        put("temperature", pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)
        put("part_number", pynvml.nvmlDeviceGetBoardPartNumber)
        put("bar1_total", lambda d: pynvml.nvmlDeviceGetBAR1MemoryInfo(d).bar1Total)
        put("cores", pynvml.nvmlDeviceGetNumGpuCores)
        put("cuda_cc", lambda d: list(pynvml.nvmlDeviceGetCudaComputeCapability(d)))
        put("power_limits", lambda d: list(pynvml.nvmlDeviceGetPowerManagementLimitConstraints(d)))
        put("nvlink_version", pynvml.nvmlDeviceGetNvLinkVersion, 0)
        put("fan", pynvml.nvmlDeviceGetFanSpeed)

        def fabric_state(d):
            # pynvml declares the one-byte state as a c_uint: padding must be zero.
            info = pynvml.c_nvmlGpuFabricInfo_v2_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(d, byref(info))
            return info.state

        put("fabric_state", fabric_state)
        put(
            "nvlink_link_count",
            lambda d: (lambda f: f.value.uiVal if f.nvmlReturn == 0 else {"error": f.nvmlReturn})(
                pynvml.nvmlDeviceGetFieldValues(d, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
            ),
        )
        put("compute_pids", lambda d: sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(d)))
        put("graphics_pids", lambda d: sorted(p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(d)))
        put(
            "detail_pids",
            lambda d: sorted(
                p.pid
                for p in pynvml.nvmlDeviceGetRunningProcessDetailList(
                    d, pynvml.nvmlProcessDetailList_v1, pynvml.NVML_PROCESS_MODE_COMPUTE
                )
            ),
        )
        out.append(g)
    return out


def main():
    pynvml.nvmlInit()
    gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    migs = []
    for g in gpus:
        try:
            n = pynvml.nvmlDeviceGetMaxMigDeviceCount(g)
        except pynvml.NVMLError:
            continue
        for i in range(n):
            try:
                migs.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, i))
            except pynvml.NVMLError:
                pass
    doc = {
        "gpus": len(gpus),
        "migs": len(migs),
        "symbols": symbols(),
        "calls": sweep(gpus, migs),
        "values": values(gpus),
    }
    if "--summary" in sys.argv[1:]:
        calls = doc["calls"].values()
        print(
            f"{doc['gpus']} GPUs, {doc['migs']} MIG devices; symbols bound {doc['symbols']['bound']}, "
            f"missing {len(doc['symbols']['missing'])}; getters {len(doc['calls'])}, "
            f"calls {sum(sum(o.values()) for o in calls)}; FunctionNotFound: "
            f"{sum(1 for o in calls if 'FunctionNotFound' in o)} getters, "
            f"{sum(o.get('FunctionNotFound', 0) for o in calls)} calls; "
            f"answered with a value or NOT_SUPPORTED: {sum(o.get('ok', 0) + o.get('NotSupported', 0) for o in calls)} calls"
        )
        return
    print(json.dumps(doc, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
