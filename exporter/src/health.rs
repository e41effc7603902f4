//! `DCGM_EXP_GPU_HEALTH_STATUS` from NVML signals, and the trailing windows behind
//! `DCGM_EXP_XID_ERRORS_COUNT` and `DCGM_EXP_CLOCK_EVENTS_COUNT`.
//!
//! dcgm-exporter asks DCGM's health engine; NVML has none, so the status here is derived
//! from what NVML reports (XIDs, ECC, row remapping, page retirement, PCIe replays,
//! NVLink error counters, clock-event reasons, the recovery action). Values and names
//! are DCGM's: result 0 PASS, 10 WARN, 20 FAIL; `health_watch` and
//! `health_error_code` (`DCGM_FR_*`) as dcgm-exporter prints them. Only the watches
//! NVML can speak for are exported; PMU, MCU, SM, INFOROM and DRIVER are not.

use crate::plan::catalog::Quantity;
use crate::source::Raw;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// DCGM's `dcgmHealthWatchResults_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HealthResult {
    Pass = 0,
    Warn = 10,
    Fail = 20,
}

/// The health watches exported, in dcgm-exporter's order.
pub const WATCHES: [&str; 6] = ["PCIE", "NVLINK", "MEM", "THERMAL", "POWER", "ALL"];
const PCIE: usize = 0;
const NVLINK: usize = 1;
const MEM: usize = 2;
const THERMAL: usize = 3;
const POWER: usize = 4;
const ALL: usize = 5;

/// One watch's verdict: the result and the `DCGM_FR_*` code that explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub result: HealthResult,
    pub code: &'static str,
}

const OK: Verdict = Verdict {
    result: HealthResult::Pass,
    code: "DCGM_FR_OK",
};

/// A GPU's verdict per watch of [`WATCHES`].
pub type Health = [Verdict; WATCHES.len()];

/// PCIe replays per minute above which DCGM warns (`DCGM_FR_PCI_REPLAY_RATE`).
pub const PCIE_REPLAYS_PER_MINUTE: u64 = 8;

/// How far back counter increases count for the PCIe and NVLink watches.
pub const COUNTER_WINDOW: Duration = Duration::from_secs(60);

/// Clock-event reason bits (`nvmlClocksEventReason*`, the same as DCGM's).
pub mod reasons {
    pub const SW_THERMAL: u64 = 0x20;
    pub const HW_THERMAL: u64 = 0x40;
    pub const HW_POWER_BRAKE: u64 = 0x80;
}

/// dcgm-exporter's `clock_event` label values, by bit (DCGM's throttle-reason table).
pub const CLOCK_EVENTS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "clocks_setting"),
    (0x4, "power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
];

/// What one GPU showed, for [`evaluate`].
#[derive(Debug, Default, Clone)]
pub struct Signals<'a> {
    /// This cycle's readings of the GPU.
    pub readings: &'a [(Quantity, Raw)],
    /// XID codes in the XID window.
    pub xids: Vec<u64>,
    /// Increase of the PCIe replay counter over [`COUNTER_WINDOW`], when known.
    pub pcie_replays: Option<u64>,
    /// Increase of the NVLink CRC flit, CRC data, replay and recovery counters over
    /// [`COUNTER_WINDOW`], when known.
    pub nvlink_errors: Option<[u64; 4]>,
    /// Fallen off the bus.
    pub lost: bool,
}

fn reading(readings: &[(Quantity, Raw)], q: Quantity) -> Option<u64> {
    readings
        .iter()
        .find(|(x, _)| *x == q)
        .map(|(_, r)| r.as_f64() as u64)
}

