//! The fake API server, through the real kube-rs client, list, watch and watcher, as
//! the exporter (pods) and the metrics adapter (pods, EndpointSlices) use them.

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
#[allow(deprecated)] // The exporter uses it; `watcher` on `PartialObjectMeta` is tested too.
use kube::runtime::metadata_watcher;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Config};
use kube_sim::apiserver::{FakeApiServer, PodMeta};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const NODE_SELECTOR: &str = "spec.nodeName=node-a,status.phase!=Succeeded,status.phase!=Failed";

async fn client(api: &FakeApiServer) -> (Client, tempfile::TempDir) {
    let (config, dir) = config(api).await;
    (Client::try_from(config).unwrap(), dir)
}

async fn config(api: &FakeApiServer) -> (Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube").join("config");
    api.write_kubeconfig(&path).unwrap();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string(), format!("{}/", api.url()));
    (config, dir)
}

fn pod(name: &str, node: &str, labels: &[(&str, &str)]) -> PodMeta {
    PodMeta {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..PodMeta::running("default", name, &format!("uid-{name}"), node)
    }
}

/// Polls `condition` until it holds or `within` passes.
async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    condition()
}

fn api_error(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(status) => (status.code, status.reason, status.message),
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn metadata_watcher_follows_the_node_s_unfinished_pods_through_an_outage() {
    let server = FakeApiServer::start().unwrap();
    server.apply(pod("a1", "node-a", &[("app", "x")]));
    server.apply(pod("a2", "node-a", &[]));
    server.apply(pod("b1", "node-b", &[]));
    server.apply(PodMeta {
        phase: "Succeeded".into(),
        ..pod("done", "node-a", &[])
    });
    let (client, _dir) = client(&server).await;

    let (reader, writer) = reflector::store::<PartialObjectMeta<Pod>>();
    #[allow(deprecated)] // What the exporter uses.
    let events = metadata_watcher(
        Api::<Pod>::all(client),
        watcher::Config::default().fields(NODE_SELECTOR),
    )
    .default_backoff();
    let driver = tokio::spawn(reflector(writer, events).for_each(|_| async {}));
    let names = || {
        reader
            .state()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect::<BTreeSet<_>>()
    };
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    let labels_of = |name: &str| {
        reader
            .state()
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .and_then(|p| p.metadata.labels.clone())
            .unwrap_or_default()
    };

    assert!(
        eventually(Duration::from_secs(20), || names() == set(&["a1", "a2"])).await,
        "{:?}",
        names()
    );
    let a1 = reader
        .state()
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some("a1"))
        .unwrap();
    assert_eq!(a1.metadata.uid.as_deref(), Some("uid-a1"));
    assert_eq!(
        a1.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );

    // A label update arrives.
    server.apply(pod("a1", "node-a", &[("app", "y")]));
    let want = BTreeMap::from([("app".to_string(), "y".to_string())]);
    assert!(eventually(Duration::from_secs(20), || labels_of("a1") == want).await);

    // A pod that finishes leaves the watch; one on another node never enters it.
    assert!(server.set_phase("default", "a2", "Succeeded"));
    server.apply(pod("b2", "node-b", &[]));
    assert!(eventually(Duration::from_secs(20), || names() == set(&["a1"])).await);

    // An outage: the watch is closed, the watcher's retries are refused with 503; a pod
    // added meanwhile shows up once the server is back.
    let before = server.requests().len();
    server.set_available(false);
    assert!(
        eventually(Duration::from_secs(20), || server.requests().len() > before).await,
        "the watcher retried during the outage"
    );
    server.apply(pod("a3", "node-a", &[]));
    assert!(server.delete("default", "a1"));
    server.set_available(true);
    assert!(
        eventually(Duration::from_secs(30), || names() == set(&["a3"])).await,
        "{:?}",
        names()
    );

    let requests = server.requests();
    assert!(
        requests.iter().any(|r| r.starts_with("GET /api/v1/pods?")
            && r.contains("watch=true")
            && r.contains("fieldSelector=spec.nodeName%3Dnode-a")),
        "{requests:?}"
    );
    driver.abort();
}

