//! KEDA's external scaler gRPC service (`externalscaler.ExternalScaler`), answering from
//! the same fleet view and pod index as the HTTP APIs.
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

use crate::api::selector::Selector;
use crate::derive::GpuMetric;
use crate::http::AppState;
use crate::pods::Workload;
use crate::query::{self, QueryError, Scope};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// KEDA's `externalscaler` types, server and client.
pub use kube_support::proto::keda as proto;

use proto::external_scaler_server::ExternalScaler;
use proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};

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

fn number(meta: &HashMap<String, String>, key: &str) -> Result<Option<f64>, Status> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| Status::invalid_argument(format!("{key}: {v:?} is not a number"))),
    }
}

/// Parse a trigger's metadata; every problem is an `INVALID_ARGUMENT` that names the key.
pub fn parse_trigger(meta: &HashMap<String, String>) -> Result<Trigger, Status> {
    let metric_name = meta
        .get("metric")
        .ok_or_else(|| Status::invalid_argument("metric is required (e.g. gpu_utilization)"))?;
    let metric = GpuMetric::from_name(metric_name).ok_or_else(|| {
        Status::invalid_argument(format!(
            "metric: unknown {metric_name:?} (known: {})",
            GpuMetric::ALL.map(GpuMetric::name).join(", ")
        ))
    })?;
    let target = number(meta, "targetValue")?
        .filter(|t| *t > 0.0)
        .ok_or_else(|| Status::invalid_argument("targetValue is required and must be > 0"))?;
    let activation = number(meta, "activationTargetValue")?.unwrap_or(0.0);
    let aggregation = match meta.get("aggregation").map(String::as_str) {
        None | Some("sum") => Aggregation::Sum,
        Some("average") => Aggregation::Average,
        Some("max") => Aggregation::Max,
        Some("min") => Aggregation::Min,
        Some(other) => {
            return Err(Status::invalid_argument(format!(
                "aggregation: {other:?} is not one of sum, average, max, min"
            )));
        }
    };
    let pods = match (meta.get("podSelector"), meta.get("deployment")) {
        (Some(s), None) => Pods::Selector(
            Selector::parse(s)
                .map_err(|e| Status::invalid_argument(format!("podSelector: {e}")))?,
        ),
        (None, Some(d)) if !d.is_empty() => Pods::Deployment(d.clone()),
        _ => {
            return Err(Status::invalid_argument(
                "exactly one of podSelector and deployment is required",
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
pub fn evaluate(state: &AppState, namespace: &str, t: &Trigger) -> Result<f64, Status> {
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
    let a = query::pod_values(
        &state.fleet.load(),
        &state.pods.load(),
        namespace,
        &scope,
        t.metric,
        Instant::now(),
        state.staleness,
    )
    .map_err(|e| match e {
        QueryError::PodsUnknown => Status::unavailable("the pod watch has not synced yet"),
    })?;
    if a.values.is_empty() {
        if a.stale > 0 {
            return Err(Status::unavailable(format!(
                "all {} pods have stale {} data",
                a.stale,
                t.metric.name()
            )));
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

/// The gRPC service.
pub struct Scaler {
    state: Arc<AppState>,
    /// How often a `StreamIsActive` stream re-evaluates.
    poll: Duration,
}

impl Scaler {
    pub fn new(state: Arc<AppState>, poll: Duration) -> Scaler {
        Scaler { state, poll }
    }

    fn active(&self, r: &ScaledObjectRef) -> Result<bool, Status> {
        let t = parse_trigger(&r.scaler_metadata)?;
        Ok(evaluate(&self.state, &r.namespace, &t)? > t.activation)
    }
}

type ActiveStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let result = self.active(request.get_ref())?;
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = ActiveStream;

    /// Sends the current state at once, then again whenever it flips (scale from and
    /// to zero without waiting for KEDA's polling interval).
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let r = request.into_inner();
        let trigger = parse_trigger(&r.scaler_metadata)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let state = self.state.clone();
        let poll = self.poll;
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let now = evaluate(&state, &r.namespace, &trigger).map(|v| v > trigger.activation);
                let send = match (&now, last) {
                    (Ok(a), Some(b)) => *a != b,
                    (Ok(_), None) => true,
                    // Errors do not flip the state; the stream goes on.
                    (Err(_), _) => false,
                };
                if let Ok(a) = now {
                    last = Some(a);
                }
                if send
                    && tx
                        .send(Ok(IsActiveResponse {
                            result: last == Some(true),
                        }))
                        .await
                        .is_err()
                {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(poll) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let t = parse_trigger(&request.get_ref().scaler_metadata)?;
        #[allow(deprecated)] // targetSize is what KEDA before 2.17 reads
        let spec = MetricSpec {
            metric_name: t.metric.name().to_string(),
            target_size: t.target.ceil() as i64,
            target_size_float: t.target,
        };
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![spec],
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let req = request.into_inner();
        let r = req
            .scaled_object_ref
            .ok_or_else(|| Status::invalid_argument("scaledObjectRef is required"))?;
        let t = parse_trigger(&r.scaler_metadata)?;
        let value = evaluate(&self.state, &r.namespace, &t)?;
        #[allow(deprecated)] // metricValue is what KEDA before 2.17 reads
        let v = MetricValue {
            metric_name: t.metric.name().to_string(),
            metric_value: value.round() as i64,
            metric_value_float: value,
        };
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![v],
        }))
    }
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
            let e = parse_trigger(&bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(says), "{says}: {}", e.message());
        }
    }
}
