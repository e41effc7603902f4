#!/usr/bin/env python3
"""Read every GPU and MIG instance through pynvml (PyPI package nvidia-ml-py) from
whatever libnvidia-ml.so.1 the dynamic loader finds, and print one JSON document.

Used by tests/tests/e2e/nvml_fidelity.rs as an independent NVML client: its numbers must
equal the exporter's for the same (frozen) instant after unit conversion.

Each reading is its value, `null` when NVML answers NOT_SUPPORTED, or
`{"error": "<NVML error string>", "code": <nvmlReturn_t>}` for any other error (for
example GPU_IS_LOST on a GPU that fell off the bus). Exits non-zero only when pynvml
cannot be imported or NVML cannot be initialised.
"""

import json
import sys

try:
    import pynvml
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"cannot import pynvml ({e}); run tests/setup.sh", file=sys.stderr)
    sys.exit(2)


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def read(fn, *args):
    """Call fn; NOT_SUPPORTED -> None, any other NVML error -> {"error", "code"}."""
    try:
        return fn(*args)
    except pynvml.NVMLError_NotSupported:
        return None
    except pynvml.NVMLError as e:
        return {"error": str(e), "code": e.value}


def ok(v):
    return not (v is None or (isinstance(v, dict) and "error" in v))


def mapped(v, f):
    return f(v) if ok(v) else v


def memory_v1(handle):
    return mapped(
        read(pynvml.nvmlDeviceGetMemoryInfo, handle),
        lambda m: {"total": m.total, "free": m.free, "used": m.used},
    )


def memory_v2(handle):
    return mapped(
        read(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2),
        lambda m: {
            "total": m.total,
            "free": m.free,
            "used": m.used,
            "reserved": m.reserved,
        },
    )


def processes(handle):
    return mapped(
        read(pynvml.nvmlDeviceGetComputeRunningProcesses, handle),
        lambda ps: [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory} for p in ps],
    )


