//! fleet-sim: a synthetic GPU fleet on one loopback listener, for the fleet-scale
//! harness (tests/scale/engine.sh). Test infrastructure, in the e2e-tests crate so it
//! never reaches a shipped binary; its model is `e2e_tests::fleet` (shape, series count,
//! truth).
//!
//!   fleet-sim [--gpus N] [--nodes-per-group N] [--listen ADDR] [--step-seconds S]
//!
//! Endpoints:
//! - `GET /node-group/{i}/metrics`: the series of nodes `i*per_group ..`, as the
//!   exporter serves them, at the current step (rendered once per group and step),
//!   and `fleet_sim_step`, the step;
//! - `GET /file-sd`: the scrape targets (Prometheus `file_sd_configs` JSON), one per
//!   group, the group's path in `__metrics_path__`;
//! - `GET /step`, `POST /step?to=N`: the current step (values change only with it;
//!   `--step-seconds S` also advances it every S seconds);
//! - `GET /truth[?step=N]`: per pod, the values an adapter must answer at that step;
//! - `GET /kube-objects`: the fleet's Namespaces and Pods, a `v1` List for
//!   `kubectl apply`;
//! - `GET /shape`: GPUs, nodes, node groups, series, pods and workloads;
//! - `GET /-/ready`.
//!
//! Logs `listening address=HOST:PORT` once it serves.

use e2e_tests::fleet::{Fleet, PodTruth};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connections served at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 256;

struct Settings {
    gpus: u32,
    per_group: u32,
    listen: String,
    step_seconds: u64,
}

fn settings() -> Result<Settings, String> {
    let mut s = Settings {
        gpus: 100_000,
        per_group: 50,
        listen: "127.0.0.1:0".into(),
        step_seconds: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--gpus" => {
                s.gpus = u32::try_from(number(value()?)?).map_err(|e| format!("--gpus: {e}"))?
            }
            "--nodes-per-group" => {
                s.per_group = u32::try_from(number(value()?)?)
                    .map_err(|e| format!("--nodes-per-group: {e}"))?
            }
            "--listen" => s.listen = value()?,
            "--step-seconds" => s.step_seconds = number(value()?)?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if s.gpus == 0 || s.per_group == 0 {
        return Err("--gpus and --nodes-per-group must be positive".into());
    }
    Ok(s)
}

struct State {
    fleet: Fleet,
    step: AtomicU64,
    /// Per group: the step its body was rendered at, and the body.
    bodies: Vec<Mutex<Option<(u64, Bytes)>>>,
    /// The truth of the last step asked for.
    truth: Mutex<Option<(u64, Bytes)>>,
    addr: String,
}

fn answer(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

fn truth_json(fleet: &Fleet, step: u64) -> Bytes {
    let pods: Vec<_> = fleet
        .truth(step)
        .into_iter()
        .map(|(pod, t): (_, PodTruth)| {
            let mut v = json!({
                "namespace": pod.namespace,
                "pod": pod.name,
                "app": pod.app,
                "devices": t.devices,
                "gpu_utilization": t.gpu_utilization,
                "gpu_memory_used_bytes": t.gpu_memory_used_bytes,
                "gpu_memory_utilization": t.gpu_memory_utilization,
            });
            if let Some(w) = t.gpu_power_watts {
                v["gpu_power_watts"] = json!(w);
            }
            if let Some(a) = t.gpu_tensor_active {
                v["gpu_tensor_active"] = json!(a);
            }
            v
        })
        .collect();
    Bytes::from(json!({ "step": step, "pods": pods }).to_string())
}

fn kube_objects(fleet: &Fleet) -> Bytes {
    let pods = fleet.pods();
    let mut namespaces: Vec<&str> = pods.iter().map(|p| p.namespace.as_str()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    // Each namespace with its default ServiceAccount, which pod admission requires
    // (no controller-manager makes it here).
    let mut items: Vec<serde_json::Value> = namespaces
        .iter()
        .flat_map(|ns| {
            [
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}),
            ]
        })
        .collect();
    items.extend(pods.iter().map(|p| {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace, "labels": {"app": p.app}},
            "spec": {
                "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": "registry.invalid/fleet-sim:0"}],
            },
        })
    }));
    Bytes::from(json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())
}

