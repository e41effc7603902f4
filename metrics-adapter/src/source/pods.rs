//! Pods and their owners, from a cluster-wide metadata-only pod watch.
//!
//! Label selectors in API requests are over pod labels, and Object metrics average
//! over a workload's pods, so the adapter keeps every pod's labels and its owning
//! workload. A Deployment owns its pods through a ReplicaSet named
//! `<deployment>-<pod-template-hash>`; the pod carries the same `pod-template-hash`
//! label, so the Deployment's name follows without watching ReplicaSets.

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube_support::watch::Change;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The workload a pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Workload {
    /// Plural, group-qualified resource: `deployments.apps`, `statefulsets.apps`, ….
    pub resource: &'static str,
    pub name: String,
}

/// What the adapter knows of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub labels: BTreeMap<String, String>,
    pub workloads: Vec<Workload>,
}

/// Every pod, by (namespace, name), in that order (see [`crate::fleet::in_namespace`]).
/// A persistent map: the watch publishes a new index after every pod change, and the
/// copy shares all but the changed pod's path with the last one (at 51,875 pods a
/// `BTreeMap` copy was a deep one of every pod's labels, 0.1 s a change).
#[derive(Debug, Clone, Default)]
pub struct PodIndex {
    pub synced: bool,
    pub up: bool,
    pub pods: imbl::OrdMap<(String, String), PodInfo>,
}

/// The workloads owning a pod: its controller, and a Deployment through its
/// ReplicaSet's name.
pub fn workloads(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<Workload> {
    let mut out = Vec::new();
    let hash = meta
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"));
    for owner in meta.owner_references.iter().flatten() {
        if owner.controller != Some(true) {
            continue;
        }
        let resource = match owner.kind.as_str() {
            "ReplicaSet" => "replicasets.apps",
            "StatefulSet" => "statefulsets.apps",
            "DaemonSet" => "daemonsets.apps",
            "Job" => "jobs.batch",
            _ => continue,
        };
        out.push(Workload {
            resource,
            name: owner.name.clone(),
        });
        if resource == "replicasets.apps"
            && let Some(h) = hash
            && let Some(deployment) = owner.name.strip_suffix(&format!("-{h}"))
            && !deployment.is_empty()
        {
            out.push(Workload {
                resource: "deployments.apps",
                name: deployment.to_string(),
            });
        }
    }
    out
}

/// What the index keeps of a pod, made as it arrives (the rest of its metadata,
/// `managedFields` and all, is dropped at once).
fn key_and_info(meta: PartialObjectMeta<Pod>) -> Option<((String, String), PodInfo)> {
    let m = meta.metadata;
    let workloads = workloads(&m);
    Some((
        (m.namespace?, m.name?),
        PodInfo {
            labels: m.labels.unwrap_or_default(),
            workloads,
        },
    ))
}

/// Keep `store` in step with every pod until the runtime stops. While the API server
/// fails, the last known pods stay in use (see [`kube_support::watch`]).
pub async fn watch(client: kube::Client, store: Arc<ArcSwap<PodIndex>>) {
    let api: kube::Api<PartialObjectMeta<Pod>> = kube::Api::all(client);
    let mut index = PodIndex::default();
    let config = watcher::Config::default();
    kube_support::watch::watch_kept(api, config, "pod watch", key_and_info, |change| {
        let changed = match change {
            Change::Failed => {
                index.up = false;
                true
            }
            Change::Listed(pods) => {
                index.pods = pods.into_iter().flatten().collect();
                if !index.synced {
                    tracing::info!(pods = index.pods.len(), "pod watch synced");
                }
                index.synced = true;
                index.up = true;
                true
            }
            Change::Applied(kept) => match kept {
                Some((k, info)) => index.pods.insert(k, info.clone()) != Some(info),
                None => false,
            },
            Change::Deleted(kept) => match kept {
                Some((k, _)) => index.pods.remove(&k).is_some(),
                None => false,
            },
        };
        if changed {
            store.store(Arc::new(index.clone()));
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn owned(kind: &str, name: &str, hash: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            labels: hash.map(|h| [("pod-template-hash".to_string(), h.to_string())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: kind.into(),
                name: name.into(),
                uid: "u".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn deployments_follow_from_the_replicaset_name_and_template_hash() {
        let w = workloads(&owned("ReplicaSet", "resnet-7c9f8d6b5", Some("7c9f8d6b5")));
        assert_eq!(
            w,
            vec![
                Workload {
                    resource: "replicasets.apps",
                    name: "resnet-7c9f8d6b5".into()
                },
                Workload {
                    resource: "deployments.apps",
                    name: "resnet".into()
                },
            ]
        );
        // A ReplicaSet whose name does not end in the pod's hash is not a Deployment's.
        assert_eq!(
            workloads(&owned("ReplicaSet", "by-hand", Some("abc"))).len(),
            1
        );
        assert_eq!(
            workloads(&owned("StatefulSet", "db", None)),
            vec![Workload {
                resource: "statefulsets.apps",
                name: "db".into()
            }]
        );
    }
}
