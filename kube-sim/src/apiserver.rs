//! A minimal fake kube-apiserver: pod, EndpointSlice and ConfigMap list and watch, and
//! token and access reviews, over plain HTTP.
//!
//! The exporter learns pod UIDs, labels and annotations from a node-scoped,
//! metadata-only pod watch (`kube-rs`'s `metadata_watcher`); the metrics adapter
//! watches pods cluster-wide and finds the exporters through the EndpointSlices of
//! their Service. This server implements the parts of the API server those watches
//! depend on, with the API server's semantics, so that the real client is what tests
//! exercise:
//!
//! - `GET /api/v1/pods` and `GET /api/v1/namespaces/{ns}/pods` list and, with
//!   `watch=true`, stream newline-delimited watch events; `…/pods/{name}` gets one pod;
//!   the same for `discovery.k8s.io/v1` EndpointSlices under
//!   `/apis/discovery.k8s.io/v1/[namespaces/{ns}/]endpointslices`;
//! - `fieldSelector` over `metadata.name` and `metadata.namespace` (and, for pods,
//!   `spec.nodeName` and `status.phase`), and `labelSelector`; a watch sends `DELETED`
//!   when an object stops matching (a pod that finishes under
//!   `status.phase!=Succeeded`) and `ADDED` when it starts to, as the API server's
//!   watch cache does;
//! - `Accept: …;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1` gives metadata-only
//!   objects, anything else full objects;
//! - one global, integer `resourceVersion` across kinds (as etcd's revision); watches
//!   resume from any version still in a bounded history and get a `410 Gone`
//!   (`Expired`) error event for older ones;
//! - `allowWatchBookmarks`, `timeoutSeconds`, `sendInitialEvents` (streaming lists);
//! - `resource.k8s.io/v1` ResourceSlices (cluster-scoped), selectable by
//!   `spec.nodeName` and `spec.driver` (the exporter watches its node's slices of
//!   NVIDIA's DRA driver);
//! - ConfigMaps, the same way (the adapter watches
//!   `kube-system/extension-apiserver-authentication`);
//! - `TokenReview` and `SubjectAccessReview` creation, answered from a token table and
//!   an authorizer function the test sets, each review recorded, so that an aggregated
//!   API server's delegated authentication and authorization can be tested;
//! - bearer-token authentication (401 otherwise) and simulated outages (503, and open
//!   watches are closed); every error body is a `meta/v1` `Status`.
//!
//! Paging is not implemented: `limit` is accepted and everything is returned at once,
//! without a `continue` token (which clients must accept). Lists are always served at
//! the current version, whatever `resourceVersion` and `resourceVersionMatch` say.

use crate::selector::{
    Field, FieldSelector, Fields, OBJECT_FIELDS, POD_FIELDS, RESOURCE_SLICE_FIELDS, SelectorError,
};
use crate::server_thread::ServerThread;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use k8s_openapi::api::authentication::v1::{
    TokenReview, TokenReviewSpec, TokenReviewStatus, UserInfo,
};
use k8s_openapi::api::authorization::v1::{
    SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodSpec, PodStatus};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Status};
use kube_support::selector::Selector as LabelSelector;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
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
}

impl Fields for PodMeta {
    fn field(&self, field: Field) -> &str {
        match field {
            Field::Name => &self.name,
            Field::Namespace => &self.namespace,
            Field::NodeName => &self.node_name,
            Field::Phase => &self.phase,
            // Refused when a selector is parsed (`Kind::fields`).
            Field::Driver => "",
        }
    }
}

/// The kinds of object the fake serves. Every kind shares one store, one resource
/// version and one history, so lists, watches, bookmarks and `410 Gone` behave the
/// same for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pod,
    EndpointSlice,
    ConfigMap,
    /// `resource.k8s.io/v1`, cluster-scoped (stored under namespace "").
    ResourceSlice,
}

