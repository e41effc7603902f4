//! Everything builds and validates: every overlay, component and example builds with
//! `kubectl kustomize` and validates, and the validator rejects what it must.

use super::*;

const EXAMPLES: [&str; 7] = [
    "inference",
    "hpa",
    "keda-external",
    "keda-metrics-api",
    "keda-prometheus",
    "composite-hpa",
    "keda-scale-from-zero",
];

#[test]
fn every_overlay_and_example_builds_and_validates() {
    let overlays = kustomizations("overlays");
    let examples = kustomizations("examples");
    for want in OVERLAYS {
        assert!(overlays.contains(want), "deploy/overlays/{want} is missing");
    }
    for want in EXAMPLES {
        assert!(examples.contains(want), "deploy/examples/{want} is missing");
    }
    let cluster_scoped = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "APIService",
    ];
    for rel in overlays
        .iter()
        .map(|o| format!("overlays/{o}"))
        .chain(examples.iter().map(|e| format!("examples/{e}")))
    {
        let objs = build(&rel);
        // No kustomize `namespace:` is used (it would move the kube-system RoleBinding),
        // so every namespaced object must name its namespace, or it lands in `default`.
        for o in &objs {
            if !cluster_scoped.contains(&kind(o)) {
                assert!(
                    !namespace(o).is_empty(),
                    "deploy/{rel}: {}/{} has no namespace",
                    kind(o),
                    name(o)
                );
            }
        }
        let mut seen = BTreeSet::new();
        for o in &objs {
            assert!(
                seen.insert((kind(o), namespace(o), name(o))),
                "deploy/{rel}: {}/{} twice",
                kind(o),
                name(o)
            );
        }
    }
}

/// The validator is not vacuous: a misspelt field in a built-in kind and in each
/// custom resource kind fails, and so does a kind without a schema.
#[test]
fn the_validator_rejects_typos_and_unknown_kinds() {
    let default = kustomize(&tree().join("overlays/default"));
    let examples = kustomize(&tree().join("examples/keda-external"))
        + "---\n"
        + &kustomize(&tree().join("examples/keda-prometheus"));
    let rules = std::fs::read_to_string(
        tree().join("components/prometheus-recording-rules/prometheusrule.yaml"),
    )
    .expect("the recording rules");
    let cases = [
        (
            &default,
            "readOnlyRootFilesystem",
            "readOnlyRootFileSystem",
            "DaemonSet/gpu-exporter",
        ),
        (
            &default,
            "honorLabels",
            "honourLabels",
            "ServiceMonitor/gpu-exporter",
        ),
        (
            &default,
            "serverName",
            "servername",
            "ServiceMonitor/gpu-metrics-adapter",
        ),
        (
            &default,
            "dnsNames",
            "dnsName",
            "Certificate/gpu-metrics-adapter-tls",
        ),
        (
            &default,
            "selfSigned",
            "selfsigned",
            "Issuer/gpu-metrics-adapter-selfsigned",
        ),
        (
            &default,
            "versionPriority: 200",
            "versionPriority: high",
            "APIService/v1beta2.custom.metrics.k8s.io",
        ),
        (
            &examples,
            "scalerAddress",
            "scalerAdress",
            "ScaledObject/resnet-inference",
        ),
        (
            &examples,
            "metricType: AverageValue",
            "metricType: Average",
            "ScaledObject/resnet-inference",
        ),
        (
            &examples,
            "secretTargetRef",
            "secretTargetRefs",
            "TriggerAuthentication/gpu-metrics-adapter-tls",
        ),
        (
            &examples,
            "threshold: \"70\"",
            "treshold: \"70\"",
            "ScaledObject/resnet-inference-prometheus",
        ),
        (
            &rules,
            "record:",
            "recrod:",
            "PrometheusRule/gpu-metrics-adapter-recording-rules",
        ),
    ];
    for (yaml, from, to, culprit) in cases {
        assert!(
            yaml.contains(from),
            "{from:?} is not in the manifests any more"
        );
        let (_, errors) = validate_yaml(&yaml.replace(from, to));
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("{culprit}:"))),
            "{from:?} → {to:?} was not caught for {culprit}: {errors:?}"
        );
    }
    let unknown =
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n  namespace: x\n";
    let (_, errors) = validate_yaml(unknown);
    assert!(errors.iter().any(|e| e.contains("no schema")), "{errors:?}");
}

