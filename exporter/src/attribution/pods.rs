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

/// Which pod labels are copied onto GPU series: the keys named by
/// `--kubernetes-pod-labels`, and, with `--kubernetes-enable-pod-labels`, every key that
/// one of the `--kubernetes-pod-label-allowlist-regex` patterns matches (all keys when
/// there is no pattern). A pattern matches anywhere in the key unless anchored, as
/// dcgm-exporter's Go regexps do.
#[derive(Debug, Clone, Default)]
pub struct LabelSelection {
    pub keys: Vec<String>,
    /// dcgm-exporter's pod labels: None when off, else the allow-list (empty: all).
    pub patterns: Option<Vec<regex::Regex>>,
}

impl LabelSelection {
    /// From the flags; an allow-list pattern that does not compile is an error naming it.
    pub fn new(
        keys: Vec<String>,
        enable_all: bool,
        allowlist: &[String],
    ) -> Result<LabelSelection, String> {
        let patterns = allowlist
            .iter()
            .map(|p| {
                regex::Regex::new(p).map_err(|e| {
                    format!("--kubernetes-pod-label-allowlist-regex {p:?} is not a regular expression: {e}")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !enable_all && !patterns.is_empty() {
            tracing::warn!(
                "--kubernetes-pod-label-allowlist-regex has no effect without --kubernetes-enable-pod-labels"
            );
        }
        Ok(LabelSelection {
            keys,
            patterns: enable_all.then_some(patterns),
        })
    }

    /// Whether any label can be copied at all.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.patterns.is_none()
    }

    fn matches_pattern(&self, key: &str) -> bool {
        match &self.patterns {
            None => false,
            Some(p) if p.is_empty() => true,
            Some(p) => p.iter().any(|r| r.is_match(key)),
        }
    }
}

/// The selected labels of a pod, sanitised and sorted. Two keys that sanitise to the
/// same name keep the first: named keys in flag order, then pattern-matched keys in
/// byte order.
pub fn allowed_labels(
    labels: Option<&BTreeMap<String, String>>,
    selection: &LabelSelection,
) -> Vec<(String, String)> {
    let Some(labels) = labels else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = Vec::new();
    let named = selection
        .keys
        .iter()
        .filter_map(|k| labels.get_key_value(k));
    let matched = labels.iter().filter(|(k, _)| selection.matches_pattern(k));
    for (key, v) in named.chain(matched) {
        let name = sanitize_label_name(key);
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, v.clone()));
        }
    }
    out.sort();
    out
}

fn key_and_info(
    meta: &PartialObjectMeta<Pod>,
    allow: &LabelSelection,
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
    allow: LabelSelection,
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
        let allow = LabelSelection {
            keys: ["team", "app", "a.b", "a/b", "missing"]
                .into_iter()
                .map(String::from)
                .collect(),
            patterns: None,
        };
        assert_eq!(
            allowed_labels(Some(&labels), &allow),
            vec![
                ("a_b".to_string(), "first".to_string()),
                ("app".to_string(), "resnet".to_string()),
                ("team".to_string(), "ml".to_string()),
            ]
        );
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn enabled_pod_labels_copy_every_label_or_those_a_pattern_matches_plus_named_keys() {
        let pod = labels(&[
            ("app.kubernetes.io/name", "web"),
            ("team", "ml"),
            ("pod-template-hash", "abc"),
            ("tier", "gold"),
        ]);
        let all = LabelSelection::new(vec![], true, &[]).unwrap();
        assert_eq!(allowed_labels(Some(&pod), &all).len(), 4);
        // Unanchored, as Go's MatchString: "^t" anchors, "name" matches inside a key.
        let some = LabelSelection::new(vec![], true, &["^t".into(), "name".into()]).unwrap();
        assert_eq!(
            allowed_labels(Some(&pod), &some),
            vec![
                ("app_kubernetes_io_name".to_string(), "web".to_string()),
                ("team".to_string(), "ml".to_string()),
                ("tier".to_string(), "gold".to_string()),
            ]
        );
        // Named keys are copied whatever the patterns say.
        let union = LabelSelection::new(vec!["pod-template-hash".into()], true, &["^team$".into()])
            .unwrap();
        assert_eq!(
            allowed_labels(Some(&pod), &union),
            vec![
                ("pod_template_hash".to_string(), "abc".to_string()),
                ("team".to_string(), "ml".to_string()),
            ]
        );
        // Patterns do nothing unless pod labels are enabled.
        let off = LabelSelection::new(vec!["tier".into()], false, &["team".into()]).unwrap();
        assert_eq!(
            allowed_labels(Some(&pod), &off),
            vec![("tier".to_string(), "gold".to_string())]
        );
        assert!(LabelSelection::new(vec![], false, &[]).unwrap().is_empty());
        assert!(!all.is_empty());
    }

    #[test]
    fn a_bad_allowlist_pattern_is_an_error_naming_it() {
        let e = LabelSelection::new(vec![], true, &["ok".into(), "team(".into()]).unwrap_err();
        assert!(
            e.contains("\"team(\"") && e.contains("--kubernetes-pod-label-allowlist-regex"),
            "{e}"
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
