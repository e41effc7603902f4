//! How often each field is read: every field has a read period (a default per field,
//! `--field-periods` / `DCGM_EXPORTER_FIELD_PERIODS` to override), turned into a whole
//! number of collect intervals. A field not due in a cycle serves the value it read
//! last, which is never older than its period; docs/exporter/cadence.md has the table.

use crate::health;
use crate::plan::catalog::{self, FieldSource, Quantity};
use kube_support::duration;
use std::time::Duration;

/// The longest `--field-periods` value accepted, in bytes.
pub const MAX_TEXT: usize = 16 * 1024;
/// The most `FIELD=DURATION` items in it.
pub const MAX_ITEMS: usize = 256;
/// The longest period: an hour, as every interval flag.
pub const MAX_PERIOD: Duration = Duration::from_secs(3600);
/// The name of the device-set and MIG-layout check in `--field-periods`.
pub const DEVICE_SET: &str = "device-set";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FieldPeriodError {
    #[error("--field-periods is {0} bytes long; at most {MAX_TEXT} are accepted")]
    TooLong(usize),
    #[error("--field-periods has more than {MAX_ITEMS} items")]
    TooMany,
    #[error("--field-periods item {item} ({text:?}) is not FIELD=DURATION")]
    Syntax { item: usize, text: String },
    #[error("--field-periods item {item}: {name:?} is not a field this exporter reads{}", suggest(.suggestions))]
    UnknownField {
        item: usize,
        name: String,
        suggestions: Vec<&'static str>,
    },
    #[error(
        "--field-periods item {item}: {name} is not read from the GPU (a label or an exporter-side value); it has no period"
    )]
    NotRead { item: usize, name: String },
    #[error(
        "--field-periods item {item}: {name} is served as a per-second rate of two consecutive readings, so it is read every cycle"
    )]
    Rate { item: usize, name: String },
    #[error("--field-periods item {item}: {name}: {source}")]
    Duration {
        item: usize,
        name: String,
        source: duration::DurationError,
    },
    #[error("--field-periods item {item}: {name}: {text:?} is longer than {}s", MAX_PERIOD.as_secs())]
    TooLongPeriod {
        item: usize,
        name: String,
        text: String,
    },
    #[error("--field-periods item {item}: {name} is given twice")]
    Duplicate { item: usize, name: String },
}

fn suggest(names: &[&str]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", names.join(", "))
    }
}

/// What a period applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// `*`: every field and the device-set check.
    All,
    Field(Quantity),
    DeviceSet,
}

/// The overrides of `--field-periods`, in the order given (a later `*` does not undo an
/// earlier field's: named items win over `*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldPeriods {
    items: Vec<(Target, Duration)>,
}

/// Fields served as a per-second rate of two consecutive readings: read every cycle.
fn is_rate(q: Quantity) -> bool {
    catalog::FIELDS.iter().any(|f| {
        matches!(f.source, FieldSource::Value { quantity, convert: catalog::Convert::RatePerSec(_), .. } if quantity == q)
    })
}

impl FieldPeriods {
    /// Parse `FIELD=DURATION[,FIELD=DURATION…]`: FIELD a DCGM field name (or a legacy
    /// alias), `device-set`, or `*`; DURATION Go's syntax (`10s`, `1m30s`, `0`) or
    /// whole milliseconds, at most an hour. Empty: no override.
    pub fn parse(text: &str) -> Result<FieldPeriods, FieldPeriodError> {
        if text.len() > MAX_TEXT {
            return Err(FieldPeriodError::TooLong(text.len()));
        }
        if text.split(',').filter(|i| !i.trim().is_empty()).count() > MAX_ITEMS {
            return Err(FieldPeriodError::TooMany);
        }
        let mut items = Vec::new();
        for (i, raw) in text.split(',').enumerate() {
            let item = i + 1;
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let (name, period) = raw
                .split_once('=')
                .map(|(n, p)| (n.trim(), p.trim()))
                .filter(|(n, p)| !n.is_empty() && !p.is_empty())
                .ok_or_else(|| FieldPeriodError::Syntax {
                    item,
                    text: raw.chars().take(80).collect(),
                })?;
            let target = match name {
                "*" => Target::All,
                DEVICE_SET => Target::DeviceSet,
                _ => match catalog::resolve(name).map(|(_, def)| def.source) {
                    Some(FieldSource::Value { quantity, .. }) if is_rate(quantity) => {
                        return Err(FieldPeriodError::Rate {
                            item,
                            name: name.into(),
                        });
                    }
                    Some(FieldSource::Value { quantity, .. }) => Target::Field(quantity),
                    Some(_) => {
                        return Err(FieldPeriodError::NotRead {
                            item,
                            name: name.into(),
                        });
                    }
                    None if catalog::is_known_dcgm_name(name) => {
                        return Err(FieldPeriodError::NotRead {
                            item,
                            name: name.into(),
                        });
                    }
                    None => {
                        return Err(FieldPeriodError::UnknownField {
                            item,
                            name: name.chars().take(128).collect(),
                            suggestions: catalog::closest_names(name),
                        });
                    }
                },
            };
            let d = if !period.is_empty() && period.bytes().all(|b| b.is_ascii_digit()) {
                period
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .unwrap_or(Duration::MAX)
            } else {
                duration::parse(period).map_err(|source| FieldPeriodError::Duration {
                    item,
                    name: name.into(),
                    source,
                })?
            };
            if d > MAX_PERIOD {
                return Err(FieldPeriodError::TooLongPeriod {
                    item,
                    name: name.into(),
                    text: period.chars().take(40).collect(),
                });
            }
            if items.iter().any(|(t, _)| *t == target) {
                return Err(FieldPeriodError::Duplicate {
                    item,
                    name: name.into(),
                });
            }
            items.push((target, d));
        }
        Ok(FieldPeriods { items })
    }