impl Kind {
    /// `apiVersion` and `kind` of a full object.
    fn type_meta(self) -> (&'static str, &'static str) {
        match self {
            Kind::Pod => ("v1", "Pod"),
            Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
            Kind::ConfigMap => ("v1", "ConfigMap"),
            Kind::ResourceSlice => ("resource.k8s.io/v1", "ResourceSlice"),
        }
    }

    /// `kind` of a list of full objects.
    fn list_kind(self) -> &'static str {
        match self {
            Kind::Pod => "PodList",
            Kind::EndpointSlice => "EndpointSliceList",
            Kind::ConfigMap => "ConfigMapList",
            Kind::ResourceSlice => "ResourceSliceList",
        }
    }

    /// The resource name, as NotFound messages give it.
    fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::EndpointSlice => "endpointslices",
            Kind::ConfigMap => "configmaps",
            Kind::ResourceSlice => "resourceslices",
        }
    }

    /// The fields a field selector may name for this kind.
    fn fields(self) -> &'static [Field] {
        match self {
            Kind::Pod => POD_FIELDS,
            Kind::EndpointSlice | Kind::ConfigMap => OBJECT_FIELDS,
            Kind::ResourceSlice => RESOURCE_SLICE_FIELDS,
        }
    }
}

/// Where an object is stored: its kind, namespace and name.
type Key = (Kind, String, String);

/// A stored object, without its resource version (kept beside it).
#[derive(Debug, Clone, PartialEq)]
enum Object {
    Pod(PodMeta),
    /// With `metadata.namespace` and `metadata.uid` set and no `resourceVersion`.
    EndpointSlice(EndpointSlice),
    /// With `metadata.namespace` and `metadata.uid` set and no `resourceVersion`.
    ConfigMap(ConfigMap),
    /// With `metadata.uid` set, no namespace and no `resourceVersion`.
    ResourceSlice(ResourceSlice),
}

/// The labels of an object that has none.
static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl Object {
    fn kind(&self) -> Kind {
        match self {
            Object::Pod(_) => Kind::Pod,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::ConfigMap(_) => Kind::ConfigMap,
            Object::ResourceSlice(_) => Kind::ResourceSlice,
        }
    }

    fn key(&self) -> Key {
        (
            self.kind(),
            self.field(Field::Namespace).to_string(),
            self.field(Field::Name).to_string(),
        )
    }

    fn labels(&self) -> &BTreeMap<String, String> {
        match self {
            Object::Pod(pod) => &pod.labels,
            Object::EndpointSlice(slice) => slice.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            Object::ConfigMap(map) => map.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            Object::ResourceSlice(slice) => slice.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
        }
    }

    /// `metadata` as the API server returns it, at version `rv`.
    fn metadata(&self, rv: u64) -> ObjectMeta {
        match self {
            Object::Pod(pod) => object_meta(pod, rv),
            Object::EndpointSlice(slice) => ObjectMeta {
                resource_version: Some(rv.to_string()),
                ..slice.metadata.clone()
            },
            Object::ConfigMap(map) => ObjectMeta {
                resource_version: Some(rv.to_string()),
                ..map.metadata.clone()
            },
            Object::ResourceSlice(slice) => ObjectMeta {
                resource_version: Some(rv.to_string()),
                ..slice.metadata.clone()
            },
        }
    }

    /// The object as JSON at version `rv`, full or metadata-only.
    fn render(&self, rv: u64, shape: Shape) -> Result<serde_json::Value, serde_json::Error> {
        match (shape, self) {
            (Shape::Metadata, _) => {
                let (api_version, kind) = Shape::Metadata.type_meta(self.kind());
                serde_json::to_value(PartialObjectMetadata {
                    api_version,
                    kind,
                    metadata: self.metadata(rv),
                })
            }
            (Shape::Full, Object::Pod(pod)) => serde_json::to_value(full_pod(pod, rv)),
            (Shape::Full, Object::EndpointSlice(slice)) => serde_json::to_value(EndpointSlice {
                metadata: self.metadata(rv),
                ..slice.clone()
            }),
            (Shape::Full, Object::ConfigMap(map)) => serde_json::to_value(ConfigMap {
                metadata: self.metadata(rv),
                ..map.clone()
            }),
            (Shape::Full, Object::ResourceSlice(slice)) => serde_json::to_value(ResourceSlice {
                metadata: self.metadata(rv),
                ..slice.clone()
            }),
        }
    }
}

