//! A stand-in for LLM serving engines' `/metrics`, for the dashboards' end-to-end test:
//! vLLM's metric names and label set (`model_name`, `engine`), one block per pod, the
//! `namespace` and `pod` labels a Prometheus Kubernetes scrape attaches. Gauges move and
//! counters and histograms grow with time, so `rate()` and `histogram_quantile()` have
//! something to work on. Real HTTP on a real port; test infrastructure only.

use std::io::{Read, Write};
use std::time::Instant;

pub struct FakeEngines {
    pub port: u16,
}

/// The exposition at `t` seconds after start for `pods` ((namespace, pod) each).
pub fn exposition(pods: &[(String, String)], t: f64) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, lines: &mut dyn FnMut(&mut String)| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        lines(&mut out);
    };
    let labels = |ns: &str, pod: &str| {
        format!("engine=\"0\",model_name=\"llama\",namespace=\"{ns}\",pod=\"{pod}\"")
    };
    let tick = t.floor();
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting.",
        &mut |o| {
            for (i, (ns, pod)) in pods.iter().enumerate() {
                let v = (tick as u64 + i as u64 * 3) % 7;
                o.push_str(&format!(
                    "vllm:num_requests_waiting{{{}}} {v}\n",
                    labels(ns, pod)
                ));
            }
        },
    );
    family(
        "vllm:num_requests_running",
        "gauge",
        "Requests running.",
        &mut |o| {
            for (i, (ns, pod)) in pods.iter().enumerate() {
                o.push_str(&format!(
                    "vllm:num_requests_running{{{}}} {}\n",
                    labels(ns, pod),
                    4 + i
                ));
            }
        },
    );
    family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV cache usage (1 = full).",
        &mut |o| {
            for (i, (ns, pod)) in pods.iter().enumerate() {
                let v = 0.3 + 0.1 * i as f64;
                o.push_str(&format!(
                    "vllm:kv_cache_usage_perc{{{}}} {v}\n",
                    labels(ns, pod)
                ));
            }
        },
    );
    family(
        "vllm:generation_tokens",
        "counter",
        "Generated tokens.",
        &mut |o| {
            for (i, (ns, pod)) in pods.iter().enumerate() {
                let v = (t * 100.0 * (i + 1) as f64).floor();
                o.push_str(&format!(
                    "vllm:generation_tokens_total{{{}}} {v}\n",
                    labels(ns, pod)
                ));
            }
        },
    );
    family(
        "vllm:time_to_first_token_seconds",
        "histogram",
        "Time to first token.",
        &mut |o| {
            for (ns, pod) in pods {
                // Ten requests a second: 2 under 0.1 s, 6 more under 0.5 s, 2 more under 1 s.
                let n = (t * 10.0).floor();
                let l = labels(ns, pod);
                for (le, share) in [("0.1", 0.2), ("0.5", 0.8), ("1.0", 1.0), ("+Inf", 1.0)] {
                    o.push_str(&format!(
                        "vllm:time_to_first_token_seconds_bucket{{{l},le=\"{le}\"}} {}\n",
                        (n * share).floor()
                    ));
                }
                o.push_str(&format!(
                    "vllm:time_to_first_token_seconds_sum{{{l}}} {}\n",
                    n * 0.3
                ));
                o.push_str(&format!(
                    "vllm:time_to_first_token_seconds_count{{{l}}} {n}\n"
                ));
            }
        },
    );
    out
}

impl FakeEngines {
    /// Serve [`exposition`] for `pods` on a free port, from a background thread.
    pub fn start(pods: &[(&str, &str)]) -> FakeEngines {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let pods: Vec<(String, String)> = pods
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect();
        let started = Instant::now();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let body = exposition(&pods, started.elapsed().as_secs_f64());
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        FakeEngines { port }
    }
}
