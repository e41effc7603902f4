//! NVML calls per whole read period: the real exporter on the fake
//! `libnvidia-ml.so.1`, big node (8 × H100, 4 in MIG mode with 7 instances each, 200
//! processes), frozen scenario time, with the fake counting calls per function
//! (`GPU_SIM_CALL_COUNTS`). The calls of [`WINDOW`] steady-state cycles — a whole
//! number of every default read period (docs/exporter/cadence.md) — are held to a
//! budget per function derived from the node's shape and the periods, so reintroducing
//! any per-cycle call that was removed (handle lookups, GPM sample allocation, process
//! names, list counts) fails, and so does a slow field read more often than its period
//! or a fast one less often than every cycle.

use e2e_tests::{Exporter, fake_nvml, sample_value, scratch_dir, try_wait_for, wait_for};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Calls that belong to no sampling cycle: the XID thread's blocking wait.
const NOT_PER_CYCLE: &[&str] = &["nvmlEventSetWait_v2"];

/// Cycles per measured window: 30 s at [`INTERVAL_MS`], the longest default period of
/// a field that calls the driver, so every period fits a whole number of times.
const WINDOW: u64 = 30;
/// The default periods in cycles at [`INTERVAL_MS`] (docs/exporter/cadence.md): the
/// cumulative counters (energy, PCIe replays, violations, NVLink errors) and the
/// device-set check every 10 s; ECC, retired pages, row remapping and fabric state
/// every 30 s.
const COUNTERS: u64 = 10;
const RARE: u64 = 30;

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
const INTERVAL_MS: &str = "1000";

/// The call counts once cycle `s` is complete, taken just after the exporter published
/// it (its own cycle counter, polled): from a counts file the fake wrote after that
/// moment, since a cycle's calls all precede its publication, and before the next cycle
/// (the counter is read again). The XID thread calls at least every 500 ms, so such a
/// write comes well within the interval. A reading that still raced the next cycle is
/// caught by [`per_window`]'s window-length check.
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

