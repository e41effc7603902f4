//! Dynamic Resource Allocation: NVIDIA's DRA driver's device names, and the optional
//! `resource.k8s.io/v1` ResourceSlice watch that tells each device's UUID.
//!
//! The kubelet reports a DRA-allocated GPU as (driver, pool, device) under the
//! container's claim. NVIDIA's driver (`gpu.nvidia.com`, k8s-dra-driver-gpu) names
//! devices by the GPU's **minor number**, never its NVML index, and MIG devices by
//! parent minor number, GPU-instance profile ID and placement:
//!
//! | form | driver releases |
//! |---|---|
//! | `gpu-<minor>` | all |
//! | `gpu-<minor>-mig-<profile>-<profile ID>-<start>` (`gpu-0-mig-1g10gb-19-0`) | 25.12 and later |
//! | `gpu-<minor>-mig-<profile ID>-<start>-<size>` (`gpu-1-mig-19-4-1`) | 25.3, 25.8 |
//!
//! `<profile>` is the profile name without dots, lower case, other characters as `-`
//! (`1g.10gb+me` → `1g10gb-me`). The CDI device names carry the claim UID
//! (`k8s.gpu.nvidia.com/claim=<claim UID>-<device>`), never a GPU UUID, so they are not
//! read. Anything else the driver publishes (`gpu-vfio-<n>`, …) names no NVML device.
//!
//! Names are resolved against the inventory current when the allocations change, so a
//! device the driver creates later (a dynamic MIG instance) resolves once NVML lists it.

use arc_swap::ArcSwap;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::watcher;
use kube_support::watch::Change;
use std::collections::HashMap;
use std::sync::Arc;

/// A device name of NVIDIA's DRA driver, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DraDeviceName {
    /// `gpu-<minor>`: a whole GPU.
    Gpu { minor: u32 },
    /// A MIG device of the GPU with minor number `minor`.
    Mig {
        minor: u32,
        /// The profile name as the name spells it (`1g10gb`); absent in the 25.3/25.8
        /// form.
        profile: Option<String>,
        /// The GPU-instance profile's unique ID (`nvmlGpuInstanceInfo_t.profileId`).
        profile_id: u32,
        /// First memory slice of the placement.
        start: u32,
        /// Placement size; only the 25.3/25.8 form has it.
        size: Option<u32>,
    },
}

/// A decimal number of ASCII digits, fitting in `u32`.
fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl DraDeviceName {
    /// The device `name` names, or `None` for a name of another shape.
    pub fn parse(name: &str) -> Option<DraDeviceName> {
        let rest = name.strip_prefix("gpu-")?;
        let (minor, mig) = match rest.split_once("-mig-") {
            Some((minor, mig)) => (number(minor)?, Some(mig)),
            None => (number(rest)?, None),
        };
        let Some(mig) = mig else {
            return Some(DraDeviceName::Gpu { minor });
        };
        let parts: Vec<&str> = mig.split('-').collect();
        if let [profile_id, start, size] = parts[..]
            && let (Some(profile_id), Some(start), Some(size)) =
                (number(profile_id), number(start), number(size))
        {
            return Some(DraDeviceName::Mig {
                minor,
                profile: None,
                profile_id,
                start,
                size: Some(size),
            });
        }
        let [profile @ .., profile_id, start] = &parts[..] else {
            return None;
        };
        let profile = profile.join("-");
        let valid_profile = !profile.is_empty()
            && profile
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid_profile {
            return None;
        }
        Some(DraDeviceName::Mig {
            minor,
            profile: Some(profile),
            profile_id: number(profile_id)?,
            start: number(start)?,
            size: None,
        })
    }
}

/// A MIG profile name as the DRA driver writes it into device names (`1g.10gb` →
/// `1g10gb`, `1g.10gb+me` → `1g10gb-me`).
pub fn device_name_profile(profile: &str) -> String {
    let mapped: String = profile
        .chars()
        .filter(|&c| c != '.')
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped.trim_matches('-').to_string()
}

/// dcgm-exporter's `dra_*` labels of a series attributed through a DRA claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DraLabels {
    pub claim_name: String,
    pub claim_namespace: String,
    pub driver_name: String,
    pub pool_name: String,
    pub device_name: String,
    /// MIG devices only: the instance's profile (`1g.10gb`) and MIG UUID.
    pub mig: Option<(String, String)>,
}

impl DraLabels {
    /// The labels as (name, value), byte-sorted by name as dcgm-exporter emits its
    /// attributes.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut v = vec![
            ("dra_claim_name", self.claim_name.as_str()),
            ("dra_claim_namespace", self.claim_namespace.as_str()),
            ("dra_device_name", self.device_name.as_str()),
            ("dra_driver_name", self.driver_name.as_str()),
        ];
        if let Some((profile, uuid)) = &self.mig {
            v.push(("dra_mig_device_uuid", uuid.as_str()));
            v.push(("dra_mig_profile", profile.as_str()));
        }
        v.push(("dra_pool_name", self.pool_name.as_str()));
        v
    }
}

