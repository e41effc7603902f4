//! Pod attribution end to end: the real exporter, simulated or fake-NVML GPUs, and a
//! simulated Kubernetes node (a fake kubelet speaking PodResources gRPC on a unix
//! socket, a fake API server serving the node's pod watch, a fake /proc). Every test
//! asserts exact label sets on `/metrics`.

use e2e_tests::{
    Exporter, KubeNode, fake_nvml, fixture, line_value, sample_value, samples, wait_for,
};
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/pods-node.toml";
/// The scenario's frozen second.
const T: f64 = 60.0;

/// The exporter against `node`, with simulated GPUs or, with `nvml`, the fake library.
fn exporter(node: &KubeNode, nvml: bool, extra: &[&str]) -> Exporter {
    exporter_on("pods-node.toml", node, nvml, extra)
}

/// [`exporter`] on another scenario of `tests/fixtures`.
pub(crate) fn exporter_on(
    scenario_file: &str,
    node: &KubeNode,
    nvml: bool,
    extra: &[&str],
) -> Exporter {
    let scenario = fixture(scenario_file);
    let simulate = format!("--simulate=tests/fixtures/{scenario_file}");
    let lib = fake_nvml();
    let mut args: Vec<&str> = vec!["-c", "200", "-k", "--kubernetes-refresh-interval", "200ms"];
    let socket = node.socket().display().to_string();
    let kubeconfig = node.kubeconfig().display().to_string();
    let proc_root = node.proc_root().display().to_string();
    args.extend([
        "--pod-resources-kubelet-socket",
        &socket,
        "--kubeconfig",
        &kubeconfig,
        "--proc-root",
        &proc_root,
    ]);
    let lib_arg = lib.display().to_string();
    if nvml {
        args.extend(["--nvml-lib", &lib_arg]);
    } else {
        args.push(&simulate);
    }
    args.extend(extra);
    let scenario_env = scenario.display().to_string();
    Exporter::start(
        &args,
        &[
            ("NODE_NAME", "node-a"),
            ("GPU_SIM_SCENARIO", &scenario_env),
            ("GPU_SIM_FROZEN_AT_S", "60"),
        ],
    )
}

/// A scrape taken once the kubelet and the pod watch are both up and `pred` holds.
pub(crate) fn scrape_when(e: &Exporter, what: &str, pred: impl Fn(&str) -> bool) -> String {
    wait_for(what, Duration::from_secs(30), || {
        let body = e.metrics();
        (sample_value(&body, "gpu_exporter_kubelet_up") == Some(1.0)
            && sample_value(&body, "gpu_exporter_pod_watch_up") == Some(1.0)
            && pred(&body))
        .then_some(body)
    })
}

/// The label set (between the braces) of every sample of `name`.
pub(crate) fn label_sets(body: &str, name: &str) -> Vec<String> {
    samples(body, name)
        .into_iter()
        .filter_map(|l| Some(l.split_once('{')?.1.rsplit_once('}')?.0.to_string()))
        .collect()
}

/// The sample of `name` whose label set is exactly `labels`.
pub(crate) fn exact(body: &str, name: &str, labels: &str) -> Option<f64> {
    samples(body, name).into_iter().find_map(|l| {
        let (set, value) = l.split_once('{')?.1.rsplit_once("} ")?;
        (set == labels).then(|| value.parse().ok())?
    })
}

/// dcgm-exporter's labels of GPU `i` (or its MIG instance `mig`) on the scenario node,
/// followed by `tail` (label fields, pod labels, attributes).
pub(crate) fn device_labels(
    node: &gpu_sim::SimNode,
    i: usize,
    mig: Option<usize>,
    tail: &str,
) -> String {
    let g = &node.gpus[i];
    let mig = mig
        .map(|m| {
            let m = &g.mig[m];
            format!(
                ",GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\"",
                m.profile.name, m.gpu_instance_id
            )
        })
        .unwrap_or_default();
    format!(
        "gpu=\"{i}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{i}\",modelName=\"{}\"{mig},Hostname=\"node-a\",DCGM_FI_DRIVER_VERSION=\"580.82.07\"{tail}",
        g.uuid, g.pci_bus_id, g.model.name
    )
}

