//! KEDA trigger metadata (`scalerMetadata` of an external-scaler trigger, or a
//! metrics-api request's query): one `key=value` per line.
//! Invariants: an accepted trigger has a finite target > 0 and a finite activation, and
//! its metadata written back canonically parses to the same trigger.
#![no_main]

use gpu_metrics_adapter::fuzzing::trigger_state;
use gpu_metrics_adapter::query::AppState;
use gpu_metrics_adapter::query::trigger::{Pods, Trigger, parse_trigger};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::sync::OnceLock;

fn state() -> &'static AppState {
    static STATE: OnceLock<AppState> = OnceLock::new();
    STATE.get_or_init(trigger_state)
}

fn metadata_of(t: &Trigger) -> HashMap<String, String> {
    let mut meta = HashMap::from([
        ("metric".to_owned(), t.metric.name().to_owned()),
        ("targetValue".to_owned(), t.target.to_string()),
        ("activationTargetValue".to_owned(), t.activation.to_string()),
        ("aggregation".to_owned(), t.aggregation.to_string()),
    ]);
    match &t.pods {
        Some(Pods::Selector(s)) => meta.insert("podSelector".to_owned(), s.to_string()),
        Some(Pods::Deployment(d)) => meta.insert("deployment".to_owned(), d.clone()),
        None => None,
    };
    meta
}

fuzz_target!(|text: &str| {
    let meta: HashMap<String, String> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let Ok(trigger) = parse_trigger(state(), "fuzz", &meta) else {
        return;
    };
    assert!(trigger.target.is_finite() && trigger.target > 0.0);
    assert!(trigger.activation.is_finite());
    let written = metadata_of(&trigger);
    let again = parse_trigger(state(), "fuzz", &written)
        .unwrap_or_else(|e| panic!("{written:?} (from {meta:?}) does not parse: {e}"));
    assert_eq!(metadata_of(&again), written);
});
