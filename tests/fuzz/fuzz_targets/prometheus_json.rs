//! The Prometheus HTTP API's instant-query answers, as the adapter's Prometheus source
//! reads them through one round (decode each query's answer, per-pod rows, freshness).
//! Input: the answers of the round's queries, in order, separated by 0xFF bytes (the
//! last query's answer, usually the pods' sample times, is the rest).
//! Kept thin: it calls the adapter's current entry point only.
#![no_main]

use gpu_metrics_adapter::fuzzing::prometheus_round;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

/// When the round runs: shortly after the seeds were recorded.
const NOW_UNIX: f64 = 1_795_620_500.0;

fuzz_target!(|data: &[u8]| {
    let bodies: Vec<&[u8]> = data.split(|&b| b == 0xFF).collect();
    let staleness = Duration::from_secs(3600);
    // The adapter's default series and pod budgets.
    let (max_series, max_pods) = (200_000, 100_000);
    let round = prometheus_round(&bodies, NOW_UNIX, staleness, max_series, max_pods);
    if let Ok(fleet) = round {
        assert!(fleet.pods.len() <= max_pods);
        for observed in fleet.pods.values() {
            assert!(observed.at.duration_since(std::time::UNIX_EPOCH).is_ok());
            assert!(observed.values.values.values().all(|v| v.is_finite() && *v >= 0.0));
        }
    }
});
