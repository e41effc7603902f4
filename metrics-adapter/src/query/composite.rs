//! Every metric name the adapter serves, beyond the built-in GPU metrics: composite
//! metrics declared in the configuration (`--composite-metric`,
//! `--composite-metrics-file`), and signals without pods (`--signal`, see
//! [`crate::source::signal`]). [`Catalog::resolve`] turns a requested name, with its
//! optional `:aggregation` suffix ([`super::aggregate`]), into a [`Metric`], and
//! [`metric_values`] answers a scope's per-pod values for any per-pod metric, so that
//! every face serves composites exactly as it serves the built-in metrics.
//!
//! A composite is evaluated per pod, from that pod's own fresh values; a pod lacking
//! any input has no composite value (it is counted missing or stale, never given a 0).
//! A workload's composite is its pods' composite values aggregated like any metric's.

use super::aggregate::{Aggregation, NotAnAggregation, split_suffix};
use super::expr::{EvalError, Expr, quoted};
use super::{Answer, PodValue, Scope};
use crate::error::Error;
use crate::fleet::GpuMetric;
use crate::source::pods::PodIndex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The per-pod metrics a composite may read. The one place that knows them, so more
/// per-pod sources plug in here by name.
fn input_metric(name: &str) -> Option<GpuMetric> {
    GpuMetric::from_name(name)
}

/// Every per-pod input name, for error messages.
fn input_names() -> Vec<&'static str> {
    GpuMetric::served()
        .into_iter()
        .map(GpuMetric::name)
        .collect()
}

/// A composite metric: a name and an expression over per-pod metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Composite {
    /// Lives as long as the process (declared once at startup), so that it reads like
    /// the built-in metrics' names.
    pub name: &'static str,
    pub expr: Expr,
    pub text: String,
    inputs: Vec<GpuMetric>,
}

/// A served metric.
#[derive(Debug, Clone)]
pub enum Metric {
    Gpu(GpuMetric),
    Composite(Arc<Composite>),
    /// A signal without pods, by name (its namespace is the request's).
    Signal(&'static str),
}

impl Metric {
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Gpu(m) => m.name(),
            Metric::Composite(c) => c.name,
            Metric::Signal(s) => s,
        }
    }
}

/// The configured metric names.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    composites: BTreeMap<&'static str, Arc<Composite>>,
    /// Each namespace's signals.
    signals: BTreeMap<String, BTreeSet<&'static str>>,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Where a composite definition came from, for errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A `--composite-metric` flag.
    Flag,
    /// A line of `--composite-metrics-file` (1-based).
    File { path: String, line: usize },
}

/// One composite definition, `NAME = EXPRESSION`, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    pub origin: Origin,
    pub text: String,
}

impl Definition {
    /// A `--composite-metric` flag's value.
    pub fn flag(text: impl Into<String>) -> Definition {
        Definition {
            origin: Origin::Flag,
            text: text.into(),
        }
    }

    /// An error about the definition: the flag or file line, and `at` (a byte offset
    /// into the definition) as a column where it is known.
    fn error(&self, at: Option<usize>, why: &str) -> Error {
        // The definition as written, shortened: a hostile line may be a megabyte.
        const SHOWN: usize = 80;
        let shown = match self.text.char_indices().nth(SHOWN) {
            Some((cut, _)) => format!("{:?}…", &self.text[..cut]),
            None => format!("{:?}", self.text),
        };
        let column = at.map(|at| self.text[..at.min(self.text.len())].chars().count() + 1);
        Error::Config(match (&self.origin, column) {
            (Origin::Flag, None) => format!("--composite-metric: {shown}: {why}"),
            (Origin::Flag, Some(c)) => {
                format!("--composite-metric: {shown}: at character {c}: {why}")
            }
            (Origin::File { path, line }, None) => format!("{path}:{line}: {shown}: {why}"),
            (Origin::File { path, line }, Some(c)) => {
                format!("{path}:{line}:{c}: {shown}: {why}")
            }
        })
    }
}