async fn serve(state: Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let text = "text/plain; charset=utf-8";
    let js = "application/json";
    match (req.method(), path.as_str()) {
        (&Method::GET, "/-/ready") => answer(StatusCode::OK, text, "ready\n"),
        (&Method::GET, "/shape") => {
            let f = &state.fleet;
            let shape = json!({
                "gpus": f.gpus(),
                "nodes": f.nodes,
                "node_groups": f.groups(),
                "series": f.series(),
                "pods": Fleet::first_pod(f.nodes),
                "workloads": Fleet::first_pod(f.nodes).div_ceil(u64::from(e2e_tests::fleet::PODS_PER_WORKLOAD)),
            });
            answer(StatusCode::OK, js, shape.to_string())
        }
        (&Method::GET, "/step") => answer(
            StatusCode::OK,
            js,
            json!({"step": state.step.load(Ordering::SeqCst)}).to_string(),
        ),
        (&Method::POST, "/step") => match query_param(&req, "to").map(|v| v.parse::<u64>()) {
            Some(Ok(to)) => {
                state.step.store(to, Ordering::SeqCst);
                answer(StatusCode::OK, js, json!({"step": to}).to_string())
            }
            _ => answer(StatusCode::BAD_REQUEST, text, "POST /step?to=N\n"),
        },
        (&Method::GET, "/file-sd") => {
            let targets: Vec<_> = (0..state.fleet.groups())
                .map(|g| {
                    json!({
                        "targets": [state.addr],
                        "labels": {"__metrics_path__": format!("/node-group/{g}/metrics"), "node_group": g.to_string()},
                    })
                })
                .collect();
            answer(
                StatusCode::OK,
                js,
                serde_json::Value::from(targets).to_string(),
            )
        }
        (&Method::GET, "/truth") => {
            let step = match query_param(&req, "step").map(|v| v.parse::<u64>()) {
                None => state.step.load(Ordering::SeqCst),
                Some(Ok(s)) => s,
                Some(Err(e)) => {
                    return answer(StatusCode::BAD_REQUEST, text, format!("step: {e}\n"));
                }
            };
            let cached = state.truth.lock().ok().and_then(|t| {
                t.as_ref()
                    .filter(|(s, _)| *s == step)
                    .map(|(_, b)| b.clone())
            });
            let body = match cached {
                Some(b) => b,
                None => {
                    let st = state.clone();
                    let Ok(b) =
                        tokio::task::spawn_blocking(move || truth_json(&st.fleet, step)).await
                    else {
                        return answer(StatusCode::INTERNAL_SERVER_ERROR, text, "truth failed\n");
                    };
                    if let Ok(mut t) = state.truth.lock() {
                        *t = Some((step, b.clone()));
                    }
                    b
                }
            };
            answer(StatusCode::OK, js, body)
        }
        (&Method::GET, "/kube-objects") => {
            let st = state.clone();
            match tokio::task::spawn_blocking(move || kube_objects(&st.fleet)).await {
                Ok(b) => answer(StatusCode::OK, js, b),
                Err(_) => answer(StatusCode::INTERNAL_SERVER_ERROR, text, "failed\n"),
            }
        }
        (&Method::GET, p) if p.starts_with("/node-group/") && p.ends_with("/metrics") => {
            let group = p
                .trim_start_matches("/node-group/")
                .trim_end_matches("/metrics")
                .parse::<u32>()
                .ok()
                .filter(|g| *g < state.fleet.groups());
            let Some(group) = group else {
                return answer(StatusCode::NOT_FOUND, text, "no such node group\n");
            };
            let st = state.clone();
            let body = tokio::task::spawn_blocking(move || {
                let step = st.step.load(Ordering::SeqCst);
                let mut slot = st.bodies[group as usize].lock().ok()?;
                match &*slot {
                    Some((s, b)) if *s == step => Some(b.clone()),
                    _ => {
                        // The step itself, so a reader of the engine can tell which
                        // step its samples are from.
                        let mut body = format!(
                            "# HELP fleet_sim_step The step of the fleet's values.\n# TYPE fleet_sim_step gauge\nfleet_sim_step {step}\n"
                        );
                        body.push_str(&st.fleet.render_group(group, step));
                        let b = Bytes::from(body);
                        *slot = Some((step, b.clone()));
                        Some(b)
                    }
                }
            })
            .await;
            match body {
                Ok(Some(b)) => answer(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    b,
                ),
                _ => answer(StatusCode::INTERNAL_SERVER_ERROR, text, "render failed\n"),
            }
        }
        _ => answer(StatusCode::NOT_FOUND, text, "not found\n"),
    }
}

fn main() -> ExitCode {
    let s = match settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fleet-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fleet-sim: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&s.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("fleet-sim: bind {}: {e}", s.listen);
                return ExitCode::FAILURE;
            }
        };
        let addr = match listener.local_addr() {
            Ok(a) => a.to_string(),
            Err(e) => {
                eprintln!("fleet-sim: {e}");
                return ExitCode::FAILURE;
            }
        };
        let fleet = Fleet::with_gpus(s.gpus, s.per_group);
        eprintln!(
            "fleet-sim: {} GPUs on {} nodes in {} node groups, {} series, {} pods",
            fleet.gpus(),
            fleet.nodes,
            fleet.groups(),
            fleet.series(),
            Fleet::first_pod(fleet.nodes)
        );
        let state = Arc::new(State {
            bodies: (0..fleet.groups()).map(|_| Mutex::new(None)).collect(),
            fleet,
            step: AtomicU64::new(0),
            truth: Mutex::new(None),
            addr: addr.clone(),
        });
        if s.step_seconds > 0 {
            let st = state.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(s.step_seconds));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    st.step.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        eprintln!("fleet-sim: listening address={addr}");
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return ExitCode::FAILURE;
            };
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("fleet-sim: accept: {e}");
                    continue;
                }
            };
            let st = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let st = st.clone();
                    async move { Ok::<_, std::convert::Infallible>(serve(st, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .max_buf_size(64 * 1024)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                drop(permit);
            });
        }
    })
}