pub(crate) fn attrs(container: &str, namespace: &str, pod: &str) -> String {
    format!(",container=\"{container}\",namespace=\"{namespace}\",pod=\"{pod}\"")
}

fn sim() -> gpu_sim::SimNode {
    let s = gpu_sim::Scenario::load(&fixture("pods-node.toml")).expect("scenario");
    let mut n = gpu_sim::SimNode::new(&s, std::time::SystemTime::now());
    n.freeze_at(T);
    n
}

/// Each GPU's `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED` series (the pods'
/// shares and the device's own) sum to the device's value in the scenario.
fn assert_shares_sum_to_devices(body: &str, n: &gpu_sim::SimNode) {
    for g in n.gpus.iter().filter(|g| g.mig.is_empty()) {
        let reading = n.gpu_reading(g.index, T);
        let uuid = format!("UUID=\"{}\"", g.uuid);
        let sum = |name: &str| -> f64 {
            samples(body, name)
                .into_iter()
                .filter(|l| l.contains(&uuid) && !l.contains("GPU_I_ID="))
                .filter_map(line_value)
                .sum()
        };
        if let Some(util) = reading.gpu_util_percent {
            assert_eq!(
                sum("DCGM_FI_DEV_GPU_UTIL"),
                f64::from(util),
                "GPU {} utilisation",
                g.index
            );
        }
        assert_eq!(
            sum("DCGM_FI_DEV_FB_USED"),
            (reading.memory.used >> 20) as f64,
            "GPU {} memory",
            g.index
        );
    }
}

fn every_form_gets_exact_labels(nvml: bool) {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node, nvml, &[]);
    let n = sim();
    let body = scrape_when(&e, "pod labels", |b| b.contains("pod=\"gke-0\""));

    // Whole GPUs: uuid form, index form, GKE name; pod labels from the allow-list only
    // (team is not allowed), sanitised and byte-sorted among the label fields.
    let expected = [
        (
            0,
            ",app=\"trainer\",app_kubernetes_io_name=\"bert\"".to_string()
                + &attrs("trainer", "ml", "train-0"),
        ),
        (
            1,
            ",app=\"indexed\"".to_string() + &attrs("main", "ml", "idx-0"),
        ),
        (4, attrs("app", "default", "gke-0")),
        // A DRA claim's device, `gpu-<minor>` (here the minor number is the index),
        // with dcgm-exporter's dra_* labels between container and namespace.
        (
            5,
            ",app_kubernetes_io_instance=\"dra-demo\",container=\"app\",dra_claim_name=\"gpu-claim\",\
             dra_claim_namespace=\"default\",dra_device_name=\"gpu-5\",dra_driver_name=\"gpu.nvidia.com\",\
             dra_pool_name=\"node-a\",namespace=\"default\",pod=\"dra-0\""
                .to_string(),
        ),
    ];
    for (gpu, tail) in &expected {
        let want = device_labels(&n, *gpu, None, tail);
        assert!(
            exact(&body, "DCGM_FI_DEV_POWER_USAGE", &want).is_some(),
            "GPU {gpu}: want {want}\nhave {:#?}",
            label_sets(&body, "DCGM_FI_DEV_POWER_USAGE")
        );
    }
    // MIG instances: MIG UUID, index `2:1`, GKE `nvidia2/giN`, legacy `MIG-GPU-…/gi/ci`.
    for (slot, pod) in [
        (0, "mig-uuid"),
        (1, "mig-index"),
        (2, "mig-gke"),
        (3, "mig-legacy"),
    ] {
        let want = device_labels(&n, 2, Some(slot), &attrs("vllm", "serve", pod));
        assert!(
            exact(&body, "DCGM_FI_DEV_FB_USED", &want).is_some(),
            "MIG slot {slot}: want {want}\nhave {:#?}",
            label_sets(&body, "DCGM_FI_DEV_FB_USED")
        );
    }
    // The MIG parent itself is held by no one and the shared GPU's device-wide series
    // stay unlabelled: no pod label is copied onto power.
    assert!(
        exact(
            &body,
            "DCGM_FI_DEV_POWER_USAGE",
            &device_labels(&n, 2, None, "")
        )
        .is_some()
    );
    assert!(
        exact(
            &body,
            "DCGM_FI_DEV_POWER_USAGE",
            &device_labels(&n, 3, None, "")
        )
        .is_some()
    );
    assert_eq!(
        samples(&body, "DCGM_FI_DEV_POWER_USAGE").len(),
        6,
        "one power series per GPU, never one per pod"
    );
    // One allocation series per held device and container.
    let allocations = label_sets(&body, "gpu_exporter_pod_gpu_allocation");
    assert_eq!(allocations.len(), 10, "{allocations:#?}");
    assert!(allocations.contains(&device_labels(
        &n,
        3,
        None,
        &(",app=\"resnet-inference\"".to_string() + &attrs("server", "inference", "share-a"))
    )));
    assert_eq!(
        sample_value(&body, "gpu_exporter_pod_devices_unmapped"),
        Some(0.0)
    );
}

