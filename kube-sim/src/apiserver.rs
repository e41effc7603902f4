//! A minimal fake kube-apiserver: the pod list and watch endpoints, over plain HTTP.
//!
//! The exporter learns pod UIDs, labels and annotations from a node-scoped,
//! metadata-only pod watch (`kube-rs`'s `metadata_watcher`). This server implements the
//! parts of the API server that watch depends on, with the API server's semantics, so
//! that the real client is what tests exercise:
//!
//! - `GET /api/v1/pods` and `GET /api/v1/namespaces/{ns}/pods` list and, with
//!   `watch=true`, stream newline-delimited watch events; `…/pods/{name}` gets one pod;
//! - `fieldSelector` over `metadata.name`, `metadata.namespace`, `spec.nodeName` and
//!   `status.phase`, and `labelSelector`; a watch sends `DELETED` when an object stops
//!   matching (a pod that finishes under `status.phase!=Succeeded`) and `ADDED` when it
//!   starts to, as the API server's watch cache does;
//! - `Accept: …;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1` gives metadata-only
//!   objects, anything else full `v1` pods;
//! - one global, integer `resourceVersion`; watches resume from any version still in a
//!   bounded history and get a `410 Gone` (`Expired`) error event for older ones;
//! - `allowWatchBookmarks`, `timeoutSeconds`, `sendInitialEvents` (streaming lists);
//! - bearer-token authentication (401 otherwise) and simulated outages (503, and open
//!   watches are closed); every error body is a `meta/v1` `Status`.
//!
//! Paging is not implemented: `limit` is accepted and everything is returned at once,
//! without a `continue` token (which clients must accept). Lists are always served at
//! the current version, whatever `resourceVersion` and `resourceVersionMatch` say.

use crate::selector::{FieldSelector, Fields, LabelSelector, PodField, SelectorError};
use crate::server_thread::ServerThread;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Status};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How many changes the server remembers for watches to resume from, by default.
pub const DEFAULT_HISTORY_LIMIT: usize = 1000;

/// How often a watch with `allowWatchBookmarks=true` gets a bookmark, by default. (The
/// real API server sends one about every minute; tests want them sooner.)
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// How long a watch without `timeoutSeconds` lasts (the API server's
/// `--min-request-timeout` default).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// How many request lines [`FakeApiServer::requests`] keeps (the oldest go first), so
/// that a long-running demo does not grow without bound.
pub const REQUEST_LOG_LIMIT: usize = 10_000;

/// The annotation on the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// What the fake knows about a pod: the fields the exporter reads and the ones its
/// selectors filter on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `spec.nodeName`; empty for an unscheduled pod.
    pub node_name: String,
    /// `status.phase`: `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: String,
    /// The controlling owner, (kind, name), e.g. a Deployment's ReplicaSet.
    pub owner: Option<(String, String)>,
}

impl PodMeta {
    /// A `Running` pod without labels or annotations.
    pub fn running(namespace: &str, name: &str, uid: &str, node_name: &str) -> PodMeta {
        PodMeta {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            node_name: node_name.to_string(),
            phase: "Running".to_string(),
            ..PodMeta::default()
        }
    }

    fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }
}

impl Fields for PodMeta {
    fn field(&self, field: PodField) -> &str {
        match field {
            PodField::Name => &self.name,
            PodField::Namespace => &self.namespace,
            PodField::NodeName => &self.node_name,
            PodField::Phase => &self.phase,
        }
    }
}

/// One recorded change: the object before and after (`None`: absent), at version `rv`.
struct Change {
    rv: u64,
    prev: Option<PodMeta>,
    cur: Option<PodMeta>,
}

/// The pods, the global resource version and the change history.
struct Store {
    /// (namespace, name) → (pod, version of its last change).
    pods: BTreeMap<(String, String), (PodMeta, u64)>,
    version: u64,
    history: VecDeque<Change>,
    history_limit: usize,
    /// Changes up to this version have left the history: a watch from an older version
    /// gets 410 Gone.
    compacted: u64,
}

impl Store {
    fn record(&mut self, prev: Option<PodMeta>, cur: Option<PodMeta>) -> u64 {
        self.version += 1;
        self.history.push_back(Change {
            rv: self.version,
            prev,
            cur,
        });
        self.trim();
        self.version
    }

    fn trim(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.rv;
            }
        }
    }
}

