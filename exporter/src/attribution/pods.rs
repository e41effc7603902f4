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
//!
//! A pod the watch saw leave is remembered only while the kubelet may still list it
//! (a terminated pod can keep its devices for a while, and an older kubelet lists a
//! finished one): once a kubelet list asked for after the pod left no longer names it,
//! the kubelet will not list it again and it is forgotten. So the memory of ended pods
//! follows what the kubelet lists, not how many pods have come and gone.

use super::kubelet::KubeletView;
use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube_support::watch::Change;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// The annotation a static pod's mirror carries with the config hash its cgroup uses
/// in place of the pod UID.
const CONFIG_HASH: &str = "kubernetes.io/config.hash";

/// Most ended pods remembered while no kubelet list can say which are gone (the kubelet
/// is down or unreachable); past it the longest-ended are forgotten first. A node runs
/// a few hundred pods at most.
pub const MAX_ENDED: usize = 1024;

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
    /// Pods the watch saw leave (finished or deleted) and that have not come back, with
    /// when they left; only those the kubelet may still list (see
    /// [`PodDirectory::forget_unlisted`]).
    pub ended: HashMap<(String, String), Instant>,
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

    fn remove(&mut self, key: &(String, String), at: Instant) {
        if self.pods.remove(key).is_some() {
            self.by_uid.retain(|_, v| v != key);
            self.ended.insert(key.clone(), at);
        }
    }

    /// Forget the ended pods that the kubelet's latest list, asked for after they ended,
    /// does not name: the kubelet has let them go and will not list them again, so no
    /// allocation of theirs can come up to be labelled. Nothing is forgotten while the
    /// kubelet is down (its view then lists nothing). Returns how many were forgotten.
    pub fn forget_unlisted(&mut self, kubelet: &KubeletView) -> usize {
        let Some(listed_at) = kubelet.listed_at.filter(|_| kubelet.up) else {
            return 0;
        };
        if self.ended.is_empty() {
            return 0;
        }
        let listed: HashSet<(&str, &str)> = kubelet
            .allocations
            .iter()
            .map(|a| (&*a.namespace, &*a.pod))
            .collect();
        let before = self.ended.len();
        self.ended.retain(|(namespace, name), ended_at| {
            *ended_at >= listed_at || listed.contains(&(namespace.as_str(), name.as_str()))
        });
        // The directory is copied on every change: do not carry a past peak's capacity.
        if self.ended.capacity() > 64 && self.ended.len() < self.ended.capacity() / 4 {
            self.ended.shrink_to_fit();
        }
        before - self.ended.len()
    }

    /// Keep at most [`MAX_ENDED`] ended pods, forgetting the longest-ended first (down to
    /// three quarters of it, so a long kubelet outage does not sort on every event).
    fn cap_ended(&mut self) {
        if self.ended.len() <= MAX_ENDED {
            return;
        }
        let mut newest_first: Vec<((String, String), Instant)> = self.ended.drain().collect();
        newest_first.sort_unstable_by_key(|(_, at)| std::cmp::Reverse(*at));
        newest_first.truncate(MAX_ENDED * 3 / 4);
        self.ended = newest_first.into_iter().collect();
    }

    /// Apply one watch change seen at `now`; returns whether the pods changed.
    fn apply(
        &mut self,
        change: Change<PartialObjectMeta<Pod>>,
        allow: &LabelSelection,
        now: Instant,
    ) -> bool {
        match change {
            Change::Failed => {
                let was_up = self.up;
                self.up = false;
                was_up
            }
            Change::Listed(pods) => {
                let mut listed = PodDirectory {
                    ended: std::mem::take(&mut self.ended),
                    generation: self.generation,
                    ..PodDirectory::default()
                };
                for meta in &pods {
                    if let Some((k, info, hash)) = key_and_info(meta, allow) {
                        listed.insert(k, info, hash);
                    }
                }
                // Pods that were known and are not listed any more have left.
                for k in self.pods.keys() {
                    if !listed.pods.contains_key(k) {
                        listed.ended.insert(k.clone(), now);
                    }
                }
                *self = listed;
                self.synced = true;
                self.up = true;
                true
            }
            Change::Applied(meta) => match key_and_info(&meta, allow) {
                Some((k, info, hash)) if self.pods.get(&k) != Some(&info) => {
                    self.insert(k, info, hash);
                    true
                }
                _ => false,
            },
            Change::Deleted(meta) => match key_and_info(&meta, allow) {
                Some((k, _, _)) => {
                    self.remove(&k, now);
                    true
                }
                None => false,
            },
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
    ) -> crate::error::Result<LabelSelection> {
        let patterns = allowlist
            .iter()
            .map(|p| {
                regex::Regex::new(p).map_err(|source| crate::error::Error::PodLabelPattern {
                    pattern: p.clone(),
                    source,
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
/// server fails, the last known pods stay in use (see [`kube_support::watch`]). The
/// kubelet's view says which ended pods it may still list.
pub async fn watch(
    client: kube::Client,
    node_name: String,
    allow: LabelSelection,
    store: Arc<ArcSwap<PodDirectory>>,
    kubelet: Arc<ArcSwap<KubeletView>>,
) {
    // An Api of PartialObjectMeta asks the API server for metadata only.
    let api: kube::Api<PartialObjectMeta<Pod>> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&field_selector(&node_name));
    let mut dir = PodDirectory::default();
    kube_support::watch::watch(api, config, "pod watch", |change| {
        let was_synced = dir.synced;
        let changed = dir.apply(change, &allow, Instant::now());
        if dir.synced && !was_synced {
            tracing::info!(node = %node_name, pods = dir.pods.len(), "pod watch synced");
        }
        // What is forgotten here labels nothing, so it needs no publishing of its own.
        dir.forget_unlisted(&kubelet.load());
        dir.cap_ended();
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
        let e = LabelSelection::new(vec![], true, &["ok".into(), "team(".into()])
            .unwrap_err()
            .to_string();
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
        d.remove(&key, Instant::now());
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

    use super::super::device_id::DeviceId;
    use super::super::kubelet::{AllocatedDevice, Allocation};
    use kube::core::{ObjectMeta, PartialObjectMetaExt};
    use std::time::Duration;

    fn meta(name: &str, uid: &str) -> PartialObjectMeta<Pod> {
        ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        }
        .into_response_partial()
    }

    /// The kubelet's answer to a list asked for at `listed_at`, naming `pods` (each
    /// holding GPU 0).
    fn kubelet_listing(pods: &[&str], listed_at: Instant) -> KubeletView {
        KubeletView {
            allocations: pods
                .iter()
                .map(|p| Allocation {
                    namespace: "ns".into(),
                    pod: (*p).into(),
                    container: "c".into(),
                    resource: "nvidia.com/gpu".into(),
                    shared_resource: false,
                    device: AllocatedDevice::Plugin("0".parse::<DeviceId>().unwrap()),
                })
                .collect(),
            up: true,
            listed_at: Some(listed_at),
            ..KubeletView::default()
        }
    }

    #[test]
    fn an_ended_pod_is_forgotten_only_once_a_kubelet_list_asked_for_after_it_ended_omits_it() {
        let t0 = Instant::now();
        let mut d = PodDirectory::default();
        assert!(d.apply(
            Change::Applied(meta("p", "u1")),
            &LabelSelection::default(),
            t0
        ));
        assert!(d.apply(
            Change::Deleted(meta("p", "u1")),
            &LabelSelection::default(),
            t0
        ));
        assert!(!d.may_label("ns", "p"));
        // A list asked for before the pod ended says nothing about it, listed or not.
        let before = t0 - Duration::from_millis(1);
        assert_eq!(d.forget_unlisted(&kubelet_listing(&[], before)), 0);
        // The kubelet still lists it after it ended (containers terminating, or an
        // older kubelet that lists finished pods): its devices must stay unlabelled.
        let after = t0 + Duration::from_secs(1);
        assert_eq!(d.forget_unlisted(&kubelet_listing(&["p"], after)), 0);
        assert!(!d.may_label("ns", "p"));
        // A kubelet that is down lists nothing, which says nothing either.
        let down = KubeletView {
            up: false,
            ..kubelet_listing(&[], after)
        };
        assert_eq!(d.forget_unlisted(&down), 0);
        assert!(!d.may_label("ns", "p"));
        // Once a later list omits it, it is gone from the kubelet for good.
        assert_eq!(d.forget_unlisted(&kubelet_listing(&["other"], after)), 1);
        assert!(d.ended.is_empty());
    }

    #[test]
    fn churn_keeps_the_ended_pods_to_those_the_kubelet_still_lists() {
        // 32 pods, each replaced 300 times; after every deletion the kubelet, one list
        // behind, still names the pod just deleted and then lets it go.
        let t0 = Instant::now();
        let at = |step: u64| t0 + Duration::from_millis(step);
        let mut d = PodDirectory::default();
        let live: Vec<String> = (0..32).map(|i| format!("p{i}")).collect();
        for p in &live {
            d.apply(
                Change::Applied(meta(p, &format!("u-{p}"))),
                &LabelSelection::default(),
                at(0),
            );
        }
        let mut live = live;
        let mut peak = 0;
        for n in 0..(32 * 300u64) {
            let slot = (n % 32) as usize;
            let step = 2 * n + 1;
            let new = format!("q{n}");
            let old = std::mem::replace(&mut live[slot], new.clone());
            d.apply(
                Change::Deleted(meta(&old, &format!("u-{old}"))),
                &LabelSelection::default(),
                at(step),
            );
            d.apply(
                Change::Applied(meta(&new, &format!("u-{new}"))),
                &LabelSelection::default(),
                at(step),
            );
            let mut listed: Vec<&str> = live.iter().map(String::as_str).collect();
            listed.push(&old);
            d.forget_unlisted(&kubelet_listing(&listed, at(step + 1)));
            d.cap_ended();
            assert!(
                !d.may_label("ns", &old),
                "{old} is still listed by the kubelet"
            );
            assert!(d.may_label("ns", &new));
            peak = peak.max(d.ended.len());
        }
        assert_eq!(d.pods.len(), 32);
        assert!(
            peak <= 2,
            "ended pods grew to {peak} with the kubelet listing one"
        );
        assert!(d.ended.capacity() <= 64, "capacity {}", d.ended.capacity());
    }

    #[test]
    fn without_a_kubelet_list_the_longest_ended_pods_are_forgotten_first() {
        let t0 = Instant::now();
        let mut d = PodDirectory::default();
        let n = MAX_ENDED as u64 * 2 + 1;
        for i in 0..n {
            let name = format!("p{i}");
            let at = t0 + Duration::from_millis(i);
            d.apply(
                Change::Applied(meta(&name, &name)),
                &LabelSelection::default(),
                at,
            );
            d.apply(
                Change::Deleted(meta(&name, &name)),
                &LabelSelection::default(),
                at,
            );
            d.cap_ended();
            assert!(d.ended.len() <= MAX_ENDED);
            assert!(
                !d.may_label("ns", &name),
                "the pod just ended is remembered"
            );
        }
        assert!(d.ended.len() >= MAX_ENDED / 2, "{} kept", d.ended.len());
        assert!(
            d.may_label("ns", "p0"),
            "the longest-ended pod is forgotten"
        );
        let newest = t0 + Duration::from_millis(n - 1);
        let oldest_kept = d.ended.values().min().copied();
        let kept = d.ended.len() as u64;
        // What is kept is the most recent run of endings, with no gap.
        assert_eq!(oldest_kept, Some(newest - Duration::from_millis(kept - 1)));
    }

    #[test]
    fn a_relist_ends_the_pods_it_no_longer_has_and_keeps_the_earlier_ended() {
        let t0 = Instant::now();
        let mut d = PodDirectory::default();
        d.apply(
            Change::Listed(vec![meta("a", "ua"), meta("b", "ub"), meta("c", "uc")]),
            &LabelSelection::default(),
            t0,
        );
        assert!(d.synced);
        d.apply(
            Change::Deleted(meta("c", "uc")),
            &LabelSelection::default(),
            t0,
        );
        d.apply(
            Change::Listed(vec![meta("a", "ua")]),
            &LabelSelection::default(),
            t0,
        );
        assert!(d.may_label("ns", "a"));
        assert!(!d.may_label("ns", "b"), "b left while the watch was away");
        assert!(
            !d.may_label("ns", "c"),
            "c's end is not forgotten by a relist"
        );
        assert_eq!(d.by_uid.len(), 1);
    }
}
