//! `nvmlDeviceGetFieldValues`: the field IDs the model can answer. Each requested field
//! gets its own `nvmlReturn`; unknown IDs (including 251–273, whose numbering changed
//! at driver 580.82) are `NOT_SUPPORTED`.

use crate::ffi::{INVALID_ARGUMENT, NOT_SUPPORTED, in_slice};
use crate::state::{Dev, device_call};
use gpu_sim::{Capability, GpuReading};
use nvml_wrapper_sys::bindings::field_id::*;
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_int;

/// `scopeId` meaning "all links" for NVLink fields.
pub const ALL_LINKS: u32 = u32::MAX;

/// A typed field value.
enum Value {
    U32(u32),
    U64(u64),
    I32(i32),
}

fn nvlink(d: &Dev) -> Result<(), nvmlReturn_t> {
    d.require(Capability::Nvlink)?;
    if d.gpu.model.nvlink_links == 0 {
        return Err(NOT_SUPPORTED);
    }
    Ok(())
}

/// The first driver branch that answers `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (field
/// 230): R570, the branch that introduced XID 154 "GPU recovery action changed"
/// (believed from NVIDIA's XID catalogue; not checked on a real driver). Older drivers
/// answer `NOT_SUPPORTED` for an ID they do not know.
pub const RECOVERY_ACTION_DRIVER: u32 = 570;

