//! The adapter's manifests: its ServiceMonitor, APIServices, Deployment, RBAC, the
//! privileged namespace, KEDA's gRPC client certificate, Services and NetworkPolicies.

use super::*;
use crate::rbac;

/// The adapter's ServiceMonitor reaches its secure port, verifies the serving
/// certificate (the CA from the Secret the adapter serves, the Service's DNS name) and
/// sends a service-account token the adapter can review; the ClusterRole it documents
/// grants exactly `get` on `/metrics`.
#[test]
fn the_adapter_service_monitor_verifies_the_adapter_and_authenticates() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let (sm, svc) = monitor_and_service(&objs, overlay, "gpu-metrics-adapter");
        let adapter = adapter_deploy(&objs);
        let endpoints = arr(sm, "/spec/endpoints");
        assert_eq!(endpoints.len(), 1, "{overlay}");
        let e = &endpoints[0];
        let svc_port = arr(svc, "/spec/ports")
            .iter()
            .find(|p| p["name"] == e["port"])
            .unwrap_or_else(|| panic!("{overlay}: the Service has no port {}", e["port"]));
        let secure: i64 = flag(&args(container(adapter, "adapter")), "--secure-port")
            .unwrap_or("6443")
            .parse()
            .expect("--secure-port number");
        assert_eq!(
            resolve_port(adapter, &svc_port["targetPort"]),
            Some(secure),
            "{overlay}: the scrape does not reach --secure-port"
        );
        assert_eq!(e["scheme"], "https", "{overlay}");
        assert_eq!(e["path"], "/metrics", "{overlay}");
        assert_eq!(
            e["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "{overlay}: the adapter authorizes /metrics by the scraper's token"
        );
        assert_ne!(e["tlsConfig"]["insecureSkipVerify"], true, "{overlay}");
        assert_eq!(
            str_at(e, "/tlsConfig/serverName"),
            format!("{}.{}.svc", name(svc), namespace(svc)),
            "{overlay}"
        );
        let serving_secret = arr(pod_spec(adapter), "/volumes")
            .iter()
            .find_map(|v| v["secret"]["secretName"].as_str())
            .expect("the adapter mounts a serving Secret");
        assert_eq!(
            str_at(e, "/tlsConfig/ca/secret/name"),
            serving_secret,
            "{overlay}: the CA must come from the Secret the adapter serves from"
        );
        assert_eq!(str_at(e, "/tlsConfig/ca/secret/key"), "ca.crt");
        let reader = find(&objs, "ClusterRole", "gpu-metrics-adapter-metrics-reader");
        assert_eq!(
            reader["rules"],
            serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
            "{overlay}"
        );
    }
}

