//! A real Prometheus on loopback scrapes the simulated exporter (`builtin:default`: eight
//! GPUs, no pods), once in the default text format and once in OpenMetrics, and its
//! query API shows every GPU with dcgm-exporter's labels.

use e2e_tests::{Exporter, Prometheus, query_value, wait_for};
use std::collections::{BTreeMap, BTreeSet};
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

/// What Prometheus 3 sends by default: OpenMetrics first, then text.
const PROMETHEUS_TEXT_ACCEPT: &str = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.7,application/openmetrics-text;version=0.0.1;q=0.6,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.3";
/// The same with `scrape_native_histograms: true`: protobuf first.
const PROMETHEUS_PROTOBUF_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";

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
    let prom_pb = Prometheus::start(&[("pb", &host_port(&pb), NATIVE_HISTOGRAMS)]);
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

/// A job's YAML for Prometheus 3 to scrape native histograms, which makes it ask for
/// protobuf first.
const NATIVE_HISTOGRAMS: &str = "    scrape_native_histograms: true\n";

fn value(sample: &serde_json::Value) -> f64 {
    sample["value"][1]
        .as_str()
        .expect("value")
        .parse()
        .expect("number")
}

// ---------------------------------------------------------------------------------
// Prometheus 3's scrape negotiation.

/// A series as a label map (`__name__` included), with `le` and `quantile` compared as
/// numbers: Prometheus 3 rewrites them in its own float syntax (`le="0.00005"` is stored
/// as `le="5e-05"`, `le="1"` as `le="1.0"`).
type Series = BTreeMap<String, String>;

/// `name{a="v",…}` as the text format (and [`protobuf::series_text`]) writes it.
fn parse_series(s: &str) -> Series {
    let (name, rest) = s.split_once('{').unwrap_or((s, "}"));
    let mut series = Series::from([("__name__".to_string(), name.to_string())]);
    let mut chars = rest.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let key = key.trim_start_matches(',');
        if key.is_empty() || key == "}" {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "{s}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => panic!("unterminated escape in {s}"),
                },
                c => value.push(c),
            }
        }
        series.insert(key.to_string(), value);
    }
    canonical(series)
}

fn canonical(mut series: Series) -> Series {
    for key in ["le", "quantile"] {
        if let Some(v) = series.get_mut(key) {
            let f: f64 = v.parse().unwrap_or_else(|e| panic!("{key}={v}: {e}"));
            *v = format!("{f:?}");
        }
    }
    series
}

/// Self-metrics whose values change from one scrape (or sampling cycle) to the next.
const VOLATILE: &[&str] = &[
    "gpu_exporter_last_sample_timestamp_seconds",
    "gpu_exporter_sample_duration_seconds",
    "gpu_exporter_samples_total",
    "gpu_exporter_scrape_duration_seconds_bucket",
    "gpu_exporter_scrape_duration_seconds_sum",
    "gpu_exporter_scrape_duration_seconds_count",
];

/// What the exporter serves in `format` (as the exporter's debug log names it).
fn served(exporter: &Exporter, format: &str) -> BTreeMap<Series, f64> {
    let accept = match format {
        "protobuf" => PROMETHEUS_PROTOBUF_ACCEPT,
        "openmetrics" => "application/openmetrics-text;version=1.0.0",
        _ => "text/plain;version=0.0.4",
    };
    let resp = e2e_tests::get_raw(&exporter.url("/metrics"), &[("Accept", accept)]);
    assert_eq!(resp.status, 200);
    let series = if format == "protobuf" {
        let families = gpu_exporter::encode::protobuf::decode(&resp.body).expect("protobuf");
        gpu_exporter::encode::protobuf::series_text(&families)
    } else {
        e2e_tests::text_series(&String::from_utf8(resp.body).expect("UTF-8"))
    };
    let n = series.len();
    let map: BTreeMap<Series, f64> = series
        .into_iter()
        .map(|(s, v)| (parse_series(&s), v))
        .collect();
    assert_eq!(map.len(), n, "a series served twice");
    map
}

