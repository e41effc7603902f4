//! Render cost on the "big node" (8 GPUs, 4 in MIG mode with 7 instances each, 200
//! processes): the per-snapshot render in text, OpenMetrics and protobuf, the
//! per-scrape cost of serving the cached render, a sampling cycle against the simulated
//! source, and a naive `write!`-based renderer of the same series as the in-process
//! baseline.
//!
//! `cargo bench -p gpu-exporter --bench render`; per-series figures: divide by the series
//! count printed first.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_exporter::encode::{self, Format, ScrapeStats};
use gpu_exporter::plan::counters::{self, ExportPlan};
use gpu_exporter::sampler::{Sampler, SamplerOptions};
use gpu_exporter::snapshot::{Snapshot, Value};
use gpu_exporter::source::simulated::SimulatedSource;
use std::hint::black_box;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

fn sampler(plan: ExportPlan) -> Sampler {
    let scenario = gpu_sim::Scenario::builtin("big-node").expect("built-in scenario");
    let mut node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
    node.freeze_at(100.0);
    let source = SimulatedSource::new(node, "builtin:big-node");
    Sampler::new(
        Box::new(source),
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
    )
}

fn series_count(body: &[u8]) -> usize {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty() && l[0] != b'#')
        .count()
}

/// What a straightforward implementation would do: `write!` every line.
fn naive_render(snap: &Snapshot, out: &mut Vec<u8>) {
    for (m, field) in snap.plan.metrics.iter().enumerate() {
        let _ = writeln!(out, "# HELP {} {}", field.name, field.help);
        let _ = writeln!(out, "# TYPE {} gauge", field.name);
        for (e, entity) in snap.entities.iter().enumerate() {
            match snap.value(e, m) {
                Some(Value::Int(v)) => {
                    let _ = writeln!(out, "{}{{{}}} {}", field.name, entity.labels, v);
                }
                Some(Value::Float(v)) => {
                    let _ = writeln!(out, "{}{{{}}} {:.6}", field.name, entity.labels, v);
                }
                None => {}
            }
        }
        for (l, link) in snap.links.iter().enumerate() {
            match snap.link_value(l, m) {
                Some(Value::Int(v)) => {
                    let _ = writeln!(out, "{}{{{}}} {}", field.name, link.labels, v);
                }
                Some(Value::Float(v)) => {
                    let _ = writeln!(out, "{}{{{}}} {:.6}", field.name, link.labels, v);
                }
                None => {}
            }
        }
    }
    for e in snap.entities.iter().filter(|e| e.is_gpu) {
        let _ = writeln!(
            out,
            "gpu_exporter_gpu_up{{{}}} {}",
            e.labels,
            u8::from(e.up)
        );
    }
    for e in &snap.entities {
        for (code, stat) in &e.xids {
            let _ = writeln!(
                out,
                "gpu_exporter_xid_errors_total{{{},xid=\"{code}\"}} {}",
                e.labels, stat.count
            );
            let seen = stat
                .last_seen
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            let _ = writeln!(
                out,
                "gpu_exporter_xid_last_seen_timestamp_seconds{{{},xid=\"{code}\"}} {seen}",
                e.labels
            );
        }
    }
    for family in [
        "gpu_exporter_process_memory_used_bytes",
        "gpu_exporter_process_sm_utilization_percent",
    ] {
        for e in &snap.entities {
            for p in e.processes.iter().map(|p| &p.sample) {
                let v = if family.ends_with("bytes") {
                    p.used_memory_bytes
                } else {
                    p.sm_util_percent.map(u64::from)
                };
                let Some(v) = v else { continue };
                let _ = writeln!(
                    out,
                    "{family}{{{},pid=\"{}\",process_name=\"{}\"}} {v}",
                    e.labels, p.pid, p.name
                );
            }
        }
    }
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
        let (plan, _) = counters::plan(csv, name).expect("plan");
        let mut s = sampler(plan);
        s.cycle();
        let snap = s.cycle();
        let mut out = Vec::new();
        encode::render_device_families(&snap, Format::Text, &mut out);
        let n = series_count(&out) as u64;
        let mut naive = Vec::new();
        naive_render(&snap, &mut naive);
        // The baseline must produce the same series, or the ratio means nothing.
        assert_eq!(
            series_count(&naive) as u64,
            n,
            "the baseline renders the same series"
        );
        let mut pb = Vec::new();
        encode::render_device_families(&snap, Format::Protobuf, &mut pb);
        let families = encode::protobuf::decode(&pb).expect("protobuf decodes");
        assert_eq!(
            encode::protobuf::series_text(&families).len() as u64,
            n,
            "protobuf carries the same series"
        );
        println!(
            "{name}: {n} series; per render: text {} bytes ({} gzipped), protobuf {} bytes ({} gzipped)",
            out.len(),
            encode::gzip(&out).len(),
            pb.len(),
            encode::gzip(&pb).len()
        );

        let mut g = c.benchmark_group(format!("big-node/{name}"));
        g.throughput(Throughput::Elements(n));
        g.bench_function("render-text", |b| {
            let mut buf = Vec::with_capacity(out.len());
            b.iter(|| {
                buf.clear();
                encode::render_device_families(black_box(&snap), Format::Text, &mut buf);
                black_box(buf.len())
            })
        });
        g.bench_function("render-openmetrics", |b| {
            let mut buf = Vec::with_capacity(out.len());
            b.iter(|| {
                buf.clear();
                encode::render_device_families(black_box(&snap), Format::OpenMetrics, &mut buf);
                black_box(buf.len())
            })
        });
        g.bench_function("render-protobuf", |b| {
            let mut buf = Vec::with_capacity(pb.len());
            b.iter(|| {
                buf.clear();
                encode::render_device_families(black_box(&snap), Format::Protobuf, &mut buf);
                black_box(buf.len())
            })
        });
        g.bench_function("baseline-naive-write", |b| {
            let mut buf = Vec::with_capacity(out.len());
            b.iter(|| {
                buf.clear();
                naive_render(black_box(&snap), &mut buf);
                black_box(buf.len())
            })
        });
        // Per scrape from the caches: plain, gzip (the snapshot's cached gzip member plus
        // a stored member for the histogram), and the pre-issue-16 gzip scrape as the
        // in-process baseline: the cached member plus the self-metrics compressed anew
        // with a fresh deflate encoder on every scrape. `-served` is what /metrics does
        // since issue 27: the same parts, the cached one shared rather than copied.
        for (bench, fmt, gzip) in [
            ("scrape-cached", Format::Text, false),
            ("scrape-cached-gzip", Format::Text, true),
            ("scrape-cached-openmetrics", Format::OpenMetrics, false),
            ("scrape-cached-openmetrics-gzip", Format::OpenMetrics, true),
            ("scrape-cached-protobuf", Format::Protobuf, false),
            ("scrape-cached-protobuf-gzip", Format::Protobuf, true),
        ] {
            g.bench_function(bench, |b| {
                let _ = encode::render(&snap, ScrapeStats::default(), fmt, true, gzip);
                b.iter(|| {
                    let body =
                        encode::render(black_box(&snap), ScrapeStats::default(), fmt, true, gzip);
                    black_box(body.len())
                })
            });
            // What /metrics serves (issue 27): the cached part shared, not copied.
            g.bench_function(format!("{bench}-served"), |b| {
                b.iter(|| {
                    let body = encode::render_parts(
                        black_box(&snap),
                        ScrapeStats::default(),
                        fmt,
                        true,
                        gzip,
                    );
                    black_box(body.len())
                })
            });
        }
        g.bench_function("baseline-scrape-gzip-recompressing-self-metrics", |b| {
            let devices = encode::gzip(&out);
            let _ = encode::cached_part(&snap, Format::Text, false);
            b.iter(|| {
                let mut tail = encode::cached_part(black_box(&snap), Format::Text, false).to_vec();
                encode::scrape_part(ScrapeStats::default(), Format::Text, &mut tail);
                let tail = encode::gzip(&tail);
                let mut body = Vec::with_capacity(devices.len() + tail.len());
                body.extend_from_slice(&devices);
                body.extend_from_slice(&tail);
                black_box(body.len())
            })
        });
        g.bench_function("sample-cycle-simulated", |b| {
            b.iter(|| black_box(s.cycle().values.len()))
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    targets = bench
}
criterion_main!(benches);
