//! DRA end to end (issue 17): the real exporter, simulated or fake-NVML GPUs whose minor
//! numbers differ from their indices, and a simulated node whose fake kubelet reports
//! claims as NVIDIA's DRA driver names devices (`gpu-<minor>`, MIG by profile ID and
//! placement, both driver generations), plus the fake API server's ResourceSlices.

use crate::attribution::{device_labels, exact, exporter_on, label_sets, scrape_when};
use e2e_tests::{KubeNode, fixture, sample_value, wait_for};
use kube_sim::proto::{ClaimResource, ContainerResources, DynamicResource, PodResources};
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/dra-node.toml";

fn scenario() -> (gpu_sim::Scenario, gpu_sim::SimNode) {
    let s = gpu_sim::Scenario::load(&fixture("dra-node.toml")).expect("scenario");
    let n = gpu_sim::SimNode::new(&s, std::time::SystemTime::now());
    (s, n)
}

/// The tail of a series held through a claim: pod labels, container, the `dra_*`
/// labels (MIG ones from the scenario's own instance), namespace and pod.
fn claim_tail(
    n: &gpu_sim::SimNode,
    pod_labels: &str,
    (container, namespace, pod): (&str, &str, &str),
    claim: &str,
    device: &str,
    mig: Option<(usize, usize)>,
) -> String {
    let mig = mig
        .map(|(g, m)| {
            let m = &n.gpus[g].mig[m];
            format!(
                ",dra_mig_device_uuid=\"{}\",dra_mig_profile=\"{}\"",
                m.uuid, m.profile.name
            )
        })
        .unwrap_or_default();
    format!(
        "{pod_labels},container=\"{container}\",dra_claim_name=\"{claim}\",dra_claim_namespace=\"{namespace}\",\
         dra_device_name=\"{device}\",dra_driver_name=\"gpu.nvidia.com\"{mig},dra_pool_name=\"node-a\",\
         namespace=\"{namespace}\",pod=\"{pod}\""
    )
}

/// The device name the fake kubelet reports for the claim of pod `pod`.
fn device_name(s: &gpu_sim::Scenario, n: &gpu_sim::SimNode, pod: &str) -> String {
    let p = s.pods.iter().find(|p| p.name == pod).expect("pod");
    n.dra_device_name(&p.containers[0].claims[0])
        .expect("device name")
}

fn claims_label_the_right_series(nvml: bool) {
    let (s, n) = scenario();
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = exporter_on("dra-node.toml", &node, nvml, &[]);
    let body = scrape_when(&e, "DRA pod labels", |b| b.contains("pod=\"legacy-0\""));

    // NVIDIA's names, as the fake kubelet reports them: minor numbers, never indices.
    let train_device = device_name(&s, &n, "train-0");
    assert_eq!(train_device, format!("gpu-{}", n.gpus[0].minor_number));
    assert_ne!(
        n.gpus[0].minor_number, 0,
        "the scenario's minors differ from indices"
    );

    let want = device_labels(
        &n,
        0,
        None,
        &claim_tail(
            &n,
            ",app=\"trainer\"",
            ("main", "ml", "train-0"),
            "train-gpu",
            &train_device,
            None,
        ),
    );
    assert!(
        exact(&body, "DCGM_FI_DEV_POWER_USAGE", &want).is_some(),
        "want {want}\nhave {:#?}",
        label_sets(&body, "DCGM_FI_DEV_POWER_USAGE")
    );
    // The GPU whose index is the claimed minor number stays free.
    let index_of_minor = device_labels(&n, 1, None, "");
    assert!(
        exact(&body, "DCGM_FI_DEV_POWER_USAGE", &index_of_minor).is_some(),
        "GPU 1 (minor 0) is nobody's: {:#?}",
        label_sets(&body, "DCGM_FI_DEV_POWER_USAGE")
    );

    // MIG devices: the 25.12+ name (profile, profile ID, placement) and the 25.3/25.8
    // one (profile ID, placement start and size).
    for (pod, container, claim, slot) in [
        ("serve-0", "vllm", "serve-slice", 0),
        ("legacy-0", "app", "old-slice", 2),
    ] {
        let device = device_name(&s, &n, pod);
        let want = device_labels(
            &n,
            2,
            Some(slot),
            &claim_tail(
                &n,
                "",
                (container, "ml", pod),
                claim,
                &device,
                Some((2, slot)),
            ),
        );
        assert!(
            exact(&body, "DCGM_FI_DEV_FB_USED", &want).is_some(),
            "{device}: want {want}\nhave {:#?}",
            label_sets(&body, "DCGM_FI_DEV_FB_USED")
        );
    }
    assert_eq!(
        sample_value(&body, "gpu_exporter_pod_devices_unmapped"),
        Some(0.0)
    );

    // A claim that appears after startup (a pod scheduled later) on a MIG device: the
    // next kubelet refresh resolves it against the current inventory.
    let free_before = device_labels(&n, 2, Some(1), "");
    assert!(exact(&body, "DCGM_FI_DEV_FB_USED", &free_before).is_some());
    node.kubelet().set_pods(kube_sim::node::pod_resources_on(
        &s, &n, "node-a", 2e6, false,
    ));
    let late_device = device_name(&s, &n, "late-0");
    let want = device_labels(
        &n,
        2,
        Some(1),
        &claim_tail(
            &n,
            "",
            ("job", "batch", "late-0"),
            "late-slice",
            &late_device,
            Some((2, 1)),
        ),
    );
    let body = scrape_when(&e, "the late claim", |b| {
        exact(b, "DCGM_FI_DEV_FB_USED", &want).is_some()
    });
    assert!(exact(&body, "DCGM_FI_DEV_FB_USED", &free_before).is_none());
    // Every claim has its allocation series too.
    let allocations = label_sets(&body, "gpu_exporter_pod_gpu_allocation");
    assert_eq!(allocations.len(), 4, "{allocations:#?}");
    assert!(allocations.iter().all(|l| l.contains("dra_claim_name=")));
}