#[test]
fn every_device_id_form_gets_exact_pod_labels_simulated() {
    every_form_gets_exact_labels(false);
}

#[test]
fn every_device_id_form_gets_exact_pod_labels_through_nvml() {
    every_form_gets_exact_labels(true);
}

#[test]
fn a_shared_gpu_is_split_per_pod_and_the_shares_sum_to_the_device() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node, false, &[]);
    let n = sim();
    let body = scrape_when(&e, "shares", |b| b.contains("pod=\"share-b\""));
    let reading = n.gpu_reading(3, T);
    let device_util = f64::from(reading.gpu_util_percent.expect("whole GPU utilisation"));
    let device_fb = (reading.memory.used / (1 << 20)) as f64;

    let tail =
        |pod: &str| ",app=\"resnet-inference\"".to_string() + &attrs("server", "inference", pod);
    let get = |name: &str, labels: String| {
        exact(&body, name, &labels).unwrap_or_else(|| {
            panic!(
                "{name}{{{labels}}} missing; have {:#?}",
                label_sets(&body, name)
            )
        })
    };
    let util_a = get(
        "DCGM_FI_DEV_GPU_UTIL",
        device_labels(&n, 3, None, &tail("share-a")),
    );
    let util_b = get(
        "DCGM_FI_DEV_GPU_UTIL",
        device_labels(&n, 3, None, &tail("share-b")),
    );
    let util_rest = get("DCGM_FI_DEV_GPU_UTIL", device_labels(&n, 3, None, ""));
    assert_eq!(util_a + util_b + util_rest, device_util);
    // Weights 3:1:1 (the third process is in no pod): shares follow them.
    assert_eq!((util_a, util_b, util_rest), (54.0, 18.0, 18.0));

    let fb_a = get(
        "DCGM_FI_DEV_FB_USED",
        device_labels(&n, 3, None, &tail("share-a")),
    );
    let fb_b = get(
        "DCGM_FI_DEV_FB_USED",
        device_labels(&n, 3, None, &tail("share-b")),
    );
    let fb_rest = get("DCGM_FI_DEV_FB_USED", device_labels(&n, 3, None, ""));
    assert_eq!(fb_a + fb_b + fb_rest, device_fb);
    assert_eq!(
        (fb_a, fb_b),
        (20480.0, 8192.0),
        "each pod's own processes' memory"
    );

    // Exclusive devices: their one series is the pod's, equal to the device value.
    let util0 = n.gpu_reading(0, T).gpu_util_percent;
    let tail0 = ",app=\"trainer\",app_kubernetes_io_name=\"bert\"".to_string()
        + &attrs("trainer", "ml", "train-0");
    assert_eq!(
        get("DCGM_FI_DEV_GPU_UTIL", device_labels(&n, 0, None, &tail0)),
        f64::from(util0.expect("utilisation"))
    );
    // A KEDA-style query over the pod label: the pods' own utilisation only.
    let resnet: f64 = samples(&body, "DCGM_FI_DEV_GPU_UTIL")
        .into_iter()
        .filter(|l| l.contains("app=\"resnet-inference\""))
        .filter_map(line_value)
        .sum();
    assert_eq!(resnet, util_a + util_b);
    assert_shares_sum_to_devices(&body, &n);
}

