//! Building the snapshot of a cycle from its readings, in dcgm's units.

use super::Sampler;
use super::devices::Devices;
use super::pods::{process_snapshots, split_entity};
use super::windows::exporter_values;
use crate::attribution::assign::Holding;
use crate::plan::catalog::{Convert, Scope};
use crate::plan::counters::ExportPlan;
use crate::plan::counters::MetricKind;
use crate::snapshot::LinkSnapshot;
use crate::snapshot::{EntitySnapshot, Snapshot, Value};
use crate::source::Raw;
use std::time::{Instant, SystemTime};

impl Sampler {
    pub(super) fn snapshot(&mut self, started: Instant) -> Snapshot {
        let now = Instant::now();
        let mut snap = Snapshot::empty(self.plan.clone(), self.build_labels.clone());
        snap.taken = now;
        snap.taken_at = SystemTime::now();
        snap.sample_duration = now - started;
        snap.last_success = self.last_success;
        snap.samples_total = self.samples_total;
        snap.sample_failures_total = self.failures_total;
        snap.process_metrics = self.opts.process_metrics;
        snap.field_errors = self
            .plan
            .metrics
            .iter()
            .zip(&self.field_errors)
            .filter(|(_, c)| **c > 0)
            .map(|(m, c)| (m.name, *c))
            .collect();
        let Some(d) = self.devices.as_mut() else {
            return snap;
        };
        snap.source_up = true;
        let metrics = self.plan.metrics.len();
        let n = d.inventory.entities.len();
        snap.values = vec![None; n * metrics];
        for e in 0..n {
            let up = !d.lost[e];
            let is_gpu = d.inventory.entities[e].mig.is_none();
            if up {
                entity_values(
                    d,
                    &self.plan,
                    e,
                    now,
                    &mut snap.values[e * metrics..(e + 1) * metrics],
                );
            }
            let shares = match (&mut self.attributor, d.holdings.as_deref()) {
                (Some(a), Some(h)) if up && d.processes_read[e] => match h.per_entity.get(e) {
                    Some(Holding::Shared(holders)) => {
                        let t = Instant::now();
                        let shares = split_entity(
                            a,
                            holders,
                            &d.share_labels[e],
                            &d.processes[e],
                            &self.splits,
                            &mut snap.values[e * metrics..(e + 1) * metrics],
                        );
                        self.attribution_time += t.elapsed();
                        shares
                    }
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            let processes = if self.opts.process_metrics {
                let t = Instant::now();
                let processes =
                    process_snapshots(self.attributor.as_mut(), &mut self.process_pods, d, e);
                self.attribution_time += t.elapsed();
                processes
            } else {
                Vec::new()
            };
            let exporter = (is_gpu && self.exporter.any()).then(|| {
                Box::new(exporter_values(
                    &self.exporter,
                    &mut d.windows[e],
                    &d.readings[e],
                    up,
                    now,
                ))
            });
            snap.entities.push(EntitySnapshot {
                labels: d.labels[e].clone(),
                copies: d.copies[e].clone(),
                is_gpu: d.inventory.entities[e].mig.is_none(),
                up,
                last_xid: d.last_xid[e],
                xids: d.xids[e].clone(),
                processes,
                shares,
                exporter,
            });
        }
        link_values(d, &self.plan, now, &mut snap);
        snap.allocations = d.allocation_labels.clone();
        snap.xid_window_ms = self.exporter.xid_window.as_millis() as u64;
        snap.clock_events_window_ms = self.exporter.clock_events_window.as_millis() as u64;
        if let Some(a) = self.attributor.as_mut() {
            a.end_cycle();
        }
        snap
    }
}

/// Entity `e`'s value of each plan metric into `out`, in dcgm's units.
fn entity_values(
    d: &mut Devices,
    plan: &ExportPlan,
    e: usize,
    now: Instant,
    out: &mut [Option<Value>],
) {
    let is_gpu = d.inventory.entities[e].mig.is_none();
    for (i, m) in plan.metrics.iter().enumerate() {
        out[i] = match m.kind {
            // The XID gauge belongs to physical GPUs, as in dcgm-exporter.
            // Rendered from the entity's own values (`exporter`).
            MetricKind::Exporter(_) => None,
            MetricKind::LastXid => {
                is_gpu.then(|| Value::Int(d.last_xid[e].map_or(0, |x| x as i64)))
            }
            MetricKind::Value {
                quantity, convert, ..
            } => d.readings[e]
                .iter()
                .find(|(q, _)| *q == quantity)
                .and_then(|&(_, raw)| {
                    let previous = match convert {
                        Convert::RatePerSec(_) => d.previous.insert((e, i), (raw.as_f64(), now)),
                        _ => None,
                    };
                    convert_value(raw, convert, previous, now)
                }),
        };
    }
}

/// The series of the NVLinks of the GPUs that are up.
fn link_values(d: &mut Devices, plan: &ExportPlan, now: Instant, snap: &mut Snapshot) {
    for (l, slot) in d.links.iter().enumerate() {
        if d.lost[slot.entity] {
            continue;
        }
        snap.links.push(LinkSnapshot {
            labels: slot.labels.clone(),
        });
        snap.link_values
            .extend(plan.metrics.iter().enumerate().map(|(i, m)| {
                let MetricKind::Value {
                    quantity,
                    convert,
                    scope: Scope::Link,
                } = m.kind
                else {
                    return None;
                };
                let &(_, raw) = d.link_readings[l].iter().find(|(q, _)| *q == quantity)?;
                let previous = match convert {
                    Convert::RatePerSec(_) => d.link_previous.insert((l, i), (raw.as_f64(), now)),
                    _ => None,
                };
                convert_value(raw, convert, previous, now)
            }));
    }
}

/// Convert a raw reading to dcgm's units. `previous` is the last raw value of this
/// series, for rates; a rate needs two readings and a counter that did not go back.
pub(super) fn convert_value(
    raw: Raw,
    c: Convert,
    previous: Option<(f64, Instant)>,
    now: Instant,
) -> Option<Value> {
    match c {
        Convert::Int => Some(Value::Int(match raw {
            Raw::U64(v) => i64::try_from(v).unwrap_or(i64::MAX),
            Raw::F64(v) => v.round() as i64,
        })),
        Convert::Float(div) => Some(Value::Float(raw.as_f64() / div)),
        Convert::IntDiv(div) => Some(Value::Int(match raw {
            Raw::U64(v) => i64::try_from(v / div).unwrap_or(i64::MAX),
            Raw::F64(v) => (v / div as f64) as i64,
        })),
        Convert::IntMul(mul) => Some(Value::Int((raw.as_f64() * mul).round() as i64)),
        Convert::RatePerSec(div) => {
            let (prev, at) = previous?;
            let dt = now.saturating_duration_since(at).as_secs_f64();
            let cur = raw.as_f64();
            (dt > 0.0 && cur >= prev).then(|| Value::Int(((cur - prev) / dt / div).round() as i64))
        }
    }
}
