//! Attribution inside a cycle: who holds what and the labels that follow, processes
//! with their pods, shared devices split per pod.

use super::SamplerOptions;
use super::devices::Devices;
use super::labels::entity_label_string;
use super::plan::Split;
use crate::attribution::Attributor;
use crate::attribution::assign::{Holder, Holding, Holdings, split_owned, split_proportional};
use crate::attribution::pods::PodDirectory;
use crate::hpc::HpcJobs;
use crate::plan::counters::ExportPlan;
use crate::snapshot::Value;
use crate::snapshot::{PodRef, PodShare, ProcessSnapshot};
use crate::source::ProcessSample;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pod UID → the pod's [`PodRef`], for one generation of the pod directory: a process's
/// series share their label strings across cycles instead of copying them every cycle.
#[derive(Default)]
pub(super) struct PodRefs {
    pub(super) generation: u64,
    pub(super) by_uid: HashMap<String, Option<PodRef>>,
}

impl PodRefs {
    fn get(&mut self, pods: &PodDirectory, uid: &str) -> Option<PodRef> {
        if pods.generation != self.generation {
            self.by_uid.clear();
            self.generation = pods.generation;
        }
        if let Some(known) = self.by_uid.get(uid) {
            return known.clone();
        }
        let found = pods.by_uid.get(uid).map(|(namespace, pod)| PodRef {
            namespace: namespace.as_str().into(),
            pod: pod.as_str().into(),
        });
        self.by_uid.insert(uid.to_string(), found.clone());
        found
    }
}

/// Each process with the pod its cgroup names, when the pod watch knows that pod.
pub(super) fn with_pods(
    a: &mut Attributor,
    refs: &mut PodRefs,
    samples: Vec<ProcessSample>,
) -> Vec<ProcessSnapshot> {
    let pods = a.pods();
    samples
        .into_iter()
        .map(|sample| {
            let pod = if pods.synced {
                a.pod_of(sample.pid)
                    .and_then(|pc| refs.get(&pods, &pc.pod_uid))
            } else {
                None
            };
            ProcessSnapshot { sample, pod }
        })
        .collect()
}

/// Split the split metrics of one shared entity between the pods holding it, from the
/// processes on it: each process's pod comes from its cgroup and the pod directory;
/// processes of no holding pod (other pods, system processes, unreadable cgroups) make
/// up the remainder left on the entity's own series. `values` are the entity's values,
/// one per plan metric; the split ones are replaced by their remainder.
pub(super) fn split_entity(
    a: &mut Attributor,
    holders: &[Holder],
    labels: &[Arc<str>],
    processes: &[ProcessSample],
    splits: &[(usize, Split)],
    values: &mut [Option<Value>],
) -> Vec<PodShare> {
    let pods = a.pods();
    if !pods.synced {
        // Without pod UIDs, no process can be placed: leave the device whole rather
        // than report every pod at zero.
        return Vec::new();
    }
    let mut sm = vec![0u64; holders.len()];
    let mut mem = vec![0u64; holders.len()];
    let mut sm_all = 0u64;
    for p in processes {
        let sm_p = u64::from(p.sm_util_percent.unwrap_or(0));
        sm_all += sm_p;
        let holder = a
            .pod_of(p.pid)
            .and_then(|pc| pods.by_uid.get(&pc.pod_uid))
            .and_then(|(ns, name)| {
                holders
                    .iter()
                    .position(|h| &*h.namespace == ns && &*h.pod == name)
            });
        if let Some(i) = holder {
            sm[i] += sm_p;
            mem[i] += p.used_memory_bytes.unwrap_or(0);
        }
    }
    let mut shares: Vec<PodShare> = labels
        .iter()
        .map(|l| PodShare {
            labels: l.clone(),
            values: Vec::with_capacity(splits.len()),
        })
        .collect();
    for &(m, how) in splits {
        let Some(Some(Value::Int(total))) = values.get(m).copied() else {
            continue;
        };
        let (parts, rest) = match how {
            Split::BySmShare => split_proportional(total, &sm, sm_all),
            Split::ByMemory => {
                let mib: Vec<u64> = mem.iter().map(|b| b >> 20).collect();
                split_owned(total, &mib)
            }
        };
        for (share, v) in shares.iter_mut().zip(parts) {
            share.values.push((m, Value::Int(v)));
        }
        values[m] = Some(Value::Int(rest));
    }
    shares
}

