use super::*;

#[test]
fn gpus_and_mig_instances_that_come_or_go_are_rediscovered_on_the_next_cycle_only() {
    let source = Reshaping::default();
    source.set(vec![gpu(0)]);
    let mut s = rate_sampler(&source);
    for _ in 0..5 {
        s.cycle();
    }
    // Nothing changed: the one discovery at start.
    assert_eq!(source.discoveries.load(Ordering::SeqCst), 1);
    let generation = s.devices.as_ref().unwrap().generation;

    source.set(vec![gpu(0), mig(0, 7, "MIG-a")]);
    let snap = s.cycle();
    assert_eq!(names(&snap, &s), ["GPU-0", "MIG-a"]);
    // Attribution caches keyed by generation see a new inventory.
    assert!(s.devices.as_ref().unwrap().generation > generation);

    source.set(vec![gpu(0), gpu(1)]);
    let snap = s.cycle();
    assert_eq!(names(&snap, &s), ["GPU-0", "GPU-1"]);
    assert_eq!(source.discoveries.load(Ordering::SeqCst), 3);
    for _ in 0..3 {
        s.cycle();
    }
    assert_eq!(source.discoveries.load(Ordering::SeqCst), 3);
}

#[test]
fn a_device_that_replaces_another_at_the_same_index_starts_fresh() {
    let source = Reshaping::default();
    source.set(vec![gpu(0)]);
    let mut s = rate_sampler(&source);
    let rate = 0;
    s.cycle();
    // The second reading gives the rate.
    assert!(s.cycle().value(0, rate).is_some());
    // Another GPU at index 0 (a MIG instance created again with the same GI is
    // the same case: a new UUID at the same place).
    let mut other = gpu(0);
    other.uuid = "GPU-other".into();
    source.set(vec![other]);
    let snap = s.cycle();
    assert_eq!(names(&snap, &s), ["GPU-other"]);
    // Its first reading has no rate: the old GPU's last reading is not its own.
    assert_eq!(snap.value(0, rate), None);
    assert!(s.cycle().value(0, rate).is_some());
}

#[test]
fn a_node_whose_driver_lists_no_gpu_is_not_ready_until_gpus_appear() {
    let source = Reshaping::default();
    let mut s = rate_sampler(&source);
    let store = Arc::new(SnapshotStore::new(Snapshot::empty(
        Arc::new(ExportPlan::default()),
        "".into(),
    )));
    let state =
        crate::serving::http::AppState::new(store.clone(), Duration::from_secs(3600), false);
    for _ in 0..3 {
        store.store(Arc::new(s.cycle()));
        let why = state.readiness(Instant::now()).unwrap_err().to_string();
        assert!(why.contains("no GPU"), "{why}");
    }
    source.set(vec![gpu(0)]);
    store.store(Arc::new(s.cycle()));
    assert_eq!(state.readiness(Instant::now()), Ok(()));
    assert_eq!(store.load().entities.len(), 1);
}

#[test]
fn rediscovery_names_the_gpus_and_mig_instances_that_came_and_went() {
    let inv = |entities| Inventory {
        driver_version: "1".into(),
        nvml_version: "1".into(),
        entities,
    };
    let (added, removed) = inventory_changes(
        &inv(vec![gpu(0), mig(0, 7, "MIG-old")]),
        &inv(vec![gpu(0), gpu(1), mig(0, 7, "MIG-new")]),
    );
    assert_eq!(added.len(), 2, "{added:?}");
    assert!(added[0].contains("GPU-1") && added[1].contains("MIG-new"));
    assert_eq!(removed.len(), 1);
    assert!(removed[0].contains("MIG-old"));
}

#[test]
fn a_down_driver_is_probed_every_cycle_and_discovered_on_the_first_passing_probe() {
    let source = Scripted::default();
    let mut s = sampler(&source);
    for _ in 0..10 {
        assert!(!s.cycle().source_up);
    }
    // One discovery at start; after that only the cheap probe, once per cycle.
    assert_eq!(source.discoveries.load(Ordering::SeqCst), 1);
    assert_eq!(source.probes.load(Ordering::SeqCst), 9);
    source.probe_up.store(true, Ordering::SeqCst);
    source.discover_up.store(true, Ordering::SeqCst);
    assert!(
        s.cycle().source_up,
        "back on the first cycle after the driver"
    );
    assert_eq!(source.discoveries.load(Ordering::SeqCst), 2);
    // Up again: no more probes.
    assert!(s.cycle().source_up);
    assert_eq!(source.probes.load(Ordering::SeqCst), 10);
}

#[test]
fn a_probe_that_passed_before_a_failed_discovery_is_not_trusted_again() {
    let source = Scripted::default();
    source.probe_up.store(true, Ordering::SeqCst);
    let mut s = sampler(&source);
    for _ in 0..10 {
        assert!(!s.cycle().source_up);
    }
    // The start, then the one discovery the first probe let through; then nothing
    // until the backoff comes due, instead of a full discovery every cycle.
    assert_eq!(source.discoveries.load(Ordering::SeqCst), 2);
    assert_eq!(source.probes.load(Ordering::SeqCst), 1);
}
