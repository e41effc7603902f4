//! Serving engines found in a cluster: the pods behind every Service labelled
//! `--serving-service-selector` (e.g. `gpu-metrics.io/serving=true`), through their
//! EndpointSlices, which the EndpointSlice controller labels with their Service's
//! labels. Each ready endpoint that is a pod (`targetRef`) is scraped at
//! `<scheme>://<address>:<port>/metrics`, on the port named `--serving-port-name`
//! (or the slice's only port), as the exporters' discovery does; the slices are
//! watched with the same restart and relist rules ([`kube_support::watch`]).

use super::super::discovery::{METRICS_PATH, is_ready, slice_port, url_host};
use super::{ServingTarget, TargetPods};
use crate::fleet::PodKey;
use arc_swap::ArcSwap;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube_support::watch::Change;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Every ready pod endpoint of `slices`: its metrics URL and its pod.
pub fn targets_from_slices<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port_name: &str,
    scheme: &str,
) -> BTreeMap<String, PodKey> {
    let mut out = BTreeMap::new();
    for slice in slices {
        let Some(port) = slice_port(slice, port_name) else {
            continue;
        };
        for endpoint in slice.endpoints.iter().filter(|e| is_ready(e)) {
            let Some(pod) = endpoint
                .target_ref
                .as_ref()
                .filter(|r| r.kind.as_deref() == Some("Pod"))
            else {
                continue;
            };
            let namespace = pod
                .namespace
                .clone()
                .or_else(|| slice.metadata.namespace.clone());
            let (Some(namespace), Some(name)) = (namespace, pod.name.clone()) else {
                continue;
            };
            if let Some(host) = endpoint
                .addresses
                .first()
                .and_then(|a| url_host(a, &slice.address_type))
            {
                out.insert(
                    format!("{scheme}://{host}:{port}{METRICS_PATH}"),
                    (namespace, name),
                );
            }
        }
    }
    out
}

/// Keep `pods` and `targets` equal to the static targets plus the discovered ones
/// until the runtime stops. After an error the last known targets stay in use.
pub async fn watch(
    client: kube::Client,
    selector: String,
    port_name: String,
    scheme: String,
    fixed: Vec<ServingTarget>,
    pods: TargetPods,
    targets: Arc<ArcSwap<Vec<String>>>,
) {
    let api: kube::Api<EndpointSlice> = kube::Api::all(client);
    let config = watcher::Config::default().labels(&selector);
    // Slices by (namespace, name).
    let mut slices: BTreeMap<(String, String), EndpointSlice> = BTreeMap::new();
    let key = |s: &EndpointSlice| Some((s.metadata.namespace.clone()?, s.metadata.name.clone()?));
    let what = format!("serving engine discovery ({selector})");
    let mut published: Option<usize> = None;
    kube_support::watch::watch(api, config, &what, |change| {
        let changed = match change {
            Change::Failed => false,
            Change::Listed(listed) => {
                slices = listed.into_iter().filter_map(|s| Some((key(&s)?, s))).collect();
                true
            }
            Change::Applied(slice) => match key(&slice) {
                Some(k) => slices.insert(k, slice.clone()) != Some(slice),
                None => false,
            },
            Change::Deleted(slice) => key(&slice).is_some_and(|k| slices.remove(&k).is_some()),
        };
        if !changed {
            return;
        }
        let mut current: HashMap<String, PodKey> =
            targets_from_slices(slices.values(), &port_name, &scheme).into_iter().collect();
        for t in &fixed {
            current.insert(t.url.clone(), t.pod.clone());
        }
        if published != Some(current.len()) {
            tracing::info!(selector = %selector, targets = current.len(), "serving engine targets changed");
            published = Some(current.len());
        }
        let mut urls: Vec<String> = current.keys().cloned().collect();
        urls.sort();
        // The pods first: a new target's first answer must find its pod.
        pods.store(Arc::new(current));
        targets.store(Arc::new(urls));
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn endpoint(address: &str, ready: bool, pod: Option<(&str, &str)>) -> Endpoint {
        Endpoint {
            addresses: vec![address.into()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            target_ref: pod.map(|(kind, name)| ObjectReference {
                kind: Some(kind.into()),
                name: Some(name.into()),
                namespace: Some("llm".into()),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    #[test]
    fn ready_pod_endpoints_on_the_named_port_are_targets() {
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            metadata: ObjectMeta {
                name: Some("vllm-abc".into()),
                namespace: Some("llm".into()),
                ..ObjectMeta::default()
            },
            endpoints: vec![
                endpoint("10.0.0.1", true, Some(("Pod", "vllm-0"))),
                endpoint("10.0.0.2", false, Some(("Pod", "vllm-1"))),
                endpoint("10.0.0.3", true, None),
                endpoint("10.0.0.4", true, Some(("Node", "n"))),
            ],
            ports: Some(vec![
                EndpointPort {
                    name: Some("http".into()),
                    port: Some(8000),
                    ..EndpointPort::default()
                },
                EndpointPort {
                    name: Some("metrics".into()),
                    port: Some(8002),
                    ..EndpointPort::default()
                },
            ]),
        };
        let got = targets_from_slices([&slice], "metrics", "http");
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            [(
                "http://10.0.0.1:8002/metrics".to_string(),
                ("llm".to_string(), "vllm-0".to_string())
            )]
        );
        let http = targets_from_slices([&slice], "http", "https");
        assert!(http.contains_key("https://10.0.0.1:8000/metrics"));
        assert!(
            targets_from_slices([&slice], "grpc", "http").is_empty(),
            "no such port"
        );
    }
}