#[test]
fn apiservices_point_at_the_adapter_and_trust_its_certificate() {
    let custom = [
        "v1beta2.custom.metrics.k8s.io",
        "v1beta1.custom.metrics.k8s.io",
    ];
    let external = "v1beta1.external.metrics.k8s.io";
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let apiservices = all(&objs, "APIService");
        let names: BTreeSet<&str> = apiservices.iter().map(|a| name(a)).collect();
        let mut want: BTreeSet<&str> = custom.into();
        // KEDA owns the external metrics API where it is installed.
        if overlay != "keda" {
            want.insert(external);
        }
        assert_eq!(names, want, "{overlay}");
        let adapter = adapter_deploy(&objs);
        let adapter_args = args(container(adapter, "adapter"));
        for a in &apiservices {
            let spec = &a["spec"];
            assert_eq!(
                name(a),
                format!("{}.{}", str_at(spec, "/version"), str_at(spec, "/group")),
                "{overlay}: APIService name"
            );
            assert_eq!(spec["groupPriorityMinimum"], 100);
            let want_priority = if spec["version"] == "v1beta2" {
                200
            } else {
                100
            };
            assert_eq!(spec["versionPriority"], want_priority, "{}", name(a));

            // The Service exists, has the port, and reaches the adapter's secure port.
            let svc_ns = str_at(spec, "/service/namespace");
            let svc_name = str_at(spec, "/service/name");
            let port = spec["service"]["port"].as_i64().unwrap_or(443);
            assert_eq!(port, 443, "{overlay}: {}", name(a));
            let svc = objs
                .iter()
                .find(|o| kind(o) == "Service" && name(o) == svc_name && namespace(o) == svc_ns)
                .unwrap_or_else(|| panic!("{overlay}: no Service {svc_ns}/{svc_name}"));
            assert_ne!(
                svc["spec"]["clusterIP"], "None",
                "the aggregator needs a ClusterIP"
            );
            assert!(selects(
                &svc["spec"]["selector"],
                &string_map(&adapter["spec"]["template"]["metadata"]["labels"])
            ));
            let svc_port = arr(svc, "/spec/ports")
                .iter()
                .find(|p| p["port"] == port)
                .unwrap_or_else(|| panic!("{overlay}: Service {svc_name} has no port {port}"));
            let target = resolve_port(adapter, &svc_port["targetPort"]).expect("target port");
            let secure: i64 = flag(&adapter_args, "--secure-port")
                .unwrap_or("6443")
                .parse()
                .expect("--secure-port number");
            assert_eq!(
                target, secure,
                "{overlay}: 443 does not reach --secure-port"
            );

            // Trust: exactly one way, and never skipping verification.
            assert_ne!(
                spec["insecureSkipTLSVerify"],
                true,
                "{overlay}: {}",
                name(a)
            );
            let inject = a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str();
            let bundle = spec["caBundle"].as_str();
            assert!(
                inject.is_some() != bundle.is_some(),
                "{overlay}: {} needs exactly one of caBundle and inject-ca-from",
                name(a)
            );
            let host = format!("{svc_name}.{svc_ns}.svc");
            let serving_secret = arr(pod_spec(adapter), "/volumes")
                .iter()
                .find_map(|v| v["secret"]["secretName"].as_str())
                .expect("the adapter mounts a serving Secret");
            if let Some(inject) = inject {
                let (cert_ns, cert_name) = inject.split_once('/').expect("ns/name");
                let cert = find(&objs, "Certificate", cert_name);
                assert_eq!(namespace(cert), cert_ns);
                assert_eq!(str_at(cert, "/spec/secretName"), serving_secret);
                let dns: Vec<&str> = arr(cert, "/spec/dnsNames")
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                assert!(
                    dns.contains(&host.as_str()),
                    "{overlay}: {host} not in {dns:?}"
                );
                // Its issuer exists, and a CA issuer's secret is a CA certificate's.
                let issuer = find(&objs, "Issuer", str_at(cert, "/spec/issuerRef/name"));
                if let Some(ca_secret) = issuer["spec"]["ca"]["secretName"].as_str() {
                    let ca = all(&objs, "Certificate")
                        .into_iter()
                        .find(|c| c["spec"]["secretName"] == ca_secret)
                        .expect("a Certificate writes the CA issuer's secret");
                    assert_eq!(ca["spec"]["isCA"], true);
                    find(&objs, "Issuer", str_at(ca, "/spec/issuerRef/name"));
                }
            } else {
                let secret = find(&objs, "Secret", serving_secret);
                assert_eq!(secret["type"], "kubernetes.io/tls");
                let ca_file = tree().join(format!("overlays/{overlay}/certs/ca.crt"));
                let ca = std::fs::read(&ca_file).expect("static-certs ca.crt");
                // kustomize folds long base64 values; the API server's decoder skips
                // the newlines.
                let bundle = bundle.map(|b| b.split_whitespace().collect::<String>());
                assert_eq!(
                    bundle.as_deref(),
                    Some(base64(&ca).as_str()),
                    "{overlay}: caBundle is not ca.crt"
                );
                assert_eq!(
                    secret["data"]["ca.crt"]
                        .as_str()
                        .map(|b| b.split_whitespace().collect::<String>()),
                    bundle
                );
                for key in ["tls.crt", "tls.key"] {
                    assert!(secret["data"][key].is_string(), "{overlay}: no {key}");
                }
                let crt = tree().join(format!("overlays/{overlay}/certs/tls.crt"));
                let sans = run(Command::new("openssl")
                    .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
                    .arg(&crt));
                let want_san = format!("DNS:{host}");
                assert!(
                    sans.split([',', '\n']).any(|s| s.trim() == want_san),
                    "{overlay}: tls.crt lacks {want_san}: {sans}"
                );
                run(Command::new("openssl")
                    .args(["verify", "-CAfile"])
                    .arg(&ca_file)
                    .arg(&crt));
            }
        }
    }
}

#[test]
fn adapter_is_highly_available_hardened_and_finds_the_exporters() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let d = adapter_deploy(&objs);
        let labels = string_map(&d["spec"]["template"]["metadata"]["labels"]);
        assert!(selects(&d["spec"]["selector"], &labels));
        let replicas = d["spec"]["replicas"].as_i64().expect("replicas");
        assert_eq!(replicas, 2, "{overlay}");
        let pdb = all(&objs, "PodDisruptionBudget")
            .into_iter()
            .find(|p| selects(&p["spec"]["selector"], &labels))
            .unwrap_or_else(|| panic!("{overlay}: no PodDisruptionBudget for the adapter"));
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        let anti = arr(
            pod_spec(d),
            "/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution",
        );
        assert!(
            anti.iter().any(
                |t| t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
                    && selects(&t["podAffinityTerm"]["labelSelector"], &labels)
            ),
            "{overlay}: no preferred anti-affinity by hostname"
        );

        let spec = pod_spec(d);
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_ne!(spec["securityContext"]["runAsUser"], 0);
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let c = container(d, "adapter");
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert!(c["resources"]["requests"]["memory"].is_string());
        assert!(c["resources"]["limits"]["memory"].is_string());
        assert_eq!(
            str_at(c, "/image"),
            "ghcr.io/gpu-exporter/gpu-metrics-adapter:0.1.0"
        );

        let a = args(c);
        let secure: i64 = flag(&a, "--secure-port").unwrap_or("6443").parse().unwrap();
        let grpc: i64 = flag(&a, "--grpc-port").unwrap_or("9090").parse().unwrap();
        assert_eq!(container_port(c, "https"), Some(secure));
        assert_eq!(container_port(c, "grpc"), Some(grpc));
        for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
            let p = &c[probe]["httpGet"];
            assert_eq!(p["scheme"], "HTTPS", "{overlay}: {probe}");
            assert_eq!(p["path"], path, "{overlay}: {probe}");
            assert_eq!(
                resolve_port(d, &p["port"]),
                Some(secure),
                "{overlay}: {probe}"
            );
        }

        // The serving pair lies in the mounted serving Secret.
        for f in ["--tls-cert-file", "--tls-private-key-file"] {
            let path = Path::new(flag(&a, f).unwrap_or_else(|| panic!("{overlay}: no {f}")));
            let m = arr(c, "/volumeMounts")
                .iter()
                .find(|m| path.parent() == Some(Path::new(str_at(m, "/mountPath"))))
                .unwrap_or_else(|| panic!("{overlay}: {} is not mounted", path.display()));
            let v = arr(spec, "/volumes")
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap();
            assert!(
                v["secret"]["secretName"].is_string(),
                "{overlay}: {f} not from a Secret"
            );
        }

        // The exporter Service and port name the adapter discovers exist.
        let (svc_ns, svc_name) = flag(&a, "--exporter-service")
            .unwrap_or("gpu-exporter/gpu-exporter")
            .split_once('/')
            .expect("NAMESPACE/NAME");
        let port_name = flag(&a, "--exporter-port-name").unwrap_or("metrics");
        let svc = objs
            .iter()
            .find(|o| kind(o) == "Service" && name(o) == svc_name && namespace(o) == svc_ns)
            .unwrap_or_else(|| {
                panic!("{overlay}: --exporter-service {svc_ns}/{svc_name} does not exist")
            });
        let exporter = exporter_ds(&objs);
        assert!(selects(
            &svc["spec"]["selector"],
            &string_map(&exporter["spec"]["template"]["metadata"]["labels"])
        ));
        assert!(
            arr(svc, "/spec/ports")
                .iter()
                .any(|p| p["name"] == port_name),
            "{overlay}: Service {svc_name} has no port {port_name}"
        );
    }
}

