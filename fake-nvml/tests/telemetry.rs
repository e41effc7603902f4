//! Identity, telemetry, processes, field values and GPM of whole GPUs, checked against
//! what gpu-sim computes for the same frozen instant.

mod common;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor,
};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::*;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

const SCENARIO: &str = "telemetry.toml";
const T: f64 = 100.0;

fn nvml() -> &'static Nvml {
    &common::shared(SCENARIO, Some(T)).0
}

fn model() -> gpu_sim::SimNode {
    common::model(SCENARIO, T)
}

fn dev(i: u32) -> Device<'static> {
    nvml().device_by_index(i).expect("device by index")
}

#[test]
fn system_and_identity() {
    let (nvml, m) = (nvml(), model());
    assert_eq!(nvml.sys_driver_version().unwrap(), m.driver_version);
    assert_eq!(nvml.sys_nvml_version().unwrap(), m.nvml_version);
    assert_eq!(
        nvml.sys_cuda_driver_version().unwrap(),
        m.cuda_driver_version
    );
    assert_eq!(
        nvml.field_id_scheme(),
        nvml_wrapper::FieldIdScheme::V13Update1,
        "driver 580.82.07 selects the new field-ID numbering"
    );
    assert_eq!(nvml.device_count().unwrap() as usize, m.gpus.len());
    assert_eq!(nvml.sys_process_name(5001, 64).unwrap(), "trainer");
    assert!(matches!(
        nvml.sys_process_name(1, 64),
        Err(NvmlError::NotFound)
    ));

    for (i, g) in m.gpus.iter().enumerate() {
        let d = dev(i as u32);
        assert_eq!(d.name().unwrap(), g.model.name);
        assert_eq!(d.uuid().unwrap(), g.uuid);
        assert_eq!(d.serial().unwrap(), g.serial);
        assert_eq!(d.index().unwrap(), i as u32);
        assert_eq!(d.minor_number().unwrap(), g.minor_number);
        assert!(d.vbios_version().is_ok());
        assert!(d.brand().is_ok());
        let pci = d.pci_info().unwrap();
        assert_eq!(pci.bus_id, g.pci_bus_id);
        assert_eq!(pci.domain, 0);
        assert_eq!(
            pci.bus,
            u32::from_str_radix(&g.pci_bus_id[9..11], 16).unwrap()
        );
        assert_eq!(pci.pci_device_id, g.model.pci_device_id);
        // Lookups round-trip to the same handle.
        let by_uuid = nvml.device_by_uuid(g.uuid.as_str()).unwrap();
        let by_pci = nvml.device_by_pci_bus_id(g.pci_bus_id.as_str()).unwrap();
        // SAFETY: raw handles are only compared.
        unsafe {
            assert_eq!(by_uuid.handle(), d.handle());
            assert_eq!(by_pci.handle(), d.handle());
        }
        // Raw numbers for brand and architecture.
        let (mut brand, mut arch) = (0, 0);
        // SAFETY: valid handle and out-pointers.
        unsafe {
            assert_eq!(nvml.lib().nvmlDeviceGetBrand(d.handle(), &mut brand), 0);
            assert_eq!(
                nvml.lib().nvmlDeviceGetArchitecture(d.handle(), &mut arch),
                0
            );
        }
        assert_eq!((brand, arch), (g.model.brand, g.model.architecture));
    }
    let legacy = format!("0000:{}", &m.gpus[1].pci_bus_id[9..]);
    assert!(nvml.device_by_pci_bus_id(legacy.as_str()).is_ok());
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_index(99),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn string_buffers_and_struct_versions_are_checked() {
    let d = dev(0);
    let lib = nvml().lib();
    let mut small = [0 as std::ffi::c_char; 8];
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut mem2: nvmlMemory_v2_t = unsafe { std::mem::zeroed() };
    mem2.version = 1; // not nvmlMemory_v2
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut mem1: nvmlMemory_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid handle, buffers of the stated sizes, valid structs.
    unsafe {
        assert_eq!(
            lib.nvmlDeviceGetUUID(d.handle(), small.as_mut_ptr(), small.len() as u32),
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(
            lib.nvmlSystemGetDriverVersion(small.as_mut_ptr(), 3),
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(d.handle(), &mut mem2),
            nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        assert_eq!(lib.nvmlDeviceGetMemoryInfo(d.handle(), &mut mem1), 0);
        let bogus = 0x10 as nvmlDevice_t;
        let mut power = 0;
        assert_eq!(
            lib.nvmlDeviceGetPowerUsage(bogus, &mut power),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
    }
    let want = model().gpu_reading(0, T).memory;
    assert_eq!(
        (mem1.total, mem1.free, mem1.used),
        (want.total, want.free, want.total - want.free)
    );
}

#[test]
fn telemetry_matches_the_model() {
    let m = model();
    for i in 0..2u32 {
        let (d, r, g) = (dev(i), m.gpu_reading(i, T), &m.gpus[i as usize]);
        let mem = d.memory_info().unwrap();
        assert_eq!(
            (mem.total, mem.reserved, mem.used, mem.free),
            (
                r.memory.total,
                r.memory.reserved,
                r.memory.used,
                r.memory.free
            )
        );
        let u = d.utilization_rates().unwrap();
        assert_eq!(Some(u.gpu), r.gpu_util_percent);
        assert_eq!(Some(u.memory), r.memory_util_percent);
        assert_eq!(
            d.encoder_utilization().unwrap().utilization,
            r.encoder_percent
        );
        assert_eq!(
            d.decoder_utilization().unwrap().utilization,
            r.decoder_percent
        );
        assert_eq!(d.power_usage().unwrap(), r.power_mw);
        assert_eq!(d.total_energy_consumption().unwrap(), r.energy_mj);
        assert_eq!(d.enforced_power_limit().unwrap(), g.model.power_limit_mw);
        assert_eq!(d.temperature(TemperatureSensor::Gpu).unwrap(), r.gpu_temp_c);
        assert_eq!(d.clock_info(Clock::SM).unwrap(), r.sm_clock_mhz);
        assert_eq!(d.clock_info(Clock::Graphics).unwrap(), r.sm_clock_mhz);
        assert_eq!(d.clock_info(Clock::Memory).unwrap(), r.mem_clock_mhz);
        assert_eq!(
            d.max_clock_info(Clock::SM).unwrap(),
            g.model.max_sm_clock_mhz
        );
        assert_eq!(
            d.current_throttle_reasons().unwrap().bits(),
            r.clock_event_reasons
        );
        assert_eq!(
            d.violation_status(PerformancePolicy::Thermal)
                .unwrap()
                .violation_time,
            r.violation_ns[1]
        );
        assert_eq!(d.pcie_replay_counter().unwrap() as u64, r.pcie_replay);
        assert_eq!(
            d.pcie_throughput(PcieUtilCounter::Send).unwrap(),
            r.pcie_tx_kb_s
        );
        assert_eq!(
            d.pcie_throughput(PcieUtilCounter::Receive).unwrap(),
            r.pcie_rx_kb_s
        );
        let ecc = |e, c| d.total_ecc_errors(e, c).unwrap();
        assert_eq!(
            ecc(MemoryError::Corrected, EccCounter::Volatile),
            r.ecc_corrected_volatile
        );
        assert_eq!(
            ecc(MemoryError::Uncorrected, EccCounter::Volatile),
            r.ecc_uncorrected_volatile
        );
        assert_eq!(
            ecc(MemoryError::Corrected, EccCounter::Aggregate),
            r.ecc_corrected_aggregate
        );
        assert_eq!(
            ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            r.ecc_uncorrected_aggregate
        );
        // Hopper retires no pages (it remaps rows): the getters answer NOT_SUPPORTED
        // even with a retired-pages fault in the scenario (retired_pages.rs checks the
        // A100, which does retire them).
        assert!(!g.model.page_retirement());
        for cause in [
            RetirementCause::MultipleSingleBitEccErrors,
            RetirementCause::DoubleBitEccError,
        ] {
            assert!(matches!(
                d.retired_pages(cause),
                Err(NvmlError::NotSupported)
            ));
        }
        assert!(matches!(
            d.are_pages_pending_retired(),
            Err(NvmlError::NotSupported)
        ));
        let (mut cor, mut unc, mut pend, mut fail) = (0, 0, 0, 0);
        // SAFETY: valid handle and out-pointers.
        let rc = unsafe {
            nvml().lib().nvmlDeviceGetRemappedRows(
                d.handle(),
                &mut cor,
                &mut unc,
                &mut pend,
                &mut fail,
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(
            (cor as u64, unc as u64, pend != 0, fail != 0),
            (
                r.remapped_correctable,
                r.remapped_uncorrectable,
                r.remap_pending,
                r.remap_failure
            )
        );
    }
    // The faults before T show, the one after does not.
    let r0 = m.gpu_reading(0, T);
    assert_eq!((r0.ecc_corrected_volatile, r0.retired_single_bit), (5, 3));
    assert_eq!(m.gpu_reading(1, T).remapped_correctable, 4);
}

#[test]
fn processes_two_call_and_utilisation() {
    let m = model();
    for i in 0..2u32 {
        let d = dev(i);
        let want = m.gpu_processes(i, T);
        assert_eq!(
            d.running_compute_processes_count().unwrap() as usize,
            want.len()
        );
        let got = d.running_compute_processes().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.pid, w.pid);
            assert!(
                matches!(g.used_gpu_memory, UsedGpuMemory::Used(b) if b == w.used_memory_bytes)
            );
            assert_eq!((g.gpu_instance_id, g.compute_instance_id), (None, None));
        }
        let util = d.process_utilization_stats(None).unwrap();
        assert_eq!(util.len(), want.len());
        for w in &want {
            let s = util
                .iter()
                .find(|s| s.pid == w.pid)
                .expect("sample per process");
            assert_eq!(s.sm_util, w.sm_util_percent);
        }
    }
    // Raw two-call protocol: too small a buffer gives the count and INSUFFICIENT_SIZE.
    let d = dev(0);
    let mut count = 1u32;
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut buf: [nvmlProcessInfo_t; 1] = unsafe { std::mem::zeroed() };
    // SAFETY: `buf` holds `count` entries.
    let rc = unsafe {
        nvml().lib().nvmlDeviceGetComputeRunningProcesses_v3(
            d.handle(),
            &mut count,
            buf.as_mut_ptr(),
        )
    };
    assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
    assert_eq!(count as usize, m.gpu_processes(0, T).len());
    assert_eq!(
        buf[0].gpuInstanceId, 0,
        "an insufficient call writes no entries"
    );
    // The original (v1) call.
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut v1: [nvmlProcessInfo_v1_t; 4] = unsafe { std::mem::zeroed() };
    let mut count = 4u32;
    // SAFETY: the symbol has the v1 signature; `v1` holds `count` entries.
    let rc = unsafe {
        (nvml()
            .lib()
            .nvmlDeviceGetComputeRunningProcesses
            .as_ref()
            .unwrap())(d.handle(), &mut count, v1.as_mut_ptr())
    };
    assert_eq!(rc, 0);
    assert_eq!(v1[0].pid, 5001);
}

fn value(s: &Result<FieldValueSample, NvmlError>) -> u64 {
    match s
        .as_ref()
        .expect("field sample")
        .value
        .as_ref()
        .expect("field value")
    {
        SampleValue::U32(v) => u64::from(*v),
        SampleValue::U64(v) => *v,
        other => panic!("unexpected value type {other:?}"),
    }
}

#[test]
fn field_values_match_the_model() {
    let m = model();
    let ids = [
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        NVML_FI_DEV_RETIRED_PENDING,
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_PERF_POLICY_POWER,
        NVML_FI_DEV_PERF_POLICY_THERMAL,
        NVML_FI_DEV_PERF_POLICY_RELIABILITY,
        NVML_FI_DEV_MEMORY_TEMP,
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
        9999,
    ];
    for i in 0..2u32 {
        let r = m.gpu_reading(i, T);
        let ids: Vec<FieldId> = ids.iter().map(|&id| FieldId(id)).collect();
        let got = dev(i).field_values_for(&ids).unwrap();
        let want = [
            r.ecc_corrected_volatile,
            r.ecc_uncorrected_volatile,
            r.ecc_corrected_aggregate,
            r.ecc_uncorrected_aggregate,
            u64::from(r.retired_pending),
            r.nvlink_errors[0],
            r.nvlink_errors[1],
            r.nvlink_errors[2],
            r.nvlink_errors[3],
            r.violation_ns[0],
            r.violation_ns[1],
            r.violation_ns[5],
            u64::from(r.memory_temp_c),
            r.energy_mj,
            r.remapped_correctable,
            r.remapped_uncorrectable,
            u64::from(r.remap_pending),
            u64::from(r.remap_failure),
        ];
        for (k, w) in want.iter().enumerate() {
            assert_eq!(value(&got[k]), *w, "GPU {i} field {}", ids[k].0);
        }
        let unknown = got.last().unwrap().as_ref().unwrap();
        assert!(matches!(unknown.value, Err(NvmlError::NotSupported)));
        let ts = got[0].as_ref().unwrap().timestamp;
        let want_ts = m
            .clock()
            .wall_time(T)
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        assert!((ts - want_ts.as_micros() as i64).abs() < 5_000_000);
    }
}

/// NVLink throughput through a raw call, since nvml-wrapper never sets `scopeId`.
#[test]
fn nvlink_throughput_honours_scope() {
    let m = model();
    let d = dev(1);
    let r = m.gpu_reading(1, T);
    let links = u64::from(m.gpus[1].model.nvlink_links);
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut values: [nvmlFieldValue_t; 4] = unsafe { std::mem::zeroed() };
    let req = [
        (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, u32::MAX),
        (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, u32::MAX),
        (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 3),
        (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 99),
    ];
    for (v, (id, scope)) in values.iter_mut().zip(req) {
        v.fieldId = id;
        v.scopeId = scope;
    }
    // SAFETY: `values` holds 4 initialised entries.
    let rc = unsafe {
        nvml()
            .lib()
            .nvmlDeviceGetFieldValues(d.handle(), 4, values.as_mut_ptr())
    };
    assert_eq!(rc, 0);
    assert!(r.nvlink_rx_kib > 0);
    // SAFETY: the fake sets unsigned long long values for these fields.
    unsafe {
        assert_eq!(values[0].value.ullVal, r.nvlink_rx_kib);
        assert_eq!(values[1].value.ullVal, r.nvlink_tx_kib);
        assert_eq!(values[2].value.ullVal, r.nvlink_rx_kib / links);
    }
    assert_eq!(
        values[0].valueType,
        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    );
    assert_eq!(
        values[3].nvmlReturn,
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
    );
}

#[test]
fn unsupported_capabilities_answer_not_supported() {
    let d = dev(2); // L4: power, ECC and memory temperature unsupported; no NVLink, no GPM
    let r = model().gpu_reading(2, T);
    assert!(matches!(d.power_usage(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(d.temperature(TemperatureSensor::Gpu).unwrap(), r.gpu_temp_c);
    assert_eq!(
        d.utilization_rates().unwrap().gpu,
        r.gpu_util_percent.unwrap()
    );
    let got = d
        .field_values_for(&[
            FieldId(NVML_FI_DEV_MEMORY_TEMP),
            FieldId(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
            FieldId(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION),
        ])
        .unwrap();
    assert!(matches!(
        got[0].as_ref().unwrap().value,
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        got[1].as_ref().unwrap().value,
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(value(&got[2]), r.energy_mj);
    assert!(matches!(d.gpm_support(), Err(NvmlError::NotSupported)));
    assert!(matches!(d.gpm_sample(), Err(NvmlError::NotSupported)));
    assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported)));
}

#[test]
fn gpm_metrics_on_h100() {
    let nvml = nvml();
    let d = dev(0);
    assert!(d.gpm_support().unwrap());
    let s1 = d.gpm_sample().unwrap();
    let s2 = d.gpm_sample().unwrap();
    let ids = [
        GpmMetricId::GraphicsUtil,
        GpmMetricId::SmUtil,
        GpmMetricId::SmOccupancy,
        GpmMetricId::HmmaTensorUtil,
        GpmMetricId::DramBwUtil,
        GpmMetricId::Fp64Util,
        GpmMetricId::Fp32Util,
        GpmMetricId::Fp16Util,
        GpmMetricId::PcieTxPerSec,
        GpmMetricId::PcieRxPerSec,
        GpmMetricId::IntegerUtil,
    ];
    let got = nvml_wrapper::gpm::gpm_metrics_get(nvml, &s1, &s2, &ids).unwrap();
    let g = model().gpu_reading(0, T).gpm.expect("H100 has GPM");
    let want = [
        g.graphics_util,
        g.sm_util,
        g.sm_occupancy,
        g.hmma_tensor_util,
        g.dram_bw_util,
        g.fp64_util,
        g.fp32_util,
        g.fp16_util,
        g.pcie_tx_mib_s,
        g.pcie_rx_mib_s,
    ];
    for (k, w) in want.iter().enumerate() {
        let r = got[k].as_ref().expect("supported metric");
        assert_eq!(r.metric_id, ids[k]);
        assert_eq!(r.value, *w, "{:?}", ids[k]);
        assert!(!r.metric_info.short_name.is_empty());
    }
    assert!(matches!(got[10], Err(NvmlError::NotSupported)));
    // Samples of two different GPUs cannot be compared.
    let other = dev(1).gpm_sample().unwrap();
    assert!(matches!(
        nvml_wrapper::gpm::gpm_metrics_get(nvml, &s1, &other, &ids[..1]),
        Err(NvmlError::InvalidArg)
    ));
}