/// What a ResourceSlice says about one device of NVIDIA's driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDevice {
    /// The `uuid` attribute: `GPU-…` for a GPU, `MIG-…` for a MIG device.
    pub uuid: Option<String>,
}

/// The devices NVIDIA's DRA driver publishes for this node, by (pool, device name).
#[derive(Debug, Clone, Default)]
pub struct SliceDirectory {
    /// Changes whenever `devices` changes.
    pub generation: u64,
    /// The watch has delivered a complete list at least once.
    pub synced: bool,
    /// The watch is connected.
    pub up: bool,
    pub devices: HashMap<(String, String), SliceDevice>,
    /// (pool, device) keys of each slice, by slice name, so a deleted slice's devices go.
    by_slice: HashMap<String, Vec<(String, String)>>,
}

impl SliceDirectory {
    /// The device published as `device` in `pool`, if any.
    pub fn get(&self, pool: &str, device: &str) -> Option<&SliceDevice> {
        self.devices.get(&(pool.to_string(), device.to_string()))
    }

    /// Replace what slice `slice` said with what it says now.
    fn apply(&mut self, slice: &ResourceSlice) {
        let Some(name) = slice.metadata.name.clone() else {
            return;
        };
        self.remove(&name);
        let pool = slice.spec.pool.name.clone();
        let mut keys = Vec::new();
        for d in slice.spec.devices.iter().flatten() {
            let uuid = d
                .attributes
                .as_ref()
                .and_then(|a| a.get("uuid"))
                .and_then(|a| a.string.clone());
            let key = (pool.clone(), d.name.clone());
            self.devices.insert(key.clone(), SliceDevice { uuid });
            keys.push(key);
        }
        self.by_slice.insert(name, keys);
    }

    fn remove(&mut self, slice_name: &str) {
        for key in self.by_slice.remove(slice_name).unwrap_or_default() {
            self.devices.remove(&key);
        }
    }
}

/// The field selector for the slices of NVIDIA's driver on this node.
pub fn field_selector(node_name: &str) -> String {
    format!(
        "spec.nodeName={node_name},spec.driver={}",
        super::kubelet::NVIDIA_DRA_DRIVER
    )
}

