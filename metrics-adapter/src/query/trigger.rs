//! KEDA triggers: the metadata of an external-scaler trigger (or a metrics-api
//! request), parsed, and its value now. Shared by the gRPC scaler and the metrics-api
//! endpoint, so both read the same keys the same way.
//!
//! Trigger metadata (`scalerMetadata`):
//!
//! | key | meaning |
//! |---|---|
//! | `metric` | one of the adapter's metrics, e.g. `gpu_utilization`, a composite, or a signal of the namespace; a `:p95`-style suffix picks the aggregation (required) |
//! | `targetValue` | the HPA target (required, > 0) |
//! | `activationTargetValue` | active while the value is above it (default 0) |
//! | `aggregation` | `sum` (default), `average`, `max`, `min`, or a percentile `p50`, `p95`, `p99`, ... over the pods |
//! | `podSelector` | label selector over the ScaledObject namespace's pods, or |
//! | `deployment` | a Deployment of that namespace, whose pods are found through their owners (neither for a signal) |
//!
//! Why `sum` is the default: KEDA's default `metricType` is `AverageValue`, and the HPA
//! divides the value by the replica count. A sum over the pods divided by the pods is
//! the average per pod, so `targetValue: 60` keeps "60 % per pod". Answering an
//! average instead (`aggregation: average`) needs `metricType: Value`; an average with
//! `AverageValue` divides twice: the classic mistake.

use super::aggregate::{Aggregation, split_suffix};
use super::composite::{Metric, metric_values, signal_value};
use super::{AppState, Scope};
use crate::api::selector::Selector;
use crate::error::Error;
use crate::source::pods::Workload;
use std::collections::HashMap;
use std::time::Instant;

/// Which pods a trigger covers.
#[derive(Debug, Clone)]
pub enum Pods {
    Selector(Selector),
    Deployment(String),
}

/// A parsed trigger.
#[derive(Debug, Clone)]
pub struct Trigger {
    pub metric: Metric,
    pub target: f64,
    pub activation: f64,
    pub aggregation: Aggregation,
    /// The pods it covers; `None` for a signal without pods.
    pub pods: Option<Pods>,
}

fn number(meta: &HashMap<String, String>, key: &str) -> Result<Option<f64>, Error> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| Error::InvalidRequest(format!("{key}: {v:?} is not a number"))),
    }
}

/// Parse a trigger's metadata, for a ScaledObject in `namespace` (signals are
/// namespaced); every problem is an [`Error::InvalidRequest`] that names the key
/// (`INVALID_ARGUMENT` over gRPC, 400 over HTTP).
pub fn parse_trigger(
    state: &AppState,
    namespace: &str,
    meta: &HashMap<String, String>,
) -> Result<Trigger, Error> {
    let requested = meta
        .get("metric")
        .ok_or_else(|| Error::InvalidRequest("metric is required (e.g. gpu_utilization)".into()))?;
    let (metric, suffix) = state.catalog.resolve(namespace, requested).map_err(|e| {
        let (base, _) = split_suffix(requested).unwrap_or((requested, None));
        let mut known = state.catalog.pod_metric_names();
        known.extend(state.catalog.signals_in(namespace));
        if matches!(e, super::composite::Unresolved::NoMetric(_)) {
            Error::InvalidRequest(format!(
                "metric: unknown {base:?} (known: {})",
                known.join(", ")
            ))
        } else {
            Error::InvalidRequest(format!("metric: {e}"))
        }
    })?;
    let target = number(meta, "targetValue")?
        .filter(|t| *t > 0.0)
        .ok_or_else(|| Error::InvalidRequest("targetValue is required and must be > 0".into()))?;
    let activation = number(meta, "activationTargetValue")?.unwrap_or(0.0);
    let key = match meta.get("aggregation") {
        None => None,
        Some(text) => Some(Aggregation::parse(text).ok_or_else(|| {
            Error::InvalidRequest(format!(
                "aggregation: {text:?} is not one of sum, average, max, min, or a percentile p0 to p100 (e.g. p95)"
            ))
        })?),
    };
    let aggregation = match (suffix, key) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::InvalidRequest(format!(
                "aggregation: {b} contradicts the metric's suffix :{a}"
            )));
        }
        (a, b) => a.or(b).unwrap_or(Aggregation::Sum),
    };
    let pods = match (meta.get("podSelector"), meta.get("deployment")) {
        (None, None) if matches!(metric, Metric::Signal(_)) => None,
        (_, _) if matches!(metric, Metric::Signal(_)) => {
            return Err(Error::InvalidRequest(format!(
                "{requested} is a signal without pods: podSelector and deployment do not apply"
            )));
        }
        (Some(s), None) => {
            Some(Pods::Selector(Selector::parse(s).map_err(|e| {
                Error::InvalidRequest(format!("podSelector: {e}"))
            })?))
        }
        (None, Some(d)) if !d.is_empty() => Some(Pods::Deployment(d.clone())),
        _ => {
            return Err(Error::InvalidRequest(
                "exactly one of podSelector and deployment is required".into(),
            ));
        }
    };
    Ok(Trigger {
        metric,
        target,
        activation,
        aggregation,
        pods,
    })
}

