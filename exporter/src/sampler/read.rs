//! Reading a cycle: every planned quantity of every entity and NVLink, processes and XIDs.

use super::Sampler;
use super::cadence::Cadence;
use super::devices::Devices;
use super::pods::attribute;
use crate::attribution::assign::{Holding, Holdings};
use crate::plan::catalog::{Quantity, Scope};
use crate::plan::counters::ExportPlan;
use crate::snapshot::XidStat;
use crate::source::{GpuSource, Raw, ReadError};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

impl Sampler {
    pub(super) fn read_all(&mut self) -> Result<(), ReadError> {
        let Some(d) = self.devices.as_mut() else {
            return Err(ReadError::Unavailable("no devices".into()));
        };
        d.start_cycle();
        let mut reader = Reader {
            source: self.source.as_mut(),
            quantities: &self.quantities,
            cadence: &self.cadence,
            plan: &self.plan,
            field_errors: &mut self.field_errors,
            scratch: &mut self.scratch,
            wanted: Vec::with_capacity(self.quantities.len()),
            succeeded: 0,
            failed: None,
        };
        for e in 0..d.inventory.entities.len() {
            reader.read_entity(d, e)?;
        }
        let mut first = 0;
        while first < d.links.len() {
            // NVLinks, one batch per GPU.
            let e = d.links[first].entity;
            let count = d.links[first..]
                .iter()
                .take_while(|l| l.entity == e)
                .count();
            reader.read_links(d, e, first..first + count)?;
            first += count;
        }
        reader.verdict()?;
        let jobs = self.hpc_jobs.as_ref().map(|j| j.load_full());
        let (holdings, took) = attribute(
            d,
            self.attributor.as_mut(),
            jobs.as_deref(),
            &self.plan,
            &self.opts,
        );
        self.attribution_time += took;
        read_processes(
            self.source.as_mut(),
            d,
            holdings.as_ref(),
            self.opts.process_metrics,
        )?;
        read_xids(self.source.as_mut(), d, self.exporter.any());
        self.source.end_cycle();
        Ok(())
    }
}

/// The reads of one cycle, on split borrows of the sampler, and their tally.
struct Reader<'a> {
    source: &'a mut dyn GpuSource,
    quantities: &'a [(Quantity, Scope, Vec<usize>)],
    cadence: &'a Cadence,
    plan: &'a ExportPlan,
    field_errors: &'a mut [u64],
    scratch: &'a mut Vec<Result<Raw, ReadError>>,
    /// The quantities asked of the entity at hand (an allocation reused).
    wanted: Vec<Quantity>,
    /// A driver that vanished may answer every call with a generic error rather than
    /// "not loaded": a cycle where nothing at all succeeds is treated as that.
    succeeded: usize,
    failed: Option<String>,
}

