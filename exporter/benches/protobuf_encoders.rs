//! The protobuf exposition of the big node's device families (8 GPUs, 4 in MIG mode
//! with 7 instances each, 200 processes), written two ways from the same walk over the
//! same snapshot: the hand-written wire writer the exporter serves, and prost's
//! generated `MetricFamily` structs built per family and `encode_length_delimited`.
//! Before timing, both bodies are decoded and must be equal, and the bytes and
//! allocations of one encode of each are printed (a counting allocator).
//!
//! `cargo bench -p gpu-exporter --bench protobuf_encoders`
// A counting global allocator is unsafe to implement: it only forwards to `System`.
#![allow(unsafe_code)]

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_exporter::encode::{self, Format};
use gpu_exporter::plan::counters;
use gpu_exporter::sampler::{Sampler, SamplerOptions};
use gpu_exporter::snapshot::Snapshot;
use gpu_exporter::source::simulated::SimulatedSource;
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// The system allocator, counting what it hands out.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed through to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ALLOCATED_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`realloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ALLOCATED_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// (allocations, bytes) during `f`.
fn allocations(f: impl FnOnce()) -> (u64, u64) {
    let (n, b) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        ALLOCATED_BYTES.load(Ordering::Relaxed),
    );
    f();
    (
        ALLOCATIONS.load(Ordering::Relaxed) - n,
        ALLOCATED_BYTES.load(Ordering::Relaxed) - b,
    )
}

fn big_node(csv: &str, name: &str) -> Snapshot {
    let (plan, _) = counters::plan(csv, name).expect("plan");
    let scenario = gpu_sim::Scenario::builtin("big-node").expect("built-in scenario");
    let mut node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
    node.freeze_at(100.0);
    let mut sampler = Sampler::new(
        Box::new(SimulatedSource::new(node, "builtin:big-node")),
        Arc::new(plan),
        SamplerOptions {
            interval: Duration::from_secs(1),
            hostname: Some(("Hostname".into(), "gpu-node-17.example.internal".into())),
            replace_blanks_in_model_name: false,
            process_metrics: true,
            pod_uid: false,
            virtual_gpus: false,
            old_namespace: false,
        },
        Arc::from("version=\"bench\",source=\"simulated\""),
    );
    sampler.cycle();
    sampler.cycle()
}

fn hand_written(snap: &Snapshot, out: &mut Vec<u8>) {
    encode::render_device_families(snap, Format::Protobuf, out);
}

fn prost(snap: &Snapshot, out: &mut Vec<u8>) {
    encode::render_device_families_prost(snap, out);
}

fn bench(c: &mut Criterion) {
    let all_fields = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/all-fields.csv"
    ))
    .expect("all-fields.csv");
    for (name, csv) in [
        ("default-counters", counters::DEFAULT_COUNTERS),
        ("all-fields", all_fields.as_str()),
    ] {
        let snap = big_node(csv, name);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let hand_alloc = allocations(|| hand_written(&snap, &mut a));
        let prost_alloc = allocations(|| prost(&snap, &mut b));
        let families = encode::protobuf::decode(&a).expect("hand-written body decodes");
        assert_eq!(
            families,
            encode::protobuf::decode(&b).expect("prost body decodes"),
            "both encoders carry the same families"
        );
        let series: usize = families.iter().map(|f| f.metric.len()).sum();
        println!(
            "{name}: {series} series, {} bytes; one encode allocates: hand-written {} times / {} bytes, prost {} times / {} bytes",
            a.len(),
            hand_alloc.0,
            hand_alloc.1,
            prost_alloc.0,
            prost_alloc.1
        );
        let mut g = c.benchmark_group(format!("protobuf-{name}"));
        let mut out = Vec::with_capacity(a.len());
        g.bench_function("hand-written", |bench| {
            bench.iter(|| {
                out.clear();
                hand_written(black_box(&snap), &mut out);
                black_box(out.len())
            })
        });
        g.bench_function("prost", |bench| {
            bench.iter(|| {
                out.clear();
                prost(black_box(&snap), &mut out);
                black_box(out.len())
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
