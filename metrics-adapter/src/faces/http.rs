//! The HTTP APIs: custom.metrics.k8s.io v1beta2 and v1beta1, external.metrics.k8s.io
//! v1beta1, their discovery documents, and health. Every error is a Kubernetes
//! `Status`; unknown paths are 404 `Status`, never a plain-text body.

use crate::api::ApiError;
use crate::api::quantity::{format_quantity, rfc3339_seconds};
use crate::api::selector::Selector;
use crate::query::aggregate::Aggregation;
use crate::query::composite::{Metric, metric_values, signal_value};
use crate::query::{self, Answer, AppState, Scope};
use crate::source::pods::Workload;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

pub const CUSTOM_GROUP: &str = "custom.metrics.k8s.io";
pub const EXTERNAL_GROUP: &str = "external.metrics.k8s.io";

/// Longest query string accepted.
const MAX_QUERY_BYTES: usize = 8192;

type Shared = State<Arc<AppState>>;

/// The object resources whose metrics are the mean over their pods.
const WORKLOADS: [&str; 3] = ["deployments.apps", "statefulsets.apps", "replicasets.apps"];

pub fn router(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/apis", get(group_list))
        .route("/apis/{group}", get(group))
        .route("/apis/{group}/{version}", get(resource_list))
        .route(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}",
            get(external),
        )
        .route("/metrics-api/namespaces/{ns}/{metric}", get(metrics_api))
        .route(
            "/apis/custom.metrics.k8s.io/{version}/namespaces/{ns}/metrics/{metric}",
            get(custom_namespace),
        )
        .route(
            "/apis/custom.metrics.k8s.io/{version}/namespaces/{ns}/{resource}/{name}/{metric}",
            get(custom_namespaced),
        )
        .route(
            "/apis/custom.metrics.k8s.io/{version}/{resource}/{name}/{metric}",
            get(custom_cluster),
        )
        .fallback(|| async {
            ApiError::not_found("the server could not find the requested resource")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::method_not_allowed("the metrics APIs are read-only: only get is supported")
        })
        .with_state(state)
}

async fn readyz(State(s): Shared) -> Response {
    // Ready once exporters or serving engines answer: a run with only serving targets
    // (no GPU exporters) serves too.
    let last_answer = s.fleet.load().last_answer.max(s.serving.load().last_answer);
    match last_answer {
        Some(t) if t.elapsed() <= s.staleness => "ok".into_response(),
        Some(t) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no exporter has answered for {:.1}s",
                t.elapsed().as_secs_f64()
            ),
        )
            .into_response(),
        None => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "no exporter has answered yet",
        )
            .into_response(),
    }
}

fn versions(group: &str) -> Option<&'static [&'static str]> {
    match group {
        CUSTOM_GROUP => Some(&["v1beta2", "v1beta1"]),
        EXTERNAL_GROUP => Some(&["v1beta1"]),
        _ => None,
    }
}

fn api_group(group: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs[0]})
}

async fn group_list() -> Json<Value> {
    Json(json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            api_group(CUSTOM_GROUP, &["v1beta2", "v1beta1"]),
            api_group(EXTERNAL_GROUP, &["v1beta1"]),
        ],
    }))
}

async fn group(Path(group): Path<String>) -> Response {
    match versions(&group) {
        Some(v) => {
            let mut g = api_group(&group, v);
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            Json(g).into_response()
        }
        None => ApiError::not_found(format!("the server could not find the group {group:?}"))
            .into_response(),
    }
}

/// Discovery: the metrics the adapter serves, per resource they describe. Static, so
/// the aggregator's availability probe is answered at once.
async fn resource_list(
    State(s): Shared,
    Path((group, version)): Path<(String, String)>,
) -> Response {
    if !versions(&group).is_some_and(|v| v.contains(&version.as_str())) {
        return ApiError::not_found(format!(
            "the server could not find the group version {group}/{version}"
        ))
        .into_response();
    }
    let mut resources = Vec::new();
    for name in s.catalog.pod_metric_names() {
        if group == EXTERNAL_GROUP {
            resources.push(json!({"name": name, "singularName": "", "namespaced": true,
                "kind": "ExternalMetricValueList", "verbs": ["get"]}));
            continue;
        }
        for r in ["pods"].iter().chain(WORKLOADS.iter()) {
            resources.push(json!({"name": format!("{r}/{name}"), "singularName": "",
                "namespaced": true, "kind": "MetricValueList", "verbs": ["get"]}));
        }
        resources.push(
            json!({"name": format!("namespaces/{name}"), "singularName": "",
            "namespaced": false, "kind": "MetricValueList", "verbs": ["get"]}),
        );
    }
    if group == EXTERNAL_GROUP {
        for name in s.catalog.signal_names() {
            resources.push(json!({"name": name, "singularName": "", "namespaced": true,
                "kind": "ExternalMetricValueList", "verbs": ["get"]}));
        }
    }
    Json(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"),
        "resources": resources,
    }))
    .into_response()
}

