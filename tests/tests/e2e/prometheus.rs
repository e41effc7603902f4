//! A real Prometheus on loopback scrapes the simulated exporter (`builtin:default`: eight
//! GPUs, no pods), once in the default text format and once in OpenMetrics, and its
//! query API shows every GPU with dcgm-exporter's labels.

use e2e_tests::{Exporter, Prometheus, query_value, wait_for};
use std::collections::BTreeSet;
use std::time::Duration;

fn host_port(e: &Exporter) -> String {
    e.base.trim_start_matches("http://").to_string()
}

#[test]
fn prometheus_scrapes_all_eight_gpus_with_dcgm_labels() {
    let text = Exporter::start(&["--simulate=builtin:default", "-c", "500"], &[]);
    let om = Exporter::start(
        &["--simulate=builtin:default", "--openmetrics", "-c", "500"],
        &[],
    );
    let prom = Prometheus::start(&[
        ("text", &host_port(&text), ""),
        ("openmetrics", &host_port(&om), ""),
    ]);

    let series = wait_for(
        "8 GPU_UTIL series from the text job",
        Duration::from_secs(60),
        || {
            let r = prom.query("DCGM_FI_DEV_GPU_UTIL{job=\"text\"}");
            (r.len() == 8).then_some(r)
        },
    );
    let mut gpus = BTreeSet::new();
    for s in &series {
        let m = &s["metric"];
        let gpu = m["gpu"].as_str().expect("gpu label");
        gpus.insert(gpu.to_string());
        assert!(
            m["UUID"]
                .as_str()
                .is_some_and(|u| u.starts_with("GPU-") && u.len() == 40),
            "{m}"
        );
        assert_eq!(m["device"], format!("nvidia{gpu}"), "{m}");
        assert_eq!(m["modelName"], "NVIDIA H100 80GB HBM3", "{m}");
        assert_eq!(m["Hostname"], "e2e-node", "{m}");
        assert_eq!(m["DCGM_FI_DRIVER_VERSION"], "580.82.07", "{m}");
        assert!(
            m["pci_bus_id"]
                .as_str()
                .is_some_and(|p| p.starts_with("00000000:")),
            "{m}"
        );
        let v = query_value(s);
        assert!((0.0..=100.0).contains(&v), "{v}");
    }
    assert_eq!(gpus, (0..8).map(|i| i.to_string()).collect());

    // OpenMetrics: Prometheus negotiated it and sees counters with _total.
    let energy = wait_for(
        "OpenMetrics energy counters",
        Duration::from_secs(60),
        || {
            let r = prom.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total{job=\"openmetrics\"}");
            (r.len() == 8).then_some(r)
        },
    );
    assert_eq!(energy.len(), 8);
    // The text job keeps dcgm-exporter's counter name.
    assert_eq!(
        prom.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{job=\"text\"}")
            .len(),
        8
    );
    let up = prom.query("up");
    assert!(up.iter().all(|s| s["value"][1] == "1"), "{up:?}");
}

/// What Prometheus 2.42 sends without feature flags: OpenMetrics first, then text.
const PROMETHEUS_TEXT_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// The same with `--enable-feature=native-histograms`: protobuf first.
const PROMETHEUS_PROTOBUF_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// The first gzip member of `body` alone, decompressed.
fn first_member(body: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut out)
        .expect("a gzip member");
    out
}

/// Every gzip member of `body`, decompressed.
fn all_members(body: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(body)
        .read_to_end(&mut out)
        .expect("a gzip stream");
    out
}

