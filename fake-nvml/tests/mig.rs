//! MIG: mode, instance handles, IDs, UUIDs, memory, processes and GPM per instance.

mod common;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;

const SCENARIO: &str = "mig.toml";
const T: f64 = 42.0;

fn nvml() -> &'static Nvml {
    &common::shared(SCENARIO, Some(T)).0
}

fn model() -> gpu_sim::SimNode {
    common::model(SCENARIO, T)
}

#[test]
fn mig_mode_and_instance_handles() {
    let (nvml, m) = (nvml(), model());
    let gpu = nvml.device_by_index(0).unwrap();
    let whole = nvml.device_by_index(1).unwrap();
    let g = &m.gpus[0];
    assert_eq!(gpu.mig_mode().unwrap().current, 1);
    assert_eq!(whole.mig_mode().unwrap().current, 0);
    assert_eq!(gpu.mig_device_count().unwrap(), 7);
    assert_eq!(whole.mig_device_count().unwrap(), 0);
    assert!(!gpu.mig_is_mig_device_handle().unwrap());
    assert!(matches!(
        gpu.mig_device_by_index(g.mig.len() as u32),
        Err(NvmlError::NotFound)
    ));

    let mut handles = Vec::new();
    for (k, inst) in g.mig.iter().enumerate() {
        let mig = gpu.mig_device_by_index(k as u32).unwrap();
        assert!(mig.mig_is_mig_device_handle().unwrap());
        let uuid = mig.uuid().unwrap();
        assert!(uuid.starts_with("MIG-"));
        assert_eq!(uuid, inst.uuid);
        assert_eq!(
            mig.name().unwrap(),
            format!("{} MIG {}", g.model.name, inst.profile.name)
        );
        assert_eq!(mig.mig_parent_device().unwrap().uuid().unwrap(), g.uuid);
        let by_uuid = nvml.device_by_uuid(uuid.as_str()).unwrap();
        // SAFETY: raw handles are only compared.
        unsafe {
            assert_eq!(by_uuid.handle(), mig.handle());
            assert_ne!(mig.handle(), gpu.handle());
            handles.push(mig.handle());
        }
        let lib = nvml.lib();
        let (mut gi, mut ci) = (0u32, 0u32);
        // SAFETY: valid handle and out-pointers.
        unsafe {
            assert_eq!(lib.nvmlDeviceGetGpuInstanceId(mig.handle(), &mut gi), 0);
            assert_eq!(lib.nvmlDeviceGetComputeInstanceId(mig.handle(), &mut ci), 0);
        }
        assert_eq!((gi, ci), (inst.gpu_instance_id, inst.compute_instance_id));

        let mem = mig.memory_info().unwrap();
        let want = m.mig_reading(0, k, T).memory;
        assert_eq!(
            (mem.total, mem.used, mem.free),
            (want.total, want.used, want.free)
        );

        let procs = mig.running_compute_processes().unwrap();
        let want = m.mig_processes(0, k, T);
        assert_eq!(procs.len(), want.len());
        for (p, w) in procs.iter().zip(&want) {
            assert_eq!(p.pid, w.pid);
            assert_eq!(p.gpu_instance_id, Some(inst.gpu_instance_id));
            assert_eq!(p.compute_instance_id, Some(inst.compute_instance_id));
        }
        // Whole-GPU queries on an instance.
        assert!(matches!(
            mig.utilization_rates(),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(mig.power_usage(), Err(NvmlError::NotSupported)));
        assert!(matches!(
            mig.mig_device_count(),
            Err(NvmlError::NotSupported)
        ));
    }
    handles.sort();
    handles.dedup();
    assert_eq!(handles.len(), g.mig.len(), "distinct handles per instance");

    // A whole GPU has no instance IDs.
    let mut id = 0u32;
    // SAFETY: valid handle and out-pointer.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceId(whole.handle(), &mut id)
    };
    assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
}

#[test]
fn mig_parent_reports_memory_and_all_processes_but_no_utilisation() {
    let (nvml, m) = (nvml(), model());
    let gpu = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        gpu.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        gpu.process_utilization_stats(None),
        Err(NvmlError::NotSupported)
    ));
    let r = m.gpu_reading(0, T);
    let mem = gpu.memory_info().unwrap();
    assert_eq!((mem.total, mem.used), (r.memory.total, r.memory.used));
    assert_eq!(gpu.power_usage().unwrap(), r.power_mw);
    let procs = gpu.running_compute_processes().unwrap();
    let want = m.gpu_processes(0, T);
    assert_eq!(procs.len(), want.len());
    assert!(procs.iter().all(|p| p.gpu_instance_id.is_some()));
    // The whole GPU next to it.
    let whole = nvml.device_by_index(1).unwrap();
    let p = whole.running_compute_processes().unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].gpu_instance_id, p[0].compute_instance_id),
        (None, None)
    );
}

