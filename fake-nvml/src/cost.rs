//! A cost model: each NVML call spends, busy on the calling thread's CPU, what the real
//! driver's call costs, so CPU measurements of a client on the fake see the driver's
//! cost (the fake alone answers every call in microseconds).
//!
//! Off unless `GPU_SIM_COST_MODEL=NAME` is set (then one relaxed load per call). The
//! models, each read from a real driver's measurements in `tests/fixtures/real-gpu/`
//! (embedded at build time; those files are the only source of the numbers):
//!
//! - `h100-580`: one H100 80GB HBM3, driver 580.159.04
//!   (`h100-80gb-hbm3-580.159.04/nvml-latency.json`, written by
//!   `exporter/benches/nvml-latency.py`: each call timed alone, idle GPU, medians).
//! - `h200-580`: one H200, driver 580.159.04 (`h200-141gb-hbm3e-580.159.04/`): its
//!   `nvml-latency.json`, whose GPM entries `gpm-fresh-pairs.json` replaces
//!   (`exporter/benches/gpm-fresh-pairs.py`: a sample and the metrics on a fresh pair a
//!   second apart, as a sampler calls them, which the real driver answers for more
//!   than back-to-back calls on one pair: 296 µs against 38 µs for the sample).
//!
//! What a call costs under a model:
//! - a function the file times (`getters`, `events`, `gpm`): its median. A versioned
//!   export the file times under its plain name (`nvmlDeviceGetMemoryInfo_v2`,
//!   `nvmlDeviceGetCount_v2`: pynvml calls the plain or the newest name) costs that
//!   name's median; `nvmlGpmMigSampleGet` costs `nvmlGpmSampleGet`'s;
//! - `nvmlDeviceGetFieldValues`: the sum of its requested fields' medians (the file
//!   times each field ID alone); an ID timed under two names costs the lower median;
//! - `nvmlGpmMetricsGet`: the sum of its requested metrics' medians, where the file
//!   times metrics alone (`nvmlGpmMetricsGet(metric ID)`); a metric it does not time
//!   costs its largest request's median divided by that request's metric count
//!   (`nvmlGpmMetricsGet(5 metrics)`: dcgm-exporter's five, 351 µs each on the 580
//!   file, which times no metric alone);
//! - anything else: the default, the median of the file's function medians (3.9 µs on
//!   the 580 file); a field ID it does not time: the median of its field medians
//!   (4.7 µs).
//!
//! The time is spent by spinning on the thread's CPU clock, so a preempted spin still
//! spends the whole cost in CPU time; except for the calls in [`WAITS`], which the driver
//! spends mostly waiting (the PCIe throughput's 20 ms sample): those spin their CPU
//! median where the file has one (`cpu_median_us`: 0.92 ms of the H200's 21 ms) and
//! sleep the rest. The file's medians are wall times; for every other call the model
//! takes them as CPU time, which the H200 file's CPU medians bear out (within 1 % for
//! every call that does not wait) and the real H100's idle CPU did (0.61–0.73 % of a
//! core measured, 0.62 % modelled).

use std::collections::HashMap;
use std::sync::OnceLock;

pub const COST_MODEL_ENV: &str = "GPU_SIM_COST_MODEL";

/// The models: name, the latency file it is read from, and the file whose `gpm`
/// entries replace that file's, if any.
const MODELS: &[(&str, &str, Option<&str>)] = &[
    (
        "h100-580",
        include_str!("../../tests/fixtures/real-gpu/h100-80gb-hbm3-580.159.04/nvml-latency.json"),
        None,
    ),
    (
        "h200-580",
        include_str!("../../tests/fixtures/real-gpu/h200-141gb-hbm3e-580.159.04/nvml-latency.json"),
        Some(include_str!(
            "../../tests/fixtures/real-gpu/h200-141gb-hbm3e-580.159.04/gpm-fresh-pairs.json"
        )),
    ),
];