#[test]
fn dra_claims_label_the_right_gpu_and_mig_series_simulated() {
    claims_label_the_right_series(false);
}

#[test]
fn dra_claims_label_the_right_gpu_and_mig_series_through_nvml() {
    claims_label_the_right_series(true);
}

/// With `--kubernetes-enable-dra`, the exporter watches the node's ResourceSlices of
/// NVIDIA's driver and resolves a device by the UUID its slice publishes, even one whose
/// name it cannot read, and one published after startup; without the flag that device
/// stays unmapped and no ResourceSlice is asked for.
#[test]
fn the_resource_slice_watch_resolves_devices_by_their_published_uuid() {
    let (s, n) = scenario();
    let node = KubeNode::start(SCENARIO, "node-a");
    let slice_requests = || {
        node.api()
            .requests()
            .into_iter()
            .filter(|r| r.contains("/apis/resource.k8s.io/v1/resourceslices"))
            .collect::<Vec<_>>()
    };
    // Without the flag: DRA claims are labelled from the names alone, and no slice is
    // asked for (the pod watch is up by then, so the API client is too).
    let without = exporter_on("dra-node.toml", &node, true, &[]);
    scrape_when(&without, "DRA pod labels", |b| {
        b.contains("pod=\"legacy-0\"")
    });
    assert_eq!(slice_requests(), Vec::<String>::new());
    let with = exporter_on("dra-node.toml", &node, true, &["--kubernetes-enable-dra"]);
    scrape_when(&with, "DRA pod labels", |b| b.contains("pod=\"legacy-0\""));
    let asked = wait_for("a ResourceSlice list", Duration::from_secs(30), || {
        let r = slice_requests();
        (!r.is_empty()).then_some(r)
    });
    // Only this node's slices of NVIDIA's driver.
    assert!(
        asked
            .iter()
            .all(|r| r.contains("spec.nodeName%3Dnode-a")
                && r.contains("spec.driver%3Dgpu.nvidia.com")),
        "{asked:#?}"
    );

    // After startup: a slice publishing a device under a name of no known form, with
    // GPU 3's UUID, and a pod claiming it.
    let mut slice = kube_sim::node::resource_slice(&n, "node-a");
    slice.metadata.name = Some("node-a-gpu.nvidia.com-extra".into());
    let mut device = slice.spec.devices.as_ref().expect("devices")[0].clone();
    device.name = "gpu-partition-x".into();
    if let Some(attrs) = device.attributes.as_mut()
        && let Some(uuid) = attrs.get_mut("uuid")
    {
        uuid.string = Some(n.gpus[3].uuid.clone());
    }
    slice.spec.devices = Some(vec![device]);
    node.api().apply_resource_slice(slice);
    let mut pods = kube_sim::node::pod_resources_on(&s, &n, "node-a", 0.0, false);
    pods.push(PodResources {
        name: "custom-0".into(),
        namespace: "ml".into(),
        containers: vec![ContainerResources {
            name: "c".into(),
            dynamic_resources: vec![DynamicResource {
                claim_name: "custom".into(),
                claim_namespace: "ml".into(),
                claim_resources: vec![ClaimResource {
                    driver_name: "gpu.nvidia.com".into(),
                    pool_name: "node-a".into(),
                    device_name: "gpu-partition-x".into(),
                    ..Default::default()
                }],
            }],
            ..Default::default()
        }],
        ..Default::default()
    });
    node.kubelet().set_pods(pods);

    let want = device_labels(
        &n,
        3,
        None,
        &claim_tail(
            &n,
            "",
            ("c", "ml", "custom-0"),
            "custom",
            "gpu-partition-x",
            None,
        ),
    );
    scrape_when(&with, "the device its slice names", |b| {
        exact(b, "DCGM_FI_DEV_POWER_USAGE", &want).is_some()
    });
    let body = scrape_when(&without, "the unmapped device", |b| {
        sample_value(b, "gpu_exporter_pod_devices_unmapped") == Some(1.0)
    });
    assert!(!body.contains("pod=\"custom-0\""));
}
