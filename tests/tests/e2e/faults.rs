//! The fault matrix (issue 20): the exporter against a GPU driver that is missing, lost,
//! hung or late, and a kubelet that is missing, restarting, answering garbage or
//! silent, and an API server that is down. Every case asserts that the process keeps
//! serving `/metrics`, that health tells the truth (`/healthz`, `/readyz`,
//! `gpu_exporter_source_up`, `gpu_exporter_source_hung`, `gpu_exporter_kubelet_up`,
//! `gpu_exporter_pod_watch_up`), and, where the exporter owns the retry, that the data
//! is back within [`RECOVERY_INTERVALS`] collect intervals of the fault clearing.
//!
//! Driver faults are switched on and off through the fake library's cue file
//! (`GPU_SIM_FAULT_FILE`), kubelet faults through kube-sim's fake kubelet, so each test
//! knows the instant a fault ends and times recovery from there by polling. Each outage
//! lasts a number of failed cycles or lists counted by the exporter itself, long enough
//! that a doubling backoff would have grown past the recovery bound. Every recovery
//! time is printed (`recovery CASE: N ms`) for docs/benchmarks/robustness.md.

use e2e_tests::{
    Exporter, KubeNode, fake_nvml, fixture, get, sample_value, samples, scratch_dir, series_values,
    wait_for,
};
use gpu_exporter::sampler::HUNG_INTERVALS;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The collect interval (and kubelet refresh interval) of every exporter here.
const INTERVAL_MS: u64 = 250;
/// The promise: the data is back within this many intervals of the fault clearing.
const RECOVERY_INTERVALS: u32 = 2;
/// One more interval for the scheduling of a shared test machine and the poll itself.
const SLACK_INTERVALS: u32 = 1;
/// Failed cycles an NVML outage lasts before it is cleared, counted from the moment
/// the outage shows. A backoff doubling from one interval retries after 1, 2, 4, 8, 16
/// intervals: after 20 failed cycles its next retry lies 8 or more intervals ahead,
/// far past the bound, where after 6 it may still fall within it.
const NVML_OUTAGE_CYCLES: f64 = 20.0;
/// Failed kubelet lists an outage lasts. A kubelet attempt is a list, not a cycle: a
/// backoff fails fewer times per second, and after 6 it waits half a minute.
const KUBELET_OUTAGE_LISTS: f64 = 6.0;
/// How long a recovery is waited for, so that a slow one is measured, not just failed.
const MEASURE_FOR: Duration = Duration::from_secs(60);

fn interval() -> Duration {
    Duration::from_millis(INTERVAL_MS)
}

fn recovery_bound() -> Duration {
    interval() * (RECOVERY_INTERVALS + SLACK_INTERVALS)
}

/// Poll `f` until it holds, then assert it held within the recovery bound of `since`
/// (the instant the fault cleared) and print the time taken.
fn recovered<T>(case: &str, since: Instant, f: impl FnMut() -> Option<T>) -> T {
    let v = wait_for(&format!("{case}: recovery"), MEASURE_FOR, f);
    let took = since.elapsed();
    eprintln!("recovery {case}: {} ms", took.as_millis());
    assert!(
        took <= recovery_bound(),
        "{case}: back after {took:?}, more than {RECOVERY_INTERVALS} intervals (+{SLACK_INTERVALS} of slack) = {:?}",
        recovery_bound()
    );
    v
}

/// What a client sees of the exporter at one moment.
struct Seen {
    ready: u16,
    healthy: u16,
    metrics: String,
    /// How long `/metrics` took to answer.
    scrape: Duration,
}

fn look(e: &Exporter) -> Seen {
    let started = Instant::now();
    let metrics = e.metrics();
    let scrape = started.elapsed();
    Seen {
        ready: get(&e.url("/readyz")).0,
        healthy: get(&e.url("/healthz")).0,
        metrics,
        scrape,
    }
}

impl Seen {
    fn value(&self, name: &str) -> Option<f64> {
        sample_value(&self.metrics, name)
    }

