//! The per-pod values, computed by the engine: each built-in metric is one PromQL
//! aggregation `by` the pod, so an answer holds one sample per pod, never the fleet's
//! raw per-GPU series. A round's memory then grows with the pods served, not the GPUs,
//! and its cost on the engine is a fixed set of queries ([`queries`]), however many
//! HPAs and ScaledObjects ask.
//!
//! The queries say in PromQL what the direct source's derivation says in Rust
//! (`source::derive`, whose module comment is the definition): a pod's series are the
//! ones labelled with it; a shared GPU's unlabelled remainder is nobody's; percentages
//! are averaged over the pod's devices, bytes and watts summed; MIG instances, which
//! have no `DCGM_FI_DEV_GPU_UTIL`, use the graphics engine's activity. A sample that is
//! negative or not a finite number is left out (`>= 0 < +Inf`).
//!
//! Staleness is the engine's: every query is sent with `lookback_delta` set to
//! `--max-staleness` ([`lookback_delta`]), so a selector only sees samples that recent
//! instead of the engine's default 5 minutes. That costs one selection of each series
//! set; filtering in PromQL (`timestamp(x) > time() - S`) would select every set twice,
//! which was 40 % of a round through Thanos. Freshness is the oldest sample time among
//! the pod's series, from `timestamp()` (an instant query's value carries its
//! evaluation time). An engine that ignores the parameter (Prometheus before 2.43,
//! older Mimir) answers with up to its own lookback: the oldest time then shows it,
//! and such a pod is left out whole ([`assemble`]).
//!
//! Labels: scraped with `honorLabels: true`, series carry the exporter's `pod` and
//! `namespace`. With `honorLabels: false` Prometheus renames them `exported_pod` and
//! `exported_namespace` (its own `pod`/`namespace` then name the exporter pod); the
//! queries group by all four, and the renamed ones win here.
//!
//! The test `e2e::adapter_prometheus` holds these queries to `derive` on the same
//! series, in Prometheus 3's own engine.

use super::answer::VectorSample;
use crate::error::Error;
use crate::fleet::{Fleet, GpuMetric, Observed, PodKey, PodValues};
use crate::source::limits::Rejection;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, UNIX_EPOCH};

/// What one of a round's queries answers for each pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The pod's value of a built-in metric.
    Value(GpuMetric),
    /// The oldest sample time among the pod's series, Unix seconds.
    Oldest,
}

/// One query of a round.
#[derive(Debug, Clone, PartialEq)]
pub struct PodQuery {
    pub answers: Answer,
    pub promql: String,
    /// The series a recording rule of this query keeps ([`recording_rules`]):
    /// Prometheus's `level:metric:operation` convention, the level being the pod.
    pub record: &'static str,
}

/// Where a round's per-pod values are computed (`--prometheus-queries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Queries {
    /// Each query aggregates the raw per-GPU series per pod when the round asks.
    #[default]
    Inline,
    /// Each query reads the per-pod series that the engine's recording rules keep
    /// ([`recording_rules`]): the aggregation runs in each shard as it ingests, and a
    /// round selects one series per pod and query.
    Recorded,
}

/// How often the printed rules are evaluated: no less often than the exporters are
/// commonly scraped, so a recorded value is at most one interval behind its samples.
pub const RULE_INTERVAL: &str = "15s";

/// The recording rules for [`Queries::Recorded`] as a Prometheus rule file (also a
/// `PrometheusRule`'s `spec`): one rule per inline query, recording its answer.
///
/// Rules are evaluated with the engine's own lookback, not `--max-staleness`: a pod
/// whose samples are older than the staleness still gets recorded values, and its
/// recorded oldest sample time says so, so the adapter leaves it out whole.
pub fn recording_rules() -> String {
    let mut out = String::from(
        "# Recording rules for gpu-metrics-adapter --prometheus-queries=recorded\n\
         # (gpu-metrics-adapter --print-recording-rules): one per-pod series per metric,\n\
         # computed where the exporters' series are stored, so the adapter's rounds\n\
         # select one series per pod instead of aggregating every GPU's.\n\
         groups:\n",
    );
    out.push_str(&format!(
        "  - name: gpu-metrics-adapter\n    interval: {RULE_INTERVAL}\n    rules:\n"
    ));
    for q in queries() {
        out.push_str(&format!(
            "      - record: {}\n        expr: '{}'\n",
            q.record,
            // YAML single-quoted scalar: a quote is written twice.
            q.promql.replace('\'', "''")
        ));
    }
    out
}

