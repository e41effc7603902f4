//! The exporter's manifests: its DaemonSet, the flags the binaries run with until ready,
//! and its ServiceMonitor.

use super::*;
use e2e_tests::{KubeNode, binary, try_wait_for};
use std::time::Duration;

#[test]
fn exporter_daemonset_runs_on_gpu_nodes_hardened_and_attributing() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let ds = exporter_ds(&objs);
        let spec = pod_spec(ds);
        let c = container(ds, "exporter");
        let a = args(c);

        // GPU nodes only, tainted ones included; no GPU taken from the workloads.
        let terms = arr(
            spec,
            "/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
        );
        assert!(!terms.is_empty(), "{overlay}: no required node affinity");
        let gpu_node: BTreeMap<String, String> =
            [("nvidia.com/gpu.present".to_string(), "true".to_string())].into();
        let cpu_node: BTreeMap<String, String> =
            [("kubernetes.io/os".to_string(), "linux".to_string())].into();
        let admits = |labels: &BTreeMap<String, String>| {
            terms.iter().any(|t| {
                arr(t, "/matchExpressions")
                    .iter()
                    .all(|e| selects(&serde_json::json!({"matchExpressions": [e]}), labels))
            })
        };
        assert!(
            admits(&gpu_node),
            "{overlay}: a GFD-labelled GPU node is excluded"
        );
        assert!(!admits(&cpu_node), "{overlay}: a CPU node is admitted");
        assert!(
            arr(spec, "/tolerations")
                .iter()
                .any(|t| t["key"] == "nvidia.com/gpu"
                    && t["operator"] == "Exists"
                    && t["effect"] == "NoSchedule"),
            "{overlay}: no toleration for nvidia.com/gpu:NoSchedule"
        );
        for section in ["requests", "limits"] {
            assert!(
                c["resources"][section].get("nvidia.com/gpu").is_none(),
                "{overlay}: the exporter must not take a GPU"
            );
        }
        let env: BTreeMap<&str, &Value> = arr(c, "/env")
            .iter()
            .map(|e| (str_at(e, "/name"), e))
            .collect();
        assert_eq!(
            env.get("NODE_NAME")
                .map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
            Some(&Value::from("spec.nodeName")),
            "{overlay}: NODE_NAME from the downward API"
        );
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"]["value"], "all");
        assert_eq!(env["NVIDIA_DRIVER_CAPABILITIES"]["value"], "utility");

        // Pod attribution, with the pod-resources socket mounted read-only.
        assert!(
            a.iter().any(|x| x == "--kubernetes" || x == "-k"),
            "{overlay}: no --kubernetes"
        );
        let labels = flag(&a, "--kubernetes-pod-labels").expect("--kubernetes-pod-labels");
        assert!(
            labels.split(',').any(|l| l == "app"),
            "{overlay}: `app` not copied"
        );
        let socket = Path::new(
            flag(&a, "--pod-resources-kubelet-socket")
                .unwrap_or("/var/lib/kubelet/pod-resources/kubelet.sock"),
        );
        let mount = arr(c, "/volumeMounts")
            .iter()
            .find(|m| socket.starts_with(str_at(m, "/mountPath")))
            .unwrap_or_else(|| panic!("{overlay}: nothing mounted at {}", socket.display()));
        assert_eq!(
            mount["readOnly"], true,
            "{overlay}: pod-resources mount is writable"
        );
        let volume = arr(spec, "/volumes")
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("the mount's volume");
        assert_eq!(
            Path::new(str_at(volume, "/hostPath/path")),
            socket.parent().expect("socket dir"),
            "{overlay}: the hostPath is not the socket's directory"
        );

        // Hardening.
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{overlay}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{overlay}");
        assert_ne!(sc["privileged"], true, "{overlay}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{overlay}"
        );
        assert!(
            sc["capabilities"].get("add").is_none(),
            "{overlay}: capabilities added"
        );
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        // Root only because the kubelet socket is root's (see the DaemonSet comment);
        // a non-root uid is fine too, never root with runAsNonRoot unset silently.
        let uid = spec["securityContext"]["runAsUser"]
            .as_i64()
            .expect("runAsUser set");
        assert_eq!(
            spec["securityContext"]["runAsNonRoot"],
            Value::from(uid != 0),
            "{overlay}: runAsNonRoot must state what runAsUser does"
        );
        assert!(spec.get("hostNetwork").is_none(), "{overlay}: hostNetwork");
        assert_eq!(spec["priorityClassName"], "system-node-critical");
        assert!(c["resources"]["requests"]["memory"].is_string());
        assert!(c["resources"]["requests"]["cpu"].is_string());
        assert!(c["resources"]["limits"]["memory"].is_string());

        // Probes on the serving port.
        let port = container_port(c, "metrics").expect("metrics port");
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let p = &c[probe]["httpGet"];
            assert_eq!(p["path"], path, "{overlay}: {probe}");
            assert_eq!(
                resolve_port(ds, &p["port"]),
                Some(port),
                "{overlay}: {probe} port"
            );
        }
        let listen = flag(&a, "--address").or(flag(&a, "-a")).unwrap_or(":9400");
        assert!(
            listen.ends_with(&format!(":{port}")),
            "{overlay}: listens on {listen}, container port {port}"
        );
        assert_eq!(
            str_at(c, "/image"),
            "ghcr.io/gpu-exporter/gpu-exporter:0.1.0"
        );
    }
}

