//! Identity and telemetry of a device: everything answered from one [`GpuReading`]
//! (or from a MIG instance's [`gpu_sim::MigReading`] where NVML answers per instance).

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, CBuf, INVALID_ARGUMENT, NOT_SUPPORTED, Out, fill_list,
    put_array_str, struct_version,
};
use crate::state::{Dev, device_call};
use gpu_sim::{Capability, Fault, GpuReading, InforomObject, MemoryReading};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_char, c_uint, c_ulonglong};

/// `pciSubSystemId` reported for every board (an HGX H100 SXM5 baseboard's).
pub const PCI_SUBSYSTEM_ID: u32 = 0x16C1_10DE;
/// VBIOS version reported for every board.
/// Sampling period reported with encoder/decoder utilisation, µs.
pub const CODEC_SAMPLING_PERIOD_US: u32 = 1_000_000;
/// Clock-event reasons every board claims to support (bits 0x1..0x100 of NVML's mask).
pub const SUPPORTED_CLOCK_EVENT_REASONS: u64 = 0x1FF;

/// `(domain, bus, device, function)` of a PCI bus ID such as `00000000:5B:00.0`,
/// `0000:5B:00.0` or `5B:00.0`.
pub(crate) fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let mut parts = s.trim().rsplit(':');
    let (dev, func) = parts.next()?.split_once('.')?;
    let bus = parts.next()?;
    let domain = parts.next().unwrap_or("0");
    if parts.next().is_some() {
        return None;
    }
    let hex = |x: &str| u32::from_str_radix(x, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(dev)?, hex(func)?))
}

