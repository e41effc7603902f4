//! Who holds each GPU and MIG instance, and each pod's share of a shared one.
//!
//! [`Holdings::resolve`] matches the kubelet's allocations against the inventory; it
//! runs only when the allocations, the pods or the inventory change. [`split`] divides
//! one device value between the pods sharing it, every cycle, from their processes.

use super::device_id::{DeviceRef, GpuUuid, MigUuid};
use super::dra::{DraDeviceName, DraLabels, SliceDirectory, device_name_profile};
use super::kubelet::{AllocatedDevice, Allocation, DraDevice};
use super::pods::PodDirectory;
use crate::source::{EntityInfo, Inventory};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A container holding a device, with what labels it brings.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    pub namespace: Arc<str>,
    pub pod: Arc<str>,
    /// None when several containers of the pod share the device: the pod's share is
    /// then not one container's.
    pub container: Option<Arc<str>>,
    /// Allow-listed pod labels (sanitised name, value), sorted.
    pub pod_labels: Vec<(String, String)>,
    /// The pod's UID, once the pod watch knows the pod.
    pub pod_uid: Option<Arc<str>>,
    /// The sharing replica the container was given (`::N`, `/vgpuN`): dcgm's `vgpu`.
    /// The lowest, when it holds several of one device.
    pub vgpu: Option<u32>,
    /// The DRA claim the device came through, when it did.
    pub dra: Option<Arc<DraLabels>>,
}

/// How an entity is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// Allocated to no container.
    Free,
    /// Allocated whole to one container: every series of the entity is that container's.
    Exclusive(Holder),
    /// Shared (several containers, or a sharing replica or resource): device-wide
    /// values stay unlabelled, and usage is split per pod from processes.
    Shared(Vec<Holder>),
}

/// The result of matching allocations to entities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holdings {
    /// One per inventory entity.
    pub per_entity: Vec<Holding>,
    /// Every (entity, container) allocation, for the joinable allocation series.
    pub allocations: Vec<(usize, Holder)>,
    /// Allocations whose device is not on this node's inventory.
    pub unmapped: Vec<String>,
}

/// Lookup tables from every way a kubelet names a device to an inventory entity.
#[derive(Debug, Default)]
pub struct DeviceIndex {
    gpu_by_uuid: HashMap<GpuUuid, usize>,
    gpu_by_index: HashMap<u32, usize>,
    mig_by_uuid: HashMap<MigUuid, usize>,
    /// (GPU index, GPU instance ID) → entity.
    mig_by_gi: HashMap<(u32, u32), usize>,
    /// (GPU index, GPU instance ID, compute instance ID) → entity.
    mig_by_gi_ci: HashMap<(u32, u32, u32), usize>,
    /// (GPU index, MIG slot) → entity.
    mig_by_slot: HashMap<(u32, u32), usize>,
    /// GPU minor number → entity (NVIDIA's DRA driver's `gpu-<minor>`).
    gpu_by_minor: HashMap<u32, usize>,
    /// (parent minor, GI profile ID, placement start) → (entity, placement size).
    mig_by_placement: HashMap<(u32, u32, u32), (usize, u32)>,
    /// (parent minor, profile as device names spell it) → entities, for MIG instances
    /// whose placement NVML did not tell.
    mig_by_profile: HashMap<(u32, String), Vec<usize>>,
}

impl DeviceIndex {
    /// Index an inventory. MIG UUIDs are resolved here once per discovery, from the
    /// enumeration NVML already did, so no per-ID NVML lookup is ever made.
    pub fn new(inv: &Inventory) -> DeviceIndex {
        let mut ix = DeviceIndex::default();
        for (e, ent) in inv.entities.iter().enumerate() {
            match &ent.mig {
                None => {
                    if let Ok(u) = ent.uuid.parse::<GpuUuid>() {
                        ix.gpu_by_uuid.insert(u, e);
                    }
                    ix.gpu_by_index.insert(ent.gpu_index, e);
                    if let Some(minor) = ent.minor_number {
                        ix.gpu_by_minor.insert(minor, e);
                    }
                }
                Some(m) => {
                    if let Ok(u) = m.mig_uuid.parse::<MigUuid>() {
                        ix.mig_by_uuid.insert(u, e);
                    }
                    ix.mig_by_gi.insert((ent.gpu_index, m.gpu_instance_id), e);
                    ix.mig_by_gi_ci
                        .insert((ent.gpu_index, m.gpu_instance_id, m.compute_instance_id), e);
                    ix.mig_by_slot.insert((ent.gpu_index, m.slot), e);
                    if let Some(minor) = ent.minor_number {
                        match m.placement {
                            Some(p) => {
                                ix.mig_by_placement
                                    .insert((minor, p.profile_id, p.start), (e, p.size));
                            }
                            None => ix
                                .mig_by_profile
                                .entry((minor, device_name_profile(&m.profile)))
                                .or_default()
                                .push(e),
                        }
                    }
                }
            }
        }
        ix
    }

