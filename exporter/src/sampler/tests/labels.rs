use super::*;

/// The text series of `name` in a snapshot's device families.
fn rendered(snap: &Snapshot, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    crate::encode::render_device_families(snap, crate::encode::Format::Text, &mut out);
    String::from_utf8(out)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(str::to_string)
        .collect()
}

fn opts(pod_uid: bool, virtual_gpus: bool) -> SamplerOptions {
    SamplerOptions {
        interval: Duration::from_secs(3600),
        hostname: None,
        replace_blanks_in_model_name: false,
        process_metrics: false,
        pod_uid,
        virtual_gpus,
        old_namespace: false,
    }
}

/// Pod `c` holds GPU 0 whole; pods `a` and `b` share GPU 1 as time-slicing replicas
/// 0 and 1; every pod has a `team` label and a UID.
fn replicas_attributor(proc_root: &std::path::Path) -> Attributor {
    use crate::attribution::device_id::DeviceId;
    use crate::attribution::kubelet::{AllocatedDevice, Allocation, KubeletView};
    use crate::attribution::pods::PodInfo;
    let alloc = |pod: &str, id: String| Allocation {
        namespace: "ns".into(),
        pod: pod.into(),
        container: "main".into(),
        resource: "nvidia.com/gpu".into(),
        shared_resource: false,
        device: AllocatedDevice::Plugin(id.parse::<DeviceId>().unwrap()),
    };
    let kubelet = KubeletView {
        generation: 1,
        allocations: vec![
            alloc("a", format!("{}::0", GPU_UUIDS[1])),
            alloc("b", format!("{}::1", GPU_UUIDS[1])),
            alloc("c", GPU_UUIDS[0].to_string()),
        ],
        up: true,
        ..KubeletView::default()
    };
    let mut directory = PodDirectory {
        generation: 2,
        synced: true,
        up: true,
        ..PodDirectory::default()
    };
    for (uid, pod) in [(UID_A, "a"), (UID_B, "b"), (UID_C, "c")] {
        directory.pods.insert(
            ("ns".to_string(), pod.to_string()),
            PodInfo {
                uid: uid.into(),
                labels: vec![("team".into(), format!("team-{pod}"))],
            },
        );
    }
    Attributor::new(
        Arc::new(ArcSwap::from_pointee(kubelet)),
        Arc::new(ArcSwap::from_pointee(directory)),
        true,
        proc_root.to_path_buf(),
    )
}

fn nvlink_and_util_plan() -> ExportPlan {
    crate::plan::counters::plan(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, n\n\
         DCGM_FI_DEV_GPU_UTIL, gauge, u\n",
        "test.csv",
    )
    .unwrap()
    .0
}

