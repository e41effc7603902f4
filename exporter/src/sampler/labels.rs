//! The label sets of entities and NVLinks, and their rebuild when pods or HPC jobs change.

use super::SamplerOptions;
use crate::attribution::assign::Holder;
use crate::plan::counters::ExportPlan;
use crate::snapshot::push_label;
use crate::source::{EntityInfo, Inventory};
use std::sync::Arc;

/// The label names `-o` changes, as (today's, 1.x).
const OLD_NAMESPACE: [(&str, &str); 4] = [
    ("UUID", "uuid"),
    ("pod", "pod_name"),
    ("namespace", "pod_namespace"),
    ("container", "container_name"),
];

impl SamplerOptions {
    /// The name a dcgm-exporter label has under these options: its 1.x name with `-o`.
    fn label_name(&self, name: &'static str) -> &'static str {
        match OLD_NAMESPACE.iter().find(|(now, _)| *now == name) {
            Some((_, old)) if self.old_namespace => old,
            _ => name,
        }
    }

    /// Whether a pod label of this name would collide with a label the exporter
    /// writes.
    pub(super) fn reserved(&self, name: &str) -> bool {
        RESERVED_LABELS.contains(&name)
            || name.starts_with("dra_")
            || (self.old_namespace && OLD_NAMESPACE.iter().any(|(_, old)| *old == name))
    }
}

/// Label names the exporter itself writes, which a pod label must not take.
pub(super) const RESERVED_LABELS: [&str; 19] = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "Hostname",
    "hostname",
    "container",
    "namespace",
    "pod",
    "err_code",
    "err_msg",
    "pid",
    "process_name",
    "hpc_job",
    "pod_uid",
    "vgpu",
];

/// The label set of one entity in dcgm-exporter's order, with a pod's labels when the
/// series belongs to one and the HPC job when it belongs to one: `gpu, UUID,
/// pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID,] hostname`, then label
/// fields and allow-listed pod labels in one byte-sorted run, then dcgm's attributes,
/// byte-sorted: `container, [dra_*,] hpc_job, namespace, pod, pod_uid, vgpu`. In
/// `--kubernetes-virtual-gpus` mode pod labels are not copied (nor are they by dcgm).
/// With `-o`, dcgm's 1.x names: `uuid` for `UUID`, and `container_name, [dra_*,]
/// hpc_job, pod_name, pod_namespace, pod_uid, vgpu`.
pub fn entity_label_string(
    e: &EntityInfo,
    plan: &ExportPlan,
    opts: &SamplerOptions,
    holder: Option<&Holder>,
    hpc_job: Option<&str>,
) -> Arc<str> {
    let mut s = String::with_capacity(256);
    push_label(&mut s, "gpu", itoa::Buffer::new().format(e.gpu_index));
    push_label(&mut s, opts.label_name("UUID"), &e.uuid);
    push_label(&mut s, "pci_bus_id", &e.pci_bus_id);
    push_label(&mut s, "device", &format!("nvidia{}", e.gpu_index));
    let model = if opts.replace_blanks_in_model_name {
        e.model_name.replace(' ', "-")
    } else {
        e.model_name.clone()
    };
    push_label(&mut s, "modelName", &model);
    if let Some(m) = &e.mig {
        push_label(&mut s, "GPU_I_PROFILE", &m.profile);
        push_label(
            &mut s,
            "GPU_I_ID",
            itoa::Buffer::new().format(m.gpu_instance_id),
        );
    }
    if let Some((name, value)) = &opts.hostname {
        push_label(&mut s, name, value);
    }
    // `plan.labels` is byte-sorted, as dcgm-exporter emits label fields; pod labels
    // join that run in order.
    let mut run: Vec<(&str, &str)> = plan
        .labels
        .iter()
        .filter_map(|(name, field)| e.labels.get(field).map(|v| (*name, v.as_str())))
        .collect();
    if let Some(h) = holder.filter(|_| !opts.virtual_gpus) {
        for (k, v) in &h.pod_labels {
            let taken = opts.reserved(k) || run.iter().any(|(n, _)| *n == k.as_str());
            if !taken {
                run.push((k, v));
            }
        }
        run.sort_by(|a, b| a.0.cmp(b.0));
    }
    for (name, value) in run {
        push_label(&mut s, name, value);
    }
    if let Some(c) = holder.and_then(|h| h.container.as_ref()) {
        push_label(&mut s, opts.label_name("container"), c);
    }
    if let Some(dra) = holder.and_then(|h| h.dra.as_ref()) {
        for (name, value) in dra.pairs() {
            push_label(&mut s, name, value);
        }
    }
    if let Some(job) = hpc_job {
        push_label(&mut s, "hpc_job", job);
    }
    if let Some(h) = holder {
        // Byte-sorted either way: `namespace, pod`; `pod_name, pod_namespace`.
        if opts.old_namespace {
            push_label(&mut s, opts.label_name("pod"), &h.pod);
            push_label(&mut s, opts.label_name("namespace"), &h.namespace);
        } else {
            push_label(&mut s, opts.label_name("namespace"), &h.namespace);
            push_label(&mut s, opts.label_name("pod"), &h.pod);
        }
        if let Some(uid) = h.pod_uid.as_ref().filter(|_| opts.pod_uid) {
            push_label(&mut s, "pod_uid", uid);
        }
        if let Some(replica) = h.vgpu.filter(|_| opts.virtual_gpus) {
            push_label(&mut s, "vgpu", itoa::Buffer::new().format(replica));
        }
    }
    Arc::from(s)
}

/// The label set of each entity, without pods.
pub(super) fn entity_labels(
    inv: &Inventory,
    plan: &ExportPlan,
    opts: &SamplerOptions,
) -> Vec<Arc<str>> {
    inv.entities
        .iter()
        .map(|e| entity_label_string(e, plan, opts, None, None))
        .collect()
}

/// The label set of one NVLink, as dcgm-exporter labels its NVLink entities: `nvlink,
/// gpu, gpu_uuid, pci_bus_id, device, model_name, hostname`, then the label fields
/// (byte-sorted). No pod labels: a link belongs to the node, not to a workload.
pub fn link_label_string(
    e: &EntityInfo,
    link: u32,
    plan: &ExportPlan,
    opts: &SamplerOptions,
) -> Arc<str> {
    let mut s = String::with_capacity(256);
    push_label(&mut s, "nvlink", itoa::Buffer::new().format(link));
    push_label(&mut s, "gpu", itoa::Buffer::new().format(e.gpu_index));
    push_label(&mut s, "gpu_uuid", &e.uuid);
    push_label(&mut s, "pci_bus_id", &e.pci_bus_id);
    push_label(&mut s, "device", &format!("nvidia{}", e.gpu_index));
    // dcgm-exporter never replaces blanks in an NVLink's model name.
    push_label(&mut s, "model_name", &e.model_name);
    if let Some((name, value)) = &opts.hostname {
        push_label(&mut s, name, value);
    }
    for (name, field) in &plan.labels {
        if let Some(v) = e.labels.get(field) {
            push_label(&mut s, name, v);
        }
    }
    Arc::from(s)
}