#[test]
fn a_finished_pod_loses_its_labels_even_while_the_kubelet_lists_it() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node, false, &[]);
    let n = sim();
    scrape_when(&e, "train-0 labelled", |b| b.contains("pod=\"train-0\""));
    // The pod finishes; an older kubelet (before 1.34) keeps listing it.
    assert!(node.api().set_phase("ml", "train-0", "Succeeded"));
    let body = scrape_when(&e, "train-0 unlabelled", |b| !b.contains("pod=\"train-0\""));
    assert!(
        exact(
            &body,
            "DCGM_FI_DEV_POWER_USAGE",
            &device_labels(&n, 0, None, "")
        )
        .is_some(),
        "the GPU keeps exporting, without the finished pod"
    );
    assert!(
        body.contains("pod=\"idx-0\""),
        "other pods keep their labels"
    );
    assert_eq!(
        label_sets(&body, "gpu_exporter_pod_gpu_allocation").len(),
        9
    );
}

#[test]
fn a_kubelet_outage_and_restart_keep_gpu_metrics_and_labels_come_back() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node, false, &[]);
    scrape_when(&e, "labelled", |b| b.contains("pod=\"train-0\""));

    node.kubelet().stop().expect("stop the kubelet");
    let body = wait_for("kubelet down", Duration::from_secs(30), || {
        let b = e.metrics();
        (sample_value(&b, "gpu_exporter_kubelet_up") == Some(0.0)).then_some(b)
    });
    assert!(
        !body.contains("pod=\""),
        "no pod labels without the kubelet"
    );
    assert_eq!(
        samples(&body, "DCGM_FI_DEV_POWER_USAGE").len(),
        6,
        "GPU metrics go on"
    );
    assert_eq!(
        e::get_status(&e, "/readyz"),
        200,
        "GPU data is fresh: ready"
    );
    let failures = wait_for("several failures", Duration::from_secs(30), || {
        let v = sample_value(&e.metrics(), "gpu_exporter_kubelet_list_failures_total")?;
        (v >= 3.0).then_some(v)
    });
    assert!(failures >= 3.0);
    let log = e.process.log();
    assert_eq!(
        log.matches("kubelet PodResources is not answering").count(),
        1,
        "logged once per outage, not per attempt:\n{log}"
    );

    node.kubelet().restart().expect("restart the kubelet");
    scrape_when(&e, "labels back after the restart", |b| {
        b.contains("pod=\"train-0\"")
    });
    assert!(
        e.process
            .log()
            .contains("kubelet PodResources answers again")
    );
}

#[test]
fn a_hanging_or_garbage_kubelet_is_bounded_and_reported() {
    use kube_sim::kubelet::Behavior;
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node, false, &[]);
    scrape_when(&e, "labelled", |b| b.contains("pod=\"train-0\""));

    for behavior in [Behavior::Hang, Behavior::Garbage, Behavior::RateLimited] {
        let name = format!("{behavior:?}");
        node.kubelet().set_behavior(behavior);
        let body = wait_for(
            &format!("{name}: kubelet down"),
            Duration::from_secs(30),
            || {
                let b = e.metrics();
                (sample_value(&b, "gpu_exporter_kubelet_up") == Some(0.0)).then_some(b)
            },
        );
        assert!(!body.contains("pod=\""), "{name}");
        assert_eq!(samples(&body, "DCGM_FI_DEV_POWER_USAGE").len(), 6, "{name}");
        node.kubelet().set_behavior(Behavior::Serve);
        scrape_when(&e, &format!("{name}: back"), |b| {
            b.contains("pod=\"train-0\"")
        });
    }
}

