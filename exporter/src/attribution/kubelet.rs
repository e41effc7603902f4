//! The kubelet PodResources v1 client and its background refresh.
//!
//! dcgm-exporter opens a new gRPC connection on every scrape with gRPC's default 4 MiB
//! receive limit, so busy nodes fail scrapes (#509) and idle ones pay a connection per
//! scrape. Here one channel lives as long as the kubelet does, messages up to 16 MiB are
//! accepted, every call is bounded by a timeout, and the list is refreshed on a timer in
//! the background: a scrape never waits on the kubelet.
//!
//! Each refresh publishes a [`KubeletView`]: the parsed allocations and the health of
//! the connection. When the kubelet is missing, restarting, slow or answers garbage, the
//! last good allocations are dropped (pod labels must not outlive the truth), the view
//! says why, and the failure is logged once per outage. While it lasts, every refresh
//! first probes the socket with a bare `connect()` (bounded by [`PROBE_TIMEOUT`]); only
//! a socket that accepts gets a fresh channel and a `List`. So the labels are back
//! within two refreshes of the kubelet, and an outage costs one `connect()` per
//! refresh, not a growing backoff.

use super::device_id::{DeviceId, DeviceIdError, ResourceKind, is_gpu_resource};
use arc_swap::ArcSwap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The PodResources v1 types and client.
pub use kube_support::proto::podresources as proto;

/// Largest PodResources answer accepted (kubelet e2e's `defaultPodResourcesMaxSize`).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Longest wait for the socket to accept a probe's connection while the kubelet is down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The DRA driver name of NVIDIA's GPU driver.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// Where a container's GPU came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AllocatedDevice {
    /// A device-plugin device ID.
    Plugin(DeviceId),
    /// A DRA claim's device from NVIDIA's DRA driver.
    Dra(DraDevice),
}

/// A DRA-allocated device as the kubelet reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DraDevice {
    pub claim_name: String,
    pub claim_namespace: String,
    pub pool: String,
    /// The driver's device name, e.g. `gpu-0`.
    pub device: String,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

/// One GPU device held by one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Allocation {
    pub namespace: Arc<str>,
    pub pod: Arc<str>,
    pub container: Arc<str>,
    pub resource: Arc<str>,
    /// The resource is a shared one (`nvidia.com/gpu.shared`, `…mig-….shared`).
    pub shared_resource: bool,
    pub device: AllocatedDevice,
}

/// A device ID under a GPU resource that matches no known form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnparsedId {
    pub resource: String,
    pub error: DeviceIdError,
}

/// The latest word from the kubelet.
#[derive(Debug, Clone, Default)]
pub struct KubeletView {
    /// Changes whenever `allocations` changes.
    pub generation: u64,
    /// GPU allocations, sorted, from the last successful list; empty while down.
    pub allocations: Vec<Allocation>,
    pub unparsed: Vec<UnparsedId>,
    /// The last list succeeded.
    pub up: bool,
    /// Why the last attempt failed.
    pub last_error: Option<KubeletError>,
    pub last_success: Option<SystemTime>,
    /// When the list `allocations` come from was asked for; None while down. A pod it
    /// does not name had left the kubelet's list by then.
    pub listed_at: Option<Instant>,
    pub lists_total: u64,
    pub failures_total: u64,
    pub last_list_duration: Duration,
}

