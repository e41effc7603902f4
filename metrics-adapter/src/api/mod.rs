//! Pure building blocks of the metrics APIs' wire format, shared by the HTTP handlers,
//! the KEDA scaler and the tests:
//!
//! - [`selector`]: Kubernetes label selectors, in the string syntax of `labelSelector`
//!   query parameters and the JSON `LabelSelector` object of `metric.selector` (the
//!   parser lives in `kube-support`, shared with kube-sim's fake API server);
//! - [`quantity`]: `resource.Quantity` strings and `metav1.Time` timestamps, as we
//!   write them;
//! - [`status`]: `metav1.Status` error bodies and their HTTP responses.
//!
//! Nothing here does I/O or keeps state, so every rule can be tested in isolation and
//! against upstream behaviour.

pub mod quantity;
pub use kube_support::selector;
pub mod status;

pub use quantity::{format_milli, format_quantity, rfc3339_seconds};
pub use selector::{
    LabelLookup, Location, MAX_SELECTOR_LEN, Operator, Requirement, Selector, SelectorError,
};
pub use status::{ApiError, Reason};