#[test]
fn a_down_api_server_keeps_the_last_known_pods() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node, false, &[]);
    scrape_when(&e, "labelled", |b| b.contains("app=\"trainer\""));
    node.api().set_available(false);
    let body = wait_for("watch down", Duration::from_secs(30), || {
        let b = e.metrics();
        (sample_value(&b, "gpu_exporter_pod_watch_up") == Some(0.0)).then_some(b)
    });
    assert!(
        body.contains("app=\"trainer\""),
        "last known pod labels stay"
    );
    assert!(body.contains("pod=\"share-a\""), "shares still split");
    assert_shares_sum_to_devices(&body, &sim());
    node.api().set_available(true);
    let back = e2e_tests::try_wait_for(Duration::from_secs(30), || {
        (sample_value(&e.metrics(), "gpu_exporter_pod_watch_up") == Some(1.0)).then_some(())
    });
    assert!(
        back.is_some(),
        "watch back after the API server returns:\n{}",
        e.process.log()
    );
}

#[test]
fn the_simulate_demo_shows_pods() {
    let e = Exporter::start(&[&format!("--simulate={SCENARIO}"), "-c", "200"], &[]);
    // The demo's pods come through the same kubelet and watch paths: wait until both
    // have answered (the allocation series alone appear before the watch syncs).
    let body = wait_for("demo pods", Duration::from_secs(30), || {
        let b = e.metrics();
        (sample_value(&b, "gpu_exporter_pod_watch_up") == Some(1.0)
            && samples(&b, "DCGM_FI_DEV_GPU_UTIL")
                .iter()
                .any(|l| l.contains("pod=\"share-a\"")))
        .then_some(b)
    });
    assert!(body.contains("pod=\"train-0\""));
    assert!(body.contains("app=\"resnet-inference\""));
    assert_shares_sum_to_devices(&body, &sim());
}

#[test]
fn a_pod_the_kubelet_stops_listing_loses_its_labels() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter(&node, false, &[]);
    scrape_when(&e, "share-b labelled", |b| b.contains("pod=\"share-b\""));
    // Kubernetes 1.34+: a finished pod leaves the kubelet's list (and the watch).
    let s = gpu_sim::Scenario::load(&fixture("pods-node.toml")).expect("scenario");
    let mut pods = kube_sim::node::pod_resources_on(&s, &sim(), "node-a", T, false);
    pods.retain(|p| p.name != "share-b");
    node.kubelet().set_pods(pods);
    assert!(node.api().delete("inference", "share-b"));
    let body = scrape_when(&e, "share-b gone", |b| !b.contains("pod=\"share-b\""));
    // share-a is now the only pod on the time-sliced GPU: still a share, not the whole
    // device, and share-b's usage moved to the unattributed remainder.
    let n = sim();
    let util_rest = exact(
        &body,
        "DCGM_FI_DEV_GPU_UTIL",
        &device_labels(&n, 3, None, ""),
    );
    assert_eq!(
        util_rest,
        Some(36.0),
        "{:#?}",
        label_sets(&body, "DCGM_FI_DEV_GPU_UTIL")
    );
    assert_shares_sum_to_devices(&body, &n);
}