/// Turn a `List` answer into sorted GPU allocations.
pub fn allocations(
    resp: &proto::ListPodResourcesResponse,
    extra_resources: &[String],
) -> (Vec<Allocation>, Vec<UnparsedId>) {
    let mut out = Vec::new();
    let mut unparsed = Vec::new();
    for pod in &resp.pod_resources {
        let namespace: Arc<str> = pod.namespace.as_str().into();
        let pod_name: Arc<str> = pod.name.as_str().into();
        for c in &pod.containers {
            let container: Arc<str> = c.name.as_str().into();
            for d in &c.devices {
                let Some(kind) = is_gpu_resource(&d.resource_name, extra_resources) else {
                    continue;
                };
                let shared_resource = matches!(
                    kind,
                    ResourceKind::Gpu { shared: true } | ResourceKind::Mig { shared: true, .. }
                );
                let resource: Arc<str> = d.resource_name.as_str().into();
                for id in &d.device_ids {
                    match id.parse::<DeviceId>() {
                        Ok(parsed) => out.push(Allocation {
                            namespace: namespace.clone(),
                            pod: pod_name.clone(),
                            container: container.clone(),
                            resource: resource.clone(),
                            shared_resource,
                            device: AllocatedDevice::Plugin(parsed),
                        }),
                        Err(error) => unparsed.push(UnparsedId {
                            resource: d.resource_name.clone(),
                            error,
                        }),
                    }
                }
            }
            for claim in &c.dynamic_resources {
                for r in &claim.claim_resources {
                    if r.driver_name != NVIDIA_DRA_DRIVER {
                        continue;
                    }
                    out.push(Allocation {
                        namespace: namespace.clone(),
                        pod: pod_name.clone(),
                        container: container.clone(),
                        resource: format!("{}/{}", claim.claim_namespace, claim.claim_name).into(),
                        // A claim may be shared by several pods; whether it is follows
                        // from how many containers hold the device.
                        shared_resource: r.share_id.is_some(),
                        device: AllocatedDevice::Dra(DraDevice {
                            claim_name: claim.claim_name.clone(),
                            claim_namespace: claim.claim_namespace.clone(),
                            pool: r.pool_name.clone(),
                            device: r.device_name.clone(),
                            cdi_devices: r.cdi_devices.iter().map(|d| d.name.clone()).collect(),
                        }),
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container, &a.resource)
            .cmp(&(&b.namespace, &b.pod, &b.container, &b.resource))
            .then_with(|| format!("{:?}", a.device).cmp(&format!("{:?}", b.device)))
    });
    out.dedup();
    (out, unparsed)
}

/// How the refresher reaches the kubelet.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    pub socket: PathBuf,
    pub interval: Duration,
    /// Bound on one `List` call.
    pub timeout: Duration,
    /// Resource names besides NVIDIA's (`--nvidia-resource-names`).
    pub extra_resources: Vec<String>,
}

type Client =
    proto::pod_resources_lister_client::PodResourcesListerClient<tonic::transport::Channel>;

/// A channel to the kubelet's unix socket. It connects on first use and reconnects by
/// itself after the kubelet restarts; it is replaced only after a failed call.
fn connect(socket: &Path) -> Result<Client, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    // The URI is required by the API but unused: the connector dials the socket.
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.sock")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }));
    Ok(Client::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// One `List` call, bounded by `timeout`.
pub async fn list_once(
    client: &mut Client,
    timeout: Duration,
) -> Result<proto::ListPodResourcesResponse, KubeletError> {
    match tokio::time::timeout(
        timeout,
        client.list(proto::ListPodResourcesRequest::default()),
    )
    .await
    {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(KubeletError::Status {
            code: status.code(),
            message: status.message().chars().take(MAX_ERROR_CHARS).collect(),
        }),
        Err(_) => Err(KubeletError::NoAnswer(timeout)),
    }
}

/// Refresh `store` from the kubelet forever (until the runtime stops).
pub async fn refresh(opts: KubeletOptions, store: Arc<ArcSwap<KubeletView>>) {
    let mut client = match connect(&opts.socket) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "cannot set up the kubelet channel");
            None
        }
    };
    let mut view = KubeletView::default();
    let mut down_logged = false;
    loop {
        let started = Instant::now();
        let result = if down_logged {
            match probe(&opts.socket, PROBE_TIMEOUT.min(opts.timeout)).await {
                // A fresh channel, in case the old one is wedged on a dead connection.
                Ok(()) => match connect(&opts.socket) {
                    Ok(c) => list_once(client.insert(c), opts.timeout).await,
                    Err(e) => Err(KubeletError::Channel(Arc::new(e))),
                },
                Err(e) => Err(e),
            }
        } else {
            match client.as_mut() {
                Some(c) => list_once(c, opts.timeout).await,
                None => Err(KubeletError::NoChannel),
            }
        };
        view.lists_total += 1;
        view.last_list_duration = started.elapsed();
        match result {
            Ok(resp) => {
                let (allocs, unparsed) = allocations(&resp, &opts.extra_resources);
                for u in unparsed.iter().filter(|u| !view.unparsed.contains(u)) {
                    tracing::warn!(resource = %u.resource, error = %u.error, "kubelet device ID not understood; its pod gets no GPU labels");
                }
                if allocs != view.allocations || !view.up {
                    view.generation += 1;
                }
                view.allocations = allocs;
                view.unparsed = unparsed;
                if down_logged {
                    tracing::info!(socket = %opts.socket.display(), "kubelet PodResources answers again");
                    down_logged = false;
                }
                view.up = true;
                view.last_error = None;
                view.last_success = Some(SystemTime::now());
                view.listed_at = Some(started);
            }
            Err(e) => {
                view.failures_total += 1;
                if !down_logged {
                    tracing::warn!(socket = %opts.socket.display(), error = %e, "kubelet PodResources is not answering; GPU metrics go on without pod labels, probing the socket every refresh");
                    down_logged = true;
                }
                if view.up || !view.allocations.is_empty() {
                    view.generation += 1;
                }
                view.up = false;
                view.allocations.clear();
                view.listed_at = None;
                view.last_error = Some(e);
            }
        }
        store.store(Arc::new(view.clone()));
        tokio::time::sleep(opts.interval.saturating_sub(started.elapsed())).await;
    }
}