/// Issue 16: a gzip body is the snapshot's cached gzip member followed by a small
/// per-scrape member (the scrape-duration histogram, then OpenMetrics' `# EOF`). Real
/// Prometheus, which always asks for gzip, reads such bodies whole in all three
/// formats: every sample of a scrape is ingested, device series and self-metrics from
/// the cached member and the histogram from the per-scrape one.
#[test]
fn prometheus_reads_two_member_gzip_bodies_in_every_format() {
    let env = [("RUST_LOG", "info,gpu_exporter::serving::http=debug")];
    let args = ["--simulate=builtin:default", "-c", "500"];
    let text = Exporter::start(&args, &env);
    let om = Exporter::start(&[&args[..], &["--openmetrics"]].concat(), &env);
    let pb = Exporter::start(&args, &env);

    // What each exporter answers Prometheus is two gzip members: the first alone holds
    // the devices and per-snapshot self-metrics but not the per-scrape histogram.
    for (exporter, accept, eof) in [
        (&text, PROMETHEUS_TEXT_ACCEPT, false),
        (&om, PROMETHEUS_TEXT_ACCEPT, true),
        (&pb, PROMETHEUS_PROTOBUF_ACCEPT, false),
    ] {
        exporter.metrics_after_samples(2);
        let (status, body, encoding) = e2e_tests::get_bytes_with(
            &exporter.url("/metrics"),
            &[("Accept", accept), ("Accept-Encoding", "gzip")],
        );
        assert_eq!((status, encoding.as_deref()), (200, Some("gzip")));
        let whole = all_members(&body);
        let first = first_member(&body);
        let has = |b: &[u8], what: &[u8]| b.windows(what.len()).any(|w| w == what);
        assert!(first.len() < whole.len() && whole.starts_with(&first));
        for part in [&first, &whole] {
            assert!(has(part, b"DCGM_FI_DEV_GPU_UTIL") && has(part, b"gpu_exporter_build_info"));
        }
        assert!(!has(&first, b"gpu_exporter_scrape_duration_seconds"));
        assert!(has(&whole, b"gpu_exporter_scrape_duration_seconds"));
        assert_eq!(whole.ends_with(b"# EOF\n"), eof);
    }

    let prom_text = Prometheus::start(&[
        ("text", &host_port(&text), ""),
        ("openmetrics", &host_port(&om), ""),
    ]);
    let prom_pb = Prometheus::start_with_args(
        &[("pb", &host_port(&pb), "")],
        &["--enable-feature=native-histograms"],
    );
    for (prom, job, exporter) in [
        (&prom_text, "text", &text),
        (&prom_text, "openmetrics", &om),
        (&prom_pb, "pb", &pb),
    ] {
        // Every sample of a scrape ingested: as many as the text body has lines.
        let series = e2e_tests::text_series(&exporter.metrics()).len() as f64;
        wait_for(
            &format!("a whole gzip scrape ingested by job {job}"),
            Duration::from_secs(60),
            || {
                let r = prom.query(&format!("scrape_samples_scraped{{job=\"{job}\"}}"));
                (r.len() == 1 && query_value(&r[0]) == series).then_some(())
            },
        );
        assert_eq!(
            prom.query(&format!("DCGM_FI_DEV_GPU_UTIL{{job=\"{job}\"}}"))
                .len(),
            8
        );
        let build = prom.query(&format!("gpu_exporter_build_info{{job=\"{job}\"}}"));
        assert_eq!(build.len(), 1, "{job}");
        assert_eq!(query_value(&build[0]), 1.0);
        // The per-scrape member: the histogram counts the scrapes before each one, so
        // it grows between two of Prometheus's scrapes.
        let count = format!("gpu_exporter_scrape_duration_seconds_count{{job=\"{job}\"}}");
        let before = query_value(&prom.query(&count)[0]);
        wait_for(
            &format!("job {job}'s scrape count to grow"),
            Duration::from_secs(30),
            || (query_value(prom.query(&count).first()?) > before).then_some(()),
        );
        let up = prom.query(&format!("up{{job=\"{job}\"}}"));
        assert_eq!(query_value(&up[0]), 1.0, "{job}");
    }
    // Every exporter served Prometheus gzip, in the format its job negotiated.
    for (exporter, format) in [(&text, "text"), (&om, "openmetrics"), (&pb, "protobuf")] {
        let log = exporter.process.log();
        assert!(
            log.lines().any(|l| l.contains("served /metrics")
                && l.contains(&format!("format=\"{format}\""))
                && l.contains("gzip=true")),
            "no gzip {format} scrape in the log:\n{log}"
        );
    }
}
