//! Read periods on the real NVML path (the fake library, real clock): the energy
//! counter read every 3 s of a 0.5 s cycle is served as steps that stay monotone, and a
//! real Prometheus' `rate()` over the served series equals the simulated truth (the
//! scenario's power, from gpu-sim) within the error a step of one period can make.

use e2e_tests::{Exporter, Prometheus, fake_nvml, fixture, wait_for};
use std::time::Duration;

const SCENARIO: &str = "cadence-node.toml";
const ENERGY: &str = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION";
/// The energy counter's read period under test, and the exporter's interval.
const PERIOD_S: f64 = 3.0;
const INTERVAL_MS: &str = "500";
/// The rate() window: long next to the period, so a step moves it little.
const WINDOW_S: f64 = 60.0;

/// The truth: each GPU's energy growth in mJ/s, from the simulator over 100 s.
fn true_rates() -> Vec<f64> {
    let s = gpu_sim::Scenario::load(&fixture(SCENARIO)).expect("scenario");
    let node = gpu_sim::SimNode::new(&s, std::time::SystemTime::now());
    (0..node.gpus.len() as u32)
        .map(|i| {
            let (a, b) = (node.gpu_reading(i, 50.0), node.gpu_reading(i, 150.0));
            (b.energy_mj - a.energy_mj) as f64 / 100.0
        })
        .collect()
}

fn by_gpu(result: &[serde_json::Value]) -> Vec<(usize, f64)> {
    let mut v: Vec<(usize, f64)> = result
        .iter()
        .map(|s| {
            let gpu = s["metric"]["gpu"]
                .as_str()
                .expect("gpu")
                .parse()
                .expect("index");
            let value = s["value"][1]
                .as_str()
                .expect("value")
                .parse()
                .expect("number");
            (gpu, value)
        })
        .collect();
    v.sort_by_key(|(g, _)| *g);
    v
}

#[test]
fn rate_over_a_counter_read_every_period_equals_the_simulated_truth() {
    let lib = fake_nvml();
    let scenario = fixture(SCENARIO);
    let periods = format!("{ENERGY}={PERIOD_S}s");
    let e = Exporter::start(
        &[
            "--nvml-lib",
            lib.to_str().expect("utf-8 path"),
            "-c",
            INTERVAL_MS,
            "--field-periods",
            &periods,
        ],
        &[("GPU_SIM_SCENARIO", scenario.to_str().expect("utf-8 path"))],
    );
    let target = e.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("cadence", &target, "")]);
    let truth = true_rates();
    assert!(truth.iter().all(|r| *r > 0.0), "{truth:?}");
    // Series older than the window (one that starts inside it makes rate() extrapolate
    // less than the window, a bias of Prometheus', not the exporter's).
    let query = format!("rate({ENERGY}[{WINDOW_S}s])");
    let older = WINDOW_S + 5.0;
    let rates = wait_for(
        "series older than the window",
        Duration::from_secs(240),
        || {
            let covered = by_gpu(&prom.query(&format!("count_over_time({ENERGY}[{older}s])")));
            (covered.len() == truth.len() && covered.iter().all(|(_, n)| *n >= older - 2.0))
                .then(|| by_gpu(&prom.query(&query)))
        },
    );
    // A served value was read less than a period and a cycle before the scrape, so the
    // first and last samples of the window lag the truth by 0 to that much each, and
    // rate() is off by at most their difference over the window's span (a scrape
    // interval shorter than the window).
    let tolerance = (PERIOD_S + 0.5 + 1.0) / (WINDOW_S - 1.0);
    println!("rate() {rates:?}, truth {truth:?}, tolerance {tolerance:.3}");
    assert_eq!(rates.len(), truth.len());
    for ((gpu, got), want) in rates.iter().zip(&truth) {
        let off = (got - want).abs() / want;
        assert!(
            off <= tolerance,
            "GPU {gpu}: rate() {got} mJ/s, truth {want} mJ/s ({off:.3} off)"
        );
    }
    // Monotone: no counter reset in the served series.
    let resets = by_gpu(&prom.query(&format!("resets({ENERGY}[{WINDOW_S}s])")));
    assert!(resets.iter().all(|(_, n)| *n == 0.0), "{resets:?}");
    // And read at its period, not every cycle: the served value changes at most once a
    // period (every cycle it would change at each 1 s scrape).
    let changes = by_gpu(&prom.query(&format!("changes({ENERGY}[{WINDOW_S}s])")));
    let most = (WINDOW_S / PERIOD_S).ceil() + 1.0;
    assert!(
        changes.iter().all(|(_, n)| *n <= most),
        "{changes:?} (at most {most})"
    );
}