    fn get(&self, target: Target) -> Option<Duration> {
        let of = |t: Target| self.items.iter().find(|(x, _)| *x == t).map(|(_, d)| *d);
        of(target).or_else(|| of(Target::All))
    }
}

/// The default read period of a quantity; docs/exporter/cadence.md gives the reasons.
/// `Duration::ZERO`: every cycle.
pub fn default_period(q: Quantity) -> Duration {
    use Quantity::*;
    const EVERY: Duration = Duration::ZERO;
    const S10: Duration = Duration::from_secs(10);
    const S30: Duration = Duration::from_secs(30);
    const S60: Duration = Duration::from_secs(60);
    match q {
        // What autoscaling, dashboards and alerts follow: every cycle.
        GpuUtil | MemCopyUtil | EncoderUtil | DecoderUtil | FbFree | FbUsed | FbReserved
        | FbTotal | PowerUsage | PowerLimit | GpuTemp | MemoryTemp | SmClock | MemClock
        | PcieTxThroughput | PcieRxThroughput | ClockEventReasons | Pstate | FanSpeed
        | NvlinkDataKib | LinkState | LinkTxKib | LinkRxKib | LinkDataKib | GpmGraphicsUtil
        | GpmSmUtil | GpmSmOccupancy | GpmTensorUtil | GpmDramUtil | GpmFp64Util | GpmFp32Util
        | GpmFp16Util | GpmPcieTx | GpmPcieRx => EVERY,
        // Cumulative counters read through rate()/increase() over minutes.
        TotalEnergy | PcieReplayCounter | PowerViolation | ThermalViolation
        | SyncBoostViolation | BoardLimitViolation | LowUtilViolation | ReliabilityViolation
        | NvlinkCrcFlitErrors | NvlinkCrcDataErrors | NvlinkReplayErrors | NvlinkRecoveryErrors
        | LinkCrcFlitErrors | LinkCrcDataErrors | LinkReplayErrors | LinkRecoveryErrors => S10,
        // Error counts and states that change rarely; their events (XIDs) are immediate.
        EccSbeVolatile
        | EccDbeVolatile
        | EccSbeAggregate
        | EccDbeAggregate
        | RetiredSbe
        | RetiredDbe
        | RetiredPending
        | RemappedCorrectable
        | RemappedUncorrectable
        | RemapFailure
        | RemapPending
        | EccModeCurrent
        | EccModePending
        | RecoveryAction
        | FabricManagerStatus
        | FabricManagerError
        | FabricCliqueId
        | FabricHealthMask
        | FabricHealthSummary => S30,
        // Board constants and licences.
        SlowdownTemp | ShutdownTemp | GpuMaxOpTemp | MemMaxOpTemp | VgpuLicensed => S60,
    }
}

/// The default period of the device-set and MIG-layout check.
pub const DEVICE_SET_DEFAULT: Duration = Duration::from_secs(10);

/// Read periods in cycles.
#[derive(Debug, Clone, PartialEq)]
pub struct Cadence {
    cycles: [u32; Quantity::COUNT],
    device_set: u32,
}

/// A period as a whole number of intervals, at least one: the most cycles whose
/// readings are together no older than the period.
fn cycles(period: Duration, interval: Duration) -> u32 {
    if interval.is_zero() {
        return 1;
    }
    let n = period.as_nanos() / interval.as_nanos();
    u32::try_from(n).unwrap_or(u32::MAX).max(1)
}

impl Cadence {
    /// Every field and the device set every cycle.
    pub fn every_cycle() -> Cadence {
        Cadence {
            cycles: [1; Quantity::COUNT],
            device_set: 1,
        }
    }

    /// The defaults with `overrides`, at collect interval `interval`.
    pub fn new(overrides: &FieldPeriods, interval: Duration) -> Cadence {
        let mut c = Cadence::every_cycle();
        // Every quantity a plan can ask (`plan::plan_tables`): the fields' and what the
        // collectors read besides.
        let planned = catalog::FIELDS
            .iter()
            .filter_map(|f| match f.source {
                FieldSource::Value { quantity, .. } => Some(quantity),
                _ => None,
            })
            .chain(health::HEALTH_QUANTITIES)
            .chain([Quantity::ClockEventReasons]);
        for q in planned {
            if is_rate(q) {
                continue;
            }
            let period = overrides
                .get(Target::Field(q))
                .unwrap_or_else(|| default_period(q));
            c.cycles[q as usize] = cycles(period, interval);
        }
        let device_set = overrides
            .get(Target::DeviceSet)
            .unwrap_or(DEVICE_SET_DEFAULT);
        c.device_set = cycles(device_set, interval);
        c
    }