/// Calls whose cost is the sum of their items' (charged by [`charge_fields`] and
/// [`charge_gpm_metrics`]), not a per-call median.
const PER_ITEM_CALLS: &[&str] = &["nvmlDeviceGetFieldValues", "nvmlGpmMetricsGet"];

/// Calls whose time the driver spends waiting, not computing: spent asleep, so a
/// client's wall time sees them and its CPU time does not.
/// `nvmlDeviceGetPcieThroughput` samples the link for 20 ms: nvitop-exporter calls it
/// twice a cycle and used 0.40–0.54 % of a core at 1 s on the real H100
/// (docs/benchmarks/real-gpu.md), not the 4.2 % that 41.6 ms of CPU would be.
const WAITS: &[&str] = &["nvmlDeviceGetPcieThroughput"];

/// Exports that cost what another, timed, function costs.
const SAME_PATH: &[(&str, &str)] = &[("nvmlGpmMigSampleGet", "nvmlGpmSampleGet")];

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CostModelError {
    #[error("{COST_MODEL_ENV}={0:?} is not a cost model; the models are: {models}", models = model_names())]
    Unknown(String),
    #[error("cost model {model}: its latency file does not parse: {reason}")]
    BadFile { model: String, reason: String },
}

fn model_names() -> String {
    MODELS
        .iter()
        .map(|(n, _, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One model's costs, in nanoseconds.
#[derive(Debug)]
pub struct Model {
    pub name: &'static str,
    calls: HashMap<String, u64>,
    /// The CPU part of the waiting calls ([`WAITS`]) the file gives one for
    /// (`cpu_median_us`); every other call is CPU throughout.
    calls_cpu: HashMap<String, u64>,
    fields: HashMap<u32, u64>,
    gpm_metrics: HashMap<u32, u64>,
    pub gpm_metric_default_ns: u64,
    pub call_default_ns: u64,
    pub field_default_ns: u64,
}

fn us_to_ns(us: f64) -> u64 {
    (us * 1000.0).round() as u64
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

impl Model {
    /// The model called `name`.
    pub fn named(name: &str) -> Result<Model, CostModelError> {
        let (name, text, gpm) = MODELS
            .iter()
            .find(|(n, _, _)| *n == name)
            .ok_or_else(|| CostModelError::Unknown(name.to_owned()))?;
        Model::parse(name, text, *gpm).map_err(|reason| CostModelError::BadFile {
            model: (*name).to_owned(),
            reason,
        })
    }

    fn parse(name: &'static str, text: &str, gpm: Option<&str>) -> Result<Model, String> {
        use serde_json::Value;
        let mut doc: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(gpm) = gpm {
            let over: Value = serde_json::from_str(gpm).map_err(|e| format!("gpm file: {e}"))?;
            let over = over
                .get("gpm")
                .and_then(Value::as_object)
                .ok_or("gpm file: no \"gpm\" object")?;
            let into = doc
                .get_mut("gpm")
                .and_then(Value::as_object_mut)
                .ok_or("no \"gpm\" object")?;
            for (k, v) in over {
                into.insert(k.clone(), v.clone());
            }
        }
        let section = |key: &str| -> Result<&serde_json::Map<String, Value>, String> {
            doc.get(key)
                .and_then(Value::as_object)
                .ok_or_else(|| format!("no {key:?} object"))
        };
        let med = |key: &str, v: &Value| -> Result<u64, String> {
            v.get("median_us")
                .and_then(Value::as_f64)
                .filter(|us| us.is_finite() && *us >= 0.0)
                .map(us_to_ns)
                .ok_or_else(|| format!("{key:?} has no median_us"))
        };
        let mut calls = HashMap::new();
        let mut calls_cpu = HashMap::new();
        for key in ["getters", "events"] {
            for (k, v) in section(key)? {
                // "nvmlEventSetWait_v2(timeout 0)": the function is the name before "(";
                // the zero-timeout entry is the one a call costs.
                let function = k.split('(').next().unwrap_or(k).trim();
                if k.contains('(') && !k.ends_with("(timeout 0)") {
                    continue;
                }
                calls.insert(function.to_owned(), med(k, v)?);
                if let Some(cpu) = v.get("cpu_median_us").and_then(Value::as_f64)
                    && WAITS.contains(&function)
                    && cpu.is_finite()
                    && cpu >= 0.0
                {
                    calls_cpu.insert(function.to_owned(), us_to_ns(cpu));
                }
            }
        }
        let call_default_ns = median(calls.values().copied().collect());
        let mut fields: HashMap<u32, u64> = HashMap::new();
        for (k, v) in section("field_values")? {
            let id = v
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| format!("{k:?} has no field id"))?;
            let ns = med(k, v)?;
            fields
                .entry(id)
                .and_modify(|old| *old = (*old).min(ns))
                .or_insert(ns);
        }
        let field_default_ns = median(fields.values().copied().collect());
        let mut gpm_metrics = HashMap::new();
        // (metrics in the request, median) of the largest "(N metrics)" request.
        let mut largest: Option<(u64, u64)> = None;
        for (k, v) in section("gpm")? {
            if k == "error" {
                continue;
            }
            let ns = med(k, v)?;
            let Some(inner) = k
                .strip_prefix("nvmlGpmMetricsGet(")
                .and_then(|r| r.strip_suffix(')'))
            else {
                calls.insert(k.clone(), ns);
                continue;
            };
            if let Some(id) = inner.strip_prefix("metric ") {
                let id = id.parse().map_err(|_| format!("{k:?}: metric id"))?;
                gpm_metrics.insert(id, ns);
            } else if let Some(n) = inner.strip_suffix(" metrics") {
                let n: u64 = n.parse().map_err(|_| format!("{k:?}: metric count"))?;
                if n > 0 && largest.is_none_or(|(m, _)| n > m) {
                    largest = Some((n, ns));
                }
            }
        }
        let gpm_metric_default_ns = largest.map_or(call_default_ns, |(n, ns)| ns / n);
        Ok(Model {
            name,
            calls,
            calls_cpu,
            fields,
            gpm_metrics,
            gpm_metric_default_ns,
            call_default_ns,
            field_default_ns,
        })
    }

    /// What one call of the export `function` costs, besides its items'.
    pub fn call_ns(&self, function: &str) -> u64 {
        if PER_ITEM_CALLS.contains(&function) {
            return 0;
        }
        let timed = SAME_PATH
            .iter()
            .find(|(f, _)| *f == function)
            .map_or(function, |(_, same)| *same);
        self.calls
            .get(timed)
            .or_else(|| self.calls.get(unversioned(timed)))
            .copied()
            .unwrap_or(self.call_default_ns)
    }

    /// How much of one call of a waiting `function` is CPU time: the file's CPU median,
    /// or none where it has none.
    pub fn wait_cpu_ns(&self, function: &str) -> u64 {
        self.calls_cpu.get(function).copied().unwrap_or(0)
    }

    /// What reading field `id` in `nvmlDeviceGetFieldValues` costs.
    pub fn field_ns(&self, id: u32) -> u64 {
        self.fields
            .get(&id)
            .copied()
            .unwrap_or(self.field_default_ns)
    }

    /// What GPM metric `id` costs in `nvmlGpmMetricsGet`.
    pub fn gpm_metric_ns(&self, id: u32) -> u64 {
        self.gpm_metrics
            .get(&id)
            .copied()
            .unwrap_or(self.gpm_metric_default_ns)
    }
}

/// `nvmlDeviceGetMemoryInfo_v2` → `nvmlDeviceGetMemoryInfo`; other names unchanged.
fn unversioned(function: &str) -> &str {
    match function.rsplit_once("_v") {
        Some((base, v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => function,
    }
}

/// The model the environment asks for: `Ok(None)` when none is.
pub fn from_env() -> &'static Result<Option<Model>, CostModelError> {
    static MODEL: OnceLock<Result<Option<Model>, CostModelError>> = OnceLock::new();
    MODEL.get_or_init(|| match std::env::var(COST_MODEL_ENV) {
        Ok(name) if !name.is_empty() => Model::named(&name).map(Some),
        _ => Ok(None),
    })
}

fn active() -> Option<&'static Model> {
    from_env().as_ref().ok()?.as_ref()
}

/// The calling thread's CPU time, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Spend `ns` of this thread's CPU time, busy.
fn spin(ns: u64) {
    if ns == 0 {
        return;
    }
    let start = thread_cpu_ns();
    while thread_cpu_ns().saturating_sub(start) < ns {
        std::hint::spin_loop();
    }
}

/// Charge one call of `function` (every export does, through `calls::count!`).
pub(crate) fn charge_call(function: &str) {
    if let Some(m) = active() {
        spend(function, m.call_ns(function), m.wait_cpu_ns(function));
    }
}

/// Spend `ns` for one call of `function`: for the calls that wait, `cpu_ns` busy and the
/// rest asleep; busy for the others.
fn spend(function: &str, ns: u64, cpu_ns: u64) {
    if WAITS.contains(&function) {
        let cpu_ns = cpu_ns.min(ns);
        spin(cpu_ns);
        std::thread::sleep(std::time::Duration::from_nanos(ns - cpu_ns));
    } else {
        spin(ns);
    }
}

/// Charge the fields of one `nvmlDeviceGetFieldValues` request.
pub(crate) fn charge_fields(ids: impl Iterator<Item = u32>) {
    if let Some(m) = active() {
        spin(ids.map(|id| m.field_ns(id)).sum());
    }
}

/// Charge the metrics of one `nvmlGpmMetricsGet` request.
pub(crate) fn charge_gpm_metrics(ids: impl Iterator<Item = u32>) {
    if let Some(m) = active() {
        spin(ids.map(|id| m.gpm_metric_ns(id)).sum());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_model_is_an_error_that_names_the_models() {
        let e = Model::named("h100-999").unwrap_err();
        assert_eq!(e, CostModelError::Unknown("h100-999".into()));
        let text = e.to_string();
        assert!(text.contains("GPU_SIM_COST_MODEL=\"h100-999\""), "{text}");
        assert!(text.contains("h100-580"), "{text}");
    }

    #[test]
    fn the_580_model_reads_every_entry_of_its_file() {
        let m = Model::named("h100-580").unwrap();
        let doc: serde_json::Value = serde_json::from_str(MODELS[0].1).unwrap();
        assert!(MODELS[0].2.is_none());
        let n = |k: &str| doc[k].as_object().unwrap().len();
        // Every getter and event; the GPM sample (the metric requests are per metric).
        assert_eq!(m.calls.len(), n("getters") + n("events") + 1);
        assert_eq!(
            m.call_ns("nvmlDeviceGetPowerUsage"),
            us_to_ns(
                doc["getters"]["nvmlDeviceGetPowerUsage"]["median_us"]
                    .as_f64()
                    .unwrap()
            )
        );
        assert_eq!(
            m.call_ns("nvmlDeviceGetMemoryInfo_v2"),
            m.call_ns("nvmlDeviceGetMemoryInfo")
        );
        assert_eq!(
            m.call_ns("nvmlGpmMigSampleGet"),
            m.call_ns("nvmlGpmSampleGet")
        );
        assert_eq!(m.call_ns("nvmlDeviceGetFieldValues"), 0);
        assert_eq!(m.call_ns("nvmlNoSuchFunction"), m.call_default_ns);
        // Field IDs timed under two names (74, 76) are one entry each.
        let ids: std::collections::HashSet<u64> = doc["field_values"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v["id"].as_u64().unwrap())
            .collect();
        assert_eq!(m.fields.len(), ids.len());
        assert_eq!(m.field_ns(9999), m.field_default_ns);
        let five = us_to_ns(
            doc["gpm"]["nvmlGpmMetricsGet(5 metrics)"]["median_us"]
                .as_f64()
                .unwrap(),
        );
        assert_eq!(m.gpm_metric_ns(1), five / 5);
    }

    #[test]
    fn the_h200_model_takes_gpm_from_its_fresh_pair_file() {
        let m = Model::named("h200-580").unwrap();
        let (_, latency, fresh) = MODELS[1];
        let latency: serde_json::Value = serde_json::from_str(latency).unwrap();
        let fresh: serde_json::Value = serde_json::from_str(fresh.unwrap()).unwrap();
        let ns = |v: &serde_json::Value| us_to_ns(v["median_us"].as_f64().unwrap());
        // The fresh pair's sample and graphics activity, not the back-to-back ones.
        assert_eq!(
            m.call_ns("nvmlGpmSampleGet"),
            ns(&fresh["gpm"]["nvmlGpmSampleGet"])
        );
        assert_eq!(
            m.gpm_metric_ns(1),
            ns(&fresh["gpm"]["nvmlGpmMetricsGet(metric 1)"])
        );
        assert!(m.call_ns("nvmlGpmSampleGet") > ns(&latency["gpm"]["nvmlGpmSampleGet"]));
        // A metric the fresh file leaves alone keeps the latency file's median.
        assert_eq!(
            m.gpm_metric_ns(5),
            ns(&latency["gpm"]["nvmlGpmMetricsGet(metric 5)"])
        );
        // The wait's CPU part, and the event wait at a zero timeout (not the 500 ms one).
        let pcie = &latency["getters"]["nvmlDeviceGetPcieThroughput"];
        assert_eq!(
            m.wait_cpu_ns("nvmlDeviceGetPcieThroughput"),
            us_to_ns(pcie["cpu_median_us"].as_f64().unwrap())
        );
        assert_eq!(
            m.call_ns("nvmlEventSetWait_v2"),
            ns(&latency["events"]["nvmlEventSetWait_v2(timeout 0)"])
        );
    }

    #[test]
    fn versions_are_stripped_only_from_version_suffixes() {
        assert_eq!(unversioned("nvmlDeviceGetCount_v2"), "nvmlDeviceGetCount");
        assert_eq!(
            unversioned("nvmlDeviceGetPciInfo_v3"),
            "nvmlDeviceGetPciInfo"
        );
        assert_eq!(
            unversioned("nvmlDeviceGetTemperatureV"),
            "nvmlDeviceGetTemperatureV"
        );
        assert_eq!(unversioned("nvmlDeviceGet_vgpu"), "nvmlDeviceGet_vgpu");
    }

    #[test]
    fn the_pcie_throughput_sample_waits_and_other_calls_compute() {
        let cpu = thread_cpu_ns();
        let wall = std::time::Instant::now();
        spend("nvmlDeviceGetPcieThroughput", 20_000_000, 0);
        assert!(wall.elapsed() >= std::time::Duration::from_millis(20));
        assert!(thread_cpu_ns() - cpu < 5_000_000, "slept, not spun");
        // With a CPU part: that much busy, the call as long as before.
        let cpu = thread_cpu_ns();
        let wall = std::time::Instant::now();
        spend("nvmlDeviceGetPcieThroughput", 20_000_000, 8_000_000);
        assert!(wall.elapsed() >= std::time::Duration::from_millis(20));
        let spent = thread_cpu_ns() - cpu;
        assert!((8_000_000..13_000_000).contains(&spent), "spun {spent} ns");
        let cpu = thread_cpu_ns();
        spend("nvmlDeviceGetTotalEnergyConsumption", 3_000_000, 0);
        assert!(thread_cpu_ns() - cpu >= 3_000_000);
    }

    #[test]
    fn spinning_spends_thread_cpu_time() {
        let start = thread_cpu_ns();
        spin(2_000_000);
        assert!(thread_cpu_ns() - start >= 2_000_000);
    }
}
