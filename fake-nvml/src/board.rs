//! Board identity and modes, power-limit range, thermal thresholds, BAR1, GSP,
//! confidential computing (off), accounting (off), encoder/FBC sessions (none) and
//! the other per-board facts, from the model's [`BoardFacts`].

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, CBuf, INVALID_ARGUMENT, InOut, NOT_FOUND, NOT_SUPPORTED, Out, Ret,
    fill_list, struct_version,
};
use crate::state::{Dev, device_call};
use gpu_sim::Capability;
use gpu_sim::models::BoardFacts;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

/// Processes the driver's accounting ring holds.
pub const ACCOUNTING_BUFFER_SIZE: u32 = 4000;
const MIB: u64 = 1 << 20;
/// Compute slices of a whole MIG-capable GPU.
const MIG_SLICES: u32 = 7;
/// BAR1 mapped by the driver itself and by each running process.
pub const BAR1_DRIVER_MIB: u64 = 1;
pub const BAR1_PER_PROCESS_MIB: u64 = 2;

/// The board facts of a whole GPU (`NOT_SUPPORTED` on a MIG handle).
pub(crate) fn board<'a>(d: &Dev<'a>) -> Result<&'a BoardFacts, Ret> {
    d.whole_gpu()?;
    Ok(&d.gpu.model.board)
}

/// The board's BAR1, or a MIG instance's share of it (its slices of seven), with the
/// mappings of the processes on it.
fn bar1(d: &Dev) -> Result<nvmlBAR1Memory_t, Ret> {
    let board_bar1 = d.gpu.model.board.bar1_mib * MIB;
    let (total, procs) = match d.mig {
        Some(m) => (
            board_bar1 / u64::from(MIG_SLICES) * u64::from(d.gpu.mig[m].profile.slices),
            d.node().mig_processes(d.index, m, d.t).len() as u64,
        ),
        None => (
            board_bar1,
            d.node().gpu_processes(d.index, d.t).len() as u64,
        ),
    };
    let used = (BAR1_DRIVER_MIB + BAR1_PER_PROCESS_MIB * procs) * MIB;
    Ok(nvmlBAR1Memory_t {
        bar1Total: total,
        bar1Free: total.saturating_sub(used),
        bar1Used: used.min(total),
    })
}

/// (lowest, highest) settable power limit, mW.
fn power_limits(d: &Dev) -> Result<(c_uint, c_uint), Ret> {
    let b = board(d)?;
    d.require(Capability::Power)?;
    Ok((b.min_power_limit_mw, d.gpu.model.power_limit_mw))
}

fn threshold(d: &Dev, kind: nvmlTemperatureThresholds_t) -> Result<c_uint, Ret> {
    let b = board(d)?;
    d.require(Capability::Temperature)?;
    Ok(match kind {
        nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => b.shutdown_temp_c,
        nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => b.slowdown_temp_c,
        nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_MEM_MAX => {
            b.memory_max_operating_temp_c
        }
        nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_GPU_MAX => {
            b.gpu_max_operating_temp_c
        }
        k if k < nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_COUNT => {
            return Err(NOT_SUPPORTED);
        }
        _ => return Err(INVALID_ARGUMENT),
    })
}

fn memory_error_counter(
    d: &Dev,
    error: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    location: nvmlMemoryLocation_t,
) -> Result<c_ulonglong, Ret> {
    let r = d.reading(Capability::Ecc)?;
    let value = match (error, counter) {
        (0, 0) => r.ecc_corrected_volatile,
        (1, 0) => r.ecc_uncorrected_volatile,
        (0, 1) => r.ecc_corrected_aggregate,
        (1, 1) => r.ecc_uncorrected_aggregate,
        _ => return Err(INVALID_ARGUMENT),
    };
    Ok(match location {
        l if l >= nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_COUNT => {
            return Err(INVALID_ARGUMENT);
        }
        l if !d.gpu.model.ecc_location_counted(l) => return Err(NOT_SUPPORTED),
        nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_DEVICE_MEMORY => value,
        l if l < nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_COUNT => 0,
        _ => return Err(INVALID_ARGUMENT),
    })
}