#[tokio::test]
async fn lists_give_full_pods_or_metadata_with_selectors() {
    let server = FakeApiServer::start().unwrap();
    server.apply(pod("a1", "node-a", &[("app", "web"), ("tier", "gpu")]));
    server.apply(pod("a2", "node-a", &[("app", "db")]));
    server.apply(PodMeta {
        namespace: "ml".into(),
        ..pod("m1", "node-b", &[("app", "web")])
    });
    let (client, _dir) = client(&server).await;
    let all: Api<Pod> = Api::all(client.clone());

    let pods = all.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        pods.metadata.resource_version.as_deref(),
        Some(server.resource_version().as_str())
    );
    assert_eq!(pods.items.len(), 3);
    let a1 = &pods.items[0];
    assert_eq!(a1.metadata.name.as_deref(), Some("a1"));
    assert_eq!(
        a1.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("node-a")
    );
    assert_eq!(
        a1.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );

    let names = |items: Vec<String>| items.into_iter().collect::<Vec<_>>();
    let web = all
        .list_metadata(&ListParams::default().labels("app=web,tier"))
        .await
        .unwrap();
    assert_eq!(
        names(
            web.items
                .iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect()
        ),
        ["a1"]
    );
    assert!(web.items[0].metadata.uid.is_some());
    let not_web = all
        .list_metadata(&ListParams::default().labels("app notin (web)"))
        .await
        .unwrap();
    assert_eq!(not_web.items.len(), 1);
    let node_b = all
        .list_metadata(&ListParams::default().fields("spec.nodeName=node-b"))
        .await
        .unwrap();
    assert_eq!(node_b.items[0].metadata.namespace.as_deref(), Some("ml"));
    let in_ml: Api<Pod> = Api::namespaced(client.clone(), "ml");
    assert_eq!(
        in_ml
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        in_ml
            .get_metadata("m1")
            .await
            .unwrap()
            .metadata
            .uid
            .as_deref(),
        Some("uid-m1")
    );
    let (code, reason, message) = api_error(in_ml.get("a1").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (404, "NotFound"), "{message}");
}

#[tokio::test]
async fn errors_are_status_objects() {
    let server = FakeApiServer::start().unwrap();
    let (client, _dir) = client(&server).await;
    let all: Api<Pod> = Api::all(client);

    let (code, reason, message) = api_error(
        all.list_metadata(&ListParams::default().fields("spec.bogus=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (400, "BadRequest", "field label not supported: spec.bogus")
    );
    assert_eq!(
        api_error(
            all.list_metadata(&ListParams::default().labels("app in (x"))
                .await
                .unwrap_err()
        )
        .0,
        400
    );

    // No token: 401.
    let mut anonymous = Config::new(server.url().parse().unwrap());
    anonymous.default_namespace = "default".into();
    let anonymous: Api<Pod> = Api::all(Client::try_from(anonymous).unwrap());
    let (code, reason, _) = api_error(anonymous.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (401, "Unauthorized"));

    // kube-rs retries 503 for minutes by default; this client takes the first answer.
    let (mut config, _dir2) = config(&server).await;
    config.default_retry = false;
    let once: Api<Pod> = Api::all(Client::try_from(config).unwrap());
    server.set_available(false);
    let (code, reason, _) = api_error(once.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (503, "ServiceUnavailable"));
    server.set_available(true);
    assert!(once.list(&ListParams::default()).await.is_ok());
    assert!(all.list(&ListParams::default()).await.is_ok());
}

#[tokio::test]
async fn watches_resume_from_history_and_get_410_beyond_it() {
    let server = FakeApiServer::start().unwrap();
    let (client, _dir) = client(&server).await;
    let all: Api<Pod> = Api::all(client);
    let start = server.resource_version();
    server.apply(pod("a1", "node-a", &[]));
    server.apply(pod("a2", "node-a", &[]));
    server.set_phase("default", "a1", "Succeeded");
    let deleted_at = server.resource_version();

    // Replay from `start` under the node selector: two adds, then a1 leaves.
    let params = WatchParams::default().fields(NODE_SELECTOR).timeout(1);
    let events: Vec<_> = all
        .watch_metadata(&params, &start)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let summary: Vec<(String, String, String)> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(p) => ("ADDED", p),
            WatchEvent::Modified(p) => ("MODIFIED", p),
            WatchEvent::Deleted(p) => ("DELETED", p),
            other => panic!("unexpected {other:?}"),
        })
        .map(|(kind, p)| {
            (
                kind.to_string(),
                p.metadata.name.clone().unwrap(),
                p.metadata.resource_version.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "ADDED".into(),
                "a1".into(),
                (start.parse::<u64>().unwrap() + 1).to_string()
            ),
            (
                "ADDED".into(),
                "a2".into(),
                (start.parse::<u64>().unwrap() + 2).to_string()
            ),
            ("DELETED".into(), "a1".into(), deleted_at.clone()),
        ]
    );

    // Beyond the retained history: an ERROR event with 410 Gone.
    server.set_history_limit(2);
    let mut stream = all
        .watch_metadata(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected 410, got {other:?}"),
    }
    assert!(stream.try_next().await.unwrap().is_none());
}