/// The series Prometheus holds for `job`, without its own (`up`, `scrape_*`) and
/// without the target labels it adds (`job`, `instance`).
fn stored(prom: &Prometheus, job: &str) -> BTreeMap<Series, f64> {
    prom.query(&format!("{{job=\"{job}\"}}"))
        .iter()
        .filter_map(|s| {
            let mut series: Series = serde_json::from_value(s["metric"].clone()).expect("labels");
            let name = series.get("__name__")?;
            if name == "up" || name.starts_with("scrape_") {
                return None;
            }
            series.remove("job");
            series.remove("instance");
            Some((canonical(series), value(s)))
        })
        .collect()
}

/// One scrape job: its YAML, and the format the exporter must answer it in.
struct Negotiation {
    job: &'static str,
    yaml: &'static str,
    openmetrics: bool,
    format: &'static str,
}

const NEGOTIATIONS: &[Negotiation] = &[
    // Protobuf with native histograms on, alone and as Prometheus' proto-first default.
    // The exporter's one histogram is classic; Prometheus keeps its buckets.
    Negotiation {
        job: "proto",
        yaml: "    scrape_protocols: [PrometheusProto]\n    scrape_native_histograms: true\n",
        openmetrics: true,
        format: "protobuf",
    },
    Negotiation {
        job: "native_histograms",
        yaml: "    scrape_native_histograms: true\n",
        openmetrics: false,
        format: "protobuf",
    },
    Negotiation {
        job: "openmetrics",
        yaml: "    scrape_protocols: [OpenMetricsText1.0.0]\n",
        openmetrics: true,
        format: "openmetrics",
    },
    // OpenMetrics asked for but not enabled: the `*/*` Prometheus adds gets text.
    Negotiation {
        job: "openmetrics_off",
        yaml: "    scrape_protocols: [OpenMetricsText1.0.0]\n",
        openmetrics: false,
        format: "text",
    },
    Negotiation {
        job: "text_1_0_0",
        yaml: "    scrape_protocols: [PrometheusText1.0.0]\n",
        openmetrics: true,
        format: "text",
    },
    Negotiation {
        job: "text_0_0_4",
        yaml: "    scrape_protocols: [PrometheusText0.0.4]\n",
        openmetrics: true,
        format: "text",
    },
    // Text preferred to OpenMetrics, both served: the job's first choice.
    Negotiation {
        job: "text_first",
        yaml: "    scrape_protocols: [PrometheusText1.0.0, OpenMetricsText1.0.0]\n",
        openmetrics: true,
        format: "text",
    },
    // The fallback applies only to a missing or unknown Content-Type. The exporter's is
    // always one Prometheus knows, so a wrong fallback (OpenMetrics, which would reject
    // a text body without `# EOF`) is never used.
    Negotiation {
        job: "fallback",
        yaml: "    scrape_protocols: [PrometheusText0.0.4]\n    fallback_scrape_protocol: OpenMetricsText1.0.0\n",
        openmetrics: true,
        format: "text",
    },
    // Each UTF-8 escaping scheme (the `escaping=` of the 1.0.0 text formats' Accept):
    // every name the exporter writes is a legacy one, which no scheme changes.
    Negotiation {
        job: "escaping_allow_utf8",
        yaml: "    metric_name_validation_scheme: utf8\n    metric_name_escaping_scheme: allow-utf-8\n    scrape_protocols: [OpenMetricsText1.0.0]\n",
        openmetrics: true,
        format: "openmetrics",
    },
    Negotiation {
        job: "escaping_underscores",
        yaml: "    metric_name_validation_scheme: legacy\n    metric_name_escaping_scheme: underscores\n    scrape_protocols: [PrometheusText1.0.0]\n",
        openmetrics: true,
        format: "text",
    },
    Negotiation {
        job: "escaping_dots",
        yaml: "    metric_name_validation_scheme: legacy\n    metric_name_escaping_scheme: dots\n    scrape_protocols: [OpenMetricsText1.0.0]\n",
        openmetrics: true,
        format: "openmetrics",
    },
    Negotiation {
        job: "escaping_values",
        yaml: "    metric_name_validation_scheme: legacy\n    metric_name_escaping_scheme: values\n    scrape_protocols: [PrometheusText1.0.0]\n",
        openmetrics: true,
        format: "text",
    },
];

