//! The fake kubelet, through the generated tonic client over the unix socket, as the
//! exporter talks to the real one.

use kube_sim::kubelet::{Behavior, FakeKubelet};
use kube_sim::proto::{
    AllocatableResourcesRequest, ContainerDevices, ContainerResources, GetPodResourcesRequest,
    ListPodResourcesRequest, PodResources, PodResourcesListerClient,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// The exporter's receive limit.
const CLIENT_LIMIT: usize = 16 << 20;

/// A channel to the socket at `path`; `timeout` bounds every call.
async fn channel(path: &Path, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    Endpoint::try_from("http://[::]:50051")?
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}

async fn client(path: &Path) -> PodResourcesListerClient<Channel> {
    let channel = channel(path, Duration::from_secs(10))
        .await
        .expect("connect to the fake kubelet");
    PodResourcesListerClient::new(channel).max_decoding_message_size(CLIENT_LIMIT)
}

async fn list(
    client: &mut PodResourcesListerClient<Channel>,
) -> Result<Vec<PodResources>, tonic::Status> {
    Ok(client
        .list(ListPodResourcesRequest {})
        .await?
        .into_inner()
        .pod_resources)
}

fn pod(name: &str, devices: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: "default".into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: devices.iter().map(|d| d.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Polls `condition` until it holds or `within` passes.
async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("pod-resources").join("kubelet.sock")
}

#[tokio::test]
async fn list_get_and_allocatable_answer_from_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    // A stale file where the socket goes is replaced.
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    std::fs::write(&socket, b"stale").unwrap();
    let kubelet = FakeKubelet::start(&socket).unwrap();
    assert_eq!(kubelet.socket_path(), socket);
    let pods = vec![pod("a", &["GPU-1"]), pod("b", &["GPU-2", "GPU-3"])];
    kubelet.set_pods(pods.clone());
    kubelet.set_allocatable(
        pod("x", &["GPU-1", "GPU-2", "GPU-3"]).containers[0]
            .devices
            .clone(),
    );

    let mut c = client(&socket).await;
    assert_eq!(list(&mut c).await.unwrap(), pods);
    let got = c
        .get(GetPodResourcesRequest {
            pod_name: "b".into(),
            pod_namespace: "default".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources, Some(pods[1].clone()));
    let missing = c
        .get(GetPodResourcesRequest {
            pod_name: "b".into(),
            pod_namespace: "other".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(missing.message(), "pod b not found in other");
    let alloc = c
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alloc.devices[0].device_ids, ["GPU-1", "GPU-2", "GPU-3"]);
    assert_eq!(kubelet.calls(), 4);

    // A dynamic source is evaluated per call.
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = n.clone();
    kubelet.set_pod_source(Arc::new(move || {
        let k = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        vec![pod(&format!("gen-{k}"), &[])]
    }));
    assert_eq!(list(&mut c).await.unwrap()[0].name, "gen-0");
    assert_eq!(list(&mut c).await.unwrap()[0].name, "gen-1");

    drop(kubelet);
    assert!(!socket.exists(), "drop removes the socket");
}

#[tokio::test]
async fn fail_and_rate_limited_return_their_codes() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&socket_in(&dir)).unwrap();
    let mut c = client(kubelet.socket_path()).await;
    kubelet.set_behavior(Behavior::Fail(Code::Unavailable, "kubelet is sad".into()));
    let e = list(&mut c).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::Unavailable, "kubelet is sad")
    );
    kubelet.set_behavior(Behavior::RateLimited);
    let e = c
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::ResourceExhausted, "rejected by rate limit")
    );
    kubelet.set_behavior(Behavior::Serve);
    assert!(list(&mut c).await.unwrap().is_empty());
    assert_eq!(kubelet.calls(), 3);
}

#[tokio::test]
async fn hang_times_out_under_a_client_deadline_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&socket_in(&dir)).unwrap();
    kubelet.set_pods(vec![pod("a", &["GPU-1"])]);
    kubelet.set_behavior(Behavior::Hang);

    let timeout = Duration::from_millis(300);
    let mut short =
        PodResourcesListerClient::new(channel(kubelet.socket_path(), timeout).await.unwrap());
    let started = Instant::now();
    let e = list(&mut short).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(e.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{e:?}"
    );
    assert!(took >= timeout && took < Duration::from_secs(5), "{took:?}");

    // A call waiting under Hang is answered once the behavior changes.
    let mut patient = client(kubelet.socket_path()).await;
    let calls = kubelet.calls();
    let pending = tokio::spawn(async move { list(&mut patient).await });
    assert!(eventually(Duration::from_secs(10), || kubelet.calls() > calls).await);
    assert!(!pending.is_finished());
    kubelet.set_behavior(Behavior::Serve);
    let answered = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("answered after the behavior changed")
        .unwrap()
        .unwrap();
    assert_eq!(answered[0].name, "a");
    assert_eq!(list(&mut short).await.unwrap()[0].name, "a");

    // A hung call does not keep the server from stopping.
    kubelet.set_behavior(Behavior::Hang);
    let mut hung = client(kubelet.socket_path()).await;
    let calls = kubelet.calls();
    let pending = tokio::spawn(async move { list(&mut hung).await });
    assert!(eventually(Duration::from_secs(10), || kubelet.calls() > calls).await);
    let socket = kubelet.socket_path().to_path_buf();
    drop(kubelet);
    assert!(!socket.exists());
    let broken = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the hung call ends when the server stops")
        .unwrap();
    assert!(broken.is_err());
}