/// Everything the handlers and the handle share.
struct ApiState {
    store: Mutex<Store>,
    /// The current resource version; watches wait on its changes.
    version: watch::Sender<u64>,
    available: watch::Sender<bool>,
    token: String,
    requests: Mutex<VecDeque<String>>,
    bookmark_interval: Mutex<Duration>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ApiState {
    /// Replaces the pod at `key` with what `update` makes of it (`None`: absent), in one
    /// step. Identical content is not a change: the API server does not bump versions
    /// for no-op updates. Returns whether the pod existed before.
    fn change(
        &self,
        key: (String, String),
        update: impl FnOnce(Option<&PodMeta>) -> Option<PodMeta>,
    ) -> bool {
        let mut store = lock(&self.store);
        let prev = store.pods.get(&key).map(|(pod, _)| pod.clone());
        let cur = update(prev.as_ref());
        let existed = prev.is_some();
        if prev == cur {
            return existed;
        }
        let rv = store.record(prev, cur.clone());
        match cur {
            Some(pod) => store.pods.insert(key, (pod, rv)),
            None => store.pods.remove(&key),
        };
        // While the store is locked, so that watchers see versions in order.
        self.version.send_replace(rv);
        existed
    }
}

/// A fake kube-apiserver for pods on `127.0.0.1`. Dropping it stops it.
pub struct FakeApiServer {
    state: Arc<ApiState>,
    addr: SocketAddr,
    _thread: ServerThread,
}

impl FakeApiServer {
    /// Serves on `127.0.0.1` on a free port, with no pods; returns once the port
    /// accepts connections.
    pub fn start() -> io::Result<FakeApiServer> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ApiState {
            store: Mutex::new(Store {
                pods: BTreeMap::new(),
                version: 1,
                history: VecDeque::new(),
                history_limit: DEFAULT_HISTORY_LIMIT,
                compacted: 1,
            }),
            version: watch::Sender::new(1),
            available: watch::Sender::new(true),
            token: random_token(),
            requests: Mutex::new(VecDeque::new()),
            bookmark_interval: Mutex::new(DEFAULT_BOOKMARK_INTERVAL),
        });
        let shared = state.clone();
        let thread = ServerThread::spawn("fake-apiserver", move || async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "fake API server: cannot use the port");
                    return;
                }
            };
            if let Err(e) = axum::serve(listener, router(shared)).await {
                tracing::error!(error = %e, "fake API server failed");
            }
        })?;
        Ok(FakeApiServer {
            state,
            addr,
            _thread: thread,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bearer token every request must carry.
    pub fn token(&self) -> &str {
        &self.state.token
    }

    /// Writes a kubeconfig (server = [`url`](Self::url), a user with the token, a
    /// current context) that `kube::Config` accepts, creating parent directories.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, kubeconfig(&self.url(), self.token()))
    }

    /// Adds `pod`, or replaces the pod with its namespace and name.
    pub fn apply(&self, pod: PodMeta) {
        self.state.change(pod.key(), |_| Some(pod));
    }

    /// Sets a pod's `status.phase`; false if there is no such pod.
    pub fn set_phase(&self, namespace: &str, name: &str, phase: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        self.state.change(key, |prev| {
            prev.map(|pod| PodMeta {
                phase: phase.to_string(),
                ..pod.clone()
            })
        })
    }

    /// Deletes a pod; false if there was no such pod.
    pub fn delete(&self, namespace: &str, name: &str) -> bool {
        self.state
            .change((namespace.to_string(), name.to_string()), |_| None)
    }

    /// The pods, in (namespace, name) order.
    pub fn pods(&self) -> Vec<PodMeta> {
        lock(&self.state.store)
            .pods
            .values()
            .map(|(pod, _)| pod.clone())
            .collect()
    }

    /// The current global resource version.
    pub fn resource_version(&self) -> String {
        lock(&self.state.store).version.to_string()
    }

    /// `false`: every request gets 503 and open watches are closed, as when the API
    /// server (or the path to it) is down. `true`: serve again.
    pub fn set_available(&self, available: bool) {
        self.state.available.send_replace(available);
    }

    /// Whether the server is answering (see [`set_available`](Self::set_available)).
    pub fn is_available(&self) -> bool {
        *self.state.available.borrow()
    }

    /// Request lines received so far (`GET /api/v1/pods?…`), including rejected ones;
    /// the last [`REQUEST_LOG_LIMIT`].
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state.requests).iter().cloned().collect()
    }

    /// How many changes are kept for watches to resume from; older versions get 410.
    pub fn set_history_limit(&self, limit: usize) {
        let mut store = lock(&self.state.store);
        store.history_limit = limit;
        store.trim();
    }

    /// How often watches that allow bookmarks get one (for watches started later; at
    /// least every millisecond).
    pub fn set_bookmark_interval(&self, interval: Duration) {
        *lock(&self.state.bookmark_interval) = interval.max(Duration::from_millis(1));
    }
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("url", &self.url())
            .field("available", &self.is_available())
            .finish_non_exhaustive()
    }
}