/// Query parameters: selectors, with anything else generic clients send ignored.
fn selector(params: &HashMap<String, String>, name: &str) -> Result<Selector, ApiError> {
    let text = params.get(name).map(String::as_str).unwrap_or("");
    Selector::parse(text).map_err(|e| ApiError::bad_request(format!("invalid {name}: {e}")))
}

fn check_query(raw: Option<&str>) -> Result<(), ApiError> {
    match raw {
        Some(q) if q.len() > MAX_QUERY_BYTES => Err(ApiError::bad_request(format!(
            "query string of {} bytes exceeds the limit of {MAX_QUERY_BYTES}",
            q.len()
        ))),
        _ => Ok(()),
    }
}

/// The metric a request names (with its `:aggregation` suffix) in `ns`.
fn metric_of(
    s: &AppState,
    ns: &str,
    name: &str,
    resource: &str,
) -> Result<(Metric, Option<Aggregation>), ApiError> {
    s.catalog.resolve(ns, name).map_err(|e| match e {
        crate::query::composite::Unresolved::NoMetric(_) => {
            ApiError::metric_not_found(name, resource)
        }
        other => ApiError::bad_request(other.to_string()),
    })
}

/// A per-pod metric: signals have no pods.
fn pod_metric_of(
    s: &AppState,
    ns: &str,
    name: &str,
    resource: &str,
) -> Result<(Metric, Option<Aggregation>), ApiError> {
    match metric_of(s, ns, name, resource)? {
        (Metric::Signal(_), _) => Err(ApiError::metric_not_found(name, resource)),
        found => Ok(found),
    }
}

fn custom_version(v: &str) -> Result<bool, ApiError> {
    match v {
        "v1beta2" => Ok(true),
        "v1beta1" => Ok(false),
        _ => Err(ApiError::not_found(format!(
            "the server could not find the group version {CUSTOM_GROUP}/{v}"
        ))),
    }
}

fn answer(s: &AppState, ns: &str, scope: &Scope<'_>, metric: &Metric) -> Result<Answer, ApiError> {
    let a = s.with_fleets(|fleets| {
        metric_values(
            fleets,
            &s.pods.load(),
            ns,
            scope,
            metric,
            Instant::now(),
            s.staleness,
        )
    })?;
    if a.stale > 0 {
        tracing::info!(
            namespace = ns,
            metric = metric.name(),
            fresh = a.values.len(),
            stale = a.stale,
            "answering from fresh pods only"
        );
    }
    Ok(a)
}

fn no_data(metric: &str, what: &str, a: &Answer) -> ApiError {
    if !a.values.is_empty() {
        // Fresh values whose combination is not a finite number (a sum that
        // overflows): no value, answered like missing data.
        return ApiError::not_found(format!(
            "no {metric} for {what}: the values of its {} pods combine into a number that is not finite or too large for a quantity",
            a.values.len()
        ));
    }
    ApiError::not_found(format!(
        "no fresh {} for {what} ({} pods with stale data, {} without data)",
        metric, a.stale, a.missing
    ))
}

/// One MetricValue in the version's shape.
fn metric_value(
    v2: bool,
    object: Value,
    metric: &str,
    sel: &Selector,
    value: f64,
    at: std::time::SystemTime,
    window: u64,
) -> Option<Value> {
    let q = format_quantity(value)?;
    let selector = if sel.is_empty() {
        Value::Null
    } else {
        sel.to_label_selector()
    };
    Some(if v2 {
        json!({"describedObject": object, "metric": {"name": metric, "selector": selector},
            "timestamp": rfc3339_seconds(at), "windowSeconds": window, "value": q})
    } else {
        json!({"describedObject": object, "metricName": metric,
            "timestamp": rfc3339_seconds(at), "window": window, "value": q, "selector": selector})
    })
}

