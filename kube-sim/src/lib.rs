//! # kube-sim
//!
//! A simulated Kubernetes node, for tests and for `gpu-exporter --simulate`.
//!
//! The exporter maps GPUs to pods through three node-local sources; there is no
//! Kubernetes in tests or in the demo, so this crate fakes each one while speaking its
//! real wire protocol, so that the exporter's production clients are what gets tested:
//!
//! - [`kubelet::FakeKubelet`]: the kubelet's PodResources v1 gRPC service on a unix
//!   socket, with failure modes (errors, hangs, garbage, restarts, rate limiting);
//! - [`apiserver::FakeApiServer`]: the pod and EndpointSlice list and watch endpoints of
//!   a kube-apiserver, over plain HTTP, with field and label selectors, metadata-only
//!   responses, bookmarks, `410 Gone` and outages, as `kube-rs`'s watcher expects them;
//! - [`procfs::FakeProc`]: a `/proc` tree with the `cgroup` files of container processes
//!   in each layout the kubelet and container runtimes produce.
//!
//! [`node::SimKubeNode`] runs the three together from a `gpu-sim` scenario.
//!
//! The `fake-kubelet` binary serves the PodResources socket for a node of a real control
//! plane (`tests/kube`), allocating GPUs to the pods bound there ([`allocation`]).
//!
//! Every server owns a tokio runtime on a thread of its own, so it works the same from
//! synchronous code and from inside another runtime, and stopping it drops every
//! connection it had open.

pub mod allocation;
pub mod apiserver;
pub mod kubelet;
pub mod node;
pub mod procfs;
mod selector;
mod server_thread;

/// The kubelet PodResources v1 messages, client and server.
pub use kube_support::proto::podresources as proto;

pub use apiserver::{FakeApiServer, PodMeta};
pub use kubelet::{Behavior, FakeKubelet};
pub use node::SimKubeNode;
pub use procfs::{CgroupLayout, FakeProc, Qos};
