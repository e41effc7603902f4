//! What a request asks to do, as k8s.io/apiserver's `RequestInfoFactory` reads it from
//! the path (prefixes `api` and `apis`), and the SubjectAccessReview attributes that
//! authorize it.

use std::collections::BTreeMap;

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

use super::User;

/// A request's authorization attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attributes {
    Resource {
        verb: String,
        group: String,
        version: String,
        resource: String,
        subresource: String,
        name: String,
        namespace: String,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

/// Namespace subresources that stay on the namespace (`/namespaces/x/status`).
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl Attributes {
    /// Reads `method`, `path` and `query` as `RequestInfoFactory.NewRequestInfo` does.
    pub fn from_request(method: &str, path: &str, query: Option<&str>) -> Attributes {
        let non_resource = || Attributes::NonResource {
            verb: method.to_ascii_lowercase(),
            path: path.to_string(),
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if parts.len() < 3 {
            return non_resource();
        }
        let (group, rest) = match parts[0] {
            "api" => ("", &parts[1..]),
            // `/apis/<group>/<version>` is discovery, not a resource: four parts needed.
            "apis" if parts.len() >= 4 => (parts[1], &parts[2..]),
            _ => return non_resource(),
        };
        let (version, mut rest) = (rest[0], &rest[1..]);
        let mut verb = match method {
            "GET" | "HEAD" => "get",
            "POST" => "create",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" => "delete",
            _ => "",
        }
        .to_string();
        let mut namespace = "";
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            namespace = rest[1];
            if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
                rest = &rest[2..];
            }
        }
        let resource = rest.first().copied().unwrap_or_default();
        let name = rest.get(1).copied().unwrap_or_default();
        let subresource = rest.get(2).copied().unwrap_or_default();
        if name.is_empty() {
            if verb == "get" {
                verb = if watch_requested(query) {
                    "watch"
                } else {
                    "list"
                }
                .into();
            } else if verb == "delete" {
                verb = "deletecollection".into();
            }
        }
        Attributes::Resource {
            verb,
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            subresource: subresource.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
        }
    }

    pub fn verb(&self) -> &str {
        match self {
            Attributes::Resource { verb, .. } | Attributes::NonResource { verb, .. } => verb,
        }
    }

    /// The SubjectAccessReview for `user` doing this.
    pub fn access_review(&self, user: &User) -> SubjectAccessReview {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let (resource_attributes, non_resource_attributes) = match self {
            Attributes::Resource {
                verb,
                group,
                version,
                resource,
                subresource,
                name,
                namespace,
            } => (
                Some(ResourceAttributes {
                    verb: opt(verb),
                    group: Some(group.clone()),
                    version: opt(version),
                    resource: opt(resource),
                    subresource: opt(subresource),
                    name: opt(name),
                    namespace: opt(namespace),
                    ..ResourceAttributes::default()
                }),
                None,
            ),
            Attributes::NonResource { verb, path } => (
                None,
                Some(NonResourceAttributes {
                    path: Some(path.clone()),
                    verb: Some(verb.clone()),
                }),
            ),
        };
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: opt(&user.uid),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes,
                non_resource_attributes,
            },
            ..SubjectAccessReview::default()
        }
    }

    /// The `Forbidden` message k8s.io/apiserver writes (`forbiddenMessage`).
    pub fn forbidden_message(&self, user: &str, reason: &str) -> String {
        let message = match self {
            Attributes::NonResource { verb, path } => {
                format!("forbidden: User {user:?} cannot {verb} path {path:?}")
            }
            Attributes::Resource {
                verb,
                group,
                resource,
                subresource,
                name,
                namespace,
                ..
            } => {
                let qualified = if group.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}.{group}")
                };
                let what = if subresource.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{subresource}")
                };
                let scope = if namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace {namespace:?}")
                };
                let object = if name.is_empty() {
                    qualified
                } else {
                    format!("{qualified} {name:?}")
                };
                format!(
                    "{object} is forbidden: User {user:?} cannot {verb} resource {what:?} in API group {group:?} {scope}"
                )
            }
        };
        if reason.is_empty() {
            message
        } else {
            format!("{message}: {reason}")
        }
    }
}