/// Keep `store` in step with this node's ResourceSlices of NVIDIA's driver until the
/// runtime stops. While the API server fails, the last known devices stay in use.
pub async fn watch(client: kube::Client, node_name: String, store: Arc<ArcSwap<SliceDirectory>>) {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&field_selector(&node_name));
    let mut dir = SliceDirectory::default();
    kube_support::watch::watch(api, config, "ResourceSlice watch", |change| {
        let changed = match change {
            Change::Failed => std::mem::replace(&mut dir.up, false),
            Change::Listed(slices) => {
                let mut listed = SliceDirectory {
                    generation: dir.generation,
                    ..SliceDirectory::default()
                };
                for s in &slices {
                    listed.apply(s);
                }
                if !dir.synced {
                    tracing::info!(node = %node_name, devices = listed.devices.len(), "ResourceSlice watch synced");
                }
                dir = listed;
                dir.synced = true;
                dir.up = true;
                true
            }
            Change::Applied(s) => {
                dir.apply(&s);
                true
            }
            Change::Deleted(s) => {
                if let Some(name) = &s.metadata.name {
                    dir.remove(name);
                }
                true
            }
        };
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
    use k8s_openapi::api::resource::v1::{
        Device, DeviceAttribute, ResourcePool, ResourceSliceSpec,
    };

    #[test]
    fn device_names_of_every_driver_release_parse() {
        let mig = |minor, profile: Option<&str>, profile_id, start, size| DraDeviceName::Mig {
            minor,
            profile: profile.map(str::to_string),
            profile_id,
            start,
            size,
        };
        let rows = [
            ("gpu-0", Some(DraDeviceName::Gpu { minor: 0 })),
            ("gpu-13", Some(DraDeviceName::Gpu { minor: 13 })),
            // 25.12+: profile name without dots, profile ID, placement start.
            (
                "gpu-2-mig-1g24gb-19-0",
                Some(mig(2, Some("1g24gb"), 19, 0, None)),
            ),
            (
                "gpu-1-mig-2g47gb-14-0",
                Some(mig(1, Some("2g47gb"), 14, 0, None)),
            ),
            (
                "gpu-0-mig-1g10gb-me-20-6",
                Some(mig(0, Some("1g10gb-me"), 20, 6, None)),
            ),
            (
                "gpu-3-mig-1c2g20gb-14-4",
                Some(mig(3, Some("1c2g20gb"), 14, 4, None)),
            ),
            // 25.3/25.8: profile ID, placement start, size.
            ("gpu-1-mig-19-4-1", Some(mig(1, None, 19, 4, Some(1)))),
            ("gpu-0-mig-9-4-4", Some(mig(0, None, 9, 4, Some(4)))),
            // Not NVML devices, or not the driver's shapes.
            ("gpu-vfio-0", None),
            ("gpu-", None),
            ("gpu-x", None),
            ("gpu--1", None),
            ("gpu-1-mig-", None),
            ("gpu-1-mig-19-4", None),
            ("gpu-1-mig-1G10GB-19-0", None),
            ("gpu-1-mig-1g10gb-19-x", None),
            ("gpu-1-mig-1g10gb-19-0-extra", None),
            ("gpu-99999999999", None),
            ("channel-0", None),
            ("GPU-0", None),
            ("", None),
        ];
        for (name, want) in rows {
            assert_eq!(DraDeviceName::parse(name), want, "{name}");
        }
    }

    #[test]
    fn profile_names_are_spelled_as_in_device_names() {
        // The spellings NVIDIA's driver publishes (`gpu-0-mig-1g10gb-19-0`, …).
        let rows = [
            ("1g.10gb", "1g10gb"),
            ("1g.10gb+me", "1g10gb-me"),
            ("1c.2g.20gb", "1c2g20gb"),
            ("7g.141gb", "7g141gb"),
            ("3g.71gb", "3g71gb"),
            ("2g.47gb", "2g47gb"),
        ];
        for (profile, want) in rows {
            assert_eq!(device_name_profile(profile), want, "{profile}");
        }
    }

    #[test]
    fn labels_come_byte_sorted_with_mig_ones_only_for_mig() {
        let mut l = DraLabels {
            claim_name: "claim".into(),
            claim_namespace: "ns".into(),
            driver_name: "gpu.nvidia.com".into(),
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            mig: None,
        };
        assert_eq!(
            l.pairs(),
            [
                ("dra_claim_name", "claim"),
                ("dra_claim_namespace", "ns"),
                ("dra_device_name", "gpu-0"),
                ("dra_driver_name", "gpu.nvidia.com"),
                ("dra_pool_name", "node-a"),
            ]
        );
        l.device_name = "gpu-0-mig-1g10gb-19-0".into();
        l.mig = Some(("1g.10gb".into(), "MIG-x".into()));
        assert_eq!(
            l.pairs(),
            [
                ("dra_claim_name", "claim"),
                ("dra_claim_namespace", "ns"),
                ("dra_device_name", "gpu-0-mig-1g10gb-19-0"),
                ("dra_driver_name", "gpu.nvidia.com"),
                ("dra_mig_device_uuid", "MIG-x"),
                ("dra_mig_profile", "1g.10gb"),
                ("dra_pool_name", "node-a"),
            ]
        );
    }

    fn slice(name: &str, pool: &str, devices: &[(&str, Option<&str>)]) -> ResourceSlice {
        ResourceSlice {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "gpu.nvidia.com".into(),
                pool: ResourcePool {
                    name: pool.into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(
                    devices
                        .iter()
                        .map(|(d, uuid)| Device {
                            name: d.to_string(),
                            attributes: uuid.map(|u| {
                                [(
                                    "uuid".to_string(),
                                    DeviceAttribute {
                                        string: Some(u.into()),
                                        ..Default::default()
                                    },
                                )]
                                .into()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_slice_update_replaces_its_devices_and_a_delete_removes_them() {
        let mut d = SliceDirectory::default();
        d.apply(&slice(
            "s1",
            "node-a",
            &[("gpu-0", Some("GPU-a")), ("gpu-1", None)],
        ));
        d.apply(&slice("s2", "node-a", &[("gpu-2", Some("GPU-c"))]));
        assert_eq!(
            d.get("node-a", "gpu-0").and_then(|s| s.uuid.as_deref()),
            Some("GPU-a")
        );
        assert_eq!(d.get("node-a", "gpu-1").map(|s| s.uuid.clone()), Some(None));
        assert!(d.get("node-b", "gpu-0").is_none());
        d.apply(&slice("s1", "node-a", &[("gpu-1", Some("GPU-b"))]));
        assert!(d.get("node-a", "gpu-0").is_none(), "dropped from its slice");
        assert_eq!(
            d.get("node-a", "gpu-1").and_then(|s| s.uuid.as_deref()),
            Some("GPU-b")
        );
        d.remove("s1");
        assert!(d.get("node-a", "gpu-1").is_none());
        assert!(d.get("node-a", "gpu-2").is_some(), "other slices stay");
    }
}