#[tokio::test]
async fn garbage_fails_calls_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&socket_in(&dir)).unwrap();
    let mut before = client(kubelet.socket_path()).await;
    assert!(list(&mut before).await.is_ok());

    kubelet.set_behavior(Behavior::Garbage);
    let fresh = tokio::time::timeout(Duration::from_secs(10), async {
        match channel(kubelet.socket_path(), Duration::from_secs(5)).await {
            Err(e) => Err(e.to_string()),
            Ok(ch) => list(&mut PodResourcesListerClient::new(ch))
                .await
                .map_err(|s| format!("{s:?}")),
        }
    })
    .await
    .expect("garbage must not hang the client");
    let e = fresh.unwrap_err();
    // Raw bytes on the socket itself.
    let mut raw = UnixStream::connect(kubelet.socket_path()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut got))
        .await
        .expect("the garbage connection is closed")
        .unwrap();
    assert_eq!(got, kube_sim::kubelet::GARBAGE, "{e}");

    // A channel connected before the switch fails too: its connection was closed and
    // the reconnection meets the garbage.
    let e = tokio::time::timeout(Duration::from_secs(10), list(&mut before))
        .await
        .expect("no hang on the old channel")
        .unwrap_err();
    assert_ne!(e.code(), Code::Ok);

    kubelet.set_behavior(Behavior::Serve);
    let mut after = client(kubelet.socket_path()).await;
    assert!(list(&mut after).await.is_ok());
}

#[tokio::test]
async fn restart_breaks_connections_and_keeps_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&socket_in(&dir)).unwrap();
    let pods = vec![pod("a", &["GPU-1"])];
    kubelet.set_pods(pods.clone());
    let mut old = client(kubelet.socket_path()).await;
    assert_eq!(list(&mut old).await.unwrap(), pods);
    let connections = kubelet.connections();
    let mut raw = UnixStream::connect(kubelet.socket_path()).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || kubelet.connections()
            > connections)
        .await
    );

    kubelet.restart().unwrap();
    // The old server's connections are closed, promptly: after the server's HTTP/2
    // preface, the raw connection reaches EOF (or is reset).
    let mut preface = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut preface))
        .await
        .expect("the old connection breaks")
        .ok();

    let mut new = client(kubelet.socket_path()).await;
    assert_eq!(list(&mut new).await.unwrap(), pods);
    // The old channel reconnects (its first call may fail on the dead connection).
    let mut recovered = false;
    for _ in 0..3 {
        if list(&mut old).await.is_ok() {
            recovered = true;
            break;
        }
    }
    assert!(recovered);

    kubelet.stop().unwrap();
    assert!(!kubelet.is_serving());
    assert!(!kubelet.socket_path().exists());
    // The first call may meet the dead connection, the next one cannot reconnect.
    for _ in 0..2 {
        assert!(list(&mut old).await.is_err());
    }
    assert!(UnixStream::connect(kubelet.socket_path()).await.is_err());

    kubelet.restart().unwrap();
    let mut again = client(kubelet.socket_path()).await;
    assert_eq!(list(&mut again).await.unwrap(), pods);
}

#[tokio::test]
async fn a_ten_mebibyte_response_gets_through_a_sixteen_mebibyte_limit() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&socket_in(&dir)).unwrap();
    // 2,200 pods × 100 IDs × ~50 bytes ≈ 11 MiB.
    let id = "GPU-00000000-0000-0000-0000-000000000000::";
    let pods: Vec<PodResources> = (0..2200)
        .map(|p| {
            let ids: Vec<String> = (0..100).map(|k| format!("{id}{p}-{k}")).collect();
            pod(
                &format!("pod-{p}"),
                &ids.iter().map(String::as_str).collect::<Vec<_>>(),
            )
        })
        .collect();
    let size: usize = pods.iter().map(prost::Message::encoded_len).sum();
    assert!(size > 10 << 20 && size < CLIENT_LIMIT, "{size}");
    kubelet.set_pods(pods);

    let mut c = client(kubelet.socket_path()).await;
    let got = list(&mut c).await.unwrap();
    assert_eq!(got.len(), 2200);
    assert_eq!(
        got[2199].containers[0].devices[0].device_ids[99],
        format!("{id}2199-99")
    );

    // gRPC's default 4 MiB receive limit is not enough: the size is real.
    let ch = channel(kubelet.socket_path(), Duration::from_secs(10))
        .await
        .unwrap();
    let e = list(&mut PodResourcesListerClient::new(ch))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
}

#[tokio::test]
async fn bad_protobuf_is_a_decode_error_on_a_working_transport() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&socket_in(&dir)).unwrap();
    let mut before = client(kubelet.socket_path()).await;
    assert!(list(&mut before).await.is_ok());

    kubelet.set_behavior(Behavior::BadProtobuf);
    let mut during = client(kubelet.socket_path()).await;
    let e = tokio::time::timeout(Duration::from_secs(10), list(&mut during))
        .await
        .expect("a bad message must not hang the client")
        .unwrap_err();
    // tonic reports a message it cannot decode as INTERNAL, naming the decode error;
    // the HTTP/2 exchange and the gRPC status itself were fine.
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(e.message().contains("decode"), "{e:?}");

    kubelet.set_behavior(Behavior::Serve);
    let mut after = client(kubelet.socket_path()).await;
    assert!(list(&mut after).await.is_ok());
}
