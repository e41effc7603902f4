//! Least privilege (issue 20): the Kubernetes API calls each binary makes, read from its
//! source, and the RBAC grants of deploy/ that cover them. deploy/adapter.rs holds the manifests
//! to exactly these calls (no rule unused, no call unpermitted); cluster.rs holds these
//! calls to what the binaries actually did against a real kube-apiserver (its audit log).
//!
//! The source is read, not parsed: every `Api<T>` the code declares (a `let`, a field or
//! a parameter) names a variable, and every use of that variable is a call: a method
//! (`get_opt`, `create`, …) or a watch (`watcher(api, …)`, kube-support's
//! `watch::watch(api, …)` and `watch::watch_kept(api, …)`). A use the scanner cannot
//! classify fails the test, so a new call cannot slip past it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One permission: (verb, API group, resource).
pub(crate) type Call = (String, String, String);

pub(crate) fn call(verb: &str, group: &str, resource: &str) -> Call {
    (verb.to_string(), group.to_string(), resource.to_string())
}

/// The API group and resource of a k8s-openapi type, from k8s-openapi itself.
fn resource_of(ty: &str) -> (&'static str, &'static str) {
    use k8s_openapi::Resource;
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    match ty {
        "Pod" => (Pod::GROUP, Pod::URL_PATH_SEGMENT),
        "ConfigMap" => (ConfigMap::GROUP, ConfigMap::URL_PATH_SEGMENT),
        "EndpointSlice" => (EndpointSlice::GROUP, EndpointSlice::URL_PATH_SEGMENT),
        "ResourceSlice" => (ResourceSlice::GROUP, ResourceSlice::URL_PATH_SEGMENT),
        "TokenReview" => (TokenReview::GROUP, TokenReview::URL_PATH_SEGMENT),
        "SubjectAccessReview" => (
            SubjectAccessReview::GROUP,
            SubjectAccessReview::URL_PATH_SEGMENT,
        ),
        other => panic!("Api<{other}>: add its type to rbac.rs's resource_of"),
    }
}

/// The verbs a method of kube::Api calls.
fn verbs_of(method: &str) -> &'static [&'static str] {
    match method {
        "clone" => &[],
        "get" | "get_opt" | "get_metadata" | "get_metadata_opt" => &["get"],
        "list" | "list_metadata" => &["list"],
        "watch" | "watch_metadata" => &["watch"],
        "create" => &["create"],
        "replace" | "replace_status" => &["update"],
        "patch" | "patch_metadata" | "patch_status" => &["patch"],
        "delete" => &["delete"],
        "delete_collection" => &["deletecollection"],
        other => panic!("kube::Api::{other}: add its verbs to rbac.rs's verbs_of"),
    }
}

/// Functions that list and watch the Api they are given (kube's watchers and
/// kube-support's watch and watch_kept, which run kube's watcher).
const WATCHERS: [&str; 5] = [
    "watcher(",
    "metadata_watcher(",
    "watch::watch(",
    "watch(",
    "watch_kept(",
];

/// Every call the code under `dir` makes, by the type it makes it on; a type that is a
/// generic parameter (kube-support's plumbing) is reported as `"<generic>"`.
pub(crate) fn calls_by_type(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(dir) {
        let text = std::fs::read_to_string(&file).expect("read source");
        // Production code only: tests come after `#[cfg(test)]`; comments say nothing.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let vars = api_variables(&code, &file);
        for (var, types) in &vars {
            for verb in uses(&code, var, &file) {
                for ty in types {
                    out.entry(ty.clone()).or_default().insert(verb.to_string());
                }
            }
        }
    }
    out
}

/// The calls as permissions: (verb, group, resource).
pub(crate) fn calls_in(dir: &Path) -> BTreeSet<Call> {
    calls_by_type(dir)
        .into_iter()
        .flat_map(|(ty, verbs)| {
            let (group, resource) = resource_of(&ty);
            verbs.into_iter().map(move |v| call(&v, group, resource))
        })
        .collect()
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Variables declared with an `Api<T>` type (`NAME: Api<T>` or
/// `NAME: kube::Api<PartialObjectMeta<T>>`), and the types each holds.
fn api_variables(code: &str, file: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut vars: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in code.lines() {
        let mut rest = line;
        while let Some(at) = rest.find("Api<") {
            let before = rest[..at].trim_end_matches("kube::").trim_end();
            let after = &rest[at + "Api<".len()..];
            let after = after.trim_start_matches("PartialObjectMeta<");
            let ty: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let Some(decl) = before.strip_suffix(':') else {
                panic!(
                    "{}: `{}`: an Api<…> that is not a `name: Api<…>` declaration; teach rbac.rs",
                    file.display(),
                    line.trim()
                );
            };
            let var: String = decl
                .chars()
                .rev()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
                .chars()
                .rev()
                .collect();
            assert!(!var.is_empty(), "{}: `{}`", file.display(), line.trim());
            // A one-letter type is a generic parameter: the caller's type.
            let ty = if ty.len() == 1 {
                "<generic>".into()
            } else {
                ty
            };
            vars.entry(var).or_default().insert(ty);
            rest = after;
        }
    }
    vars
}

/// The verbs of every use of `var` in `code`.
fn uses(code: &str, var: &str, file: &Path) -> BTreeSet<&'static str> {
    let mut verbs = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(found) = code[from..].find(var) {
        let at = from + found;
        from = at + var.len();
        let before = &code[..at];
        let after = &code[at + var.len()..];
        // Whole identifiers only.
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        if at > 0 && ident(bytes[at - 1]) || after.bytes().next().is_some_and(ident) {
            continue;
        }
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = &code[line_start..code[at..].find('\n').map_or(code.len(), |i| at + i)];
        // A path segment (`k8s_openapi::api::…`), or text in a string literal.
        if before.ends_with("::")
            || after.starts_with("::")
            || code[line_start..at].matches('"').count() % 2 == 1
        {
            continue;
        }
        if after.starts_with(':') {
            continue; // the declaration itself, or a struct literal field
        }
        if let Some(call) = after.strip_prefix('.') {
            let method: String = call
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // `watcher(api.clone(), …)`: the clone is watched.
            if method == "clone" && WATCHERS.iter().any(|w| before.trim_end().ends_with(w)) {
                verbs.extend(["list", "watch"]);
            }
            verbs.extend(verbs_of(&method));
            continue;
        }
        let trimmed = before.trim_end();
        if WATCHERS.iter().any(|w| trimmed.ends_with(w)) {
            verbs.extend(["list", "watch"]);
            continue;
        }
        // Handed to a function of our own that takes an Api: its body, where the
        // parameter is declared `name: Api<…>`, holds the calls.
        if trimmed.ends_with('(') || trimmed.ends_with(',') {
            continue;
        }
        // `self.api` read as a field, or `Self { api: … }` built: covered above.
        if trimmed.ends_with("self.") || after.trim_start().starts_with(',') {
            continue;
        }
        panic!(
            "{}: `{}`: a use of {var} that rbac.rs cannot classify",
            file.display(),
            line.trim()
        );
    }
    verbs
}
