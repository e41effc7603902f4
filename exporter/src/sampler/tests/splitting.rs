use super::*;

/// An attributor whose pod directory knows `pods` (uid, namespace, name) and whose
/// `/proc` (under `proc_root`) places each of `procs` (pid, uid) in its pod.
fn attributor_with(
    proc_root: &std::path::Path,
    pods: &[(&str, &str, &str)],
    procs: &[(u32, &str)],
    synced: bool,
    kubelet: crate::attribution::kubelet::KubeletView,
) -> Attributor {
    for (pid, uid) in procs {
        let dir = proc_root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope\n",
                uid.replace('-', "_"),
                "ab".repeat(32)
            ),
        )
        .unwrap();
    }
    let mut directory = PodDirectory {
        generation: 1,
        synced,
        up: synced,
        ..PodDirectory::default()
    };
    for (uid, ns, name) in pods {
        directory
            .by_uid
            .insert(uid.to_string(), (ns.to_string(), name.to_string()));
    }
    let mut a = Attributor::new(
        Arc::new(arc_swap::ArcSwap::from_pointee(kubelet)),
        Arc::new(arc_swap::ArcSwap::from_pointee(directory)),
        true,
        proc_root.to_path_buf(),
    );
    // The shares use the directory the holdings were computed from. A generation no
    // sampler's discovery has, so a sampler computes its own holdings.
    let inv = Inventory {
        driver_version: "1".into(),
        nvml_version: "1".into(),
        entities: Vec::new(),
    };
    a.holdings(&inv, u64::MAX);
    a
}

fn holder(namespace: &str, pod: &str) -> Holder {
    Holder {
        namespace: namespace.into(),
        pod: pod.into(),
        container: None,
        pod_labels: Vec::new(),
        pod_uid: None,
        vgpu: None,
        dra: None,
    }
}

fn shared_gpu_attributor(
    proc_root: &std::path::Path,
    synced: bool,
    kubelet: crate::attribution::kubelet::KubeletView,
) -> Attributor {
    attributor_with(
        proc_root,
        &[
            (UID_A, "ns", "a"),
            (UID_B, "ns", "b"),
            (UID_C, "ns", "c"),
            (UID_D, "other", "a"),
        ],
        &[(101, UID_A), (102, UID_B), (103, UID_C), (104, UID_D)],
        synced,
        kubelet,
    )
}

#[test]
fn a_shared_gpu_is_split_between_its_holders_by_their_own_processes() {
    let proc_root = tempfile::tempdir().unwrap();
    let mut a = shared_gpu_attributor(proc_root.path(), true, Default::default());
    let holders = [holder("ns", "a"), holder("ns", "b")];
    let labels: [Arc<str>; 2] = ["pod-a".into(), "pod-b".into()];
    // Utilisation 90 % and 1000 MiB used on the device; a third metric not split.
    let mut values = [
        Some(Value::Int(90)),
        Some(Value::Int(1000)),
        Some(Value::Float(1.5)),
    ];
    let splits = [(0, Split::BySmShare), (1, Split::ByMemory)];
    let shares = split_entity(
        &mut a,
        &holders,
        &labels,
        &shared_gpu_processes(),
        &splits,
        &mut values,
    );
    // SM: the processes add up to 30 + 10 + 20 + 20 = 80 %; pod a ran 30 of them, so
    // 30/80 of the device's 90 % is 33.75, b 10/80 of it 11.25; rounded to whole
    // percent with the sum kept, a 34 and b 11; the other 45 stay on the device.
    // Memory: each holder its own MiB, the rest of the 1000 on the device.
    let expected_sm = [90 * 30 / 80 + 1, 90 * 10 / 80];
    let expected_mem = [100, 300];
    assert_eq!(shares.len(), 2, "one share per holder");
    for (i, share) in shares.iter().enumerate() {
        assert_eq!(share.labels, labels[i]);
        assert_eq!(
            share.values,
            vec![
                (0, Value::Int(expected_sm[i])),
                (1, Value::Int(expected_mem[i]))
            ],
            "share of {}",
            labels[i]
        );
    }
    assert_eq!(
        values,
        [
            Some(Value::Int(90 - expected_sm.iter().sum::<i64>())),
            Some(Value::Int(1000 - 400)),
            Some(Value::Float(1.5)),
        ],
        "the device keeps what no holder used; unsplit metrics are untouched"
    );
}

#[test]
fn without_a_synced_pod_directory_a_shared_gpu_stays_whole() {
    let proc_root = tempfile::tempdir().unwrap();
    let mut a = shared_gpu_attributor(proc_root.path(), false, Default::default());
    let holders = [holder("ns", "a"), holder("ns", "b")];
    let labels: [Arc<str>; 2] = ["pod-a".into(), "pod-b".into()];
    let mut values = [Some(Value::Int(90)), Some(Value::Int(1000))];
    let before = values;
    let shares = split_entity(
        &mut a,
        &holders,
        &labels,
        &shared_gpu_processes(),
        &[(0, Split::BySmShare), (1, Split::ByMemory)],
        &mut values,
    );
    assert!(shares.is_empty());
    assert_eq!(values, before);
}

