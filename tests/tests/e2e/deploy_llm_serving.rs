//! Issue 18's examples (deploy/examples/composite-hpa, keda-scale-from-zero): they
//! validate like every manifest (deploy.rs builds them with kustomize and the schema
//! validator), and they name metrics the adapter serves with the configuration they
//! ship: the composite file parses in the adapter and defines what the HPA and the
//! ScaledObject ask for; the ScaledObject scales from zero with an activation
//! threshold and a fallback.

use crate::deploy::{build, kustomize, validate_yaml};
use e2e_tests::workspace;
use gpu_metrics_adapter::query::composite::Catalog;
use serde_json::Value;

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

/// The composites the example ships, as the adapter reads them.
fn example_catalog() -> Catalog {
    let path = workspace().join("deploy/examples/composite-hpa/composites.conf");
    let defs = Catalog::read_file(&path).expect("read composites.conf");
    Catalog::new(&defs, &[]).expect("the adapter accepts composites.conf")
}

#[test]
fn the_composite_hpa_asks_for_a_composite_the_shipped_file_defines() {
    let catalog = example_catalog();
    let objs = build("examples/composite-hpa");
    let hpa = one(&objs, "HorizontalPodAutoscaler");
    let metric = &hpa["spec"]["metrics"][0];
    assert_eq!(metric["type"], "Pods");
    let name = metric["pods"]["metric"]["name"].as_str().expect("name");
    assert!(
        catalog.composites().any(|c| c.name == name),
        "{name} is not defined in composites.conf"
    );
    // The ConfigMap the adapter mounts carries the file as it is.
    let cm = one(&objs, "ConfigMap");
    let file =
        std::fs::read_to_string(workspace().join("deploy/examples/composite-hpa/composites.conf"))
            .expect("read");
    assert_eq!(cm["data"]["composites.conf"], Value::from(file));
    assert_eq!(cm["metadata"]["namespace"], "gpu-monitoring");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        one(&objs, "Deployment")["metadata"]["name"]
    );
}

#[test]
fn the_scale_from_zero_example_activates_on_a_signal_and_falls_back() {
    let catalog = example_catalog();
    let objs = build("examples/keda-scale-from-zero");
    let so = one(&objs, "ScaledObject");
    let spec = &so["spec"];
    assert_eq!(spec["minReplicaCount"], 0, "scales to and from zero");
    assert!(spec["fallback"]["replicas"].as_i64().unwrap_or(0) > 0);
    assert!(spec["fallback"]["failureThreshold"].as_i64().unwrap_or(0) > 0);
    let triggers = spec["triggers"].as_array().expect("triggers");
    // The signal: pushed (external-push reads StreamIsActive), no pods named.
    let signal = triggers
        .iter()
        .find(|t| t["type"] == "external-push")
        .expect("a push trigger");
    let m = &signal["metadata"];
    assert!(m["activationTargetValue"].is_string());
    assert!(m["podSelector"].is_null() && m["deployment"].is_null());
    // The pods' trigger asks for the example's composite, summed for AverageValue.
    let pods = triggers
        .iter()
        .find(|t| t["type"] == "external")
        .expect("a pods trigger");
    let metric = pods["metadata"]["metric"].as_str().expect("metric");
    assert!(catalog.composites().any(|c| c.name == metric), "{metric}");
    assert_eq!(pods["metadata"]["aggregation"], "sum");
    for t in triggers {
        // Fallback applies only to AverageValue triggers.
        assert_eq!(t["metricType"], "AverageValue", "{t}");
    }
    // The validator reads this ScaledObject: a misspelt field fails it.
    let yaml = kustomize(&workspace().join("deploy/examples/keda-scale-from-zero"));
    assert!(yaml.contains("minReplicaCount"));
    let (_, errors) = validate_yaml(&yaml.replace("minReplicaCount", "minReplicaCont"));
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("ScaledObject/resnet-inference-from-zero:")),
        "{errors:?}"
    );
}