/// Domains GPU, frame buffer, video (decoder) and bus (PCIe share of 32 GB/s).
fn dynamic_pstates(d: &Dev) -> Result<nvmlGpuDynamicPstatesInfo_t, Ret> {
    let r = d.reading(Capability::Utilization)?;
    let domain = |percentage: u32| nvmlGpuDynamicPstatesInfo_st__bindgen_ty_1 {
        bIsPresent: 1,
        percentage,
        incThreshold: 0,
        decThreshold: 0,
    };
    let absent = nvmlGpuDynamicPstatesInfo_st__bindgen_ty_1 {
        bIsPresent: 0,
        percentage: 0,
        incThreshold: 0,
        decThreshold: 0,
    };
    let mut info = nvmlGpuDynamicPstatesInfo_t {
        flags: 0,
        utilization: [absent; 8],
    };
    info.utilization[0] = domain(r.gpu_util_percent.ok_or(NOT_SUPPORTED)?);
    info.utilization[1] = domain(r.memory_util_percent.ok_or(NOT_SUPPORTED)?);
    info.utilization[2] = domain(r.decoder_percent);
    info.utilization[3] = domain(0);
    Ok(info)
}

/// Both restricted APIs need root, as the driver ships.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAPIRestriction(
    device: nvmlDevice_t,
    apiType: nvmlRestrictedAPI_t,
    isRestricted: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAPIRestriction");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(isRestricted) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            match apiType {
                // Hopper has no settable application clocks to restrict (H100, 580.159.04).
                nvmlRestrictedAPI_enum_NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS
                    if d.gpu.model.architecture >= gpu_sim::models::ARCH_HOPPER =>
                {
                    return Err(NOT_SUPPORTED);
                }
                nvmlRestrictedAPI_enum_NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS
                | nvmlRestrictedAPI_enum_NVML_RESTRICTED_API_SET_AUTO_BOOSTED_CLOCKS => {
                    nvmlEnableState_enum_NVML_FEATURE_ENABLED
                }
                _ => return Err(INVALID_ARGUMENT),
            }
        })
    })
}

/// The driver's accounting ring holds 4,000 processes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingBufferSize(
    device: nvmlDevice_t,
    bufferSize: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAccountingBufferSize");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(bufferSize) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            ACCOUNTING_BUFFER_SIZE
        })
    })
}

/// Disabled: no display on an SXM board, accounting off by default.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingMode(
    device: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAccountingMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(mode) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlEnableState_enum_NVML_FEATURE_DISABLED
        })
    })
}

/// Accounting is off: no accounted processes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(
    device: nvmlDevice_t,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAccountingPids");
    device_call(device, |d| {
        board(d)?;
        // SAFETY: NVML contract: `count` is valid and `pids` is null or holds `*count` entries.
        unsafe { fill_list::<c_uint>(count, pids, &[]) }
    })
}

/// Accounting is off, so no process has statistics: `NOT_FOUND` once the handle and
/// the out-pointer check out.
fn no_accounting_stats(device: nvmlDevice_t, out_is_null: bool) -> nvmlReturn_t {
    device_call(device, |d| {
        board(d)?;
        if out_is_null {
            return Err(INVALID_ARGUMENT);
        }
        Err(NOT_FOUND)
    })
}

/// Accounting is off: no process has statistics (`NOT_FOUND`), as for the v1 call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats_v2(
    device: nvmlDevice_t,
    data: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAccountingStats_v2");
    no_accounting_stats(device, data.is_null())
}

/// Accounting is off: no process has statistics (`NOT_FOUND`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(
    device: nvmlDevice_t,
    _pid: c_uint,
    stats: *mut nvmlAccountingStats_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetAccountingStats");
    no_accounting_stats(device, stats.is_null())
}

/// The board's BAR1 aperture (a MIG instance: its share); each running process maps 2 MiB
/// of it and the driver 1 MiB.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    device: nvmlDevice_t,
    bar1Memory: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBAR1MemoryInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(bar1Memory) };
    device_call(device, |d| out.set(bar1(d)?))
}

