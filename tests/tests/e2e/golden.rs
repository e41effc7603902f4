//! Golden-file end-to-end test: the real exporter binary on a fixed scenario with a
//! frozen clock; `/metrics` in both formats must equal the checked-in files byte for
//! byte, except the few self-metrics that measure time. `UPDATE_GOLDEN=1` rewrites them.
//! A second test checks the same output against values computed from the scenario, so
//! the golden files cannot silently bless a wrong number; a third gives the checked-in
//! files themselves to promtool and to Prometheus' Python client parser (code
//! independent of this workspace) and compares every sample it reads with the gpu-sim
//! model ([`model_value`]): a family the model does not know fails it.

use e2e_tests::{
    assert_promtool_accepts_dcgm_exposition, fixture, get_bytes_with, get_with,
    golden_node_exporter, gunzip, series_values,
};
use gpu_sim::{FabricState, Scenario, SimNode};
use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

/// Self-metrics whose values depend on timing, not on the scenario.
const VOLATILE: &[&str] = &[
    "gpu_exporter_last_sample_timestamp_seconds ",
    "gpu_exporter_config_last_reload_success_timestamp_seconds ",
    "gpu_exporter_sample_duration_seconds ",
    "gpu_exporter_samples_total ",
    "gpu_exporter_scrape_duration_seconds_bucket{",
    "gpu_exporter_scrape_duration_seconds_sum ",
    "gpu_exporter_scrape_duration_seconds_count ",
];

