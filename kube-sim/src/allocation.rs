//! GPU allocation as the NVIDIA device plugin and the kubelet's device manager do it,
//! for a fake kubelet that follows a real API server: every container of a pod bound to
//! the node gets as many of the node's GPUs as its `nvidia.com/gpu` limit asks, for as
//! long as the pod is not finished, and keeps them until then.

use crate::proto::{ContainerDevices, ContainerResources, PodResources};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet};

/// The GPUs of one node and which pod containers hold them.
#[derive(Debug, Clone)]
pub struct Allocator {
    resource: String,
    devices: Vec<String>,
    free: BTreeSet<usize>,
    /// By pod UID: namespace, name, and each container's device indices.
    pods: BTreeMap<String, Held>,
}

#[derive(Debug, Clone)]
struct Held {
    namespace: String,
    name: String,
    containers: Vec<(String, Vec<usize>)>,
}

/// A pod that asks for more devices than are free (the scheduler should not have
/// placed it here); it is left without devices, as the kubelet rejects it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("pod {namespace}/{name} asks for {wanted} {resource}, {free} free")]
pub struct Unfit {
    pub namespace: String,
    pub name: String,
    pub resource: String,
    pub wanted: usize,
    pub free: usize,
}

impl Allocator {
    /// A node whose `resource` devices have these IDs (GPU UUIDs for `nvidia.com/gpu`).
    pub fn new(resource: impl Into<String>, devices: Vec<String>) -> Self {
        Allocator {
            resource: resource.into(),
            free: (0..devices.len()).collect(),
            devices,
            pods: BTreeMap::new(),
        }
    }

