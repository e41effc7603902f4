//! What a counters plan asks of the source, and which metrics split per pod.

use crate::health::{self};
use crate::plan::catalog::{ExporterField, Quantity, Scope};
use crate::plan::counters::{ExportPlan, MetricKind};
use std::time::Duration;

/// Which metrics are split per pod on a shared device, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Split {
    /// In proportion to the pods' processes' SM utilisation.
    BySmShare,
    /// Each pod's processes' own memory, MiB.
    ByMemory,
}

/// The default of dcgm-exporter's `-x` and `--clock-events-count-window-size`.
pub const DEFAULT_COUNT_WINDOW: Duration = Duration::from_secs(300);

/// Which `DCGM_EXP_*` collectors the plan has, and their windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExporterCollectors {
    pub xid_count: bool,
    pub clock_events_count: bool,
    pub health: bool,
    pub xid_window: Duration,
    pub clock_events_window: Duration,
}

impl ExporterCollectors {
    pub(super) fn any(&self) -> bool {
        self.xid_count || self.clock_events_count || self.health
    }
}

/// What a plan asks of the source: the distinct quantities with their scope and the
/// metrics each feeds, and the metrics split per pod on shared devices.
#[allow(clippy::type_complexity)]
pub(super) fn plan_tables(
    plan: &ExportPlan,
) -> (
    Vec<(Quantity, Scope, Vec<usize>)>,
    Vec<(usize, Split)>,
    ExporterCollectors,
) {
    let mut quantities: Vec<(Quantity, Scope, Vec<usize>)> = Vec::new();
    for (i, m) in plan.metrics.iter().enumerate() {
        if let MetricKind::Value {
            quantity, scope, ..
        } = m.kind
        {
            match quantities.iter_mut().find(|(q, _, _)| *q == quantity) {
                Some((_, _, idx)) => idx.push(i),
                None => quantities.push((quantity, scope, vec![i])),
            }
        }
    }
    let has = |x: ExporterField| {
        plan.metrics
            .iter()
            .any(|m| m.kind == MetricKind::Exporter(x))
    };
    let exporter = ExporterCollectors {
        xid_count: has(ExporterField::XidWindowCount),
        clock_events_count: has(ExporterField::ClockEventWindowCount),
        health: has(ExporterField::HealthStatus),
        xid_window: DEFAULT_COUNT_WINDOW,
        clock_events_window: DEFAULT_COUNT_WINDOW,
    };
    // What the collectors read besides the plan's own fields: read every cycle,
    // exported only through them.
    let mut extra: Vec<Quantity> = Vec::new();
    if exporter.clock_events_count {
        extra.push(Quantity::ClockEventReasons);
    }
    if exporter.health {
        extra.extend(health::HEALTH_QUANTITIES);
    }
    for q in extra {
        if !quantities.iter().any(|(x, _, _)| *x == q) {
            quantities.push((q, Scope::Device, Vec::new()));
        }
    }
    let splits = plan
        .metrics
        .iter()
        .enumerate()
        .filter_map(|(i, m)| match m.kind {
            MetricKind::Value {
                quantity: Quantity::GpuUtil,
                ..
            } => Some((i, Split::BySmShare)),
            MetricKind::Value {
                quantity: Quantity::FbUsed,
                ..
            } => Some((i, Split::ByMemory)),
            _ => None,
        })
        .collect();
    (quantities, splits, exporter)
}