/// The health of one GPU. Each watch keeps its worst finding (the first of equals).
pub fn evaluate(s: &Signals<'_>) -> Health {
    let mut h: Health = [OK; WATCHES.len()];
    let mut flag = |watch: usize, result: HealthResult, code: &'static str| {
        if result > h[watch].result {
            h[watch] = Verdict { result, code };
        }
    };
    use HealthResult::{Fail, Warn};
    if s.lost {
        flag(ALL, Fail, "DCGM_FR_FALLEN_OFF_BUS");
        return h;
    }
    let r = |q| reading(s.readings, q);
    // GPU-wide XIDs that DCGM reports under ALL, and the subsystem ones.
    for &xid in &s.xids {
        match xid {
            79 => flag(ALL, Fail, "DCGM_FR_FALLEN_OFF_BUS"),
            95 => flag(ALL, Fail, "DCGM_FR_UNCONTAINED_ERROR"),
            48 => flag(MEM, Fail, "DCGM_FR_VOLATILE_DBE_DETECTED"),
            74 => flag(NVLINK, Fail, "DCGM_FR_NVLINK_ERROR_CRITICAL"),
            _ => {}
        }
    }
    match r(Quantity::RecoveryAction) {
        Some(1 | 6) => flag(ALL, Fail, "DCGM_FR_GPU_RECOVERY_RESET"),
        Some(2 | 7) => flag(ALL, Fail, "DCGM_FR_GPU_RECOVERY_REBOOT"),
        Some(3) => flag(ALL, Fail, "DCGM_FR_GPU_RECOVERY_DRAIN_P2P"),
        Some(4) => flag(ALL, Fail, "DCGM_FR_GPU_RECOVERY_DRAIN_RESET"),
        Some(5) => flag(ALL, Fail, "DCGM_FR_IMEX_UNHEALTHY"),
        _ => {}
    }
    if r(Quantity::EccDbeVolatile).is_some_and(|n| n > 0) {
        flag(MEM, Fail, "DCGM_FR_VOLATILE_DBE_DETECTED");
    }
    if r(Quantity::RemapFailure) == Some(1) {
        flag(MEM, Fail, "DCGM_FR_ROW_REMAP_FAILURE");
    }
    if r(Quantity::RemapPending) == Some(1) {
        flag(MEM, Warn, "DCGM_FR_PENDING_ROW_REMAP");
    }
    if r(Quantity::RetiredPending) == Some(1) {
        flag(MEM, Warn, "DCGM_FR_PENDING_PAGE_RETIREMENTS");
    }
    if s.pcie_replays.is_some_and(|n| n > PCIE_REPLAYS_PER_MINUTE) {
        flag(PCIE, Warn, "DCGM_FR_PCI_REPLAY_RATE");
    }
    if let Some([flit, data, replay, recovery]) = s.nvlink_errors {
        if recovery > 0 {
            flag(NVLINK, Fail, "DCGM_FR_NVLINK_ERROR_CRITICAL");
        }
        if flit + data + replay > 0 {
            flag(NVLINK, Warn, "DCGM_FR_NVLINK_ERROR_THRESHOLD");
        }
    }
    let events = r(Quantity::ClockEventReasons).unwrap_or(0);
    if events & (reasons::SW_THERMAL | reasons::HW_THERMAL) != 0 {
        flag(THERMAL, Warn, "DCGM_FR_CLOCK_THROTTLE_THERMAL");
    }
    if events & reasons::HW_POWER_BRAKE != 0 {
        flag(POWER, Warn, "DCGM_FR_CLOCK_THROTTLE_POWER");
    }
    h
}

/// The quantities [`evaluate`] reads (besides XIDs).
pub const HEALTH_QUANTITIES: [Quantity; 11] = [
    Quantity::RecoveryAction,
    Quantity::EccDbeVolatile,
    Quantity::RemapFailure,
    Quantity::RemapPending,
    Quantity::RetiredPending,
    Quantity::PcieReplayCounter,
    Quantity::NvlinkCrcFlitErrors,
    Quantity::NvlinkCrcDataErrors,
    Quantity::NvlinkReplayErrors,
    Quantity::NvlinkRecoveryErrors,
    Quantity::ClockEventReasons,
];

/// Most entries one window keeps per GPU; beyond it the oldest go first. At the default
/// five minutes it is never reached (an XID storm of 30 a second would).
pub const WINDOW_CAP: usize = 10_000;

/// Timestamped entries of a trailing window.
#[derive(Debug, Clone)]
pub struct Window<T> {
    span: Duration,
    entries: VecDeque<(Instant, T)>,
}

impl<T: Copy> Window<T> {
    pub fn new(span: Duration) -> Window<T> {
        Window {
            span,
            entries: VecDeque::new(),
        }
    }

    pub fn push(&mut self, at: Instant, v: T) {
        if self.entries.len() == WINDOW_CAP {
            self.entries.pop_front();
        }
        self.entries.push_back((at, v));
    }

    /// Drop what fell out of the window ending at `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.entries.front() {
            if now.saturating_duration_since(*at) > self.span {
                self.entries.pop_front();
            } else {
                break;
            }
        }
    }

    pub fn values(&self) -> impl Iterator<Item = T> + '_ {
        self.entries.iter().map(|(_, v)| *v)
    }
}

/// A cumulative counter's readings over [`COUNTER_WINDOW`], keeping one reading from
/// before the window as the base of the increase.
#[derive(Debug, Clone, Default)]
pub struct CounterHistory<const N: usize> {
    entries: VecDeque<(Instant, [u64; N])>,
}

