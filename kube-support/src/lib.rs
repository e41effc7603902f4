//! Kubernetes plumbing shared by `gpu-exporter`, `gpu-metrics-adapter` and the test
//! doubles in `kube-sim`, written once:
//!
//! - [`client()`]: a client from a kubeconfig or the in-cluster configuration, without
//!   client-side retries, every file it names read bounded;
//! - [`shutdown::signal`]: SIGINT or SIGTERM;
//! - [`duration`]: Go's `time.ParseDuration`, the one grammar of every duration flag;
//! - [`log_filter`]: the one grammar of `--log-level`, refused at startup when wrong;
//! - [`listener_flags`]: the listener flags of both binaries, declared once;
//! - [`config_file`]: configuration files read whole, regular files only, bounded;
//! - [`watch`]: a watch that mirrors objects and restarts from a fresh list after
//!   errors, with backoff;
//! - [`selector`]: label selectors as `k8s.io/apimachinery` parses and matches them;
//! - [`proto`]: the wire types (kubelet PodResources, the Prometheus exposition, KEDA's
//!   external scaler), generated once from `proto/`.

mod client;
/// Re-exported: tls-serving and gpu-sim need the same bounded reads without the
/// Kubernetes dependencies, so the code lives in its own small crate.
pub use config_file;
pub mod duration;
pub mod listener_flags;
pub mod log_filter;
pub mod proto;
pub mod selector;
pub mod shutdown;
pub mod watch;

pub use client::client;

use std::path::PathBuf;

/// What can go wrong building a Kubernetes client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("kubeconfig {}: {source}", path.display())]
    KubeconfigFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file the kubeconfig names for the context in use.
    #[error("kubeconfig {kubeconfig}: {key} {}: {source}", path.display())]
    KubeconfigReference {
        kubeconfig: String,
        key: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no kubeconfig: KUBECONFIG is unset and there is no ~/.kube/config")]
    NoKubeconfig,
    #[error("no Kubernetes configuration: not in a cluster ({in_cluster}), and {kubeconfig}")]
    NoConfig {
        kubeconfig: Box<Error>,
        in_cluster: kube::config::InClusterError,
    },
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}