/// The serving Secret as cert-manager writes it: the pair and its issuing CA.
struct ServingSecret<'a> {
    leaf: &'a e2e_tests::pki::Leaf,
    ca: &'a e2e_tests::pki::Ca,
}

/// Where a path the manifests name comes from in the test: a ConfigMap's file, the
/// generated serving Secret, the simulated node's kubelet socket or `/proc`.
fn provide_path(
    objs: &[Value],
    path: &str,
    root: &Path,
    node: &KubeNode,
    serving: &ServingSecret<'_>,
) -> PathBuf {
    let file_name = Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if path == "/proc" {
        return node.proc_root().to_path_buf();
    }
    if file_name.ends_with(".sock") {
        // The node's own socket: a socket path must stay short (SUN_LEN).
        return node.socket().to_path_buf();
    }
    let local = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(local.parent().expect("a parent")).expect("mkdir");
    let content = match file_name {
        "tls.crt" => serving.leaf.cert_pem.clone(),
        "tls.key" => serving.leaf.key_pem.clone(),
        "ca.crt" => serving.ca.pem(),
        name => objs
            .iter()
            .filter(|o| kind(o) == "ConfigMap")
            .find_map(|cm| cm["data"][name].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("no ConfigMap provides {path}: the test cannot run it")),
    };
    std::fs::write(&local, content).expect("write a mounted file");
    local
}

/// The container's arguments with each absolute path moved under `root` (and provided
/// there), and listening ports made ephemeral on loopback; nothing else changes, so
/// clap's conflict checks and the binaries' own startup validation see the manifests'
/// flags.
fn runnable_args(
    a: &[String],
    objs: &[Value],
    root: &Path,
    node: &KubeNode,
    serving: &ServingSecret<'_>,
) -> Vec<String> {
    a.iter()
        .map(|arg| match arg.split_once('=') {
            Some((flag, _)) if ["--secure-port", "--grpc-port"].contains(&flag) => {
                format!("{flag}=0")
            }
            Some((flag, _)) if ["--address", "-a"].contains(&flag) => {
                format!("{flag}=127.0.0.1:0")
            }
            Some((flag, value)) if value.starts_with('/') => {
                let local = provide_path(objs, value, root, node, serving);
                format!("{flag}={}", local.display())
            }
            _ => arg.clone(),
        })
        .collect()
}

