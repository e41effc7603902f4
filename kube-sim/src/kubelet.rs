//! A fake kubelet PodResources v1 server on a unix socket.
//!
//! It is a real tonic gRPC server for `v1.PodResourcesLister`, so the exporter's
//! production client (channel, connector, message limits, deadlines) is what tests
//! exercise. Around it sit the ways a real kubelet misbehaves — error statuses, the
//! kubelet's rate limiter, calls that never answer, something on the socket that does
//! not speak HTTP/2, a gRPC answer that is not protobuf, and restarts that replace the socket — selected with
//! [`FakeKubelet::set_behavior`], [`FakeKubelet::restart`] and [`FakeKubelet::stop`].
//!
//! Connections are accepted by a loop of our own rather than tonic's, so that the
//! [`Behavior::Garbage`] check happens per connection; accepted streams are handed to
//! tonic through a channel.

use crate::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources, PodResourcesLister, PodResourcesListerServer,
};
use crate::server_thread::ServerThread;
use std::io;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

/// The largest message the fake sends or accepts. The real kubelet (grpc-go) sends up
/// to `math.MaxInt32` bytes; clients are expected to raise their 4 MiB default receive
/// limit (the exporter uses 16 MiB), and tests need responses above that to get through.
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// The bytes a [`Behavior::Garbage`] connection receives: not an HTTP/2 server preface
/// (read as a frame header, it announces a frame far larger than any client allows).
pub const GARBAGE: &[u8] = b"this is not HTTP/2, this is kube-sim's garbage\r\n\x00\xff\xfe\xfd";

/// How the fake kubelet answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Behavior {
    /// Answer every RPC from the configured state.
    #[default]
    Serve,
    /// Every RPC returns this status.
    Fail(tonic::Code, String),
    /// RPCs never answer, until the behavior changes (they are then answered by the new
    /// behavior) or the server stops (their connections are closed).
    Hang,
    /// The socket accepts connections, writes [`GARBAGE`] and closes them. Switching to
    /// this behavior also closes open connections, so that clients holding a channel
    /// reconnect and meet the garbage, as after a real process swap.
    Garbage,
    /// Every RPC returns `RESOURCE_EXHAUSTED` "rejected by rate limit", as the kubelet's
    /// limiter (100 QPS, burst 10) does.
    RateLimited,
    /// Well-formed gRPC over HTTP/2 (status OK) whose message is [`BAD_PROTOBUF`]: the
    /// transport works, the payload does not decode. Like [`Behavior::Garbage`],
    /// switching to it closes open connections, and it is decided per connection.
    BadProtobuf,
}

/// The message a [`Behavior::BadProtobuf`] answer carries: field 1 with wire type 7,
/// which no protobuf decoder accepts.
pub const BAD_PROTOBUF: &[u8] = b"\x0f\xff\xff\xff";

/// A dynamically computed pod list, evaluated on every `List` and `Get`.
pub type PodSource = Arc<dyn Fn() -> Vec<PodResources> + Send + Sync>;

/// Where `List` and `Get` take their pods from.
enum Pods {
    Fixed(Arc<Vec<PodResources>>),
    Dynamic(PodSource),
}

/// What the server answers from; shared by the handle and every serving generation, so
/// that a restart keeps it.
struct KubeletState {
    pods: RwLock<Pods>,
    allocatable: RwLock<Arc<Vec<ContainerDevices>>>,
    behavior: watch::Sender<Behavior>,
    calls: AtomicU64,
    connections: AtomicU64,
}

impl KubeletState {
    fn pods(&self) -> Vec<PodResources> {
        // Clone out of the lock first: a dynamic source may take its time.
        let source = match &*self.pods.read().unwrap_or_else(PoisonError::into_inner) {
            Pods::Fixed(pods) => return pods.as_ref().clone(),
            Pods::Dynamic(source) => source.clone(),
        };
        source()
    }

