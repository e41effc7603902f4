//! NVML calls per sampling cycle (issue 16): the real exporter on the fake
//! `libnvidia-ml.so.1`, big node (8 × H100, 4 in MIG mode with 7 instances each, 200
//! processes), frozen scenario time, with the fake counting calls per function
//! (`GPU_SIM_CALL_COUNTS`). The calls of whole steady-state cycles are held to a budget
//! per function derived from the node's shape, so reintroducing any per-cycle call
//! that was removed (handle lookups, GPM sample allocation, process names, list counts)
//! fails.

use e2e_tests::{Exporter, fake_nvml, sample_value, scratch_dir, try_wait_for, wait_for};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Calls that belong to no sampling cycle: the XID thread's blocking wait.
const NOT_PER_CYCLE: &[&str] = &["nvmlEventSetWait_v2"];

/// Cycles per measured window.
const WINDOW: u64 = 3;

type Counts = BTreeMap<String, u64>;

fn read_counts(path: &Path) -> Counts {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Counts::new();
    };
    text.lines()
        .filter_map(|l| {
            let (count, name) = l.split_once(' ')?;
            Some((name.to_owned(), count.parse().ok()?))
        })
        .filter(|(name, _)| !NOT_PER_CYCLE.contains(&name.as_str()))
        .collect()
}

fn samples_total(e: &Exporter) -> u64 {
    sample_value(&e.metrics(), "gpu_exporter_samples_total").unwrap_or(0.0) as u64
}

/// The call counts once cycle `s` is complete: `s` is the exporter's own cycle counter,
/// and the counts come from a file the fake wrote after `s` was seen published (a
/// cycle's calls all precede its publication). The counter is read again after the file:
/// a reading that raced the next cycle is caught by [`per_cycle`]'s whole-cycle check.
fn reading(e: &Exporter, file: &Path) -> (u64, Counts) {
    wait_for("a settled reading", Duration::from_secs(30), || {
        let s = samples_total(e);
        let published_by = SystemTime::now();
        let written_after = || {
            let written = std::fs::metadata(file).and_then(|m| m.modified()).ok()?;
            (written > published_by).then_some(())
        };
        // The fake rewrites the file within 50 ms of any call; the XID thread calls at
        // least every 500 ms.
        try_wait_for(Duration::from_secs(5), written_after)?;
        let counts = read_counts(file);
        (samples_total(e) == s).then_some((s, counts))
    })
}

/// Calls per cycle, per function, over `WINDOW` steady-state cycles. A window is kept
/// only if every function's count grew by a whole multiple of the cycles in it: a
/// reading that caught a cycle half done would not.
fn per_cycle(args: &[&str]) -> Counts {
    let dir = scratch_dir("nvml-calls");
    let file = dir.join("calls");
    let file_env = file.to_str().expect("utf-8 path").to_owned();
    let lib = fake_nvml();
    let lib = lib.to_str().expect("utf-8 path");
    let e = Exporter::start(
        &[&["--nvml-lib", lib, "-c", "500"][..], args].concat(),
        &[
            ("GPU_SIM_SCENARIO", "builtin:big-node"),
            ("GPU_SIM_FROZEN_AT_S", "100"),
            ("GPU_SIM_CALL_COUNTS", &file_env),
        ],
    );
    // Discovery, the first GPM sample and the first process names are behind cycle 3.
    e.metrics_after_samples(3);
    wait_for("a window of whole cycles", Duration::from_secs(60), || {
        let (s0, before) = reading(&e, &file);
        wait_for("more cycles", Duration::from_secs(30), || {
            (samples_total(&e) >= s0 + WINDOW).then_some(())
        });
        let (s1, after) = reading(&e, &file);
        let cycles = s1 - s0;
        let diff: Counts = after
            .iter()
            .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        diff.values()
            .all(|n| n % cycles == 0)
            .then(|| diff.into_iter().map(|(k, n)| (k, n / cycles)).collect())
    })
}

fn show(counts: &Counts) -> String {
    let total: u64 = counts.values().sum();
    let lines: String = counts
        .iter()
        .map(|(k, n)| format!("{n:>4} {k}\n"))
        .collect();
    format!("{lines}{total:>4} total")
}

#[test]
fn default_counters_stay_within_the_call_budget() {
    let calls = per_cycle(&[]);
    println!("default counters:\n{}", show(&calls));
}

#[test]
fn default_counters_with_processes_stay_within_the_call_budget() {
    let calls = per_cycle(&["--process-metrics"]);
    println!("default counters, processes:\n{}", show(&calls));
}

#[test]
fn all_fields_stay_within_the_call_budget() {
    let calls = per_cycle(&["-f", "tests/fixtures/all-fields.csv"]);
    println!("all fields:\n{}", show(&calls));
}

#[test]
fn all_fields_with_processes_stay_within_the_call_budget() {
    let calls = per_cycle(&["-f", "tests/fixtures/all-fields.csv", "--process-metrics"]);
    println!("all fields, processes:\n{}", show(&calls));
}
