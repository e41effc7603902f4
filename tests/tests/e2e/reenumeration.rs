//! Re-enumeration (issue 17): GPUs and MIG instances that appear or go while the
//! exporter runs show on `/metrics` within a few collect intervals, without a restart;
//! a node whose driver lists no GPU is not ready until GPUs appear. Devices come and go
//! through the fake library's device-set cue file (`GPU_SIM_DEVICES_FILE`), so each test
//! knows the instant of the change and times the exporter from there by polling. The
//! times are printed (`re-enumeration CASE: N ms`).

use e2e_tests::sysfs::{BadClass, CLASS_3D, CLASS_NVSWITCH, FakeSysfs, address_of};
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
    exporter_of("reenumeration-node.toml", dir, devices, &[])
}

fn exporter_of(scenario: &str, dir: &Path, devices: &str, args: &[&str]) -> (Exporter, Devices) {
    let cue = Devices(dir.join("devices"));
    cue.set(devices);
    let lib = fake_nvml();
    let scenario = fixture(scenario);
    let interval = INTERVAL_MS.to_string();
    // The device set checked every cycle (its default period is 10 s; the sampler's
    // unit tests hold it to its period): what is timed here is the path from a check
    // to the published change.
    let mut all = vec![
        "--nvml-lib",
        lib.to_str().expect("utf-8 path"),
        "-c",
        &interval,
        "--field-periods",
        "device-set=0",
    ];
    all.extend_from_slice(args);
    let e = Exporter::start(
        &all,
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

/// The `gpu` labels of the `DCGM_FI_DEV_FB_USED` series of whole GPUs.
fn gpus_served(e: &Exporter) -> BTreeSet<String> {
    fb_series(e)
        .into_iter()
        .filter(|(_, gi)| gi.is_empty())
        .map(|(gpu, _)| gpu)
        .collect()
}

fn gpu_set(gpus: &[&str]) -> BTreeSet<String> {
    gpus.iter().map(|g| g.to_string()).collect()
}

#[test]
fn a_gpu_bound_to_the_driver_after_start_shows_and_goes_and_an_nvswitch_changes_nothing() {
    // The PCI addresses of the scenario's GPUs, from the model the fake serves.
    let node = gpu_sim::SimNode::new(
        &gpu_sim::Scenario::load(&fixture("hotadd-node.toml")).expect("scenario"),
        SystemTime::now(),
    );
    let bus_ids: Vec<String> = node.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    let addresses: Vec<String> = bus_ids.iter().map(|b| address_of(b)).collect();
    assert_eq!(addresses.len(), 3);
    let dir = scratch_dir("reenumeration-hotadd");
    let sysfs = FakeSysfs::new(&dir.join("sys"));
    sysfs.bind(&addresses[0], CLASS_3D);
    sysfs.bind(&addresses[1], CLASS_3D);
    let root = sysfs.root().to_str().expect("utf-8 path").to_owned();
    let (e, devices) = exporter_of(
        "hotadd-node.toml",
        &dir,
        "gpus=2\n",
        &["--path-sysfs", &root],
    );
    let body = wait_for("GPUs 0 and 1", MEASURE_FOR, || {
        (gpus_served(&e) == gpu_set(&["0", "1"])).then(|| e.metrics())
    });
    // The fake sysfs names the GPUs the exporter serves.
    assert!(
        body.contains(&format!("pci_bus_id=\"{}\"", bus_ids[1])),
        "{body}"
    );
    let log_count = |needle: &str| e.process.log().matches(needle).count();
    const REINIT: &str = "GPUs bound to the nvidia driver changed";
    let discovered = log_count("discovered GPUs");
    let samples = |e: &Exporter| {
        e2e_tests::sample_value(&e.metrics(), "gpu_exporter_samples_total").unwrap_or(0.0)
    };
    let cycles = |n: f64| {
        let from = samples(&e);
        wait_for("more cycles", MEASURE_FOR, || {
            (samples(&e) >= from + n).then_some(())
        });
    };

    // The driver has a third GPU, but NVML lists it only from its next initialisation
    // (as the real library does): nothing shows while sysfs does not change.
    devices.set("gpus=3\n");
    cycles(4.0);
    assert_eq!(gpus_served(&e), gpu_set(&["0", "1"]));

    // It is bound to the nvidia driver: NVML is initialised again and it shows.
    sysfs.bind(&addresses[2], CLASS_3D);
    let since = Instant::now();
    picked_up("a GPU bound to the driver", since, || {
        (gpus_served(&e) == gpu_set(&["0", "1", "2"])).then_some(())
    });
    let log = e.process.log();
    assert_eq!(log.matches(REINIT).count(), 1, "{log}");
    let line = log.lines().find(|l| l.contains(REINIT)).unwrap_or_default();
    let came = format!("came=[\"{}\"] went=[]", addresses[2]);
    assert!(line.contains(&came), "{line}");
    assert_eq!(log_count("discovered GPUs"), discovered + 1, "{log}");

    // An NVSwitch bound to the same driver is no GPU: nothing happens.
    sysfs.bind("0000:05:00.0", CLASS_NVSWITCH);
    cycles(4.0);
    let log = e.process.log();
    assert_eq!(log.matches(REINIT).count(), 1, "{log}");
    assert_eq!(log_count("discovered GPUs"), discovered + 1, "{log}");

    // The GPU goes (unbound, for vfio-pci or passthrough): after a new initialisation
    // NVML no longer lists it, so it is gone altogether, not reported lost.
    devices.set("gpus=2\n");
    sysfs.unbind(&addresses[2]);
    let since = Instant::now();
    picked_up("a GPU unbound from the driver", since, || {
        let body = e.metrics();
        (gpus_served(&e) == gpu_set(&["0", "1"])
            && series_values(&body, "gpu_exporter_gpu_up", &[("gpu", "2")]).is_empty()
            && series_values(&body, "gpu_exporter_gpu_up", &[("gpu", "1")]) == [1.0])
        .then_some(())
    });
    let log = e.process.log();
    assert_eq!(log.matches(REINIT).count(), 2, "{log}");
    let line = log
        .lines()
        .filter(|l| l.contains(REINIT))
        .nth(1)
        .unwrap_or_default();
    let went = format!("came=[] went=[\"{}\"]", addresses[2]);
    assert!(line.contains(&went), "{line}");
}

/// A device bound to the driver whose `class` is a FIFO or a link to `/dev/zero` (a
/// broken or hostile sysfs) is logged once, naming the file, and is no GPU; the
/// sampler keeps cycling and every GPU keeps its series. The FIFO used to block the
/// sampler for good (reported as a hung driver, every GPU series gone), and
/// `/dev/zero` to be read until memory ran out.
#[test]
fn a_bound_device_whose_class_is_a_fifo_or_dev_zero_is_logged_and_the_gpus_keep_flowing() {
    let node = gpu_sim::SimNode::new(
        &gpu_sim::Scenario::load(&fixture("hotadd-node.toml")).expect("scenario"),
        SystemTime::now(),
    );
    let addresses: Vec<String> = node
        .gpus
        .iter()
        .map(|g| address_of(&g.pci_bus_id))
        .collect();
    let dir = scratch_dir("reenumeration-bad-class");
    let sysfs = FakeSysfs::new(&dir.join("sys"));
    sysfs.bind(&addresses[0], CLASS_3D);
    sysfs.bind(&addresses[1], CLASS_3D);
    let root = sysfs.root().to_str().expect("utf-8 path").to_owned();
    let (e, _devices) = exporter_of(
        "hotadd-node.toml",
        &dir,
        "gpus=2\n",
        &["--path-sysfs", &root],
    );
    wait_for("GPUs 0 and 1", MEASURE_FOR, || {
        (gpus_served(&e) == gpu_set(&["0", "1"])).then_some(())
    });
    let samples = |e: &Exporter| {
        e2e_tests::sample_value(&e.metrics(), "gpu_exporter_samples_total").unwrap_or(0.0)
    };
    sysfs.bind_bad_class("0000:e1:00.0", BadClass::Fifo);
    sysfs.bind_bad_class("0000:e2:00.0", BadClass::DevZero);
    let from = samples(&e);
    wait_for("cycles past the bad entries", MEASURE_FOR, || {
        (samples(&e) >= from + 4.0).then_some(())
    });
    let body = e.metrics();
    assert_eq!(gpus_served(&e), gpu_set(&["0", "1"]), "{body}");
    for gpu in ["0", "1"] {
        assert_eq!(
            series_values(&body, "gpu_exporter_gpu_up", &[("gpu", gpu)]),
            [1.0],
            "{body}"
        );
    }
    assert_eq!(
        e2e_tests::sample_value(&body, "gpu_exporter_source_hung"),
        Some(0.0),
        "{body}"
    );
    let log = e.process.log();
    for (address, says) in [
        ("0000:e1:00.0", "a FIFO"),
        ("0000:e2:00.0", "a character device"),
    ] {
        // Read, and named, through the driver's link to the device.
        let class = format!("drivers/nvidia/{address}/class");
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&class)).collect();
        assert_eq!(
            lines.len(),
            1,
            "one line for {class}, cycle after cycle:\n{log}"
        );
        assert!(
            lines[0].contains("unreadable PCI class") && lines[0].contains(says),
            "{}",
            lines[0]
        );
    }
    assert!(
        !log.contains("GPUs bound to the nvidia driver changed"),
        "{log}"
    );
}