impl<const N: usize> CounterHistory<N> {
    /// Record `now`'s readings and return the increase over the window (per counter;
    /// a counter that went back, as on a driver reload, counts from its new value).
    pub fn record(&mut self, now: Instant, v: [u64; N]) -> [u64; N] {
        self.entries.push_back((now, v));
        while self.entries.len() > 2
            && self
                .entries
                .get(1)
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= COUNTER_WINDOW)
        {
            self.entries.pop_front();
        }
        let mut up = [0; N];
        let mut prev: Option<&[u64; N]> = None;
        for (_, cur) in &self.entries {
            if let Some(p) = prev {
                for i in 0..N {
                    up[i] += cur[i].checked_sub(p[i]).unwrap_or(cur[i]);
                }
            }
            prev = Some(cur);
        }
        up
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(h: &Health, name: &str) -> Verdict {
        h[WATCHES.iter().position(|w| *w == name).unwrap()]
    }

    #[test]
    fn a_quiet_gpu_passes_every_watch() {
        let readings = [
            (Quantity::EccDbeVolatile, Raw::U64(0)),
            (Quantity::RemapPending, Raw::U64(0)),
            (Quantity::ClockEventReasons, Raw::U64(0x1 | 0x4)),
            (Quantity::RecoveryAction, Raw::U64(0)),
        ];
        let h = evaluate(&Signals {
            readings: &readings,
            xids: vec![13],
            pcie_replays: Some(8),
            nvlink_errors: Some([0; 4]),
            lost: false,
        });
        assert!(h.iter().all(|v| *v == OK), "{h:?}");
    }

    #[test]
    fn each_signal_flags_its_watch_and_the_worst_wins() {
        let readings = [
            (Quantity::RemapPending, Raw::U64(1)),
            (Quantity::EccDbeVolatile, Raw::U64(2)),
            (Quantity::ClockEventReasons, Raw::U64(reasons::HW_THERMAL)),
            (Quantity::RecoveryAction, Raw::U64(2)),
        ];
        let h = evaluate(&Signals {
            readings: &readings,
            xids: vec![],
            pcie_replays: Some(9),
            nvlink_errors: Some([1, 0, 0, 0]),
            lost: false,
        });
        // FAIL (DBE) outranks the WARN of the pending remap, listed first.
        assert_eq!(watch(&h, "MEM").code, "DCGM_FR_VOLATILE_DBE_DETECTED");
        assert_eq!(watch(&h, "MEM").result, HealthResult::Fail);
        assert_eq!(watch(&h, "ALL").code, "DCGM_FR_GPU_RECOVERY_REBOOT");
        assert_eq!(watch(&h, "PCIE").result, HealthResult::Warn);
        assert_eq!(watch(&h, "NVLINK").code, "DCGM_FR_NVLINK_ERROR_THRESHOLD");
        assert_eq!(watch(&h, "THERMAL").code, "DCGM_FR_CLOCK_THROTTLE_THERMAL");
        assert_eq!(watch(&h, "POWER"), OK);
    }

    #[test]
    fn a_pending_remap_alone_warns_and_a_lost_gpu_fails_all() {
        let readings = [(Quantity::RemapPending, Raw::U64(1))];
        let h = evaluate(&Signals {
            readings: &readings,
            ..Default::default()
        });
        assert_eq!(
            watch(&h, "MEM"),
            Verdict {
                result: HealthResult::Warn,
                code: "DCGM_FR_PENDING_ROW_REMAP"
            }
        );
        let h = evaluate(&Signals {
            lost: true,
            ..Default::default()
        });
        assert_eq!(watch(&h, "ALL").code, "DCGM_FR_FALLEN_OFF_BUS");
        assert_eq!(watch(&h, "ALL").result, HealthResult::Fail);
        let h = evaluate(&Signals {
            xids: vec![95],
            ..Default::default()
        });
        assert_eq!(watch(&h, "ALL").code, "DCGM_FR_UNCONTAINED_ERROR");
    }

    #[test]
    fn windows_expire_old_entries_and_stay_bounded() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(10));
        w.push(t0, 1u64);
        w.push(t0 + Duration::from_secs(5), 2);
        w.expire(t0 + Duration::from_secs(12));
        assert_eq!(w.values().collect::<Vec<_>>(), vec![2]);
        for i in 0..WINDOW_CAP + 5 {
            w.push(t0 + Duration::from_secs(6), i as u64);
        }
        assert_eq!(w.values().count(), WINDOW_CAP);
        assert_eq!(w.values().next(), Some(5));
    }

    #[test]
    fn counter_history_sums_increases_over_the_last_minute() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut c = CounterHistory::<1>::default();
        assert_eq!(c.record(s(0), [100]), [0]);
        assert_eq!(c.record(s(30), [104]), [4]);
        assert_eq!(c.record(s(60), [110]), [10]);
        // The reading at 0 s is now more than a window before the one at 30 s's
        // successor: the increase counts from 30 s.
        assert_eq!(c.record(s(95), [111]), [7]);
        // A reset counter counts from its new value.
        assert_eq!(c.record(s(100), [3]), [6 + 1 + 3]);
    }
}
