//! Exporter discovery: the scrape targets follow the EndpointSlices of the exporter
//! Service.
//!
//! The exporters run as a DaemonSet behind a Service. The EndpointSlice controller keeps
//! the Service's slices (labelled `kubernetes.io/service-name`) listing every exporter
//! pod's address, port and readiness, so watching them gives exactly the exporters
//! Kubernetes considers serving, with the port resolved by name, for `list`/`watch` on
//! `endpointslices.discovery.k8s.io` in one namespace. A Service may have several slices
//! (more than 100 endpoints, or dual-stack); the targets are the union over all of them.

use crate::config::ServiceRef;
use arc_swap::ArcSwap;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::runtime::watcher;
use kube_support::watch::Change;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// The label the EndpointSlice controller puts on a Service's slices.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The scrape path of every exporter.
pub(crate) const METRICS_PATH: &str = "/metrics";

/// The port of `slice` to scrape: the one named `port_name`, else the slice's only port
/// (a Service with a single unnamed port is common). `None` when neither exists, or the
/// port has no number ("all ports", which names nothing to scrape).
pub fn slice_port(slice: &EndpointSlice, port_name: &str) -> Option<u16> {
    let ports = slice.ports.as_deref().unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p.name.as_deref().unwrap_or("") == port_name)
        .or(match ports {
            [only] => Some(only),
            _ => None,
        })?;
    port.port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)
}

/// Whether an endpoint should be scraped: `conditions.ready` is not `false`. The API
/// says a nil `ready` is to be read as ready, and the controller sets it to `false`
/// for terminating pods (unless the Service publishes not-ready addresses), so
/// `serving` and `terminating` need no separate reading.
pub(crate) fn is_ready(endpoint: &Endpoint) -> bool {
    endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(false)
}

/// The host part of a URL for `address`: IPs normalised (so one address written two
/// ways is scraped once), IPv6 in brackets, and FQDNs as they are if they are plain
/// hostnames. Anything else is refused rather than pasted into a URL.
pub(crate) fn url_host(address: &str, address_type: &str) -> Option<String> {
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => Some(ip.to_string()),
        Ok(IpAddr::V6(ip)) => Some(format!("[{ip}]")),
        Err(_) => {
            let hostname = !address.is_empty()
                && address
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            (address_type == "FQDN" && hostname).then(|| address.to_string())
        }
    }
}

/// The sorted, deduplicated `<scheme>://<address>:<port>/metrics` of every ready endpoint
/// of `slices` (see [`slice_port`] for the port). Of an endpoint's addresses only the
/// first is used: the API declares them fungible and lets consumers use just the first
/// (kubernetes/kubernetes#106267), and scraping more would count one exporter twice.
pub fn targets_from_slices<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port_name: &str,
    scheme: &str,
) -> Vec<String> {
    let mut targets = BTreeSet::new();
    for slice in slices {
        let Some(port) = slice_port(slice, port_name) else {
            continue;
        };
        for endpoint in slice.endpoints.iter().filter(|e| is_ready(e)) {
            if let Some(host) = endpoint
                .addresses
                .first()
                .and_then(|a| url_host(a, &slice.address_type))
            {
                targets.insert(format!("{scheme}://{host}:{port}{METRICS_PATH}"));
            }
        }
    }
    targets.into_iter().collect()
}

