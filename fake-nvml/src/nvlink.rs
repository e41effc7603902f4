//! NVLink: per-link state, version, capabilities, remote end and error counters, and
//! the GPU's fabric registration. The links of an HGX board end at its NVSwitches (the
//! model's `nvswitches`), spread evenly over them. Link state, per-link errors and the
//! fabric follow the scenario's `nvlink_down`, `nvlink_errors` and `fabric` faults
//! (`gpu_sim::fabric`).

use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, NOT_SUPPORTED, Out, Ret, put_array_str,
    struct_version,
};
use crate::state::{Dev, device_call};
use gpu_sim::Capability;
use gpu_sim::models::BoardFacts;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};

/// PCI device ID and first bus number of the baseboard's NVSwitches.
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
    let board = link_of(d, link)?;
    let switch = link * board.nvswitches.max(1) / d.gpu.model.nvlink_links;
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

fn error_counter(
    d: &Dev,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
) -> Result<c_ulonglong, Ret> {
    link_of(d, link)?;
    // [CRC flit, CRC data, replay, recovery] of this link.
    let e = d.node().nvlink_link_errors(d.index, link, d.t);
    Ok(match counter {
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY => e[2],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY => e[3],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT => e[0],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_DATA => e[1],
        nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_ECC_DATA => 0,
        _ => return Err(INVALID_ARGUMENT),
    })
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

/// The scenario's per-link error counts (they sum to the all-link fields); ECC data
/// errors are 0.
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

/// Up unless the scenario takes the link down.
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
            if d.node().nvlink_active(d.index, link, d.t) {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            }
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

/// The NVLink fabric registration of a Hopper or newer board with NVLink (HGX
/// NVSwitches or an NVL72 rack, both managed by the fabric manager), as the scenario
/// has it; other boards are `NOT_SUPPORTED`.
fn fabric(d: &Dev) -> Result<gpu_sim::FabricReading, Ret> {
    d.whole_gpu()?;
    d.require(Capability::Nvlink)?;
    if d.gpu.model.nvlink_links == 0 || d.gpu.model.architecture < HOPPER {
        return Err(NOT_SUPPORTED);
    }
    Ok(d.node().fabric(d.index, d.t))
}

/// `nvmlDeviceArchitecture_t` of Hopper.
const HOPPER: u32 = 9;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    gpuFabricInfo: *mut nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuFabricInfo");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(gpuFabricInfo) };
    device_call(device, |d| {
        let f = fabric(d)?;
        // SAFETY: a plain C struct, for which all-zero bytes are valid.
        unsafe {
            out.set_zeroed(|v| {
                v.clusterUuid = f.cluster_uuid;
                v.status = f.status;
                v.cliqueId = f.clique_id;
                v.state = f.state.nvml();
            })
        }
    })
}

/// Versions 2 and 3 of the struct (v2 is v3 without `healthSummary`), with the
/// scenario's health mask and the summary it implies.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    gpuFabricInfo: *mut nvmlGpuFabricInfoV_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuFabricInfoV");
    // SAFETY: NVML contract: `gpuFabricInfo` is null or valid for the struct version its
    // version word names; v2 is a prefix of v3, so only the version word is read first.
    let version = unsafe { gpuFabricInfo.cast::<c_uint>().as_ref().copied() };
    device_call(device, |d| {
        let version = version.ok_or(INVALID_ARGUMENT)?;
        let v3 = version == struct_version::<nvmlGpuFabricInfo_v3_t>(3);
        if !v3 && version != struct_version::<nvmlGpuFabricInfo_v2_t>(2) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let f = fabric(d)?;
        // SAFETY: the caller's struct is at least a v2 (its version word says so), a
        // plain C struct for which all-zero bytes are valid.
        unsafe {
            Out::new(gpuFabricInfo.cast::<nvmlGpuFabricInfo_v2_t>()).set_zeroed(|v| {
                v.version = version;
                v.clusterUuid = f.cluster_uuid;
                v.status = f.status;
                v.cliqueId = f.clique_id;
                v.state = f.state.nvml();
                v.healthMask = f.health_mask;
            })
        }?;
        if v3 {
            // SAFETY: the version word says the caller's struct is a v3.
            let full = unsafe { crate::ffi::InOut::new(gpuFabricInfo) }.get()?;
            full.healthSummary = f.health_summary as u8;
        }
        Ok(())
    })
}
