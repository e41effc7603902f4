//! How clients reach the adapter, each answering from [`crate::query`]:
//!
//! - [`http`]: the custom and external metrics APIs the aggregator relays to HPAs,
//!   their discovery documents, health, and KEDA's metrics-api JSON;
//! - [`keda`]: KEDA's external scaler gRPC service;
//! - [`telemetry`]: the adapter's own `/metrics`, and the middleware that counts
//!   requests on every face.

pub mod http;
pub mod keda;
pub mod telemetry;
