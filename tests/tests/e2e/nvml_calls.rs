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

/// How often the exporter samples: long next to a cycle of the debug build, so a
/// reading taken just after a cycle is published has time to settle before the next.
const INTERVAL_MS: &str = "2000";

/// The call counts once cycle `s` is complete, taken just after the exporter published
/// it (its own cycle counter, polled): from a counts file the fake wrote after that
/// moment, since a cycle's calls all precede its publication, and before the next cycle
/// (the counter is read again). The XID thread calls at least every 500 ms, so such a
/// write comes well within the interval. A reading that still raced the next cycle is
/// caught by [`per_cycle`]'s whole-cycle check.
fn reading(e: &Exporter, file: &Path) -> (u64, Counts) {
    wait_for("a settled reading", Duration::from_secs(60), || {
        let before = samples_total(e);
        let s = wait_for("the next cycle", Duration::from_secs(30), || {
            let s = samples_total(e);
            (s > before).then_some(s)
        });
        let published_by = SystemTime::now();
        try_wait_for(Duration::from_secs(5), || {
            let written = std::fs::metadata(file).and_then(|m| m.modified()).ok()?;
            (written > published_by).then_some(())
        })?;
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
        &[&["--nvml-lib", lib, "-c", INTERVAL_MS][..], args].concat(),
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

/// The big node's shape, from the model the fake serves.
struct Shape {
    gpus: u64,
    mig_instances: u64,
    /// GPUs not in MIG mode.
    whole_gpus: u64,
    /// NVLinks of all GPUs.
    nvlinks: u64,
    /// GPUs whose model offers MIG, and those in MIG mode.
    mig_capable: u64,
    mig_enabled: u64,
    /// GPUs without GPM (before Hopper).
    without_gpm: u64,
}

fn big_node() -> Shape {
    let scenario = gpu_sim::Scenario::builtin("big-node").expect("built-in scenario");
    let node = gpu_sim::SimNode::new(&scenario, SystemTime::now());
    let count = |f: &dyn Fn(&gpu_sim::SimGpu) -> u64| node.gpus.iter().map(f).sum::<u64>();
    Shape {
        gpus: node.gpus.len() as u64,
        mig_instances: count(&|g| g.mig.len() as u64),
        whole_gpus: count(&|g| u64::from(g.mig.is_empty())),
        nvlinks: count(&|g| u64::from(g.model.nvlink_links)),
        mig_capable: count(&|g| u64::from(!g.model.mig_profiles.is_empty())),
        mig_enabled: count(&|g| u64::from(!g.mig.is_empty())),
        without_gpm: count(&|g| u64::from(!g.model.gpm)),
    }
}

/// What the plan reads.
#[derive(Clone, Copy)]
struct Plan {
    all_fields: bool,
    processes: bool,
}

/// The most calls per steady cycle, per function; any function not listed: none. Every
/// entry is one call per entity that needs it, because nothing static is read again.
/// No `nvmlDeviceGetHandleByIndex_v2` (handles are kept from discovery; MIG handles are
/// listed only to check the device set), no `nvmlGpmSampleAlloc`/`Free` (two samples per entity,
/// reused), no `nvmlSystemGetProcessName` (names are kept per pid), no getter of a
/// counter that the one `nvmlDeviceGetFieldValues` per GPU answers (ECC, retired pages,
/// violations, energy), no second call of a list getter for its length, and no process
/// list per MIG instance.
fn budget(shape: &Shape, plan: Plan) -> Counts {
    let Shape {
        gpus,
        mig_instances: migs,
        whole_gpus: whole,
        nvlinks: links,
        mig_capable,
        mig_enabled,
        without_gpm,
    } = *shape;
    let mut b: Vec<(&str, u64)> = vec![
        // Every entity: framebuffer, GPM metrics from its two kept samples.
        ("nvmlDeviceGetMemoryInfo_v2", gpus + migs),
        ("nvmlGpmMetricsGet", gpus + migs),
        // Only the metrics the plan serves: dcgm-exporter's defaults have five
        // (graphics, tensor, DRAM, PCIe TX and RX), every field ten.
        (
            "nvmlGpmMetricsGet.metrics",
            (gpus + migs) * if plan.all_fields { 10 } else { 5 },
        ),
        ("nvmlGpmSampleGet", gpus),
        ("nvmlGpmMigSampleGet", migs),
        // Every GPU: one field-values call, SM and memory clocks, one getter per
        // remaining counter.
        ("nvmlDeviceGetFieldValues", gpus),
        ("nvmlDeviceGetClockInfo", 2 * gpus),
        ("nvmlDeviceGetDecoderUtilization", gpus),
        ("nvmlDeviceGetEncoderUtilization", gpus),
        ("nvmlDeviceGetPcieReplayCounter", gpus),
        ("nvmlDeviceGetPowerUsage", gpus),
        ("nvmlDeviceGetTemperature", gpus),
        // A GPU in MIG mode has no utilisation: asked once, remembered.
        ("nvmlDeviceGetUtilizationRates", whole),
        // The device-set check: the count, each MIG-capable GPU's MIG device count,
        // then each slot of a GPU in MIG mode and each instance's UUID.
        ("nvmlDeviceGetCount_v2", 1),
        ("nvmlDeviceGetMaxMigDeviceCount", mig_capable),
        ("nvmlDeviceGetMigDeviceHandleByIndex", 7 * mig_enabled),
        ("nvmlDeviceGetUUID", migs),
    ];
    if plan.all_fields {
        b.extend([
            ("nvmlDeviceGetCurrentClocksThrottleReasons", gpus),
            ("nvmlDeviceGetEnforcedPowerLimit", gpus),
            // PCIe throughput from GPM where there is GPM: the 20 ms getter only
            // on older GPUs.
            ("nvmlDeviceGetPcieThroughput", 2 * without_gpm),
            // P-state and fabric registration; the temperature thresholds are read
            // once per discovery and the fanless boards' fan speed is asked once.
            ("nvmlDeviceGetPerformanceState", gpus),
            ("nvmlDeviceGetGpuFabricInfoV", gpus),
            // Per-link fields: one scoped field-values call per GPU for every link's
            // state and traffic, and the four data-link error counters of each link
            // (the calls DCGM makes for its per-link fields).
            ("nvmlDeviceGetNvLinkErrorCounter", 4 * links),
        ]);
        if let Some(n) = b.iter_mut().find(|(k, _)| *k == "nvmlDeviceGetFieldValues") {
            n.1 += gpus;
        }
    }
    if plan.processes {
        b.extend([
            // One list per GPU, in one call: a GPU in MIG mode lists every instance's
            // processes with their instance IDs.
            ("nvmlDeviceGetComputeRunningProcesses_v3", gpus),
            // MIG instances have no per-process utilisation: asked once, remembered.
            ("nvmlDeviceGetProcessUtilization", whole),
        ]);
    }
    b.into_iter().map(|(k, n)| (k.to_owned(), n)).collect()
}

fn assert_within_budget(args: &[&str], plan: Plan) {
    let calls = per_cycle(args);
    let shape = big_node();
    let budget = budget(&shape, plan);
    let shown = format!("calls per cycle with {args:?}:\n{}", show(&calls));
    println!("{shown}");
    for removed in [
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
        "nvmlSystemGetProcessName",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPages_v2",
    ] {
        assert!(!calls.contains_key(removed), "{removed} is back; {shown}");
    }
    for (function, n) in &calls {
        let allowed = budget.get(function).copied().unwrap_or(0);
        assert!(
            *n <= allowed,
            "{function}: {n} calls per cycle, budget {allowed}; {shown}"
        );
    }
    let total: u64 = calls.values().sum();
    let allowed: u64 = budget.values().sum();
    assert!(
        total <= allowed,
        "{total} calls per cycle, budget {allowed}; {shown}"
    );
    // The measurement sees the cycle's work: the per-entity reads are all there.
    assert_eq!(
        calls.get("nvmlDeviceGetMemoryInfo_v2"),
        Some(&(shape.gpus + shape.mig_instances)),
        "{shown}"
    );
}

#[test]
fn default_counters_stay_within_the_call_budget() {
    let plan = Plan {
        all_fields: false,
        processes: false,
    };
    assert_within_budget(&[], plan);
}

#[test]
fn default_counters_with_processes_stay_within_the_call_budget() {
    let plan = Plan {
        all_fields: false,
        processes: true,
    };
    assert_within_budget(&["--process-metrics"], plan);
}

#[test]
fn all_fields_stay_within_the_call_budget() {
    let plan = Plan {
        all_fields: true,
        processes: false,
    };
    assert_within_budget(&["-f", "tests/fixtures/all-fields.csv"], plan);
}

#[test]
fn all_fields_with_processes_stay_within_the_call_budget() {
    let plan = Plan {
        all_fields: true,
        processes: true,
    };
    assert_within_budget(
        &["-f", "tests/fixtures/all-fields.csv", "--process-metrics"],
        plan,
    );
}
