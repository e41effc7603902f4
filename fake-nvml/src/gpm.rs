//! GPM (GPU performance monitoring): samples record which device or MIG instance they
//! were taken on and when; metrics come from the model's [`GpmReading`] at the second
//! sample's instant (the model's ratios are instantaneous, so no differencing).

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, GPU_IS_LOST, INVALID_ARGUMENT, InOut, NOT_FOUND, NOT_SUPPORTED, Out,
};
use crate::state::{Dev, Sim, device_call, system_call};
use gpu_sim::{Capability, GpmReading};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, c_uint};

/// A GPM sample: `(gpu, MIG instance, scenario time)` once taken.
#[derive(Default)]
pub(crate) struct GpmSample {
    taken: Option<(u32, Option<usize>, f64)>,
}

/// A metric the model answers: ID, names, unit and how to read it.
struct Metric {
    id: c_uint,
    short: &'static CStr,
    long: &'static CStr,
    unit: &'static CStr,
    value: fn(&GpmReading) -> f64,
}

/// `ANY_TENSOR_UTIL` reports the HMMA ratio (the model's only tensor work); integer,
/// DFMA and IMMA, NVLink and the engine metrics are not modelled (`NOT_SUPPORTED`).
const METRICS: &[Metric] = &[
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
        short: c"gr_util",
        long: c"graphics utilization",
        unit: c"%",
        value: |g| g.graphics_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
        short: c"sm_util",
        long: c"SM utilization",
        unit: c"%",
        value: |g| g.sm_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY,
        short: c"sm_occupancy",
        long: c"SM occupancy",
        unit: c"%",
        value: |g| g.sm_occupancy,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        short: c"any_tensor_util",
        long: c"any tensor utilization",
        unit: c"%",
        value: |g| g.hmma_tensor_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
        short: c"hmma_tensor_util",
        long: c"HMMA tensor utilization",
        unit: c"%",
        value: |g| g.hmma_tensor_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
        short: c"dram_bw_util",
        long: c"DRAM bandwidth utilization",
        unit: c"%",
        value: |g| g.dram_bw_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL,
        short: c"fp64_util",
        long: c"FP64 utilization",
        unit: c"%",
        value: |g| g.fp64_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL,
        short: c"fp32_util",
        long: c"FP32 utilization",
        unit: c"%",
        value: |g| g.fp32_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL,
        short: c"fp16_util",
        long: c"FP16 utilization",
        unit: c"%",
        value: |g| g.fp16_util,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        short: c"pcie_tx",
        long: c"PCIe TX bandwidth",
        unit: c"MiB/sec",
        value: |g| g.pcie_tx_mib_s,
    },
    Metric {
        id: nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        short: c"pcie_rx",
        long: c"PCIe RX bandwidth",
        unit: c"MiB/sec",
        value: |g| g.pcie_rx_mib_s,
    },
];

/// GPM needs a model with GPM and a scenario that does not switch it off.
fn gpm_supported(d: &Dev) -> Result<(), nvmlReturn_t> {
    d.require(Capability::Gpm)?;
    if !d.gpu.gpm {
        return Err(NOT_SUPPORTED);
    }
    Ok(())
}

/// Record a sample of `(gpu, mig)` at the call's instant.
fn take(d: &Dev, sample: nvmlGpmSample_t, mig: Option<usize>) -> Result<(), nvmlReturn_t> {
    d.sim
        .gpm_samples
        .with(sample as usize, |s| s.taken = Some((d.index, mig, d.t)))
        .ok_or(INVALID_ARGUMENT)
}

