//! Answers to metric queries over the latest fleet view and the pod index: which pods
//! an object covers, which of their values are fresh, and how they combine; the
//! [`AppState`] every face answers from, and KEDA [`trigger`]s.
//!
//! Deterministic by construction, so two replicas with the same data answer the same:
//! pods are visited in name order and combined in that order.

pub mod aggregate;
pub mod composite;
pub mod expr;
pub mod trigger;

use crate::error::Error;
use crate::fleet::{Fleet, GpuMetric, Observed, PodKey, in_namespace};
use crate::source::pods::{PodIndex, Workload};
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What every face answers from: the fleet view and the pod index the sources keep
/// current, and how old a value may be.
pub struct AppState {
    pub fleet: Arc<ArcSwap<Fleet>>,
    /// What the serving engines last said ([`crate::source::serving`]): their own
    /// targets, their own staleness, the same rules.
    pub serving: Arc<ArcSwap<Fleet>>,
    pub pods: Arc<ArcSwap<PodIndex>>,
    pub staleness: Duration,
    /// The window reported with each value (the scrape interval).
    pub window_seconds: u64,
    /// The configured metric names: composites and signals.
    pub catalog: Arc<composite::Catalog>,
    /// The signals' last readings.
    pub signals: crate::source::signal::SignalsHandle,
}

impl AppState {
    /// Answers from the current views (the exporters' and the serving engines').
    pub fn with_fleets<T>(&self, f: impl FnOnce(&Fleets<'_>) -> T) -> T {
        let (gpu, serving) = (self.fleet.load(), self.serving.load());
        f(&Fleets {
            gpu: &gpu,
            serving: &serving,
        })
    }
}

/// The two views a metric may be read from: the exporters' and the serving engines'.
#[derive(Clone, Copy)]
pub struct Fleets<'a> {
    pub gpu: &'a Fleet,
    pub serving: &'a Fleet,
}

impl<'a> Fleets<'a> {
    /// The view `metric` is read from.
    pub fn of(&self, metric: GpuMetric) -> &'a Fleet {
        if metric.is_serving() {
            self.serving
        } else {
            self.gpu
        }
    }
}

/// One pod's fresh value.
#[derive(Debug, Clone, PartialEq)]
pub struct PodValue {
    pub pod: String,
    pub value: f64,
    pub at: SystemTime,
}

/// The pods a query covers, and how many had no fresh value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub values: Vec<PodValue>,
    /// Pods covered but left out: stale data.
    pub stale: usize,
    /// Pods covered with no data at all (no GPU, or not scraped).
    pub missing: usize,
}

impl Answer {
    /// The pods' values combined by `aggregation`, and the oldest timestamp among
    /// them. `None` without values, or when the combination is not a finite number
    /// (finite values whose sum overflows): never ±Inf or NaN.
    pub fn combined(&self, aggregation: aggregate::Aggregation) -> Option<(f64, SystemTime)> {
        let oldest = self.values.iter().map(|v| v.at).min()?;
        let values: Vec<f64> = self.values.iter().map(|v| v.value).collect();
        Some((aggregation.apply(&values)?, oldest))
    }

    /// The sum of the pods' values and the oldest timestamp among them.
    pub fn sum(&self) -> Option<(f64, SystemTime)> {
        self.combined(aggregate::Aggregation::Sum)
    }

    /// The mean of the pods' values and the oldest timestamp among them.
    pub fn mean(&self) -> Option<(f64, SystemTime)> {
        self.combined(aggregate::Aggregation::Average)
    }
}

