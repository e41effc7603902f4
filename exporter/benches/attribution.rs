//! Pod attribution cost per sampling cycle on the "big node" (8 GPUs, 4 in MIG mode
//! with 7 instances each, 200 processes) with 120 pods: the 28 MIG instances held
//! whole by one pod each, and the 4 whole GPUs time-sliced between 23 pods each, so
//! every one of the 200 processes is mapped to its pod through its cgroup file.
//!
//! Baseline in the same process: the same cycle without attribution. Cases:
//! - `steady`: allocations and pods unchanged (the common case: holdings and labels
//!   reused, cgroups cached per live process, shares computed);
//! - `changed`: the kubelet's allocations change every cycle (holdings resolved and
//!   every label set rebuilt);
//! - `cold_cgroups`: as `steady`, but every process's cgroup file read afresh (a cycle
//!   right after every process restarted).
//! - `steady_process_metrics`: as `steady` with `--process-metrics`, where processes
//!   on shared GPUs also carry their pod, against `baseline_process_metrics` (process
//!   series, no attribution).
//!
//! `cargo bench -p gpu-exporter --bench attribution`

use arc_swap::ArcSwap;
use criterion::{Criterion, criterion_group, criterion_main};
use gpu_exporter::attribution::Attributor;
use gpu_exporter::attribution::device_id::DeviceId;
use gpu_exporter::attribution::kubelet::{AllocatedDevice, Allocation, KubeletView};
use gpu_exporter::attribution::pods::{PodDirectory, PodInfo};
use gpu_exporter::plan::counters;
use gpu_exporter::sampler::{Sampler, SamplerOptions};
use gpu_exporter::source::simulated::SimulatedSource;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

struct Fixture {
    node: gpu_sim::SimNode,
    kubelet: Arc<ArcSwap<KubeletView>>,
    pods: Arc<ArcSwap<PodDirectory>>,
    proc_dir: tempfile::TempDir,
}

fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

fn fixture() -> Fixture {
    let scenario = gpu_sim::Scenario::builtin("big-node").expect("built-in scenario");
    let mut node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
    node.freeze_at(100.0);
    let proc_dir = tempfile::tempdir().expect("temp dir");
    let mut allocations = Vec::new();
    let mut dir = PodDirectory {
        generation: 1,
        synced: true,
        up: true,
        ..PodDirectory::default()
    };
    let mut add_pod = |name: String, id: String, replica: bool, pids: Vec<u32>, root: &Path| {
        let i = dir.pods.len();
        let key = ("bench".to_string(), name.clone());
        dir.pods.insert(
            key.clone(),
            PodInfo {
                uid: uid(i),
                labels: vec![("app".into(), format!("app-{}", i % 7))],
            },
        );
        dir.by_uid.insert(uid(i), key);
        let mut parsed: DeviceId = id.parse().expect("device ID");
        if replica {
            parsed.replica = Some(i as u32);
        }
        allocations.push(Allocation {
            namespace: "bench".into(),
            pod: name.into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            shared_resource: false,
            device: AllocatedDevice::Plugin(parsed),
        });
        let container = format!("{:064x}", i + 1);
        for pid in pids {
            let d = root.join(pid.to_string());
            std::fs::create_dir_all(&d).expect("proc dir");
            std::fs::write(
                d.join("cgroup"),
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container}.scope\n",
                    uid(i).replace('-', "_")
                ),
            )
            .expect("cgroup file");
        }
    };
    for g in &node.gpus {
        if g.mig.is_empty() {
            for p in 0..23 {
                let pids = g
                    .processes
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| k % 23 == p)
                    .map(|(_, proc)| proc.pid)
                    .collect();
                add_pod(
                    format!("shared-{}-{p}", g.index),
                    g.uuid.clone(),
                    true,
                    pids,
                    proc_dir.path(),
                );
            }
        } else {
            for (slot, m) in g.mig.iter().enumerate() {
                add_pod(
                    format!("mig-{}-{slot}", g.index),
                    format!("{}:{slot}", g.index),
                    false,
                    m.processes.iter().map(|p| p.pid).collect(),
                    proc_dir.path(),
                );
            }
        }
    }
    assert_eq!(dir.pods.len(), 120, "120 pods");
    let kubelet = KubeletView {
        generation: 1,
        allocations,
        up: true,
        ..KubeletView::default()
    };
    Fixture {
        node,
        kubelet: Arc::new(ArcSwap::from_pointee(kubelet)),
        pods: Arc::new(ArcSwap::from_pointee(dir)),
        proc_dir,
    }
}

