//! Thermal limits, fans, per-link NVLink and fabric health (issue 17) through the real
//! NVML code path and a real Prometheus: the exporter reads the fake libnvidia-ml
//! serving a GB200 NVL72 tray (a link down, an unhealthy fabric route) and a node with
//! an actively cooled board; Prometheus scrapes both and evaluates the shipped rules.
//! Every expected value comes from the gpu-sim model of the same scenario and instant.

use e2e_tests::{
    Exporter, Prometheus, fake_nvml, query_value, scratch_dir, try_wait_for, wait_for,
};
use gpu_sim::{Scenario, SimNode};
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, UNIX_EPOCH};

const GB200: &str = "builtin:gb200-nvl72";
/// Inside the GB200 scenario's fault window (60–180 s).
const GB200_AT: f64 = 100.0;
const FANS: &str = "tests/fixtures/dashboards-node.toml";
const FANS_AT: f64 = 10.0;

fn model(scenario: &str, t: f64) -> SimNode {
    let s = match scenario.strip_prefix("builtin:") {
        Some(name) => Scenario::builtin(name),
        None => Scenario::load(&e2e_tests::workspace().join(scenario)),
    }
    .expect("scenario");
    let mut node = SimNode::new(&s, UNIX_EPOCH);
    node.freeze_at(t);
    node
}

fn nvml_exporter(scenario: &str, t: f64) -> Exporter {
    let lib = fake_nvml();
    Exporter::start(
        &[
            "--nvml-lib",
            lib.to_str().expect("utf-8 path"),
            "-f",
            "tests/fixtures/all-fields.csv",
            "-c",
            "200",
        ],
        &[
            ("GPU_SIM_SCENARIO", scenario),
            ("GPU_SIM_FROZEN_AT_S", &t.to_string()),
        ],
    )
}

fn host_port(e: &Exporter) -> String {
    e.base.trim_start_matches("http://").to_string()
}

/// Prometheus scraping `jobs` (name, exporter) every second, with the shipped rules.
fn prometheus_with_rules(jobs: &[(&str, &Exporter)]) -> Prometheus {
    let dir = scratch_dir("prometheus-nvlink");
    let text = std::fs::read_to_string(
        e2e_tests::workspace().join("dashboards/alerts/prometheusrule.yaml"),
    )
    .expect("the PrometheusRule");
    let rule: Value = serde_saphyr::from_str(&text).expect("PrometheusRule YAML");
    let rules = dir.join("rules.yaml");
    // JSON is YAML: the spec is a plain rule file.
    std::fs::write(&rules, serde_json::to_string(&rule["spec"]).expect("JSON")).expect("write");
    let mut config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {}\nscrape_configs:\n",
        rules.display()
    );
    for (name, e) in jobs {
        config.push_str(&format!(
            "  - job_name: {name}\n    honor_labels: true\n    static_configs:\n      - targets: ['{}']\n",
            host_port(e)
        ));
    }
    Prometheus::start_with_config(&config, &[])
}

fn label<'a>(s: &'a Value, name: &str) -> &'a str {
    s["metric"][name].as_str().unwrap_or_default()
}

/// Wait until `promql` returns `n` series, and return them.
fn series(prom: &Prometheus, promql: &str, n: usize) -> Vec<Value> {
    wait_for(
        &format!("{n} series of {promql}"),
        Duration::from_secs(60),
        || {
            let r = prom.query(promql);
            (r.len() == n).then_some(r)
        },
    )
}