/// Names of the slices that list endpoints but no port to scrape them on: a wrong
/// `--exporter-port-name`, most likely.
fn portless<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port_name: &str,
) -> BTreeSet<String> {
    slices
        .into_iter()
        .filter(|s| !s.endpoints.is_empty() && slice_port(s, port_name).is_none())
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

/// Keep `targets` equal to the exporters in the EndpointSlices of `service`, on port
/// `port_name`, until the runtime stops.
///
/// As the pod watch does: after an error the watch restarts from a fresh list (with
/// backoff), the targets stay as last known meanwhile (an API server outage must not
/// stop the scraping of healthy exporters), and each failure is logged once, not at
/// every retry. A relist replaces the slices only when complete, so the targets never
/// flap through a partial state.
pub async fn watch_exporters(
    client: kube::Client,
    service: ServiceRef,
    port_name: String,
    scheme: String,
    targets: Arc<ArcSwap<Vec<String>>>,
) {
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(client, &service.namespace);
    let config =
        watcher::Config::default().labels(&format!("{SERVICE_NAME_LABEL}={}", service.name));
    // Slices by name (the watch is in one namespace).
    let mut slices: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut published: Option<usize> = None;
    let mut unusable = BTreeSet::new();
    let what = format!("exporter discovery ({service})");
    kube_support::watch::watch(api, config, &what, |change| {
        let changed = match change {
            Change::Failed => false,
            Change::Listed(listed) => {
                slices = listed
                    .into_iter()
                    .filter_map(|slice| Some((slice.metadata.name.clone()?, slice)))
                    .collect();
                true
            }
            Change::Applied(slice) => match slice.metadata.name.clone() {
                Some(name) => slices.insert(name, slice.clone()) != Some(slice),
                None => false,
            },
            Change::Deleted(slice) => slice
                .metadata
                .name
                .as_ref()
                .is_some_and(|name| slices.remove(name).is_some()),
        };
        if !changed {
            return;
        }
        let now_unusable = portless(slices.values(), &port_name);
        for name in now_unusable.difference(&unusable) {
            tracing::warn!(service = %service, slice = %name, port_name = %port_name, "EndpointSlice has no port of that name and not exactly one port; its exporters are not scraped");
        }
        unusable = now_unusable;
        let current = targets_from_slices(slices.values(), &port_name, &scheme);
        if published != Some(current.len()) {
            if current.is_empty() {
                tracing::warn!(service = %service, "no ready exporters in the Service's EndpointSlices");
            } else {
                tracing::info!(service = %service, exporters = current.len(), "exporter targets changed");
            }
            published = Some(current.len());
        }
        if **targets.load() != current {
            tracing::debug!(service = %service, targets = ?current, "exporter targets");
            targets.store(Arc::new(current));
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// (address, ready, terminating) of one endpoint; `ready: None` is a nil condition.
    type Ep = (&'static str, Option<bool>, bool);

    fn slice(
        name: &str,
        address_type: &str,
        ports: &[(Option<&str>, Option<i32>)],
        endpoints: &[Ep],
    ) -> EndpointSlice {
        EndpointSlice {
            address_type: address_type.into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            endpoints: endpoints
                .iter()
                .map(|&(address, ready, terminating)| Endpoint {
                    addresses: vec![address.to_string()],
                    conditions: Some(EndpointConditions {
                        ready,
                        serving: Some(ready != Some(false) || terminating),
                        terminating: Some(terminating),
                    }),
                    ..Endpoint::default()
                })
                .collect(),
            ports: Some(
                ports
                    .iter()
                    .map(|&(name, port)| EndpointPort {
                        name: name.map(str::to_string),
                        port,
                        protocol: Some("TCP".into()),
                        ..EndpointPort::default()
                    })
                    .collect(),
            ),
        }
    }

    const METRICS: &[(Option<&str>, Option<i32>)] = &[(Some("metrics"), Some(9400))];

    #[test]
    fn targets_follow_readiness_ports_and_address_families() {
        let cases: Vec<(&str, Vec<EndpointSlice>, &str, Vec<&str>)> = vec![
            ("no slices", vec![], "metrics", vec![]),
            (
                "ready, nil and not-ready endpoints",
                vec![slice(
                    "a",
                    "IPv4",
                    METRICS,
                    &[
                        ("10.0.0.2", Some(true), false),
                        ("10.0.0.1", None, false),
                        ("10.0.0.3", Some(false), false),
                    ],
                )],
                "metrics",
                vec![
                    "http://10.0.0.1:9400/metrics",
                    "http://10.0.0.2:9400/metrics",
                ],
            ),
            (
                "terminating: out unless the Service publishes not-ready addresses",
                vec![slice(
                    "a",
                    "IPv4",
                    METRICS,
                    &[
                        ("10.0.0.1", Some(false), true),
                        ("10.0.0.2", Some(true), true),
                    ],
                )],
                "metrics",
                vec!["http://10.0.0.2:9400/metrics"],
            ),
            (
                "multiple slices are unioned, each with its own port, sorted",
                vec![
                    slice("b", "IPv4", METRICS, &[("10.0.1.1", Some(true), false)]),
                    slice(
                        "a",
                        "IPv4",
                        &[(Some("metrics"), Some(9500))],
                        &[("10.0.0.1", Some(true), false)],
                    ),
                ],
                "metrics",
                vec![
                    "http://10.0.0.1:9500/metrics",
                    "http://10.0.1.1:9400/metrics",
                ],
            ),
            (
                "IPv6 in brackets, normalised; dual-stack slices",
                vec![
                    slice("v6", "IPv6", METRICS, &[("fd00:0:0::1", Some(true), false)]),
                    slice("v4", "IPv4", METRICS, &[("10.0.0.1", Some(true), false)]),
                ],
                "metrics",
                vec![
                    "http://10.0.0.1:9400/metrics",
                    "http://[fd00::1]:9400/metrics",
                ],
            ),
            (
                "the named port among several",
                vec![slice(
                    "a",
                    "IPv4",
                    &[(Some("grpc"), Some(9401)), (Some("metrics"), Some(9400))],
                    &[("10.0.0.1", Some(true), false)],
                )],
                "metrics",
                vec!["http://10.0.0.1:9400/metrics"],
            ),
            (
                "the only port, whatever its name",
                vec![slice(
                    "a",
                    "IPv4",
                    &[(None, Some(9400))],
                    &[("10.0.0.1", Some(true), false)],
                )],
                "metrics",
                vec!["http://10.0.0.1:9400/metrics"],
            ),
            (
                "missing port: several, none named so; no ports; a nil port number",
                vec![
                    slice(
                        "several",
                        "IPv4",
                        &[(Some("a"), Some(1)), (Some("b"), Some(2))],
                        &[("10.0.0.1", Some(true), false)],
                    ),
                    slice("none", "IPv4", &[], &[("10.0.0.2", Some(true), false)]),
                    slice(
                        "nil",
                        "IPv4",
                        &[(Some("metrics"), None)],
                        &[("10.0.0.3", Some(true), false)],
                    ),
                    slice(
                        "out-of-range",
                        "IPv4",
                        &[(Some("metrics"), Some(70_000))],
                        &[("10.0.0.4", Some(true), false)],
                    ),
                ],
                "metrics",
                vec![],
            ),
            (
                "duplicate addresses across slices and spellings are scraped once",
                vec![
                    slice(
                        "a",
                        "IPv4",
                        METRICS,
                        &[("10.0.0.1", Some(true), false), ("10.0.0.1", None, false)],
                    ),
                    slice("b", "IPv4", METRICS, &[("10.0.0.1", Some(true), false)]),
                    slice("c", "IPv6", METRICS, &[("FD00::1", Some(true), false)]),
                    slice("d", "IPv6", METRICS, &[("fd00:0::1", Some(true), false)]),
                ],
                "metrics",
                vec![
                    "http://10.0.0.1:9400/metrics",
                    "http://[fd00::1]:9400/metrics",
                ],
            ),
            (
                "FQDN hostnames kept, garbage refused",
                vec![
                    slice(
                        "f",
                        "FQDN",
                        METRICS,
                        &[
                            ("exporter-0.gpu.svc", Some(true), false),
                            ("evil/../x", Some(true), false),
                        ],
                    ),
                    slice("g", "IPv4", METRICS, &[("not-an-ip", Some(true), false)]),
                ],
                "metrics",
                vec!["http://exporter-0.gpu.svc:9400/metrics"],
            ),
        ];
        for (name, slices, port_name, want) in cases {
            assert_eq!(
                targets_from_slices(&slices, port_name, "http"),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn only_an_endpoint_s_first_address_is_scraped() {
        let mut s = slice("a", "IPv4", METRICS, &[("10.0.0.1", Some(true), false)]);
        s.endpoints[0].addresses.push("10.0.0.9".into());
        assert_eq!(
            targets_from_slices([&s], "metrics", "http"),
            ["http://10.0.0.1:9400/metrics"]
        );
        // Exporters serving TLS (--exporter-scheme https).
        assert_eq!(
            targets_from_slices([&s], "metrics", "https"),
            ["https://10.0.0.1:9400/metrics"]
        );
        // No address at all (invalid, but must not panic).
        s.endpoints[0].addresses.clear();
        assert!(targets_from_slices([&s], "metrics", "http").is_empty());
    }

    /// The refusal of a `NAMESPACE/NAME` whose `part` is not a name.
    fn not_a_name(text: &str, part: &str) -> String {
        format!(
            "{text:?}: {part:?} is not a namespace or Service name (lowercase letters, digits and '-', at most 63)"
        )
    }

    #[test]
    fn the_exporter_service_flag_is_namespace_slash_name() {
        use crate::config::parse_service;
        let s = parse_service("gpu-monitoring/gpu-exporter").unwrap();
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str()),
            ("gpu-monitoring", "gpu-exporter")
        );
        assert_eq!(s.to_string(), "gpu-monitoring/gpu-exporter");
        let long = format!("a/{}", "x".repeat(64));
        for (bad, why) in [
            (
                "gpu-exporter",
                "\"gpu-exporter\" is not NAMESPACE/NAME".to_string(),
            ),
            ("/x", not_a_name("/x", "")),
            ("x/", not_a_name("x/", "")),
            ("a/b/c", not_a_name("a/b/c", "b/c")),
            ("A/b", not_a_name("A/b", "A")),
            ("a/-b", not_a_name("a/-b", "-b")),
            ("a/b c", not_a_name("a/b c", "b c")),
            (long.as_str(), not_a_name(&long, &"x".repeat(64))),
        ] {
            let e = parse_service(bad).map(|s| s.to_string()).unwrap_err();
            assert_eq!(e.to_string(), why, "{bad}");
        }
    }

    #[test]
    fn slices_with_endpoints_but_no_usable_port_are_reported() {
        let several = &[(Some("a"), Some(1)), (Some("b"), Some(2))];
        let slices = [
            slice("ok", "IPv4", METRICS, &[("10.0.0.1", Some(true), false)]),
            slice("bad", "IPv4", several, &[("10.0.0.2", Some(true), false)]),
            slice("empty", "IPv4", several, &[]),
        ];
        assert_eq!(
            portless(&slices, "metrics"),
            BTreeSet::from(["bad".to_string()])
        );
        // "ok" has a single port, so any name finds it; "bad" has one named `a`.
        assert!(portless(&slices, "a").is_empty());
    }
}