/// Prometheus 3 scraping the exporter under each `scrape_protocols`, the fallback
/// protocol and each name-escaping scheme: every job is answered in the format it asked
/// for first, and what Prometheus stored is what the exporter served, series for series
/// and value for value (self-metrics that move between scrapes: series only).
#[test]
fn prometheus_3_stores_what_the_exporter_serves_under_every_negotiation() {
    let env = [("RUST_LOG", "info,gpu_exporter::http=debug")];
    let args = [
        "--simulate=tests/fixtures/golden-node.toml",
        "-f",
        "tests/fixtures/all-fields.csv",
        "--process-metrics",
        "-c",
        "500",
    ];
    // One exporter a job, so that each one's log shows what its job was served.
    let exporters: Vec<Exporter> = NEGOTIATIONS
        .iter()
        .map(|n| {
            let om: &[&str] = if n.openmetrics {
                &["--openmetrics"]
            } else {
                &[]
            };
            Exporter::start(&[&args[..], om].concat(), &env)
        })
        .collect();
    let before: Vec<usize> = exporters
        .iter()
        .map(|e| {
            e.metrics_after_samples(2);
            e.process.log().len()
        })
        .collect();
    let targets: Vec<String> = exporters.iter().map(host_port).collect();
    let jobs: Vec<(&str, &str, &str)> = NEGOTIATIONS
        .iter()
        .zip(&targets)
        .map(|(n, t)| (n.job, t.as_str(), n.yaml))
        .collect();
    let prom = Prometheus::start(&jobs);

    for ((n, exporter), before) in NEGOTIATIONS.iter().zip(&exporters).zip(before) {
        let job = n.job;
        wait_for(
            &format!("job {job} scraped"),
            Duration::from_secs(60),
            || {
                let r = prom.query(&format!("up{{job=\"{job}\"}}"));
                (r.len() == 1 && value(&r[0]) == 1.0).then_some(())
            },
        );
        // What Prometheus' scrapes were answered with, before the test's own fetches.
        let log = exporter.process.log();
        let scrapes: Vec<&str> = log[before..]
            .lines()
            .filter(|l| l.contains("served /metrics"))
            .collect();
        assert!(!scrapes.is_empty(), "{job}: no scrape logged");
        for l in &scrapes {
            assert!(
                l.contains(&format!("format=\"{}\"", n.format)),
                "{job} must be served {}: {l}",
                n.format
            );
        }
    }
    for (n, exporter) in NEGOTIATIONS.iter().zip(&exporters) {
        let job = n.job;
        let want_count = served(exporter, n.format).len() as f64;
        wait_for(
            &format!("a whole scrape ingested by job {job}"),
            Duration::from_secs(60),
            || {
                let r = prom.query(&format!("scrape_samples_scraped{{job=\"{job}\"}}"));
                (r.len() == 1 && value(&r[0]) == want_count).then_some(())
            },
        );
        let stored = stored(&prom, job);
        let served = served(exporter, n.format);
        let missing: Vec<_> = served.keys().filter(|s| !stored.contains_key(*s)).collect();
        let extra: Vec<_> = stored.keys().filter(|s| !served.contains_key(*s)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{job}: served but not stored {missing:#?}\nstored but not served {extra:#?}"
        );
        for (series, want) in &served {
            let name = &series["__name__"];
            if VOLATILE.contains(&name.as_str()) {
                continue;
            }
            let got = stored[series];
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{job}: {series:?}: {got} vs {want}"
            );
        }
    }
}