/// A token nobody can guess by accident, so a test that forgets authentication fails.
fn random_token() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("kube-sim-{:016x}", hasher.finish())
}

fn kubeconfig(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-sim
  cluster:
    server: \"{server}\"
users:
- name: kube-sim
  user:
    token: \"{token}\"
contexts:
- name: kube-sim
  context:
    cluster: kube-sim
    user: kube-sim
    namespace: default
current-context: kube-sim
"
    )
}

fn router(state: Arc<ApiState>) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/pods", get(list_all))
        .route("/api/v1/namespaces/{namespace}/pods", get(list_namespace))
        .route("/api/v1/namespaces/{namespace}/pods/{name}", get(get_pod))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// A request the server refuses, answered with a `meta/v1` `Status`.
#[derive(Debug)]
struct ApiError {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    fn status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code.as_u16())),
            message: Some(self.message.clone()),
            reason: Some(self.reason.to_string()),
            status: Some("Failure".to_string()),
            ..Status::default()
        }
    }
}

impl From<SelectorError> for ApiError {
    fn from(e: SelectorError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.status()).unwrap_or_else(|e| {
            tracing::error!(error = %e, "fake API server: cannot encode a Status");
            br#"{"kind":"Status","apiVersion":"v1","status":"Failure"}"#.to_vec()
        });
        (
            self.code,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// Logs the request, then refuses it while unavailable or unauthenticated.
async fn guard(State(api): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let target = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path().to_string(), |pq| pq.to_string());
    {
        let mut log = lock(&api.requests);
        if log.len() >= REQUEST_LOG_LIMIT {
            log.pop_front();
        }
        log.push_back(format!("{} {target}", request.method()));
    }
    if !*api.available.borrow() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
        .into_response();
    }
    let authorized = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| token.trim() == api.token);
    if !authorized {
        return ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
            .into_response();
    }
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

/// The list and watch query parameters the fake looks at (others are ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    watch: Option<String>,
    field_selector: Option<String>,
    label_selector: Option<String>,
    resource_version: Option<String>,
    timeout_seconds: Option<u64>,
    allow_watch_bookmarks: Option<String>,
    send_initial_events: Option<String>,
}

/// Go's `strconv.ParseBool`, which the API server uses for query flags.
fn flag(name: &str, value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "invalid boolean value {other:?} for {name}"
        ))),
    }
}

/// Metadata-only objects or full pods, from the `Accept` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Full,
    Metadata,
}

impl Shape {
    fn from_headers(headers: &HeaderMap) -> Shape {
        let metadata = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("as=PartialObjectMetadata"));
        if metadata {
            Shape::Metadata
        } else {
            Shape::Full
        }
    }

    fn type_meta(self) -> (&'static str, &'static str) {
        match self {
            Shape::Full => ("v1", "Pod"),
            Shape::Metadata => ("meta.k8s.io/v1", "PartialObjectMetadata"),
        }
    }
}

/// Which pods a request is about.
struct Filter {
    namespace: Option<String>,
    fields: FieldSelector,
    labels: LabelSelector,
}

impl Filter {
    fn matches(&self, pod: &PodMeta) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|ns| *ns == pod.namespace)
            && self.fields.matches(pod)
            && self.labels.matches(&pod.labels)
    }

    /// The watch event a change is to a watcher with this filter, as the API server's
    /// watch cache decides it: an object that starts matching is `ADDED`, one that stops
    /// matching is `DELETED` (with its previous content at the change's version).
    fn event<'a>(&self, change: &'a Change) -> Option<(&'static str, &'a PodMeta)> {
        let cur = change.cur.as_ref().filter(|p| self.matches(p));
        let prev = change.prev.as_ref().filter(|p| self.matches(p));
        match (prev, cur) {
            (None, Some(cur)) => Some(("ADDED", cur)),
            (Some(_), Some(cur)) => Some(("MODIFIED", cur)),
            (Some(prev), None) => Some(("DELETED", prev)),
            (None, None) => None,
        }
    }
}