/// A definition that passed every check.
struct Checked {
    name: String,
    text: String,
    expr: Expr,
    inputs: Vec<GpuMetric>,
}

/// Every definition checked in order (each against the ones before it and the
/// `signals`' names); the first error names its definition and where in it.
fn checked(composites: &[Definition], signals: &[&str]) -> Result<Vec<Checked>, Error> {
    let mut out: Vec<Checked> = Vec::new();
    let mut names: BTreeSet<String> = BTreeSet::new();
    for definition in composites {
        let bad = |why: String| definition.error(None, &why);
        let (name, text) = definition
            .text
            .split_once('=')
            .ok_or_else(|| bad("expected NAME=EXPRESSION".into()))?;
        // Where the expression starts in the definition, for positions.
        let offset = definition.text.len() - text.trim_start().len();
        let (name, text) = (name.trim(), text.trim());
        let earlier = |n: &str| names.contains(n);
        if !valid_name(name) {
            return Err(bad(format!(
                "the name {} must be lower case letters, digits and _, starting with a letter or _",
                quoted(name)
            )));
        }
        if input_metric(name).is_some() || earlier(name) {
            return Err(bad(format!("the name {} is already taken", quoted(name))));
        }
        if signals.contains(&name) {
            return Err(bad(format!(
                "the name {} is already a --signal",
                quoted(name)
            )));
        }
        let expr =
            Expr::parse(text).map_err(|e| definition.error(Some(offset + e.at), &e.message))?;
        let mut inputs = Vec::new();
        for input in expr.inputs() {
            match input_metric(input) {
                Some(m) => inputs.push(m),
                None => {
                    let why = if earlier(input) {
                        "is a composite: composites read per-pod metrics only".to_string()
                    } else if signals.contains(&input) {
                        "is a signal without pods: composites read per-pod metrics only".to_string()
                    } else {
                        format!(
                            "is not a per-pod metric (known: {})",
                            input_names().join(", ")
                        )
                    };
                    return Err(bad(format!("{} {why}", quoted(input))));
                }
            }
        }
        if inputs.is_empty() {
            return Err(bad("reads no metric: a constant is no signal".into()));
        }
        names.insert(name.to_string());
        let checked = Checked {
            name: name.to_string(),
            text: text.to_string(),
            expr,
            inputs,
        };
        out.push(checked);
    }
    Ok(out)
}

/// The composite metrics file's size limit: a thousand definitions of a long line.
pub const FILE_LIMIT: u64 = kube_support::config_file::DEFAULT_LIMIT;

impl Catalog {
    /// The catalog of `composites` and `signals` ((namespace, name) each). Every error
    /// names the definition at fault, and where in it.
    pub fn new(composites: &[Definition], signals: &[(String, String)]) -> Result<Catalog, Error> {
        let mut catalog = Catalog::default();
        for (namespace, name) in signals {
            let leaked: &'static str = Box::leak(name.clone().into_boxed_str());
            if !catalog
                .signals
                .entry(namespace.clone())
                .or_default()
                .insert(leaked)
            {
                return Err(Error::Config(format!(
                    "--signal {namespace}/{name}: declared twice"
                )));
            }
        }
        for c in checked(composites, &catalog.signal_names())? {
            let leaked: &'static str = Box::leak(c.name.into_boxed_str());
            catalog.composites.insert(
                leaked,
                Arc::new(Composite {
                    name: leaked,
                    expr: c.expr,
                    text: c.text,
                    inputs: c.inputs,
                }),
            );
        }
        Ok(catalog)
    }