#[test]
fn virtual_gpus_repeat_a_shared_gpus_series_per_pod_with_vgpu_and_pod_uid() {
    let proc_root = tempfile::tempdir().unwrap();
    let mut s = Sampler::new(
        Box::new(ThreeGpus { cycles: 0 }),
        Arc::new(nvlink_and_util_plan()),
        opts(true, true),
        "".into(),
    )
    .with_attribution(replicas_attributor(proc_root.path()));
    s.cycle();
    let snap = s.cycle();
    let nvlink = rendered(&snap, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL");
    let on_gpu = |g: usize| -> Vec<&String> {
        nvlink
            .iter()
            .filter(|l| l.contains(&format!("{{gpu=\"{g}\"")))
            .collect()
    };
    // GPU 1: one series per pod, none for the device alone; the same value each.
    let gpu1 = on_gpu(1);
    assert_eq!(gpu1.len(), 2, "{nvlink:#?}");
    assert!(
        gpu1[0].contains(&format!(
            "container=\"main\",namespace=\"ns\",pod=\"a\",pod_uid=\"{UID_A}\",vgpu=\"0\"}}"
        )),
        "{}",
        gpu1[0]
    );
    assert!(
        gpu1[1].contains(&format!(
            "container=\"main\",namespace=\"ns\",pod=\"b\",pod_uid=\"{UID_B}\",vgpu=\"1\"}}"
        )),
        "{}",
        gpu1[1]
    );
    let value = |l: &str| l.rsplit_once(' ').unwrap().1.to_string();
    assert_eq!(value(gpu1[0]), value(gpu1[1]));
    // dcgm-exporter copies no pod labels in this mode.
    assert!(nvlink.iter().all(|l| !l.contains("team=")), "{nvlink:#?}");
    // GPU 0, held whole: its pod, its UID, no replica.
    let gpu0 = on_gpu(0);
    assert_eq!(gpu0.len(), 1, "{nvlink:#?}");
    assert!(
        gpu0[0].ends_with(&format!(
            "container=\"main\",namespace=\"ns\",pod=\"c\",pod_uid=\"{UID_C}\"}} {}",
            value(gpu0[0])
        )),
        "{}",
        gpu0[0]
    );
    // GPU 2, free: its own series.
    assert_eq!(on_gpu(2).len(), 1);
    assert!(!on_gpu(2)[0].contains("pod="));
}

#[test]
fn without_virtual_gpus_pod_labels_are_copied_and_pod_uid_only_when_asked() {
    let proc_root = tempfile::tempdir().unwrap();
    for pod_uid in [false, true] {
        let mut s = Sampler::new(
            Box::new(ThreeGpus { cycles: 0 }),
            Arc::new(nvlink_and_util_plan()),
            opts(pod_uid, false),
            "".into(),
        )
        .with_attribution(replicas_attributor(proc_root.path()));
        s.cycle();
        let snap = s.cycle();
        let nvlink = rendered(&snap, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL");
        let gpu0: Vec<_> = nvlink.iter().filter(|l| l.contains("gpu=\"0\"")).collect();
        assert_eq!(gpu0.len(), 1);
        let uid = if pod_uid {
            format!(",pod_uid=\"{UID_C}\"")
        } else {
            String::new()
        };
        assert!(
            gpu0[0].contains(&format!(
                "team=\"team-c\",container=\"main\",namespace=\"ns\",pod=\"c\"{uid}}}"
            )),
            "{}",
            gpu0[0]
        );
        // The shared GPU stays one unlabelled series, without vgpu.
        let gpu1: Vec<_> = nvlink.iter().filter(|l| l.contains("gpu=\"1\"")).collect();
        assert_eq!(gpu1.len(), 1);
        assert!(!gpu1[0].contains("pod=") && !gpu1[0].contains("vgpu="));
    }
}

/// `-o`: dcgm-exporter's 1.x label names (its transformation package's `old*`
/// attributes and the collectors' `uuid`), byte-sorted among the attributes as it
/// emits them; a pod label taking one of those names is dropped, not doubled.
#[test]
fn the_old_namespace_serves_the_1x_label_names() {
    let proc_root = tempfile::tempdir().unwrap();
    let mut s = Sampler::new(
        Box::new(ThreeGpus { cycles: 0 }),
        Arc::new(nvlink_and_util_plan()),
        SamplerOptions {
            old_namespace: true,
            ..opts(true, false)
        },
        "".into(),
    )
    .with_attribution(replicas_attributor(proc_root.path()));
    s.cycle();
    let snap = s.cycle();
    let util = rendered(&snap, "DCGM_FI_DEV_GPU_UTIL");
    assert!(util.len() >= 3, "{util:#?}");
    for line in &util {
        assert!(
            line.contains(",uuid=\"GPU-") && !line.contains("UUID="),
            "{line}"
        );
        for now in [",pod=", ",namespace=", ",container="] {
            assert!(!line.contains(now), "{line}");
        }
    }
    let gpu0 = util
        .iter()
        .find(|l| l.contains("gpu=\"0\""))
        .expect("GPU 0");
    assert!(
        gpu0.contains(&format!(
            "team=\"team-c\",container_name=\"main\",pod_name=\"c\",pod_namespace=\"ns\",pod_uid=\"{UID_C}\"}}"
        )),
        "{gpu0}"
    );
    let default = opts(false, false);
    let old = SamplerOptions {
        old_namespace: true,
        ..opts(false, false)
    };
    assert!(!default.reserved("pod_name") && old.reserved("pod_name"));
    assert!(old.reserved("pod") && old.reserved("UUID"));
}

#[test]
fn hpc_jobs_repeat_a_devices_series_per_job_and_follow_changes() {
    let jobs = Arc::new(ArcSwap::from_pointee(HpcJobs {
        generation: 1,
        by_device: [("2".to_string(), vec!["j1".to_string(), "j2".to_string()])]
            .into_iter()
            .collect(),
    }));
    let mut s = Sampler::new(
        Box::new(ThreeGpus { cycles: 0 }),
        Arc::new(nvlink_and_util_plan()),
        opts(false, false),
        "".into(),
    )
    .with_hpc_jobs(jobs.clone());
    s.cycle();
    let snap = s.cycle();
    let util = rendered(&snap, "DCGM_FI_DEV_GPU_UTIL");
    let gpu2: Vec<_> = util.iter().filter(|l| l.contains("gpu=\"2\"")).collect();
    assert_eq!(
        gpu2.iter()
            .map(|l| l.split("hpc_job=").nth(1).unwrap_or("none").to_string())
            .collect::<Vec<_>>(),
        vec![
            format!("\"j1\"}} {}", GPU_UTIL[2]),
            format!("\"j2\"}} {}", GPU_UTIL[2])
        ]
    );
    assert!(util.iter().filter(|l| l.contains("hpc_job")).count() == 2);
    // A job ends, another starts on GPU 0: the next cycle says so.
    jobs.store(Arc::new(HpcJobs {
        generation: 2,
        by_device: [("0".to_string(), vec!["k9".to_string()])]
            .into_iter()
            .collect(),
    }));
    let snap = s.cycle();
    let util = rendered(&snap, "DCGM_FI_DEV_GPU_UTIL");
    assert!(util.len() >= 3, "{util:#?}");
    let with_job: Vec<_> = util.iter().filter(|l| l.contains("hpc_job")).collect();
    assert_eq!(with_job.len(), 1);
    assert!(with_job[0].contains("gpu=\"0\"") && with_job[0].contains("hpc_job=\"k9\""));
}

#[test]
fn a_reloaded_plan_is_served_from_the_next_cycle_and_a_failed_one_is_reported() {
    let handle = Arc::new(PlanHandle::new(Arc::new(nvlink_and_util_plan())));
    let mut s = Sampler::new(
        Box::new(ThreeGpus { cycles: 0 }),
        handle.plan(),
        opts(false, false),
        "".into(),
    )
    .with_plan_updates(handle.clone());
    let snap = s.cycle();
    assert_eq!(rendered(&snap, "DCGM_FI_DEV_GPU_UTIL").len(), 3);
    assert!(rendered(&snap, "DCGM_FI_DEV_FB_USED").is_empty());
    assert_eq!(snap.config_reload.map(|r| r.successful), Some(true));
    let (plan, _) =
        crate::plan::counters::plan("DCGM_FI_DEV_FB_USED, gauge, m\n", "new.csv").unwrap();
    handle.succeeded(plan);
    let snap = s.cycle();
    assert!(rendered(&snap, "DCGM_FI_DEV_GPU_UTIL").is_empty());
    assert_eq!(
        rendered(&snap, "DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|l| l.rsplit_once(' ').unwrap().1.to_string())
            .collect::<Vec<_>>(),
        FB_USED_MIB
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
    );
    handle.failed();
    let snap = s.cycle();
    assert_eq!(snap.config_reload.map(|r| r.successful), Some(false));
    assert_eq!(
        rendered(&snap, "DCGM_FI_DEV_FB_USED").len(),
        3,
        "the running plan stays"
    );
}