    /// The entity a device-plugin reference names, if it is on this node.
    pub fn lookup(&self, r: &DeviceRef, entities: &[EntityInfo]) -> Option<usize> {
        match *r {
            DeviceRef::GpuUuid(u) => self.gpu_by_uuid.get(&u).copied(),
            DeviceRef::MigUuid(u) => self.mig_by_uuid.get(&u).copied(),
            DeviceRef::LegacyMig {
                parent,
                gpu_instance,
                compute_instance,
            } => {
                let gpu = self.gpu_by_uuid.get(&parent)?;
                let index = entities.get(*gpu)?.gpu_index;
                self.mig_by_gi_ci
                    .get(&(index, gpu_instance, compute_instance))
                    .copied()
            }
            DeviceRef::Index(i) | DeviceRef::GkeGpu { index: i } => {
                self.gpu_by_index.get(&i).copied()
            }
            DeviceRef::MigIndex { parent, slot } => self.mig_by_slot.get(&(parent, slot)).copied(),
            DeviceRef::GkeMig {
                index,
                gpu_instance,
            } => self.mig_by_gi.get(&(index, gpu_instance)).copied(),
        }
    }

    /// The entity a DRA device of NVIDIA's driver is: by the UUID its ResourceSlice
    /// publishes when the watch knows the device, else by its name (`gpu-<minor>`, MIG
    /// by parent minor, profile ID and placement). CDI names are not read: they carry
    /// the claim UID, not the device's.
    pub fn lookup_dra(
        &self,
        d: &DraDevice,
        slice: Option<&super::dra::SliceDevice>,
    ) -> Option<usize> {
        if let Some(uuid) = slice.and_then(|s| s.uuid.as_deref()) {
            let by_uuid = if let Ok(u) = uuid.parse::<GpuUuid>() {
                self.gpu_by_uuid.get(&u)
            } else if let Ok(u) = uuid.parse::<MigUuid>() {
                self.mig_by_uuid.get(&u)
            } else {
                None
            };
            if let Some(&e) = by_uuid {
                return Some(e);
            }
        }
        match DraDeviceName::parse(&d.device)? {
            DraDeviceName::Gpu { minor } => self.gpu_by_minor.get(&minor).copied(),
            DraDeviceName::Mig {
                minor,
                profile,
                profile_id,
                start,
                size,
            } => {
                if let Some(&(e, placed_size)) =
                    self.mig_by_placement.get(&(minor, profile_id, start))
                {
                    return size.is_none_or(|s| s == placed_size).then_some(e);
                }
                // Placement unknown: a profile that only one instance of the GPU has.
                match self.mig_by_profile.get(&(minor, profile?))?.as_slice() {
                    [only] => Some(*only),
                    _ => None,
                }
            }
        }
    }
}

/// A device reference as the cache keys it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CacheKey {
    Plugin(DeviceRef),
    /// (pool, device name).
    Dra(String, String),
}

/// Resolved references for one inventory and one view of the ResourceSlices, failures
/// included, so a device ID the node does not have is looked up (and logged) once, not
/// every refresh. A new inventory or new slices start a new cache, so a device that
/// appears later (a MIG instance created for a claim) resolves then.
#[derive(Debug, Default)]
pub struct ResolveCache {
    index: DeviceIndex,
    resolved: HashMap<CacheKey, Option<usize>>,
    slices: Arc<SliceDirectory>,
}

impl ResolveCache {
    pub fn new(inv: &Inventory) -> ResolveCache {
        ResolveCache::with_slices(inv, Arc::default())
    }

    /// A cache that also resolves DRA devices by the UUIDs `slices` publish.
    pub fn with_slices(inv: &Inventory, slices: Arc<SliceDirectory>) -> ResolveCache {
        ResolveCache {
            index: DeviceIndex::new(inv),
            resolved: HashMap::new(),
            slices,
        }
    }