fn normalise(body: &str) -> String {
    body.lines()
        .map(|l| {
            match (
                VOLATILE.iter().any(|v| l.starts_with(*v)),
                l.rsplit_once(' '),
            ) {
                (true, Some((series, _))) => format!("{series} <volatile>"),
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn check_golden(name: &str, actual: &str) {
    let path = fixture(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from /metrics at line {}:\n expected: {:?}\n   actual: {:?}",
            path.display(),
            first + 1,
            expected.lines().nth(first),
            actual.lines().nth(first)
        );
    }
}

#[test]
fn metrics_match_the_golden_files_in_both_formats() {
    let exporter = golden_node_exporter(&[]);
    // Three cycles: rate fields need two readings.
    let text = exporter.metrics_after_samples(3);
    check_golden("golden.prom", &normalise(&text));
    let (status, om) = get_with(
        &exporter.url("/metrics"),
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )],
    );
    assert_eq!(status, 200);
    assert!(om.ends_with("# EOF\n"), "OpenMetrics must end with # EOF");
    check_golden("golden.openmetrics", &normalise(&om));
}

#[test]
fn gzip_responses_carry_the_same_metrics_in_both_formats() {
    let exporter = golden_node_exporter(&[]);
    let plain = normalise(&exporter.metrics_after_samples(3));
    let (status, body, encoding) =
        get_bytes_with(&exporter.url("/metrics"), &[("Accept-Encoding", "gzip")]);
    assert_eq!((status, encoding.as_deref()), (200, Some("gzip")));
    assert!(
        body.len() * 5 < plain.len(),
        "compressed {} vs {} bytes",
        body.len(),
        plain.len()
    );
    assert_eq!(normalise(&gunzip(&body)), plain);
    let (_, om, encoding) = get_bytes_with(
        &exporter.url("/metrics"),
        &[
            ("Accept-Encoding", "gzip, deflate"),
            ("Accept", "application/openmetrics-text;version=1.0.0"),
        ],
    );
    assert_eq!(encoding.as_deref(), Some("gzip"));
    let om = gunzip(&om);
    assert!(om.ends_with("# EOF\n"));
    check_golden("golden.openmetrics", &normalise(&om));
    // Without Accept-Encoding the body is plain.
    let (_, _, encoding) = get_bytes_with(&exporter.url("/metrics"), &[]);
    assert_eq!(encoding, None);
}

#[test]
fn exported_values_are_the_scenarios_values() {
    let scenario = Scenario::load(&fixture("golden-node.toml")).expect("scenario");
    let node = SimNode::new(&scenario, UNIX_EPOCH);
    let t = 60.0;
    let exporter = golden_node_exporter(&[]);
    let body = exporter.metrics_after_samples(2);
    for gpu in 0..4u32 {
        let g = gpu.to_string();
        let r = node.gpu_reading(gpu, t);
        let labels = [("gpu", g.as_str())];
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_POWER_USAGE", &labels),
            vec![f64::from(r.power_mw) / 1000.0],
            "power of GPU {gpu}"
        );
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", &labels),
            vec![r.energy_mj as f64],
            "energy of GPU {gpu}"
        );
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_FB_USED", &labels),
            vec![(r.memory.used >> 20) as f64],
            "memory of GPU {gpu}"
        );
        let util: Vec<f64> = r.gpu_util_percent.map(f64::from).into_iter().collect();
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_GPU_UTIL", &labels),
            util,
            "util of GPU {gpu}"
        );
        let gpm: Vec<f64> = r.gpm.map(|g| g.graphics_util / 100.0).into_iter().collect();
        let got = series_values(&body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", &labels);
        assert_eq!(got.len(), gpm.len(), "GPM presence on GPU {gpu}");
        for (a, b) in got.iter().zip(&gpm) {
            assert!((a - b).abs() < 1e-6, "GR engine of GPU {gpu}: {a} vs {b}");
        }
    }
    // The MIG instances: their own memory and engine activity, no device-wide fields.
    let g2 = &node.gpus[2];
    for (m, mig) in g2.mig.iter().enumerate() {
        let gi = mig.gpu_instance_id.to_string();
        let labels = [
            ("gpu", "2"),
            ("GPU_I_ID", gi.as_str()),
            ("GPU_I_PROFILE", mig.profile.name),
        ];
        let r = node.mig_reading(2, m, t);
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_FB_USED", &labels),
            vec![(r.memory.used >> 20) as f64]
        );
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_POWER_USAGE", &labels),
            Vec::<f64>::new()
        );
        let gr = series_values(&body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", &labels);
        assert!((gr[0] - r.gpm.expect("H100 GPM").graphics_util / 100.0).abs() < 1e-6);
    }
    // Thermal limits and NVLinks of every GPU that answers: the board's thresholds, one
    // link series per NVLink with dcgm-exporter's NVLink labels, none for the L4.
    for gpu in 0..4u32 {
        let g = &node.gpus[gpu as usize];
        let idx = gpu.to_string();
        assert_eq!(
            series_values(&body, "DCGM_FI_DEV_SLOWDOWN_TEMP", &[("gpu", idx.as_str())]),
            vec![f64::from(g.model.board.slowdown_temp_c)]
        );
        let uuid = g.uuid.as_str();
        let states = series_values(
            &body,
            "DCGM_FI_DEV_NVLINK_GET_STATE",
            &[("gpu", idx.as_str()), ("gpu_uuid", uuid)],
        );
        assert_eq!(
            states.len() as u32,
            g.model.nvlink_links,
            "links of GPU {gpu}"
        );
        assert!(states.iter().all(|s| *s == 1.0), "all links up: {states:?}");
    }
    assert!(series_values(&body, "DCGM_FI_DEV_NVLINK_GET_STATE", &[("gpu", "4")]).is_empty());
    // Unsupported on the A100: memory temperature; GPU 4 is lost: only gpu_up says so.
    assert!(series_values(&body, "DCGM_FI_DEV_MEMORY_TEMP", &[("gpu", "3")]).is_empty());
    assert!(series_values(&body, "DCGM_FI_DEV_GPU_TEMP", &[("gpu", "4")]).is_empty());
    assert_eq!(
        series_values(&body, "gpu_exporter_gpu_up", &[("gpu", "4")]),
        vec![0.0]
    );
    assert_eq!(
        series_values(&body, "gpu_exporter_gpu_up", &[("gpu", "0")]),
        vec![1.0]
    );
    // XIDs: two of code 31 on GPU 0, one of code 13 on MIG instance 1 of GPU 2.
    assert_eq!(
        series_values(
            &body,
            "gpu_exporter_xid_errors_total",
            &[("gpu", "0"), ("xid", "31")]
        ),
        vec![2.0]
    );
    assert_eq!(
        series_values(
            &body,
            "gpu_exporter_xid_last_seen_timestamp_seconds",
            &[("gpu", "0"), ("xid", "31")]
        ),
        vec![1_700_000_020.0]
    );
    assert_eq!(
        series_values(
            &body,
            "gpu_exporter_xid_errors_total",
            &[("gpu", "2"), ("GPU_I_ID", "1"), ("xid", "13")]
        ),
        vec![1.0]
    );
    assert_eq!(
        series_values(
            &body,
            "DCGM_FI_DEV_XID_ERRORS",
            &[("gpu", "0"), ("err_code", "31")]
        ),
        vec![31.0]
    );
    // ECC and remapped rows from the faults.
    assert_eq!(
        series_values(&body, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &[("gpu", "1")]),
        vec![1.0]
    );
    assert_eq!(
        series_values(
            &body,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            &[("gpu", "1")]
        ),
        vec![1.0]
    );
    // Per-process shares on a whole GPU sum to the device utilisation.
    let util0 = series_values(&body, "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")])[0];
    let shares: f64 = series_values(
        &body,
        "gpu_exporter_process_sm_utilization_percent",
        &[("gpu", "0")],
    )
    .iter()
    .sum();
    assert_eq!(shares, util0);
}

