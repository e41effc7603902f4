//! One pod change at fleet scale: what the pod watch does per change (insert the
//! pod's record, publish a copy of the index for readers), at 51,875 pods in 500
//! namespaces, the 100,000-GPU fleet of docs/benchmarks/fleet-scale.md. The index is a
//! persistent map (`imbl::OrdMap`); `btreemap-copy` is the same change with the
//! `BTreeMap` it replaced, whose copy was a deep one of every pod's labels.
//!
//! `cargo bench -p gpu-metrics-adapter --bench pod_index`

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use gpu_metrics_adapter::source::pods::{PodIndex, PodInfo, Workload};
use std::collections::BTreeMap;
use std::hint::black_box;

const PODS: u32 = 51_875;

type Key = (String, String);

fn pods() -> Vec<(Key, PodInfo)> {
    (0..PODS)
        .map(|i| {
            let app = format!("app-{}", i / 8);
            let labels = [
                ("app", app.as_str()),
                ("pod-template-hash", "7c9f8d6b5"),
                ("team", "ml"),
                ("tier", "inference"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let workloads = vec![
                Workload {
                    resource: "replicasets.apps",
                    name: format!("{app}-7c9f8d6b5"),
                },
                Workload {
                    resource: "deployments.apps",
                    name: app.clone(),
                },
            ];
            (
                (format!("ns-{}", i % 500), format!("{app}-{i}")),
                PodInfo { labels, workloads },
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let all = pods();
    let (key, info) = all[PODS as usize / 2].clone();
    let mut changed = info.clone();
    changed.labels.insert("rollout".into(), "2".into());
    let mut g = c.benchmark_group("pod-change-at-51875-pods");
    let mut index = PodIndex {
        pods: all.iter().cloned().collect(),
        ..PodIndex::default()
    };
    // As in the watch: the last published copy is still held (readers have it) when the
    // next change comes, so the insert copies the changed path.
    let mut published = index.clone();
    g.bench_function("ordmap-insert-and-publish", |b| {
        b.iter(|| {
            index.pods.insert(key.clone(), changed.clone());
            published = black_box(index.clone());
        })
    });
    drop(published);
    let old: BTreeMap<Key, PodInfo> = all.into_iter().collect();
    g.sample_size(10);
    g.bench_function("btreemap-copy", |b| {
        b.iter_batched_ref(
            || old.clone(),
            |m| {
                m.insert(key.clone(), changed.clone());
                black_box(m.clone())
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
