//! `/readyz` tells the truth: 503 while the GPU source stops answering (errors or
//! hangs), 200 again once it recovers; `/healthz` stays 200 and `/metrics` keeps
//! answering, without serving stale GPU readings as current.

use e2e_tests::{Exporter, get, sample_value, samples, wait_for};
use std::time::{Duration, Instant};

fn ready(e: &Exporter) -> u16 {
    get(&e.url("/readyz")).0
}

#[test]
fn readyz_follows_a_driver_outage_and_recovery() {
    let e = Exporter::start(
        &["--simulate=tests/fixtures/driver-outage.toml", "-c", "200"],
        &[],
    );
    wait_for("ready", Duration::from_secs(10), || {
        (ready(&e) == 200).then_some(())
    });
    assert_eq!(samples(&e.metrics(), "DCGM_FI_DEV_GPU_UTIL").len(), 1);

    wait_for(
        "not ready during the outage",
        Duration::from_secs(10),
        || (ready(&e) == 503).then_some(()),
    );
    let (status, body) = get(&e.url("/readyz"));
    assert_eq!(status, 503);
    assert!(body.contains("old"), "{body}");
    assert_eq!(
        get(&e.url("/healthz")).0,
        200,
        "the process itself is alive"
    );
    let during = e.metrics();
    assert_eq!(sample_value(&during, "gpu_exporter_source_up"), Some(0.0));
    assert!(
        samples(&during, "DCGM_FI_DEV_GPU_UTIL").is_empty(),
        "no GPU data while the driver is down"
    );

    wait_for(
        "ready again after recovery",
        Duration::from_secs(20),
        || (ready(&e) == 200).then_some(()),
    );
    let after = e.metrics();
    assert_eq!(sample_value(&after, "gpu_exporter_source_up"), Some(1.0));
    assert_eq!(samples(&after, "DCGM_FI_DEV_GPU_UTIL").len(), 1);
    assert!(sample_value(&after, "gpu_exporter_sample_failures_total").is_some_and(|v| v >= 1.0));
    assert!(
        e.process.log().contains("GPU driver is not answering"),
        "{}",
        e.process.log()
    );
}

#[test]
fn readyz_fails_while_the_driver_hangs_and_metrics_stay_fast() {
    let e = Exporter::start(
        &["--simulate=tests/fixtures/driver-hang.toml", "-c", "200"],
        &[],
    );
    wait_for("ready", Duration::from_secs(10), || {
        (ready(&e) == 200).then_some(())
    });
    wait_for(
        "not ready while a call hangs",
        Duration::from_secs(10),
        || (ready(&e) == 503).then_some(()),
    );
    // The sampler is stuck inside a call; scrapes must not wait for it, nor show its
    // last readings as if they were current.
    let started = Instant::now();
    let body = e.metrics();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "scrape blocked for {:?}",
        started.elapsed()
    );
    assert!(
        samples(&body, "DCGM_FI_DEV_GPU_UTIL").is_empty(),
        "stale readings served:\n{body}"
    );
    assert!(sample_value(&body, "gpu_exporter_last_sample_timestamp_seconds").is_some());
    wait_for("ready after the hang", Duration::from_secs(20), || {
        (ready(&e) == 200).then_some(())
    });
    assert_eq!(samples(&e.metrics(), "DCGM_FI_DEV_GPU_UTIL").len(), 1);
}