    /// Counts the call and waits for the behavior to let it through: `Ok` to serve it,
    /// `Err` with the status to return otherwise.
    async fn admit(&self) -> Result<(), Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut behavior = self.behavior.subscribe();
        loop {
            let current = behavior.borrow_and_update().clone();
            match current {
                Behavior::Serve => return Ok(()),
                Behavior::Fail(code, message) => return Err(Status::new(code, message)),
                Behavior::RateLimited => {
                    return Err(Status::resource_exhausted("rejected by rate limit"));
                }
                // Calls already on a connection when the garbage starts get no answer:
                // their connection is being closed.
                Behavior::Hang | Behavior::Garbage | Behavior::BadProtobuf => {
                    if behavior.changed().await.is_err() {
                        // The state is going away with the server: never answer.
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

/// The gRPC service: a thin view of the shared state.
struct Lister(Arc<KubeletState>);

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.0.admit().await?;
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: self.0.pods(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.0.admit().await?;
        let devices = self
            .0
            .allocatable
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(Response::new(AllocatableResourcesResponse {
            devices: devices.as_ref().clone(),
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        self.0.admit().await?;
        let GetPodResourcesRequest {
            pod_name,
            pod_namespace,
        } = request.into_inner();
        self.0
            .pods()
            .into_iter()
            .find(|p| p.name == pod_name && p.namespace == pod_namespace)
            .map(|pod| {
                Response::new(GetPodResourcesResponse {
                    pod_resources: Some(pod),
                })
            })
            .ok_or_else(|| {
                Status::not_found(format!("pod {pod_name} not found in {pod_namespace}"))
            })
    }
}

/// One bound socket and the thread serving it.
struct Serving {
    /// Dropped first (field order): stopping the generation closes its connections.
    generation: ServerThread,
    /// The listening socket itself; each generation accepts on a duplicate of it, so
    /// that open connections can be closed without refusing new ones.
    listener: StdUnixListener,
}

/// A fake kubelet PodResources server. Dropping it stops it and removes the socket.
pub struct FakeKubelet {
    socket: PathBuf,
    state: Arc<KubeletState>,
    serving: Mutex<Option<Serving>>,
}

impl FakeKubelet {
    /// Serves `v1.PodResourcesLister` on the unix socket `socket`, replacing a stale
    /// socket file there and creating its parent directories. Returns once the socket
    /// accepts connections. Pods and allocatable devices start empty.
    pub fn start(socket: &Path) -> io::Result<FakeKubelet> {
        let state = Arc::new(KubeletState {
            pods: RwLock::new(Pods::Fixed(Arc::new(Vec::new()))),
            allocatable: RwLock::new(Arc::new(Vec::new())),
            behavior: watch::Sender::new(Behavior::Serve),
            calls: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        });
        let kubelet = FakeKubelet {
            socket: socket.to_path_buf(),
            state,
            serving: Mutex::new(None),
        };
        *kubelet.serving() = Some(kubelet.bind()?);
        Ok(kubelet)
    }

    /// The socket path.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Serves these pods from now on.
    pub fn set_pods(&self, pods: Vec<PodResources>) {
        *self
            .state
            .pods
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Pods::Fixed(Arc::new(pods));
    }

    /// Serves what `source` returns, evaluated on every `List` and `Get` (e.g. pods that
    /// follow a simulated clock).
    pub fn set_pod_source(&self, source: PodSource) {
        *self
            .state
            .pods
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Pods::Dynamic(source);
    }

    /// The devices `GetAllocatableResources` reports.
    pub fn set_allocatable(&self, devices: Vec<ContainerDevices>) {
        *self
            .state
            .allocatable
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(devices);
    }

    /// Changes how RPCs are answered, including RPCs already waiting under
    /// [`Behavior::Hang`].
    pub fn set_behavior(&self, behavior: Behavior) {
        // Decided per connection: open ones must go, so that clients reconnect and meet it.
        let per_connection = matches!(behavior, Behavior::Garbage | Behavior::BadProtobuf);
        let previous = self.state.behavior.send_replace(behavior.clone());
        if per_connection && previous != behavior {
            let mut serving = self.serving();
            if let Some(current) = serving.as_mut() {
                match Self::duplicate_and_serve(&current.listener, &self.state) {
                    // Assigning drops the old generation, closing its connections.
                    Ok(generation) => current.generation = generation,
                    Err(e) => tracing::error!(error = %e, "fake kubelet: cannot renew the server"),
                }
            }
        }
    }

    /// The current behavior.
    pub fn behavior(&self) -> Behavior {
        self.state.behavior.borrow().clone()
    }

    /// RPCs received so far (whatever they were answered), across restarts.
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::Relaxed)
    }

    /// Connections accepted so far, across restarts: a client that reconnects shows up
    /// here.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Whether the socket is being served (not [`stop`](Self::stop)ped).
    pub fn is_serving(&self) -> bool {
        self.serving().is_some()
    }

    /// Simulates a kubelet restart: stops serving (open connections break), removes the
    /// socket file, then creates a new socket at the same path and serves it with the
    /// same pods, devices and behavior. Also starts a [`stop`](Self::stop)ped server.
    pub fn restart(&self) -> io::Result<()> {
        let mut serving = self.serving();
        if let Some(old) = serving.take() {
            drop(old);
            remove_socket(&self.socket)?;
        }
        *serving = Some(self.bind()?);
        Ok(())
    }

    /// Stops serving and removes the socket; open connections break and new ones are
    /// refused until [`restart`](Self::restart).
    pub fn stop(&self) -> io::Result<()> {
        let old = self.serving().take();
        if let Some(old) = old {
            drop(old);
            remove_socket(&self.socket)?;
        }
        Ok(())
    }

    fn serving(&self) -> MutexGuard<'_, Option<Serving>> {
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Binds a fresh socket at the path and serves it.
    fn bind(&self) -> io::Result<Serving> {
        if let Some(parent) = self.socket.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)?;
        }
        remove_socket(&self.socket)?;
        // Bound and listening before we return: connections queue in the backlog until
        // the serving thread accepts them.
        let listener = StdUnixListener::bind(&self.socket)?;
        listener.set_nonblocking(true)?;
        let generation = Self::duplicate_and_serve(&listener, &self.state)?;
        Ok(Serving {
            generation,
            listener,
        })
    }

    fn duplicate_and_serve(
        listener: &StdUnixListener,
        state: &Arc<KubeletState>,
    ) -> io::Result<ServerThread> {
        let listener = listener.try_clone()?;
        let state = state.clone();
        ServerThread::spawn("fake-kubelet", move || serve(listener, state))
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!(socket = %self.socket.display(), error = %e, "fake kubelet: cannot remove the socket");
        }
    }
}

impl std::fmt::Debug for FakeKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeKubelet")
            .field("socket", &self.socket)
            .field("behavior", &self.behavior())
            .field("serving", &self.is_serving())
            .finish_non_exhaustive()
    }
}