impl Fields for Object {
    fn field(&self, field: Field) -> &str {
        match self {
            Object::Pod(pod) => pod.field(field),
            Object::EndpointSlice(slice) => match field {
                Field::Name => slice.metadata.name.as_deref().unwrap_or(""),
                Field::Namespace => slice.metadata.namespace.as_deref().unwrap_or(""),
                // Refused when a selector is parsed (`Kind::fields`).
                Field::NodeName | Field::Phase | Field::Driver => "",
            },
            Object::ConfigMap(map) => match field {
                Field::Name => map.metadata.name.as_deref().unwrap_or(""),
                Field::Namespace => map.metadata.namespace.as_deref().unwrap_or(""),
                // Refused when a selector is parsed (`Kind::fields`).
                Field::NodeName | Field::Phase | Field::Driver => "",
            },
            Object::ResourceSlice(slice) => match field {
                Field::Name => slice.metadata.name.as_deref().unwrap_or(""),
                Field::NodeName => slice.spec.node_name.as_deref().unwrap_or(""),
                Field::Driver => &slice.spec.driver,
                // Refused when a selector is parsed (`Kind::fields`).
                Field::Namespace | Field::Phase => "",
            },
        }
    }
}

/// One recorded change: the object before and after (`None`: absent), at version `rv`.
struct Change {
    rv: u64,
    prev: Option<Object>,
    cur: Option<Object>,
}

/// The objects, the global resource version and the change history.
struct Store {
    /// (kind, namespace, name) → (object, version of its last change).
    objects: BTreeMap<Key, (Object, u64)>,
    version: u64,
    history: VecDeque<Change>,
    history_limit: usize,
    /// Changes up to this version have left the history: a watch from an older version
    /// gets 410 Gone.
    compacted: u64,
}

