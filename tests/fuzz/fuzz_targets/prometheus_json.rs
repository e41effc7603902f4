//! The Prometheus HTTP API's instant-query answer, as the adapter's Prometheus source
//! reads it, through one round (decode, join with `timestamp()`, per-pod values).
//! Input: a family selector byte, the family's answer, then optionally 0xFF and the
//! answer to its `timestamp()` query (else the same bytes).
//! Kept thin: it calls the adapter's current entry point only.
#![no_main]

use gpu_metrics_adapter::fuzzing::prometheus_round;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

/// When the round runs: shortly after the seeds were recorded.
const NOW_UNIX: f64 = 1_795_620_500.0;

fuzz_target!(|data: &[u8]| {
    let Some((&family, rest)) = data.split_first() else {
        return;
    };
    let (values, stamps) = match rest.iter().position(|&b| b == 0xFF) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, rest),
    };
    let staleness = Duration::from_secs(3600);
    // The adapter's default series and pod budgets.
    let (max_series, max_pods) = (200_000, 100_000);
    let round = prometheus_round(
        family.into(),
        values,
        stamps,
        NOW_UNIX,
        staleness,
        max_series,
        max_pods,
    );
    if let Ok(fleet) = round {
        assert!(fleet.pods.len() <= max_pods);
        for observed in fleet.pods.values() {
            assert!(observed.at.duration_since(std::time::UNIX_EPOCH).is_ok());
        }
    }
});
