//! An exporter's scrape in the Prometheus protobuf exposition (length-delimited
//! `MetricFamily` messages), as the adapter's direct source decodes it, then derives
//! per-pod values from it.
//! Invariant: only the wanted families come out.
//! Kept thin: it calls the adapter's current entry points only.
#![no_main]

use gpu_metrics_adapter::source::derive::{FAMILIES, pod_values};
use gpu_metrics_adapter::source::exposition::{ACCEPT, decode};
use libfuzzer_sys::fuzz_target;

/// A small series cap, so the fuzzer reaches the refusal.
const MAX_SERIES: usize = 64;

fuzz_target!(|body: &[u8]| {
    if let Ok(series) = decode(ACCEPT, body, MAX_SERIES) {
        assert!(series.len() <= MAX_SERIES);
        for s in &series {
            assert!(FAMILIES.contains(&s.name.as_str()), "{}", s.name);
        }
        let _ = pod_values(&series);
    }
});