/// `metadata` of a pod as the API server returns it.
fn object_meta(pod: &PodMeta, rv: u64) -> ObjectMeta {
    let non_empty = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
    ObjectMeta {
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        resource_version: Some(rv.to_string()),
        labels: non_empty(&pod.labels),
        annotations: non_empty(&pod.annotations),
        owner_references: pod.owner.as_ref().map(|(kind, name)| {
            vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: if kind == "Job" { "batch/v1" } else { "apps/v1" }.into(),
                    kind: kind.clone(),
                    name: name.clone(),
                    uid: format!("owner-{name}"),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                },
            ]
        }),
        ..ObjectMeta::default()
    }
}

/// A `meta.k8s.io/v1` `PartialObjectMetadata`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartialObjectMetadata {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta,
}

/// A `meta.k8s.io/v1` `PartialObjectMetadataList`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartialObjectMetadataList {
    api_version: &'static str,
    kind: &'static str,
    metadata: ListMeta,
    items: Vec<PartialObjectMetadata>,
}

fn full_pod(pod: &PodMeta, rv: u64) -> Pod {
    Pod {
        metadata: object_meta(pod, rv),
        spec: Some(PodSpec {
            node_name: (!pod.node_name.is_empty()).then(|| pod.node_name.clone()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(pod.phase.clone()),
            ..PodStatus::default()
        }),
    }
}

fn partial(pod: &PodMeta, rv: u64) -> PartialObjectMetadata {
    let (api_version, kind) = Shape::Metadata.type_meta();
    PartialObjectMetadata {
        api_version,
        kind,
        metadata: object_meta(pod, rv),
    }
}

fn render(pod: &PodMeta, rv: u64, shape: Shape) -> Result<serde_json::Value, serde_json::Error> {
    match shape {
        Shape::Full => serde_json::to_value(full_pod(pod, rv)),
        Shape::Metadata => serde_json::to_value(partial(pod, rv)),
    }
}

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn list_all(
    State(api): State<Arc<ApiState>>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    list_or_watch(api, None, &headers, query)
}

async fn list_namespace(
    State(api): State<Arc<ApiState>>,
    UrlPath(namespace): UrlPath<String>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    list_or_watch(api, Some(namespace), &headers, query)
}

async fn get_pod(
    State(api): State<Arc<ApiState>>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let shape = Shape::from_headers(&headers);
    let store = lock(&api.store);
    let (pod, rv) = store.pods.get(&(namespace, name.clone())).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{name}\" not found"),
        )
    })?;
    let body = match shape {
        Shape::Full => serde_json::to_vec(&full_pod(pod, *rv)),
        Shape::Metadata => serde_json::to_vec(&partial(pod, *rv)),
    }
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(json_response(body))
}

fn list_or_watch(
    api: Arc<ApiState>,
    namespace: Option<String>,
    headers: &HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let filter = Filter {
        namespace,
        fields: FieldSelector::parse(query.field_selector.as_deref().unwrap_or(""))?,
        labels: LabelSelector::parse(query.label_selector.as_deref().unwrap_or(""))?,
    };
    let shape = Shape::from_headers(headers);
    if flag("watch", query.watch.as_deref())? {
        let start =
            match query.resource_version.as_deref() {
                None | Some("" | "0") => None,
                Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version {rv:?}"))
                })?),
            };
        let request = WatchRequest {
            filter,
            shape,
            start,
            bookmarks: flag(
                "allowWatchBookmarks",
                query.allow_watch_bookmarks.as_deref(),
            )?,
            initial_events: flag("sendInitialEvents", query.send_initial_events.as_deref())?,
            timeout: query
                .timeout_seconds
                .filter(|&s| s > 0)
                .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs),
        };
        return Ok(watch_response(api, request));
    }
    let store = lock(&api.store);
    let matching = store.pods.values().filter(|(pod, _)| filter.matches(pod));
    let metadata = ListMeta {
        resource_version: Some(store.version.to_string()),
        ..ListMeta::default()
    };
    let body = match shape {
        Shape::Full => serde_json::to_vec(&k8s_openapi::List::<Pod> {
            items: matching.map(|(pod, rv)| full_pod(pod, *rv)).collect(),
            metadata,
        }),
        Shape::Metadata => serde_json::to_vec(&PartialObjectMetadataList {
            api_version: "meta.k8s.io/v1",
            kind: "PartialObjectMetadataList",
            metadata,
            items: matching.map(|(pod, rv)| partial(pod, *rv)).collect(),
        }),
    }
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(json_response(body))
}

