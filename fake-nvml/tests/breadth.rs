//! The getters beyond the exporter's own needs (clocks of every ID, PCIe link, NVLink,
//! board facts, modes, thresholds, compute and graphics process lists) through nvml-wrapper,
//! checked against the gpu-sim model; setters refuse as for a non-root client.

mod common;

use nvml_wrapper::enum_wrappers::device::{
    Clock, ClockId, ComputeMode, PerformanceState, TemperatureSensor, TemperatureThreshold,
    TopologyLevel,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

const SCENARIO: &str = "telemetry.toml";
const T: f64 = 100.0;
/// Index of the scenario's L4 (no NVLink; ECC and power unsupported).
const L4: u32 = 2;

fn nvml() -> &'static Nvml {
    &common::shared(SCENARIO, Some(T)).0
}

fn dev(i: u32) -> Device<'static> {
    nvml().device_by_index(i).expect("device by index")
}

#[test]
fn clocks_of_every_id_and_type() {
    let m = common::model(SCENARIO, T);
    for (i, g) in m.gpus.iter().enumerate() {
        let (d, model) = (dev(i as u32), g.model);
        let r = m.gpu_reading(i as u32, T);
        assert_eq!(
            d.clock(Clock::SM, ClockId::Current).unwrap(),
            r.sm_clock_mhz
        );
        assert_eq!(
            d.clock(Clock::Memory, ClockId::Current).unwrap(),
            r.mem_clock_mhz
        );
        let video = model.board.max_video_clock_mhz * r.sm_clock_mhz / model.max_sm_clock_mhz;
        assert_eq!(d.clock(Clock::Video, ClockId::Current).unwrap(), video);
        assert_eq!(d.clock_info(Clock::Video).unwrap(), video);
        assert_eq!(
            d.max_clock_info(Clock::Video).unwrap(),
            model.board.max_video_clock_mhz
        );
        for id in [
            ClockId::TargetAppClock,
            ClockId::DefaultAppClock,
            ClockId::CustomerMaxBoost,
        ] {
            assert_eq!(
                d.clock(Clock::Graphics, id).unwrap(),
                model.max_sm_clock_mhz
            );
            // Memory has application clocks but no customer boost clock; video has
            // neither (the real H100's NOT_SUPPORTED).
            match id {
                ClockId::CustomerMaxBoost => assert!(matches!(
                    d.clock(Clock::Memory, id),
                    Err(NvmlError::NotSupported)
                )),
                _ => assert_eq!(d.clock(Clock::Memory, id).unwrap(), model.mem_clock_mhz),
            }
            assert!(matches!(
                d.clock(Clock::Video, id),
                Err(NvmlError::NotSupported)
            ));
        }
        assert_eq!(
            d.max_customer_boost_clock(Clock::SM).unwrap(),
            model.max_sm_clock_mhz
        );
        assert_eq!(d.supported_memory_clocks().unwrap(), [model.mem_clock_mhz]);
        let graphics = d.supported_graphics_clocks(model.mem_clock_mhz).unwrap();
        assert_eq!(graphics.first(), Some(&model.max_sm_clock_mhz));
        assert!(graphics.iter().all(|&c| c >= model.idle_sm_clock_mhz));
        assert!(matches!(
            d.supported_graphics_clocks(model.mem_clock_mhz + 1),
            Err(NvmlError::NotFound)
        ));
        assert_eq!(d.performance_state().unwrap(), PerformanceState::Zero);
    }
}

#[test]
fn pcie_link_and_topology() {
    let m = common::model(SCENARIO, T);
    for (i, g) in m.gpus.iter().enumerate() {
        let (d, b) = (dev(i as u32), &g.model.board);
        assert_eq!(d.current_pcie_link_gen().unwrap(), b.pcie_generation);
        assert_eq!(d.max_pcie_link_gen().unwrap(), b.pcie_generation);
        assert_eq!(d.current_pcie_link_width().unwrap(), b.pcie_width);
        assert_eq!(d.max_pcie_link_width().unwrap(), b.pcie_width);
        assert!(d.pcie_link_speed().unwrap() >= 16_000);
    }
    let (a, b) = (dev(0), dev(1));
    assert_eq!(
        a.topology_common_ancestor(dev(0)).unwrap(),
        TopologyLevel::Internal
    );
    // Three GPUs on two sockets: GPUs 0 and 1 share the first.
    assert_eq!(a.topology_common_ancestor(b).unwrap(), TopologyLevel::Node);
    assert_eq!(
        a.topology_common_ancestor(dev(L4)).unwrap(),
        TopologyLevel::System
    );
    // The nearest-GPUs call: none inside the GPU, the socket's other GPU, then all.
    let nearest = |level| a.topology_nearest_gpus(level).unwrap().len();
    assert_eq!(nearest(TopologyLevel::Internal), 0);
    assert_eq!(nearest(TopologyLevel::Node), 1);
    assert_eq!(nearest(TopologyLevel::System), 2);
    assert_eq!(a.numa_node_id().unwrap(), 0);
    assert_eq!(dev(L4).numa_node_id().unwrap(), 1);
}