/// Every binding names a ServiceAccount and a role that exist (or are Kubernetes' own),
/// and each component gets what its code asks the API for, read-only.
#[test]
fn rbac_grants_what_the_code_needs_to_accounts_that_exist() {
    // Roles Kubernetes bootstraps itself, and the HPA controller's account.
    let builtin_roles = [
        ("ClusterRole", "system:auth-delegator"),
        ("Role", "extension-apiserver-authentication-reader"),
    ];
    let builtin_accounts = [("kube-system", "horizontal-pod-autoscaler")];
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let accounts: BTreeSet<(&str, &str)> = all(&objs, "ServiceAccount")
            .into_iter()
            .map(|s| (namespace(s), name(s)))
            .collect();
        for (w, _) in workloads(&objs) {
            let sa = str_at(pod_spec(w), "/serviceAccountName");
            assert!(
                accounts.contains(&(namespace(w), sa)),
                "{overlay}: {} runs as missing {sa}",
                name(w)
            );
        }
        let bindings: Vec<&Value> = objs
            .iter()
            .filter(|o| matches!(kind(o), "RoleBinding" | "ClusterRoleBinding"))
            .collect();
        for b in &bindings {
            for s in arr(b, "/subjects") {
                assert_eq!(s["kind"], "ServiceAccount", "{overlay}: {}", name(b));
                let who = (str_at(s, "/namespace"), str_at(s, "/name"));
                assert!(
                    accounts.contains(&who) || builtin_accounts.contains(&who),
                    "{overlay}: {} binds missing ServiceAccount {who:?}",
                    name(b)
                );
            }
            let role_kind = str_at(b, "/roleRef/kind");
            let role_name = str_at(b, "/roleRef/name");
            let exists = objs.iter().any(|o| {
                kind(o) == role_kind
                    && name(o) == role_name
                    && (role_kind == "ClusterRole" || namespace(o) == namespace(b))
            });
            assert!(
                exists || builtin_roles.contains(&(role_kind, role_name)),
                "{overlay}: {} refers to missing {role_kind} {role_name}",
                name(b)
            );
        }
        // Our roles only read.
        for r in objs
            .iter()
            .filter(|o| matches!(kind(o), "Role" | "ClusterRole"))
        {
            for rule in arr(r, "/rules") {
                for verb in arr(rule, "/verbs") {
                    assert!(
                        ["get", "list", "watch"].contains(&verb.as_str().unwrap_or_default()),
                        "{overlay}: {} grants {verb}",
                        name(r)
                    );
                }
            }
        }

        // Whether `who` may `verb` `group/resource` in `ns` (None: cluster-wide), through
        // the roles in the build.
        let may = |who: (&str, &str), verb: &str, group: &str, resource: &str, ns: Option<&str>| {
            bindings.iter().any(|b| {
                let bound = arr(b, "/subjects")
                    .iter()
                    .any(|s| (str_at(s, "/namespace"), str_at(s, "/name")) == who);
                let in_scope = match (kind(b), ns) {
                    ("ClusterRoleBinding", _) => true,
                    ("RoleBinding", Some(ns)) => namespace(b) == ns,
                    _ => false,
                };
                let role = objs.iter().find(|o| {
                    kind(o) == str_at(b, "/roleRef/kind")
                        && name(o) == str_at(b, "/roleRef/name")
                        && (kind(o) == "ClusterRole" || namespace(o) == namespace(b))
                });
                bound
                    && in_scope
                    && role.is_some_and(|r| {
                        arr(r, "/rules").iter().any(|rule| {
                            let has = |field: &str, want: &str| {
                                arr(rule, field).iter().any(|v| v == want || v == "*")
                            };
                            has("/verbs", verb)
                                && has("/apiGroups", group)
                                && has("/resources", resource)
                        })
                    })
            })
        };
        let binds_builtin = |who: (&str, &str), role: (&str, &str), ns: &str| {
            bindings.iter().any(|b| {
                (kind(b) == "ClusterRoleBinding" || namespace(b) == ns)
                    && (str_at(b, "/roleRef/kind"), str_at(b, "/roleRef/name")) == role
                    && arr(b, "/subjects")
                        .iter()
                        .any(|s| (str_at(s, "/namespace"), str_at(s, "/name")) == who)
            })
        };

        let exporter = exporter_ds(&objs);
        let exporter_sa = (
            namespace(exporter),
            str_at(pod_spec(exporter), "/serviceAccountName"),
        );
        for verb in ["list", "watch"] {
            assert!(
                may(exporter_sa, verb, "", "pods", None),
                "{overlay}: exporter {verb} pods"
            );
        }
        let adapter = adapter_deploy(&objs);
        let adapter_sa = (
            namespace(adapter),
            str_at(pod_spec(adapter), "/serviceAccountName"),
        );
        let exporter_ns = flag(&args(container(adapter, "adapter")), "--exporter-service")
            .unwrap_or("gpu-exporter/gpu-exporter")
            .split_once('/')
            .map(|(ns, _)| ns.to_string())
            .unwrap();
        for verb in ["list", "watch"] {
            assert!(
                may(adapter_sa, verb, "", "pods", None),
                "{overlay}: adapter {verb} pods (all namespaces)"
            );
            assert!(
                may(
                    adapter_sa,
                    verb,
                    "discovery.k8s.io",
                    "endpointslices",
                    Some(&exporter_ns)
                ),
                "{overlay}: adapter {verb} EndpointSlices in {exporter_ns}"
            );
        }
        assert!(binds_builtin(
            adapter_sa,
            ("ClusterRole", "system:auth-delegator"),
            ""
        ));
        assert!(binds_builtin(
            adapter_sa,
            ("Role", "extension-apiserver-authentication-reader"),
            "kube-system"
        ));
        let hpa_sa = builtin_accounts[0];
        for group in ["custom.metrics.k8s.io", "external.metrics.k8s.io"] {
            assert!(
                may(hpa_sa, "get", group, "gpu_utilization", None),
                "{overlay}: HPA reads {group}"
            );
        }
        // Not more than needed: the adapter cannot read Secrets.
        assert!(!may(
            adapter_sa,
            "get",
            "",
            "secrets",
            Some("gpu-monitoring")
        ));
    }
}