    /// The composite definitions of a file: one `NAME = EXPRESSION` a line; blank lines
    /// and `#` comments skipped. Read through the bounded reader: a regular file of at
    /// most [`FILE_LIMIT`] bytes (a FIFO or `/dev/zero` is refused at once).
    pub fn read_file(path: &Path) -> Result<Vec<Definition>, Error> {
        let text = kube_support::config_file::read_to_string(path, FILE_LIMIT).map_err(|e| {
            Error::Config(format!("--composite-metrics-file {}: {e}", path.display()))
        })?;
        Ok(Catalog::parse_file(&path.display().to_string(), &text))
    }

    /// Every definition checked as [`Catalog::new`] checks it (no signals), without
    /// building a catalog (whose names live as long as the process): each composite's
    /// name and expression (the fuzz target's entry).
    pub fn validate(composites: &[Definition]) -> Result<Vec<(String, Expr)>, Error> {
        Ok(checked(composites, &[])?
            .into_iter()
            .map(|c| (c.name, c.expr))
            .collect())
    }

    /// The definitions in a composite metrics file's `text`, read from `path`.
    pub fn parse_file(path: &str, text: &str) -> Vec<Definition> {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|(i, l)| Definition {
                origin: Origin::File {
                    path: path.to_string(),
                    line: i + 1,
                },
                // As written (less the line end), so that columns count from the
                // line's start.
                text: l.trim_end().to_string(),
            })
            .collect()
    }

    /// Every per-pod metric name served: built-in, then composites.
    pub fn pod_metric_names(&self) -> Vec<&'static str> {
        let mut names = input_names();
        names.extend(self.composites.keys().copied());
        names
    }

    /// Every signal's name, in any namespace, sorted, each once.
    pub fn signal_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.signals.values().flatten().copied().collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// The signals of `namespace`.
    pub fn signals_in(&self, namespace: &str) -> impl Iterator<Item = &'static str> + '_ {
        self.signals.get(namespace).into_iter().flatten().copied()
    }

    pub fn composites(&self) -> impl Iterator<Item = &Composite> {
        self.composites.values().map(|c| c.as_ref())
    }

    /// The metric a request names in `namespace`, and the aggregation its suffix asks
    /// for.
    pub fn resolve(
        &self,
        namespace: &str,
        requested: &str,
    ) -> Result<(Metric, Option<Aggregation>), Unresolved> {
        let (name, aggregation) = split_suffix(requested)?;
        let metric = if let Some(m) = input_metric(name) {
            Metric::Gpu(m)
        } else if let Some(c) = self.composites.get(name) {
            Metric::Composite(c.clone())
        } else if let Some(s) = self.signals.get(namespace).and_then(|set| set.get(name)) {
            if aggregation.is_some() {
                return Err(Unresolved::SignalAggregated {
                    requested: requested.to_string(),
                    name: name.to_string(),
                });
            }
            Metric::Signal(s)
        } else {
            return Err(Unresolved::NoMetric(name.to_string()));
        };
        Ok((metric, aggregation))
    }
}

/// Why a requested metric name resolves to no metric.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    /// No such metric: a 404.
    #[error("no metric {0:?}")]
    NoMetric(String),
    #[error(transparent)]
    Suffix(#[from] NotAnAggregation),
    #[error("{requested}: {name} is one value, not a value per pod: it takes no aggregation")]
    SignalAggregated { requested: String, name: String },
}

