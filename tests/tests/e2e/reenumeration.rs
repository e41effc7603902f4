//! Re-enumeration (issue 17): GPUs and MIG instances that appear or go while the
//! exporter runs show on `/metrics` within a few collect intervals, without a restart;
//! a node whose driver lists no GPU is not ready until GPUs appear. Devices come and go
//! through the fake library's device-set cue file (`GPU_SIM_DEVICES_FILE`), so each test
//! knows the instant of the change and times the exporter from there by polling. The
//! times are printed (`re-enumeration CASE: N ms`).

use e2e_tests::{Exporter, fake_nvml, fixture, get, scratch_dir, series_values, wait_for};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

const INTERVAL_MS: u64 = 250;
/// The promise: a change shows within this many intervals (the next cycle's check,
/// the rediscovery, the publication).
const PICKED_UP_INTERVALS: u32 = 2;
/// More intervals for the scheduling of a shared test machine and the poll itself.
const SLACK_INTERVALS: u32 = 2;
/// How long a change is waited for, so that a slow one is measured, not just failed.
const MEASURE_FOR: Duration = Duration::from_secs(60);

fn bound() -> Duration {
    Duration::from_millis(INTERVAL_MS) * (PICKED_UP_INTERVALS + SLACK_INTERVALS)
}

/// The fake library's device-set cue file.
struct Devices(PathBuf);

impl Devices {
    /// Write `text` (see fake-nvml `devices.rs`) atomically; the instant it took effect.
    fn set(&self, text: &str) -> Instant {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write the device set");
        std::fs::rename(&tmp, &self.0).expect("install the device set");
        Instant::now()
    }
}

fn exporter(dir: &Path, devices: &str) -> (Exporter, Devices) {
    let cue = Devices(dir.join("devices"));
    cue.set(devices);
    let lib = fake_nvml();
    let scenario = fixture("reenumeration-node.toml");
    let e = Exporter::start(
        &[
            "--nvml-lib",
            lib.to_str().expect("utf-8 path"),
            "-c",
            &INTERVAL_MS.to_string(),
        ],
        &[
            ("GPU_SIM_SCENARIO", scenario.to_str().expect("utf-8 path")),
            ("GPU_SIM_DEVICES_FILE", cue.0.to_str().expect("utf-8 path")),
        ],
    );
    (e, cue)
}

/// Wait for `f`, then assert it held within [`bound`] of `since` and print the time.
fn picked_up<T>(case: &str, since: Instant, f: impl FnMut() -> Option<T>) -> T {
    let v = wait_for(case, MEASURE_FOR, f);
    let took = since.elapsed();
    eprintln!("re-enumeration {case}: {} ms", took.as_millis());
    assert!(
        took <= bound(),
        "{case}: picked up after {took:?}, more than {PICKED_UP_INTERVALS} intervals (+{SLACK_INTERVALS} of slack) = {:?}",
        bound()
    );
    v
}

/// The value of label `name` in one exposition line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    line[start..].split('"').next()
}

/// (GPU, GPU_I_ID) of every `DCGM_FI_DEV_FB_USED` series: one per GPU (GPU_I_ID
/// empty) and one per MIG instance.
fn fb_series(e: &Exporter) -> BTreeSet<(String, String)> {
    e.metrics()
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
        .map(|l| {
            let gi = label(l, "GPU_I_ID").unwrap_or_default();
            (
                label(l, "gpu").unwrap_or_default().to_owned(),
                gi.to_owned(),
            )
        })
        .collect()
}

/// The GPU-instance IDs of the scenario's MIG instances of GPU 0, by position: the
/// model the fake serves, not the exporter.
fn scenario_gpu_instances() -> Vec<String> {
    let s = gpu_sim::Scenario::load(&fixture("reenumeration-node.toml")).expect("scenario");
    gpu_sim::SimNode::new(&s, SystemTime::now()).gpus[0]
        .mig
        .iter()
        .map(|m| m.gpu_instance_id.to_string())
        .collect()
}

