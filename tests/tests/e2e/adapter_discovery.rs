//! gpu-metrics-adapter end to end, exporter discovery: no `--exporter-url`; the adapter
//! finds the exporter through the EndpointSlices of its Service in the (fake) API
//! server, and its targets follow the slices as they come and go.

use e2e_tests::metrics_api::items_milli;
use e2e_tests::{Adapter, KubeNode, Process, attributed_exporter, get, wait_for, workspace};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/pods-node.toml";
pub(crate) const NAMESPACE: &str = "gpu-exporter";
const TRAIN_0: &str =
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/train-0/gpu_memory_used_bytes";

/// The adapter against `node`'s API server, without `--exporter-url`.
fn adapter(node: &KubeNode, extra: &[&str]) -> Adapter {
    let kubeconfig = node.kubeconfig().display().to_string();
    let mut args = vec!["--scrape-interval", "300ms", "--kubeconfig", &kubeconfig];
    args.extend(extra);
    Adapter::start(&args)
}

/// An EndpointSlice of `service` with a `metrics` port and one endpoint per
/// (address, ready), as the EndpointSlice controller writes it.
pub(crate) fn slice(
    name: &str,
    service: &str,
    port: u16,
    endpoints: &[(&str, bool)],
) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(
                [(
                    "kubernetes.io/service-name".to_string(),
                    service.to_string(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        endpoints: endpoints
            .iter()
            .map(|(address, ready)| Endpoint {
                addresses: vec![address.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(*ready),
                    serving: Some(*ready),
                    terminating: Some(false),
                }),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("metrics".into()),
            port: Some(i32::from(port)),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

#[test]
fn the_adapter_scrapes_the_exporters_its_service_s_endpoint_slices_list() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let e = attributed_exporter(&node, SCENARIO);
    let port: u16 = e
        .base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the exporter's port");
    // The exporter's slice, with a not-ready endpoint that must not be scraped (nothing
    // listens there), and another Service's slice that must not be read.
    let ours = slice(
        "gpu-exporter-x7k2p",
        "gpu-exporter",
        port,
        &[("127.0.0.1", true), ("127.0.0.3", false)],
    );
    node.api().apply_endpoint_slice(ours.clone());
    node.api()
        .apply_endpoint_slice(slice("web-9f8d7", "web", port, &[("127.0.0.2", true)]));

    let a = adapter(
        &node,
        &[
            "--exporter-service",
            &format!("{NAMESPACE}/gpu-exporter"),
            "--max-staleness",
            "1s",
        ],
    );

    // Per-pod metrics arrive through the discovered exporter.
    let v = wait_for("train-0 through discovery", Duration::from_secs(30), || {
        let (status, v) = a.get(TRAIN_0);
        (status == 200).then_some(v)
    });
    assert_eq!(
        items_milli(&v),
        vec![("train-0".to_string(), 40_960 * 1_048_576 * 1000)]
    );
    let all =
        a.get("/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization");
    assert_eq!(all.0, 200, "{}", all.1);
    assert_eq!(items_milli(&all.1).len(), 2, "{}", all.1);
    let log = a.process.log();
    assert!(
        log.contains("exporter targets changed") && log.contains("exporters=1"),
        "{log}"
    );
    assert!(
        !log.contains("127.0.0.2") && !log.contains("127.0.0.3"),
        "{log}"
    );

    // The slice goes (the exporter pod is deleted, the Service changes): the pods'
    // data stops being served within the staleness limit.
    assert!(
        node.api()
            .delete_endpoint_slice(NAMESPACE, "gpu-exporter-x7k2p")
    );
    wait_for(
        "train-0 gone with its slice",
        Duration::from_secs(30),
        || (a.get(TRAIN_0).0 == 404).then_some(()),
    );
    let (_, body) = a.get(TRAIN_0);
    assert_eq!(body["reason"], "NotFound", "{body}");
    assert!(
        a.process.log().contains("no ready exporters"),
        "{}",
        a.process.log()
    );
    // The exporter itself still answers: it is the targets that changed.
    assert_eq!(get(&e.url("/metrics")).0, 200);

    // And it comes back with the slice.
    node.api().apply_endpoint_slice(ours);
    wait_for(
        "train-0 back with its slice",
        Duration::from_secs(30),
        || (a.get(TRAIN_0).0 == 200).then_some(()),
    );
}

#[test]
fn without_exporter_urls_the_adapter_needs_kubernetes_access() {
    let missing = workspace().join("no/such/kubeconfig").display().to_string();
    let mut process = Process::spawn(Adapter::command(&["--kubeconfig", &missing]));
    assert_eq!(process.wait_exit(Duration::from_secs(30)), Some(1));
    let log = process.log();
    assert!(
        log.contains("no --exporter-url")
            && log.contains("EndpointSlices of gpu-exporter/gpu-exporter"),
        "{log}"
    );
}