    /// Ready, reaching the driver, not hung, and serving the scenario's GPU reading.
    fn gpu_data(&self) -> bool {
        self.ready == 200
            && self.value("gpu_exporter_source_up") == Some(1.0)
            && self.value("gpu_exporter_source_hung") == Some(0.0)
            && series_values(&self.metrics, "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]) == [40.0]
    }

    /// Alive, not ready, no GPU series: what an outage must look like.
    fn assert_down(&self, case: &str, hung: bool) {
        assert_eq!(self.healthy, 200, "{case}: the process itself is alive");
        assert_eq!(self.ready, 503, "{case}: not ready without GPU data");
        assert_eq!(
            self.value("gpu_exporter_source_up"),
            Some(0.0),
            "{case}:\n{}",
            self.metrics
        );
        assert_eq!(
            self.value("gpu_exporter_source_hung"),
            Some(if hung { 1.0 } else { 0.0 }),
            "{case}:\n{}",
            self.metrics
        );
        assert!(
            samples(&self.metrics, "DCGM_FI_DEV_GPU_UTIL").is_empty(),
            "{case}: no GPU readings served during the fault:\n{}",
            self.metrics
        );
        assert!(
            self.scrape < interval(),
            "{case}: a scrape waited {:?} on the sampler",
            self.scrape
        );
    }
}

/// The fake library's fault cue file.
struct Cue(PathBuf);

impl Cue {
    fn new(dir: &Path) -> Cue {
        Cue(dir.join("nvml-fault"))
    }

    /// Switch to `word` (see fake-nvml `cue.rs`), atomically.
    fn set(&self, word: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, word).expect("write the cue");
        std::fs::rename(&tmp, &self.0).expect("install the cue");
    }

    /// End the fault; the instant it ended.
    fn clear(&self) -> Instant {
        self.set("");
        Instant::now()
    }
}

/// The exporter on the fake library at `lib`, one GPU, faults cued through `cue`.
fn nvml_exporter(lib: &Path, cue: &Cue) -> Exporter {
    let scenario = fixture("fault-cue.toml");
    Exporter::start(
        &[
            "--nvml-lib",
            lib.to_str().expect("utf-8 path"),
            "-c",
            &INTERVAL_MS.to_string(),
        ],
        &[
            ("GPU_SIM_SCENARIO", scenario.to_str().expect("utf-8 path")),
            ("GPU_SIM_FAULT_FILE", cue.0.to_str().expect("utf-8 path")),
        ],
    )
}

/// Wait until the exporter has counted [`NVML_OUTAGE_CYCLES`] more failed cycles than in `seen`.
fn hold_outage(e: &Exporter, case: &str, seen: &Seen) {
    let from = seen
        .value("gpu_exporter_sample_failures_total")
        .unwrap_or(0.0);
    wait_for(&format!("{case}: the outage"), MEASURE_FOR, || {
        let failures = sample_value(&e.metrics(), "gpu_exporter_sample_failures_total")?;
        (failures >= from + NVML_OUTAGE_CYCLES).then_some(())
    });
}

fn log_count(e: &Exporter, needle: &str) -> usize {
    e.process.log().matches(needle).count()
}

/// Threads of process `pid`, from `/proc`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("read /proc/PID/task")
        .count()
}

#[test]
fn nvml_lost_mid_run_is_reported_and_back_within_two_intervals() {
    let dir = scratch_dir("fault-nvml-lost");
    let cue = Cue::new(&dir);
    let e = nvml_exporter(&fake_nvml(), &cue);
    wait_for("GPU data", MEASURE_FOR, || {
        look(&e).gpu_data().then_some(())
    });

    for outage in 1..=2 {
        let case = format!("nvml lost #{outage}");
        cue.set("unavailable");
        let down = wait_for(&format!("{case}: down"), MEASURE_FOR, || {
            let s = look(&e);
            (s.ready == 503 && s.value("gpu_exporter_source_up") == Some(0.0)).then_some(s)
        });
        down.assert_down(&case, false);
        hold_outage(&e, &case, &down);
        look(&e).assert_down(&case, false);
        let since = cue.clear();
        recovered(&case, since, || look(&e).gpu_data().then_some(()));
        // Once per state change, not once per probe.
        assert_eq!(log_count(&e, "GPU driver is not answering"), outage);
        assert_eq!(log_count(&e, "GPU driver answers again"), outage);
    }
}

