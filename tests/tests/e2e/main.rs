//! The end-to-end suite, one test binary: every module below starts the real binaries
//! (exporter, adapter, fake libnvidia-ml) against real Prometheus, promtool, kubectl and
//! nvidia-ml-py. One binary, not one per file, because each links the whole workspace:
//! fifteen links cost CI minutes and gigabytes of disk.

mod adapter;
mod adapter_auth;
mod adapter_composite;
mod adapter_discovery;
mod adapter_memory;
mod adapter_prometheus;
mod arm64;
mod attribution;
mod cadence;
mod cluster;
mod cluster_composite;
mod cluster_ha;
mod counters_reload;
mod dashboards;
mod dcgm_dropin;
mod demo;
mod deploy;
mod deploy_llm_serving;
mod docs;
mod dra;
mod faults;
mod faults_adapter;
mod features;
mod fleet_scale;
mod golden;
mod health_signals;
mod helm;
mod images;
mod keda;
mod layering;
mod listener_limits;
mod long_polls;
mod nvlink_fabric;
mod nvml_backend;
mod nvml_breadth;
mod nvml_calls;
mod nvml_fidelity;
mod peers;
mod pod_metadata;
mod prometheus;
mod prometheus_pushdown;
mod promtool;
mod protobuf;
mod rbac;
mod readiness;
mod real_gpu;
mod reenumeration;
mod serving;
mod soak;
mod web_config;