/// The fresh values of a per-pod `metric` for the pods `scope` covers: the built-in
/// metrics as [`super::pod_values`] answers them, a composite evaluated on each pod
/// that has every input fresh.
pub fn metric_values(
    fleets: &super::Fleets<'_>,
    pods: &PodIndex,
    namespace: &str,
    scope: &Scope<'_>,
    metric: &Metric,
    now: Instant,
    staleness: Duration,
) -> Result<Answer, Error> {
    let composite = match metric {
        Metric::Gpu(m) => {
            return super::pod_values(fleets.of(*m), pods, namespace, scope, *m, now, staleness);
        }
        Metric::Signal(s) => {
            return Err(Error::InvalidRequest(format!(
                "{s} is a signal without pods: ask for it as an external metric, through metrics-api or KEDA"
            )));
        }
        Metric::Composite(c) => c,
    };
    let answers = composite
        .inputs
        .iter()
        .map(|m| {
            let a = super::pod_values(fleets.of(*m), pods, namespace, scope, *m, now, staleness)?;
            Ok((m.name(), a))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    // Every input covers the same pods; a pod is in `values` of those where it has a
    // fresh value.
    let covered = answers
        .first()
        .map(|(_, a)| a.values.len() + a.stale + a.missing)
        .unwrap_or(0);
    let by_pod: Vec<BTreeMap<&str, &PodValue>> = answers
        .iter()
        .map(|(_, a)| a.values.iter().map(|v| (v.pod.as_str(), v)).collect())
        .collect();
    let mut answer = Answer::default();
    if let Some(first) = by_pod.first() {
        for pod in first.keys() {
            let inputs: Option<Vec<&PodValue>> =
                by_pod.iter().map(|m| m.get(pod).copied()).collect();
            let Some(inputs) = inputs else { continue };
            let value = composite.expr.eval(&|name| {
                answers
                    .iter()
                    .position(|(n, _)| *n == name)
                    .and_then(|i| inputs.get(i))
                    .map(|v| v.value)
            });
            match value {
                Ok(value) => answer.values.push(PodValue {
                    pod: (*pod).to_string(),
                    value,
                    // As old as its oldest input.
                    at: inputs.iter().map(|v| v.at).min().unwrap_or(inputs[0].at),
                }),
                // Left out, so counted missing below.
                Err(EvalError::NotFinite) => {
                    tracing::debug!(
                        metric = composite.name,
                        pod,
                        "the composite is not a finite number (a division by zero)"
                    );
                }
                Err(EvalError::Missing(_)) => {}
            }
        }
    }
    // The pods left out: stale if any input's data of them is stale (the most any
    // input counts), the rest missing.
    answer.stale = answers.iter().map(|(_, a)| a.stale).max().unwrap_or(0);
    answer.missing = covered
        .saturating_sub(answer.values.len())
        .saturating_sub(answer.stale);
    Ok(answer)
}

/// A signal's value now in `namespace`: its last reading if fresh. No reading (never
/// read, or its source failing) and a stale one are errors, never a 0.
pub fn signal_value(
    signals: &crate::source::signal::Signals,
    namespace: &str,
    name: &str,
    now: Instant,
    staleness: Duration,
) -> Result<(f64, std::time::SystemTime), Error> {
    let key = (namespace.to_string(), name.to_string());
    match signals.readings.get(&key) {
        // The signal loop keeps no value that is not finite; nor is one answered.
        Some(r) if !r.value.is_finite() => Err(Error::Scrape(format!(
            "signal {name} has no value: its source's answer is not a finite number"
        ))),
        Some(r) if now.saturating_duration_since(r.seen) <= staleness => Ok((r.value, r.at)),
        Some(r) => Err(Error::Scrape(format!(
            "signal {name} was last read {:.1}s ago, past the staleness limit",
            now.saturating_duration_since(r.seen).as_secs_f64()
        ))),
        None => Err(Error::Scrape(format!(
            "signal {name} has no value: its source has not answered (see the adapter's log)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Fleet, Observed, PodValues};
    use std::time::SystemTime;

    fn defs(list: &[&str]) -> Vec<Definition> {
        list.iter().map(|d| Definition::flag(*d)).collect()
    }

    #[test]
    fn bad_definitions_are_refused_naming_the_definition() {
        let signals = vec![("inference".to_string(), "gateway_queue".to_string())];
        for (def, says) in [
            ("pressure", "expected NAME=EXPRESSION"),
            ("Pressure=gpu_utilization", "lower case"),
            ("gpu_utilization=gpu_power_watts", "already taken"),
            (
                "pressure=max(gpu_utilization/70, vllm_queue/50)",
                "\"vllm_queue\" is not a per-pod metric",
            ),
            ("pressure=gpu_utilization / ", "at character"),
            ("pressure=42", "reads no metric"),
            ("gateway_queue=gpu_utilization", "already a --signal"),
            ("pressure=gateway_queue * 2", "signal without pods"),
        ] {
            let e = Catalog::new(&defs(&[def]), &signals)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("--composite-metric: "), "{def}: {e}");
            assert!(e.contains(&format!("{def:?}")), "names the definition: {e}");
            assert!(e.contains(says), "{def}: {e}");
        }
        let twice = Catalog::new(&defs(&["a=gpu_utilization", "a=gpu_power_watts"]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            twice.contains("\"a=gpu_power_watts\"") && twice.contains("taken"),
            "{twice}"
        );
        let chained = Catalog::new(&defs(&["a=gpu_utilization", "b=a*2"]), &[])
            .unwrap_err()
            .to_string();
        assert!(chained.contains("is a composite"), "{chained}");
    }

    #[test]
    fn names_resolve_with_their_aggregation_and_signals_stay_in_their_namespace() {
        let c = Catalog::new(
            &defs(&["pressure = max(gpu_utilization/70, gpu_memory_utilization/80)"]),
            &[("inference".to_string(), "gateway_queue".to_string())],
        )
        .unwrap();
        let (m, a) = c.resolve("x", "pressure:p95").unwrap();
        assert_eq!(
            (m.name(), a),
            ("pressure", Some(Aggregation::Quantile(0.95)))
        );
        let (m, a) = c.resolve("x", "gpu_power_watts").unwrap();
        assert_eq!((m.name(), a), ("gpu_power_watts", None));
        assert!(matches!(
            c.resolve("inference", "gateway_queue"),
            Ok((Metric::Signal("gateway_queue"), None))
        ));
        assert!(c.resolve("other", "gateway_queue").is_err());
        assert!(
            c.resolve("inference", "gateway_queue:p95")
                .unwrap_err()
                .to_string()
                .contains("no aggregation")
        );
        assert_eq!(
            c.resolve("x", "nothing").unwrap_err(),
            Unresolved::NoMetric("nothing".into())
        );
        assert_eq!(
            c.pod_metric_names().last(),
            Some(&"pressure"),
            "served next to the built-in ones"
        );
    }

    #[test]
    fn a_file_holds_one_definition_a_line_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("composites");
        std::fs::write(
            &path,
            "# pressure for the HPA\npressure = max(gpu_utilization/70, gpu_power_watts/300)\n\nbroken = max(\n",
        )
        .unwrap();
        let defs = Catalog::read_file(&path).unwrap();
        assert_eq!(defs.len(), 2);
        let e = Catalog::new(&defs, &[]).unwrap_err().to_string();
        // "broken = max(" ends at column 13: the error is at the end, column 14.
        assert!(e.starts_with(&format!("{}:4:14: ", path.display())), "{e}");
        assert!(Catalog::new(&defs[..1], &[]).is_ok());
    }

    /// Issue 27: a 20,000-term chain is refused at startup, naming the file, line and
    /// column where the term past the cap starts, with the line shortened.
    #[test]
    fn a_chain_past_the_cap_is_refused_with_its_line_and_column() {
        let chain = format!("  c = {}gpu_utilization", "gpu_utilization+".repeat(19_999));
        let text = format!("# ok\nfine = gpu_utilization\n{chain}\n");
        let file = Catalog::parse_file("composites.conf", &text);
        let e = Catalog::new(&file, &[]).unwrap_err().to_string();
        let column = "  c = ".len() + 1000 * "gpu_utilization+".len() + 1;
        assert!(
            e.starts_with(&format!("composites.conf:3:{column}: ")),
            "{}",
            &e[..e.len().min(300)]
        );
        assert!(e.contains("more than 1000 terms"), "{e}");
        assert!(
            e.len() < 300,
            "the definition is shortened: {} bytes",
            e.len()
        );
        // The same on the flag: the character within the flag's value.
        let e = Catalog::new(&defs(&[chain.trim()]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("at character {}: more than", column - 2)),
            "{e}"
        );
    }

    /// Issue 27 (item 10): the file is read by the bounded regular-file reader; a FIFO
    /// with no writer and /dev/zero are refused at once, naming the flag.
    #[test]
    fn a_fifo_or_dev_zero_is_refused_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        for (path, says) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a directory"),
        ] {
            let e = Catalog::read_file(path).unwrap_err().to_string();
            assert!(e.starts_with("--composite-metrics-file "), "{e}");
            assert!(e.contains(says), "{e}");
        }
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'#'; FILE_LIMIT as usize + 1]).unwrap();
        let e = Catalog::read_file(&big).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }

    /// Issue 27: a signal reading that is not finite is no value, never served.
    #[test]
    fn a_signal_that_is_not_finite_has_no_value() {
        use crate::source::signal::{Reading, Signals};
        let now = Instant::now();
        for value in [f64::INFINITY, f64::NAN, 2.5] {
            let mut signals = Signals::default();
            signals.readings.insert(
                ("ns".into(), "queue".into()),
                Reading {
                    value,
                    at: SystemTime::now(),
                    seen: now,
                },
            );
            let got = signal_value(&signals, "ns", "queue", now, Duration::from_secs(5));
            assert_eq!(got.is_ok(), value.is_finite(), "{value}: {got:?}");
        }
    }

    /// A composite over a fleet: each pod's value is the formula over its own inputs;
    /// pods lacking one are missing, pods with stale data stale.
    #[test]
    fn a_composite_is_its_formula_over_each_pods_own_values() {
        let now = Instant::now() + Duration::from_secs(60);
        let mut fleet = Fleet::default();
        let pods = [
            ("a", Some(84.0), Some(120.0), 1),
            ("b", Some(35.0), Some(290.0), 1),
            ("c", Some(50.0), None, 1),
            ("d", Some(99.0), Some(10.0), 30),
        ];
        for (name, util, power, age) in pods {
            let mut v = PodValues::default();
            if let Some(u) = util {
                v.values.insert(GpuMetric::Utilization, u);
            }
            if let Some(p) = power {
                v.values.insert(GpuMetric::PowerWatts, p);
            }
            fleet.pods.insert(
                ("ns".into(), name.into()),
                Observed {
                    values: v,
                    at: SystemTime::UNIX_EPOCH + Duration::from_secs(age),
                    seen: now - Duration::from_secs(age),
                },
            );
        }
        let c = Catalog::new(
            &defs(&["pressure=max(gpu_utilization/70, gpu_power_watts/300) - 0.5"]),
            &[],
        )
        .unwrap();
        let (m, _) = c.resolve("ns", "pressure").unwrap();
        let a = metric_values(
            &crate::query::Fleets {
                gpu: &fleet,
                serving: &Fleet::default(),
            },
            &PodIndex::default(),
            "ns",
            &Scope::Namespace,
            &m,
            now,
            Duration::from_secs(10),
        )
        .unwrap();
        let got: Vec<(&str, f64)> = a.values.iter().map(|v| (v.pod.as_str(), v.value)).collect();
        let want: Vec<(&str, f64)> = pods
            .iter()
            .filter(|(_, u, p, age)| u.is_some() && p.is_some() && *age < 10)
            .map(|(n, u, p, _)| (*n, (u.unwrap() / 70.0).max(p.unwrap() / 300.0) - 0.5))
            .collect();
        assert_eq!(got, want);
        assert_eq!((a.stale, a.missing), (1, 1), "d stale, c lacks power");
    }
}