fn remove_socket(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Accepts connections until the generation is dropped, handing each to tonic or, under
/// [`Behavior::Garbage`], answering it with garbage.
async fn serve(listener: StdUnixListener, state: Arc<KubeletState>) {
    let listener = match UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "fake kubelet: cannot use the socket");
            return;
        }
    };
    let (to_tonic, incoming) = mpsc::channel::<io::Result<UnixStream>>(16);
    let service = PodResourcesListerServer::new(Lister(state.clone()))
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let grpc = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(incoming));
    tokio::spawn(async move {
        if let Err(e) = grpc.await {
            tracing::error!(error = %e, "fake kubelet: the gRPC server failed");
        }
    });
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // E.g. out of file descriptors: back off rather than spin.
                tracing::warn!(error = %e, "fake kubelet: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        state.connections.fetch_add(1, Ordering::Relaxed);
        let behavior = state.behavior.borrow().clone();
        if behavior == Behavior::Garbage {
            tokio::spawn(answer_with_garbage(stream));
        } else if behavior == Behavior::BadProtobuf {
            tokio::spawn(answer_with_bad_protobuf(stream));
        } else if to_tonic.send(Ok(stream)).await.is_err() {
            tracing::error!("fake kubelet: the gRPC server is gone");
            return;
        }
    }
}

/// Serves HTTP/2 on the connection, answering every request as a successful gRPC call
/// whose one message is [`BAD_PROTOBUF`].
async fn answer_with_bad_protobuf(stream: UnixStream) {
    use http_body_util::StreamBody;
    use hyper::body::{Bytes, Frame};
    let service = hyper::service::service_fn(|_request| async {
        let mut message = vec![0u8];
        message.extend_from_slice(&(BAD_PROTOBUF.len() as u32).to_be_bytes());
        message.extend_from_slice(BAD_PROTOBUF);
        let mut trailers = hyper::HeaderMap::new();
        trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
        let frames = [
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(message))),
            Ok(Frame::trailers(trailers)),
        ];
        let mut response =
            hyper::Response::new(StreamBody::new(futures_util::stream::iter(frames)));
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/grpc"),
        );
        Ok::<_, std::convert::Infallible>(response)
    });
    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

/// Writes [`GARBAGE`], closes the write side, then drains what the client sent for a
/// moment so that the close is orderly (a close with unread data would reset the
/// connection before the client reads the garbage).
async fn answer_with_garbage(mut stream: UnixStream) {
    if stream.write_all(GARBAGE).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}