/// What `who` (namespace, name) is granted in `objs`, through every binding and the
/// roles (deploy/'s own or bootstrap ones) they refer to: (verb, group, resource).
fn granted(objs: &[Value], who: (&str, &str)) -> BTreeSet<rbac::Call> {
    let mut out = BTreeSet::new();
    for b in objs
        .iter()
        .filter(|o| matches!(kind(o), "RoleBinding" | "ClusterRoleBinding"))
    {
        if !arr(b, "/subjects")
            .iter()
            .any(|s| (str_at(s, "/namespace"), str_at(s, "/name")) == who)
        {
            continue;
        }
        let (role_kind, role_name) = (str_at(b, "/roleRef/kind"), str_at(b, "/roleRef/name"));
        if let Some((_, _, rules)) = BUILTIN_ROLE_RULES
            .iter()
            .find(|(k, n, _)| (*k, *n) == (role_kind, role_name))
        {
            out.extend(rules.iter().map(|(v, g, r)| rbac::call(v, g, r)));
            continue;
        }
        let role = objs
            .iter()
            .find(|o| {
                kind(o) == role_kind
                    && name(o) == role_name
                    && (role_kind == "ClusterRole" || namespace(o) == namespace(b))
            })
            .unwrap_or_else(|| panic!("{} refers to missing {role_kind} {role_name}", name(b)));
        for rule in arr(role, "/rules") {
            for verb in arr(rule, "/verbs") {
                for group in arr(rule, "/apiGroups") {
                    for resource in arr(rule, "/resources") {
                        out.insert(rbac::call(
                            verb.as_str().unwrap_or_default(),
                            group.as_str().unwrap_or_default(),
                            resource.as_str().unwrap_or_default(),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// Issue 20, least privilege: each ServiceAccount is granted exactly the calls its
/// binary's source makes (rbac.rs reads them), not one verb more and none missing; the
/// HPA controller only `get` and `list` on the metrics APIs (cluster.rs checks what it
/// really calls).
#[test]
fn rbac_grants_exactly_the_calls_in_the_code() {
    let exporter_calls = rbac::calls_in(&workspace().join("exporter/src"));
    let adapter_calls = rbac::calls_in(&workspace().join("metrics-adapter/src"));
    // kube-support's plumbing calls only what it is handed, and only to list and watch.
    let plumbing = rbac::calls_by_type(&workspace().join("kube-support/src"));
    assert_eq!(
        plumbing.keys().collect::<Vec<_>>(),
        ["<generic>"],
        "{plumbing:?}"
    );
    assert_eq!(
        plumbing["<generic>"].iter().collect::<Vec<_>>(),
        ["list", "watch"]
    );
    // The scanner found the calls the binaries are known to make (a scanner that found
    // nothing would pass every comparison below).
    assert!(
        exporter_calls.contains(&rbac::call("watch", "", "pods")),
        "{exporter_calls:?}"
    );
    assert!(
        adapter_calls.contains(&rbac::call(
            "create",
            "authorization.k8s.io",
            "subjectaccessreviews"
        )),
        "{adapter_calls:?}"
    );
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        for (workload, calls) in [
            (exporter_ds(&objs), &exporter_calls),
            (adapter_deploy(&objs), &adapter_calls),
        ] {
            let who = (
                namespace(workload),
                str_at(pod_spec(workload), "/serviceAccountName"),
            );
            let grants = granted(&objs, who);
            let unused: Vec<_> = grants.difference(calls).collect();
            let unpermitted: Vec<_> = calls.difference(&grants).collect();
            assert!(
                unused.is_empty() && unpermitted.is_empty(),
                "{overlay}: {who:?}: granted but never called {unused:?}; called but not granted {unpermitted:?}"
            );
        }
        let hpa: BTreeSet<String> = granted(&objs, ("kube-system", "horizontal-pod-autoscaler"))
            .into_iter()
            .map(|(verb, group, resource)| {
                assert!(
                    group.ends_with(".metrics.k8s.io") && resource == "*",
                    "{overlay}: HPA granted {verb} {group}/{resource}"
                );
                verb
            })
            .collect();
        assert_eq!(
            hpa.iter().collect::<Vec<_>>(),
            ["get", "list"],
            "{overlay}: the HPA controller reads, never watches"
        );
    }
}

/// Issue 18, least privilege: serving-engine discovery lists and watches EndpointSlices
/// in every namespace, so components/serving-discovery grants exactly those calls of
/// metrics-adapter/src/source/serving cluster-wide, and no overlay without it grants
/// EndpointSlices beyond the exporters' namespace. llm-serving's adapter carries the
/// flags, and mounts the ConfigMap examples/composite-hpa ships at the file it reads.
#[test]
fn serving_discovery_is_granted_cluster_wide_only_with_its_component() {
    let adapter_calls = rbac::calls_in(&workspace().join("metrics-adapter/src"));
    let slices = |calls: &BTreeSet<rbac::Call>| -> BTreeSet<rbac::Call> {
        calls
            .iter()
            .filter(|(_, g, r)| (g.as_str(), r.as_str()) == ("discovery.k8s.io", "endpointslices"))
            .cloned()
            .collect()
    };
    let serving_calls = slices(&rbac::calls_in(
        &workspace().join("metrics-adapter/src/source/serving"),
    ));
    assert!(
        serving_calls.contains(&rbac::call("watch", "discovery.k8s.io", "endpointslices")),
        "{serving_calls:?}"
    );
    // Grants through ClusterRoleBindings only: those that reach every namespace.
    let cluster_wide = |objs: &[Value]| {
        let cluster: Vec<Value> = objs
            .iter()
            .filter(|o| kind(o) != "RoleBinding")
            .cloned()
            .collect();
        let adapter = adapter_deploy(objs);
        let who = (
            namespace(adapter),
            str_at(pod_spec(adapter), "/serviceAccountName"),
        );
        (slices(&granted(&cluster, who)), granted(objs, who))
    };
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let (wide, _) = cluster_wide(&objs);
        assert!(wide.is_empty(), "{overlay}: {wide:?}");
        let a = args(container(adapter_deploy(&objs), "adapter"));
        assert_eq!(flag(&a, "--serving-service-selector"), None, "{overlay}");
        assert_eq!(flag(&a, "--composite-metrics-file"), None, "{overlay}");
    }
    let objs = build("overlays/llm-serving");
    let (wide, all_grants) = cluster_wide(&objs);
    assert_eq!(wide, serving_calls, "cluster-wide EndpointSlice grants");
    assert_eq!(
        all_grants, adapter_calls,
        "llm-serving: the adapter's grants"
    );
    let adapter = adapter_deploy(&objs);
    let a = args(container(adapter, "adapter"));
    assert_eq!(
        flag(&a, "--serving-service-selector"),
        Some("gpu-metrics.io/serving=true")
    );
    assert_eq!(flag(&a, "--serving-port-name"), Some("metrics"));
    let file = flag(&a, "--composite-metrics-file").expect("--composite-metrics-file");
    let mounts = arr(container(adapter, "adapter"), "/volumeMounts");
    let mount = mounts
        .iter()
        .find(|m| file.starts_with(&format!("{}/", str_at(m, "/mountPath"))))
        .unwrap_or_else(|| panic!("{file} is not under a mount: {mounts:?}"));
    assert_eq!(mount["readOnly"], true);
    let volume = arr(pod_spec(adapter), "/volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    let example = build("examples/composite-hpa");
    let cm = all(&example, "ConfigMap")
        .into_iter()
        .find(|c| name(c) == str_at(volume, "/configMap/name"))
        .expect("examples/composite-hpa ships the mounted ConfigMap");
    assert_eq!(namespace(cm), namespace(adapter));
    let key = Path::new(file)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("file name");
    assert!(
        cm["data"][key].is_string(),
        "the ConfigMap has no key {key}"
    );
    // The engines' pods are reachable: an egress rule to the label in any namespace.
    let policy = find(&objs, "NetworkPolicy", "gpu-metrics-adapter");
    assert!(
        arr(policy, "/spec/egress")
            .iter()
            .any(|r| r["to"][0]["namespaceSelector"] == serde_json::json!({})
                && r["to"][0]["podSelector"]["matchLabels"]["gpu-metrics.io/serving"] == "true"),
        "{policy}"
    );
}

/// Pod Security (issue 20): the adapter's namespace enforces "restricted"; the
/// exporter's, "privileged" because of its hostPath, holds the exporter and nothing
/// else. (cluster.rs has the real kube-apiserver admit and refuse the pods.)
#[test]
fn only_the_exporter_runs_in_a_privileged_namespace() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let enforce = |ns: &str| {
            let n = find(&objs, "Namespace", ns);
            str_at(n, "/metadata/labels/pod-security.kubernetes.io~1enforce").to_string()
        };
        let exporter = exporter_ds(&objs);
        let adapter = adapter_deploy(&objs);
        assert_ne!(namespace(exporter), namespace(adapter), "{overlay}");
        assert_eq!(enforce(namespace(adapter)), "restricted", "{overlay}");
        assert_eq!(enforce(namespace(exporter)), "privileged", "{overlay}");
        let in_privileged: Vec<String> = workloads(&objs)
            .into_iter()
            .filter(|(w, _)| namespace(w) == namespace(exporter))
            .map(|(w, _)| format!("{}/{}", kind(w), name(w)))
            .collect();
        assert_eq!(in_privileged, ["DaemonSet/gpu-exporter"], "{overlay}");
        // Every namespace an object names is one the overlay creates (or kube-system).
        for o in &objs {
            let ns = namespace(o);
            assert!(
                ns.is_empty()
                    || ns == "kube-system"
                    || objs.iter().any(|n| kind(n) == "Namespace" && name(n) == ns),
                "{overlay}: {}/{} in namespace {ns}, which is not created",
                kind(o),
                name(o)
            );
        }
    }
}

/// KEDA's gRPC port requires a client certificate in every overlay (issue 20): the
/// adapter gets --grpc-client-ca-file from its serving Secret, never --grpc-insecure;
/// each TLS source issues KEDA a client-only certificate from that CA; the example's
/// TriggerAuthentication presents it.
#[test]
fn keda_grpc_requires_a_client_certificate_by_default() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let d = adapter_deploy(&objs);
        let spec = pod_spec(d);
        let c = container(d, "adapter");
        let a = args(c);
        assert!(
            !a.iter().any(|x| x == "--grpc-insecure"),
            "{overlay}: {a:?}"
        );
        let ca = Path::new(
            flag(&a, "--grpc-client-ca-file")
                .unwrap_or_else(|| panic!("{overlay}: no --grpc-client-ca-file")),
        );
        let m = arr(c, "/volumeMounts")
            .iter()
            .find(|m| ca.parent() == Some(Path::new(str_at(m, "/mountPath"))))
            .unwrap_or_else(|| panic!("{overlay}: {} is not mounted", ca.display()));
        let secret = arr(spec, "/volumes")
            .iter()
            .find(|v| v["name"] == m["name"])
            .map(|v| str_at(v, "/secret/secretName"))
            .expect("the CA's volume");
        let key = ca.file_name().and_then(|f| f.to_str()).expect("file name");
        // The Secret holds that key: generated with it, or issued by cert-manager's CA
        // Issuer (which writes ca.crt), as KEDA's client certificate is.
        if let Some(s) = objs
            .iter()
            .find(|o| kind(o) == "Secret" && name(o) == secret)
        {
            assert!(
                s["data"][key].is_string(),
                "{overlay}: {secret} has no {key}"
            );
        } else {
            let serving = all(&objs, "Certificate")
                .into_iter()
                .find(|x| str_at(x, "/spec/secretName") == secret)
                .unwrap_or_else(|| panic!("{overlay}: nothing makes Secret {secret}"));
            let issuer = str_at(serving, "/spec/issuerRef/name");
            assert!(
                find(&objs, "Issuer", issuer)["spec"]["ca"].is_object(),
                "{overlay}: {issuer} is no CA Issuer (no ca.crt)"
            );
            assert_eq!(key, "ca.crt", "{overlay}");
            let client = find(&objs, "Certificate", "gpu-metrics-adapter-keda-client");
            assert_eq!(str_at(client, "/spec/issuerRef/name"), issuer, "{overlay}");
            let usages: Vec<&str> = arr(client, "/spec/usages")
                .iter()
                .map(|u| u.as_str().unwrap_or_default())
                .collect();
            assert!(
                usages.contains(&"client auth") && !usages.contains(&"server auth"),
                "{overlay}: {usages:?}"
            );
        }
    }

    // generate-certs.sh (static-certs): KEDA's certificate chains to the CA the adapter
    // trusts and is for clients only; the serving one is for servers only (openssl).
    let certs = tree().join("overlays/static-certs/certs");
    let verify = |cert: &str, purpose: &str| {
        Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(certs.join("ca.crt"))
            .args(["-purpose", purpose])
            .arg(certs.join(cert))
            .output()
            .expect("openssl")
            .status
            .success()
    };
    assert!(verify("keda-client.crt", "sslclient"));
    assert!(!verify("keda-client.crt", "sslserver"));
    assert!(!verify("tls.crt", "sslclient"));

    // The example presents the certificate, its key and the CA, from one Secret.
    let example = build("examples/keda-external");
    let auth = all(&example, "TriggerAuthentication")[0];
    let refs: BTreeMap<&str, (&str, &str)> = arr(auth, "/spec/secretTargetRef")
        .iter()
        .map(|r| {
            (
                str_at(r, "/parameter"),
                (str_at(r, "/name"), str_at(r, "/key")),
            )
        })
        .collect();
    let secret = "gpu-metrics-adapter-keda-client";
    assert_eq!(
        refs,
        BTreeMap::from([
            ("caCert", (secret, "ca.crt")),
            ("tlsClientCert", (secret, "tls.crt")),
            ("tlsClientKey", (secret, "tls.key")),
        ])
    );
    let so = all(&example, "ScaledObject")[0];
    assert_eq!(so["spec"]["triggers"][0]["metadata"]["enableTLS"], "true");
    assert_eq!(
        so["spec"]["triggers"][0]["authenticationRef"]["name"],
        name(auth)
    );
}

/// Services select their workload's pods and name its ports; the PodDisruptionBudget
/// and the NetworkPolicy select the adapter and open what it uses.
#[test]
fn services_and_policies_select_the_right_pods_and_ports() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let loads = workloads(&objs);
        for svc in all(&objs, "Service") {
            let matching: Vec<&Value> = loads
                .iter()
                .filter(|(w, labels)| {
                    namespace(w) == namespace(svc) && selects(&svc["spec"]["selector"], labels)
                })
                .map(|(w, _)| *w)
                .collect();
            assert_eq!(
                matching.len(),
                1,
                "{overlay}: Service {} selects {matching:?}",
                name(svc)
            );
            for p in arr(svc, "/spec/ports") {
                assert!(
                    resolve_port(matching[0], &p["targetPort"]).is_some(),
                    "{overlay}: Service {} targets missing port {}",
                    name(svc),
                    p["targetPort"]
                );
            }
        }

        let adapter = adapter_deploy(&objs);
        let adapter_labels = string_map(&adapter["spec"]["template"]["metadata"]["labels"]);
        let c = container(adapter, "adapter");
        let https = container_port(c, "https").unwrap();
        let grpc = container_port(c, "grpc").unwrap();
        let exporter = exporter_ds(&objs);
        let exporter_labels = string_map(&exporter["spec"]["template"]["metadata"]["labels"]);
        let metrics = container_port(container(exporter, "exporter"), "metrics").unwrap();
        let policy = all(&objs, "NetworkPolicy")
            .into_iter()
            .find(|p| selects(&p["spec"]["podSelector"], &adapter_labels))
            .unwrap_or_else(|| panic!("{overlay}: no NetworkPolicy for the adapter"));
        let ports = |rule: &Value| -> Vec<(String, i64)> {
            arr(rule, "/ports")
                .iter()
                .map(|p| {
                    (
                        p["protocol"].as_str().unwrap_or("TCP").to_string(),
                        p["port"].as_i64().expect("numeric port"),
                    )
                })
                .collect()
        };
        let ingress = arr(policy, "/spec/ingress");
        // The aggregator is not a pod: the secure port must be open to every source.
        assert!(
            ingress
                .iter()
                .any(|r| r.get("from").is_none() && ports(r).contains(&("TCP".into(), https))),
            "{overlay}: {https} not open to the aggregator"
        );
        assert!(
            !ingress
                .iter()
                .any(|r| r.get("from").is_none() && ports(r).contains(&("TCP".into(), grpc))),
            "{overlay}: gRPC open to everyone"
        );
        assert!(
            ingress.iter().any(|r| arr(r, "/from").iter().any(|f| {
                f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "keda"
            }) && ports(r).contains(&("TCP".into(), grpc))),
            "{overlay}: gRPC not open to the keda namespace"
        );
        let egress = arr(policy, "/spec/egress");
        // A peer that selects `pod` in namespace `ns` (the namespaces are told apart by
        // the label the API server sets on every namespace).
        let selects_in = |peer: &Value, ns: &str, pod: &BTreeMap<String, String>| {
            let ns_labels =
                BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())]);
            peer.get("namespaceSelector")
                .is_some_and(|s| selects(s, &ns_labels))
                && selects(&peer["podSelector"], pod)
        };
        assert!(
            egress
                .iter()
                .any(|r| arr(r, "/to").iter().any(|t| selects_in(
                    t,
                    namespace(exporter),
                    &exporter_labels
                )) && ports(r).contains(&("TCP".into(), metrics))),
            "{overlay}: no egress to the exporters in {} on {metrics}",
            namespace(exporter)
        );

        // The exporter's /metrics (pod names and labels): Prometheus and the adapter
        // only, on the metrics port only, from no other pod.
        let policy = all(&objs, "NetworkPolicy")
            .into_iter()
            .find(|p| {
                namespace(p) == namespace(exporter)
                    && selects(&p["spec"]["podSelector"], &exporter_labels)
            })
            .unwrap_or_else(|| panic!("{overlay}: no NetworkPolicy for the exporter"));
        assert!(
            arr(policy, "/spec/policyTypes").contains(&Value::from("Ingress")),
            "{overlay}: {policy}"
        );
        let rules = arr(policy, "/spec/ingress");
        assert!(!rules.is_empty(), "{overlay}: {policy}");
        let prometheus = BTreeMap::from([(
            "app.kubernetes.io/name".to_string(),
            "prometheus".to_string(),
        )]);
        for r in rules {
            assert_eq!(ports(r), [("TCP".to_string(), metrics)], "{overlay}: {r}");
            let peers = arr(r, "/from");
            assert!(
                !peers.is_empty(),
                "{overlay}: /metrics open to everyone: {r}"
            );
            for peer in peers {
                assert!(
                    selects_in(peer, namespace(adapter), &adapter_labels)
                        || selects_in(peer, "monitoring", &prometheus),
                    "{overlay}: a peer that is neither Prometheus nor the adapter: {peer}"
                );
            }
            // Not another pod of the adapter's namespace, nor the adapter elsewhere.
            let other = BTreeMap::from([("app".to_string(), "web".to_string())]);
            assert!(
                !peers
                    .iter()
                    .any(|p| selects_in(p, namespace(adapter), &other)
                        || selects_in(p, "default", &adapter_labels)),
                "{overlay}: {r}"
            );
        }
        for (ns, labels, who) in [
            (namespace(adapter), &adapter_labels, "the adapter"),
            (
                "monitoring",
                &prometheus,
                "kube-prometheus-stack's Prometheus",
            ),
        ] {
            assert!(
                rules
                    .iter()
                    .any(|r| arr(r, "/from").iter().any(|p| selects_in(p, ns, labels))),
                "{overlay}: {who} cannot scrape the exporters"
            );
        }
        assert!(
            egress
                .iter()
                .any(|r| ports(r).contains(&("UDP".into(), 53))),
            "{overlay}: no DNS"
        );
        assert!(
            egress
                .iter()
                .any(|r| r.get("to").is_none() && ports(r).contains(&("TCP".into(), 443))),
            "{overlay}: no egress to the API server"
        );
    }
}