#[test]
fn nvml_missing_is_reported_and_found_within_two_intervals_once_installed() {
    // Two ways for the driver to be missing: no library at all, and a library whose
    // init says the kernel driver is not loaded.
    for case in ["nvml library missing", "nvml driver not loaded"] {
        let dir = scratch_dir("fault-nvml-missing");
        let cue = Cue::new(&dir);
        let lib = if case == "nvml library missing" {
            dir.join("libnvidia-ml.so.1")
        } else {
            cue.set("not_loaded");
            fake_nvml()
        };
        let e = nvml_exporter(&lib, &cue);
        let first = e.metrics_after_samples(1);
        let seen = Seen {
            metrics: first,
            ..look(&e)
        };
        hold_outage(&e, case, &seen);
        look(&e).assert_down(case, false);
        assert!(
            e.process.log().contains("cannot initialise NVML"),
            "{}",
            e.process.log()
        );
        let since = if case == "nvml library missing" {
            std::os::unix::fs::symlink(fake_nvml(), &lib).expect("install the library");
            Instant::now()
        } else {
            cue.clear()
        };
        recovered(case, since, || look(&e).gpu_data().then_some(()));
        assert_eq!(log_count(&e, "GPU driver is not answering"), 1, "{case}");
    }
}

#[test]
fn nvml_hung_is_reported_piles_up_nothing_and_is_back_within_two_intervals() {
    let dir = scratch_dir("fault-nvml-hung");
    let cue = Cue::new(&dir);
    let e = nvml_exporter(&fake_nvml(), &cue);
    wait_for("GPU data", MEASURE_FOR, || {
        look(&e).gpu_data().then_some(())
    });

    // A read that never returns, then a probe that never returns (the driver hangs
    // while it is already down): both reported as hung, neither piling up calls.
    for (case, before) in [
        ("nvml hung read", None),
        ("nvml hung probe", Some("unavailable")),
    ] {
        if let Some(word) = before {
            cue.set(word);
            wait_for(&format!("{case}: down"), MEASURE_FOR, || {
                let s = look(&e);
                (s.ready == 503 && s.value("gpu_exporter_source_up") == Some(0.0)).then_some(())
            });
        }
        cue.set("hang");
        let hung = wait_for(&format!("{case}: hung"), MEASURE_FOR, || {
            let s = look(&e);
            (s.value("gpu_exporter_source_hung") == Some(1.0)).then_some(s)
        });
        hung.assert_down(case, true);
        let samples_hung = hung.value("gpu_exporter_samples_total");
        let threads_hung = threads(e.process.pid());
        // The fault lasts several hung budgets: nothing new may start meanwhile.
        let hold = interval() * HUNG_INTERVALS * 3;
        let held = Instant::now();
        wait_for(&format!("{case}: held"), MEASURE_FOR, || {
            (held.elapsed() >= hold).then_some(())
        });
        let still = look(&e);
        still.assert_down(case, true);
        assert_eq!(
            still.value("gpu_exporter_samples_total"),
            samples_hung,
            "{case}: no cycle started behind the hung call"
        );
        assert_eq!(
            threads(e.process.pid()),
            threads_hung,
            "{case}: threads piled up behind the hung call"
        );
        let since = cue.clear();
        recovered(case, since, || look(&e).gpu_data().then_some(()));
    }
    assert_eq!(
        log_count(&e, "a GPU call has not returned"),
        2,
        "{}",
        e.process.log()
    );
}