fn sampler(f: &Fixture, attribution: bool, process_metrics: bool) -> Sampler {
    let (plan, _) = counters::plan(counters::DEFAULT_COUNTERS, "default").expect("default plan");
    let source = SimulatedSource::new(f.node.clone(), "builtin:big-node");
    let s = Sampler::new(
        Box::new(source),
        Arc::new(plan),
        SamplerOptions {
            interval: Duration::from_secs(1),
            hostname: Some(("Hostname".into(), "gpu-node-17.example.internal".into())),
            replace_blanks_in_model_name: false,
            process_metrics,
            pod_uid: false,
            virtual_gpus: false,
            old_namespace: false,
        },
        Arc::from("version=\"bench\",source=\"simulated\""),
    );
    if attribution {
        s.with_attribution(Attributor::new(
            f.kubelet.clone(),
            f.pods.clone(),
            true,
            f.proc_dir.path().to_path_buf(),
        ))
    } else {
        s
    }
}

fn bench(c: &mut Criterion) {
    let f = fixture();
    let mut g = c.benchmark_group("attribution_cycle");

    let mut plain = sampler(&f, false, false);
    g.bench_function("baseline_no_attribution", |b| {
        b.iter(|| black_box(plain.cycle()))
    });

    let mut steady = sampler(&f, true, false);
    let snap = steady.cycle();
    let shares: usize = snap.entities.iter().map(|e| e.shares.len()).sum();
    let labelled = snap
        .entities
        .iter()
        .filter(|e| e.labels.contains("pod="))
        .count();
    println!(
        "fixture: {} entities, {labelled} held whole, {shares} pod shares, {} allocation series",
        snap.entities.len(),
        snap.allocations.len()
    );
    assert_eq!(shares, 92, "every time-slicing pod has a share");
    assert_eq!(labelled, 28, "every MIG instance is labelled");
    g.bench_function("steady", |b| b.iter(|| black_box(steady.cycle())));
    let per_cycle: Vec<f64> = (0..200)
        .filter_map(|_| steady.cycle().attribution.map(|a| a.duration_seconds))
        .collect();
    println!(
        "steady: attribution work per cycle, as the sampler measures it: mean {:.1} µs",
        per_cycle.iter().sum::<f64>() / per_cycle.len() as f64 * 1e6
    );

    let mut changed = sampler(&f, true, false);
    g.bench_function("changed", |b| {
        b.iter(|| {
            let mut v = KubeletView::clone(&f.kubelet.load());
            v.generation += 1;
            // Rename one container, so the holdings really differ and labels are rebuilt.
            let next = if &*v.allocations[0].container == "main" {
                "main2"
            } else {
                "main"
            };
            v.allocations[0].container = next.into();
            f.kubelet.store(Arc::new(v));
            black_box(changed.cycle())
        })
    });

    let mut cold = sampler(&f, true, false);
    g.bench_function("cold_cgroups", |b| {
        b.iter(|| {
            if let Some(a) = cold.attributor_mut() {
                a.forget_processes();
            }
            black_box(cold.cycle())
        })
    });

    // With --process-metrics: the processes on time-sliced GPUs get their pods (those on
    // MIG instances held whole do not need them: the device's labels name the pod),
    // against the same cycle with process series but no attribution.
    let mut plain_processes = sampler(&f, false, true);
    g.bench_function("baseline_process_metrics", |b| {
        b.iter(|| black_box(plain_processes.cycle()))
    });
    let mut steady_processes = sampler(&f, true, true);
    let snap = steady_processes.cycle();
    let with_pod = snap
        .entities
        .iter()
        .flat_map(|e| &e.processes)
        .filter(|p| p.pod.is_some())
        .count();
    println!("process series with their pod: {with_pod}");
    assert!(with_pod > 0, "processes on shared GPUs name their pods");
    g.bench_function("steady_process_metrics", |b| {
        b.iter(|| black_box(steady_processes.cycle()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