    fn resolve(&mut self, dev: &AllocatedDevice, inv: &Inventory) -> (Option<usize>, bool) {
        let key = match dev {
            AllocatedDevice::Plugin(id) => CacheKey::Plugin(id.device),
            AllocatedDevice::Dra(d) => CacheKey::Dra(d.pool.clone(), d.device.clone()),
        };
        if let Some(hit) = self.resolved.get(&key) {
            return (*hit, false);
        }
        let found = match dev {
            AllocatedDevice::Plugin(id) => self.index.lookup(&id.device, &inv.entities),
            AllocatedDevice::Dra(d) => self
                .index
                .lookup_dra(d, self.slices.get(&d.pool, &d.device)),
        };
        self.resolved.insert(key, found);
        (found, true)
    }
}

/// (namespace, pod, container).
type ContainerKey = (Arc<str>, Arc<str>, Arc<str>);
/// How a container holds one entity: whether any of its IDs marks sharing, its lowest
/// sharing replica, and the DRA claim the device came through.
type Held = (bool, Option<u32>, Option<Arc<DraLabels>>);
/// The containers holding one entity, and how.
type EntityHolders = BTreeMap<ContainerKey, Held>;

impl Holdings {
    /// Match `allocations` to the inventory. Pods the watch saw finish are left out.
    pub fn resolve(
        inv: &Inventory,
        allocations: &[Allocation],
        pods: &PodDirectory,
        cache: &mut ResolveCache,
    ) -> Holdings {
        let (holders, unmapped) = holders_by_entity(inv, allocations, pods, cache);
        let mut per_entity = Vec::with_capacity(holders.len());
        let mut allocations_out = Vec::new();
        for (e, hs) in holders.iter().enumerate() {
            for ((ns, pod, container), (_, replica, dra)) in hs {
                allocations_out.push((
                    e,
                    Holder {
                        namespace: ns.clone(),
                        pod: pod.clone(),
                        container: Some(container.clone()),
                        pod_labels: pod_labels(pods, ns, pod),
                        pod_uid: pod_uid(pods, ns, pod),
                        vgpu: *replica,
                        dra: dra.clone(),
                    },
                ));
            }
            per_entity.push(holding_of(hs, pods));
        }
        Holdings {
            per_entity,
            allocations: allocations_out,
            unmapped,
        }
    }
}

/// Group the allocations of pods that may be labelled by the inventory entity they
/// resolve to (one map per entity), and list the devices that resolve to none, sorted
/// and deduplicated.
fn holders_by_entity(
    inv: &Inventory,
    allocations: &[Allocation],
    pods: &PodDirectory,
    cache: &mut ResolveCache,
) -> (Vec<EntityHolders>, Vec<String>) {
    let mut holders: Vec<EntityHolders> = vec![BTreeMap::new(); inv.entities.len()];
    let mut unmapped = Vec::new();
    for a in allocations {
        if !pods.may_label(&a.namespace, &a.pod) {
            continue;
        }
        let (entity, first_time) = cache.resolve(&a.device, inv);
        let Some(e) = entity else {
            let what = match &a.device {
                AllocatedDevice::Plugin(id) => id.to_string(),
                AllocatedDevice::Dra(d) => format!("DRA {}/{}", d.pool, d.device),
            };
            if first_time {
                tracing::warn!(resource = %a.resource, device = %what, pod = %a.pod, namespace = %a.namespace, "kubelet device is not a GPU on this node; its pod gets no GPU labels");
            }
            unmapped.push(what);
            continue;
        };
        let replica = match &a.device {
            AllocatedDevice::Plugin(id) => id.replica,
            AllocatedDevice::Dra(_) => None,
        };
        let sharing = a.shared_resource || replica.is_some();
        let dra = dra_labels(&a.device, inv, e);
        let slot = holders[e]
            .entry((a.namespace.clone(), a.pod.clone(), a.container.clone()))
            .or_insert((false, None, None));
        slot.0 |= sharing;
        slot.1 = match (slot.1, replica) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        // One claim per (device, container); should two name it, the first in the
        // kubelet's sorted order labels it.
        if slot.2.is_none() {
            slot.2 = dra;
        }
    }
    unmapped.sort();
    unmapped.dedup();
    (holders, unmapped)
}