/// Derived from the PCI location, as the driver does: `domain << 16 | bus << 8 | device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBoardId(
    device: nvmlDevice_t,
    boardId: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBoardId");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(boardId) };
    device_call(device, |d| {
        out.set({
            let p = crate::device::pci_info(d)?;
            p.domain << 16 | p.bus << 8 | p.device
        })
    })
}

/// The model's board part number.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(
    device: nvmlDevice_t,
    partNumber: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBoardPartNumber");
    // SAFETY: NVML contract: `partNumber` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(partNumber, length) };
    device_call(device, |d| buf.put_str(board(d)?.part_number))
}

/// `DEFAULT`: several contexts may share the GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetComputeMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(mode) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT
        })
    })
}

/// Confidential computing is off: no protected memory, all of it unprotected.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeMemSizeInfo(
    device: nvmlDevice_t,
    memInfo: *mut nvmlConfComputeMemSizeInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetConfComputeMemSizeInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(memInfo) };
    device_call(device, |d| {
        out.set(nvmlConfComputeMemSizeInfo_t {
            protectedMemSizeKib: 0,
            unprotectedMemSizeKib: {
                board(d)?;
                d.gpu.model.memory_total_mib * 1024
            },
        })
    })
}

/// Confidential computing is off: no protected memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeProtectedMemoryUsage(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetConfComputeProtectedMemoryUsage");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(memory) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlMemory_t {
                total: 0,
                free: 0,
                used: 0,
            }
        })
    })
}

/// The model's compute capability.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCudaComputeCapability");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (a, b) = unsafe { (Out::new(major), Out::new(minor)) };
    device_call(device, |d| {
        let (maj, min) = board(d)?.cuda_capability;
        if a.is_null() || b.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        a.set(maj)?;
        b.set(min)
    })
}

/// Enabled, as on a data-centre node.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDefaultEccMode(
    device: nvmlDevice_t,
    defaultMode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDefaultEccMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(defaultMode) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlEnableState_enum_NVML_FEATURE_ENABLED
        })
    })
}

/// Disabled: no display on an SXM board, accounting off by default.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(
    device: nvmlDevice_t,
    isActive: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDisplayActive");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(isActive) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlEnableState_enum_NVML_FEATURE_DISABLED
        })
    })
}

/// Disabled: no display on an SXM board, accounting off by default.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    device: nvmlDevice_t,
    display: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDisplayMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(display) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlEnableState_enum_NVML_FEATURE_DISABLED
        })
    })
}

/// Utilisation of the GPU, frame buffer, video engine and bus domains.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDynamicPstatesInfo(
    device: nvmlDevice_t,
    pDynamicPstatesInfo: *mut nvmlGpuDynamicPstatesInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDynamicPstatesInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pDynamicPstatesInfo) };
    device_call(device, |d| out.set(dynamic_pstates(d)?))
}

/// ECC on, now and after reboot, unless the scenario marks ECC unsupported or a fault
/// makes a mode change pending.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut nvmlEnableState_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetEccMode");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (a, b) = unsafe { (Out::new(current), Out::new(pending)) };
    device_call(device, |d| {
        let r = d.reading(Capability::Ecc)?;
        if a.is_null() || b.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mode = |on: bool| {
            if on {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            }
        };
        a.set(mode(r.ecc_mode_current))?;
        b.set(mode(r.ecc_mode_pending))
    })
}

/// H100 has no NVENC: no encoder capacity.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderCapacity(
    device: nvmlDevice_t,
    encoderQueryType: nvmlEncoderType_t,
    encoderCapacity: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetEncoderCapacity");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(encoderCapacity) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            if encoderQueryType > nvmlEncoderQueryType_enum_NVML_ENCODER_QUERY_AV1 {
                return Err(INVALID_ARGUMENT);
            }
            if encoderQueryType == nvmlEncoderQueryType_enum_NVML_ENCODER_QUERY_AV1
                && !d.gpu.model.av1_encoder()
            {
                return Err(NOT_SUPPORTED);
            }
            0
        })
    })
}