/// A golden file with its `<volatile>` placeholders set to 0 (a valid value for every
/// one of them: an all-zero histogram is consistent).
fn golden_with_values(name: &str) -> String {
    std::fs::read_to_string(fixture(name))
        .expect("golden file")
        .replace(" <volatile>", " 0")
}

/// One sample as an independent parser read it.
#[derive(Debug)]
struct ParsedSample {
    /// The family's name as the parser reads it (`_total` of a counter dropped).
    family: String,
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Samples of `text` as prometheus_client's parser reads them (`openmetrics`: its strict
/// OpenMetrics parser; else its text-format parser). It rejects malformed input.
fn parse_with_prometheus_client(text: &str, openmetrics: bool) -> Vec<ParsedSample> {
    const SCRIPT: &str = r#"
import json, sys
if sys.argv[1] == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append([family.name, s.name, s.labels, repr(float(s.value))])
json.dump(out, sys.stdout)
"#;
    use std::io::Write;
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            SCRIPT,
            if openmetrics { "openmetrics" } else { "text" },
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (tests/setup.sh installs prometheus-client)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to the parser");
    let out = child.wait_with_output().expect("parser output");
    assert!(
        out.status.success(),
        "prometheus_client rejects the file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<(String, String, BTreeMap<String, String>, String)> =
        serde_json::from_slice(&out.stdout).expect("parser JSON");
    rows.into_iter()
        .map(|(family, name, labels, value)| ParsedSample {
            family,
            name,
            labels,
            value: match value.as_str() {
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" => f64::NAN,
                v => v.parse().expect("float"),
            },
        })
        .collect()
}

fn parsed_values(samples: &[ParsedSample], name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let want_mig = labels.iter().any(|(k, _)| *k == "GPU_I_ID");
    samples
        .iter()
        // The parser names a counter's sample `<name>_total` whether or not the file does.
        .filter(|s| s.name == name || s.name.strip_suffix("_total") == Some(name))
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .filter(|s| want_mig || !s.labels.contains_key("GPU_I_ID"))
        .map(|s| s.value)
        .collect()
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1.0))
}

/// Where a rate field's two readings are taken under a frozen clock: both the same, so
/// the difference (and the rate) is zero whatever its unit.
fn frozen_rate(before: u64, after: u64) -> f64 {
    (after - before) as f64
}