/// The series expected with GPU 0's instances at `positions` and both GPUs listed.
fn expected(gis: &[String], positions: &[usize]) -> BTreeSet<(String, String)> {
    let mut want: BTreeSet<_> = [("0".into(), String::new()), ("1".into(), String::new())].into();
    want.extend(positions.iter().map(|&p| ("0".to_owned(), gis[p].clone())));
    want
}

#[test]
fn mig_instances_created_and_destroyed_after_start_show_and_go_within_a_few_cycles() {
    let gis = scenario_gpu_instances();
    assert_eq!(gis.len(), 3);
    let dir = scratch_dir("reenumeration-mig");
    let (e, devices) = exporter(&dir, "mig.0=0\n");
    wait_for("the first instance", MEASURE_FOR, || {
        (fb_series(&e) == expected(&gis, &[0])).then_some(())
    });
    let discovered = e.process.log().matches("discovered GPUs").count();

    // Two instances created (as the mig-manager or a DRA driver does).
    let since = devices.set("mig.0=0,1,2\n");
    picked_up("MIG instances created", since, || {
        (fb_series(&e) == expected(&gis, &[0, 1, 2])).then_some(())
    });
    // One destroyed: its series go, the others stay.
    let since = devices.set("mig.0=0,2\n");
    picked_up("a MIG instance destroyed", since, || {
        (fb_series(&e) == expected(&gis, &[0, 2])).then_some(())
    });
    // Each change rediscovered once, and logged with what changed.
    let log = e.process.log();
    assert_eq!(
        log.matches("discovered GPUs").count(),
        discovered + 2,
        "{log}"
    );
    assert_eq!(
        log.matches("the GPU device set changed").count(),
        2,
        "{log}"
    );

    // Nothing changes: no more rediscovery over several cycles.
    let samples = |e: &Exporter| {
        e2e_tests::sample_value(&e.metrics(), "gpu_exporter_samples_total").unwrap_or(0.0)
    };
    let from = samples(&e);
    wait_for("four more cycles", MEASURE_FOR, || {
        (samples(&e) >= from + 4.0).then_some(())
    });
    assert_eq!(
        e.process.log().matches("discovered GPUs").count(),
        discovered + 2
    );
}

#[test]
fn a_node_whose_driver_lists_no_gpu_turns_ready_when_gpus_appear_and_reports_one_lost() {
    let dir = scratch_dir("reenumeration-zero");
    let (e, devices) = exporter(&dir, "gpus=0\n");
    let why = wait_for("not ready for want of GPUs", MEASURE_FOR, || {
        let (status, body) = get(&e.url("/readyz"));
        (status == 503 && body.contains("no GPU")).then_some(body)
    });
    // Serving, and saying why not ready; the driver itself answers.
    assert!(why.contains("lists no GPU"), "{why}");
    let body = e.metrics();
    assert!(!body.contains("DCGM_FI_DEV_FB_USED{"), "{body}");
    assert_eq!(
        e2e_tests::sample_value(&body, "gpu_exporter_source_up"),
        Some(1.0)
    );

    // The GPUs show up (bound to the driver after the exporter started).
    let since = devices.set("");
    picked_up("GPUs appeared", since, || {
        let (status, _) = get(&e.url("/readyz"));
        (status == 200 && fb_series(&e).len() == 5).then_some(())
    });

    // GPU 1 falls off the bus: reported lost, its series gone, GPU 0 and its instances
    // still served.
    let since = devices.set("gpus=1\n");
    picked_up("a GPU lost", since, || {
        let body = e.metrics();
        let up = |gpu| series_values(&body, "gpu_exporter_gpu_up", &[("gpu", gpu)]);
        (up("1") == [0.0] && up("0") == [1.0] && fb_series(&e).len() == 4).then_some(())
    });
}