    /// The read period of `q`, in cycles (at least 1).
    pub fn of(&self, q: Quantity) -> u32 {
        self.cycles[q as usize]
    }

    /// The period of the device-set check, in cycles.
    pub fn device_set(&self) -> u32 {
        self.device_set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn defaults_read_the_fast_fields_every_cycle_and_energy_every_ten_seconds() {
        let c = Cadence::new(&FieldPeriods::default(), S);
        assert_eq!(c.of(Quantity::GpuUtil), 1);
        assert_eq!(c.of(Quantity::PowerUsage), 1);
        assert_eq!(c.of(Quantity::FbUsed), 1);
        assert_eq!(c.of(Quantity::GpmGraphicsUtil), 1);
        assert_eq!(c.of(Quantity::TotalEnergy), 10);
        assert_eq!(c.of(Quantity::EccDbeVolatile), 30);
        assert_eq!(c.device_set(), 10);
        // At dcgm-exporter's own default interval (30 s) every field is read each cycle
        // but the board constants.
        let slow = Cadence::new(&FieldPeriods::default(), 30 * S);
        assert_eq!(slow.of(Quantity::TotalEnergy), 1);
        assert_eq!(slow.of(Quantity::EccDbeVolatile), 1);
        assert_eq!(slow.of(Quantity::ShutdownTemp), 2);
    }

    #[test]
    fn overrides_by_dcgm_name_star_and_device_set() {
        let p = FieldPeriods::parse(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=2s, *=0, device-set=1m,dcgm_sm_clock=5s",
        )
        .unwrap();
        let c = Cadence::new(&p, S);
        assert_eq!(c.of(Quantity::TotalEnergy), 2);
        assert_eq!(c.of(Quantity::EccDbeVolatile), 1);
        assert_eq!(c.of(Quantity::SmClock), 5);
        assert_eq!(c.device_set(), 60);
        // Bare milliseconds, as -c.
        let p = FieldPeriods::parse("DCGM_FI_DEV_PCIE_REPLAY_COUNTER=2500").unwrap();
        assert_eq!(Cadence::new(&p, S).of(Quantity::PcieReplayCounter), 2);
    }

    #[test]
    fn every_period_at_one_cycle_is_every_cycle() {
        let p = FieldPeriods::parse("*=0").unwrap();
        assert_eq!(Cadence::new(&p, S), Cadence::every_cycle());
    }

    #[test]
    fn rates_are_read_every_cycle() {
        let p = FieldPeriods::parse("*=1m").unwrap();
        assert_eq!(Cadence::new(&p, S).of(Quantity::NvlinkDataKib), 1);
        let e = FieldPeriods::parse("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL=10s").unwrap_err();
        assert!(matches!(e, FieldPeriodError::Rate { item: 1, .. }), "{e}");
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let e = FieldPeriods::parse("DCGM_FI_DEV_GPU_UTIL=1s,DCGM_FI_DEV_TOTAL_ENERGY=10s")
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(
                "--field-periods item 2: \"DCGM_FI_DEV_TOTAL_ENERGY\" is not a field this exporter reads (did you mean "
            ) && text.contains("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
            "{e}"
        );
        assert!(matches!(
            FieldPeriods::parse("DCGM_FI_DEV_GPU_UTIL").unwrap_err(),
            FieldPeriodError::Syntax { item: 1, .. }
        ));
        assert!(matches!(
            FieldPeriods::parse("DCGM_FI_DEV_GPU_UTIL=ten").unwrap_err(),
            FieldPeriodError::Duration { item: 1, .. }
        ));
        assert!(matches!(
            FieldPeriods::parse("DCGM_FI_DEV_GPU_UTIL=2h").unwrap_err(),
            FieldPeriodError::TooLongPeriod { item: 1, .. }
        ));
        assert!(matches!(
            FieldPeriods::parse("DCGM_FI_DRIVER_VERSION=1s").unwrap_err(),
            FieldPeriodError::NotRead { item: 1, .. }
        ));
        assert!(matches!(
            FieldPeriods::parse("*=1s,*=2s").unwrap_err(),
            FieldPeriodError::Duplicate { item: 2, .. }
        ));
        assert!(matches!(
            FieldPeriods::parse(&"x".repeat(MAX_TEXT + 1)).unwrap_err(),
            FieldPeriodError::TooLong(_)
        ));
        let many = vec!["*=1s"; MAX_ITEMS + 1].join(",");
        assert_eq!(
            FieldPeriods::parse(&many).unwrap_err(),
            FieldPeriodError::TooMany
        );
        assert_eq!(FieldPeriods::parse("").unwrap(), FieldPeriods::default());
    }
}