/// A parsed watch request.
struct WatchRequest {
    filter: Filter,
    shape: Shape,
    /// Resume after this version; `None`: start with the current objects as `ADDED`.
    start: Option<u64>,
    bookmarks: bool,
    initial_events: bool,
    timeout: Duration,
}

/// Streams the watch from a task of its own; the stream ends when the client goes
/// away, the timeout passes or the server becomes unavailable.
fn watch_response(api: Arc<ApiState>, request: WatchRequest) -> Response {
    let (lines, body) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        if let Err(e) = stream_watch(&api, &request, &lines).await {
            tracing::debug!(error = %e, "fake API server: watch ended");
        }
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(body)),
    )
        .into_response()
}

/// Why a watch stream ended early.
#[derive(Debug, thiserror::Error)]
enum WatchEnd {
    #[error("the client went away")]
    Gone,
    #[error("cannot encode an event: {0}")]
    Encode(#[from] serde_json::Error),
}

/// One watch event line: `{"type":…,"object":…}` and a newline.
fn event_line(kind: &str, object: serde_json::Value) -> Result<Bytes, serde_json::Error> {
    let mut line = serde_json::to_vec(&serde_json::json!({ "type": kind, "object": object }))?;
    line.push(b'\n');
    Ok(Bytes::from(line))
}

fn bookmark_line(
    shape: Shape,
    rv: u64,
    initial_events_end: bool,
) -> Result<Bytes, serde_json::Error> {
    let (api_version, kind) = shape.type_meta();
    let mut metadata = serde_json::json!({ "resourceVersion": rv.to_string() });
    if initial_events_end {
        metadata["annotations"] = serde_json::json!({ INITIAL_EVENTS_END: "true" });
    }
    event_line(
        "BOOKMARK",
        serde_json::json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata }),
    )
}

fn gone_line(requested: u64, compacted: u64) -> Result<Bytes, serde_json::Error> {
    let status = ApiError::new(
        StatusCode::GONE,
        "Expired",
        format!("too old resource version: {requested} ({compacted})"),
    )
    .status();
    event_line("ERROR", serde_json::to_value(status)?)
}

/// The lines for every change after `after` that this watcher sees, or the 410 line if
/// the history no longer reaches back that far. Returns the version they bring it to.
fn lines_since(
    store: &Store,
    after: u64,
    request: &WatchRequest,
) -> Result<(Vec<Bytes>, u64, bool), serde_json::Error> {
    if after < store.compacted {
        return Ok((vec![gone_line(after, store.compacted)?], after, true));
    }
    let mut lines = Vec::new();
    for change in store.history.iter().filter(|c| c.rv > after) {
        if let Some((kind, pod)) = request.filter.event(change) {
            lines.push(event_line(kind, render(pod, change.rv, request.shape)?)?);
        }
    }
    Ok((lines, store.version.max(after), false))
}

async fn send_all(
    out: &mpsc::Sender<Result<Bytes, Infallible>>,
    lines: Vec<Bytes>,
) -> Result<(), WatchEnd> {
    for line in lines {
        out.send(Ok(line)).await.map_err(|_| WatchEnd::Gone)?;
    }
    Ok(())
}