/// No encoder sessions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderSessions(
    device: nvmlDevice_t,
    sessionCount: *mut c_uint,
    sessionInfos: *mut nvmlEncoderSessionInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetEncoderSessions");
    device_call(device, |d| {
        board(d)?;
        // SAFETY: NVML contract: `sessionCount` is valid and `sessionInfos` is null or holds `*sessionCount` entries.
        unsafe { fill_list::<nvmlEncoderSessionInfo_t>(sessionCount, sessionInfos, &[]) }
    })
}

/// No encoder sessions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderStats(
    device: nvmlDevice_t,
    sessionCount: *mut c_uint,
    averageFps: *mut c_uint,
    averageLatency: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetEncoderStats");
    // SAFETY: NVML contract: the three out-pointers are null or valid for writes.
    let outs = unsafe {
        [
            Out::new(sessionCount),
            Out::new(averageFps),
            Out::new(averageLatency),
        ]
    };
    device_call(device, |d| {
        board(d)?;
        if outs.iter().any(Out::is_null) {
            return Err(INVALID_ARGUMENT);
        }
        outs.into_iter().try_for_each(|o| o.set(0))
    })
}

/// No frame-buffer-capture sessions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFBCSessions(
    device: nvmlDevice_t,
    sessionCount: *mut c_uint,
    sessionInfo: *mut nvmlFBCSessionInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetFBCSessions");
    device_call(device, |d| {
        board(d)?;
        // SAFETY: NVML contract: `sessionCount` is valid and `sessionInfo` is null or holds `*sessionCount` entries.
        unsafe { fill_list::<nvmlFBCSessionInfo_t>(sessionCount, sessionInfo, &[]) }
    })
}

/// No frame-buffer-capture sessions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFBCStats(
    device: nvmlDevice_t,
    fbcStats: *mut nvmlFBCStats_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetFBCStats");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(fbcStats) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlFBCStats_t {
                sessionsCount: 0,
                averageFPS: 0,
                averageLatency: 0,
            }
        })
    })
}

/// GSP firmware on, by default too (Hopper runs it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGspFirmwareMode(
    device: nvmlDevice_t,
    isEnabled: *mut c_uint,
    defaultMode: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGspFirmwareMode");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (a, b) = unsafe { (Out::new(isEnabled), Out::new(defaultMode)) };
    device_call(device, |d| {
        board(d)?;
        if a.is_null() || b.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        a.set(1)?;
        b.set(1)
    })
}

/// The GSP firmware ships with the driver: its version is the driver version.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGspFirmwareVersion(
    device: nvmlDevice_t,
    version: *mut c_char,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGspFirmwareVersion");
    // SAFETY: NVML contract: `version` is null or valid for `NVML_GSP_FIRMWARE_VERSION_BUF_SIZE` bytes.
    let buf = unsafe { CBuf::new(version, NVML_GSP_FIRMWARE_VERSION_BUF_SIZE) };
    device_call(device, |d| {
        board(d)?;
        buf.put_str(&d.node().driver_version)
    })
}

/// A checksum of the board serial, stable per board.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetInforomConfigurationChecksum(
    device: nvmlDevice_t,
    checksum: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetInforomConfigurationChecksum");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(checksum) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            d.gpu.serial.bytes().fold(0x811C_9DC5_u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            })
        })
    })
}

/// An engine the model does not simulate (JPEG, OFA): idle, 0 %, over the usual
/// sampling period.
///
/// # Safety
/// Both pointers are null or valid for writing one `c_uint`.
unsafe fn idle_engine(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: per this function's contract.
    let (a, b) = unsafe { (Out::new(utilization), Out::new(sampling_period_us)) };
    device_call(device, |d| {
        d.reading(Capability::Utilization)?;
        if a.is_null() || b.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        a.set(0)?;
        b.set(crate::device::CODEC_SAMPLING_PERIOD_US)
    })
}

/// Not modelled: idle (0 %) over the usual sampling period.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetJpgUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetJpgUtilization");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    unsafe { idle_engine(device, utilization, samplingPeriodUs) }
}