    /// Exactly these pods exist now (a fresh list): allocations of pods not among them
    /// are released, those of pods still there are kept.
    pub fn replace_all(&mut self, pods: &[Pod]) -> Vec<Unfit> {
        let live: BTreeSet<&str> = pods
            .iter()
            .filter(|p| !finished(p))
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !live.contains(uid.as_str()))
            .cloned()
            .collect();
        for uid in gone {
            self.release(&uid);
        }
        pods.iter().filter_map(|p| self.apply(p).err()).collect()
    }

    /// A pod was added or changed: allocate for it once, release it when it finishes.
    pub fn apply(&mut self, pod: &Pod) -> Result<(), Unfit> {
        let Some(uid) = pod.metadata.uid.clone() else {
            return Ok(());
        };
        if finished(pod) {
            self.release(&uid);
            return Ok(());
        }
        if self.pods.contains_key(&uid) {
            return Ok(());
        }
        let wanted: Vec<(String, usize)> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| (c.name.clone(), self.asked(c)))
            .collect();
        let total: usize = wanted.iter().map(|(_, n)| n).sum();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if total > self.free.len() {
            return Err(Unfit {
                namespace,
                name,
                resource: self.resource.clone(),
                wanted: total,
                free: self.free.len(),
            });
        }
        let containers = wanted
            .into_iter()
            .map(|(container, n)| {
                let taken: Vec<usize> = self.free.iter().take(n).copied().collect();
                for i in &taken {
                    self.free.remove(i);
                }
                (container, taken)
            })
            .collect();
        self.pods.insert(
            uid,
            Held {
                namespace,
                name,
                containers,
            },
        );
        Ok(())
    }

    /// A pod was deleted.
    pub fn remove(&mut self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.release(uid);
        }
    }

    fn release(&mut self, uid: &str) {
        if let Some(held) = self.pods.remove(uid) {
            for (_, devices) in held.containers {
                self.free.extend(devices);
            }
        }
    }

    fn asked(&self, c: &k8s_openapi::api::core::v1::Container) -> usize {
        let resources = c.resources.as_ref();
        let quantity = resources
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(&self.resource))
            .or_else(|| {
                resources
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|l| l.get(&self.resource))
            });
        // Extended resources are whole numbers (the API server refuses fractions).
        quantity.and_then(|q| q.0.parse().ok()).unwrap_or(0)
    }

    /// What the kubelet's `List` answers: every pod holding devices, with its
    /// containers' device IDs.
    pub fn pod_resources(&self) -> Vec<PodResources> {
        self.pods
            .values()
            .map(|held| PodResources {
                name: held.name.clone(),
                namespace: held.namespace.clone(),
                containers: held
                    .containers
                    .iter()
                    .map(|(container, devices)| ContainerResources {
                        name: container.clone(),
                        devices: (!devices.is_empty())
                            .then(|| ContainerDevices {
                                resource_name: self.resource.clone(),
                                device_ids: devices
                                    .iter()
                                    .map(|&i| self.devices[i].clone())
                                    .collect(),
                                topology: None,
                            })
                            .into_iter()
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect()
    }

    /// What `GetAllocatableResources` answers: every device of the node.
    pub fn allocatable(&self) -> Vec<ContainerDevices> {
        vec![ContainerDevices {
            resource_name: self.resource.clone(),
            device_ids: self.devices.clone(),
            topology: None,
        }]
    }
}

/// A pod whose containers have all stopped for good holds no devices.
fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, name: &str, gpus: &[u64], phase: &str) -> Pod {
        let containers: Vec<_> = gpus
            .iter()
            .enumerate()
            .map(|(i, n)| {
                json!({"name": format!("c{i}"), "resources": {"limits": {"nvidia.com/gpu": n.to_string()}}})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"uid": uid, "name": name, "namespace": "ns"},
            "spec": {"containers": containers},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn held(a: &Allocator) -> Vec<(String, Vec<Vec<String>>)> {
        a.pod_resources()
            .into_iter()
            .map(|p| {
                let devices = p
                    .containers
                    .iter()
                    .map(|c| {
                        c.devices
                            .iter()
                            .flat_map(|d| d.device_ids.clone())
                            .collect()
                    })
                    .collect();
                (p.name, devices)
            })
            .collect()
    }

    #[test]
    fn pods_get_distinct_gpus_keep_them_and_give_them_back() {
        let gpus: Vec<String> = (0..4).map(|i| format!("GPU-{i}")).collect();
        let mut a = Allocator::new("nvidia.com/gpu", gpus);
        a.apply(&pod("u1", "a", &[1, 1], "Running")).unwrap();
        a.apply(&pod("u2", "b", &[1], "Pending")).unwrap();
        assert_eq!(
            held(&a),
            [
                ("a".into(), vec![vec!["GPU-0".into()], vec!["GPU-1".into()]]),
                ("b".into(), vec![vec!["GPU-2".into()]]),
            ]
        );
        // An update of a running pod keeps its GPUs.
        a.apply(&pod("u1", "a", &[1, 1], "Running")).unwrap();
        assert_eq!(
            held(&a)[0].1,
            vec![vec!["GPU-0".to_string()], vec!["GPU-1".to_string()]]
        );
        let e = a.apply(&pod("u3", "c", &[2], "Pending")).unwrap_err();
        assert_eq!((e.wanted, e.free), (2, 1));
        // Finished pods give their GPUs back; the freed ones go to the next pod.
        a.apply(&pod("u1", "a", &[1, 1], "Succeeded")).unwrap();
        a.apply(&pod("u3", "c", &[2], "Pending")).unwrap();
        assert_eq!(
            held(&a)[1],
            ("c".into(), vec![vec!["GPU-0".into(), "GPU-1".into()]])
        );
        // A fresh list without b releases it.
        assert!(a.replace_all(&[pod("u3", "c", &[2], "Running")]).is_empty());
        assert_eq!(held(&a).len(), 1);
        a.remove(&pod("u3", "c", &[2], "Running"));
        assert!(held(&a).is_empty());
        assert_eq!(a.allocatable()[0].device_ids.len(), 4);
    }
}