#[test]
fn nvml_late_answers_keep_the_exporter_ready_and_say_how_long_a_cycle_took() {
    let dir = scratch_dir("fault-nvml-late");
    let cue = Cue::new(&dir);
    let e = nvml_exporter(&fake_nvml(), &cue);
    let fast = wait_for("GPU data", MEASURE_FOR, || {
        let s = look(&e);
        s.gpu_data().then_some(s)
    });
    let fast_cycle = fast
        .value("gpu_exporter_sample_duration_seconds")
        .expect("sample duration");
    // Each call a fiftieth of an interval late: a cycle of a few dozen calls takes
    // about an interval, well short of the hung budget.
    let delay = interval() / 50;
    cue.set(&format!("slow={}", delay.as_millis()));
    let slow = wait_for("slow cycles", MEASURE_FOR, || {
        let s = look(&e);
        let took = s.value("gpu_exporter_sample_duration_seconds")?;
        (took >= fast_cycle + delay.as_secs_f64() * 10.0).then_some(s)
    });
    assert!(
        slow.gpu_data(),
        "late answers are still answers:\n{}",
        slow.metrics
    );
    assert_eq!(slow.healthy, 200);
    assert!(
        slow.scrape < interval(),
        "a scrape waited {:?}",
        slow.scrape
    );
    let since = cue.clear();
    recovered("nvml late", since, || {
        let s = look(&e);
        let took = s.value("gpu_exporter_sample_duration_seconds")?;
        (s.gpu_data() && took < fast_cycle + delay.as_secs_f64() * 10.0).then_some(())
    });
    assert_eq!(log_count(&e, "GPU driver is not answering"), 0);
    assert_eq!(log_count(&e, "a GPU call has not returned"), 0);
}

/// The scenario node of the attribution tests, its GPUs simulated, time frozen.
const PODS_SCENARIO: &str = "tests/fixtures/pods-node.toml";

/// The exporter with pod attribution against `node`, sampling and refreshing the
/// kubelet's list every [`INTERVAL_MS`].
fn kube_exporter(node: &KubeNode) -> Exporter {
    let interval = format!("{INTERVAL_MS}ms");
    let socket = node.socket().display().to_string();
    let kubeconfig = node.kubeconfig().display().to_string();
    let proc_root = node.proc_root().display().to_string();
    Exporter::start(
        &[
            "-c",
            &INTERVAL_MS.to_string(),
            "-k",
            "--kubernetes-refresh-interval",
            &interval,
            "--pod-resources-kubelet-socket",
            &socket,
            "--kubeconfig",
            &kubeconfig,
            "--proc-root",
            &proc_root,
            &format!("--simulate={PODS_SCENARIO}"),
        ],
        &[("NODE_NAME", "node-a")],
    )
}

/// GPU series every scrape of the pods node carries, with or without pods.
fn power_series(s: &Seen) -> usize {
    samples(&s.metrics, "DCGM_FI_DEV_POWER_USAGE").len()
}

/// Labelled: kubelet and pod watch up, the training pod on its GPU.
fn labelled(e: &Exporter) -> Option<Seen> {
    let s = look(e);
    (s.ready == 200
        && s.value("gpu_exporter_kubelet_up") == Some(1.0)
        && s.value("gpu_exporter_pod_watch_up") == Some(1.0)
        && s.metrics.contains("pod=\"train-0\""))
    .then_some(s)
}

/// A kubelet fault seen from outside: GPU metrics go on, ready, without pod labels.
fn assert_kubelet_down(case: &str, s: &Seen, gpu_series: usize) {
    assert_eq!(s.healthy, 200, "{case}");
    assert_eq!(s.ready, 200, "{case}: the GPU data is fresh");
    assert_eq!(s.value("gpu_exporter_kubelet_up"), Some(0.0), "{case}");
    assert!(
        !s.metrics.contains("pod=\""),
        "{case}: no pod labels the kubelet does not vouch for"
    );
    assert_eq!(power_series(s), gpu_series, "{case}: GPU metrics go on");
    assert!(
        s.scrape < interval(),
        "{case}: a scrape waited {:?}",
        s.scrape
    );
}