/// The major branch of the simulated driver (`"580.82.07"` → 580; 0 if unparsable).
fn driver_major(d: &Dev) -> u32 {
    let v = &d.node().driver_version;
    v.split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// The value of one field, or the per-field return code.
fn field(d: &Dev, r: &GpuReading, id: u32, scope: u32) -> Result<Value, nvmlReturn_t> {
    use Value::{I32, U32, U64};
    let need = |c: Capability| d.require(c);
    Ok(match id {
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL => {
            need(Capability::Ecc).map(|_| U64(r.ecc_corrected_volatile))?
        }
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL => {
            need(Capability::Ecc).map(|_| U64(r.ecc_uncorrected_volatile))?
        }
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL => {
            need(Capability::Ecc).map(|_| U64(r.ecc_corrected_aggregate))?
        }
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL => {
            need(Capability::Ecc).map(|_| U64(r.ecc_uncorrected_aggregate))?
        }
        NVML_FI_DEV_RETIRED_SBE => {
            need(Capability::RetiredPages).map(|_| U64(r.retired_single_bit))?
        }
        NVML_FI_DEV_RETIRED_DBE => {
            need(Capability::RetiredPages).map(|_| U64(r.retired_double_bit))?
        }
        NVML_FI_DEV_RETIRED_PENDING => {
            need(Capability::RetiredPages).map(|_| U32(r.retired_pending.into()))?
        }
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL => {
            nvlink(d).map(|_| U64(r.nvlink_errors[0]))?
        }
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL => {
            nvlink(d).map(|_| U64(r.nvlink_errors[1]))?
        }
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL => {
            nvlink(d).map(|_| U64(r.nvlink_errors[2]))?
        }
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL => {
            nvlink(d).map(|_| U64(r.nvlink_errors[3]))?
        }
        NVML_FI_DEV_PERF_POLICY_POWER..=NVML_FI_DEV_PERF_POLICY_RELIABILITY => {
            need(Capability::Violations)?;
            U64(r.violation_ns[(id - NVML_FI_DEV_PERF_POLICY_POWER) as usize])
        }
        NVML_FI_DEV_MEMORY_TEMP => {
            need(Capability::MemoryTemperature).map(|_| U32(r.memory_temp_c))?
        }
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => {
            need(Capability::Energy).map(|_| U64(r.energy_mj))?
        }
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX | NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => {
            nvlink(d)?;
            let total = if id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX {
                r.nvlink_tx_kib
            } else {
                r.nvlink_rx_kib
            };
            let links = d.gpu.model.nvlink_links;
            // The traffic runs over the links that are up, evenly.
            let up = u64::from(d.node().nvlinks_active(d.index, d.t).max(1));
            match scope {
                ALL_LINKS => U64(total),
                l if l < links && d.node().nvlink_active(d.index, l, d.t) => U64(total / up),
                l if l < links => U64(0),
                _ => return Err(INVALID_ARGUMENT),
            }
        }
        NVML_FI_DEV_REMAPPED_COR => {
            need(Capability::RemappedRows).map(|_| U32(r.remapped_correctable as u32))?
        }
        NVML_FI_DEV_REMAPPED_UNC => {
            need(Capability::RemappedRows).map(|_| U32(r.remapped_uncorrectable as u32))?
        }
        NVML_FI_DEV_REMAPPED_PENDING => {
            need(Capability::RemappedRows).map(|_| U32(r.remap_pending.into()))?
        }
        NVML_FI_DEV_REMAPPED_FAILURE => {
            need(Capability::RemappedRows).map(|_| U32(r.remap_failure.into()))?
        }
        NVML_FI_DEV_NVLINK_LINK_COUNT => nvlink(d).map(|_| U32(d.gpu.model.nvlink_links))?,
        NVML_FI_DEV_NVLINK_GET_STATE => {
            nvlink(d)?;
            // NVML_NVLINK_STATE_ACTIVE (1) or _INACTIVE (0).
            match scope {
                l if l < d.gpu.model.nvlink_links => {
                    U32(d.node().nvlink_active(d.index, l, d.t).into())
                }
                _ => return Err(INVALID_ARGUMENT),
            }
        }
        NVML_FI_DEV_NVLINK_GET_VERSION => {
            nvlink(d)?;
            U32(d.gpu.model.board.nvlink_version)
        }
        NVML_FI_DEV_ECC_CURRENT => need(Capability::Ecc).map(|_| U32(r.ecc_mode_current.into()))?,
        NVML_FI_DEV_ECC_PENDING => need(Capability::Ecc).map(|_| U32(r.ecc_mode_pending.into()))?,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => {
            if driver_major(d) < RECOVERY_ACTION_DRIVER {
                return Err(NOT_SUPPORTED);
            }
            U32(r.recovery_action)
        }
        NVML_FI_DEV_PCIE_REPLAY_COUNTER => {
            need(Capability::PcieReplay).map(|_| U64(r.pcie_replay))?
        }
        NVML_FI_DEV_POWER_INSTANT | NVML_FI_DEV_POWER_AVERAGE => {
            need(Capability::Power).map(|_| U32(r.power_mw))?
        }
        // In T.Limit terms, as a real driver answers them: signed degrees between the
        // GPU's T.Limit (its maximum operating temperature) and the threshold. A real
        // H100 80GB HBM3 (driver 580.159.04) answers -8, -2, 0 and 0
        // (tests/fixtures/real-gpu/h100-80gb-hbm3-580.159.04/nvidia-smi-q.xml), not the
        // °C of `nvmlDeviceGetTemperatureThreshold`.
        NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT
        | NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT
        | NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT
        | NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT => {
            need(Capability::Temperature)?;
            let b = &d.gpu.model.board;
            let tlimit = b.gpu_max_operating_temp_c as i32;
            I32(match id {
                NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT => tlimit - b.shutdown_temp_c as i32,
                NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT => tlimit - b.slowdown_temp_c as i32,
                _ => 0,
            })
        }
        _ => return Err(NOT_SUPPORTED),
    })
}

/// Whole-GPU only (`NOT_SUPPORTED` on a MIG handle). The call succeeds as long as the
/// device answers; each field carries its own result, the scenario instant as its
/// timestamp (µs since the Unix epoch) and zero latency.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    valuesCount: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetFieldValues");
    // SAFETY: NVML contract: `values` is null or holds `valuesCount` initialised entries
    // (the caller sets `fieldId` and `scopeId` of each).
    let fields = unsafe { in_slice(values, usize::try_from(valuesCount).unwrap_or(0)) };
    if let Some(f) = &fields {
        // What a request costs grows with its fields (the energy counter's alone is ms).
        crate::calls::count_items!("nvmlDeviceGetFieldValues.fields", f.len() as u64);
        crate::cost::charge_fields(f.iter().map(|f| f.fieldId));
    }
    device_call(device, |d| {
        d.whole_gpu()?;
        let fields = fields.filter(|_| valuesCount > 0).ok_or(INVALID_ARGUMENT)?;
        let r = d.node().gpu_reading(d.index, d.t);
        let ts = d.timestamp_us();
        for f in fields {
            f.timestamp = ts;
            f.latencyUsec = 0;
            match field(d, &r, f.fieldId, f.scopeId) {
                Ok(Value::U32(v)) => {
                    f.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                    f.value = nvmlValue_t { ullVal: 0 };
                    f.value.uiVal = v;
                    f.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                }
                Ok(Value::I32(v)) => {
                    f.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT;
                    f.value = nvmlValue_t { ullVal: 0 };
                    f.value.siVal = v;
                    f.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                }
                Ok(Value::U64(v)) => {
                    f.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    f.value = nvmlValue_t { ullVal: v };
                    f.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                }
                Err(code) => {
                    f.value = nvmlValue_t { ullVal: 0 };
                    f.nvmlReturn = code;
                }
            }
        }
        Ok(())
    })
}