#[test]
fn links_fabric_thermal_limits_and_fans_reach_prometheus_and_raise_the_alerts() {
    let gb200 = nvml_exporter(GB200, GB200_AT);
    let fans = nvml_exporter(FANS, FANS_AT);
    let prom = prometheus_with_rules(&[("gb200", &gb200), ("fans", &fans)]);
    let m = model(GB200, GB200_AT);
    let links: u32 = m.gpus.iter().map(|g| g.model.nvlink_links).sum();

    // Every link of every GPU, with dcgm-exporter's NVLink labels; exactly the downed
    // one at 0.
    let states = series(
        &prom,
        "DCGM_FI_DEV_NVLINK_GET_STATE{job=\"gb200\"}",
        links as usize,
    );
    for s in &states {
        let gpu: u32 = label(s, "gpu").parse().expect("gpu");
        let link: u32 = label(s, "nvlink").parse().expect("nvlink");
        let g = &m.gpus[gpu as usize];
        assert_eq!(label(s, "gpu_uuid"), g.uuid, "{s}");
        assert_eq!(label(s, "pci_bus_id"), g.pci_bus_id, "{s}");
        assert_eq!(label(s, "device"), format!("nvidia{gpu}"), "{s}");
        assert_eq!(label(s, "model_name"), "NVIDIA GB200", "{s}");
        assert_eq!(label(s, "Hostname"), "e2e-node", "{s}");
        assert!(
            s["metric"].get("UUID").is_none(),
            "NVLink series name the GPU gpu_uuid: {s}"
        );
        let active = m.nvlink_active(gpu, link, GB200_AT);
        assert_eq!(query_value(s), f64::from(u8::from(active)), "{s}");
    }
    let down = prom.query("DCGM_FI_DEV_NVLINK_GET_STATE{job=\"gb200\"} == 0");
    assert_eq!(down.len(), 1, "{down:?}");
    assert_eq!(
        (label(&down[0], "gpu"), label(&down[0], "nvlink")),
        ("2", "5")
    );
    // The downed link's error counters, per link.
    let replay = series(
        &prom,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{job=\"gb200\",gpu=\"2\",nvlink=\"5\"}",
        1,
    );
    assert_eq!(
        query_value(&replay[0]),
        m.nvlink_link_errors(2, 5, GB200_AT)[2] as f64
    );

    // Fabric: registered in the rack's clique; GPU 3's route unhealthy.
    for gpu in 0..m.gpus.len() as u32 {
        let f = m.fabric(gpu, GB200_AT);
        let q = |name: &str| {
            let r = series(&prom, &format!("{name}{{job=\"gb200\",gpu=\"{gpu}\"}}"), 1);
            query_value(&r[0])
        };
        assert_eq!(q("DCGM_FI_DEV_FABRIC_MANAGER_STATUS"), 3.0, "GPU {gpu}");
        assert_eq!(q("DCGM_FI_DEV_FABRIC_CLIQUE_ID"), f64::from(f.clique_id));
        assert_eq!(
            q("DCGM_FI_DEV_FABRIC_HEALTH_MASK"),
            f64::from(f.health_mask)
        );
        assert_eq!(
            q("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"),
            f64::from(f.health_summary)
        );
        let board = &m.gpus[gpu as usize].model.board;
        assert_eq!(
            q("DCGM_FI_DEV_SLOWDOWN_TEMP"),
            f64::from(board.slowdown_temp_c)
        );
        assert_eq!(
            q("DCGM_FI_DEV_SHUTDOWN_TEMP"),
            f64::from(board.shutdown_temp_c)
        );
        assert_eq!(q("DCGM_FI_DEV_PSTATE"), 0.0);
    }
    assert_eq!(
        m.fabric(3, GB200_AT).health_summary,
        2,
        "the scenario's fault"
    );
    // No fans on an NVL72 GPU: no series rather than zeros.
    assert!(
        prom.query("DCGM_FI_DEV_FAN_SPEED{job=\"gb200\"}")
            .is_empty()
    );

    // A failed registration (dashboards node, GPU 4: completed with NVML_ERROR_UNKNOWN):
    // DCGM's failure status and its DCGM_ST_NVML_ERROR code.
    let failed = |name: &str| {
        let r = series(&prom, &format!("{name}{{job=\"fans\",gpu=\"4\"}}"), 1);
        query_value(&r[0])
    };
    assert_eq!(failed("DCGM_FI_DEV_FABRIC_MANAGER_STATUS"), 4.0);
    assert_eq!(failed("DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"), -8.0);
    assert_eq!(
        prom.query("DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE{job=\"gb200\"} != 0"),
        Vec::<Value>::new()
    );

    // The fan of the actively cooled board, and only that board's.
    let f = model(FANS, FANS_AT);
    let fan_gpus: Vec<u32> = (0..f.gpus.len() as u32)
        .filter(|g| f.fans(*g) > 0)
        .collect();
    assert_eq!(fan_gpus.len(), 1);
    let speeds = series(&prom, "DCGM_FI_DEV_FAN_SPEED{job=\"fans\"}", 1);
    assert_eq!(label(&speeds[0], "gpu"), fan_gpus[0].to_string());
    let want = f.fan_speed_percent(fan_gpus[0], 0, FANS_AT).expect("a fan");
    assert_eq!(query_value(&speeds[0]), f64::from(want));

    // The shipped alerts, pending or firing, on exactly the faulty link and GPU.
    let mut got = BTreeSet::new();
    let want: BTreeSet<(String, String, String)> = [
        ("GPUNVLinkDown", "2", "5"),
        ("GPUNVLinkDown", "4", "7"),
        ("GPUFabricUnhealthy", "3", "unhealthy"),
        ("GPUFabricUnhealthy", "4", "registration failed"),
    ]
    .into_iter()
    .map(|(a, g, d)| (a.into(), g.into(), d.into()))
    .collect();
    let matched = try_wait_for(Duration::from_secs(30), || {
        let (status, body) = e2e_tests::get(&format!("{}/api/v1/alerts", prom.base));
        assert_eq!(status, 200, "{body}");
        let data: Value = serde_json::from_str(&body).expect("alerts JSON");
        got = data["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| {
                let name = a["labels"]["alertname"].as_str().unwrap_or_default();
                name == "GPUNVLinkDown" || name == "GPUFabricUnhealthy"
            })
            .map(|a| {
                let l = &a["labels"];
                let s = |k: &str| l[k].as_str().unwrap_or_default().to_string();
                let detail = if l["nvlink"].is_string() {
                    s("nvlink")
                } else {
                    s("reason")
                };
                (s("alertname"), s("gpu"), detail)
            })
            .collect();
        (got == want).then_some(())
    });
    assert!(
        matched.is_some(),
        "NVLink and fabric alerts {got:?}, want {want:?}"
    );
}