/// The labels a pod's answer is grouped by (see the module comment for the renames).
const POD: &str = "namespace, pod, exported_namespace, exported_pod";
/// The labels naming a device: a GPU, or one of its MIG instances.
const DEVICE: &str = "UUID, GPU_I_ID";

const UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
const GR_ENGINE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
const POWER: &str = "DCGM_FI_DEV_POWER_USAGE";
const TENSOR: &str = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE";

/// The samples of `selector` that count: a number, not negative. (Their age is the
/// engine's lookback, [`lookback_delta`].)
fn valid(selector: &str) -> String {
    format!("({selector} >= 0 < +Inf)")
}

/// A family's series that name a pod.
fn of_pods(family: &str) -> String {
    format!("{family}{{pod!=\"\"}}")
}

/// The `lookback_delta` every query of a round is sent with: the staleness, in seconds
/// as Prometheus, Thanos and Mimir read it (`45`, `30.5`).
pub fn lookback_delta(staleness: Duration) -> String {
    staleness.as_secs_f64().to_string()
}

/// A round's queries as `mode` asks them: [`queries`], or each one's recorded series.
pub fn queries_for(mode: Queries) -> Vec<PodQuery> {
    let inline = queries();
    match mode {
        Queries::Inline => inline,
        Queries::Recorded => inline
            .into_iter()
            .map(|q| PodQuery {
                promql: q.record.to_string(),
                ..q
            })
            .collect(),
    }
}

/// A round's queries: one per built-in metric, and the pods' oldest sample times.
pub fn queries() -> Vec<PodQuery> {
    let pods = |family: &str| valid(&of_pods(family));
    // A device's memory: every FB_USED series of it (the pods' shares and the
    // remainder) plus its FB_FREE. Told apart by a label before the union, since `or`
    // matches series without their names.
    let capacity = format!(
        "sum by ({DEVICE}) (label_replace({}, \"part\", \"used\", \"\", \"\") \
         or label_replace({}, \"part\", \"free\", \"\", \"\")) > 0",
        valid(FB_USED),
        valid(FB_FREE),
    );
    let oldest = crate::source::derive::FAMILIES
        .iter()
        .enumerate()
        .map(|(i, f)| {
            format!(
                "label_replace(min by ({POD}) (timestamp({})), \"family\", \"{i}\", \"\", \"\")",
                of_pods(f)
            )
        })
        .collect::<Vec<_>>()
        .join(" or ");
    let value = |m: GpuMetric, record: &'static str, promql: String| PodQuery {
        answers: Answer::Value(m),
        promql,
        record,
    };
    vec![
        value(
            GpuMetric::Utilization,
            "namespace_pod:gpu_utilization:avg",
            format!(
                "avg by ({POD}) ({} or on ({DEVICE}, {POD}) 100 * {})",
                pods(UTIL),
                valid(&format!("{GR_ENGINE}{{pod!=\"\", GPU_I_ID!=\"\"}}"))
            ),
        ),
        value(
            GpuMetric::MemoryUsedBytes,
            "namespace_pod:gpu_memory_used_bytes:sum",
            format!("1048576 * sum by ({POD}) ({})", pods(FB_USED)),
        ),
        value(
            GpuMetric::MemoryUtilization,
            "namespace_pod:gpu_memory_utilization:avg",
            format!(
                "avg by ({POD}) (100 * {} / on ({DEVICE}) group_left () ({capacity}))",
                pods(FB_USED)
            ),
        ),
        value(
            GpuMetric::PowerWatts,
            "namespace_pod:gpu_power_watts:sum",
            format!("sum by ({POD}) ({})", pods(POWER)),
        ),
        value(
            GpuMetric::TensorActive,
            "namespace_pod:gpu_tensor_active:avg",
            format!("100 * avg by ({POD}) ({})", pods(TENSOR)),
        ),
        PodQuery {
            answers: Answer::Oldest,
            promql: format!("min by ({POD}) ({oldest})"),
            record: "namespace_pod:gpu_sample_timestamp_seconds:min",
        },
    ]
}