/// Distance from the GPU temperature to the slowdown threshold; the version word must
/// be `nvmlMarginTemperature_v1`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMarginTemperature(
    device: nvmlDevice_t,
    marginTempInfo: *mut nvmlMarginTemperature_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMarginTemperature");
    // SAFETY: NVML contract: `marginTempInfo` is null or valid for one struct whose version word the caller set.
    let io = unsafe { InOut::new(marginTempInfo) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlMarginTemperature_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let r = d.reading(Capability::Temperature)?;
        v.marginTemperature = board(d)?.slowdown_temp_c as c_int - r.gpu_temp_c as c_int;
        Ok(())
    })
}

/// The model's memory bus, bits.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryBusWidth(
    device: nvmlDevice_t,
    busWidth: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemoryBusWidth");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(busWidth) };
    device_call(device, |d| out.set(board(d)?.memory_bus_width_bits))
}

/// Device (HBM) memory carries the model's ECC totals; other locations have none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: nvmlDevice_t,
    errorType: nvmlMemoryErrorType_t,
    counterType: nvmlEccCounterType_t,
    locationType: nvmlMemoryLocation_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemoryErrorCounter");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(count) };
    device_call(device, |d| {
        out.set(memory_error_counter(
            d,
            errorType,
            counterType,
            locationType,
        )?)
    })
}

/// HGX module IDs count from 1 in GPU order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetModuleId(
    device: nvmlDevice_t,
    moduleId: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetModuleId");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(moduleId) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            d.index + 1
        })
    })
}

/// One GPU per SXM module.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    device: nvmlDevice_t,
    multiGpuBool: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMultiGpuBoard");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(multiGpuBool) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            0
        })
    })
}

/// The model's CUDA cores.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    device: nvmlDevice_t,
    numCores: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNumGpuCores");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(numCores) };
    device_call(device, |d| out.set(board(d)?.cuda_cores))
}

/// Not modelled: idle (0 %) over the usual sampling period.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetOfaUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetOfaUtilization");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    unsafe { idle_engine(device, utilization, samplingPeriodUs) }
}

/// Enabled, as on a data-centre node.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPersistenceMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(mode) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlEnableState_enum_NVML_FEATURE_ENABLED
        })
    })
}

/// The model's power limit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: nvmlDevice_t,
    defaultLimit: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerManagementDefaultLimit");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(defaultLimit) };
    device_call(device, |d| out.set(power_limits(d)?.1))
}

/// The model's lowest and highest settable limits.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: nvmlDevice_t,
    minLimit: *mut c_uint,
    maxLimit: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerManagementLimitConstraints");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (a, b) = unsafe { (Out::new(minLimit), Out::new(maxLimit)) };
    device_call(device, |d| {
        let (min, max) = power_limits(d)?;
        if a.is_null() || b.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        a.set(min)?;
        b.set(max)
    })
}

/// Enabled, as on a data-centre node.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementMode(
    device: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerManagementMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(mode) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlEnableState_enum_NVML_FEATURE_ENABLED
        })
    })
}

/// The model's shutdown, slowdown and maximum operating temperatures; acoustic and
/// GPS thresholds are `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    thresholdType: nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTemperatureThreshold");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(temp) };
    device_call(device, |d| out.set(threshold(d, thresholdType)?))
}

/// GPU sensor only; the version word must be `nvmlTemperature_v1`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    device: nvmlDevice_t,
    temperature: *mut nvmlTemperature_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTemperatureV");
    // SAFETY: NVML contract: `temperature` is null or valid for one struct whose version word the caller set.
    let io = unsafe { InOut::new(temperature) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlTemperature_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let r = d.reading(Capability::Temperature)?;
        if v.sensorType != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(NOT_SUPPORTED);
        }
        v.temperature = r.gpu_temp_c as c_int;
        Ok(())
    })
}

/// Bare metal: no virtualisation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    device: nvmlDevice_t,
    pVirtualMode: *mut nvmlGpuVirtualizationMode_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVirtualizationMode");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pVirtualMode) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            nvmlGpuVirtualizationMode_NVML_GPU_VIRTUALIZATION_MODE_NONE
        })
    })
}

/// The InfoROM is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceValidateInforom(device: nvmlDevice_t) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceValidateInforom");
    device_call(device, |d| board(d).map(drop))
}