/// Which pods of a namespace a query covers.
#[derive(Debug, Clone)]
pub enum Scope<'a> {
    /// One pod by name.
    Pod(&'a str),
    /// Pods matching a selector over pod labels (empty: every pod).
    Selected(&'a crate::api::selector::Selector),
    /// The pods of a workload.
    Workload(&'a Workload),
    /// Every pod of the namespace.
    Namespace,
}

/// A pod's fresh value of `metric`. A value that is not a finite number is no value
/// (the sources refuse them; this keeps every answer finite whatever a source does).
fn fresh(o: &Observed, metric: GpuMetric, now: Instant, staleness: Duration) -> Option<f64> {
    (now.saturating_duration_since(o.seen) <= staleness)
        .then(|| o.values.values.get(&metric).copied())
        .flatten()
        .filter(|v| v.is_finite())
}

/// The fresh values of `metric` for the pods `scope` covers in `namespace`.
pub fn pod_values(
    fleet: &Fleet,
    pods: &PodIndex,
    namespace: &str,
    scope: &Scope<'_>,
    metric: GpuMetric,
    now: Instant,
    staleness: Duration,
) -> Result<Answer, Error> {
    // The covered pods' names, sorted; each scope reads one namespace's range.
    let mut names: Vec<&str> = match scope {
        Scope::Pod(name) => vec![name],
        Scope::Selected(sel) if sel.is_empty() => {
            // No selector: every pod with data, even before the pod watch syncs.
            let mut n: Vec<&str> = in_namespace(&fleet.pods, namespace)
                .map(|(name, _)| name)
                .collect();
            if pods.synced {
                n.extend(in_namespace(&pods.pods, namespace).map(|(name, _)| name));
            }
            n
        }
        Scope::Namespace => in_namespace(&fleet.pods, namespace)
            .map(|(name, _)| name)
            .collect(),
        Scope::Selected(sel) => {
            if !pods.synced {
                return Err(Error::PodsUnknown);
            }
            in_namespace(&pods.pods, namespace)
                .filter(|(_, info)| sel.matches(&info.labels))
                .map(|(name, _)| name)
                .collect()
        }
        Scope::Workload(w) => {
            if !pods.synced {
                return Err(Error::PodsUnknown);
            }
            in_namespace(&pods.pods, namespace)
                .filter(|(_, info)| info.workloads.contains(w))
                .map(|(name, _)| name)
                .collect()
        }
    };
    names.sort_unstable();
    names.dedup();
    let mut answer = Answer::default();
    for name in names {
        let key: PodKey = (namespace.to_string(), name.to_string());
        match fleet.pods.get(&key) {
            Some(o) => match fresh(o, metric, now, staleness) {
                Some(value) => answer.values.push(PodValue {
                    pod: name.to_string(),
                    value,
                    at: o.at,
                }),
                None if now.saturating_duration_since(o.seen) > staleness => answer.stale += 1,
                None => answer.missing += 1,
            },
            None => answer.missing += 1,
        }
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::selector::Selector;
    use crate::fleet::PodValues;
    use crate::source::pods::PodInfo;

    fn fleet(now: Instant) -> Fleet {
        let mut f = Fleet::default();
        let mut add = |name: &str, util: f64, age: Duration| {
            let mut v = PodValues::default();
            v.values.insert(GpuMetric::Utilization, util);
            f.pods.insert(
                ("ns".into(), name.into()),
                Observed {
                    values: v,
                    at: SystemTime::UNIX_EPOCH,
                    seen: now - age,
                },
            );
        };
        add("web-1", 80.0, Duration::from_secs(1));
        add("web-0", 60.0, Duration::from_secs(1));
        add("web-2", 99.0, Duration::from_secs(60));
        f
    }

    fn index() -> PodIndex {
        let mut p = PodIndex {
            synced: true,
            up: true,
            ..PodIndex::default()
        };
        for name in ["web-0", "web-1", "web-2", "web-3"] {
            p.pods.insert(
                ("ns".into(), name.into()),
                PodInfo {
                    labels: [("app".to_string(), "web".to_string())].into(),
                    workloads: vec![Workload {
                        resource: "deployments.apps",
                        name: "web".into(),
                    }],
                },
            );
        }
        p
    }

    #[test]
    fn stale_and_missing_pods_are_left_out_and_counted() {
        let now = Instant::now() + Duration::from_secs(120);
        let sel = Selector::parse("app=web").unwrap();
        let a = pod_values(
            &fleet(now),
            &index(),
            "ns",
            &Scope::Selected(&sel),
            GpuMetric::Utilization,
            now,
            Duration::from_secs(6),
        )
        .unwrap();
        let names: Vec<&str> = a.values.iter().map(|v| v.pod.as_str()).collect();
        assert_eq!(names, ["web-0", "web-1"], "sorted, fresh only");
        assert_eq!((a.stale, a.missing), (1, 1));
        assert_eq!(a.mean().map(|m| m.0), Some(70.0));
    }

    #[test]
    fn selectors_and_workloads_wait_for_the_pod_watch() {
        let now = Instant::now() + Duration::from_secs(120);
        let sel = Selector::parse("app=web").unwrap();
        let unsynced = PodIndex::default();
        assert!(matches!(
            pod_values(
                &fleet(now),
                &unsynced,
                "ns",
                &Scope::Selected(&sel),
                GpuMetric::Utilization,
                now,
                Duration::from_secs(6)
            ),
            Err(Error::PodsUnknown)
        ));
        let w = Workload {
            resource: "deployments.apps",
            name: "web".into(),
        };
        let a = pod_values(
            &fleet(now),
            &index(),
            "ns",
            &Scope::Workload(&w),
            GpuMetric::Utilization,
            now,
            Duration::from_secs(6),
        )
        .unwrap();
        assert_eq!(a.values.len(), 2);
    }

    /// Two namespaces with the same labels and workload (pods of the other one named in
    /// upper case), so every scope must filter by namespace; a pod with data for another
    /// metric only; one exactly at the staleness limit.
    fn two_namespaces(now: Instant) -> (Fleet, PodIndex) {
        let mut fleet = Fleet::default();
        let mut index = PodIndex {
            synced: true,
            up: true,
            ..PodIndex::default()
        };
        let web = Workload {
            resource: "deployments.apps",
            name: "web".into(),
        };
        for ns in ["ns", "other"] {
            let named = |n: &str| {
                if ns == "ns" {
                    n.to_string()
                } else {
                    n.to_uppercase()
                }
            };
            for (name, util, age) in [("a", Some(10.0), 1), ("b", None, 1), ("c", None, 6)] {
                let name = named(name);
                let mut v = PodValues::default();
                v.values.insert(GpuMetric::PowerWatts, 100.0);
                if let Some(u) = util {
                    v.values.insert(GpuMetric::Utilization, u);
                }
                fleet.pods.insert(
                    (ns.into(), name),
                    Observed {
                        values: v,
                        at: SystemTime::UNIX_EPOCH,
                        seen: now - Duration::from_secs(age),
                    },
                );
            }
            for name in ["a", "b", "c", "d"] {
                index.pods.insert(
                    (ns.into(), named(name)),
                    PodInfo {
                        labels: [("app".to_string(), "web".to_string())].into(),
                        workloads: vec![web.clone()],
                    },
                );
            }
        }
        (fleet, index)
    }

    #[test]
    fn every_scope_stays_in_its_namespace_and_counts_missing_apart_from_stale() {
        let now = Instant::now() + Duration::from_secs(120);
        let (fleet, index) = two_namespaces(now);
        let staleness = Duration::from_secs(6);
        let sel = Selector::parse("app=web").unwrap();
        let empty = Selector::parse("").unwrap();
        let web = Workload {
            resource: "deployments.apps",
            name: "web".into(),
        };
        let summary = |scope: &Scope<'_>, index: &PodIndex| {
            let a = pod_values(
                &fleet,
                index,
                "ns",
                scope,
                GpuMetric::Utilization,
                now,
                staleness,
            )
            .unwrap();
            let names: Vec<String> = a.values.iter().map(|v| v.pod.clone()).collect();
            (names, a.stale, a.missing)
        };
        // `a` has a value; `b` and `c` (exactly at the limit: still fresh) have data for
        // another metric only; `d` is known to the pod watch but has no data.
        let all = (vec!["a".to_string()], 0, 3);
        assert_eq!(summary(&Scope::Selected(&sel), &index), all);
        assert_eq!(summary(&Scope::Workload(&web), &index), all);
        assert_eq!(summary(&Scope::Selected(&empty), &index), all);
        // The namespace object and an unsynced empty selector cover the pods with data.
        assert_eq!(
            summary(&Scope::Namespace, &index),
            (vec!["a".to_string()], 0, 2)
        );
        let unsynced = PodIndex::default();
        assert_eq!(
            summary(&Scope::Selected(&empty), &unsynced),
            (vec!["a".to_string()], 0, 2)
        );
        assert_eq!(
            summary(&Scope::Pod("b"), &index),
            (Vec::<String>::new(), 0, 1)
        );
        // One second later `c` is past the limit: stale, not missing.
        let later = now + Duration::from_secs(1);
        let a = pod_values(
            &fleet,
            &index,
            "ns",
            &Scope::Pod("c"),
            GpuMetric::Utilization,
            later,
            staleness,
        )
        .unwrap();
        assert_eq!((a.values.len(), a.stale, a.missing), (0, 1, 0));
    }
}
