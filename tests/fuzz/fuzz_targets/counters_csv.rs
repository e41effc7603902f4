//! The counters CSV (`-f`): dcgm-exporter's format, read with Go's CSV rules.
//! Invariant: every line number in a warning or error is a line of the text.
#![no_main]

use gpu_exporter::error::Error;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let lines = text.split('\n').count() as u64;
    match gpu_exporter::plan::counters::plan(text, "fuzz.csv") {
        Ok((plan, warnings)) => {
            for w in &warnings {
                assert!(
                    (1..=lines).contains(&w.line),
                    "warning on line {} of {lines}",
                    w.line
                );
            }
            let _ = plan.quantities();
        }
        Err(Error::Counters { line, .. } | Error::CountersUnknownField { line, .. }) => {
            assert!(
                (1..=lines).contains(&line),
                "error on line {line} of {lines}"
            );
        }
        // A file with no metric at all, and the like: not about a line.
        Err(_) => {}
    }
});