/// Whether the kubelet's socket accepts a connection within `timeout`: the cheap check
/// made on every refresh while the kubelet is down.
async fn probe(socket: &Path, timeout: Duration) -> Result<(), KubeletError> {
    match tokio::time::timeout(timeout, tokio::net::UnixStream::connect(socket)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(KubeletError::Connect {
            socket: socket.to_path_buf(),
            source: Arc::new(e),
        }),
        Err(_) => Err(KubeletError::NoConnection {
            socket: socket.to_path_buf(),
            timeout,
        }),
    }
}

/// A kubelet status message is kept to this many characters: it is logged.
const MAX_ERROR_CHARS: usize = 256;

/// Why a PodResources `List` failed. Cloned into every published view, so its sources
/// are shared.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KubeletError {
    #[error("{code:?}: {}", if message.is_empty() { "(no message)" } else { message })]
    Status { code: tonic::Code, message: String },
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    #[error("cannot set up the kubelet channel: {0}")]
    Channel(Arc<tonic::transport::Error>),
    #[error("no channel")]
    NoChannel,
    #[error("cannot connect to {}: {source}", socket.display())]
    Connect {
        socket: std::path::PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("{} accepted no connection within {timeout:?}", socket.display())]
    NoConnection {
        socket: std::path::PathBuf,
        timeout: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::*;

    fn container(name: &str, resource: &str, ids: &[&str]) -> ContainerResources {
        ContainerResources {
            name: name.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn only_gpu_resources_are_kept_and_bad_ids_are_reported() {
        let resp = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![
                    container("a", "nvidia.com/gpu", &["0", "bogus id"]),
                    container("b", "example.com/fpga", &["fpga0"]),
                    container(
                        "c",
                        "nvidia.com/gpu.shared",
                        &["GPU-00000000-0000-0000-0000-000000000001::2"],
                    ),
                    container("d", "acme.io/gpu", &["1"]),
                ],
                ..Default::default()
            }],
        };
        let (allocs, unparsed) = allocations(&resp, &["acme.io/gpu".to_string()]);
        let names: Vec<(&str, bool)> = allocs
            .iter()
            .map(|a| (&*a.container, a.shared_resource))
            .collect();
        assert_eq!(names, vec![("a", false), ("c", true), ("d", false)]);
        assert_eq!(unparsed.len(), 1);
        assert_eq!(unparsed[0].resource, "nvidia.com/gpu");
    }

    #[test]
    fn dra_claims_of_the_nvidia_driver_are_kept() {
        let resp = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    dynamic_resources: vec![DynamicResource {
                        claim_name: "gpu-claim".into(),
                        claim_namespace: "ns".into(),
                        claim_resources: vec![
                            ClaimResource {
                                driver_name: NVIDIA_DRA_DRIVER.into(),
                                pool_name: "node-a".into(),
                                device_name: "gpu-1".into(),
                                ..Default::default()
                            },
                            ClaimResource {
                                driver_name: "other.example.com".into(),
                                device_name: "x".into(),
                                ..Default::default()
                            },
                        ],
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let (allocs, _) = allocations(&resp, &[]);
        assert_eq!(allocs.len(), 1);
        assert!(matches!(&allocs[0].device, AllocatedDevice::Dra(d) if d.device == "gpu-1"));
    }
}