async fn stream_watch(
    api: &ApiState,
    request: &WatchRequest,
    out: &mpsc::Sender<Result<Bytes, Infallible>>,
) -> Result<(), WatchEnd> {
    let deadline = Instant::now() + request.timeout;
    // Subscribe before reading the store, so no change can fall in between.
    let mut versions = api.version.subscribe();
    let mut available = api.available.subscribe();
    let (lines, mut last, gone) = {
        let store = lock(&api.store);
        match request.start {
            Some(after) => lines_since(&store, after, request)?,
            None => {
                let mut lines = Vec::new();
                for (pod, rv) in store
                    .pods
                    .values()
                    .filter(|(p, _)| request.filter.matches(p))
                {
                    lines.push(event_line("ADDED", render(pod, *rv, request.shape)?)?);
                }
                (lines, store.version, false)
            }
        }
    };
    send_all(out, lines).await?;
    if gone {
        return Ok(());
    }
    if request.initial_events {
        send_all(out, vec![bookmark_line(request.shape, last, true)?]).await?;
    }
    let period = *lock(&api.bookmark_interval);
    let mut bookmarks = tokio::time::interval_at(Instant::now() + period, period);
    loop {
        tokio::select! {
            () = out.closed() => return Err(WatchEnd::Gone),
            () = tokio::time::sleep_until(deadline) => return Ok(()),
            changed = available.changed() => {
                if changed.is_err() || !*available.borrow_and_update() {
                    return Ok(());
                }
            }
            changed = versions.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                versions.borrow_and_update();
                let (lines, now, gone) = lines_since(&lock(&api.store), last, request)?;
                last = now;
                send_all(out, lines).await?;
                if gone {
                    return Ok(());
                }
            }
            _ = bookmarks.tick(), if request.bookmarks => {
                send_all(out, vec![bookmark_line(request.shape, last, false)?]).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, phase: &str) -> PodMeta {
        PodMeta {
            phase: phase.into(),
            ..PodMeta::running("default", name, &format!("uid-{name}"), node)
        }
    }

    fn filter(fields: &str) -> Filter {
        Filter {
            namespace: None,
            fields: FieldSelector::parse(fields).unwrap(),
            labels: LabelSelector::default(),
        }
    }

    #[test]
    fn a_pod_that_stops_matching_is_deleted_and_one_that_starts_is_added() {
        let f = filter("spec.nodeName=node-a,status.phase!=Succeeded");
        let change = |prev: Option<PodMeta>, cur: Option<PodMeta>| Change { rv: 7, prev, cur };
        let running = pod("p", "node-a", "Running");
        let done = pod("p", "node-a", "Succeeded");
        let elsewhere = pod("p", "node-b", "Running");
        let c = change(None, Some(running.clone()));
        assert_eq!(f.event(&c), Some(("ADDED", &running)));
        let c = change(Some(running.clone()), Some(running.clone()));
        assert_eq!(f.event(&c), Some(("MODIFIED", &running)));
        let c = change(Some(running.clone()), Some(done.clone()));
        assert_eq!(f.event(&c), Some(("DELETED", &running)));
        let c = change(Some(done.clone()), Some(running.clone()));
        assert_eq!(f.event(&c), Some(("ADDED", &running)));
        let c = change(Some(running.clone()), None);
        assert_eq!(f.event(&c), Some(("DELETED", &running)));
        let c = change(None, Some(elsewhere.clone()));
        assert_eq!(f.event(&c), None);
        let c = change(Some(done), None);
        assert_eq!(f.event(&c), None);
    }

    #[test]
    fn history_is_bounded_and_remembers_what_it_dropped() {
        let mut store = Store {
            pods: BTreeMap::new(),
            version: 1,
            history: VecDeque::new(),
            history_limit: 2,
            compacted: 1,
        };
        for _ in 0..5 {
            store.record(None, Some(pod("p", "n", "Running")));
        }
        assert_eq!(store.version, 6);
        assert_eq!(
            store.history.iter().map(|c| c.rv).collect::<Vec<_>>(),
            vec![5, 6]
        );
        assert_eq!(store.compacted, 4);
    }

    #[test]
    fn shapes_follow_the_accept_header() {
        let mut h = HeaderMap::new();
        assert_eq!(Shape::from_headers(&h), Shape::Full);
        h.insert(
            header::ACCEPT,
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
                .parse()
                .unwrap(),
        );
        assert_eq!(Shape::from_headers(&h), Shape::Metadata);
        let v = render(&pod("p", "n", "Running"), 3, Shape::Metadata).unwrap();
        assert_eq!(v["kind"], "PartialObjectMetadata");
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(v["metadata"]["resourceVersion"], "3");
        assert!(v.get("spec").is_none() && v.get("status").is_none());
        let v = render(&pod("p", "n", "Running"), 3, Shape::Full).unwrap();
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["spec"]["nodeName"], "n");
        assert_eq!(v["status"]["phase"], "Running");
    }

    #[test]
    fn kubeconfig_names_the_server_user_and_context() {
        let k = kubeconfig("http://127.0.0.1:1234", "tok");
        assert!(k.contains("server: \"http://127.0.0.1:1234\""));
        assert!(k.contains("token: \"tok\""));
        assert!(k.contains("current-context: kube-sim"));
    }
}