/// Wait for the kubelet fault to show, hold it for [`KUBELET_OUTAGE_LISTS`] failed lists,
/// clear it with `clear`, and time the labels' return.
fn kubelet_outage(e: &Exporter, case: &str, gpu_series: usize, clear: impl FnOnce()) {
    let down = wait_for(&format!("{case}: down"), MEASURE_FOR, || {
        let s = look(e);
        (s.value("gpu_exporter_kubelet_up") == Some(0.0)).then_some(s)
    });
    assert_kubelet_down(case, &down, gpu_series);
    let from = down
        .value("gpu_exporter_kubelet_list_failures_total")
        .expect("failure counter");
    wait_for(&format!("{case}: the outage"), MEASURE_FOR, || {
        let failures = sample_value(&e.metrics(), "gpu_exporter_kubelet_list_failures_total")?;
        (failures >= from + KUBELET_OUTAGE_LISTS).then_some(())
    });
    assert_kubelet_down(case, &look(e), gpu_series);
    clear();
    let since = Instant::now();
    recovered(case, since, || labelled(e));
}

#[test]
fn kubelet_missing_at_start_then_started_is_found_within_two_intervals() {
    let node = KubeNode::start(PODS_SCENARIO, "node-a");
    node.kubelet().stop().expect("stop the kubelet");
    let e = kube_exporter(&node);
    let gpus = wait_for("GPU data", MEASURE_FOR, || {
        let s = look(&e);
        (s.ready == 200 && power_series(&s) > 0).then_some(power_series(&s))
    });
    kubelet_outage(&e, "kubelet missing", gpus, || {
        node.kubelet().restart().expect("start the kubelet")
    });
    assert_eq!(log_count(&e, "kubelet PodResources is not answering"), 1);
    assert_eq!(log_count(&e, "kubelet PodResources answers again"), 1);
}

#[test]
fn kubelet_restarts_are_reported_and_labels_back_within_two_intervals() {
    let node = KubeNode::start(PODS_SCENARIO, "node-a");
    let e = kube_exporter(&node);
    let gpus = power_series(&wait_for("labelled", MEASURE_FOR, || labelled(&e)));
    for restart in 1..=2 {
        node.kubelet().stop().expect("stop the kubelet");
        kubelet_outage(&e, &format!("kubelet restarting #{restart}"), gpus, || {
            node.kubelet().restart().expect("restart the kubelet")
        });
        assert_eq!(
            log_count(&e, "kubelet PodResources is not answering"),
            restart
        );
        assert_eq!(log_count(&e, "kubelet PodResources answers again"), restart);
    }
}

#[test]
fn a_garbage_silent_or_failing_kubelet_is_reported_and_labels_back_within_two_intervals() {
    use kube_sim::kubelet::Behavior;
    let node = KubeNode::start(PODS_SCENARIO, "node-a");
    let e = kube_exporter(&node);
    let gpus = power_series(&wait_for("labelled", MEASURE_FOR, || labelled(&e)));
    for (case, behavior) in [
        ("kubelet garbage", Behavior::Garbage),
        ("kubelet bad protobuf", Behavior::BadProtobuf),
        ("kubelet silent", Behavior::Hang),
        (
            "kubelet error status",
            Behavior::Fail(tonic::Code::Internal, "broken".into()),
        ),
    ] {
        node.kubelet().set_behavior(behavior);
        kubelet_outage(&e, case, gpus, || {
            node.kubelet().set_behavior(Behavior::Serve)
        });
    }
    assert_eq!(log_count(&e, "kubelet PodResources is not answering"), 4);
}

