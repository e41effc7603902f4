//! The protobuf exposition format end to end: the real exporter on the golden-file node
//! serves the same series as its text format, decoded with the generated prost types;
//! and a real Prometheus with native histograms negotiates protobuf and ingests them.

use e2e_tests::{
    Exporter, Prometheus, get_raw, golden_node_exporter, query_value, text_series, wait_for,
};
use gpu_exporter::encode::protobuf::{self, proto};
use std::io::Read;
use std::time::Duration;

/// What Prometheus 3 sends with `scrape_native_histograms: true`.
const PROMETHEUS_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";

/// Self-metrics whose values change from one scrape or cycle to the next.
const VOLATILE: &[&str] = &[
    "gpu_exporter_last_sample_timestamp_seconds",
    "gpu_exporter_sample_duration_seconds",
    "gpu_exporter_samples_total",
    "gpu_exporter_scrape_duration_seconds_bucket{",
    "gpu_exporter_scrape_duration_seconds_sum",
    "gpu_exporter_scrape_duration_seconds_count",
];

/// The body's families, checking the response is the delimited protobuf format.
fn scrape_protobuf(exporter: &Exporter, gzip: bool) -> Vec<proto::MetricFamily> {
    let mut headers = vec![("Accept", PROMETHEUS_ACCEPT)];
    if gzip {
        headers.push(("Accept-Encoding", "gzip"));
    }
    let resp = get_raw(&exporter.url("/metrics"), &headers);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.content_type.as_deref(), Some(protobuf::CONTENT_TYPE));
    let body = if gzip {
        assert_eq!(resp.content_encoding.as_deref(), Some("gzip"));
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(resp.body.as_slice())
            .read_to_end(&mut plain)
            .expect("valid gzip");
        plain
    } else {
        assert_eq!(resp.content_encoding, None);
        resp.body
    };
    protobuf::decode(&body).expect("delimited MetricFamily messages")
}

/// Same series in the same order, with the same values except the volatile ones.
fn assert_same_series(text: &str, families: &[proto::MetricFamily]) {
    let want = text_series(text);
    let got = protobuf::series_text(families);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.0, g.0, "series {i}");
        if !VOLATILE.iter().any(|v| w.0.starts_with(v)) {
            assert_eq!(w.1.to_bits(), g.1.to_bits(), "{}: {} vs {}", w.0, w.1, g.1);
        }
    }
    assert_eq!(want.len(), got.len(), "series count");
}

#[test]
fn protobuf_scrapes_carry_the_text_series_and_values() {
    let exporter = golden_node_exporter(&[]);
    let text = exporter.metrics_after_samples(3);
    for gzip in [false, true] {
        let families = scrape_protobuf(&exporter, gzip);
        assert_same_series(&text, &families);
    }
    let families = scrape_protobuf(&exporter, false);
    // Label values are raw in protobuf: the golden process name has quotes.
    let process = families
        .iter()
        .find(|f| f.name() == "gpu_exporter_process_memory_used_bytes")
        .expect("process family");
    assert!(process.metric.iter().any(|m| {
        m.label
            .iter()
            .any(|l| l.name() == "process_name" && l.value() == "python3 \"eval\"")
    }));
    // dcgm's counters keep their names and are counters.
    let energy = families
        .iter()
        .find(|f| f.name() == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        .expect("energy family");
    assert_eq!(energy.r#type(), proto::MetricType::Counter);
    // Text is still the default, and OpenMetrics still served when asked for.
    let plain = get_raw(&exporter.url("/metrics"), &[]);
    assert!(
        plain
            .content_type
            .is_some_and(|t| t.starts_with("text/plain"))
    );
    let om = get_raw(
        &exporter.url("/metrics"),
        &[("Accept", "application/openmetrics-text;version=1.0.0")],
    );
    assert!(
        om.content_type
            .is_some_and(|t| t.starts_with("application/openmetrics-text"))
    );
}

#[test]
fn prometheus_with_native_histograms_negotiates_protobuf() {
    let exporter = golden_node_exporter(&[("RUST_LOG", "info,gpu_exporter::serving::http=debug")]);
    let text = exporter.metrics_after_samples(3);
    let target = exporter.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&[("pb", &target, "    scrape_native_histograms: true\n")]);

    // Every sample of a scrape is ingested: as many as the text body has lines.
    let series = text_series(&text).len();
    wait_for(
        "a whole protobuf scrape ingested",
        Duration::from_secs(60),
        || {
            let r = prom.query("scrape_samples_scraped{job=\"pb\"}");
            (r.len() == 1 && query_value(&r[0]) == series as f64).then_some(())
        },
    );
    // The exporter says which format it served.
    let served = exporter.process.log();
    assert!(
        served
            .lines()
            .any(|l| l.contains("served /metrics") && l.contains("protobuf")),
        "no protobuf scrape in the log:\n{served}"
    );

    let power = text_series(&text)
        .into_iter()
        .filter(|(s, _)| s.starts_with("DCGM_FI_DEV_POWER_USAGE{"))
        .collect::<Vec<_>>();
    let count = prom.query("count(DCGM_FI_DEV_POWER_USAGE{job=\"pb\"})");
    assert_eq!(query_value(&count[0]), power.len() as f64);
    let gpu0 = prom.query("DCGM_FI_DEV_POWER_USAGE{job=\"pb\",gpu=\"0\"}");
    let want = power
        .iter()
        .find(|(s, _)| s.starts_with("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\","))
        .expect("GPU 0 power")
        .1;
    assert_eq!(query_value(&gpu0[0]), want);
    // Raw label values arrive intact; dcgm's counter names stay; the histogram is whole.
    assert!(
        !prom
            .query(r#"gpu_exporter_process_memory_used_bytes{process_name="python3 \"eval\""}"#)
            .is_empty()
    );
    assert!(
        !prom
            .query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{job=\"pb\"}")
            .is_empty()
    );
    let buckets = prom.query("gpu_exporter_scrape_duration_seconds_bucket{job=\"pb\"}");
    assert_eq!(
        buckets.len(),
        gpu_exporter::encode::SCRAPE_BUCKETS.len() + 1
    );
    assert!(buckets.iter().any(|b| b["metric"]["le"] == "+Inf"));
}
