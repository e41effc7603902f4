//! Pod attribution: which Kubernetes pod and container a GPU, a MIG instance or a GPU
//! process belongs to, so that series can carry `pod`, `namespace` and `container`
//! labels the way dcgm-exporter's do (and, unlike dcgm-exporter, for every device-ID
//! form a device plugin produces).
//!
//! Two independent inputs meet here:
//!
//! - the kubelet's PodResources API lists, per container, the *device IDs* it was
//!   allocated under a resource name; [`device_id`] turns such an ID into a typed
//!   [`device_id::DeviceId`] (GPU UUID, MIG UUID, index, GKE name…, plus the sharing
//!   replica) and says which resource names are GPUs;
//! - per-process NVML data names PIDs; [`cgroup`] maps a PID to its pod UID and
//!   container ID through `/proc/<pid>/cgroup`.
//!
//! Both are pure parsers with no Kubernetes client and no NVML calls. They are not yet
//! wired into the sampler: issue 4 connects them to the PodResources client, the pod
//! watch and the NVML lookups.

pub mod cgroup;
pub mod device_id;