#[test]
fn a_down_api_server_keeps_the_last_pods_and_the_watch_comes_back() {
    let node = KubeNode::start(PODS_SCENARIO, "node-a");
    let e = kube_exporter(&node);
    let before = wait_for("labelled", MEASURE_FOR, || labelled(&e));
    node.api().set_available(false);
    let down = wait_for("watch down", MEASURE_FOR, || {
        let s = look(&e);
        (s.value("gpu_exporter_pod_watch_up") == Some(0.0)).then_some(s)
    });
    assert_eq!(down.healthy, 200);
    assert_eq!(down.ready, 200, "the GPU data is fresh");
    assert_eq!(down.value("gpu_exporter_kubelet_up"), Some(1.0));
    assert_eq!(
        samples(&down.metrics, "DCGM_FI_DEV_POWER_USAGE"),
        samples(&before.metrics, "DCGM_FI_DEV_POWER_USAGE"),
        "the last known pods keep labelling the series"
    );
    node.api().set_available(true);
    // The pod watch backs off between re-lists (kube-support's watch, shared with the
    // adapter, so an API server that is overloaded is not hammered): its bound is the
    // watch's longest pause, not the collect interval.
    let since = Instant::now();
    wait_for("watch back", MEASURE_FOR, || labelled(&e));
    eprintln!(
        "recovery api server down: {} ms",
        since.elapsed().as_millis()
    );
    assert!(since.elapsed() <= kube_support::watch::MAX_RETRY + recovery_bound());
}

#[test]
fn a_down_api_server_keeps_the_adapters_targets_and_its_watch_comes_back() {
    // The adapter's reviews with the API server down are tested in adapter_auth.rs
    // (`reviews_that_cannot_be_made_refuse_the_request`); this is its exporter discovery.
    // The namespace the slice helper puts the exporters' EndpointSlices in.
    use crate::adapter_discovery::NAMESPACE;
    const TRAIN_0: &str =
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/train-0/gpu_memory_used_bytes";
    let node = KubeNode::start(PODS_SCENARIO, "node-a");
    let e = e2e_tests::attributed_exporter(&node, PODS_SCENARIO);
    let port: u16 = e
        .base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the exporter's port");
    let ours = crate::adapter_discovery::slice(
        "gpu-exporter-x7k2p",
        "gpu-exporter",
        port,
        &[("127.0.0.1", true)],
    );
    node.api().apply_endpoint_slice(ours.clone());
    let kubeconfig = node.kubeconfig().display().to_string();
    let service = format!("{NAMESPACE}/gpu-exporter");
    let a = e2e_tests::Adapter::start(&[
        "--scrape-interval",
        &format!("{INTERVAL_MS}ms"),
        "--kubeconfig",
        &kubeconfig,
        "--exporter-service",
        &service,
    ]);
    let ready = || get(&format!("{}/readyz", a.base)).0;
    wait_for("train-0 through discovery", MEASURE_FOR, || {
        (a.get(TRAIN_0).0 == 200 && ready() == 200).then_some(())
    });

    node.api().set_available(false);
    wait_for("the adapter notices", MEASURE_FOR, || {
        a.process
            .log()
            .contains("failed; keeping the last known objects")
            .then_some(())
    });
    // The last known exporters are still scraped: answers and readiness go on.
    let (status, body) = a.get(TRAIN_0);
    assert_eq!(status, 200, "{body}");
    assert_eq!(ready(), 200);
    assert_eq!(get(&format!("{}/livez", a.base)).0, 200);

    node.api().set_available(true);
    // The watch is back once a change made now reaches the adapter: the slice goes, and
    // with it the pod's data. Bounded by the watch's longest pause between re-lists.
    assert!(
        node.api()
            .delete_endpoint_slice(NAMESPACE, "gpu-exporter-x7k2p")
    );
    let since = Instant::now();
    wait_for("the slice's removal seen", MEASURE_FOR, || {
        a.process.log().contains("no ready exporters").then_some(())
    });
    eprintln!(
        "recovery adapter discovery after api down: {} ms",
        since.elapsed().as_millis()
    );
    assert!(since.elapsed() <= kube_support::watch::MAX_RETRY + recovery_bound());
}
