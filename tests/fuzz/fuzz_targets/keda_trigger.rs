//! KEDA trigger metadata (`scalerMetadata` of an external-scaler trigger, or a
//! metrics-api request's query): one `key=value` per line.
//! Invariants: an accepted trigger has a finite target > 0 and a finite activation, and
//! its metadata written back canonically parses to the same trigger.
#![no_main]

use gpu_metrics_adapter::query::trigger::{Aggregation, Pods, Trigger, parse_trigger};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fn metadata_of(t: &Trigger) -> HashMap<String, String> {
    let aggregation = match t.aggregation {
        Aggregation::Sum => "sum",
        Aggregation::Average => "average",
        Aggregation::Max => "max",
        Aggregation::Min => "min",
    };
    let pods = match &t.pods {
        Pods::Selector(s) => ("podSelector", s.to_string()),
        Pods::Deployment(d) => ("deployment", d.clone()),
    };
    HashMap::from([
        ("metric".to_owned(), t.metric.name().to_owned()),
        ("targetValue".to_owned(), t.target.to_string()),
        ("activationTargetValue".to_owned(), t.activation.to_string()),
        ("aggregation".to_owned(), aggregation.to_owned()),
        (pods.0.to_owned(), pods.1),
    ])
}

fuzz_target!(|text: &str| {
    let meta: HashMap<String, String> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let Ok(trigger) = parse_trigger(&meta) else {
        return;
    };
    assert!(trigger.target.is_finite() && trigger.target > 0.0);
    assert!(trigger.activation.is_finite());
    let written = metadata_of(&trigger);
    let again = parse_trigger(&written)
        .unwrap_or_else(|e| panic!("{written:?} (from {meta:?}) does not parse: {e}"));
    assert_eq!(metadata_of(&again), written);
});
