//! `--field-periods` / `DCGM_EXPORTER_FIELD_PERIODS`: FIELD=DURATION items.
//! Invariants: no panic; text over the bound is refused; an accepted value gives every
//! field a period of at least one cycle at any interval, and the same value parses the
//! same again; an error message stays short (names and text are cut).
#![no_main]

use gpu_exporter::plan::catalog::Quantity;
use gpu_exporter::sampler::{Cadence, FieldPeriods};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|input: (u16, &str)| {
    let (interval_ms, text) = input;
    match FieldPeriods::parse(text) {
        Ok(p) => {
            assert!(text.len() <= gpu_exporter::sampler::cadence::MAX_TEXT);
            assert_eq!(FieldPeriods::parse(text), Ok(p.clone()));
            let interval = Duration::from_millis(u64::from(interval_ms.max(10)));
            let c = Cadence::new(&p, interval);
            assert!(c.device_set() >= 1);
            for q in [Quantity::GpuUtil, Quantity::TotalEnergy, Quantity::NvlinkDataKib] {
                assert!(c.of(q) >= 1);
            }
            assert_eq!(c.of(Quantity::NvlinkDataKib), 1, "a rate is read every cycle");
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.len() < 2048, "{} bytes of error", msg.len());
        }
    }
});