#[test]
fn a_pod_resources_answer_over_4_mib_is_read() {
    use kube_sim::proto::{ContainerDevices, ContainerResources, PodResources};
    let node = KubeNode::start(SCENARIO, "node-a");
    let s = gpu_sim::Scenario::load(&fixture("pods-node.toml")).expect("scenario");
    let mut pods = kube_sim::node::pod_resources_on(&s, &sim(), "node-a", T, false);
    // 12,000 busy non-GPU pods: about 10 MiB, past gRPC's default 4 MiB limit that
    // breaks dcgm-exporter on busy nodes.
    let long = "x".repeat(300);
    pods.extend((0..12_000).map(|i| PodResources {
        name: format!("filler-{i}-{long}"),
        namespace: "batch".into(),
        containers: vec![ContainerResources {
            name: format!("c-{long}"),
            devices: vec![ContainerDevices {
                resource_name: "example.com/fpga".into(),
                device_ids: vec![format!("fpga-{i}-{long}")],
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }));
    node.kubelet().set_pods(pods);
    let e = exporter(&node, false, &[]);
    let body = scrape_when(&e, "labels from a 10 MiB answer", |b| {
        b.contains("pod=\"train-0\"")
    });
    assert!(!body.contains("filler-"), "non-GPU resources are ignored");
}

mod e {
    pub fn get_status(e: &e2e_tests::Exporter, path: &str) -> u16 {
        e2e_tests::get(&e.url(path)).0
    }
}

/// Per-process series name the pod each process runs in where the device's own labels
/// do not: on a shared GPU, and on a GPU no pod requested (a pod using a GPU it never
/// asked for). On a GPU held whole the device labels already name the pod, once.
/// Processes outside any pod get no pod labels. Both GPU paths.
#[test]
fn process_series_name_the_pod_each_process_runs_in() {
    const FILE: &str = "process-pods-node.toml";
    const MIB: f64 = 1024.0 * 1024.0;
    const FAMILY: &str = "gpu_exporter_process_memory_used_bytes";
    for nvml in [false, true] {
        let node = KubeNode::start(&format!("tests/fixtures/{FILE}"), "node-a");
        let e = exporter_on(FILE, &node, nvml, &["--process-metrics"]);
        let body = scrape_when(&e, "the sneaky pod's process labelled", |b| {
            !e2e_tests::series_values(b, FAMILY, &[("pid", "6201"), ("pod", "sneaky")]).is_empty()
        });
        let path = if nvml { "fake NVML" } else { "simulated" };
        let one = |labels: &[(&str, &str)]| {
            let values = e2e_tests::series_values(&body, FAMILY, labels);
            assert_eq!(values.len(), 1, "{path}: {labels:?} in\n{body}");
            values[0]
        };
        // GPU 2, requested by no pod: the process names its pod; the device does not.
        assert_eq!(
            one(&[("pid", "6201"), ("namespace", "default"), ("pod", "sneaky")]),
            4096.0 * MIB
        );
        assert!(
            label_sets(&body, "DCGM_FI_DEV_GPU_UTIL")
                .iter()
                .filter(|l| l.contains("gpu=\"2\""))
                .all(|l| !l.contains("pod=")),
            "{path}: an unallocated GPU's own series must not name a pod"
        );
        // GPU 1, shared: each pod's process names its pod; the system process none.
        assert_eq!(
            one(&[
                ("pid", "6101"),
                ("namespace", "inference"),
                ("pod", "share-a")
            ]),
            20480.0 * MIB
        );
        assert_eq!(
            one(&[
                ("pid", "6102"),
                ("namespace", "inference"),
                ("pod", "share-b")
            ]),
            8192.0 * MIB
        );
        assert_eq!(one(&[("pid", "6103")]), 512.0 * MIB);
        // GPU 0, held whole: the pod comes from the device's labels, never twice.
        assert_eq!(
            one(&[("pid", "6001"), ("namespace", "ml"), ("pod", "train-0")]),
            40960.0 * MIB
        );
        for labels in label_sets(&body, FAMILY) {
            let pods = labels.matches("pod=\"").count();
            let want = usize::from(!labels.contains("pid=\"6103\""));
            assert_eq!(pods, want, "{path}: {labels}");
            assert_eq!(
                labels.matches("namespace=\"").count(),
                want,
                "{path}: {labels}"
            );
        }
        // It parses (exit 3 is only dcgm's names tripping promtool's lint; a duplicate
        // label name would be a parse error).
        let (code, findings) = e2e_tests::promtool_check_metrics(&body);
        assert!(
            code == 0 || code == 3,
            "{path}: promtool check metrics (exit {code}): {findings}"
        );
    }
}
