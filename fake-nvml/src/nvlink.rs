//! NVLink: per-link state, version, capabilities, remote end and error counters. The
//! links of an HGX board end at its NVSwitches, spread evenly over them.

use crate::ffi::{INVALID_ARGUMENT, NOT_SUPPORTED, Out, Ret, put_array_str};
use crate::state::{Dev, device_call};
use gpu_sim::Capability;
use gpu_sim::models::BoardFacts;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};

/// NVSwitches on an HGX H100 baseboard, their PCI device ID and first bus number.
pub const NVSWITCHES: u32 = 4;
pub const NVSWITCH_PCI_DEVICE_ID: u32 = 0x22A3_10DE;
pub const NVSWITCH_FIRST_BUS: u32 = 0x05;

/// The board of a whole GPU with NVLink, checking that `link` is one of its links.
fn link_of<'a>(d: &Dev<'a>, link: c_uint) -> Result<&'a BoardFacts, Ret> {
    d.whole_gpu()?;
    d.require(Capability::Nvlink)?;
    let links = d.gpu.model.nvlink_links;
    if links == 0 {
        return Err(NOT_SUPPORTED);
    }
    if link >= links {
        return Err(INVALID_ARGUMENT);
    }
    Ok(&d.gpu.model.board)
}

fn capability_of(capability: nvmlNvLinkCapability_t) -> Result<c_uint, Ret> {
    Ok(match capability {
        nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_SUPPORTED
        | nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_ATOMICS
        | nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_VALID => 1,
        nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_SYSMEM_ACCESS
        | nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_SYSMEM_ATOMICS
        | nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_SLI_BRIDGE => 0,
        _ => return Err(INVALID_ARGUMENT),
    })
}

/// PCI identity of the NVSwitch at the far end of `link`.
fn remote_pci(d: &Dev, link: c_uint) -> Result<nvmlPciInfo_t, Ret> {
    link_of(d, link)?;
    let switch = link * NVSWITCHES / d.gpu.model.nvlink_links;
    let bus = NVSWITCH_FIRST_BUS + switch;
    let mut p = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus,
        device: 0,
        pciDeviceId: NVSWITCH_PCI_DEVICE_ID,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    put_array_str(&mut p.busIdLegacy, &format!("0000:{bus:02X}:00.0"));
    put_array_str(&mut p.busId, &format!("00000000:{bus:02X}:00.0"));
    Ok(p)
}

/// One link's share of an all-link total: the first `total % links` links take one more.
pub(crate) fn link_share(total: u64, links: u32, link: u32) -> u64 {
    let links = u64::from(links.max(1));
    total / links + u64::from(u64::from(link) < total % links)
}

fn error_counter(
    d: &Dev,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
) -> Result<c_ulonglong, Ret> {
    link_of(d, link)?;
    let r = d.node().gpu_reading(d.index, d.t);
    // `nvlink_errors` is [CRC flit, CRC data, replay, recovery].
    let total = match counter {
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY => r.nvlink_errors[2],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY => r.nvlink_errors[3],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT => r.nvlink_errors[0],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_DATA => r.nvlink_errors[1],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_ECC_DATA => 0,
        _ => return Err(INVALID_ARGUMENT),
    };
    Ok(link_share(total, d.gpu.model.nvlink_links, link))
}

/// Peer-to-peer access and atomics over the link; no system-memory access or SLI on
/// x86 HGX boards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    device: nvmlDevice_t,
    link: c_uint,
    capability: nvmlNvLinkCapability_t,
    capResult: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkCapability");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(capResult) };
    device_call(device, |d| {
        out.set({
            link_of(d, link)?;
            capability_of(capability)?
        })
    })
}

/// The model's all-link error totals, spread over the links (the first links take
/// the remainder); ECC data errors are 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
    counterValue: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkErrorCounter");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(counterValue) };
    device_call(device, |d| out.set(error_counter(d, link, counter)?))
}

/// Links of an HGX board end at NVSwitches.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    pNvLinkDeviceType: *mut nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkRemoteDeviceType");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pNvLinkDeviceType) };
    device_call(device, |d| {
        out.set({
            link_of(d, link)?;
            nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
        })
    })
}

/// The NVSwitch the link ends at.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkRemotePciInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pci) };
    device_call(device, |d| out.set(remote_pci(d, link)?))
}

/// The NVSwitch the link ends at.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pci) };
    device_call(device, |d| out.set(remote_pci(d, link)?))
}

/// Every link of the board is up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    isActive: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkState");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(isActive) };
    device_call(device, |d| {
        out.set({
            link_of(d, link)?;
            nvmlEnableState_enum_NVML_FEATURE_ENABLED
        })
    })
}

/// The board's NVLink version (`nvmlNvlinkVersion_t`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: nvmlDevice_t,
    link: c_uint,
    version: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNvLinkVersion");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(version) };
    device_call(device, |d| out.set(link_of(d, link)?.nvlink_version))
}
