//! The Prometheus HTTP API's instant-query answer, as a `promql:` signal reads it
//! (`--signal NS/NAME=promql:QUERY`): decoded sample by sample by the Prometheus
//! source's decoder, summed, or a scalar read.
//! Invariant: a value read is finite.
//! Kept thin: it calls the adapter's current entry point only.
#![no_main]

use gpu_metrics_adapter::fuzzing::signal_value;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    if let Ok(value) = signal_value(body) {
        assert!(value.is_finite(), "{value}");
    }
});