impl Store {
    fn record(&mut self, prev: Option<Object>, cur: Option<Object>) -> u64 {
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
    reviews: Mutex<Reviews>,
}

/// Decides a SubjectAccessReview: allowed or not.
type Authorizer = Arc<dyn Fn(&SubjectAccessReviewSpec) -> bool + Send + Sync>;

/// What TokenReviews and SubjectAccessReviews answer, and what they were asked.
struct Reviews {
    tokens: HashMap<String, UserInfo>,
    authorizer: Authorizer,
    token_reviews: Vec<TokenReviewSpec>,
    access_reviews: Vec<SubjectAccessReviewSpec>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ApiState {
    /// Replaces the object at `key` with what `update` makes of it (`None`: absent), in
    /// one step. Identical content is not a change: the API server does not bump
    /// versions for no-op updates. Returns whether the object existed before.
    fn change(&self, key: Key, update: impl FnOnce(Option<&Object>) -> Option<Object>) -> bool {
        let mut store = lock(&self.store);
        let prev = store.objects.get(&key).map(|(object, _)| object.clone());
        let cur = update(prev.as_ref());
        let existed = prev.is_some();
        if prev == cur {
            return existed;
        }
        let rv = store.record(prev, cur.clone());
        match cur {
            Some(object) => store.objects.insert(key, (object, rv)),
            None => store.objects.remove(&key),
        };
        // While the store is locked, so that watchers see versions in order.
        self.version.send_replace(rv);
        existed
    }
}

/// A fake kube-apiserver for pods and EndpointSlices on `127.0.0.1`. Dropping it stops
/// it.
pub struct FakeApiServer {
    state: Arc<ApiState>,
    addr: SocketAddr,
    _thread: ServerThread,
}

impl FakeApiServer {
    /// Serves on `127.0.0.1` on a free port, with no objects; returns once the port
    /// accepts connections.
    pub fn start() -> io::Result<FakeApiServer> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ApiState {
            store: Mutex::new(Store {
                objects: BTreeMap::new(),
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
            reviews: Mutex::new(Reviews {
                tokens: HashMap::new(),
                authorizer: Arc::new(|_| false),
                token_reviews: Vec::new(),
                access_reviews: Vec::new(),
            }),
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
        let pod = Object::Pod(pod);
        self.state.change(pod.key(), |_| Some(pod));
    }

    /// Sets a pod's `status.phase`; false if there is no such pod.
    pub fn set_phase(&self, namespace: &str, name: &str, phase: &str) -> bool {
        let key = (Kind::Pod, namespace.to_string(), name.to_string());
        self.state.change(key, |prev| match prev {
            Some(Object::Pod(pod)) => Some(Object::Pod(PodMeta {
                phase: phase.to_string(),
                ..pod.clone()
            })),
            other => other.cloned(),
        })
    }

    /// Deletes a pod; false if there was no such pod.
    pub fn delete(&self, namespace: &str, name: &str) -> bool {
        let key = (Kind::Pod, namespace.to_string(), name.to_string());
        self.state.change(key, |_| None)
    }

    /// The pods, in (namespace, name) order.
    pub fn pods(&self) -> Vec<PodMeta> {
        lock(&self.state.store)
            .objects
            .values()
            .filter_map(|(object, _)| match object {
                Object::Pod(pod) => Some(pod.clone()),
                Object::EndpointSlice(_) | Object::ConfigMap(_) | Object::ResourceSlice(_) => None,
            })
            .collect()
    }

    /// Adds `slice`, or replaces the EndpointSlice with its namespace and name, as
    /// `kubectl apply` would: without `metadata.namespace` it goes to `default`, a
    /// missing `metadata.uid` is derived from its name (stable across updates, as a
    /// real object's is), and any `resourceVersion` given is replaced by the server's.
    ///
    /// # Panics
    ///
    /// If the slice has no `metadata.name`: the API server would refuse it, so a test
    /// that builds one has a bug that should fail loudly.
    pub fn apply_endpoint_slice(&self, mut slice: EndpointSlice) {
        as_applied(&mut slice.metadata, "endpointslice");
        let slice = Object::EndpointSlice(slice);
        self.state.change(slice.key(), |_| Some(slice));
    }

    /// Deletes an EndpointSlice; false if there was no such slice.
    pub fn delete_endpoint_slice(&self, namespace: &str, name: &str) -> bool {
        let key = (Kind::EndpointSlice, namespace.to_string(), name.to_string());
        self.state.change(key, |_| None)
    }

    /// The EndpointSlices, in (namespace, name) order, as stored (no
    /// `resourceVersion`).
    pub fn endpoint_slices(&self) -> Vec<EndpointSlice> {
        lock(&self.state.store)
            .objects
            .values()
            .filter_map(|(object, _)| match object {
                Object::EndpointSlice(slice) => Some(slice.clone()),
                Object::Pod(_) | Object::ConfigMap(_) | Object::ResourceSlice(_) => None,
            })
            .collect()
    }

    /// Adds `map`, or replaces the ConfigMap with its namespace and name, as
    /// [`apply_endpoint_slice`](Self::apply_endpoint_slice) does for slices.
    ///
    /// # Panics
    ///
    /// If the ConfigMap has no `metadata.name` (a bug in the test that builds it).
    pub fn apply_config_map(&self, mut map: ConfigMap) {
        as_applied(&mut map.metadata, "configmap");
        let map = Object::ConfigMap(map);
        self.state.change(map.key(), |_| Some(map));
    }

    /// Deletes a ConfigMap; false if there was no such ConfigMap.
    pub fn delete_config_map(&self, namespace: &str, name: &str) -> bool {
        let key = (Kind::ConfigMap, namespace.to_string(), name.to_string());
        self.state.change(key, |_| None)
    }

    /// Adds `slice` (cluster-scoped), or replaces the ResourceSlice with its name; a
    /// missing `metadata.uid` is derived from its name and any `resourceVersion` given
    /// is replaced by the server's.
    ///
    /// # Panics
    ///
    /// If the slice has no `metadata.name` (a bug in the test that builds it).
    pub fn apply_resource_slice(&self, mut slice: ResourceSlice) {
        let Some(name) = slice.metadata.name.clone() else {
            panic!("a resourceslice needs metadata.name: {:?}", slice.metadata);
        };
        slice.metadata.namespace = None;
        slice
            .metadata
            .uid
            .get_or_insert_with(|| format!("uid-resourceslice-{name}"));
        slice.metadata.resource_version = None;
        let slice = Object::ResourceSlice(slice);
        self.state.change(slice.key(), |_| Some(slice));
    }

    /// Deletes a ResourceSlice; false if there was no such slice.
    pub fn delete_resource_slice(&self, name: &str) -> bool {
        let key = (Kind::ResourceSlice, String::new(), name.to_string());
        self.state.change(key, |_| None)
    }

    /// Makes `token` authenticate as `user` in TokenReviews (any other token is
    /// unauthenticated).
    pub fn set_token_user(&self, token: &str, user: UserInfo) {
        lock(&self.state.reviews)
            .tokens
            .insert(token.to_string(), user);
    }

    /// Decides every SubjectAccessReview from now on (the default denies all).
    pub fn set_authorizer(
        &self,
        decide: impl Fn(&SubjectAccessReviewSpec) -> bool + Send + Sync + 'static,
    ) {
        lock(&self.state.reviews).authorizer = Arc::new(decide);
    }

    /// The TokenReview specs received so far, oldest first.
    pub fn token_reviews(&self) -> Vec<TokenReviewSpec> {
        lock(&self.state.reviews).token_reviews.clone()
    }

    /// The SubjectAccessReview specs received so far, oldest first.
    pub fn access_reviews(&self) -> Vec<SubjectAccessReviewSpec> {
        lock(&self.state.reviews).access_reviews.clone()
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
/// `metadata` as `kubectl apply` leaves it: namespace `default` when absent, a `uid`
/// derived from the kind and name when absent (stable across updates, as a real
/// object's is), and no `resourceVersion` (the server assigns it).
///
/// # Panics
///
/// Without `metadata.name`: the API server would refuse the object, so a test that
/// builds one has a bug that should fail loudly.
fn as_applied(meta: &mut ObjectMeta, kind: &str) {
    let Some(name) = meta.name.clone() else {
        panic!("a {kind} needs metadata.name: {meta:?}");
    };
    let namespace = meta
        .namespace
        .get_or_insert_with(|| "default".to_string())
        .clone();
    meta.uid
        .get_or_insert_with(|| format!("uid-{kind}-{namespace}-{name}"));
    meta.resource_version = None;
}

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
    const SLICES: &str = "/apis/discovery.k8s.io/v1";
    axum::Router::new()
        .route("/api/v1/pods", list_all(Kind::Pod))
        .route(
            "/api/v1/namespaces/{namespace}/pods",
            list_namespace(Kind::Pod),
        )
        .route(
            "/api/v1/namespaces/{namespace}/pods/{name}",
            get_one(Kind::Pod),
        )
        .route(
            &format!("{SLICES}/endpointslices"),
            list_all(Kind::EndpointSlice),
        )
        .route(
            &format!("{SLICES}/namespaces/{{namespace}}/endpointslices"),
            list_namespace(Kind::EndpointSlice),
        )
        .route(
            &format!("{SLICES}/namespaces/{{namespace}}/endpointslices/{{name}}"),
            get_one(Kind::EndpointSlice),
        )
        .route(
            "/apis/resource.k8s.io/v1/resourceslices",
            list_all(Kind::ResourceSlice),
        )
        .route(
            "/apis/resource.k8s.io/v1/resourceslices/{name}",
            get(
                |State(api): State<Arc<ApiState>>,
                 UrlPath(name): UrlPath<String>,
                 headers: HeaderMap| async move {
                    get_object(&api, (Kind::ResourceSlice, String::new(), name), &headers)
                },
            ),
        )
        .route("/api/v1/configmaps", list_all(Kind::ConfigMap))
        .route(
            "/api/v1/namespaces/{namespace}/configmaps",
            list_namespace(Kind::ConfigMap),
        )
        .route(
            "/api/v1/namespaces/{namespace}/configmaps/{name}",
            get_one(Kind::ConfigMap),
        )
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(token_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(access_review),
        )
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

/// Metadata-only or full objects, from the `Accept` header.
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

    /// `apiVersion` and `kind` of one object of `kind` in this shape.
    fn type_meta(self, kind: Kind) -> (&'static str, &'static str) {
        match self {
            Shape::Full => kind.type_meta(),
            Shape::Metadata => ("meta.k8s.io/v1", "PartialObjectMetadata"),
        }
    }

    /// `apiVersion` and `kind` of a list of `kind` in this shape.
    fn list_type_meta(self, kind: Kind) -> (&'static str, &'static str) {
        match self {
            Shape::Full => (kind.type_meta().0, kind.list_kind()),
            Shape::Metadata => ("meta.k8s.io/v1", "PartialObjectMetadataList"),
        }
    }
}

/// Which objects a request is about.
struct Filter {
    kind: Kind,
    namespace: Option<String>,
    fields: FieldSelector,
    labels: LabelSelector,
}

impl Filter {
    fn matches(&self, object: &Object) -> bool {
        object.kind() == self.kind
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| ns == object.field(Field::Namespace))
            && self.fields.matches(object)
            && self.labels.matches(object.labels())
    }

    /// The watch event a change is to a watcher with this filter, as the API server's
    /// watch cache decides it: an object that starts matching is `ADDED`, one that stops
    /// matching is `DELETED` (with its previous content at the change's version).
    fn event<'a>(&self, change: &'a Change) -> Option<(&'static str, &'a Object)> {
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

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The query a list or watch route passes on: its parameters, or why they are bad.
type ListQueryResult = Result<Query<ListQuery>, QueryRejection>;

/// `GET` on a kind's cluster-wide collection: list or watch.
fn list_all(kind: Kind) -> MethodRouter<Arc<ApiState>> {
    get(
        move |State(api): State<Arc<ApiState>>, headers: HeaderMap, query: ListQueryResult| async move {
            list_or_watch(api, kind, None, &headers, query)
        },
    )
}

/// `GET` on a kind's collection in one namespace: list or watch.
fn list_namespace(kind: Kind) -> MethodRouter<Arc<ApiState>> {
    get(
        move |State(api): State<Arc<ApiState>>,
              UrlPath(namespace): UrlPath<String>,
              headers: HeaderMap,
              query: ListQueryResult| async move {
            list_or_watch(api, kind, Some(namespace), &headers, query)
        },
    )
}

/// `GET` on one object.
fn get_one(kind: Kind) -> MethodRouter<Arc<ApiState>> {
    get(
        move |State(api): State<Arc<ApiState>>,
              UrlPath((namespace, name)): UrlPath<(String, String)>,
              headers: HeaderMap| async move {
            get_object(&api, (kind, namespace, name), &headers)
        },
    )
}

fn get_object(api: &ApiState, key: Key, headers: &HeaderMap) -> Result<Response, ApiError> {
    let shape = Shape::from_headers(headers);
    let store = lock(&api.store);
    let (object, rv) = store.objects.get(&key).ok_or_else(|| {
        let (kind, _, name) = &key;
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", kind.plural()),
        )
    })?;
    let body = object
        .render(*rv, shape)
        .and_then(|v| serde_json::to_vec(&v))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(json_response(body))
}

fn list_or_watch(
    api: Arc<ApiState>,
    kind: Kind,
    namespace: Option<String>,
    headers: &HeaderMap,
    query: ListQueryResult,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let filter = Filter {
        kind,
        namespace,
        fields: FieldSelector::parse(query.field_selector.as_deref().unwrap_or(""), kind.fields())?,
        labels: LabelSelector::parse(query.label_selector.as_deref().unwrap_or(""))
            .map_err(SelectorError::from)?,
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
    let items = store
        .objects
        .values()
        .filter(|(object, _)| filter.matches(object))
        .map(|(object, rv)| object.render(*rv, shape))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let (api_version, list_kind) = shape.list_type_meta(kind);
    let list = serde_json::json!({
        "apiVersion": api_version,
        "kind": list_kind,
        "metadata": ListMeta {
            resource_version: Some(store.version.to_string()),
            ..ListMeta::default()
        },
        "items": items,
    });
    let body = serde_json::to_vec(&list).map_err(|e| ApiError::internal(e.to_string()))?;
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
    request: &WatchRequest,
    rv: u64,
    initial_events_end: bool,
) -> Result<Bytes, serde_json::Error> {
    let (api_version, kind) = request.shape.type_meta(request.filter.kind);
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
        if let Some((kind, object)) = request.filter.event(change) {
            lines.push(event_line(kind, object.render(change.rv, request.shape)?)?);
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
                for (object, rv) in store
                    .objects
                    .values()
                    .filter(|(o, _)| request.filter.matches(o))
                {
                    lines.push(event_line("ADDED", object.render(*rv, request.shape)?)?);
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
        send_all(out, vec![bookmark_line(request, last, true)?]).await?;
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
                send_all(out, vec![bookmark_line(request, last, false)?]).await?;
            }
        }
    }
}

/// `POST …/tokenreviews`: authenticated as the user [`FakeApiServer::set_token_user`]
/// gave the token, else not, as the API server's TokenReview answers.
async fn token_review(
    State(api): State<Arc<ApiState>>,
    body: Bytes,
) -> Result<axum::Json<TokenReview>, ApiError> {
    let review: TokenReview = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("decoding TokenReview: {e}")))?;
    let mut reviews = lock(&api.reviews);
    reviews.token_reviews.push(review.spec.clone());
    let user = review
        .spec
        .token
        .as_deref()
        .and_then(|token| reviews.tokens.get(token))
        .cloned();
    let status = TokenReviewStatus {
        authenticated: Some(user.is_some()),
        error: user.is_none().then(|| "invalid bearer token".to_string()),
        user,
        ..TokenReviewStatus::default()
    };
    Ok(axum::Json(TokenReview {
        status: Some(status),
        ..review
    }))
}

/// `POST …/subjectaccessreviews`: decided by [`FakeApiServer::set_authorizer`].
async fn access_review(
    State(api): State<Arc<ApiState>>,
    body: Bytes,
) -> Result<axum::Json<SubjectAccessReview>, ApiError> {
    let review: SubjectAccessReview = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("decoding SubjectAccessReview: {e}")))?;
    let authorizer = {
        let mut reviews = lock(&api.reviews);
        reviews.access_reviews.push(review.spec.clone());
        reviews.authorizer.clone()
    };
    let allowed = authorizer(&review.spec);
    Ok(axum::Json(SubjectAccessReview {
        status: Some(SubjectAccessReviewStatus {
            allowed,
            denied: Some(!allowed),
            reason: Some(
                if allowed {
                    "allowed by the test policy"
                } else {
                    "denied by the test policy"
                }
                .to_string(),
            ),
            ..SubjectAccessReviewStatus::default()
        }),
        ..review
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, phase: &str) -> Object {
        Object::Pod(PodMeta {
            phase: phase.into(),
            ..PodMeta::running("default", name, &format!("uid-{name}"), node)
        })
    }

    fn slice(name: &str, service: &str) -> Object {
        Object::EndpointSlice(EndpointSlice {
            address_type: "IPv4".into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some(
                    [(
                        "kubernetes.io/service-name".to_string(),
                        service.to_string(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..EndpointSlice::default()
        })
    }

    fn filter(kind: Kind, fields: &str, labels: &str) -> Filter {
        Filter {
            kind,
            namespace: None,
            fields: FieldSelector::parse(fields, kind.fields()).unwrap(),
            labels: LabelSelector::parse(labels).unwrap(),
        }
    }

    #[test]
    fn a_pod_that_stops_matching_is_deleted_and_one_that_starts_is_added() {
        let f = filter(
            Kind::Pod,
            "spec.nodeName=node-a,status.phase!=Succeeded",
            "",
        );
        let change = |prev: Option<Object>, cur: Option<Object>| Change { rv: 7, prev, cur };
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
    fn filters_see_only_their_kind_and_slices_match_by_label() {
        let slices = filter(
            Kind::EndpointSlice,
            "metadata.namespace=default",
            "kubernetes.io/service-name=gpu-exporter",
        );
        let pods = filter(Kind::Pod, "", "");
        let ours = slice("gpu-exporter-abc", "gpu-exporter");
        let theirs = slice("web-abc", "web");
        let p = pod("p", "n", "Running");
        assert!(slices.matches(&ours));
        assert!(!slices.matches(&theirs));
        assert!(!slices.matches(&p));
        assert!(pods.matches(&p));
        assert!(!pods.matches(&ours));
        // A slice whose Service label changes leaves the watch as a deletion.
        let c = Change {
            rv: 3,
            prev: Some(ours.clone()),
            cur: Some(theirs),
        };
        assert_eq!(slices.event(&c), Some(("DELETED", &ours)));
        assert_eq!(pods.event(&c), None);
    }

    #[test]
    fn history_is_bounded_and_remembers_what_it_dropped() {
        let mut store = Store {
            objects: BTreeMap::new(),
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
        let v = pod("p", "n", "Running").render(3, Shape::Metadata).unwrap();
        assert_eq!(v["kind"], "PartialObjectMetadata");
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(v["metadata"]["resourceVersion"], "3");
        assert!(v.get("spec").is_none() && v.get("status").is_none());
        let v = pod("p", "n", "Running").render(3, Shape::Full).unwrap();
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["spec"]["nodeName"], "n");
        assert_eq!(v["status"]["phase"], "Running");
        let s = slice("s", "svc");
        let v = s.render(4, Shape::Full).unwrap();
        assert_eq!(v["kind"], "EndpointSlice");
        assert_eq!(v["apiVersion"], "discovery.k8s.io/v1");
        assert_eq!(v["addressType"], "IPv4");
        assert_eq!(v["metadata"]["resourceVersion"], "4");
        let v = s.render(4, Shape::Metadata).unwrap();
        assert_eq!(v["kind"], "PartialObjectMetadata");
        assert_eq!(v["metadata"]["labels"]["kubernetes.io/service-name"], "svc");
        assert!(v.get("endpoints").is_none());
    }

    #[test]
    fn kubeconfig_names_the_server_user_and_context() {
        let k = kubeconfig("http://127.0.0.1:1234", "tok");
        assert!(k.contains("server: \"http://127.0.0.1:1234\""));
        assert!(k.contains("token: \"tok\""));
        assert!(k.contains("current-context: kube-sim"));
    }
}