impl Reader<'_> {
    /// Every planned, supported quantity of entity `e`, into its readings.
    fn read_entity(&mut self, d: &mut Devices, e: usize) -> Result<(), ReadError> {
        let parent_lost = d.inventory.entities[e]
            .mig
            .as_ref()
            .is_some_and(|m| d.lost[m.parent]);
        if d.lost[e] || parent_lost {
            d.lost[e] = true;
            return Ok(());
        }
        let is_gpu = d.inventory.entities[e].mig.is_none();
        let cycle = d.cycle;
        let (unsupported, held, readings) = (&d.unsupported[e], &d.held[e], &mut d.readings[e]);
        let cadence = self.cadence;
        let planned = |q: Quantity, scope: Scope| {
            scope != Scope::Link && (is_gpu || scope == Scope::Instance) && !unsupported[q as usize]
        };
        // The planned quantities due this cycle: never read, or read a period ago.
        let due = |q: Quantity| {
            held[q as usize].is_none_or(|(_, at)| cycle - at >= u64::from(cadence.of(q)))
        };
        self.wanted.clear();
        self.wanted.extend(
            self.quantities
                .iter()
                .filter(|(q, scope, _)| planned(*q, *scope) && due(*q))
                .map(|(q, _, _)| *q),
        );
        // The others serve their last reading, younger than their period.
        for (q, scope, _) in self.quantities {
            if planned(*q, *scope)
                && !self.wanted.contains(q)
                && let Some((raw, _)) = held[*q as usize]
            {
                readings.push((*q, raw));
            }
        }
        if self.wanted.is_empty() {
            return Ok(());
        }
        self.source.read(e, &self.wanted, self.scratch);
        for (q, r) in self.wanted.iter().zip(self.scratch.iter()) {
            d.held[e][*q as usize] = r.as_ref().ok().map(|raw| (*raw, cycle));
        }
        for i in 0..self.wanted.len() {
            let q = self.wanted[i];
            match &self.scratch[i] {
                Ok(_) | Err(ReadError::NoValueYet) => self.succeeded += 1,
                Err(ReadError::NotSupported) => {
                    d.unsupported[e][q as usize] = true;
                    tracing::debug!(entity = e, quantity = ?q, "not supported; not asked again");
                }
                Err(err) => {
                    let err = err.clone();
                    self.settle(d, e, q, &err)?;
                }
            }
        }
        d.readings[e].extend(
            self.wanted
                .iter()
                .zip(self.scratch.iter())
                .filter_map(|(q, r)| r.as_ref().ok().map(|r| (*q, *r))),
        );
        Ok(())
    }

    /// The planned link quantities of GPU `e`'s NVLinks, the link slots `slots`.
    fn read_links(
        &mut self,
        d: &mut Devices,
        e: usize,
        slots: Range<usize>,
    ) -> Result<(), ReadError> {
        if d.lost[e] {
            return Ok(());
        }
        let cycle = d.cycle;
        let (unsupported, read_at) = (&d.link_unsupported[e], &d.links_read_at[e]);
        let (link_held, link_readings) = (&d.link_held, &mut d.link_readings);
        let cadence = self.cadence;
        let planned = |q: Quantity, scope: Scope| scope == Scope::Link && !unsupported[q as usize];
        let due = |q: Quantity| {
            read_at[q as usize].is_none_or(|at| cycle - at >= u64::from(cadence.of(q)))
        };
        self.wanted.clear();
        self.wanted.extend(
            self.quantities
                .iter()
                .filter(|(q, scope, _)| planned(*q, *scope) && due(*q))
                .map(|(q, _, _)| *q),
        );
        for (q, scope, _) in self.quantities {
            if planned(*q, *scope) && !self.wanted.contains(q) {
                for slot in slots.clone() {
                    if let Some(raw) = link_held[slot][*q as usize] {
                        link_readings[slot].push((*q, raw));
                    }
                }
            }
        }
        if self.wanted.is_empty() {
            return Ok(());
        }
        let count = slots.len();
        self.source
            .read_links(e, count as u32, &self.wanted, self.scratch);
        let stride = self.wanted.len();
        for (qi, q) in self.wanted.iter().enumerate() {
            d.links_read_at[e][*q as usize] = Some(cycle);
            for (k, slot) in slots.clone().enumerate() {
                d.link_held[slot][*q as usize] = self
                    .scratch
                    .get(qi + k * stride)
                    .and_then(|r| r.as_ref().ok().copied());
            }
        }
        for qi in 0..stride {
            let q = self.wanted[qi];
            // The results are link by link, each with every wanted quantity.
            let result = |k: usize| self.scratch.get(qi + k * stride);
            if (0..count)
                .map_while(result)
                .all(|r| matches!(r, Err(ReadError::NotSupported)))
            {
                d.link_unsupported[e][q as usize] = true;
                tracing::debug!(entity = e, quantity = ?q, "not supported on any NVLink; not asked again");
                continue;
            }
            for (k, slot) in slots.clone().enumerate() {
                let Some(r) = self.scratch.get(qi + k * stride) else {
                    break;
                };
                match r {
                    Ok(raw) => {
                        self.succeeded += 1;
                        d.link_readings[slot].push((q, *raw));
                    }
                    Err(err) => {
                        let err = err.clone();
                        self.settle(d, e, q, &err)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// What a failed reading means, the same for an entity's and a link's: a lost GPU
    /// is marked, a driver that is gone ends the cycle, any other failure is counted
    /// against the fields `q` feeds. No value yet, or not supported, is no failure.
    fn settle(
        &mut self,
        d: &mut Devices,
        e: usize,
        q: Quantity,
        err: &ReadError,
    ) -> Result<(), ReadError> {
        match err {
            ReadError::NoValueYet | ReadError::NotSupported => {}
            ReadError::GpuLost => mark_lost(d, e),
            ReadError::Unavailable(why) => return Err(ReadError::Unavailable(why.clone())),
            ReadError::Failed(why) => {
                self.failed.get_or_insert_with(|| why.clone());
                count_failure(self.quantities, self.plan, self.field_errors, q, why);
            }
        }
        Ok(())
    }

    /// The cycle reached the driver unless every reading failed.
    fn verdict(&self) -> Result<(), ReadError> {
        match &self.failed {
            Some(why) if self.succeeded == 0 => Err(ReadError::Unavailable(format!(
                "every reading failed ({why})"
            ))),
            _ => Ok(()),
        }
    }
}

/// The process lists of the entities that need one: every entity with
/// `--process-metrics`, else the shared ones (to split them per pod). Only a driver that
/// is gone fails the cycle; an entity whose list cannot be read stays unsplit.
fn read_processes(
    source: &mut dyn GpuSource,
    d: &mut Devices,
    holdings: Option<&Arc<Holdings>>,
    process_metrics: bool,
) -> Result<(), ReadError> {
    for e in 0..d.inventory.entities.len() {
        let shared =
            holdings.is_some_and(|h| matches!(h.per_entity.get(e), Some(Holding::Shared(_))));
        if !(process_metrics || shared) || d.lost[e] {
            continue;
        }
        match source.processes(e) {
            Ok(p) => {
                d.processes[e] = p;
                d.processes_read[e] = true;
            }
            Err(ReadError::Unavailable(why)) => return Err(ReadError::Unavailable(why)),
            Err(_) => {}
        }
    }
    Ok(())
}

/// This cycle's XID events: the last XID gauge, the per-code counters and, when a
/// `DCGM_EXP_*` collector is planned (`windows`), the trailing windows.
fn read_xids(source: &mut dyn GpuSource, d: &mut Devices, windows: bool) {
    let n = d.inventory.entities.len();
    for ev in source.xid_events() {
        if ev.entity >= n {
            continue;
        }
        d.last_xid[ev.entity] = Some(ev.code);
        // dcgm-exporter reports a MIG instance's XID on its parent GPU's
        // DCGM_FI_DEV_XID_ERRORS (the only entity with that gauge); the
        // per-instance counter below keeps where it happened.
        if let Some(mig) = &d.inventory.entities[ev.entity].mig
            && mig.parent < n
        {
            d.last_xid[mig.parent] = Some(ev.code);
        }
        if windows {
            let gpu = d.inventory.entities[ev.entity]
                .mig
                .as_ref()
                .map_or(ev.entity, |m| m.parent);
            if let Some(w) = d.windows.get_mut(gpu) {
                w.xids.push(Instant::now(), ev.code);
            }
        }
        let s = d.xids[ev.entity].entry(ev.code).or_insert(XidStat {
            count: 0,
            last_seen: ev.at,
        });
        s.count += 1;
        s.last_seen = ev.at;
        tracing::warn!(
            gpu = d.inventory.entities[ev.entity].gpu_index,
            xid = ev.code,
            "XID error"
        );
    }
}

/// Mark entity `e` lost (fallen off the bus), logging it the first time.
pub(super) fn mark_lost(d: &mut Devices, e: usize) {
    if !d.lost[e] {
        let entity = &d.inventory.entities[e];
        tracing::error!(gpu = entity.gpu_index, uuid = %entity.uuid, "GPU is lost (fallen off the bus)");
    }
    d.lost[e] = true;
}

/// Count a failed read of `q` against every metric it feeds, warning on each metric's
/// first failure.
pub(super) fn count_failure(
    quantities: &[(Quantity, Scope, Vec<usize>)],
    plan: &ExportPlan,
    field_errors: &mut [u64],
    q: Quantity,
    why: &str,
) {
    let Some((_, _, metrics)) = quantities.iter().find(|(x, _, _)| *x == q) else {
        return;
    };
    for &m in metrics {
        if field_errors[m] == 0 {
            tracing::warn!(field = plan.metrics[m].name, error = %why, "field read failed");
        }
        field_errors[m] += 1;
    }
}
