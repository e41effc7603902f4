//! Reading the items of the adapter's metrics API answers (a custom metrics
//! `MetricValueList` or an external metrics `ExternalMetricValueList`).

use crate::quantity::milli_value;
use serde_json::Value;
use std::collections::BTreeMap;

/// (name, milli-value) of every item, in the answer's order. The name is the described
/// object's (custom metrics) or else the `pod` metric label (external metrics), or empty.
pub fn items_milli(v: &Value) -> Vec<(String, i64)> {
    v["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items in {v}"))
        .iter()
        .map(|i| {
            let name = i["describedObject"]["name"]
                .as_str()
                .or_else(|| i["metricLabels"]["pod"].as_str())
                .unwrap_or("")
                .to_string();
            let q = i["value"].as_str().expect("quantity string");
            (name, milli_value(q).expect("valid quantity"))
        })
        .collect()
}

/// [`items_milli`] with the values as numbers (to the thousandth, as quantities carry them).
pub fn items(v: &Value) -> Vec<(String, f64)> {
    items_milli(v)
        .into_iter()
        .map(|(name, milli)| (name, milli as f64 / 1000.0))
        .collect()
}

/// [`items`] by name.
pub fn items_by_name(v: &Value) -> BTreeMap<String, f64> {
    items(v).into_iter().collect()
}