/// The trigger's value now: its pods' fresh values combined, or the signal's value.
/// No pods at all (scaled to zero) is 0; pods whose data is all stale is an error, so
/// the HPA holds.
pub fn evaluate(state: &AppState, namespace: &str, t: &Trigger) -> Result<f64, Error> {
    let workload;
    let scope = match &t.pods {
        None => {
            let signals = state.signals.borrow();
            return signal_value(
                &signals,
                namespace,
                t.metric.name(),
                Instant::now(),
                state.staleness,
            )
            .map(|(v, _)| v);
        }
        Some(Pods::Selector(s)) => Scope::Selected(s),
        Some(Pods::Deployment(name)) => {
            workload = Workload {
                resource: "deployments.apps",
                name: name.clone(),
            };
            Scope::Workload(&workload)
        }
    };
    let a = state.with_fleets(|fleets| {
        metric_values(
            fleets,
            &state.pods.load(),
            namespace,
            &scope,
            &t.metric,
            Instant::now(),
            state.staleness,
        )
    })?;
    if a.values.is_empty() {
        if a.stale > 0 {
            return Err(Error::Stale {
                pods: a.stale,
                metric: t.metric.name(),
            });
        }
        // Pods that no exporter has reported (unreachable since start, or not scraped
        // yet) are an error, so that KEDA applies its `fallback` rather than scale on an
        // invented 0. Only when no pod is covered at all (a workload at zero replicas)
        // is the answer truly 0.
        if a.missing > 0 {
            return Err(Error::NeverSeen {
                pods: a.missing,
                metric: t.metric.name(),
            });
        }
        return Ok(0.0);
    }
    // Not empty (checked above): no value only when the values overflow together.
    a.combined(t.aggregation)
        .map(|(v, _)| v)
        .ok_or(Error::NotFinite {
            pods: a.values.len(),
            metric: t.metric.name(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::GpuMetric;

    fn meta(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The state a KEDA query sees: `reported` pods have fresh utilisation data; every
    /// pod of `running` is known to the pod watch with `app=web`.
    fn state(running: &[&str], reported: &[(&str, f64)]) -> AppState {
        use crate::fleet::{Fleet, Observed, PodValues};
        use crate::source::pods::{PodIndex, PodInfo};
        let mut fleet = Fleet::default();
        for (name, util) in reported {
            let mut v = PodValues::default();
            v.values.insert(GpuMetric::Utilization, *util);
            fleet.pods.insert(
                ("ns".into(), (*name).into()),
                Observed {
                    values: v,
                    at: std::time::SystemTime::UNIX_EPOCH,
                    seen: Instant::now(),
                },
            );
        }
        let mut pods = PodIndex {
            synced: true,
            up: true,
            ..PodIndex::default()
        };
        for name in running {
            pods.pods.insert(
                ("ns".into(), (*name).into()),
                PodInfo {
                    labels: [("app".to_string(), "web".to_string())].into(),
                    workloads: Vec::new(),
                },
            );
        }
        AppState {
            fleet: std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(fleet)),
            serving: Default::default(),
            pods: std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(pods)),
            staleness: std::time::Duration::from_secs(30),
            window_seconds: 2,
            catalog: Default::default(),
            signals: crate::source::signal::handle(),
        }
    }

    #[test]
    fn pods_never_reported_are_an_error_not_a_zero() {
        let t = parse_trigger(
            &state(&[], &[]),
            "ns",
            &meta(&[
                ("metric", "gpu_utilization"),
                ("targetValue", "60"),
                ("podSelector", "app=web"),
            ]),
        )
        .unwrap();
        let never = evaluate(&state(&["web-0", "web-1"], &[]), "ns", &t).unwrap_err();
        assert!(
            matches!(never, Error::NeverSeen { pods: 2, .. }),
            "{never:?}"
        );
        // No pod at all (a workload at zero replicas) is a true 0 ...
        assert_eq!(evaluate(&state(&[], &[]), "ns", &t).unwrap(), 0.0);
        // ... and pods with data are summed, those without left out.
        let some = state(&["web-0", "web-1"], &[("web-0", 70.0)]);
        assert_eq!(evaluate(&some, "ns", &t).unwrap(), 70.0);
    }

    #[test]
    fn triggers_parse_with_defaults_and_name_what_is_wrong() {
        let t = parse_trigger(
            &state(&[], &[]),
            "ns",
            &meta(&[
                ("metric", "gpu_utilization"),
                ("targetValue", "60"),
                ("podSelector", "app=resnet"),
            ]),
        )
        .unwrap();
        assert_eq!(t.aggregation, Aggregation::Sum);
        assert_eq!((t.target, t.activation), (60.0, 0.0));
        for (bad, says) in [
            (
                meta(&[("targetValue", "60"), ("podSelector", "a=b")]),
                "metric",
            ),
            (
                meta(&[
                    ("metric", "gpu_magic"),
                    ("targetValue", "60"),
                    ("podSelector", "a=b"),
                ]),
                "unknown",
            ),
            (
                meta(&[
                    ("metric", "gpu_utilization"),
                    ("targetValue", "0"),
                    ("podSelector", "a=b"),
                ]),
                "targetValue",
            ),
            (
                meta(&[
                    ("metric", "gpu_utilization"),
                    ("targetValue", "6"),
                    ("podSelector", "a=b"),
                    ("deployment", "d"),
                ]),
                "exactly one",
            ),
            (
                meta(&[
                    ("metric", "gpu_utilization"),
                    ("targetValue", "6"),
                    ("podSelector", "a in ("),
                ]),
                "podSelector",
            ),
            (
                meta(&[
                    ("metric", "gpu_utilization"),
                    ("targetValue", "6"),
                    ("deployment", "d"),
                    ("aggregation", "median"),
                ]),
                "aggregation",
            ),
        ] {
            let e = tonic::Status::from(parse_trigger(&state(&[], &[]), "ns", &bad).unwrap_err());
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(says), "{says}: {}", e.message());
        }
    }

    #[test]
    fn each_aggregation_combines_the_pods_values_its_way() {
        let values = [("web-0", 70.0), ("web-1", 20.0), ("web-2", 45.0)];
        let reported = state(&["web-0", "web-1", "web-2"], &values);
        let v: Vec<f64> = values.iter().map(|(_, x)| *x).collect();
        let sum: f64 = v.iter().sum();
        for (aggregation, want) in [
            ("sum", sum),
            ("average", sum / v.len() as f64),
            ("max", v.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
            ("min", v.iter().copied().fold(f64::INFINITY, f64::min)),
        ] {
            let t = parse_trigger(
                &state(&[], &[]),
                "ns",
                &meta(&[
                    ("metric", "gpu_utilization"),
                    ("targetValue", "60"),
                    ("activationTargetValue", "5.5"),
                    ("podSelector", "app=web"),
                    ("aggregation", aggregation),
                ]),
            )
            .unwrap();
            assert_eq!(t.activation, 5.5);
            assert_eq!(
                evaluate(&reported, "ns", &t).unwrap(),
                want,
                "{aggregation}"
            );
        }
    }

    /// Issue 27: a pod whose stored value is not finite is missing (its neighbours
    /// answer), and pods whose sum overflows are an error, never +Inf and never 0.
    #[test]
    fn values_that_are_not_finite_are_missing_and_an_overflow_is_an_error() {
        let trigger = |aggregation: &str| {
            parse_trigger(
                &state(&[], &[]),
                "ns",
                &meta(&[
                    ("metric", "gpu_utilization"),
                    ("targetValue", "60"),
                    ("podSelector", "app=web"),
                    ("aggregation", aggregation),
                ]),
            )
            .unwrap()
        };
        let pods = ["web-0", "web-1", "web-2"];
        let inf = state(
            &pods,
            &[
                ("web-0", f64::INFINITY),
                ("web-1", 20.0),
                ("web-2", f64::NAN),
            ],
        );
        assert_eq!(evaluate(&inf, "ns", &trigger("sum")).unwrap(), 20.0);
        assert_eq!(evaluate(&inf, "ns", &trigger("p95")).unwrap(), 20.0);
        let big = state(&pods, &[("web-0", 1e308), ("web-1", 1e308)]);
        assert!(matches!(
            evaluate(&big, "ns", &trigger("sum")),
            Err(Error::NotFinite { pods: 2, .. })
        ));
        assert_eq!(evaluate(&big, "ns", &trigger("average")).unwrap(), 1e308);
    }

    #[test]
    fn a_deployment_is_named_and_never_empty() {
        let t = parse_trigger(
            &state(&[], &[]),
            "ns",
            &meta(&[
                ("metric", "gpu_power_watts"),
                ("targetValue", "300"),
                ("deployment", "resnet"),
            ]),
        )
        .unwrap();
        assert_eq!(t.metric.name(), "gpu_power_watts");
        assert!(matches!(&t.pods, Some(Pods::Deployment(d)) if d == "resnet"));
        let empty = parse_trigger(
            &state(&[], &[]),
            "ns",
            &meta(&[
                ("metric", "gpu_power_watts"),
                ("targetValue", "300"),
                ("deployment", ""),
            ]),
        )
        .unwrap_err();
        assert!(empty.to_string().contains("exactly one"), "{empty}");
        let neither = parse_trigger(
            &state(&[], &[]),
            "ns",
            &meta(&[("metric", "gpu_power_watts"), ("targetValue", "300")]),
        )
        .unwrap_err();
        assert!(neither.to_string().contains("exactly one"), "{neither}");
    }

    #[test]
    fn pods_whose_data_is_all_stale_are_an_error() {
        let t = parse_trigger(
            &state(&[], &[]),
            "ns",
            &meta(&[
                ("metric", "gpu_utilization"),
                ("targetValue", "60"),
                ("podSelector", "app=web"),
            ]),
        )
        .unwrap();
        let s = state(&["web-0", "web-1"], &[("web-0", 70.0), ("web-1", 10.0)]);
        let mut fleet = (**s.fleet.load()).clone();
        for observed in fleet.pods.values_mut() {
            observed.seen = Instant::now() - s.staleness - std::time::Duration::from_secs(1);
        }
        s.fleet.store(std::sync::Arc::new(fleet));
        let e = evaluate(&s, "ns", &t).unwrap_err();
        assert!(matches!(e, Error::Stale { pods: 2, .. }), "{e:?}");
    }

    /// A state with the signal `gateway_queue` declared in `ns` and read `age` ago as
    /// `value` (never read when `None`).
    fn with_signal(reading: Option<(f64, std::time::Duration)>) -> AppState {
        use crate::query::composite::Catalog;
        use crate::source::signal::Reading;
        let mut s = state(&[], &[]);
        s.catalog = std::sync::Arc::new(
            Catalog::new(&[], &[("ns".to_string(), "gateway_queue".to_string())]).unwrap(),
        );
        if let Some((value, age)) = reading {
            s.signals.send_modify(|sig| {
                sig.readings.insert(
                    ("ns".into(), "gateway_queue".into()),
                    Reading {
                        value,
                        at: std::time::SystemTime::UNIX_EPOCH,
                        seen: Instant::now() - age,
                    },
                );
            });
        }
        s
    }

    #[test]
    fn a_signal_trigger_reads_the_signal_and_never_invents_a_value() {
        let m = meta(&[("metric", "gateway_queue"), ("targetValue", "8")]);
        let fresh = with_signal(Some((3.0, std::time::Duration::from_secs(1))));
        let t = parse_trigger(&fresh, "ns", &m).unwrap();
        assert!(t.pods.is_none());
        assert_eq!(evaluate(&fresh, "ns", &t).unwrap(), 3.0);
        // Another namespace has no such signal.
        let e = parse_trigger(&fresh, "other", &m).unwrap_err().to_string();
        assert!(e.contains("unknown \"gateway_queue\""), "{e}");
        // Never read, or read too long ago: an error, not 0.
        for s in [
            with_signal(None),
            with_signal(Some((3.0, std::time::Duration::from_secs(300)))),
        ] {
            let t = parse_trigger(&s, "ns", &m).unwrap();
            let e = evaluate(&s, "ns", &t).unwrap_err();
            assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
        }
        // Pods do not apply to a signal.
        let with_pods = meta(&[
            ("metric", "gateway_queue"),
            ("targetValue", "8"),
            ("deployment", "llm"),
        ]);
        let e = parse_trigger(&fresh, "ns", &with_pods)
            .unwrap_err()
            .to_string();
        assert!(e.contains("signal without pods"), "{e}");
    }

    #[test]
    fn a_suffix_picks_the_aggregation_and_may_not_contradict_the_key() {
        let values = [
            ("web-0", 70.0),
            ("web-1", 20.0),
            ("web-2", 45.0),
            ("web-3", 90.0),
        ];
        let s = state(&["web-0", "web-1", "web-2", "web-3"], &values);
        let base = [("targetValue", "60"), ("podSelector", "app=web")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = base.to_vec();
            pairs.extend_from_slice(extra);
            meta(&pairs)
        };
        let t = parse_trigger(&s, "ns", &with(&[("metric", "gpu_utilization:p95")])).unwrap();
        assert_eq!(t.aggregation, Aggregation::Quantile(0.95));
        // p95 of 20, 45, 70, 90: rank 2.85, between 70 and 90.
        let want = 70.0 + 0.85 * (90.0 - 70.0);
        assert!((evaluate(&s, "ns", &t).unwrap() - want).abs() < 1e-9);
        let same = with(&[("metric", "gpu_utilization:max"), ("aggregation", "max")]);
        assert_eq!(
            parse_trigger(&s, "ns", &same).unwrap().aggregation,
            Aggregation::Max
        );
        let clash = with(&[("metric", "gpu_utilization:max"), ("aggregation", "p95")]);
        let e = parse_trigger(&s, "ns", &clash).unwrap_err().to_string();
        assert!(e.contains("contradicts"), "{e}");
        let bad = with(&[("metric", "gpu_utilization:p200")]);
        let e = parse_trigger(&s, "ns", &bad).unwrap_err().to_string();
        assert!(e.contains("not an aggregation"), "{e}");
    }
}
