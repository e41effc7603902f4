//! One sampling cycle of the big node (8 GPUs, 4 in MIG mode with 7 instances each,
//! 200 processes) through the real NVML code path: nvml-wrapper calling the fake
//! libnvidia-ml this workspace builds. The simulated source on the same plan is the
//! in-process baseline, so the ratio is the cost of going through the NVML ABI.
//!
//! The fake driver answers in microseconds; a real driver's calls take far longer, so
//! these figures bound the exporter's own overhead, not a real GPU's cycle time.
//!
//! ```sh
//! cargo build --release -p fake-nvml
//! GPU_SIM_SCENARIO=builtin:big-node GPU_SIM_FROZEN_AT_S=100 \
//!   cargo bench -p gpu-exporter --bench nvml_cycle
//! ```
//!
//! On a machine with a real GPU, `NVML_BENCH_LIB=/path/to/libnvidia-ml.so.1` times the
//! same cycles against the real driver instead (no simulated baseline: the node is
//! whatever the machine has); `exporter/benches/real-gpu.sh` does this.

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_exporter::plan::counters::{self, ExportPlan};
use gpu_exporter::sampler::{Sampler, SamplerOptions};
use gpu_exporter::source::GpuSource;
use gpu_exporter::source::nvml::NvmlSource;
use gpu_exporter::source::simulated::SimulatedSource;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

fn sampler(source: Box<dyn GpuSource>, plan: &ExportPlan, processes: bool) -> Sampler {
    Sampler::new(
        source,
        Arc::new(plan.clone()),
        SamplerOptions {
            interval: Duration::from_secs(1),
            hostname: Some(("Hostname".into(), "bench".into())),
            replace_blanks_in_model_name: false,
            process_metrics: processes,
            pod_uid: false,
            virtual_gpus: false,
            old_namespace: false,
        },
        Arc::from("version=\"bench\""),
    )
}

/// Cycles against a real driver: default counters, then every field with processes.
fn bench_real(c: &mut Criterion, lib: PathBuf, all_fields: &str) {
    for (name, csv, processes) in [
        ("default-counters", counters::DEFAULT_COUNTERS, false),
        ("all-fields+processes", all_fields, true),
    ] {
        let (plan, _) = counters::plan(csv, name).expect("plan");
        let mut nvml = sampler(
            Box::new(NvmlSource::new(Some(lib.clone()))),
            &plan,
            processes,
        );
        for _ in 0..2 {
            let snap = nvml.cycle();
            assert!(snap.source_up, "the real NVML source must come up");
            println!(
                "{name}: {} entities, {} values",
                snap.entities.len(),
                snap.values.iter().flatten().count()
            );
        }
        let mut g = c.benchmark_group(format!("real-gpu-cycle/{name}"));
        g.bench_function("nvml-real-driver", |b| {
            b.iter(|| black_box(nvml.cycle().values.len()))
        });
        g.finish();
    }
}

fn bench(c: &mut Criterion) {
    let all_fields = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/all-fields.csv"
    ))
    .expect("all-fields.csv");
    if let Some(lib) = std::env::var_os("NVML_BENCH_LIB") {
        return bench_real(c, PathBuf::from(lib), &all_fields);
    }
    assert_eq!(
        std::env::var("GPU_SIM_SCENARIO").as_deref(),
        Ok("builtin:big-node"),
        "run with GPU_SIM_SCENARIO=builtin:big-node GPU_SIM_FROZEN_AT_S=100 (see the module doc)"
    );
    let lib = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/release/libnvidia_ml.so"
    ));
    assert!(
        lib.exists(),
        "build the fake first: cargo build --release -p fake-nvml"
    );
    let scenario = gpu_sim::Scenario::builtin("big-node").expect("scenario");
    for (name, csv, processes) in [
        ("default-counters", counters::DEFAULT_COUNTERS, false),
        ("all-fields+processes", all_fields.as_str(), true),
    ] {
        let (plan, _) = counters::plan(csv, name).expect("plan");
        let mut nvml = sampler(
            Box::new(NvmlSource::new(Some(lib.clone()))),
            &plan,
            processes,
        );
        let mut node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
        node.freeze_at(100.0);
        let mut sim = sampler(
            Box::new(SimulatedSource::new(node, "big-node")),
            &plan,
            processes,
        );
        // Discovery and the first GPM sample happen outside the measurement.
        for _ in 0..2 {
            assert!(nvml.cycle().source_up, "the NVML source must come up");
            sim.cycle();
        }
        let mut g = c.benchmark_group(format!("big-node-cycle/{name}"));
        g.bench_function("nvml-via-fake-libnvidia-ml", |b| {
            b.iter(|| black_box(nvml.cycle().values.len()))
        });
        g.bench_function("baseline-simulated", |b| {
            b.iter(|| black_box(sim.cycle().values.len()))
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4)).sample_size(30);
    targets = bench
}
criterion_main!(benches);