/// Who holds what this cycle, with the label sets rebuilt when the holdings or the HPC
/// jobs changed; and the time the attribution took.
pub(super) fn attribute(
    d: &mut Devices,
    attributor: Option<&mut Attributor>,
    jobs: Option<&HpcJobs>,
    plan: &ExportPlan,
    opts: &SamplerOptions,
) -> (Option<Arc<Holdings>>, Duration) {
    let jobs_changed = jobs.map(|j| j.generation) != d.hpc_generation;
    match attributor {
        Some(a) => {
            let t = Instant::now();
            let (h, changed) = a.holdings(&d.inventory, d.generation);
            if changed || d.holdings.is_none() || jobs_changed {
                relabel(d, Some(&h), jobs, plan, opts);
            }
            (Some(h), t.elapsed())
        }
        None => {
            if jobs_changed {
                relabel(d, None, jobs, plan, opts);
            }
            (None, Duration::ZERO)
        }
    }
}

/// Entity `e`'s processes for their series (`--process-metrics`), each with its pod
/// where the entity is not held whole by one (whose labels already name it).
pub(super) fn process_snapshots(
    attributor: Option<&mut Attributor>,
    refs: &mut PodRefs,
    d: &mut Devices,
    e: usize,
) -> Vec<ProcessSnapshot> {
    let samples = std::mem::take(&mut d.processes[e]);
    let held_whole = matches!(
        d.holdings.as_deref().and_then(|h| h.per_entity.get(e)),
        Some(Holding::Exclusive(_))
    );
    match attributor {
        Some(a) if !held_whole => with_pods(a, refs, samples),
        _ => samples
            .into_iter()
            .map(|sample| ProcessSnapshot { sample, pod: None })
            .collect(),
    }
}

/// Rebuild the label sets that depend on who holds what (`h`) and on the HPC jobs.
pub(super) fn relabel(
    d: &mut Devices,
    h: Option<&Arc<Holdings>>,
    jobs: Option<&HpcJobs>,
    plan: &ExportPlan,
    opts: &SamplerOptions,
) {
    for (e, info) in d.inventory.entities.iter().enumerate() {
        let jobs_here: Vec<Option<&str>> = match jobs {
            Some(j) => j
                .jobs(info.gpu_index, info.mig.as_ref().map(|m| m.gpu_instance_id))
                .iter()
                .map(|j| Some(j.as_str()))
                .collect(),
            None => Vec::new(),
        };
        // One series per job, as dcgm-exporter repeats them; one without a job else.
        let jobs_here = if jobs_here.is_empty() {
            vec![None]
        } else {
            jobs_here
        };
        let label = |holder: Option<&Holder>, job: Option<&str>| {
            entity_label_string(info, plan, opts, holder, job)
        };
        let per_job = |holder: Option<&Holder>| -> Vec<Arc<str>> {
            jobs_here.iter().map(|j| label(holder, *j)).collect()
        };
        let (own, copies, shares) = match h.and_then(|h| h.per_entity.get(e)) {
            Some(Holding::Exclusive(holder)) => {
                (label(Some(holder), None), per_job(Some(holder)), Vec::new())
            }
            Some(Holding::Shared(holders)) => {
                let shares: Vec<Arc<str>> = holders.iter().map(|h| label(Some(h), None)).collect();
                let copies = if opts.virtual_gpus {
                    holders.iter().flat_map(|h| per_job(Some(h))).collect()
                } else {
                    per_job(None)
                };
                (d.base_labels[e].clone(), copies, shares)
            }
            Some(Holding::Free) | None => (d.base_labels[e].clone(), per_job(None), Vec::new()),
        };
        // Copies only where they differ from the entity's own labels.
        d.copies[e] = (copies.len() != 1 || copies[0] != own).then(|| Arc::from(copies));
        d.labels[e] = own;
        d.share_labels[e] = shares;
    }
    if let Some(h) = h {
        d.allocation_labels = h
            .allocations
            .iter()
            .filter_map(|(e, holder)| {
                d.inventory
                    .entities
                    .get(*e)
                    .map(|info| entity_label_string(info, plan, opts, Some(holder), None))
            })
            .collect();
        d.holdings = Some(h.clone());
    }
    d.hpc_generation = jobs.map(|j| j.generation);
}