/// `watch=true` or `watch=1`, as `metainternalversion.ListOptions` decodes it.
fn watch_requested(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .any(|(k, v)| k == "watch" && matches!(v, "true" | "1"))
    })
}

/// `extra` of a SubjectAccessReview: header-derived keys to their values.
pub type Extra = BTreeMap<String, Vec<String>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(
        verb: &str,
        group: &str,
        version: &str,
        resource: &str,
        subresource: &str,
        name: &str,
        namespace: &str,
    ) -> Attributes {
        Attributes::Resource {
            verb: verb.into(),
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: name.into(),
            namespace: namespace.into(),
        }
    }

    #[test]
    fn the_reference_table() {
        assert_eq!(
            Attributes::from_request(
                "GET",
                "/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/gpu_utilization",
                Some("labelSelector=app%3Dx")
            ),
            resource(
                "list",
                "external.metrics.k8s.io",
                "v1beta1",
                "gpu_utilization",
                "",
                "",
                "inference"
            )
        );
        assert_eq!(
            Attributes::from_request(
                "GET",
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization",
                None
            ),
            resource(
                "get",
                "custom.metrics.k8s.io",
                "v1beta2",
                "pods",
                "gpu_utilization",
                "*",
                "inference"
            )
        );
        assert_eq!(
            Attributes::from_request(
                "GET",
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/deployments.apps/web/gpu_power_watts",
                None
            ),
            resource(
                "get",
                "custom.metrics.k8s.io",
                "v1beta2",
                "deployments.apps",
                "gpu_power_watts",
                "web",
                "ns"
            )
        );
        assert_eq!(
            Attributes::from_request(
                "GET",
                "/apis/custom.metrics.k8s.io/v1beta2/nodes/n1/gpu_utilization",
                None
            ),
            resource(
                "get",
                "custom.metrics.k8s.io",
                "v1beta2",
                "nodes",
                "gpu_utilization",
                "n1",
                ""
            )
        );
    }

    #[test]
    fn discovery_and_health_are_non_resource() {
        for path in [
            "/apis",
            "/apis/custom.metrics.k8s.io",
            "/apis/custom.metrics.k8s.io/v1beta2",
            "/openapi/v2",
            "/healthz",
            "/",
        ] {
            assert_eq!(
                Attributes::from_request("GET", path, None),
                Attributes::NonResource {
                    verb: "get".into(),
                    path: path.into()
                },
                "{path}"
            );
        }
    }

    #[test]
    fn verbs_follow_the_method_and_the_name() {
        let p = "/apis/external.metrics.k8s.io/v1beta1/namespaces/a/m";
        assert_eq!(
            Attributes::from_request("GET", p, Some("watch=true")).verb(),
            "watch"
        );
        assert_eq!(Attributes::from_request("POST", p, None).verb(), "create");
        assert_eq!(
            Attributes::from_request("DELETE", p, None).verb(),
            "deletecollection"
        );
        assert_eq!(
            Attributes::from_request("POST", "/apis", None).verb(),
            "post"
        );
    }

    #[test]
    fn forbidden_messages_read_like_the_api_servers() {
        let a = Attributes::from_request(
            "GET",
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/pods/*/gpu_utilization",
            None,
        );
        assert_eq!(
            a.forbidden_message("system:anonymous", ""),
            r#"pods.custom.metrics.k8s.io "*" is forbidden: User "system:anonymous" cannot get resource "pods/gpu_utilization" in API group "custom.metrics.k8s.io" in the namespace "ns""#
        );
        let d = Attributes::from_request("GET", "/apis", None);
        assert_eq!(
            d.forbidden_message("bob", "no RBAC policy matched"),
            r#"forbidden: User "bob" cannot get path "/apis": no RBAC policy matched"#
        );
    }
}