/// Memory of the device or instance behind the handle.
fn memory_of(d: &Dev) -> MemoryReading {
    match d.mig {
        Some(m) => d.node().mig_reading(d.index, m, d.t).memory,
        None => d.node().gpu_reading(d.index, d.t).memory,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetName");
    // SAFETY: NVML contract: `name` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(name, length) };
    device_call(device, |d| match d.mig_instance() {
        Some(m) => buf.put_str(&format!("{} MIG {}", d.gpu.model.name, m.profile.name)),
        None => buf.put_str(d.gpu.model.name),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetUUID");
    // SAFETY: NVML contract: `uuid` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(uuid, length) };
    device_call(device, |d| {
        buf.put_str(d.mig_instance().map_or(&d.gpu.uuid, |m| &m.uuid))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSerial");
    // SAFETY: NVML contract: `serial` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(serial, length) };
    device_call(device, |d| {
        d.whole_gpu()?;
        buf.put_str(&d.gpu.serial)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetVbiosVersion");
    // SAFETY: NVML contract: `version` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(version, length) };
    device_call(device, |d| {
        d.whole_gpu()?;
        buf.put_str(d.gpu.vbios_version())
    })
}

/// OEM and ECC objects have versions; the power object is `NOT_SUPPORTED`, as on
/// data-centre boards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(
    device: nvmlDevice_t,
    object: nvmlInforomObject_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetInforomVersion");
    // SAFETY: NVML contract: `version` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(version, length) };
    device_call(device, |d| {
        d.whole_gpu()?;
        let object = match object {
            nvmlInforomObject_enum_NVML_INFOROM_OEM => InforomObject::Oem,
            nvmlInforomObject_enum_NVML_INFOROM_ECC => InforomObject::Ecc,
            nvmlInforomObject_enum_NVML_INFOROM_POWER => InforomObject::Power,
            _ => return Err(INVALID_ARGUMENT),
        };
        buf.put_str(d.gpu.inforom_version(object).ok_or(NOT_SUPPORTED)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetInforomImageVersion(
    device: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetInforomImageVersion");
    // SAFETY: NVML contract: `version` is null or valid for `length` bytes.
    let buf = unsafe { CBuf::new(version, length) };
    device_call(device, |d| {
        d.whole_gpu()?;
        buf.put_str(d.gpu.inforom_image_version())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetIndex");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(index) };
    device_call(device, |d| {
        d.whole_gpu()?;
        out.set(d.index)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMinorNumber");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(minorNumber) };
    device_call(device, |d| {
        d.whole_gpu()?;
        out.set(d.gpu.minor_number)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    type_: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBrand");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(type_) };
    device_call(device, |d| out.set(d.gpu.model.brand))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetArchitecture");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(arch) };
    device_call(device, |d| out.set(d.gpu.model.architecture))
}

pub(crate) fn pci_info(d: &Dev) -> Result<nvmlPciInfo_t, nvmlReturn_t> {
    d.whole_gpu()?;
    let (domain, bus, dev, func) = parse_bus_id(&d.gpu.pci_bus_id).ok_or(INVALID_ARGUMENT)?;
    let mut p = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain,
        bus,
        device: dev,
        pciDeviceId: d.gpu.model.pci_device_id,
        pciSubSystemId: PCI_SUBSYSTEM_ID,
        busId: [0; 32],
    };
    let legacy = format!("{domain:04X}:{bus:02X}:{dev:02X}.{func:X}");
    put_array_str(&mut p.busIdLegacy, &legacy);
    put_array_str(&mut p.busId, &d.gpu.pci_bus_id);
    Ok(p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPciInfo_v3");
    // SAFETY: NVML contract: the out-pointer is null or valid for one `nvmlPciInfo_t`.
    let out = unsafe { Out::new(pci) };
    device_call(device, |d| out.set(pci_info(d)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPciInfo_v2");
    // SAFETY: `_v2` takes the same 68-byte struct as `_v3`.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// The original struct is 52 bytes: `busId[16]`, the five IDs, then four reserved words.
/// Only its first 36 bytes (which coincide with the current layout) are written, so a
/// v1 client's buffer is never overrun.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPciInfo");
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct PciInfoV1Prefix {
        bus_id: [c_char; 16],
        ids: [c_uint; 5],
    }
    // SAFETY: NVML contract: `pci` is null or valid for the v1 struct, which starts
    // with these 36 bytes.
    let out = unsafe { Out::new(pci.cast::<PciInfoV1Prefix>()) };
    device_call(device, |d| {
        let p = pci_info(d)?;
        out.set(PciInfoV1Prefix {
            bus_id: p.busIdLegacy,
            ids: [p.domain, p.bus, p.device, p.pciDeviceId, p.pciSubSystemId],
        })
    })
}

/// v1: `used` counts reserved memory, as the original API did.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemoryInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for one `nvmlMemory_t`.
    let out = unsafe { Out::new(memory) };
    device_call(device, |d| {
        let m = memory_of(d);
        out.set(nvmlMemory_t {
            total: m.total,
            free: m.free,
            used: m.total - m.free,
        })
    })
}

/// The version word must be `nvmlMemory_v2` (0x02000028).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMemoryInfo_v2");
    // SAFETY: NVML contract: `memory` is null or valid for one `nvmlMemory_v2_t` whose
    // version word the caller has set.
    let io = unsafe { crate::ffi::InOut::new(memory) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlMemory_v2_t>(2) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let m = memory_of(d);
        v.total = m.total;
        v.reserved = m.reserved;
        v.free = m.free;
        v.used = m.used;
        Ok(())
    })
}

/// `NOT_SUPPORTED` on MIG handles and on MIG-enabled GPUs (the model gives no value).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetUtilizationRates");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(utilization) };
    device_call(device, |d| {
        let r = d.reading(Capability::Utilization)?;
        out.set(nvmlUtilization_t {
            gpu: r.gpu_util_percent.ok_or(NOT_SUPPORTED)?,
            memory: r.memory_util_percent.ok_or(NOT_SUPPORTED)?,
        })
    })
}

fn codec_utilization(
    device: nvmlDevice_t,
    utilization: Out<c_uint>,
    period: Out<c_uint>,
    encoder: bool,
) -> nvmlReturn_t {
    device_call(device, |d| {
        if utilization.is_null() || period.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let value = if encoder {
            d.reading(Capability::EncoderUtilization)?.encoder_percent
        } else {
            d.reading(Capability::DecoderUtilization)?.decoder_percent
        };
        utilization.set(value)?;
        period.set(CODEC_SAMPLING_PERIOD_US)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetEncoderUtilization");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (u, p) = unsafe { (Out::new(utilization), Out::new(samplingPeriodUs)) };
    codec_utilization(device, u, p, true)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetDecoderUtilization");
    // SAFETY: NVML contract: both out-pointers are null or valid for writes.
    let (u, p) = unsafe { (Out::new(utilization), Out::new(samplingPeriodUs)) };
    codec_utilization(device, u, p, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerUsage");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(power) };
    device_call(device, |d| out.set(d.reading(Capability::Power)?.power_mw))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTotalEnergyConsumption");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(energy) };
    device_call(device, |d| {
        out.set(d.reading(Capability::Energy)?.energy_mj)
    })
}

fn power_limit(d: &Dev) -> Result<c_uint, nvmlReturn_t> {
    d.whole_gpu()?;
    d.require(Capability::Power)?;
    Ok(d.gpu.model.power_limit_mw)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetEnforcedPowerLimit");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(limit) };
    device_call(device, |d| out.set(power_limit(d)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPowerManagementLimit");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(limit) };
    device_call(device, |d| out.set(power_limit(d)?))
}

/// Only `NVML_TEMPERATURE_GPU`; other sensors are `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensorType: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTemperature");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(temp) };
    device_call(device, |d| {
        let r = d.reading(Capability::Temperature)?;
        if sensorType != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(NOT_SUPPORTED);
        }
        out.set(r.gpu_temp_c)
    })
}

/// The current or highest clock of a type (see `clocks.rs`).
fn clock(d: &Dev, type_: nvmlClockType_t, max: bool) -> Result<c_uint, nvmlReturn_t> {
    if max {
        crate::clocks::max_clock(d, type_)
    } else {
        crate::clocks::current_clock(d, type_)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock_mhz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetClockInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(clock_mhz) };
    device_call(device, |d| out.set(clock(d, type_, false)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock_mhz: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMaxClockInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(clock_mhz) };
    device_call(device, |d| out.set(clock(d, type_, true)?))
}

fn clock_reasons(device: nvmlDevice_t, out: Out<c_ulonglong>, supported: bool) -> nvmlReturn_t {
    device_call(device, |d| {
        let r = d.reading(Capability::ThrottleReasons)?;
        out.set(if supported {
            SUPPORTED_CLOCK_EVENT_REASONS
        } else {
            r.clock_event_reasons
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    clocksEventReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCurrentClocksEventReasons");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    clock_reasons(device, unsafe { Out::new(clocksEventReasons) }, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    clocksThrottleReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCurrentClocksThrottleReasons");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    clock_reasons(device, unsafe { Out::new(clocksThrottleReasons) }, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    device: nvmlDevice_t,
    supportedClocksEventReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSupportedClocksEventReasons");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    clock_reasons(
        device,
        unsafe { Out::new(supportedClocksEventReasons) },
        true,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: nvmlDevice_t,
    supportedClocksThrottleReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSupportedClocksThrottleReasons");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    clock_reasons(
        device,
        unsafe { Out::new(supportedClocksThrottleReasons) },
        true,
    )
}

/// Policies power..reliability (0–5); 6 and 7 are no `nvmlPerfPolicyType_t` value and
/// answer `INVALID_ARGUMENT`, as the real driver does (H100, 580.159.04).
/// `referenceTime` is the scenario instant in µs since the Unix epoch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetViolationStatus(
    device: nvmlDevice_t,
    perfPolicyType: nvmlPerfPolicyType_t,
    violTime: *mut nvmlViolationTime_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetViolationStatus");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(violTime) };
    device_call(device, |d| {
        let r = d.reading(Capability::Violations)?;
        let ns = match perfPolicyType as usize {
            p if p < r.violation_ns.len() => r.violation_ns[p],
            _ => return Err(INVALID_ARGUMENT),
        };
        out.set(nvmlViolationTime_t {
            referenceTime: d.timestamp_us() as u64,
            violationTime: ns,
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPcieReplayCounter");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(value) };
    device_call(device, |d| {
        let r = d.reading(Capability::PcieReplay)?;
        out.set(r.pcie_replay.min(u64::from(u32::MAX)) as c_uint)
    })
}

/// KB/s, answered at once (real NVML samples for 20 ms).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPcieThroughput");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(value) };
    device_call(device, |d| {
        let r = d.reading(Capability::PcieThroughput)?;
        out.set(match counter {
            nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => r.pcie_tx_kb_s,
            nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => r.pcie_rx_kb_s,
            _ => return Err(INVALID_ARGUMENT),
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    errorType: nvmlMemoryErrorType_t,
    counterType: nvmlEccCounterType_t,
    eccCounts: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTotalEccErrors");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(eccCounts) };
    device_call(device, |d| {
        let r = d.reading(Capability::Ecc)?;
        out.set(match (errorType, counterType) {
            (0, 0) => r.ecc_corrected_volatile,
            (1, 0) => r.ecc_uncorrected_volatile,
            (0, 1) => r.ecc_corrected_aggregate,
            (1, 1) => r.ecc_uncorrected_aggregate,
            _ => return Err(INVALID_ARGUMENT),
        })
    })
}

/// The reading behind the retired-pages getters: `NOT_SUPPORTED` on boards that do
/// not retire pages (Hopper and later remap rows instead). `nvmlDeviceGetFieldValues`
/// keeps answering the retired-page fields from the scenario's capabilities alone.
fn retirement(d: &Dev) -> Result<GpuReading, nvmlReturn_t> {
    let r = d.reading(Capability::RetiredPages)?;
    if !d.gpu.model.page_retirement() {
        return Err(NOT_SUPPORTED);
    }
    Ok(r)
}

/// Retired pages of one cause, in retirement order: synthetic page addresses and the
/// wall time (Unix seconds) of the scenario fault that retired them. The counts equal
/// the model's `retired_single_bit` / `retired_double_bit`.
fn retired_pages(
    d: &Dev,
    cause: nvmlPageRetirementCause_t,
) -> Result<(Vec<u64>, Vec<u64>), nvmlReturn_t> {
    retirement(d)?;
    let double = match cause {
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => {
            false
        }
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => true,
        _ => return Err(INVALID_ARGUMENT),
    };
    let clock = d.node().clock();
    let (mut addrs, mut times) = (Vec::new(), Vec::new());
    for f in &d.node().faults {
        if let Fault::RetiredPages {
            at_s,
            gpu,
            single_bit,
            double_bit,
            ..
        } = *f
            && gpu == d.index
            && at_s <= d.t
        {
            let n = if double { double_bit } else { single_bit };
            let when = clock
                .wall_time(at_s)
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |w| w.as_secs());
            for _ in 0..n {
                let page = addrs.len() as u64 + u64::from(double) * 0x10_0000;
                addrs.push(0x1_0000_0000 + (page << 12));
                times.push(when);
            }
        }
    }
    Ok((addrs, times))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRetiredPages_v2");
    device_call(device, |d| {
        let (addrs, times) = retired_pages(d, cause)?;
        // SAFETY: NVML contract: `pageCount` is valid and `addresses` is null or holds
        // `*pageCount` entries.
        unsafe { fill_list(pageCount, addresses, &addrs) }?;
        if !timestamps.is_null() {
            let mut n = times.len() as c_uint;
            // SAFETY: the call above succeeded, so the caller's capacity (which NVML
            // requires `timestamps` to share) holds all `n` entries.
            unsafe { fill_list(&mut n, timestamps, &times) }?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRetiredPages");
    // SAFETY: same contract as `_v2` without timestamps.
    unsafe {
        nvmlDeviceGetRetiredPages_v2(device, cause, pageCount, addresses, std::ptr::null_mut())
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    isPending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRetiredPagesPendingStatus");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(isPending) };
    device_call(device, |d| {
        out.set(nvmlEnableState_t::from(retirement(d)?.retired_pending))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corrRows: *mut c_uint,
    uncRows: *mut c_uint,
    isPending: *mut c_uint,
    failureOccurred: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetRemappedRows");
    // SAFETY: NVML contract: all four out-pointers are null or valid for writes.
    let outs = unsafe {
        [
            Out::new(corrRows),
            Out::new(uncRows),
            Out::new(isPending),
            Out::new(failureOccurred),
        ]
    };
    device_call(device, |d| {
        let r = d.reading(Capability::RemappedRows)?;
        if outs.iter().any(Out::is_null) {
            return Err(INVALID_ARGUMENT);
        }
        let values = [
            r.remapped_correctable as c_uint,
            r.remapped_uncorrectable as c_uint,
            c_uint::from(r.remap_pending),
            c_uint::from(r.remap_failure),
        ];
        outs.into_iter().zip(values).try_for_each(|(o, v)| o.set(v))
    })
}

/// One sample of a whole GPU's reading per call: utilisation (%), power (mW) or clock
/// (MHz) now, stamped with the real wall clock (µs) like the process samples, so a
/// client passing its last seen timestamp keeps getting samples with time frozen.
/// Module power (Grace Hopper only) is `INVALID_ARGUMENT`; JPEG and OFA are idle. With
/// `samples` null, the count of available samples and success, as the driver answers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    device: nvmlDevice_t,
    type_: nvmlSamplingType_t,
    lastSeenTimeStamp: c_ulonglong,
    sampleValType: *mut nvmlValueType_t,
    sampleCount: *mut c_uint,
    samples: *mut nvmlSample_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetSamples");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let value_type = unsafe { Out::new(sampleValType) };
    device_call(device, |d| {
        d.whole_gpu()?;
        let r = d.node().gpu_reading(d.index, d.t);
        let utilization = |v: Option<u32>| {
            d.require(Capability::Utilization)?;
            v.ok_or(NOT_SUPPORTED)
        };
        let value = match type_ {
            nvmlSamplingType_enum_NVML_TOTAL_POWER_SAMPLES => {
                d.require(Capability::Power)?;
                r.power_mw
            }
            nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES => utilization(r.gpu_util_percent)?,
            nvmlSamplingType_enum_NVML_MEMORY_UTILIZATION_SAMPLES => {
                utilization(r.memory_util_percent)?
            }
            nvmlSamplingType_enum_NVML_ENC_UTILIZATION_SAMPLES => {
                d.require(Capability::EncoderUtilization)?;
                r.encoder_percent
            }
            nvmlSamplingType_enum_NVML_DEC_UTILIZATION_SAMPLES => {
                d.require(Capability::DecoderUtilization)?;
                r.decoder_percent
            }
            nvmlSamplingType_enum_NVML_PROCESSOR_CLK_SAMPLES => {
                d.require(Capability::Clocks)?;
                r.sm_clock_mhz
            }
            nvmlSamplingType_enum_NVML_MEMORY_CLK_SAMPLES => {
                d.require(Capability::Clocks)?;
                r.mem_clock_mhz
            }
            nvmlSamplingType_enum_NVML_JPG_UTILIZATION_SAMPLES
            | nvmlSamplingType_enum_NVML_OFA_UTILIZATION_SAMPLES => 0,
            // Module power exists on Grace Hopper only; elsewhere the real driver refuses
            // the type as an argument (H100, 580.159.04).
            nvmlSamplingType_enum_NVML_MODULE_POWER_SAMPLES => return Err(INVALID_ARGUMENT),
            _ => return Err(INVALID_ARGUMENT),
        };
        value_type.set(nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT)?;
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |w| w.as_micros() as u64);
        let mut sample = nvmlSample_t {
            timeStamp: now_us,
            sampleValue: nvmlValue_t { ullVal: 0 },
        };
        sample.sampleValue.uiVal = value;
        let available: &[nvmlSample_t] = if now_us > lastSeenTimeStamp {
            std::slice::from_ref(&sample)
        } else {
            &[]
        };
        // SAFETY: NVML contract: `sampleCount` is null or valid for reading and writing.
        let count = unsafe { crate::ffi::InOut::new(sampleCount) }.get()?;
        if samples.is_null() {
            *count = available.len() as c_uint;
            return Ok(());
        }
        let n = (*count as usize).min(available.len());
        let mut filled = n as c_uint;
        // SAFETY: NVML contract: `samples` (not null) holds `*count` (>= n) entries.
        unsafe { fill_list(&mut filled, samples, &available[..n]) }?;
        *count = filled;
        Ok(())
    })
}