fn value_list(v2: bool, items: Vec<Value>) -> Json<Value> {
    Json(json!({
        "kind": "MetricValueList",
        "apiVersion": format!("{CUSTOM_GROUP}/{}", if v2 { "v1beta2" } else { "v1beta1" }),
        "metadata": {},
        "items": items,
    }))
}

async fn custom_namespaced(
    State(s): Shared,
    Path((version, ns, resource, name, metric)): Path<(String, String, String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    uri: axum::http::Uri,
) -> Result<Json<Value>, ApiError> {
    check_query(uri.query())?;
    let v2 = custom_version(&version)?;
    let metric_sel = selector(&params, "metricLabelSelector")?;
    let label_sel = selector(&params, "labelSelector")?;
    let (gm, aggregation) = pod_metric_of(&s, &ns, &metric, &resource)?;
    // Our metrics carry no labels: a metric selector either matches the empty set or
    // nothing.
    let no_labels: [(&str, &str); 0] = [];
    let metric_matches = metric_sel.matches(&no_labels[..]);
    if resource == "pods" {
        if aggregation.is_some() {
            return Err(ApiError::bad_request(format!(
                "{metric}: an aggregation combines a workload's or a namespace's pods; pods are answered one by one"
            )));
        }
        let scope = if name == "*" {
            Scope::Selected(&label_sel)
        } else {
            Scope::Pod(&name)
        };
        let a = answer(&s, &ns, &scope, &gm)?;
        let items: Vec<Value> = a
            .values
            .iter()
            .filter(|_| metric_matches)
            .filter_map(|p| {
                metric_value(
                    v2,
                    json!({"kind": "Pod", "namespace": ns, "name": p.pod, "apiVersion": "v1"}),
                    &metric,
                    &metric_sel,
                    p.value,
                    p.at,
                    s.window_seconds,
                )
            })
            .collect();
        if items.is_empty() {
            return Err(no_data(&metric, &format!("pods {name} in {ns}"), &a));
        }
        return Ok(value_list(v2, items));
    }
    let Some(resource) = WORKLOADS.iter().find(|r| **r == resource) else {
        return Err(ApiError::metric_not_found(&metric, &resource));
    };
    if name == "*" {
        return Err(ApiError::bad_request(format!(
            "{resource}: name one object (a workload's metric is the mean over its pods)"
        )));
    }
    let w = Workload {
        resource,
        name: name.clone(),
    };
    let a = answer(&s, &ns, &Scope::Workload(&w), &gm)?;
    let kind = match *resource {
        "deployments.apps" => "Deployment",
        "statefulsets.apps" => "StatefulSet",
        _ => "ReplicaSet",
    };
    let object = json!({"kind": kind, "namespace": ns, "name": name, "apiVersion": "apps/v1"});
    object_value(
        &s,
        v2,
        object,
        (&metric, aggregation),
        &metric_sel,
        &a,
        &format!("{resource} {ns}/{name}"),
    )
}

/// The one MetricValue of an object: the mean over its pods, or the aggregation the
/// metric name's suffix asks for.
fn object_value(
    s: &AppState,
    v2: bool,
    object: Value,
    (name, aggregation): (&str, Option<Aggregation>),
    metric_sel: &Selector,
    a: &Answer,
    what: &str,
) -> Result<Json<Value>, ApiError> {
    // Our metrics carry no labels: a metric selector either matches the empty set or
    // nothing.
    let no_labels: [(&str, &str); 0] = [];
    if !metric_sel.matches(&no_labels[..]) {
        let none = Answer {
            values: Vec::new(),
            ..a.clone()
        };
        return Err(no_data(name, what, &none));
    }
    let (value, at) = a
        .combined(aggregation.unwrap_or(Aggregation::Average))
        .ok_or_else(|| no_data(name, what, a))?;
    let item = metric_value(v2, object, name, metric_sel, value, at, s.window_seconds)
        .ok_or_else(|| no_data(name, what, a))?;
    Ok(value_list(v2, vec![item]))
}

async fn custom_namespace(
    State(s): Shared,
    Path((version, ns, metric)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    uri: axum::http::Uri,
) -> Result<Json<Value>, ApiError> {
    check_query(uri.query())?;
    let v2 = custom_version(&version)?;
    let metric_sel = selector(&params, "metricLabelSelector")?;
    let (gm, aggregation) = pod_metric_of(&s, &ns, &metric, "namespaces")?;
    let a = answer(&s, &ns, &Scope::Namespace, &gm)?;
    let object = json!({"kind": "Namespace", "name": ns, "apiVersion": "v1"});
    object_value(
        &s,
        v2,
        object,
        (&metric, aggregation),
        &metric_sel,
        &a,
        &format!("namespace {ns}"),
    )
}

async fn custom_cluster(
    Path((version, resource, _name, metric)): Path<(String, String, String, String)>,
) -> ApiError {
    if let Err(e) = custom_version(&version) {
        return e;
    }
    ApiError::metric_not_found(&metric, &resource)
}

async fn external(
    State(s): Shared,
    Path((ns, metric)): Path<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
    uri: axum::http::Uri,
) -> Result<Json<Value>, ApiError> {
    check_query(uri.query())?;
    let label_sel = selector(&params, "labelSelector")?;
    let (gm, aggregation) = metric_of(&s, &ns, &metric, "namespaces")?;
    let list = |items: Vec<Value>| {
        Json(json!({
            "kind": "ExternalMetricValueList",
            "apiVersion": format!("{EXTERNAL_GROUP}/v1beta1"),
            "metadata": {},
            "items": items,
        }))
    };
    // None when the value is too large for a quantity (values are finite here).
    let one = |value: f64, at, labels: Value| -> Option<Value> {
        let value = format_quantity(value)?;
        Some(json!({"metricName": metric, "metricLabels": labels,
            "timestamp": rfc3339_seconds(at), "window": s.window_seconds, "value": value}))
    };
    if let Metric::Signal(name) = gm {
        // One value for the namespace, whatever the selector: it has no pods.
        let (value, at) =
            signal_value(&s.signals.borrow(), &ns, name, Instant::now(), s.staleness)?;
        let item = one(value, at, json!({})).ok_or_else(|| {
            ApiError::not_found(format!(
                "signal {name} has no value a quantity can hold ({value:e})"
            ))
        })?;
        return Ok(list(vec![item]));
    }
    let a = answer(&s, &ns, &Scope::Selected(&label_sel), &gm)?;
    let what = || format!("pods matching {label_sel} in {ns}");
    if let Some(agg) = aggregation {
        // One item, the pods' values combined: with `target.type: Value`, the HPA
        // compares it to the target as it is.
        let item = a
            .combined(agg)
            .and_then(|(value, at)| one(value, at, json!({})))
            .ok_or_else(|| no_data(&metric, &what(), &a))?;
        return Ok(list(vec![item]));
    }
    if let Metric::Gpu(m) = &gm
        && m.external_sum()
    {
        // Serving signals: one item, the sum over the selected pods (a workload's pods
        // by their labels, or the whole namespace without a selector).
        let item = a
            .sum()
            .and_then(|(sum, at)| one(sum, at, json!({})))
            .ok_or_else(|| no_data(&metric, &what(), &a))?;
        return Ok(list(vec![item]));
    }
    // One item per pod: an HPA sums the items, so `AverageValue` divides that sum by
    // the replicas and keeps "average per pod at T".
    let items: Vec<Value> = a
        .values
        .iter()
        .filter_map(|p| one(p.value, p.at, json!({"pod": p.pod})))
        .collect();
    if items.is_empty() {
        return Err(no_data(&metric, &what(), &a));
    }
    Ok(list(items))
}

/// For KEDA's `metrics-api` trigger (`valueLocation: value`): one number for a workload,
/// with the same pod choice and aggregation keys as the external scaler
/// (`podSelector` or `deployment`, `aggregation`, default `sum` for KEDA's default
/// `AverageValue`).
async fn metrics_api(
    State(s): Shared,
    Path((ns, metric)): Path<(String, String)>,
    Query(mut params): Query<HashMap<String, String>>,
    uri: axum::http::Uri,
) -> Result<Json<Value>, ApiError> {
    check_query(uri.query())?;
    params.insert("metric".into(), metric.clone());
    // The target is KEDA's business here; the trigger parser wants one.
    params
        .entry("targetValue".into())
        .or_insert_with(|| "1".into());
    let trigger = query::trigger::parse_trigger(&s, &ns, &params)?;
    let value = query::trigger::evaluate(&s, &ns, &trigger)?;
    Ok(Json(
        json!({"metric": metric, "namespace": ns, "value": value}),
    ))
}