/// components/prometheus-recording-rules: the PrometheusRule's groups are, field for
/// field, the rule file `gpu-metrics-adapter --print-recording-rules` prints, so the
/// series `--prometheus-queries=recorded` reads are the ones the rules record.
#[test]
fn the_recording_rules_component_holds_the_rules_the_adapter_prints() {
    let path = workspace().join("deploy/components/prometheus-recording-rules/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).expect("read the component's PrometheusRule");
    let committed: Value = serde_saphyr::from_str(&text).expect("PrometheusRule YAML");
    assert_eq!(committed["kind"], "PrometheusRule");
    assert_eq!(committed["apiVersion"], "monitoring.coreos.com/v1");
    let printed = printed_recording_rules();
    assert_eq!(
        committed["spec"]["groups"],
        printed["groups"],
        "{} drifted from `gpu-metrics-adapter --print-recording-rules`: regenerate its spec from it",
        path.display()
    );
}

/// The component composed into an overlay that reads Prometheus (as deploy/README.md
/// tells: --prometheus-url in the user's overlay): it builds and validates, ships the
/// printed rules as a PrometheusRule in the adapter's namespace, at an interval no
/// longer than the exporters' scrape interval (the ServiceMonitor's), and switches the
/// adapter to `--prometheus-queries=recorded`, which the adapter accepts.
#[test]
fn the_recording_rules_component_switches_the_adapter_to_recorded_queries() {
    let rel = "overlays/_recorded-queries";
    let dir = tree().join(rel);
    std::fs::create_dir_all(&dir).expect("overlay dir");
    std::fs::write(
        dir.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../default
components:
  - ../../components/prometheus-recording-rules
patches:
  - target:
      kind: Deployment
      name: gpu-metrics-adapter
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --prometheus-url=http://prometheus.monitoring:9090
",
    )
    .expect("write kustomization");
    let objs = build(rel);
    let rules = all(&objs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "{:?}", ids(&objs));
    let rule = rules[0];
    let adapter = adapter_deploy(&objs);
    assert_eq!(namespace(rule), namespace(adapter));
    assert_eq!(rule["spec"]["groups"], printed_recording_rules()["groups"]);

    let a = args(container(adapter, "adapter"));
    assert_eq!(flag(&a, "--prometheus-queries"), Some("recorded"), "{a:?}");
    assert_eq!(
        a.iter()
            .filter(|x| x.starts_with("--prometheus-queries"))
            .count(),
        1,
        "{a:?}"
    );
    adapter_accepts(&a).unwrap_or_else(|e| panic!("the adapter rejects {a:?}: {e}"));

    let scrape = |s: &str| kube_support::duration::parse(s).expect("a duration");
    let (exporters, _) = monitor_and_service(&objs, rel, "gpu-exporter");
    let scraped_every = arr(exporters, "/spec/endpoints")
        .iter()
        .map(|e| scrape(str_at(e, "/interval")))
        .max()
        .expect("an endpoint");
    for g in arr(rule, "/spec/groups") {
        let every = scrape(str_at(g, "/interval"));
        assert!(
            every <= scraped_every,
            "group {} runs every {every:?}, the exporters are scraped every {scraped_every:?}",
            g["name"]
        );
    }

    // Without the component (the default overlay): no rules and the default queries.
    let default = build("overlays/default");
    assert!(all(&default, "PrometheusRule").is_empty());
    let a = args(container(adapter_deploy(&default), "adapter"));
    assert_eq!(flag(&a, "--prometheus-queries"), None, "{a:?}");
}