/// What the gpu-sim model says one sample of the golden scenario holds, in the units
/// DCGM gives each field (NVML's readings converted as dcgm-exporter does): `Ok(Some(v))`,
/// `Ok(None)` for a `<volatile>` placeholder, `Err` for a family (or an entity of a
/// family) the oracle does not know, so a new series cannot enter the golden files
/// unchecked.
fn model_value(
    node: &SimNode,
    epoch_s: f64,
    t: f64,
    s: &ParsedSample,
) -> Result<Option<f64>, String> {
    const MIB: u64 = 1 << 20;
    let label = |k: &str| s.labels.get(k).map(String::as_str);
    let number = |k: &str| -> Result<Option<u32>, String> {
        label(k)
            .map(|v| v.parse().map_err(|e| format!("label {k}={v:?}: {e}")))
            .transpose()
    };
    let family = s.family.as_str();
    // The node's own series.
    let own = match family {
        "gpu_exporter_build_info" => Some(Some(1.0)),
        "gpu_exporter_source_up" => Some(Some(f64::from(u8::from(
            node.driver_available(t) && !node.init_fails(),
        )))),
        // No call of the scenario is delayed, so none hangs and no sample fails.
        "gpu_exporter_source_hung" | "gpu_exporter_sample_failures" => {
            if node.call_delay(t).is_some() {
                return Err(format!("{family}: the golden scenario delays calls"));
            }
            Some(Some(0.0))
        }
        // The counters CSV given by -f loads.
        "gpu_exporter_config_last_reload_successful" => Some(Some(1.0)),
        // One scraper on a fresh exporter: no connection is refused, for either reason.
        "gpu_exporter_http_connections_refused" => match label("reason") {
            Some("per_address" | "max_connections") => Some(Some(0.0)),
            other => return Err(format!("{family}: unknown reason {other:?}")),
        },
        "gpu_exporter_last_sample_timestamp_seconds"
        | "gpu_exporter_config_last_reload_success_timestamp_seconds"
        | "gpu_exporter_sample_duration_seconds"
        | "gpu_exporter_samples"
        | "gpu_exporter_scrape_duration_seconds" => Some(None),
        _ => None,
    };
    if let Some(v) = own {
        return Ok(v);
    }
    let gpu = number("gpu")?.ok_or_else(|| format!("{family}: no gpu label"))?;
    let g = node
        .gpus
        .get(gpu as usize)
        .ok_or_else(|| format!("{family}: no GPU {gpu} in the scenario"))?;
    if family == "gpu_exporter_gpu_up" {
        return Ok(Some(f64::from(u8::from(!node.gpu_lost(gpu, t)))));
    }
    if node.gpu_lost(gpu, t) {
        return Err(format!(
            "{family}: GPU {gpu} is lost, only gpu_up reports it"
        ));
    }
    let xids = node.xids_between(f64::NEG_INFINITY, t);
    let instance = number("GPU_I_ID")?;
    // Processes, on a whole GPU or a MIG instance.
    if family.starts_with("gpu_exporter_process_") {
        let pid = number("pid")?.ok_or_else(|| format!("{family}: no pid"))?;
        let p = node
            .gpu_processes(gpu, t)
            .into_iter()
            .find(|p| p.pid == pid && p.gpu_instance_id == instance)
            .ok_or_else(|| format!("{family}: no process {pid} on {gpu}/{instance:?}"))?;
        return match family {
            "gpu_exporter_process_memory_used_bytes" => Ok(Some(p.used_memory_bytes as f64)),
            "gpu_exporter_process_sm_utilization_percent" if instance.is_none() => {
                Ok(Some(f64::from(p.sm_util_percent)))
            }
            _ => Err(format!("{family}: not in the model for {gpu}/{instance:?}")),
        };
    }
    // XID counters, on a whole GPU or a MIG instance.
    if let Some(code) = number("xid")? {
        let seen: Vec<_> = xids
            .iter()
            .filter(|x| x.gpu == gpu && x.gpu_instance == instance && x.code == u64::from(code))
            .collect();
        return match family {
            "gpu_exporter_xid_errors" => Ok(Some(seen.len() as f64)),
            "gpu_exporter_xid_last_seen_timestamp_seconds" => Ok(Some(
                epoch_s
                    + seen
                        .iter()
                        .map(|x| x.at_s)
                        .fold(f64::NEG_INFINITY, f64::max),
            )),
            _ => Err(format!("{family}: an xid label")),
        };
    }
    let gpm_field = |m: &gpu_sim::GpmReading| -> Option<f64> {
        Some(match family {
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => m.graphics_util / 100.0,
            "DCGM_FI_PROF_SM_ACTIVE" => m.sm_util / 100.0,
            "DCGM_FI_PROF_SM_OCCUPANCY" => m.sm_occupancy / 100.0,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => m.hmma_tensor_util / 100.0,
            "DCGM_FI_PROF_DRAM_ACTIVE" => m.dram_bw_util / 100.0,
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE" => m.fp64_util / 100.0,
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE" => m.fp32_util / 100.0,
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE" => m.fp16_util / 100.0,
            // MiB/s to bytes/s.
            "DCGM_FI_PROF_PCIE_TX_BYTES" => m.pcie_tx_mib_s * MIB as f64,
            "DCGM_FI_PROF_PCIE_RX_BYTES" => m.pcie_rx_mib_s * MIB as f64,
            _ => return None,
        })
    };
    let memory_field = |m: &gpu_sim::MemoryReading| -> Option<f64> {
        Some(match family {
            "DCGM_FI_DEV_FB_TOTAL" => (m.total / MIB) as f64,
            "DCGM_FI_DEV_FB_FREE" => (m.free / MIB) as f64,
            "DCGM_FI_DEV_FB_USED" => (m.used / MIB) as f64,
            "DCGM_FI_DEV_FB_RESERVED" => (m.reserved / MIB) as f64,
            _ => return None,
        })
    };
    // A MIG instance: its memory and its engine activity, nothing else.
    if let Some(id) = instance {
        let m = g
            .mig
            .iter()
            .position(|m| m.gpu_instance_id == id)
            .ok_or_else(|| format!("{family}: no MIG instance {gpu}/{id}"))?;
        if label("GPU_I_PROFILE") != Some(g.mig[m].profile.name) {
            return Err(format!("{family}: profile of {gpu}/{id}: {:?}", s.labels));
        }
        let r = node.mig_reading(gpu, m, t);
        return memory_field(&r.memory)
            .or_else(|| r.gpm.as_ref().and_then(gpm_field))
            .map(Some)
            .ok_or_else(|| format!("{family}: no MIG series in the model ({gpu}/{id})"));
    }
    // One NVLink of the GPU.
    if let Some(link) = number("nvlink")? {
        if link >= g.model.nvlink_links {
            return Err(format!("{family}: GPU {gpu} has no link {link}"));
        }
        let errors = node.nvlink_link_errors(gpu, link, t);
        return match family {
            "DCGM_FI_DEV_NVLINK_GET_STATE" => {
                Ok(Some(f64::from(u8::from(node.nvlink_active(gpu, link, t)))))
            }
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL" => Ok(Some(errors[0] as f64)),
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_PER_LINK_TOTAL" => Ok(Some(errors[1] as f64)),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL" => Ok(Some(errors[2] as f64)),
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL" => Ok(Some(errors[3] as f64)),
            "DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK"
            | "DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_PER_LINK"
            | "DCGM_FI_DEV_NVLINK_RX_THROUGHPUT_PER_LINK" => {
                let r = node.gpu_reading(gpu, t);
                Ok(Some(frozen_rate(r.nvlink_rx_kib, r.nvlink_rx_kib)))
            }
            _ => Err(format!("{family}: an nvlink label")),
        };
    }
    // The whole GPU.
    let r = node.gpu_reading(gpu, t);
    let b = &g.model.board;
    let flag = |v: bool| f64::from(u8::from(v));
    let fabric = node.fabric(gpu, t);
    let util = |v: Option<u32>| {
        v.map(f64::from)
            .ok_or_else(|| format!("{family}: GPU {gpu} reports no utilisation"))
    };
    let v = match family {
        "DCGM_FI_DEV_SM_CLOCK" => f64::from(r.sm_clock_mhz),
        "DCGM_FI_DEV_MEM_CLOCK" => f64::from(r.mem_clock_mhz),
        "DCGM_FI_DEV_MEMORY_TEMP" => f64::from(r.memory_temp_c),
        "DCGM_FI_DEV_GPU_TEMP" => f64::from(r.gpu_temp_c),
        // mW to W.
        "DCGM_FI_DEV_POWER_USAGE" => f64::from(r.power_mw) / 1000.0,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT" => f64::from(r.power_limit_mw) / 1000.0,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => r.energy_mj as f64,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" => r.pcie_replay as f64,
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" => f64::from(r.pcie_tx_kb_s),
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT" => f64::from(r.pcie_rx_kb_s),
        "DCGM_FI_DEV_GPU_UTIL" => util(r.gpu_util_percent)?,
        "DCGM_FI_DEV_MEM_COPY_UTIL" => util(r.memory_util_percent)?,
        "DCGM_FI_DEV_ENC_UTIL" => f64::from(r.encoder_percent),
        "DCGM_FI_DEV_DEC_UTIL" => f64::from(r.decoder_percent),
        // The last XID of the GPU or any of its instances, 0 before any.
        "DCGM_FI_DEV_XID_ERRORS" => {
            let last = xids
                .iter()
                .filter(|x| x.gpu == gpu)
                .max_by(|a, b| a.at_s.total_cmp(&b.at_s))
                .map_or(0.0, |x| x.code as f64);
            let code = label("err_code").map(|c| c.parse::<f64>().map_err(|e| e.to_string()));
            if last != 0.0 && code != Some(Ok(last)) {
                return Err(format!("{family}: err_code of GPU {gpu}: {:?}", s.labels));
            }
            last
        }
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" | "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" => {
            r.clock_event_reasons as f64
        }
        // Violation time, ns, per policy in NVML's order.
        "DCGM_FI_DEV_POWER_VIOLATION" => r.violation_ns[0] as f64,
        "DCGM_FI_DEV_THERMAL_VIOLATION" => r.violation_ns[1] as f64,
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION" => r.violation_ns[2] as f64,
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION" => r.violation_ns[3] as f64,
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION" => r.violation_ns[4] as f64,
        "DCGM_FI_DEV_RELIABILITY_VIOLATION" => r.violation_ns[5] as f64,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" => r.ecc_corrected_volatile as f64,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" => r.ecc_uncorrected_volatile as f64,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL" => r.ecc_corrected_aggregate as f64,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL" => r.ecc_uncorrected_aggregate as f64,
        "DCGM_FI_DEV_RETIRED_SBE" => r.retired_single_bit as f64,
        "DCGM_FI_DEV_RETIRED_DBE" => r.retired_double_bit as f64,
        "DCGM_FI_DEV_RETIRED_PENDING" => flag(r.retired_pending),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" => r.nvlink_errors[0] as f64,
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL" => r.nvlink_errors[1] as f64,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL" => r.nvlink_errors[2] as f64,
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL" => r.nvlink_errors[3] as f64,
        // KiB counters differenced over time (DCGM: ÷ seconds ÷ 1000).
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" => frozen_rate(
            r.nvlink_rx_kib + r.nvlink_tx_kib,
            r.nvlink_rx_kib + r.nvlink_tx_kib,
        ),
        // Bare-metal GPUs are not vGPU guests: unlicensed, as DCGM reports them.
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS" => 0.0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" => r.remapped_uncorrectable as f64,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" => r.remapped_correctable as f64,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE" => flag(r.remap_failure),
        "DCGM_FI_DEV_ROW_REMAP_PENDING" => flag(r.remap_pending),
        "DCGM_FI_DEV_ECC_CURRENT" => flag(r.ecc_mode_current),
        "DCGM_FI_DEV_ECC_PENDING" => flag(r.ecc_mode_pending),
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION" => f64::from(r.recovery_action),
        "DCGM_FI_DEV_SLOWDOWN_TEMP" => f64::from(b.slowdown_temp_c),
        "DCGM_FI_DEV_SHUTDOWN_TEMP" => f64::from(b.shutdown_temp_c),
        "DCGM_FI_DEV_GPU_MAX_OP_TEMP" => f64::from(b.gpu_max_operating_temp_c),
        "DCGM_FI_DEV_MEM_MAX_OP_TEMP" => f64::from(b.memory_max_operating_temp_c),
        // Data-centre boards in persistence mode stay in P0.
        "DCGM_FI_DEV_PSTATE" => 0.0,
        // dcgmFabricManagerStatus_t: 1 not started, 2 in progress, 3 success, 4 failure.
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS" => match (fabric.state, fabric.status) {
            (FabricState::NotStarted, _) => 1.0,
            (FabricState::InProgress, _) => 2.0,
            (FabricState::Completed, 0) => 3.0,
            (FabricState::Completed, _) => 4.0,
        },
        // A completed registration's nvmlReturn_t as DCGM converts it (DCGM_ST_*).
        "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE" => match (fabric.state, fabric.status) {
            (FabricState::Completed, 0) => 0.0,
            // NVML_ERROR_UNKNOWN: DCGM_ST_NVML_ERROR.
            (FabricState::Completed, 999) => -8.0,
            (state, status) => {
                return Err(format!(
                    "{family}: GPU {gpu}: no DCGM code known here for {state:?}, {status}"
                ));
            }
        },
        "DCGM_FI_DEV_FABRIC_CLIQUE_ID" => f64::from(fabric.clique_id),
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK" => f64::from(fabric.health_mask),
        "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY" => f64::from(fabric.health_summary),
        _ => match memory_field(&r.memory).or_else(|| r.gpm.as_ref().and_then(gpm_field)) {
            Some(v) => v,
            None => return Err(format!("{family}: not in the oracle (GPU {gpu})")),
        },
    };
    Ok(Some(v))
}