/// `SCHEME://HOST:PORT` from the first "listening" log line, in text or JSON format
/// (the manifests ask for JSON logs).
fn listening_base(process: &mut e2e_tests::Process, scheme: &str) -> String {
    let line = process.wait_for_line("listening", Duration::from_secs(60));
    let address = match serde_json::from_str::<Value>(&line) {
        Ok(json) => json["fields"]["address"]
            .as_str()
            .or(json["address"].as_str())
            .map(str::to_string),
        Err(_) => line
            .split("address=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .map(str::to_string),
    };
    let address = address.unwrap_or_else(|| panic!("no address in {line:?}"));
    format!("{scheme}://{address}")
}

fn stop(process: &mut e2e_tests::Process, what: &str) {
    let killed = Command::new("kill")
        .args(["-TERM", &process.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert_eq!(
        process.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{what} did not shut down cleanly:\n{}",
        process.log()
    );
}

/// The binaries run with each overlay's flags, as the manifests give them (clap's
/// conflict checks and the binaries' startup validation included): the exporter on
/// simulated GPUs through the fake libnvidia-ml and the simulated node's kubelet and
/// API, the adapter with a generated serving certificate, finding the exporter through
/// its Service's EndpointSlice. Each must report ready, then stop cleanly on SIGTERM.
#[test]
fn the_binaries_run_with_the_manifests_flags_until_ready() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let node = KubeNode::start(SCENARIO, "node-a");
        let root = scratch_dir(&format!("manifest-run-{overlay}"));
        let ca = e2e_tests::pki::Ca::new("manifests-test-ca");
        let leaf = ca.server(&["localhost", "127.0.0.1"]);
        let serving = ServingSecret {
            leaf: &leaf,
            ca: &ca,
        };
        let kubeconfig = node.kubeconfig().display().to_string();

        let ds = exporter_ds(&objs);
        let exporter_args = runnable_args(
            &args(container(ds, "exporter")),
            &objs,
            &root,
            &node,
            &serving,
        );
        let has_address = exporter_args
            .iter()
            .any(|a| a.starts_with("--address") || a.starts_with("-a"));
        // The real library name resolves to the fake one; the manifests carry no
        // library flag.
        let lib = root.join("lib");
        std::fs::create_dir_all(&lib).expect("mkdir lib");
        std::os::unix::fs::symlink(e2e_tests::fake_nvml(), lib.join("libnvidia-ml.so.1"))
            .expect("link libnvidia-ml.so.1");
        let mut cmd = Command::new(binary("gpu-exporter"));
        cmd.current_dir(workspace())
            .args(&exporter_args)
            .args(if has_address {
                vec![]
            } else {
                vec!["--address=127.0.0.1:0"]
            })
            .env("LD_LIBRARY_PATH", &lib)
            .env("GPU_SIM_SCENARIO", SCENARIO)
            .env("NODE_NAME", "node-a")
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("RUST_LOG");
        let mut exporter = e2e_tests::Process::spawn(cmd);
        let exporter_base = listening_base(&mut exporter, "http");
        let ready = try_wait_for(Duration::from_secs(60), || {
            (e2e_tests::get(&format!("{exporter_base}/readyz")).0 == 200).then_some(())
        });
        assert!(
            ready.is_some(),
            "{overlay}: the exporter with {exporter_args:?} never became ready:\n{}",
            exporter.log()
        );

        // The adapter finds the exporter through the Service its flags name.
        let adapter_args = runnable_args(
            &args(container(adapter_deploy(&objs), "adapter")),
            &objs,
            &root,
            &node,
            &serving,
        );
        let service = flag(&adapter_args, "--exporter-service")
            .unwrap_or("gpu-exporter/gpu-exporter")
            .to_string();
        let (namespace, name) = service.split_once('/').expect("namespace/name");
        let port_name = flag(&adapter_args, "--exporter-port-name").unwrap_or("metrics");
        let port: i32 = exporter_base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("exporter port");
        node.api().apply_endpoint_slice(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{name}-manifests"),
                    "namespace": namespace,
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
                "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            }))
            .expect("EndpointSlice"),
        );
        let mut cmd = Command::new(binary("gpu-metrics-adapter"));
        cmd.current_dir(workspace())
            .args(&adapter_args)
            .arg("--bind-address=127.0.0.1")
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("RUST_LOG");
        let mut adapter = e2e_tests::Process::spawn(cmd);
        let adapter_base = listening_base(&mut adapter, "https");
        let client = e2e_tests::https::HttpsClient::new(&ca.pem(), None);
        let ready = try_wait_for(Duration::from_secs(60), || {
            (client.get(&format!("{adapter_base}/readyz"), &[]).ok()?.0 == 200).then_some(())
        });
        assert!(
            ready.is_some(),
            "{overlay}: the adapter with {adapter_args:?} never became ready:\n{}",
            adapter.log()
        );
        stop(&mut adapter, "the adapter");
        stop(&mut exporter, "the exporter");
    }
}

#[test]
fn the_service_monitor_scrapes_every_exporter_with_honor_labels() {
    for overlay in OVERLAYS {
        let objs = build(&format!("overlays/{overlay}"));
        let (sm, svc) = monitor_and_service(&objs, overlay, "gpu-exporter");
        let endpoints = arr(sm, "/spec/endpoints");
        assert!(!endpoints.is_empty());
        let port_names: Vec<&Value> = arr(svc, "/spec/ports").iter().map(|p| &p["name"]).collect();
        for e in endpoints {
            assert_eq!(e["honorLabels"], true, "{overlay}: honorLabels");
            assert!(
                port_names.contains(&&e["port"]),
                "{overlay}: port {}",
                e["port"]
            );
        }
    }
}
