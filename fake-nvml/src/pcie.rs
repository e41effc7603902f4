//! PCIe link, bus and topology: the board's link (always at its maximum), NUMA
//! placement and the GPU-to-GPU topology of a two-socket HGX server.

use crate::board::board;
use crate::ffi::{
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, InOut, NOT_SUPPORTED, Out, Ret, fill_list,
    struct_version,
};
use crate::state::{Dev, Sim, device_call, handle};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_int, c_uint};

/// PCI class of a 3D controller (what a compute GPU enumerates as).
pub const PCI_CLASS_DISPLAY: u32 = 0x03;
pub const PCI_SUBCLASS_3D: u32 = 0x02;
/// CPU sockets of an HGX server; the GPUs split evenly between them.
pub const CPU_SOCKETS: u32 = 2;

/// Per-lane speed of a PCIe generation, Mbps.
pub(crate) fn link_speed_mbps(generation: u32) -> c_uint {
    match generation {
        1 => 2_500,
        2 => 5_000,
        3 => 8_000,
        4 => 16_000,
        5 => 32_000,
        _ => 64_000,
    }
}

/// The CPU NUMA node of a GPU.
pub(crate) fn numa_node(sim: &Sim, gpu: u32) -> u32 {
    let per_node = (sim.node.gpus.len() as u32).div_ceil(CPU_SOCKETS).max(1);
    gpu / per_node
}

/// The GPU index behind a second whole-GPU handle.
fn other_gpu(d: &Dev, other: nvmlDevice_t) -> Result<u32, Ret> {
    match d.sim.decode(other) {
        Some((gpu, None)) => Ok(gpu),
        _ => Err(INVALID_ARGUMENT),
    }
}

fn common_ancestor(sim: &Sim, a: u32, b: u32) -> nvmlGpuTopologyLevel_t {
    if a == b {
        nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL
    } else if numa_node(sim, a) == numa_node(sim, b) {
        nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
    } else {
        nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
    }
}

/// PCIe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBusType(
    device: nvmlDevice_t,
    type_: *mut nvmlBusType_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetBusType");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(type_) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            NVML_BUS_TYPE_PCIE
        })
    })
}

/// The board's link, which always trains at its maximum here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    currLinkGen: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCurrPcieLinkGeneration");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(currLinkGen) };
    device_call(device, |d| out.set(board(d)?.pcie_generation))
}

/// The board's link, which always trains at its maximum here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    currLinkWidth: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetCurrPcieLinkWidth");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(currLinkWidth) };
    device_call(device, |d| out.set(board(d)?.pcie_width))
}

/// The board's link, which always trains at its maximum here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    maxLinkGenDevice: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetGpuMaxPcieLinkGeneration");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(maxLinkGenDevice) };
    device_call(device, |d| out.set(board(d)?.pcie_generation))
}

/// The board's link, which always trains at its maximum here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    maxLinkGen: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMaxPcieLinkGeneration");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(maxLinkGen) };
    device_call(device, |d| out.set(board(d)?.pcie_generation))
}

/// The board's link, which always trains at its maximum here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    maxLinkWidth: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetMaxPcieLinkWidth");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(maxLinkWidth) };
    device_call(device, |d| out.set(board(d)?.pcie_width))
}

/// The CPU NUMA node the GPU hangs off: the first half of the GPUs on node 0, the
/// second on node 1, as on a two-socket HGX server.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetNumaNodeId");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(node) };
    device_call(device, |d| {
        out.set({
            board(d)?;
            // A passthrough VM's guest has no NUMA node for the GPU (real H100 VM).
            if d.node().passthrough_vm {
                return Err(NOT_SUPPORTED);
            }
            numa_node(d.sim, d.index)
        })
    })
}

/// Every peer capability is `OK` between NVLink-connected boards, `NOT_SUPPORTED` otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    p2pIndex: nvmlGpuP2PCapsIndex_t,
    p2pStatus: *mut nvmlGpuP2PStatus_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetP2PStatus");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(p2pStatus) };
    device_call(device1, |d| {
        board(d)?;
        other_gpu(d, device2)?;
        if p2pIndex > nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_UNKNOWN {
            return Err(INVALID_ARGUMENT);
        }
        out.set(if d.gpu.model.nvlink_links > 0 {
            nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK
        } else {
            nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED
        })
    })
}