/// `NOT_SUPPORTED` on GPUs without GPM (rather than success with `isSupportedDevice = 0`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    gpmSupport: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmQueryDeviceSupport");
    // SAFETY: NVML contract: `gpmSupport` is null or a valid struct whose version is set.
    let io = unsafe { InOut::new(gpmSupport) };
    device_call(device, |d| {
        let s = io.get()?;
        if s.version != NVML_GPM_SUPPORT_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        gpm_supported(d)?;
        s.isSupportedDevice = 1;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(gpmSample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmSampleAlloc");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(gpmSample) };
    system_call(|sim, _| {
        if out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        out.set(sim.gpm_samples.insert(GpmSample::default()) as nvmlGpmSample_t)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(gpmSample: nvmlGpmSample_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmSampleFree");
    system_call(|sim, _| {
        sim.gpm_samples
            .remove(gpmSample as usize)
            .map(drop)
            .ok_or(INVALID_ARGUMENT)
    })
}

/// On a GPU handle: the whole GPU; on a MIG handle: that instance.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    gpmSample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmSampleGet");
    device_call(device, |d| {
        gpm_supported(d)?;
        take(d, gpmSample, d.mig)
    })
}

/// On the parent GPU's handle, for the instance with this GPU-instance ID.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpuInstanceId: c_uint,
    gpmSample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmMigSampleGet");
    device_call(device, |d| {
        d.whole_gpu()?;
        gpm_supported(d)?;
        let m = d
            .gpu
            .mig
            .iter()
            .position(|m| m.gpu_instance_id == gpuInstanceId)
            .ok_or(NOT_FOUND)?;
        take(d, gpmSample, Some(m))
    })
}

fn sample(sim: &Sim, s: nvmlGpmSample_t) -> Result<(u32, Option<usize>, f64), nvmlReturn_t> {
    sim.gpm_samples
        .with(s as usize, |s| s.taken)
        .flatten()
        .ok_or(INVALID_ARGUMENT)
}

/// Both samples must have been taken on the same GPU or instance.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(metricsGet: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmMetricsGet");
    // SAFETY: NVML contract: `metricsGet` is null or a valid request the caller filled.
    let io = unsafe { InOut::new(metricsGet) };
    system_call(|sim, t| {
        let req = io.get()?;
        if req.version != NVML_GPM_METRICS_GET_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let n = req.numMetrics as usize;
        if n > req.metrics.len() {
            return Err(INVALID_ARGUMENT);
        }
        // A real driver's time depends on the metrics asked (on an H100, 1.24 ms for
        // the graphics engine's activity, 3.4 µs for any other).
        crate::calls::count_items!("nvmlGpmMetricsGet.metrics", n as u64);
        crate::cost::charge_gpm_metrics(req.metrics[..n].iter().map(|m| m.metricId));
        let (gpu, mig, _) = sample(sim, req.sample1)?;
        let (gpu2, mig2, t2) = sample(sim, req.sample2)?;
        if (gpu, mig) != (gpu2, mig2) {
            return Err(INVALID_ARGUMENT);
        }
        if sim.node.gpu_lost(gpu, t) {
            return Err(GPU_IS_LOST);
        }
        let reading = match mig {
            Some(m) => sim.node.mig_reading(gpu, m, t2).gpm,
            None => sim.node.gpu_reading(gpu, t2).gpm,
        }
        .ok_or(NOT_SUPPORTED)?;
        for m in &mut req.metrics[..n] {
            let known = METRICS.iter().find(|k| k.id == m.metricId);
            let name = |s: Option<&'static CStr>| {
                s.map_or(std::ptr::null_mut(), |s| s.as_ptr().cast_mut())
            };
            m.metricInfo.shortName = name(known.map(|k| k.short));
            m.metricInfo.longName = name(known.map(|k| k.long));
            m.metricInfo.unit = name(known.map(|k| k.unit));
            match known {
                Some(k) => {
                    m.value = (k.value)(&reading);
                    m.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                }
                None => {
                    m.value = 0.0;
                    m.nvmlReturn = NOT_SUPPORTED;
                }
            }
        }
        Ok(())
    })
}

/// GPM streaming is off.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryIfStreamingEnabled(
    device: nvmlDevice_t,
    state: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlGpmQueryIfStreamingEnabled");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(state) };
    device_call(device, |d| {
        d.whole_gpu()?;
        out.set(0)
    })
}
