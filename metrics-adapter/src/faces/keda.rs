//! KEDA's external scaler gRPC service (`externalscaler.ExternalScaler`), answering from
//! the same fleet view and pod index as the HTTP APIs.
//!
//! The trigger metadata it reads is documented in [`crate::query::trigger`].

use crate::query::AppState;
use crate::query::trigger::{evaluate, parse_trigger};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// KEDA's `externalscaler` types, server and client.
pub use kube_support::proto::keda as proto;

use proto::external_scaler_server::ExternalScaler;
use proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};

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
        let t = parse_trigger(&self.state, &r.namespace, &r.scaler_metadata)?;
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
    /// to zero without waiting for KEDA's polling interval). Re-evaluated every poll
    /// and, at once, whenever a signal's value changes: a gateway's first waiting
    /// request reaches KEDA within the signal's read interval, not a poll later.
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let r = request.into_inner();
        let trigger = parse_trigger(&self.state, &r.namespace, &r.scaler_metadata)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let state = self.state.clone();
        let poll = self.poll;
        let mut signals = state.signals.subscribe();
        signals.mark_unchanged();
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
                    // Never an error: `state` holds the sender.
                    _ = signals.changed() => {}
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
        let r = request.get_ref();
        let t = parse_trigger(&self.state, &r.namespace, &r.scaler_metadata)?;
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
        let t = parse_trigger(&self.state, &r.namespace, &r.scaler_metadata)?;
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