/// The PCI identity with its class: a 3D controller (class 3, subclass 2). The version
/// word must be `nvmlPciInfoExt_v1`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfoExt(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfoExt_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPciInfoExt");
    // SAFETY: NVML contract: `pci` is null or valid for one struct whose version word the caller set.
    let io = unsafe { InOut::new(pci) };
    device_call(device, |d| {
        let v = io.get()?;
        if v.version != struct_version::<nvmlPciInfoExt_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let p = crate::device::pci_info(d)?;
        v.domain = p.domain;
        v.bus = p.bus;
        v.device = p.device;
        v.pciDeviceId = p.pciDeviceId;
        v.pciSubSystemId = p.pciSubSystemId;
        v.baseClass = PCI_CLASS_DISPLAY;
        v.subClass = PCI_SUBCLASS_3D;
        v.busId = p.busId;
        Ok(())
    })
}

/// Per-lane speed of the link generation, Mbps (`NVML_PCIE_LINK_MAX_SPEED_*`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieLinkMaxSpeed(
    device: nvmlDevice_t,
    maxSpeed: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPcieLinkMaxSpeed");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(maxSpeed) };
    device_call(device, |d| {
        out.set(link_speed_mbps(board(d)?.pcie_generation))
    })
}

/// Per-lane speed of the link generation, Mbps.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieSpeed(
    device: nvmlDevice_t,
    pcieSpeed: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetPcieSpeed");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pcieSpeed) };
    device_call(device, |d| {
        out.set(link_speed_mbps(board(d)?.pcie_generation))
    })
}

/// The same GPU is `INTERNAL`; GPUs on one CPU socket meet at `NODE`, others at `SYSTEM`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    pathInfo: *mut nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTopologyCommonAncestor");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(pathInfo) };
    device_call(device1, |d| {
        board(d)?;
        let other = other_gpu(d, device2)?;
        // No PCIe topology in a passthrough VM's guest (real H100 VM: NOT_SUPPORTED).
        if d.node().passthrough_vm {
            return Err(NOT_SUPPORTED);
        }
        out.set(common_ancestor(d.sim, d.index, other))
    })
}

/// The other GPUs whose common ancestor with this one is at `level` or closer. This call
/// has its own protocol: with `*count` zero it reports the number and succeeds; with a
/// non-zero `*count` it fills up to that many handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyNearestGpus(
    device: nvmlDevice_t,
    level: nvmlGpuTopologyLevel_t,
    count: *mut c_uint,
    deviceArray: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceGetTopologyNearestGpus");
    device_call(device, |d| {
        board(d)?;
        // No PCIe topology in a passthrough VM's guest: the real H100 VM's driver
        // answers INVALID_ARGUMENT for every level.
        if d.node().passthrough_vm {
            return Err(INVALID_ARGUMENT);
        }
        let list: Vec<nvmlDevice_t> = (0..d.node().gpus.len() as u32)
            .filter(|&g| g != d.index && common_ancestor(d.sim, d.index, g) <= level)
            .map(|g| handle(g, None))
            .collect();
        // SAFETY: NVML contract: `count` is null or valid for reading and writing.
        let count = unsafe { InOut::new(count) }.get()?;
        if *count == 0 {
            *count = list.len() as c_uint;
            return Ok(());
        }
        if deviceArray.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let n = (*count as usize).min(list.len());
        let mut filled = n as c_uint;
        // SAFETY: NVML contract: with a non-zero `*count`, `deviceArray` holds `*count`
        // (>= n) entries, and it is not null.
        unsafe { fill_list(&mut filled, deviceArray, &list[..n]) }?;
        *count = filled;
        Ok(())
    })
}

/// Each SXM module is its own board: only a GPU and itself are on the same board.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceOnSameBoard(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    onSameBoard: *mut c_int,
) -> nvmlReturn_t {
    crate::calls::count!("nvmlDeviceOnSameBoard");
    // SAFETY: NVML contract: the out-pointer is null or valid for writes.
    let out = unsafe { Out::new(onSameBoard) };
    device_call(device1, |d| {
        board(d)?;
        let other = other_gpu(d, device2)?;
        // No PCIe topology in a passthrough VM's guest (real H100 VM: NOT_SUPPORTED).
        if d.node().passthrough_vm {
            return Err(NOT_SUPPORTED);
        }
        out.set(c_int::from(other == d.index))
    })
}