def field_value(handle, field_id):
    """One nvmlDeviceGetFieldValues reading, decoded by its value type."""

    def decode(values):
        v = values[0]
        if v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        if v.nvmlReturn != pynvml.NVML_SUCCESS:
            return {"error": str(pynvml.NVMLError(v.nvmlReturn)), "code": v.nvmlReturn}
        member = {
            pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
            pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            getattr(pynvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        }.get(v.valueType)
        if member is None:
            return {"error": f"unknown value type {v.valueType}", "code": -1}
        return getattr(v.value, member)

    return mapped(read(pynvml.nvmlDeviceGetFieldValues, handle, [field_id]), decode)


def ecc_totals(handle):
    out = {}
    for name, err, counter in [
        ("corrected_volatile", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
        ("uncorrected_volatile", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
        ("corrected_aggregate", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
        ("uncorrected_aggregate", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
    ]:
        out[name] = read(pynvml.nvmlDeviceGetTotalEccErrors, handle, err, counter)
    return out


def fabric(handle):
    """nvmlDeviceGetGpuFabricInfoV with a v3 struct (health mask and summary)."""

    def get(h):
        info = pynvml.c_nvmlGpuFabricInfo_v3_t()
        info.version = pynvml.nvmlGpuFabricInfo_v3
        pynvml.nvmlDeviceGetGpuFabricInfoV(h, pynvml.byref(info))
        return {
            "state": info.state & 0xFF,
            "status": info.status,
            "clique_id": info.cliqueId,
            "health_mask": info.healthMask,
            "health_summary": info.healthSummary,
        }

    return read(get, handle)


def nvlink_states(handle):
    """nvmlDeviceGetNvLinkState of each link until NVML says there is no such link."""
    states = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            states.append(pynvml.nvmlDeviceGetNvLinkState(handle, link))
        except pynvml.NVMLError_NotSupported:
            return None if not states else states
        except pynvml.NVMLError_InvalidArgument:
            break
        except pynvml.NVMLError as e:
            return {"error": str(e), "code": e.value}
    return states


def mig_instances(handle):
    count = read(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
    if not ok(count):
        return count
    out = []
    for i in range(count):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError_NotFound:
            continue
        except pynvml.NVMLError_NotSupported:
            return None
        except pynvml.NVMLError as e:
            out.append({"index": i, "error": str(e), "code": e.value})
            continue
        out.append(
            {
                "index": i,
                "gpu_instance_id": read(pynvml.nvmlDeviceGetGpuInstanceId, mig),
                "uuid": read(lambda h: _text(pynvml.nvmlDeviceGetUUID(h)), mig),
                "memory_v1": memory_v1(mig),
                "memory_v2": memory_v2(mig),
                "processes": processes(mig),
            }
        )
    return out


def read_gpu(index):
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as e:
        return {"index": index, "handle": {"error": str(e), "code": e.value}}
    util = mapped(
        read(pynvml.nvmlDeviceGetUtilizationRates, handle),
        lambda u: {"gpu": u.gpu, "memory": u.memory},
    )
    remapped = mapped(
        read(pynvml.nvmlDeviceGetRemappedRows, handle),
        lambda r: {"correctable": r[0], "uncorrectable": r[1], "pending": r[2], "failure": r[3]},
    )
    mig_mode = read(pynvml.nvmlDeviceGetMigMode, handle)
    gpu = {
        "index": index,
        "name": read(lambda h: _text(pynvml.nvmlDeviceGetName(h)), handle),
        "uuid": read(lambda h: _text(pynvml.nvmlDeviceGetUUID(h)), handle),
        "pci_bus_id": mapped(
            read(pynvml.nvmlDeviceGetPciInfo_v3, handle), lambda p: _text(p.busId)
        ),
        "memory_v1": memory_v1(handle),
        "memory_v2": memory_v2(handle),
        "utilization": util,
        "encoder_util": mapped(read(pynvml.nvmlDeviceGetEncoderUtilization, handle), lambda v: v[0]),
        "decoder_util": mapped(read(pynvml.nvmlDeviceGetDecoderUtilization, handle), lambda v: v[0]),
        "power_mw": read(pynvml.nvmlDeviceGetPowerUsage, handle),
        "energy_mj": read(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle),
        "gpu_temp": read(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        "memory_temp": field_value(handle, pynvml.NVML_FI_DEV_MEMORY_TEMP),
        "sm_clock": read(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "mem_clock": read(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        "pcie_replay": read(pynvml.nvmlDeviceGetPcieReplayCounter, handle),
        "pcie_tx_kb_s": read(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx_kb_s": read(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        "ecc": ecc_totals(handle),
        "remapped_rows": remapped,
        "ecc_mode": mapped(
            read(pynvml.nvmlDeviceGetEccMode, handle),
            lambda m: {"current": m[0], "pending": m[1]},
        ),
        "recovery_action": field_value(handle, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
        "slowdown_temp": read(pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "shutdown_temp": read(pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        "gpu_max_op_temp": read(pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
        "mem_max_op_temp": read(pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
        "pstate": read(pynvml.nvmlDeviceGetPerformanceState, handle),
        "fan_speed": read(pynvml.nvmlDeviceGetFanSpeed, handle),
        "fabric": fabric(handle),
        "nvlink_states": nvlink_states(handle),
        "processes": processes(handle),
        "mig_mode": mapped(mig_mode, lambda m: {"current": m[0], "pending": m[1]}),
        "mig": None,
    }
    if ok(mig_mode) and mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
        gpu["mig"] = mig_instances(handle)
    return gpu


def main():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        print(f"nvmlInit failed: {e}", file=sys.stderr)
        return 1
    try:
        try:
            from importlib.metadata import version

            pynvml_version = version("nvidia-ml-py")
        except Exception:  # noqa: BLE001 - informational only
            pynvml_version = None
        doc = {
            "pynvml_version": pynvml_version,
            "driver_version": read(lambda: _text(pynvml.nvmlSystemGetDriverVersion())),
            "device_count": read(pynvml.nvmlDeviceGetCount),
            "gpus": [],
        }
        count = doc["device_count"]
        if ok(count):
            doc["gpus"] = [read_gpu(i) for i in range(count)]
        json.dump(doc, sys.stdout, indent=1, sort_keys=True)
        print()
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