#[test]
fn a_snapshot_splits_shared_gpus_labels_processes_and_rates_each_gpus_own_readings() {
    use crate::attribution::device_id::DeviceId;
    use crate::attribution::kubelet::{AllocatedDevice, Allocation, KubeletView};
    let proc_root = tempfile::tempdir().unwrap();
    let alloc = |pod: &str, gpu: usize| Allocation {
        namespace: "ns".into(),
        pod: pod.into(),
        container: "main".into(),
        resource: "nvidia.com/gpu".into(),
        shared_resource: false,
        device: AllocatedDevice::Plugin(GPU_UUIDS[gpu].parse::<DeviceId>().unwrap()),
    };
    let kubelet = KubeletView {
        generation: 1,
        allocations: vec![
            alloc("a", 1),
            alloc("a", 2),
            alloc("b", 1),
            alloc("b", 2),
            alloc("c", 0),
        ],
        up: true,
        ..KubeletView::default()
    };
    let a = shared_gpu_attributor(proc_root.path(), true, kubelet);
    // The rate first, the split metrics last: a share's slice of the values must
    // start at its own GPU's first metric.
    let (plan, _) = crate::plan::counters::plan(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, n\n\
         DCGM_FI_DEV_SM_CLOCK, gauge, c\n\
         DCGM_FI_DEV_GPU_UTIL, gauge, u\n\
         DCGM_FI_DEV_FB_USED, gauge, m\n",
        "test.csv",
    )
    .unwrap();
    let index = |name: &str| plan.metrics.iter().position(|m| m.name == name).unwrap();
    let (rate, clock, util, fb) = (
        index("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"),
        index("DCGM_FI_DEV_SM_CLOCK"),
        index("DCGM_FI_DEV_GPU_UTIL"),
        index("DCGM_FI_DEV_FB_USED"),
    );
    let metrics = plan.metrics.len();
    let mut s = Sampler::new(
        Box::new(ThreeGpus { cycles: 0 }),
        Arc::new(plan),
        SamplerOptions {
            interval: Duration::from_secs(3600),
            hostname: None,
            replace_blanks_in_model_name: false,
            process_metrics: true,
            pod_uid: false,
            virtual_gpus: false,
            old_namespace: false,
        },
        "".into(),
    )
    .with_attribution(a);

    let started = Instant::now();
    let first = s.cycle();
    assert!(first.source_up);
    assert_eq!(first.field_errors, vec![("DCGM_FI_DEV_SM_CLOCK", 3)]);
    for e in 0..3 {
        assert!(first.entities[e].up);
        assert_eq!(
            first.values[e * metrics + rate],
            None,
            "one reading, no rate"
        );
        assert_eq!(first.values[e * metrics + clock], None);
    }
    let snap = s.cycle();
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(snap.field_errors, vec![("DCGM_FI_DEV_SM_CLOCK", 6)]);
    assert_eq!(snap.entities.len(), 3);
    let value = |e: usize, m: usize| snap.values[e * metrics + m];

    // Rates: GPU e's counter advanced (e + 1) steps over the same interval, at most
    // `elapsed`, so its rate is (e + 1) times GPU 0's and at least step / elapsed.
    let rates: Vec<i64> = (0..3)
        .map(|e| match value(e, rate) {
            Some(Value::Int(r)) => r,
            other => panic!("GPU {e}: no rate after two readings: {other:?}"),
        })
        .collect();
    assert!(rates[0] as f64 >= NVLINK_STEP_KIB as f64 / elapsed / 1000.0 - 0.5);
    for e in 1..3 {
        assert!(
            (rates[e] - (e as i64 + 1) * rates[0]).abs() <= 1,
            "rates {rates:?}"
        );
    }

    // GPU 0, held whole: its own values, no shares, its processes not given a pod
    // (the device's labels already name it).
    assert!(snap.entities[0].up);
    assert_eq!(value(0, util), Some(Value::Int(GPU_UTIL[0] as i64)));
    assert_eq!(value(0, fb), Some(Value::Int(FB_USED_MIB[0] as i64)));
    assert!(snap.entities[0].shares.is_empty());
    let pods = |e: usize| -> Vec<(u32, Option<(String, String)>)> {
        snap.entities[e]
            .processes
            .iter()
            .map(|p| {
                let pod = p
                    .pod
                    .as_ref()
                    .map(|r| (r.namespace.to_string(), r.pod.to_string()));
                (p.sample.pid, pod)
            })
            .collect()
    };
    assert_eq!(pods(0), vec![(103, None)]);

    // GPU 1, shared: split as in
    // `a_shared_gpu_is_split_between_its_holders_by_their_own_processes`.
    let shares: Vec<Vec<(usize, Value)>> = snap.entities[1]
        .shares
        .iter()
        .map(|s| s.values.clone())
        .collect();
    let expected_sm = [90 * 30 / 80 + 1, 90 * 10 / 80];
    assert_eq!(
        shares,
        vec![
            vec![(util, Value::Int(expected_sm[0])), (fb, Value::Int(100))],
            vec![(util, Value::Int(expected_sm[1])), (fb, Value::Int(300))],
        ]
    );
    assert_eq!(value(1, util), Some(Value::Int(90 - 45)));
    assert_eq!(value(1, fb), Some(Value::Int(1000 - 400)));
    let pod = |ns: &str, name: &str| Some((ns.to_string(), name.to_string()));
    assert_eq!(
        pods(1),
        vec![
            (101, pod("ns", "a")),
            (102, pod("ns", "b")),
            (103, pod("ns", "c")),
            (104, pod("other", "a")),
            (105, None),
        ]
    );

    // GPU 2, shared but with no process list: left whole rather than split blind.
    assert!(snap.entities[2].shares.is_empty());
    assert_eq!(value(2, util), Some(Value::Int(GPU_UTIL[2] as i64)));
    assert_eq!(value(2, fb), Some(Value::Int(FB_USED_MIB[2] as i64)));
    assert!(snap.entities[2].processes.is_empty());
}