/// Each component composes with the base on its own (after external-metrics, as the
/// overlays list them), validates, and does what it says.
#[test]
fn every_component_composes_with_the_base() {
    let components = kustomizations("components");
    for want in [
        "external-metrics",
        "cert-manager",
        "service-monitor",
        "process-attribution",
        "nvidia-runtime-class",
        "serving-discovery",
        "composite-metrics",
        "gateway-signal",
        "prometheus-recording-rules",
    ] {
        assert!(
            components.contains(want),
            "deploy/components/{want} is missing"
        );
    }
    for component in &components {
        let rel = format!("overlays/_component-{component}");
        let dir = tree().join(&rel);
        std::fs::create_dir_all(&dir).expect("component test dir");
        let mut list = vec!["../../components/external-metrics".to_string()];
        if component != "external-metrics" {
            list.push(format!("../../components/{component}"));
        }
        std::fs::write(
            dir.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n{}",
                list.iter().map(|c| format!("  - {c}\n")).collect::<String>()
            ),
        )
        .expect("write kustomization");
        let objs = build(&rel);
        let ds = pod_spec(exporter_ds(&objs));
        let exporter_args = args(container(exporter_ds(&objs), "exporter"));
        match component.as_str() {
            "process-attribution" => {
                assert_eq!(ds["hostPID"], true, "{component}");
                assert_eq!(flag(&exporter_args, "--proc-root"), Some("/proc"));
            }
            "nvidia-runtime-class" => assert_eq!(ds["runtimeClassName"], "nvidia"),
            _ => {
                assert!(ds.get("hostPID").is_none(), "{component} sets hostPID");
                assert!(ds.get("runtimeClassName").is_none());
            }
        }
        let adapter_args = args(container(adapter_deploy(&objs), "adapter"));
        let signal = flag(&adapter_args, "--signal");
        if component == "gateway-signal" {
            // The signal parses as the adapter parses it, and is the one the
            // scale-from-zero example's push trigger asks for, in its namespace.
            let spec = gpu_metrics_adapter::source::signal::parse_spec(signal.expect("--signal"))
                .expect("the adapter accepts the component's --signal");
            let example = build("examples/keda-scale-from-zero");
            let so = all(&example, "ScaledObject")[0];
            let push = arr(so, "/spec/triggers")
                .iter()
                .find(|t| t["type"] == "external-push")
                .expect("a push trigger");
            assert_eq!(push["metadata"]["metric"], spec.name.as_str());
            assert_eq!(namespace(so), spec.namespace);
        } else {
            assert_eq!(signal, None, "{component}");
        }
        assert_eq!(
            flag(&adapter_args, "--serving-service-selector").is_some(),
            component == "serving-discovery",
            "{component}"
        );
        assert_eq!(
            flag(&adapter_args, "--composite-metrics-file").is_some(),
            component == "composite-metrics",
            "{component}"
        );
        let recorded = component == "prometheus-recording-rules";
        assert_eq!(
            flag(&adapter_args, "--prometheus-queries"),
            recorded.then_some("recorded"),
            "{component}"
        );
        assert_eq!(
            all(&objs, "PrometheusRule").len(),
            usize::from(recorded),
            "{component}"
        );
        let apiservices = all(&objs, "APIService");
        assert_eq!(apiservices.len(), 3, "{component}");
        if component == "cert-manager" {
            for a in apiservices {
                assert!(
                    a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string(),
                    "cert-manager's patch misses {}",
                    name(a)
                );
            }
        }
    }
}
