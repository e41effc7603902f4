//! The node's pods, from a metadata-only watch of the API server.
//!
//! PodResources names pods by namespace and name only; the pod UID (to match a
//! process's cgroup) and the pod labels (for `--kubernetes-pod-labels`) come from here.
//! The watch is scoped to this node (`spec.nodeName`) and to pods that have not
//! finished (`status.phase` neither `Succeeded` nor `Failed`), so the API server sends
//! a delete when a pod finishes and the exporter stops labelling series with it even if
//! an older kubelet still lists it (kubernetes#132020). It asks for metadata only: a
//! node's pods cost a few kilobytes, not their whole specs.
//!
//! When the API server is down, the last known pods stay in use and the watch retries
//! with backoff; metrics never wait on it.

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube_support::watch::Change;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The annotation a static pod's mirror carries with the config hash its cgroup uses
/// in place of the pod UID.
const CONFIG_HASH: &str = "kubernetes.io/config.hash";

/// What the exporter needs to know about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    /// Allow-listed labels, as (sanitised label name, value), sorted by name.
    pub labels: Vec<(String, String)>,
}

/// The pods running on this node, as last seen by the watch.
#[derive(Debug, Clone, Default)]
pub struct PodDirectory {
    /// Changes whenever `pods` changes.
    pub generation: u64,
    /// The watch has delivered a complete list at least once.
    pub synced: bool,
    /// The watch is connected (its last event was not an error).
    pub up: bool,
    /// (namespace, name) → pod.
    pub pods: HashMap<(String, String), PodInfo>,
    /// Pod UID (and static pods' config hash) → (namespace, name).
    pub by_uid: HashMap<String, (String, String)>,
    /// Pods the watch saw leave (finished or deleted) and that have not come back.
    pub ended: HashMap<(String, String), String>,
}

impl PodDirectory {
    /// Whether series may carry this pod's name: a pod the watch saw finish is not
    /// labelled; one it has not seen yet is (the kubelet lists it, so it runs).
    pub fn may_label(&self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        self.pods.contains_key(&key) || !self.ended.contains_key(&key)
    }

    fn insert(&mut self, key: (String, String), info: PodInfo, hash: Option<String>) {
        self.by_uid.insert(info.uid.clone(), key.clone());
        if let Some(h) = hash {
            self.by_uid.insert(h, key.clone());
        }
        self.ended.remove(&key);
        self.pods.insert(key, info);
    }

    fn remove(&mut self, key: &(String, String)) {
        if let Some(info) = self.pods.remove(key) {
            self.by_uid.retain(|_, v| v != key);
            self.ended.insert(key.clone(), info.uid);
        }
    }
}

/// Pod label keys as Prometheus label names: every character outside `[a-zA-Z0-9_]`
/// becomes `_`, and a leading digit gains a `_` prefix (as dcgm-exporter sanitises).
pub fn sanitize_label_name(key: &str) -> String {
    let mut out: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

/// The allow-listed labels of a pod, sanitised and sorted. Two keys that sanitise to
/// the same name keep the first in allow-list order.
pub fn allowed_labels(
    labels: Option<&BTreeMap<String, String>>,
    allow: &[String],
) -> Vec<(String, String)> {
    let Some(labels) = labels else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for key in allow {
        if let Some(v) = labels.get(key) {
            let name = sanitize_label_name(key);
            if !out.iter().any(|(n, _)| *n == name) {
                out.push((name, v.clone()));
            }
        }
    }
    out.sort();
    out
}

fn key_and_info(
    meta: &PartialObjectMeta<Pod>,
    allow: &[String],
) -> Option<((String, String), PodInfo, Option<String>)> {
    let m = &meta.metadata;
    let key = (m.namespace.clone()?, m.name.clone()?);
    let info = PodInfo {
        uid: m.uid.clone()?,
        labels: allowed_labels(m.labels.as_ref(), allow),
    };
    let hash = m
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH))
        .cloned();
    Some((key, info, hash))
}