#[tokio::test]
async fn watches_send_bookmarks_and_end_at_their_timeout() {
    let server = FakeApiServer::start().unwrap();
    server.set_bookmark_interval(Duration::from_millis(100));
    let (client, _dir) = client(&server).await;
    let all: Api<Pod> = Api::all(client);
    server.apply(pod("a1", "node-a", &[]));
    let rv = server.resource_version();

    let started = Instant::now();
    let mut stream = all
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    let mut bookmarks = 0;
    let mut added = Vec::new();
    let mut applied = false;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = stream.try_next().await.unwrap() {
            match event {
                WatchEvent::Bookmark(b) => {
                    bookmarks += 1;
                    assert_eq!(b.types.kind, "Pod");
                    if !applied {
                        assert_eq!(b.metadata.resource_version, rv);
                        applied = true;
                        server.apply(pod("a2", "node-b", &[]));
                    }
                }
                WatchEvent::Added(p) => {
                    // Full pods: this watch did not ask for metadata only.
                    assert!(p.spec.is_some());
                    added.push(p.metadata.name.unwrap());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch ended at its timeout");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1900), "{took:?}");
    assert!(bookmarks >= 2, "{bookmarks}");
    assert_eq!(added, ["a2"]);
}

#[tokio::test]
async fn streaming_lists_end_their_initial_events_with_a_bookmark() {
    let server = FakeApiServer::start().unwrap();
    server.apply(pod("a1", "node-a", &[]));
    server.apply(pod("b1", "node-b", &[]));
    let (client, _dir) = client(&server).await;
    let (reader, writer) = reflector::store::<PartialObjectMeta<Pod>>();
    // kube-rs's successor to `metadata_watcher`.
    let events = watcher(
        Api::<PartialObjectMeta<Pod>>::all(client),
        watcher::Config::default()
            .fields(NODE_SELECTOR)
            .streaming_lists(),
    )
    .default_backoff();
    let driver = tokio::spawn(reflector(writer, events).for_each(|_| async {}));
    let names = || {
        reader
            .state()
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    };
    assert!(eventually(Duration::from_secs(20), || names() == ["a1"]).await);
    server.apply(pod("a2", "node-a", &[]));
    assert!(
        eventually(Duration::from_secs(20), || {
            let mut n = names();
            n.sort();
            n == ["a1", "a2"]
        })
        .await
    );
    let requests = server.requests();
    assert!(
        requests.iter().all(|r| r.contains("watch=true")),
        "a streaming list makes no list call: {requests:?}"
    );
    driver.abort();
}

const SERVICE_LABEL: &str = "kubernetes.io/service-name";

/// An EndpointSlice of `service` in `namespace` with one `metrics` port and an endpoint
/// per (address, ready).
fn slice(namespace: &str, name: &str, service: &str, endpoints: &[(&str, bool)]) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some([(SERVICE_LABEL.to_string(), service.to_string())].into()),
            ..ObjectMeta::default()
        },
        endpoints: endpoints
            .iter()
            .map(|(address, ready)| Endpoint {
                addresses: vec![address.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(*ready),
                    ..EndpointConditions::default()
                }),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("metrics".into()),
            port: Some(9400),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

/// (name, [(address, ready)]) of every slice in a reflector's store, sorted.
fn slice_state(reader: &reflector::Store<EndpointSlice>) -> Vec<(String, Vec<(String, bool)>)> {
    let mut state: Vec<_> = reader
        .state()
        .iter()
        .map(|s| {
            let endpoints = s
                .endpoints
                .iter()
                .map(|e| {
                    let ready = e.conditions.as_ref().and_then(|c| c.ready);
                    (e.addresses.join(","), ready != Some(false))
                })
                .collect();
            (s.metadata.name.clone().unwrap_or_default(), endpoints)
        })
        .collect();
    state.sort();
    state
}

fn expected(slices: &[(&str, &[(&str, bool)])]) -> Vec<(String, Vec<(String, bool)>)> {
    slices
        .iter()
        .map(|(name, endpoints)| {
            (
                name.to_string(),
                endpoints.iter().map(|(a, r)| (a.to_string(), *r)).collect(),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_endpoint_slice_watcher_by_service_label_sees_adds_updates_and_deletes() {
    let server = FakeApiServer::start().unwrap();
    server.apply_endpoint_slice(slice(
        "gpu-monitoring",
        "gpu-exporter-a",
        "gpu-exporter",
        &[("10.0.0.1", true)],
    ));
    // Another Service's slice, and the same Service name in another namespace: neither
    // is seen.
    server.apply_endpoint_slice(slice(
        "gpu-monitoring",
        "web-a",
        "web",
        &[("10.0.9.1", true)],
    ));
    server.apply_endpoint_slice(slice(
        "other",
        "gpu-exporter-x",
        "gpu-exporter",
        &[("10.0.8.1", true)],
    ));
    let (client, _dir) = client(&server).await;

    let (reader, writer) = reflector::store::<EndpointSlice>();
    let events = watcher(
        Api::<EndpointSlice>::namespaced(client, "gpu-monitoring"),
        watcher::Config::default().labels(&format!("{SERVICE_LABEL}=gpu-exporter")),
    )
    .default_backoff();
    let driver = tokio::spawn(reflector(writer, events).for_each(|_| async {}));
    let within = Duration::from_secs(20);

    let want = expected(&[("gpu-exporter-a", &[("10.0.0.1", true)])]);
    assert!(
        eventually(within, || slice_state(&reader) == want).await,
        "{:?}",
        slice_state(&reader)
    );
    let a = reader.state()[0].clone();
    assert_eq!(a.ports.as_ref().and_then(|p| p[0].port), Some(9400));
    assert!(a.metadata.uid.is_some());

    // Add a second slice; update the first (a new endpoint, one turning unready).
    server.apply_endpoint_slice(slice(
        "gpu-monitoring",
        "gpu-exporter-b",
        "gpu-exporter",
        &[("10.0.1.1", true)],
    ));
    server.apply_endpoint_slice(slice(
        "gpu-monitoring",
        "gpu-exporter-a",
        "gpu-exporter",
        &[("10.0.0.1", false), ("10.0.0.2", true)],
    ));
    let want = expected(&[
        ("gpu-exporter-a", &[("10.0.0.1", false), ("10.0.0.2", true)]),
        ("gpu-exporter-b", &[("10.0.1.1", true)]),
    ]);
    assert!(
        eventually(within, || slice_state(&reader) == want).await,
        "{:?}",
        slice_state(&reader)
    );

    // Delete one; and one whose Service label changes leaves the watch too.
    assert!(server.delete_endpoint_slice("gpu-monitoring", "gpu-exporter-a"));
    assert!(!server.delete_endpoint_slice("gpu-monitoring", "gpu-exporter-a"));
    server.apply_endpoint_slice(slice(
        "gpu-monitoring",
        "gpu-exporter-b",
        "renamed",
        &[("10.0.1.1", true)],
    ));
    assert!(
        eventually(within, || slice_state(&reader).is_empty()).await,
        "{:?}",
        slice_state(&reader)
    );

    let requests = server.requests();
    assert!(
        requests.iter().any(|r| r.starts_with(
            "GET /apis/discovery.k8s.io/v1/namespaces/gpu-monitoring/endpointslices?"
        ) && r.contains("watch=true")
            && r.contains("labelSelector=kubernetes.io%2Fservice-name%3Dgpu-exporter")),
        "{requests:?}"
    );
    driver.abort();
}

#[tokio::test]
async fn endpoint_slices_list_get_and_resume_beside_pods() {
    let server = FakeApiServer::start().unwrap();
    let (client, _dir) = client(&server).await;
    let start = server.resource_version();
    server.apply(pod("p1", "node-a", &[]));
    server.apply_endpoint_slice(slice(
        "gpu-monitoring",
        "s1",
        "gpu-exporter",
        &[("10.0.0.1", true)],
    ));
    server.apply_endpoint_slice(slice("ml", "s2", "gpu-exporter", &[("10.0.0.2", true)]));
    // A no-op apply is no change.
    let rv = server.resource_version();
    server.apply_endpoint_slice(slice("ml", "s2", "gpu-exporter", &[("10.0.0.2", true)]));
    assert_eq!(server.resource_version(), rv);
    assert_eq!(server.endpoint_slices().len(), 2);

    // Cluster-wide list with a label selector; full objects with the list's version.
    let all: Api<EndpointSlice> = Api::all(client.clone());
    let list = all
        .list(&ListParams::default().labels(&format!("{SERVICE_LABEL}=gpu-exporter")))
        .await
        .unwrap();
    assert_eq!(list.metadata.resource_version.as_deref(), Some(rv.as_str()));
    let names: Vec<_> = list
        .items
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["s1", "s2"]);
    assert_eq!(list.items[0].endpoints[0].addresses, ["10.0.0.1"]);
    assert!(
        all.list(&ListParams::default().labels(&format!("{SERVICE_LABEL}=nope")))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // Metadata-only lists work for slices too.
    let meta = all.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(meta.items.len(), 2);

    // Get one; a missing one is a NotFound Status naming the resource.
    let ml: Api<EndpointSlice> = Api::namespaced(client.clone(), "ml");
    let s2 = ml.get("s2").await.unwrap();
    assert_eq!(s2.metadata.namespace.as_deref(), Some("ml"));
    let (code, reason, message) = api_error(ml.get("s1").await.unwrap_err());
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (404, "NotFound", "endpointslices \"s1\" not found")
    );
    // Pod fields are not EndpointSlice fields.
    let (code, _, message) = api_error(
        all.list(&ListParams::default().fields("spec.nodeName=node-a"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (400, "field label not supported: spec.nodeName")
    );

    // Resuming from one version: each kind's watch sees only its own changes.
    let params = WatchParams::default().timeout(1);
    let slice_events: Vec<_> = all
        .watch(&params, &start)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let added: Vec<_> = slice_events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(s) => s.metadata.name.clone().unwrap(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(added, ["s1", "s2"]);
    let pod_events: Vec<_> = Api::<Pod>::all(client)
        .watch(&params, &start)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(pod_events.len(), 1, "{pod_events:?}");

    // 410 Gone for slices beyond the history, as for pods.
    server.set_history_limit(1);
    let mut stream = all
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => assert_eq!(status.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}
