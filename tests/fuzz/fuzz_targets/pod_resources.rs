//! The kubelet's PodResources `List` answer, decoded from bytes as tonic would, turned
//! into GPU allocations and matched against a node's inventory (the GPUs and MIG
//! instances of tests/fixtures/pods-node.toml, as gpu-sim names them).
//! Invariants: allocations come out sorted and without duplicates; every allocation
//! whose pod may be labelled either lands on an entity or is reported unmapped; one
//! holding per entity; a cached second resolve gives the same holdings.
#![no_main]

use gpu_exporter::attribution::assign::{Holding, Holdings, ResolveCache};
use gpu_exporter::attribution::kubelet::{allocations, proto::ListPodResourcesResponse};
use gpu_exporter::attribution::pods::PodDirectory;
use gpu_exporter::source::{EntityInfo, Inventory, MigInfo};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::sync::LazyLock;

fn gpu(index: u32, uuid: &str) -> EntityInfo {
    EntityInfo {
        gpu_index: index,
        uuid: uuid.into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", index + 1),
        model_name: "NVIDIA H100 80GB HBM3".into(),
        // Minor numbers that are not the indices, as on real nodes (DRA names use them).
        minor_number: Some(index ^ 1),
        mig: None,
        labels: Default::default(),
        lost: false,
    }
}

/// A MIG instance of the GPU at entity `parent`.
fn mig(parent: (usize, &EntityInfo), gpu_instance_id: u32, slot: u32, uuid: &str) -> EntityInfo {
    let (parent, gpu) = parent;
    EntityInfo {
        mig: Some(MigInfo {
            parent,
            gpu_instance_id,
            compute_instance_id: 0,
            slot,
            profile: "1g.10gb".into(),
            mig_uuid: uuid.into(),
            placement: None,
        }),
        ..gpu.clone()
    }
}

static INVENTORY: LazyLock<Inventory> = LazyLock::new(|| {
    let gpu2 = gpu(2, "GPU-c69b5336-6a11-f54e-5f15-ee2bde1e8519");
    Inventory {
        driver_version: "580.82.07".into(),
        nvml_version: "13.580.82.07".into(),
        entities: vec![
            gpu(0, "GPU-a9df47ee-b6ab-c07a-6e63-fd1369c28af5"),
            gpu(1, "GPU-65ae9485-bde6-8f64-dd3f-b67e29638e1e"),
            gpu2.clone(),
            mig((2, &gpu2), 1, 0, "MIG-c07227be-dbd7-c909-00f5-6cbb3adde4d5"),
            mig((2, &gpu2), 2, 1, "MIG-c07227be-dbd7-c909-1a1b-28e708a5719a"),
            mig((2, &gpu2), 3, 2, "MIG-c07227be-dbd7-c909-ba6d-187fd50d0428"),
            mig((2, &gpu2), 4, 3, "MIG-c07227be-dbd7-c909-78ed-3679cfdb405d"),
            gpu(3, "GPU-b7eb2f81-3329-de7d-0d6d-9cfeb04db5a5"),
            gpu(4, "GPU-f1de361b-268c-cdeb-2ed3-bf161330fa9b"),
            gpu(5, "GPU-4a1d1c84-bc3d-4cdc-4ebd-dd3b5049acb4"),
        ],
    }
});

fuzz_target!(|data: &[u8]| {
    let Ok(response) = ListPodResourcesResponse::decode(data) else {
        return;
    };
    let extra = vec!["example.com/gpu".to_owned()];
    let (allocated, _unparsed) = allocations(&response, &extra);
    for pair in allocated.windows(2) {
        let key = |a: &gpu_exporter::attribution::kubelet::Allocation| {
            (
                a.namespace.clone(),
                a.pod.clone(),
                a.container.clone(),
                a.resource.clone(),
            )
        };
        assert!(key(&pair[0]) <= key(&pair[1]), "allocations out of order");
        assert_ne!(pair[0], pair[1], "duplicate allocation");
    }

    let inventory = &*INVENTORY;
    let pods = PodDirectory::default();
    let mut cache = ResolveCache::new(inventory);
    let holdings = Holdings::resolve(inventory, &allocated, &pods, &mut cache);
    assert_eq!(holdings.per_entity.len(), inventory.entities.len());
    let placed = |a: &gpu_exporter::attribution::kubelet::Allocation| {
        holdings.allocations.iter().any(|(_, h)| {
            h.namespace == a.namespace
                && h.pod == a.pod
                && h.container.as_deref() == Some(&*a.container)
        })
    };
    if !allocated.iter().all(placed) {
        assert!(!holdings.unmapped.is_empty(), "an allocation went nowhere");
    }
    for (entity, holding) in holdings.per_entity.iter().enumerate() {
        let holders = holdings
            .allocations
            .iter()
            .filter(|(e, _)| *e == entity)
            .count();
        match holding {
            Holding::Free => assert_eq!(holders, 0),
            Holding::Exclusive(_) => assert_eq!(holders, 1),
            Holding::Shared(pods) => assert!(!pods.is_empty() && pods.len() <= holders),
        }
    }
    let again = Holdings::resolve(inventory, &allocated, &pods, &mut cache);
    assert_eq!(again, holdings);
});