/// The field selector for this node's unfinished pods.
pub fn field_selector(node_name: &str) -> String {
    format!("spec.nodeName={node_name},status.phase!=Succeeded,status.phase!=Failed")
}

/// Keep `store` in step with the node's pods until the runtime stops. While the API
/// server fails, the last known pods stay in use (see [`kube_support::watch`]).
pub async fn watch(
    client: kube::Client,
    node_name: String,
    allow: Vec<String>,
    store: Arc<ArcSwap<PodDirectory>>,
) {
    // An Api of PartialObjectMeta asks the API server for metadata only.
    let api: kube::Api<PartialObjectMeta<Pod>> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&field_selector(&node_name));
    let mut dir = PodDirectory::default();
    kube_support::watch::watch(api, config, "pod watch", |change| {
        let changed = match change {
            Change::Failed => {
                let was_up = dir.up;
                dir.up = false;
                was_up
            }
            Change::Listed(pods) => {
                let mut listed = PodDirectory {
                    ended: dir.ended.clone(),
                    generation: dir.generation,
                    ..PodDirectory::default()
                };
                for meta in &pods {
                    if let Some((k, info, hash)) = key_and_info(meta, &allow) {
                        listed.insert(k, info, hash);
                    }
                }
                // Pods that were known and are not listed any more have left.
                for (k, info) in &dir.pods {
                    if !listed.pods.contains_key(k) {
                        listed.ended.insert(k.clone(), info.uid.clone());
                    }
                }
                if !dir.synced {
                    tracing::info!(node = %node_name, pods = listed.pods.len(), "pod watch synced");
                }
                dir = listed;
                dir.synced = true;
                dir.up = true;
                true
            }
            Change::Applied(meta) => match key_and_info(&meta, &allow) {
                Some((k, info, hash)) if dir.pods.get(&k) != Some(&info) => {
                    dir.insert(k, info, hash);
                    true
                }
                _ => false,
            },
            Change::Deleted(meta) => match key_and_info(&meta, &allow) {
                Some((k, _, _)) => {
                    dir.remove(&k);
                    true
                }
                None => false,
            },
        };
        // Bound the memory of pods seen leaving: a node runs a few hundred at most.
        if dir.ended.len() > 4096 {
            dir.ended.clear();
        }
        if changed {
            dir.generation += 1;
            store.store(Arc::new(dir.clone()));
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_are_sanitised() {
        assert_eq!(sanitize_label_name("app"), "app");
        assert_eq!(
            sanitize_label_name("app.kubernetes.io/name"),
            "app_kubernetes_io_name"
        );
        assert_eq!(sanitize_label_name("9lives"), "_9lives");
        assert_eq!(sanitize_label_name(""), "_");
    }

    #[test]
    fn only_allowed_labels_are_kept_sorted_and_first_wins_on_collision() {
        let labels: BTreeMap<String, String> = [
            ("team", "ml"),
            ("app", "resnet"),
            ("a.b", "first"),
            ("a/b", "second"),
            ("secret", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let allow: Vec<String> = ["team", "app", "a.b", "a/b", "missing"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(
            allowed_labels(Some(&labels), &allow),
            vec![
                ("a_b".to_string(), "first".to_string()),
                ("app".to_string(), "resnet".to_string()),
                ("team".to_string(), "ml".to_string()),
            ]
        );
    }

    #[test]
    fn ended_pods_are_not_labelled_until_they_come_back() {
        let mut d = PodDirectory::default();
        let key = ("ns".to_string(), "p".to_string());
        assert!(
            d.may_label("ns", "p"),
            "unknown pods listed by the kubelet are labelled"
        );
        d.insert(
            key.clone(),
            PodInfo {
                uid: "u1".into(),
                labels: vec![],
            },
            Some("hash".into()),
        );
        assert_eq!(d.by_uid.get("hash"), Some(&key));
        d.remove(&key);
        assert!(!d.may_label("ns", "p"));
        assert!(d.by_uid.is_empty());
        d.insert(
            key,
            PodInfo {
                uid: "u2".into(),
                labels: vec![],
            },
            None,
        );
        assert!(d.may_label("ns", "p"));
    }
}
