//! KEDA triggers: the metadata of an external-scaler trigger (or a metrics-api
//! request), parsed, and its value now. Shared by the gRPC scaler and the metrics-api
//! endpoint, so both read the same keys the same way.
//!
//! Trigger metadata (`scalerMetadata`):
//!
//! | key | meaning |
//! |---|---|
//! | `metric` | one of the adapter's metrics, e.g. `gpu_utilization` (required) |
//! | `targetValue` | the HPA target (required, > 0) |
//! | `activationTargetValue` | active while the value is above it (default 0) |
//! | `aggregation` | `sum` (default), `average`, `max`, `min` over the pods |
//! | `podSelector` | label selector over the ScaledObject namespace's pods, or |
//! | `deployment` | a Deployment of that namespace, whose pods are found through their owners |
//!
//! Why `sum` is the default: KEDA's default `metricType` is `AverageValue`, and the HPA
//! divides the value by the replica count. A sum over the pods divided by the pods is
//! the average per pod, so `targetValue: 60` keeps "60 % per pod". Answering an
//! average instead (`aggregation: average`) needs `metricType: Value`; an average with
//! `AverageValue` divides twice: the classic mistake.

use super::{AppState, Scope};
use crate::api::selector::Selector;
use crate::error::Error;
use crate::fleet::GpuMetric;
use crate::source::pods::Workload;
use std::collections::HashMap;
use std::time::Instant;

/// How a trigger combines its pods' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    Sum,
    Average,
    Max,
    Min,
}

/// Which pods a trigger covers.
#[derive(Debug, Clone)]
pub enum Pods {
    Selector(Selector),
    Deployment(String),
}

/// A parsed trigger.
#[derive(Debug, Clone)]
pub struct Trigger {
    pub metric: GpuMetric,
    pub target: f64,
    pub activation: f64,
    pub aggregation: Aggregation,
    pub pods: Pods,
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

/// Parse a trigger's metadata; every problem is an [`Error::InvalidRequest`] that names
/// the key (`INVALID_ARGUMENT` over gRPC, 400 over HTTP).
pub fn parse_trigger(meta: &HashMap<String, String>) -> Result<Trigger, Error> {
    let metric_name = meta
        .get("metric")
        .ok_or_else(|| Error::InvalidRequest("metric is required (e.g. gpu_utilization)".into()))?;
    let metric = GpuMetric::from_name(metric_name).ok_or_else(|| {
        Error::InvalidRequest(format!(
            "metric: unknown {metric_name:?} (known: {})",
            GpuMetric::served()
                .into_iter()
                .map(GpuMetric::name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let target = number(meta, "targetValue")?
        .filter(|t| *t > 0.0)
        .ok_or_else(|| Error::InvalidRequest("targetValue is required and must be > 0".into()))?;
    let activation = number(meta, "activationTargetValue")?.unwrap_or(0.0);
    let aggregation = match meta.get("aggregation").map(String::as_str) {
        None | Some("sum") => Aggregation::Sum,
        Some("average") => Aggregation::Average,
        Some("max") => Aggregation::Max,
        Some("min") => Aggregation::Min,
        Some(other) => {
            return Err(Error::InvalidRequest(format!(
                "aggregation: {other:?} is not one of sum, average, max, min"
            )));
        }
    };
    let pods = match (meta.get("podSelector"), meta.get("deployment")) {
        (Some(s), None) => Pods::Selector(
            Selector::parse(s).map_err(|e| Error::InvalidRequest(format!("podSelector: {e}")))?,
        ),
        (None, Some(d)) if !d.is_empty() => Pods::Deployment(d.clone()),
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

/// The trigger's value now: its pods' fresh values combined. No pods at all (scaled
/// to zero) is 0; pods whose data is all stale is an error, so the HPA holds.
pub fn evaluate(state: &AppState, namespace: &str, t: &Trigger) -> Result<f64, Error> {
    let workload;
    let scope = match &t.pods {
        Pods::Selector(s) => Scope::Selected(s),
        Pods::Deployment(name) => {
            workload = Workload {
                resource: "deployments.apps",
                name: name.clone(),
            };
            Scope::Workload(&workload)
        }
    };
    let a = super::pod_values(
        &state.fleet_for(t.metric),
        &state.pods.load(),
        namespace,
        &scope,
        t.metric,
        Instant::now(),
        state.staleness,
    )?;
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
    let values = a.values.iter().map(|v| v.value);
    Ok(match t.aggregation {
        Aggregation::Sum => values.sum(),
        Aggregation::Average => values.sum::<f64>() / a.values.len() as f64,
        Aggregation::Max => values.fold(f64::MIN, f64::max),
        Aggregation::Min => values.fold(f64::MAX, f64::min),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn pods_never_reported_are_an_error_not_a_zero() {
        let t = parse_trigger(&meta(&[
            ("metric", "gpu_utilization"),
            ("targetValue", "60"),
            ("podSelector", "app=web"),
        ]))
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
        let t = parse_trigger(&meta(&[
            ("metric", "gpu_utilization"),
            ("targetValue", "60"),
            ("podSelector", "app=resnet"),
        ]))
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
            let e = tonic::Status::from(parse_trigger(&bad).unwrap_err());
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
            let t = parse_trigger(&meta(&[
                ("metric", "gpu_utilization"),
                ("targetValue", "60"),
                ("activationTargetValue", "5.5"),
                ("podSelector", "app=web"),
                ("aggregation", aggregation),
            ]))
            .unwrap();
            assert_eq!(t.activation, 5.5);
            assert_eq!(
                evaluate(&reported, "ns", &t).unwrap(),
                want,
                "{aggregation}"
            );
        }
    }

    #[test]
    fn a_deployment_is_named_and_never_empty() {
        let t = parse_trigger(&meta(&[
            ("metric", "gpu_power_watts"),
            ("targetValue", "300"),
            ("deployment", "resnet"),
        ]))
        .unwrap();
        assert_eq!(t.metric, GpuMetric::PowerWatts);
        assert!(matches!(&t.pods, Pods::Deployment(d) if d == "resnet"));
        let empty = parse_trigger(&meta(&[
            ("metric", "gpu_power_watts"),
            ("targetValue", "300"),
            ("deployment", ""),
        ]))
        .unwrap_err();
        assert!(empty.to_string().contains("exactly one"), "{empty}");
        let neither = parse_trigger(&meta(&[
            ("metric", "gpu_power_watts"),
            ("targetValue", "300"),
        ]))
        .unwrap_err();
        assert!(neither.to_string().contains("exactly one"), "{neither}");
    }

    #[test]
    fn pods_whose_data_is_all_stale_are_an_error() {
        let t = parse_trigger(&meta(&[
            ("metric", "gpu_utilization"),
            ("targetValue", "60"),
            ("podSelector", "app=web"),
        ]))
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
}
