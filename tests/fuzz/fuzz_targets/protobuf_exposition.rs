//! An exporter's scrape in the Prometheus protobuf exposition (length-delimited
//! `MetricFamily` messages), as the adapter's direct source decodes it, then derives
//! per-pod values from it.
//! Invariant: only the wanted families come out, each series within the label bound
//! and holding only the labels the derivation reads, whatever the fields' order.
//! Kept thin: it calls the adapter's current entry points only.
#![no_main]

use gpu_metrics_adapter::source::derive::{FAMILIES, LABELS, pod_values};
use gpu_metrics_adapter::source::exposition::{ACCEPT, decode};
use gpu_metrics_adapter::source::limits::MAX_LABELS_PER_SERIES;
use libfuzzer_sys::fuzz_target;

/// A small series cap, so the fuzzer reaches the refusal.
const MAX_SERIES: usize = 64;

fuzz_target!(|body: &[u8]| {
    if let Ok(decoded) = decode(ACCEPT, body, MAX_SERIES) {
        assert!(decoded.series.len() <= MAX_SERIES);
        for s in &decoded.series {
            assert!(FAMILIES.contains(&s.name.as_str()), "{}", s.name);
            assert!(s.labels.len() <= MAX_LABELS_PER_SERIES);
            assert!(s.labels.iter().all(|(k, _)| LABELS.contains(&k.as_str())));
        }
        let _ = pod_values(&decoded.series);
    }
});