/// One answer's sample as a round keeps it: the pod it names and its number (`None`
/// when it is not a finite number, so that pod gets no such value).
pub(super) type Row = (Option<PodKey>, Option<f64>);

/// The pod a sample names and its value, as a round keeps them.
pub(super) fn row(sample: VectorSample) -> Row {
    let labels = exporter_labels(sample.metric.labels);
    let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let pod = get("namespace").zip(get("pod"));
    let value = sample.value.1.parse::<f64>().ok().filter(|v| v.is_finite());
    (pod, value)
}

/// The workload labels of a series as the exporter wrote them: with
/// `honorLabels: false` Prometheus's own `pod` and `namespace` give way to the
/// exporter's, renamed `exported_pod` and `exported_namespace`.
fn exporter_labels(mut labels: Vec<(String, String)>) -> Vec<(String, String)> {
    let exported: Vec<String> = labels
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("exported_").map(str::to_string))
        .collect();
    labels.retain(|(k, _)| !exported.contains(k));
    for (k, _) in &mut labels {
        if let Some(base) = k.strip_prefix("exported_") {
            *k = base.to_string();
        }
    }
    labels
}

/// Says once per process that the engine answered samples older than its
/// `lookback_delta`: an operator should know why pods go missing.
fn warn_lookback_ignored() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "the Prometheus-compatible engine answered samples older than --max-staleness: \
             it ignores the lookback_delta query parameter (Prometheus before 2.43, older \
             Mimir), so pods with such a series are left out whole; upgrade the engine"
        )
    });
}

/// A pod as a round's answers describe it.
#[derive(Default)]
struct Described {
    values: BTreeMap<GpuMetric, f64>,
    oldest: Option<f64>,
}

/// A round's answers as they are decoded: each sample lands on its pod at once, so a
/// round holds one record per pod (by namespace, then name), never its answers' rows
/// (at 50,000 pods, six answers' rows were about 35 MB more at the round's peak).
pub(super) struct Gathered {
    pods: HashMap<String, HashMap<String, Described>>,
    count: usize,
    max_pods: usize,
    now_unix: f64,
}

impl Gathered {
    /// An empty round as of `now_unix`, holding at most `max_pods` pods.
    pub(super) fn new(now_unix: f64, max_pods: usize) -> Gathered {
        Gathered {
            pods: HashMap::new(),
            count: 0,
            max_pods,
            now_unix,
        }
    }

    /// One sample of the query that `answers`; a pod past `max_pods` is the pod
    /// budget's refusal.
    pub(super) fn take(&mut self, answers: Answer, (pod, value): Row) -> Result<(), Error> {
        let (Some((namespace, name)), Some(value)) = (pod, value) else {
            return Ok(());
        };
        let known = self
            .pods
            .get(namespace.as_str())
            .is_some_and(|pods| pods.contains_key(name.as_str()));
        if !known {
            if self.count == self.max_pods {
                return Err(Error::OverLimit {
                    reason: Rejection::PodBudget,
                    message: format!(
                        "the answers name more than the {} pods allowed (--max-pods)",
                        self.max_pods
                    ),
                });
            }
            self.count += 1;
        }
        let described = self
            .pods
            .entry(namespace)
            .or_default()
            .entry(name)
            .or_default();
        match answers {
            // Levels, ratios and counts are never below 0 (the queries leave such
            // samples out, but a sum can still overflow to a huge number).
            Answer::Value(metric) if value >= 0.0 => {
                described.values.insert(metric, value);
            }
            Answer::Value(_) => {}
            // A scrape time in the future (clock skew, or a garbage answer such as
            // `1e300`) counts as now: no sample is fresher than the answer, and such
            // times do not fit a SystemTime (they panicked the source; found by
            // fuzzing).
            //
            // A pod answered twice (recorded series of one pod in two shards while its
            // node's target moves between them) is as old as its oldest answer.
            Answer::Oldest => {
                let at = value.min(self.now_unix);
                described.oldest = Some(described.oldest.map_or(at, |o| o.min(at)));
            }
        }
        Ok(())
    }
}