#[test]
fn gpu_instance_profiles() {
    let (nvml, m) = (nvml(), model());
    let gpu = nvml.device_by_index(0).unwrap();
    for p in m.gpus[0].model.mig_profiles {
        let info = gpu.profile_info(p.profile_id).unwrap();
        // The unique ID, not the index asked for (19 for 1g.10gb, as nvidia-smi shows).
        assert_eq!(info.id, p.id);
        assert_eq!(info.slice_count, p.slices);
        assert_eq!(info.memory_size_mb, p.memory_mib);
    }
    // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
    let mut v: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    v.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
    // SAFETY: valid handle and struct.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceProfileInfoV(gpu.handle(), 2, &mut v)
    };
    assert_eq!(rc, 0);
    // SAFETY: the fake NUL-terminates the name.
    let name = unsafe { std::ffi::CStr::from_ptr(v.name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "MIG 3g.40gb");
}

#[test]
fn gpm_per_instance() {
    let (nvml, m) = (nvml(), model());
    let gpu = nvml.device_by_index(0).unwrap();
    let g = &m.gpus[0];
    let ids = [GpmMetricId::SmUtil, GpmMetricId::PcieTxPerSec];
    for (k, inst) in g.mig.iter().enumerate() {
        let want = m.mig_reading(0, k, T).gpm.unwrap();
        // Through the parent with a GPU-instance ID …
        let s1 = gpu.gpm_mig_sample(inst.gpu_instance_id).unwrap();
        let s2 = gpu.gpm_mig_sample(inst.gpu_instance_id).unwrap();
        let got = nvml_wrapper::gpm::gpm_metrics_get(nvml, &s1, &s2, &ids).unwrap();
        assert_eq!(got[0].as_ref().unwrap().value, want.sm_util);
        assert_eq!(got[1].as_ref().unwrap().value, want.pcie_tx_mib_s);
        // … and on the instance's own handle.
        let mig = gpu.mig_device_by_index(k as u32).unwrap();
        let s1 = mig.gpm_sample().unwrap();
        let s2 = mig.gpm_sample().unwrap();
        let got = nvml_wrapper::gpm::gpm_metrics_get(nvml, &s1, &s2, &ids).unwrap();
        assert_eq!(got[0].as_ref().unwrap().value, want.sm_util);
    }
    assert!(matches!(gpu.gpm_mig_sample(99), Err(NvmlError::NotFound)));
}

#[test]
fn gpu_instances_by_id_report_profile_and_placement() {
    let (nvml, m) = (nvml(), model());
    let gpu = nvml.device_by_index(0).unwrap();
    let whole = nvml.device_by_index(1).unwrap();
    let g = &m.gpus[0];
    let lib = nvml.lib();
    let mut occupied = [false; 8];
    for inst in &g.mig {
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: valid device handle and out-pointer.
        let rc = unsafe {
            lib.nvmlDeviceGetGpuInstanceById(gpu.handle(), inst.gpu_instance_id, &mut gi)
        };
        assert_eq!(rc, 0);
        // SAFETY: a plain C struct, for which all-zero bytes are a valid value.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a handle the library just gave out, and a valid out-pointer.
        assert_eq!(unsafe { lib.nvmlGpuInstanceGetInfo(gi, &mut info) }, 0);
        assert_eq!(info.id, inst.gpu_instance_id);
        // SAFETY: raw handles are only compared.
        assert_eq!(info.device, unsafe { gpu.handle() });
        // The profile ID is the unique one, which profile info by ID answers for.
        let by_id = gpu.profile_info(inst.profile.profile_id).unwrap();
        assert_eq!(info.profileId, by_id.id);
        let (start, size) = (info.placement.start, info.placement.size);
        assert_eq!(size, inst.profile.memory_slices);
        // Hardware rules: aligned to its size, inside the eight memory slices, and no
        // two instances share a slice.
        assert_eq!(start % size, 0, "{inst:?}");
        assert!(start + size <= 8);
        for s in start..start + size {
            assert!(!occupied[s as usize], "slice {s} used twice");
            occupied[s as usize] = true;
        }
        // Reading is allowed; changing the configuration is not.
        let mut count = 0u32;
        // SAFETY: valid GPU-instance handle and out-pointers (NVML checks before writing).
        let rc = unsafe {
            lib.nvmlGpuInstanceGetComputeInstances(gi, 0, std::ptr::null_mut(), &mut count)
        };
        assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_NO_PERMISSION);
    }
    // 3g.40gb then two 2g.20gb: the only packing puts the 3g instance at slice 4.
    assert_eq!(g.mig[0].placement_start, 4);
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid handles and out-pointers.
    unsafe {
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceById(gpu.handle(), 99, &mut gi),
            nvmlReturn_enum_NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceById(whole.handle(), 1, &mut gi),
            nvmlReturn_enum_NVML_ERROR_NOT_FOUND
        );
        let mut info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
        let bogus = 0x10 as nvmlGpuInstance_t;
        assert_eq!(
            lib.nvmlGpuInstanceGetInfo(bogus, &mut info),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
    }
}