/// Calls per function over exactly `WINDOW` steady-state cycles: a window of any other
/// length (a reading that raced a cycle) is measured again.
fn per_window(args: &[&str]) -> Counts {
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
    wait_for(
        "a window of whole periods",
        Duration::from_secs(300),
        || {
            let (s0, before) = reading(&e, &file);
            // The reading waits for the next cycle: start it one short of the window.
            wait_for("more cycles", Duration::from_secs(120), || {
                (samples_total(&e) + 1 >= s0 + WINDOW).then_some(())
            });
            let (s1, after) = reading(&e, &file);
            (s1 - s0 == WINDOW).then(|| {
                after
                    .iter()
                    .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
                    .filter(|(_, n)| *n > 0)
                    .collect()
            })
        },
    )
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

/// The most calls per [`WINDOW`], per function; any function not listed: none. Every
/// entry is one call per entity that needs it per read of what it answers: every cycle
/// for the fast fields, every [`COUNTERS`] or [`RARE`] cycles for the slow ones, because
/// nothing static is read again.
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
    // (function, calls per read, read every this many cycles)
    let mut b: Vec<(&str, u64, u64)> = vec![
        // Every entity: framebuffer, GPM metrics from its two kept samples.
        ("nvmlDeviceGetMemoryInfo_v2", gpus + migs, 1),
        ("nvmlGpmMetricsGet", gpus + migs, 1),
        // Only the metrics the plan serves: dcgm-exporter's defaults have five
        // (graphics, tensor, DRAM, PCIe TX and RX), every field ten.
        (
            "nvmlGpmMetricsGet.metrics",
            (gpus + migs) * if plan.all_fields { 10 } else { 5 },
            1,
        ),
        ("nvmlGpmSampleGet", gpus, 1),
        ("nvmlGpmMigSampleGet", migs, 1),
        // Every GPU: one field-values call (the memory temperature is due every
        // cycle), SM and memory clocks, one getter per remaining counter.
        ("nvmlDeviceGetFieldValues", gpus, 1),
        ("nvmlDeviceGetClockInfo", 2 * gpus, 1),
        ("nvmlDeviceGetDecoderUtilization", gpus, 1),
        ("nvmlDeviceGetEncoderUtilization", gpus, 1),
        ("nvmlDeviceGetPowerUsage", gpus, 1),
        ("nvmlDeviceGetTemperature", gpus, 1),
        ("nvmlDeviceGetPcieReplayCounter", gpus, COUNTERS),
        // A GPU in MIG mode has no utilisation: asked once, remembered.
        ("nvmlDeviceGetUtilizationRates", whole, 1),
        // The device-set check, every 10 s: the count, each MIG-capable GPU's MIG
        // device count, then each slot of a GPU in MIG mode and each instance's UUID.
        ("nvmlDeviceGetCount_v2", 1, COUNTERS),
        ("nvmlDeviceGetMaxMigDeviceCount", mig_capable, COUNTERS),
        (
            "nvmlDeviceGetMigDeviceHandleByIndex",
            7 * mig_enabled,
            COUNTERS,
        ),
        ("nvmlDeviceGetUUID", migs, COUNTERS),
    ];
    if plan.all_fields {
        b.extend([
            ("nvmlDeviceGetCurrentClocksThrottleReasons", gpus, 1),
            ("nvmlDeviceGetEnforcedPowerLimit", gpus, 1),
            // PCIe throughput from GPM where there is GPM: the 20 ms getter only
            // on older GPUs.
            ("nvmlDeviceGetPcieThroughput", 2 * without_gpm, 1),
            // P-state every cycle, fabric registration every 30 s; the temperature
            // thresholds are read once per discovery and the fanless boards' fan
            // speed is asked once.
            ("nvmlDeviceGetPerformanceState", gpus, 1),
            ("nvmlDeviceGetGpuFabricInfoV", gpus, RARE),
            // Per-link fields: one scoped field-values call per GPU for every link's
            // state and traffic (every cycle), and the four data-link error counters
            // of each link (the calls DCGM makes for its per-link fields; 10 s).
            ("nvmlDeviceGetFieldValues", gpus, 1),
            ("nvmlDeviceGetNvLinkErrorCounter", 4 * links, COUNTERS),
        ]);
    }
    if plan.processes {
        b.extend([
            // One list per GPU, in one call: a GPU in MIG mode lists every instance's
            // processes with their instance IDs.
            ("nvmlDeviceGetComputeRunningProcesses_v3", gpus, 1),
            // MIG instances have no per-process utilisation: asked once, remembered.
            ("nvmlDeviceGetProcessUtilization", whole, 1),
        ]);
    }
    // The fields of the field-values calls, per GPU: the memory temperature and the
    // NVLink traffic (two IDs, a rate) every cycle; with dcgm-exporter's defaults the
    // energy every 10 s and the three remapped-row counts every 30 s; with every field
    // the energy, six violation times and four NVLink error totals every 10 s, and every 30 s ECC totals (4), retired pages (3), remapped rows and
    // their pending flag (4), ECC modes (2) and the recovery action; per link its state
    // (1), traffic (2: TX and RX) and TX and RX again for their own fields, every cycle.
    let per_gpu_fields = if plan.all_fields {
        3 * WINDOW + 11 * WINDOW / COUNTERS + 14 * WINDOW / RARE
    } else {
        3 * WINDOW + WINDOW / COUNTERS + 3 * WINDOW / RARE
    };
    let link_fields = if plan.all_fields {
        5 * links * WINDOW
    } else {
        0
    };
    let mut out = Counts::new();
    for (k, n, every) in b {
        *out.entry(k.to_owned()).or_default() += n * WINDOW / every;
    }
    out.insert(
        "nvmlDeviceGetFieldValues.fields".into(),
        gpus * per_gpu_fields + link_fields,
    );
    out
}

fn assert_within_budget(args: &[&str], plan: Plan) {
    let calls = per_window(args);
    let shape = big_node();
    let budget = budget(&shape, plan);
    let shown = format!("calls per {WINDOW} cycles with {args:?}:\n{}", show(&calls));
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
            "{function}: {n} calls per {WINDOW} cycles, budget {allowed}; {shown}"
        );
    }
    let total: u64 = calls.values().sum();
    let allowed: u64 = budget.values().sum();
    assert!(
        total <= allowed,
        "{total} calls per {WINDOW} cycles, budget {allowed}; {shown}"
    );
    // The other direction: the fast reads are all there, every cycle, and the slow
    // ones exactly once per period (a cadence that skipped them would pass the
    // ceilings above).
    for exact in [
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlGpmMetricsGet",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetFieldValues.fields",
    ] {
        assert_eq!(calls.get(exact), budget.get(exact), "{exact}; {shown}");
    }
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
