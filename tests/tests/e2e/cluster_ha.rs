//! Two adapter replicas behind the APIService, as deploy/ runs them (a Deployment of
//! two, one Service): `ADAPTER_REPLICAS=2 cluster.sh up` gives the adapter's pods, which
//! kwok plays, one adapter process each on the pod's IP, and the aggregator routes to
//! the Service's endpoints as the real EndpointSlice controller keeps them. Both replicas
//! answer the same values; when one goes, gracefully (its pod deleted: the endpoint
//! leaves, the preStop sleep covers that, then SIGTERM) or by a crash (SIGKILL, then
//! the pod marked not ready, as the kubelet does when a container dies), the aggregator
//! keeps answering through the other: a client polling it every 50 ms sees no error in
//! the first case and none for as long as one HPA sync in the second.

use e2e_tests::cluster::Cluster;
use e2e_tests::https::HttpsClient;
use e2e_tests::pki::Leaf;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PATH: &str = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dresnet-inference";
const SERVICE: &str = "gpu-metrics-adapter.gpu-monitoring.svc";
/// cluster.sh's `--horizontal-pod-autoscaler-sync-period` (the default is 15 s).
const HPA_SYNC: Duration = Duration::from_secs(2);

/// The adapter's pods that have an IP: (name, IP).
fn adapter_pods(c: &Cluster) -> Vec<(String, String)> {
    let pods = c.json(&[
        "pods",
        "-n",
        "gpu-monitoring",
        "-l",
        "app.kubernetes.io/name=gpu-metrics-adapter",
    ]);
    pods["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                p["status"]["podIP"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Each pod's value (milli-units) in an answer of PATH; none where it has no items.
fn values(v: &Value) -> BTreeMap<String, i64> {
    if !v["items"].is_array() {
        return BTreeMap::new();
    }
    e2e_tests::metrics_api::items_milli(v).into_iter().collect()
}

/// PATH from one replica, on its pod's IP, as the cluster's admin (the serving
/// certificate names the Service, so the name is resolved to the pod's IP).
fn direct(c: &Cluster, ip: &str) -> Option<Value> {
    let port = c.env("ADAPTER_PORT");
    let pki = c.dir().join("pki");
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", "--cacert", c.env("ADAPTER_CA")])
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .args(["--resolve", &format!("{SERVICE}:{port}:{ip}")])
        .arg(format!("https://{SERVICE}:{port}{PATH}"))
        .output()
        .expect("curl");
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn pid(c: &Cluster, pod: &str) -> String {
    std::fs::read_to_string(
        c.dir()
            .join("pids")
            .join(format!("gpu-metrics-adapter-{pod}")),
    )
    .expect("pid")
    .trim()
    .to_string()
}

fn kill(pid: &str, signal: &str) {
    let ok = Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {signal} {pid}");
}

fn gone(pid: &str) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A client of the aggregator polling PATH every 50 ms: each answer's time and whether
/// it was a 200 with items.
struct Poller {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(Instant, bool)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn start(c: &Cluster) -> Poller {
        let pki = c.dir().join("pki");
        let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("pki");
        let (ca, admin) = (
            read("ca.crt"),
            Leaf {
                cert_pem: read("admin.crt"),
                key_pem: read("admin.key"),
            },
        );
        let url = format!("{}{PATH}", c.env("API_SERVER"));
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let client = HttpsClient::new(&ca, Some(&admin));
            while !stop2.load(Ordering::Relaxed) {
                let ok = matches!(client.get(&url, &[]), Ok((200, body))
                    if serde_json::from_str::<Value>(&body)
                        .is_ok_and(|v| !values(&v).is_empty()));
                seen2.lock().expect("seen").push((Instant::now(), ok));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Poller {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Answers since `from`: how many, how many failed, and the longest run of failures
    /// (from the first failed answer to the next good one).
    fn since(&self, from: Instant) -> (usize, usize, Duration) {
        let seen = self.seen.lock().expect("seen");
        let mut longest = Duration::ZERO;
        let mut failing_since: Option<Instant> = None;
        let (mut n, mut failed) = (0, 0);
        for &(at, ok) in seen.iter().filter(|(at, _)| *at >= from) {
            n += 1;
            if ok {
                if let Some(s) = failing_since.take() {
                    longest = longest.max(at - s);
                }
            } else {
                failed += 1;
                failing_since.get_or_insert(at);
            }
        }
        if let Some(s) = failing_since {
            longest = longest.max(Instant::now() - s);
        }
        (n, failed, longest)
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn two_replicas_answer_alike_and_the_aggregator_rides_out_losing_one() {
    let c = Cluster::up_with(&[("ADAPTER_REPLICAS", "2")]);
    let pods = adapter_pods(&c);
    assert_eq!(pods.len(), 2, "{pods:?}");

    // The same values from both, within one round.
    c.wait(
        "both replicas answer alike",
        Duration::from_secs(60),
        || {
            let a = values(&direct(&c, &pods[0].1)?);
            let b = values(&direct(&c, &pods[1].1)?);
            (!a.is_empty() && a == b).then_some(())
        },
    );

    let poller = Poller::start(&c);
    c.wait("the aggregator answers", Duration::from_secs(30), || {
        (poller.since(Instant::now() - Duration::from_secs(1)).0 > 3
            && poller.since(Instant::now() - Duration::from_secs(1)).1 == 0)
            .then_some(())
    });

    // Graceful: the pod is deleted (its endpoint leaves the Service), the kubelet runs
    // the preStop sleep the Deployment declares, then sends SIGTERM.
    let (gentle, gentle_ip) = pods[0].clone();
    let pre_stop = deployment_pre_stop(&c);
    let started = Instant::now();
    c.ok(&[
        "delete",
        "pod",
        "-n",
        "gpu-monitoring",
        &gentle,
        "--wait=false",
    ]);
    std::thread::sleep(pre_stop);
    let gentle_pid = pid(&c, &gentle);
    kill(&gentle_pid, "-TERM");
    c.wait("the deleted replica exits", Duration::from_secs(30), || {
        gone(&gentle_pid).then_some(())
    });
    // Its replacement, as a kubelet would start it.
    let replacement = c.wait("the replacement pod", Duration::from_secs(60), || {
        adapter_pods(&c)
            .into_iter()
            .find(|(name, ip)| *name != gentle && *name != pods[1].0 && !ip.is_empty())
    });
    let out = Command::new("bash")
        .arg(e2e_tests::workspace().join("tests/kube/cluster.sh"))
        .arg("adapter")
        .arg(c.dir())
        .arg(&replacement.0)
        .output()
        .expect("cluster.sh adapter");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.wait("the replacement answers", Duration::from_secs(60), || {
        direct(&c, &replacement.1).map(|_| ())
    });
    let (n, failed, _) = poller.since(started);
    eprintln!(
        "graceful: {n} answers through the aggregator, {failed} failed (replica {gentle} at {gentle_ip}, preStop {pre_stop:?})"
    );
    assert!(n > 20, "{n} answers");
    assert_eq!(failed, 0, "a graceful stop cost {failed} of {n} answers");

    // A crash: SIGKILL; the kubelet sees the container die and the pod is not ready.
    let (crashed, _) = pods[1].clone();
    let crashed_pid = pid(&c, &crashed);
    let started = Instant::now();
    kill(&crashed_pid, "-KILL");
    c.wait(
        "the crashed replica is gone",
        Duration::from_secs(10),
        || gone(&crashed_pid).then_some(()),
    );
    c.ok(&[
        "patch",
        "pod",
        "-n",
        "gpu-monitoring",
        &crashed,
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"False"},{"type":"ContainersReady","status":"False"}]}}"#,
    ]);
    // Well after the endpoint left: the aggregator answers throughout.
    c.wait("answers after the crash", Duration::from_secs(30), || {
        let recent = Instant::now() - Duration::from_secs(2);
        let (n, failed, _) = poller.since(recent);
        (n > 10 && failed == 0).then_some(())
    });
    let (n, failed, longest) = poller.since(started);
    eprintln!(
        "crash: {n} answers through the aggregator, {failed} failed, longest failing run {longest:?} (HPA sync {HPA_SYNC:?})"
    );
    assert!(
        longest < HPA_SYNC,
        "the aggregator failed for {longest:?}, more than one HPA sync ({HPA_SYNC:?})"
    );
    // The HPA kept scaling on the adapter's metric.
    let hpa = c.json(&["hpa", "-n", "inference", "resnet-inference"]);
    let active = hpa["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["type"] == "ScalingActive")
        .and_then(|x| x["status"].as_str());
    assert_eq!(active, Some("True"), "{hpa}");
}

/// The preStop sleep of the adapter's Deployment, as deploy/ declares it.
fn deployment_pre_stop(c: &Cluster) -> Duration {
    let d = c.json(&["deployment", "-n", "gpu-monitoring", "gpu-metrics-adapter"]);
    let seconds =
        d["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .expect("deploy/'s adapter Deployment declares a preStop sleep");
    Duration::from_secs(seconds)
}