#[test]
fn nvlink_links_of_an_hgx_board() {
    let m = common::model(SCENARIO, T);
    let h100 = &m.gpus[0].model;
    let d = dev(0);
    let mut switches = std::collections::BTreeSet::new();
    for link in 0..h100.nvlink_links {
        let l = d.link_wrapper_for(link);
        assert!(l.is_active().unwrap());
        assert_eq!(l.version().unwrap(), h100.board.nvlink_version);
        let remote = l.remote_pci_info().unwrap();
        assert!(remote.bus_id.ends_with(":00.0"), "{remote:?}");
        switches.insert(remote.bus_id);
        assert_eq!(l.error_counter(ErrorCounter::DlCrcFlit).unwrap(), 0);
    }
    // The links end at every NVSwitch of the baseboard.
    assert_eq!(switches.len() as u32, h100.board.nvswitches);
    assert!(matches!(
        d.link_wrapper_for(h100.nvlink_links).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        dev(L4).link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn board_facts_modes_and_thresholds() {
    let m = common::model(SCENARIO, T);
    for (i, g) in m.gpus.iter().enumerate() {
        let (d, model, b) = (dev(i as u32), g.model, &g.model.board);
        assert_eq!(d.board_part_number().unwrap(), b.part_number);
        assert_eq!(d.bar1_memory_info().unwrap().total, b.bar1_mib << 20);
        assert_eq!(d.num_cores().unwrap(), b.cuda_cores);
        assert_eq!(d.memory_bus_width().unwrap(), b.memory_bus_width_bits);
        let cc = d.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), b.cuda_capability);
        assert_eq!(d.compute_mode().unwrap(), ComputeMode::Default);
        assert!(d.is_in_persistent_mode().unwrap());
        let gsp = d.gsp_firmware_mode().unwrap();
        assert!(gsp.enabled && gsp.default);
        assert_eq!(d.gsp_firmware_version().unwrap(), m.driver_version);
        assert!(!d.is_multi_gpu_board().unwrap());
        assert_eq!(d.num_fans().unwrap(), 0);
        assert!(matches!(d.fan_speed(0), Err(NvmlError::InvalidArg)));
        assert_eq!(
            d.temperature_threshold(TemperatureThreshold::Shutdown)
                .unwrap(),
            b.shutdown_temp_c
        );
        assert_eq!(
            d.temperature_threshold(TemperatureThreshold::Slowdown)
                .unwrap(),
            b.slowdown_temp_c
        );
        assert_eq!(
            d.temperature(TemperatureSensor::Gpu).unwrap(),
            m.gpu_reading(i as u32, T).gpu_temp_c
        );
        if g.supports(gpu_sim::Capability::Power) {
            let c = d.power_management_limit_constraints().unwrap();
            assert_eq!(
                (c.min_limit, c.max_limit),
                (b.min_power_limit_mw, model.power_limit_mw)
            );
        }
        match g.supports(gpu_sim::Capability::Ecc) {
            true => {
                let e = d.is_ecc_enabled().unwrap();
                assert!(e.currently_enabled && e.pending_enabled);
            }
            false => assert!(matches!(d.is_ecc_enabled(), Err(NvmlError::NotSupported))),
        }
    }
}

#[test]
fn compute_and_graphics_process_lists() {
    let m = common::model(SCENARIO, T);
    let d = dev(0);
    let mut compute: Vec<u32> = d
        .running_compute_processes()
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    compute.sort_unstable();
    let mut model: Vec<u32> = m.gpu_processes(0, T).iter().map(|p| p.pid).collect();
    model.sort_unstable();
    assert!(!model.is_empty());
    assert_eq!(compute, model);
    assert!(d.running_graphics_processes().unwrap().is_empty());
}

#[test]
fn state_changes_are_refused_as_for_a_non_root_client() {
    let mut d = dev(0);
    assert!(matches!(
        d.set_compute_mode(ComputeMode::ExclusiveProcess),
        Err(NvmlError::NoPermission)
    ));
    assert!(matches!(
        d.set_persistent(false),
        Err(NvmlError::NoPermission)
    ));
    // Nothing changed.
    assert_eq!(d.compute_mode().unwrap(), ComputeMode::Default);
}

#[test]
fn fabric_of_a_hopper_hgx_board_and_handles_by_uuid_struct() {
    let m = common::model(SCENARIO, T);
    let lib = nvml().lib();
    // SAFETY: plain C structs, for which all-zero bytes are valid values.
    let mut info: nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
    info.version = std::mem::size_of::<nvmlGpuFabricInfoV_t>() as u32 | 3 << 24;
    // SAFETY: a live handle and a valid out-struct with its version set.
    let rc = unsafe { lib.nvmlDeviceGetGpuFabricInfoV(dev(0).handle(), &mut info) };
    assert_eq!(rc, nvmlReturn_enum_NVML_SUCCESS);
    assert_eq!(
        info.state,
        NVML_GPU_FABRIC_STATE_COMPLETED as nvmlGpuFabricState_t
    );
    assert_eq!(info.status, nvmlReturn_enum_NVML_SUCCESS);
    // The L4 has no NVLink fabric.
    // SAFETY: as above.
    let rc = unsafe { lib.nvmlDeviceGetGpuFabricInfoV(dev(L4).handle(), &mut info) };
    assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
    info.version = 1 << 24;
    // SAFETY: as above.
    let rc = unsafe { lib.nvmlDeviceGetGpuFabricInfoV(dev(0).handle(), &mut info) };
    assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

    for (i, g) in m.gpus.iter().enumerate() {
        // SAFETY: as above.
        let mut uuid: nvmlUUID_t = unsafe { std::mem::zeroed() };
        uuid.version = std::mem::size_of::<nvmlUUID_t>() as u32 | 1 << 24;
        uuid.type_ = nvmlUUIDType_t_NVML_UUID_TYPE_ASCII;
        // SAFETY: writing the ASCII member of a zeroed union.
        let text = unsafe { &mut uuid.value.str_ };
        for (d, s) in text.iter_mut().zip(g.uuid.bytes()) {
            *d = s as std::ffi::c_char;
        }
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: a valid in-struct and out-pointer.
        let rc = unsafe { lib.nvmlDeviceGetHandleByUUIDV(&uuid, &mut handle) };
        assert_eq!(rc, nvmlReturn_enum_NVML_SUCCESS);
        // SAFETY: raw handles are only compared.
        assert_eq!(handle, unsafe { dev(i as u32).handle() });
        // The binary form: the UUID's 32 hex digits as 16 bytes.
        let hex: String = g.uuid[4..].chars().filter(|c| *c != '-').collect();
        uuid.type_ = nvmlUUIDType_t_NVML_UUID_TYPE_BINARY;
        // SAFETY: writing the binary member.
        let bytes = unsafe { &mut uuid.value.bytes };
        for (k, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).unwrap();
        }
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: as above.
        let rc = unsafe { lib.nvmlDeviceGetHandleByUUIDV(&uuid, &mut handle) };
        assert_eq!(rc, nvmlReturn_enum_NVML_SUCCESS);
        // SAFETY: raw handles are only compared.
        assert_eq!(handle, unsafe { dev(i as u32).handle() });
    }
}

#[test]
fn samples_are_the_current_readings() {
    use nvml_wrapper::enum_wrappers::device::Sampling;
    use nvml_wrapper::enums::device::SampleValue;
    let m = common::model(SCENARIO, T);
    let r = m.gpu_reading(0, T);
    let d = dev(0);
    let one = |kind| {
        let s = d.samples(kind, None).unwrap();
        assert_eq!(s.len(), 1, "{s:?}");
        s[0].value.clone()
    };
    assert_eq!(one(Sampling::Power), SampleValue::U32(r.power_mw));
    assert_eq!(
        one(Sampling::GpuUtilization),
        SampleValue::U32(r.gpu_util_percent.unwrap())
    );
    assert_eq!(
        one(Sampling::ProcessorClock),
        SampleValue::U32(r.sm_clock_mhz)
    );
    assert_eq!(
        one(Sampling::MemoryClock),
        SampleValue::U32(r.mem_clock_mhz)
    );
    // Nothing newer than a timestamp in the future.
    assert!(d.samples(Sampling::Power, u64::MAX).unwrap().is_empty());
    // The L4 does not support power.
    assert!(matches!(
        dev(L4).samples(Sampling::Power, None),
        Err(NvmlError::NotSupported)
    ));
}