/// One round's answers into the fleet: the pods with a sample time no older than
/// `staleness`.
pub(super) fn assemble(gathered: Gathered, staleness: Duration) -> Fleet {
    let now = Instant::now();
    let now_unix = gathered.now_unix;
    let pods = gathered
        .pods
        .into_iter()
        .flat_map(|(namespace, pods)| {
            pods.into_iter()
                .map(move |(name, described)| ((namespace.clone(), name), described))
        })
        .filter_map(|(pod, described)| {
            // A pod without a time (its series went stale between two of the round's
            // queries) is not served from this round; nor is one with a series older
            // than the staleness, which only an engine that ignores `lookback_delta`
            // answers (its values may hold that series).
            let at = described.oldest?;
            let age = (now_unix - at).max(0.0);
            if age > staleness.as_secs_f64() {
                warn_lookback_ignored();
                return None;
            }
            if described.values.is_empty() {
                return None;
            }
            let age = Duration::from_secs_f64(age);
            let observed = Observed {
                values: PodValues {
                    values: described.values,
                },
                at: UNIX_EPOCH + Duration::from_secs_f64(at.max(0.0)),
                seen: now.checked_sub(age).unwrap_or(now),
            };
            Some((pod, observed))
        })
        .collect();
    Fleet {
        pods,
        targets: 1,
        answered: 1,
        last_answer: Some(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_labels_win_over_prometheus_target_labels() {
        let m: Vec<(String, String)> = [
            ("pod", "gpu-exporter-x7k2p"),
            ("namespace", "gpu-monitoring"),
            ("exported_pod", "resnet-0"),
            ("exported_namespace", "inference"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut l = exporter_labels(m);
        l.sort();
        assert_eq!(
            l,
            vec![
                ("namespace".to_string(), "inference".to_string()),
                ("pod".to_string(), "resnet-0".to_string()),
            ]
        );
    }

    fn pod(ns: &str, name: &str) -> Option<PodKey> {
        Some((ns.to_string(), name.to_string()))
    }

    fn round(answers: Vec<(Answer, Vec<Row>)>, max_pods: usize) -> Result<Fleet, Error> {
        let mut gathered = Gathered::new(NOW, max_pods);
        for (answers, rows) in answers {
            for row in rows {
                gathered.take(answers, row)?;
            }
        }
        Ok(assemble(gathered, Duration::from_secs(60)))
    }

    const NOW: f64 = 1_795_620_500.0;

    /// Each query's rows land on their pod's value; a pod is served only with a time
    /// within the staleness, and with at least one value.
    #[test]
    fn rows_become_pods_with_their_values_and_times() {
        let util = Answer::Value(GpuMetric::Utilization);
        let power = Answer::Value(GpuMetric::PowerWatts);
        let fleet = round(
            vec![
                (
                    util,
                    vec![
                        (pod("ml", "a"), Some(70.0)),
                        (pod("ml", "stale"), Some(10.0)),
                        (pod("ml", "untimed"), Some(10.0)),
                    ],
                ),
                (
                    power,
                    vec![(pod("ml", "a"), Some(500.0)), (None, Some(1.0))],
                ),
                (
                    Answer::Oldest,
                    vec![
                        (pod("ml", "a"), Some(NOW - 2.5)),
                        (pod("ml", "stale"), Some(NOW - 61.0)),
                        (pod("ml", "no-values"), Some(NOW)),
                    ],
                ),
            ],
            10,
        )
        .unwrap();
        let keys: Vec<_> = fleet.pods.keys().cloned().collect();
        assert_eq!(keys, vec![("ml".to_string(), "a".to_string())]);
        let a = &fleet.pods[&("ml".to_string(), "a".to_string())];
        assert_eq!(a.values.values[&GpuMetric::Utilization], 70.0);
        assert_eq!(a.values.values[&GpuMetric::PowerWatts], 500.0);
        let at = a.at.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        assert!((at - (NOW - 2.5)).abs() < 1e-3, "{at}");
    }

    /// The pod budget holds while answers are read, not after: the pod one past it is
    /// the refusal.
    #[test]
    fn pods_past_the_budget_are_refused() {
        let rows = |n: usize| {
            (0..n)
                .map(|i| (pod("ml", &format!("p{i}")), Some(NOW)))
                .collect::<Vec<_>>()
        };
        round(vec![(Answer::Oldest, rows(3))], 3).unwrap();
        let e = round(vec![(Answer::Oldest, rows(4))], 3).unwrap_err();
        assert!(
            matches!(
                e,
                Error::OverLimit {
                    reason: Rejection::PodBudget,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// A pod answered twice for its oldest sample time (its recorded series in two
    /// shards while its node's target moves) is as old as the older answer, in either
    /// order.
    #[test]
    fn a_pod_answered_twice_is_as_old_as_its_older_answer() {
        for times in [[NOW - 50.0, NOW - 70.0], [NOW - 70.0, NOW - 50.0]] {
            let fleet = round(
                vec![
                    (
                        Answer::Value(GpuMetric::Utilization),
                        vec![(pod("ml", "a"), Some(1.0))],
                    ),
                    (
                        Answer::Oldest,
                        times.iter().map(|t| (pod("ml", "a"), Some(*t))).collect(),
                    ),
                ],
                10,
            )
            .unwrap();
            assert!(fleet.pods.is_empty(), "70 s is past the 60 s staleness");
        }
    }

    /// Recorded queries select, for each inline query, the series its rule records;
    /// the rule file holds each inline query once, under that name, in a group with an
    /// interval (Prometheus's 1-minute default would age every value by a minute).
    #[test]
    fn recorded_queries_select_what_the_rules_record() {
        let inline = queries();
        let recorded = queries_for(Queries::Recorded);
        assert_eq!(queries_for(Queries::Inline), inline);
        let rules = recording_rules();
        assert!(
            rules.contains(&format!("    interval: {RULE_INTERVAL}\n")),
            "{rules}"
        );
        let mut names: Vec<&str> = Vec::new();
        for (i, r) in inline.iter().zip(&recorded) {
            assert_eq!(i.answers, r.answers);
            assert_eq!(r.promql, i.record);
            assert!(
                r.promql
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "{}",
                r.promql
            );
            let rule = format!(
                "      - record: {}\n        expr: '{}'\n",
                i.record,
                i.promql.replace('\'', "''")
            );
            assert!(rules.contains(&rule), "{rule} not in\n{rules}");
            names.push(i.record);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), inline.len(), "one name per query");
    }

    /// Found by the `prometheus_json` fuzz target: a `timestamp()` answer of `+Inf` or
    /// `1e300` panicked the round (`Duration::from_secs_f64`), which ended the source.
    /// A time past now counts as now; one that is no number dates nothing.
    #[test]
    fn scrape_times_past_now_or_not_finite_do_not_panic_and_count_as_now() {
        for stamp in ["+Inf", "1e300", "2e19", "1795620600", "NaN"] {
            let value = stamp.parse::<f64>().ok().filter(|v| v.is_finite());
            let fleet = round(
                vec![
                    (
                        Answer::Value(GpuMetric::Utilization),
                        vec![(pod("ml", "train-0"), Some(80.0))],
                    ),
                    (Answer::Oldest, vec![(pod("ml", "train-0"), value)]),
                ],
                10,
            )
            .unwrap();
            match fleet.pods.values().next() {
                None => assert!(["+Inf", "NaN"].contains(&stamp), "{stamp}"),
                Some(observed) => {
                    let at = observed.at.duration_since(UNIX_EPOCH).unwrap();
                    assert_eq!(at.as_secs_f64(), NOW, "{stamp}");
                }
            }
        }
    }

    /// Every query groups by the pod's labels and their renames, so an answer holds
    /// one sample per pod; none filters by time (that is the lookback's), and the
    /// lookback is the staleness in seconds.
    #[test]
    fn every_query_aggregates_by_pod_and_the_lookback_is_the_staleness() {
        let qs = queries();
        assert_eq!(qs.len(), 6);
        for q in &qs {
            assert!(
                ["avg", "sum", "min"]
                    .iter()
                    .any(|op| q.promql.contains(&format!("{op} by ({POD}) ("))),
                "{}",
                q.promql
            );
            assert!(!q.promql.contains("time()"), "{}", q.promql);
        }
        assert_eq!(lookback_delta(Duration::from_millis(30_500)), "30.5");
        assert_eq!(lookback_delta(Duration::from_secs(45)), "45");
    }
}