#[test]
fn the_golden_files_parse_independently_and_carry_the_scenarios_values() {
    let scenario = Scenario::load(&fixture("golden-node.toml")).expect("scenario");
    let node = SimNode::new(&scenario, UNIX_EPOCH);
    let t = scenario.clock.frozen_at_s.expect("a frozen clock");
    for (name, openmetrics) in [("golden.prom", false), ("golden.openmetrics", true)] {
        let text = golden_with_values(name);
        // promtool reads the Prometheus text format only (OpenMetrics' `_total` samples
        // read as families without help); the OpenMetrics file goes to the strict
        // OpenMetrics parser below.
        if !openmetrics {
            assert_promtool_accepts_dcgm_exposition(&text);
        }
        let samples = parse_with_prometheus_client(&text, openmetrics);
        // Every sample line was read (OpenMetrics adds `_created` samples of its own).
        let lines = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
        assert_eq!(
            samples
                .iter()
                .filter(|s| !s.name.ends_with("_created"))
                .count(),
            lines,
            "{name}: samples read"
        );
        // Every sample, of every family, against the model.
        let epoch_s = scenario.clock.epoch_unix_s.expect("a fixed epoch");
        let mut placeholders = 0;
        for s in &samples {
            match model_value(&node, epoch_s, t, s) {
                Ok(Some(want)) => assert!(
                    close(&[s.value], &[want]),
                    "{name}: {} {:?}: {} vs the model's {want}",
                    s.name,
                    s.labels,
                    s.value
                ),
                Ok(None) => placeholders += 1,
                Err(e) => panic!("{name}: {} {:?}: {e}", s.name, s.labels),
            }
        }
        // Only the volatile self-metrics escape the model.
        let volatile = std::fs::read_to_string(fixture(name))
            .expect("golden file")
            .matches(" <volatile>")
            .count();
        assert_eq!(
            placeholders, volatile,
            "{name}: samples without a model value"
        );
        // The XID counters: as often as the scenario raises each XID by time t.
        let mut xids: BTreeMap<(u32, Option<u32>, u64), f64> = BTreeMap::new();
        for x in node.xids_between(f64::NEG_INFINITY, t) {
            *xids.entry((x.gpu, x.gpu_instance, x.code)).or_default() += 1.0;
        }
        assert!(!xids.is_empty(), "the golden scenario raises XIDs");
        for ((gpu, instance, code), count) in xids {
            let (g, c) = (gpu.to_string(), code.to_string());
            let i = instance.map(|i| i.to_string());
            let mut labels = vec![("gpu", g.as_str()), ("xid", c.as_str())];
            if let Some(i) = &i {
                labels.push(("GPU_I_ID", i.as_str()));
            }
            assert_eq!(
                parsed_values(&samples, "gpu_exporter_xid_errors_total", &labels),
                vec![count],
                "{name}: XID {code} on GPU {gpu}/{instance:?}"
            );
        }
    }
}