/// The claim labels of a device allocated through DRA, resolved to entity `e`.
fn dra_labels(device: &AllocatedDevice, inv: &Inventory, e: usize) -> Option<Arc<DraLabels>> {
    match device {
        AllocatedDevice::Dra(d) => Some(Arc::new(DraLabels {
            claim_name: d.claim_name.clone(),
            claim_namespace: d.claim_namespace.clone(),
            driver_name: super::kubelet::NVIDIA_DRA_DRIVER.to_string(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            mig: inv.entities[e]
                .mig
                .as_ref()
                .map(|m| (m.profile.clone(), m.mig_uuid.clone())),
        })),
        AllocatedDevice::Plugin(_) => None,
    }
}

/// The pod's allow-listed labels, once the pod watch knows the pod.
fn pod_labels(pods: &PodDirectory, ns: &str, pod: &str) -> Vec<(String, String)> {
    pods.pods
        .get(&(ns.to_string(), pod.to_string()))
        .map(|p| p.labels.clone())
        .unwrap_or_default()
}

/// The pod's UID, once the pod watch knows the pod.
fn pod_uid(pods: &PodDirectory, ns: &str, pod: &str) -> Option<Arc<str>> {
    pods.pods
        .get(&(ns.to_string(), pod.to_string()))
        .map(|p| Arc::from(p.uid.as_str()))
}

/// How an entity is held, from the containers holding it.
fn holding_of(hs: &EntityHolders, pods: &PodDirectory) -> Holding {
    let shared = hs.len() > 1 || hs.values().any(|s| s.0);
    match (hs.len(), shared) {
        (0, _) => Holding::Free,
        (_, false) => {
            // One container, not shared: proven by len() == 1 above.
            let ((ns, pod, container), (_, replica, dra)) = hs
                .iter()
                .next()
                .map(|(k, v)| (k.clone(), v.clone()))
                .unwrap_or_else(|| unreachable!("an entity with one holder has a first key"));
            Holding::Exclusive(Holder {
                pod_labels: pod_labels(pods, &ns, &pod),
                pod_uid: pod_uid(pods, &ns, &pod),
                vgpu: replica,
                namespace: ns,
                pod,
                container: Some(container),
                dra,
            })
        }
        (_, true) => shared_holding(hs, pods),
    }
}

/// A shared entity's holders: one share per pod; the container is named when only one
/// holds it. A pod's share carries its claim when all its containers got the device
/// through the same one (a claim shared between pods), and the lowest replica of its
/// containers.
fn shared_holding(hs: &EntityHolders, pods: &PodDirectory) -> Holding {
    type PodKey = (Arc<str>, Arc<str>);
    type PodShare = (Vec<(Arc<str>, Option<u32>)>, Vec<Option<Arc<DraLabels>>>);
    let mut by_pod: BTreeMap<PodKey, PodShare> = BTreeMap::new();
    for ((ns, pod, c), (_, replica, dra)) in hs {
        let entry = by_pod.entry((ns.clone(), pod.clone())).or_default();
        entry.0.push((c.clone(), *replica));
        entry.1.push(dra.clone());
    }
    Holding::Shared(
        by_pod
            .into_iter()
            .map(|((ns, pod), (cs, claims))| Holder {
                pod_labels: pod_labels(pods, &ns, &pod),
                pod_uid: pod_uid(pods, &ns, &pod),
                vgpu: cs.iter().filter_map(|c| c.1).min(),
                container: (cs.len() == 1).then(|| cs[0].0.clone()),
                namespace: ns,
                pod,
                dra: match claims.split_first() {
                    Some((first, rest)) if rest.iter().all(|c| c == first) => first.clone(),
                    _ => None,
                },
            })
            .collect(),
    )
}

/// Split an integer device value `total` into per-pod shares, in proportion to
/// `weights` (one per pod) out of `all_weight` (pods plus everything else on the
/// device). Largest-remainder rounding: the shares and the returned remainder (the
/// part of no pod) sum to `total` exactly. With no weight at all, everything is
/// remainder.
pub fn split_proportional(total: i64, weights: &[u64], all_weight: u64) -> (Vec<i64>, i64) {
    let all = all_weight.max(weights.iter().sum());
    if all == 0 || total <= 0 {
        return (vec![0; weights.len()], total);
    }
    let t = total as u128;
    let mut shares: Vec<i64> = Vec::with_capacity(weights.len());
    let mut fractions: Vec<(u128, usize)> = Vec::with_capacity(weights.len());
    for (i, w) in weights.iter().enumerate() {
        let exact = t * u128::from(*w);
        shares.push((exact / u128::from(all)) as i64);
        fractions.push((exact % u128::from(all), i));
    }
    // What the pods' weights are owed in total, rounded to nearest.
    let pod_weight: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    let owed = ((t * pod_weight * 2 + u128::from(all)) / (2 * u128::from(all))) as i64;
    let mut left = owed - shares.iter().sum::<i64>();
    fractions.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, i) in fractions {
        if left <= 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    let remainder = total - shares.iter().sum::<i64>();
    (shares, remainder)
}

/// Split an integer device value between pods that each report their own amount
/// (memory, MiB): each pod keeps its own, scaled down proportionally if the pods
/// together report more than the device; the remainder is the rest.
pub fn split_owned(total: i64, owned: &[u64]) -> (Vec<i64>, i64) {
    let sum: u64 = owned.iter().sum();
    if total <= 0 {
        return (vec![0; owned.len()], total);
    }
    if sum <= total as u64 {
        let shares: Vec<i64> = owned.iter().map(|v| *v as i64).collect();
        let remainder = total - shares.iter().sum::<i64>();
        return (shares, remainder);
    }
    split_proportional(total, owned, sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::attribution::device_id::DeviceId;
    use crate::attribution::pods::PodInfo;
    use crate::source::{EntityInfo, MigInfo};

    const G0: &str = "GPU-11111111-2222-3333-4444-555555555555";
    const G1: &str = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
    const M1: &str = "MIG-99999999-8888-7777-6666-555555555555";

    /// GPU 0 whole; GPU 1 in MIG mode with GI 3 (slot 0, CI 0) and GI 5 (slot 1, CI 0).
    /// Their minor numbers are swapped (GPU 0 is /dev/nvidia1), as on real nodes where
    /// NVML orders by PCI bus and the driver numbers as it probes; GI 3 (1g.10gb, unique
    /// profile ID 19) sits at memory slice 4, GI 5 at slice 0.
    fn inventory() -> Inventory {
        let gpu = |i: u32, uuid: &str| EntityInfo {
            gpu_index: i,
            uuid: uuid.into(),
            minor_number: Some(1 - i),
            pci_bus_id: format!("00000000:0{i}:00.0"),
            model_name: "NVIDIA H100 80GB HBM3".into(),
            mig: None,
            labels: Default::default(),
            lost: false,
        };
        let mig = |gi: u32, slot: u32, uuid: &str| EntityInfo {
            mig: Some(MigInfo {
                parent: 1,
                gpu_instance_id: gi,
                compute_instance_id: 0,
                slot,
                profile: "1g.10gb".into(),
                mig_uuid: uuid.into(),
                placement: Some(crate::source::GiPlacement {
                    profile_id: 19,
                    start: if gi == 3 { 4 } else { 0 },
                    size: 1,
                }),
            }),
            ..gpu(1, G1)
        };
        Inventory {
            driver_version: "580".into(),
            nvml_version: "13".into(),
            entities: vec![
                gpu(0, G0),
                gpu(1, G1),
                mig(3, 0, M1),
                mig(5, 1, "MIG-00000000-0000-0000-0000-000000000005"),
            ],
        }
    }

    fn alloc(ns: &str, pod: &str, c: &str, resource: &str, id: &str) -> Allocation {
        Allocation {
            namespace: ns.into(),
            pod: pod.into(),
            container: c.into(),
            resource: resource.into(),
            shared_resource: resource.ends_with(".shared"),
            device: AllocatedDevice::Plugin(id.parse::<DeviceId>().unwrap()),
        }
    }

    fn holder(ns: &str, pod: &str, c: Option<&str>) -> Holder {
        Holder {
            namespace: ns.into(),
            pod: pod.into(),
            container: c.map(Into::into),
            pod_labels: vec![],
            pod_uid: None,
            vgpu: None,
            dra: None,
        }
    }

    fn resolve(allocs: &[Allocation], pods: &PodDirectory) -> Holdings {
        let inv = inventory();
        Holdings::resolve(&inv, allocs, pods, &mut ResolveCache::new(&inv))
    }

    #[test]
    fn every_device_id_form_finds_its_entity() {
        let lower = G0.to_ascii_lowercase().replacen("gpu-", "GPU-", 1);
        let cases: Vec<(String, usize)> = vec![
            (G0.into(), 0),
            (lower, 0),
            ("0".into(), 0),
            ("nvidia0".into(), 0),
            (M1.into(), 2),
            (format!("MIG-{G1}/3/0"), 2),
            ("1:1".into(), 3),
            ("nvidia1/gi5".into(), 3),
        ];
        for (id, want) in cases {
            let h = resolve(
                &[alloc("ns", "p", "c", "nvidia.com/gpu", &id)],
                &PodDirectory::default(),
            );
            assert_eq!(
                h.per_entity[want],
                Holding::Exclusive(holder("ns", "p", Some("c"))),
                "{id}"
            );
            assert!(h.unmapped.is_empty(), "{id}");
            assert_eq!(
                h.per_entity.iter().filter(|x| **x != Holding::Free).count(),
                1,
                "{id}"
            );
        }
    }

    #[test]
    fn devices_not_on_the_node_are_unmapped_not_guessed() {
        let h = resolve(
            &[
                alloc("ns", "p", "c", "nvidia.com/gpu", "7"),
                alloc("ns", "p", "c", "nvidia.com/gpu", "nvidia1/gi9"),
                alloc(
                    "ns",
                    "p",
                    "c",
                    "nvidia.com/gpu",
                    "GPU-00000000-0000-0000-0000-000000000000",
                ),
                alloc("ns", "p", "c", "nvidia.com/gpu", "1:7"),
            ],
            &PodDirectory::default(),
        );
        assert!(h.per_entity.iter().all(|x| *x == Holding::Free));
        assert_eq!(h.unmapped.len(), 4);
    }

    #[test]
    fn replicas_and_several_holders_make_a_device_shared() {
        let h = resolve(
            &[
                alloc("ns", "a", "main", "nvidia.com/gpu", &format!("{G0}::0")),
                alloc("ns", "b", "main", "nvidia.com/gpu", &format!("{G0}::1")),
                alloc("ns", "b", "side", "nvidia.com/gpu", &format!("{G0}::2")),
                alloc("ns", "c", "main", "nvidia.com/gpu.shared", "1:0"),
            ],
            &PodDirectory::default(),
        );
        assert_eq!(
            h.per_entity[0],
            Holding::Shared(vec![
                Holder {
                    vgpu: Some(0),
                    ..holder("ns", "a", Some("main"))
                },
                // The lowest of the pod's replicas.
                Holder {
                    vgpu: Some(1),
                    ..holder("ns", "b", None)
                }
            ])
        );
        // One holder of a shared resource is still a share, not the whole device.
        assert_eq!(
            h.per_entity[2],
            Holding::Shared(vec![holder("ns", "c", Some("main"))])
        );
        assert_eq!(h.allocations.len(), 4);
        // Two holders of a whole GPU by its plain UUID (no replica suffix): shared too,
        // never credited whole to the first.
        let h = resolve(
            &[
                alloc("ns", "x", "main", "nvidia.com/gpu", G0),
                alloc("ns", "y", "main", "nvidia.com/gpu", G0),
            ],
            &PodDirectory::default(),
        );
        assert_eq!(
            h.per_entity[0],
            Holding::Shared(vec![
                holder("ns", "x", Some("main")),
                holder("ns", "y", Some("main"))
            ])
        );
    }

    #[test]
    fn finished_pods_are_left_out_and_labels_come_from_the_watch() {
        let mut pods = PodDirectory::default();
        pods.pods.insert(
            ("ns".into(), "live".into()),
            PodInfo {
                uid: "u".into(),
                labels: vec![("app".into(), "resnet".into())],
            },
        );
        pods.ended
            .insert(("ns".into(), "done".into()), std::time::Instant::now());
        let h = resolve(
            &[
                alloc("ns", "live", "c", "nvidia.com/gpu", "0"),
                alloc("ns", "done", "c", "nvidia.com/gpu", "1:0"),
            ],
            &pods,
        );
        let Holding::Exclusive(live) = &h.per_entity[0] else {
            panic!("{:?}", h.per_entity[0]);
        };
        assert_eq!(
            live.pod_labels,
            vec![("app".to_string(), "resnet".to_string())]
        );
        assert_eq!(h.per_entity[2], Holding::Free);
    }

    fn dra_device(device: &str, cdi: &[&str]) -> DraDevice {
        DraDevice {
            claim_name: "c".into(),
            claim_namespace: "ns".into(),
            pool: "node".into(),
            device: device.into(),
            cdi_devices: cdi.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn dra_gpus_resolve_by_minor_number_not_index() {
        let inv = inventory();
        let ix = DeviceIndex::new(&inv);
        let entity_of_minor = |minor: u32| {
            inv.entities
                .iter()
                .position(|e| e.mig.is_none() && e.minor_number == Some(minor))
        };
        for minor in [0, 1] {
            let got = ix.lookup_dra(&dra_device(&format!("gpu-{minor}"), &[]), None);
            assert_eq!(got, entity_of_minor(minor), "gpu-{minor}");
            assert_ne!(
                got.map(|e| inv.entities[e].gpu_index),
                Some(minor),
                "minor {minor} is not index {minor} on this node"
            );
        }
        assert_eq!(ix.lookup_dra(&dra_device("gpu-9", &[]), None), None);
        assert_eq!(ix.lookup_dra(&dra_device("gpu-vfio-0", &[]), None), None);
    }

    #[test]
    fn dra_mig_devices_resolve_by_profile_id_and_placement() {
        let inv = inventory();
        let ix = DeviceIndex::new(&inv);
        let gi_of = |e: Option<usize>| {
            e.and_then(|e| inv.entities[e].mig.as_ref())
                .map(|m| m.gpu_instance_id)
        };
        // GPU 1 is minor 0. Both release forms name the same instance.
        for (name, gi) in [
            ("gpu-0-mig-1g10gb-19-4", Some(3)),
            ("gpu-0-mig-1g10gb-19-0", Some(5)),
            ("gpu-0-mig-19-4-1", Some(3)),
            ("gpu-0-mig-19-0-1", Some(5)),
            // A wrong size, an empty slice, another profile, the other GPU.
            ("gpu-0-mig-19-4-2", None),
            ("gpu-0-mig-1g10gb-19-1", None),
            ("gpu-0-mig-2g20gb-14-4", None),
            ("gpu-1-mig-1g10gb-19-4", None),
        ] {
            assert_eq!(
                gi_of(ix.lookup_dra(&dra_device(name, &[]), None)),
                gi,
                "{name}"
            );
        }
    }

    #[test]
    fn dra_mig_without_placement_resolves_by_profile_only_when_unambiguous() {
        let mut inv = inventory();
        for e in &mut inv.entities {
            if let Some(m) = &mut e.mig {
                m.placement = None;
            }
        }
        let ix = DeviceIndex::new(&inv);
        // Two 1g.10gb instances: the name cannot say which.
        assert_eq!(
            ix.lookup_dra(&dra_device("gpu-0-mig-1g10gb-19-4", &[]), None),
            None
        );
        if let Some(m) = &mut inv.entities[3].mig {
            m.profile = "2g.20gb".into();
        }
        let ix = DeviceIndex::new(&inv);
        assert_eq!(
            ix.lookup_dra(&dra_device("gpu-0-mig-1g10gb-19-4", &[]), None),
            Some(2)
        );
        assert_eq!(
            ix.lookup_dra(&dra_device("gpu-0-mig-2g20gb-14-0", &[]), None),
            Some(3)
        );
        // The legacy form has no profile name to go by.
        assert_eq!(
            ix.lookup_dra(&dra_device("gpu-0-mig-19-4-1", &[]), None),
            None
        );
    }

    #[test]
    fn dra_cdi_names_are_never_read_as_device_uuids() {
        let inv = inventory();
        let ix = DeviceIndex::new(&inv);
        // Even a CDI name that looks like a UUID does not move the device: the driver's
        // CDI names carry the claim UID.
        let cdi = [
            format!("k8s.gpu.nvidia.com/claim={M1}"),
            format!("k8s.gpu.nvidia.com/device={G1}"),
        ];
        let cdi: Vec<&str> = cdi.iter().map(String::as_str).collect();
        assert_eq!(ix.lookup_dra(&dra_device("whatever", &cdi), None), None);
        assert_eq!(ix.lookup_dra(&dra_device("gpu-1", &cdi), None), Some(0));
    }

    #[test]
    fn dra_slice_uuid_wins_over_the_name_and_the_name_backs_it_up() {
        use crate::attribution::dra::SliceDevice;
        let inv = inventory();
        let ix = DeviceIndex::new(&inv);
        let with = |uuid: &str| SliceDevice {
            uuid: Some(uuid.into()),
        };
        // A device name the exporter cannot parse, made known by its slice.
        assert_eq!(
            ix.lookup_dra(&dra_device("custom-7", &[]), Some(&with(M1))),
            Some(2)
        );
        assert_eq!(
            ix.lookup_dra(&dra_device("custom-7", &[]), Some(&with(G0))),
            Some(0)
        );
        // A UUID not on this node: the name still resolves.
        let elsewhere = with("GPU-00000000-0000-0000-0000-00000000dead");
        assert_eq!(
            ix.lookup_dra(&dra_device("gpu-1", &[]), Some(&elsewhere)),
            Some(0)
        );
        assert_eq!(
            ix.lookup_dra(&dra_device("gpu-1", &[]), Some(&SliceDevice { uuid: None })),
            Some(0)
        );
    }

    #[test]
    fn dra_holders_carry_their_claim_and_mig_identity() {
        let dra_alloc = |pod: &str, claim: &str, device: &str| Allocation {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
            resource: format!("ml/{claim}").into(),
            shared_resource: false,
            device: AllocatedDevice::Dra(DraDevice {
                claim_name: claim.into(),
                claim_namespace: "ml".into(),
                pool: "node-a".into(),
                device: device.into(),
                cdi_devices: vec![],
            }),
        };
        let allocs = vec![
            dra_alloc("train", "whole", "gpu-1"),
            dra_alloc("serve", "slice", "gpu-0-mig-1g10gb-19-4"),
            alloc(
                "ml",
                "plugin",
                "main",
                "nvidia.com/mig-1g.10gb",
                "MIG-00000000-0000-0000-0000-000000000005",
            ),
        ];
        let h = resolve(&allocs, &PodDirectory::default());
        let held = |e: usize| match &h.per_entity[e] {
            Holding::Exclusive(holder) => holder.clone(),
            other => panic!("entity {e}: {other:?}"),
        };
        let whole = held(0);
        assert_eq!(&*whole.pod, "train");
        assert_eq!(
            whole.dra.expect("claim labels").pairs(),
            [
                ("dra_claim_name", "whole"),
                ("dra_claim_namespace", "ml"),
                ("dra_device_name", "gpu-1"),
                ("dra_driver_name", "gpu.nvidia.com"),
                ("dra_pool_name", "node-a"),
            ]
        );
        let mig = held(2);
        assert_eq!(&*mig.pod, "serve");
        assert_eq!(
            mig.dra.expect("claim labels").pairs(),
            [
                ("dra_claim_name", "slice"),
                ("dra_claim_namespace", "ml"),
                ("dra_device_name", "gpu-0-mig-1g10gb-19-4"),
                ("dra_driver_name", "gpu.nvidia.com"),
                ("dra_mig_device_uuid", M1),
                ("dra_mig_profile", "1g.10gb"),
                ("dra_pool_name", "node-a"),
            ]
        );
        // A device-plugin allocation gets no claim labels.
        assert_eq!(held(3).dra, None);
        assert!(
            h.allocations
                .iter()
                .any(|(e, holder)| *e == 2 && holder.dra.is_some())
        );
    }

    #[test]
    fn proportional_shares_sum_to_the_total() {
        assert_eq!(split_proportional(90, &[3, 1], 4), (vec![68, 22], 0));
        assert_eq!(split_proportional(90, &[3, 1], 5), (vec![54, 18], 18));
        assert_eq!(split_proportional(10, &[1, 1, 1], 3), (vec![4, 3, 3], 0));
        assert_eq!(split_proportional(50, &[0, 0], 0), (vec![0, 0], 50));
        // 2/3 and 4/3: the extra unit goes to the larger fraction (0.67), not to the
        // larger share.
        assert_eq!(split_proportional(2, &[1, 2], 3), (vec![1, 1], 0));
        assert_eq!(split_owned(1000, &[300, 200]), (vec![300, 200], 500));
        assert_eq!(split_owned(100, &[300, 100]), (vec![75, 25], 0));
    }

    proptest! {
        #[test]
        fn shares_always_sum_exactly(total in 0i64..1_000_000, weights in proptest::collection::vec(0u64..10_000, 0..12), extra in 0u64..10_000) {
            let all: u64 = weights.iter().sum::<u64>() + extra;
            let (shares, rest) = split_proportional(total, &weights, all);
            prop_assert_eq!(shares.iter().sum::<i64>() + rest, total);
            prop_assert!(shares.iter().all(|s| *s >= 0) && rest >= 0);
            if extra == 0 && weights.iter().any(|w| *w > 0) {
                prop_assert_eq!(rest, 0);
            }
            // Largest remainder: a share rounded up never has a smaller fraction than
            // one rounded down.
            if all > 0 && total > 0 {
                let exact = |w: u64| (total as u128 * u128::from(w), u128::from(all));
                let up: Vec<bool> = weights
                    .iter()
                    .zip(&shares)
                    .map(|(w, s)| { let (n, d) = exact(*w); *s as u128 > n / d })
                    .collect();
                for (i, wi) in weights.iter().enumerate() {
                    for (j, wj) in weights.iter().enumerate() {
                        if up[i] && !up[j] {
                            let ((ni, d), (nj, _)) = (exact(*wi), exact(*wj));
                            prop_assert!(ni % d >= nj % d, "{:?} for {:?}", shares, weights);
                        }
                    }
                }
            }
            let (owned, rest) = split_owned(total, &weights);
            prop_assert_eq!(owned.iter().sum::<i64>() + rest, total);
            prop_assert!(owned.iter().all(|s| *s >= 0) && rest >= 0);
        }
    }
}
