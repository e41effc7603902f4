//! Durations in Go's `time.ParseDuration` syntax (every interval flag, web config's
//! `rate_limit.interval`).
//! Invariants: a parsed duration written back in nanoseconds, and as seconds with a
//! nine-digit fraction, parses to the same value; `parse_flag` agrees with `parse`
//! within the flag range.
#![no_main]

use kube_support::duration::{FLAG_RANGE, parse, parse_flag};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let parsed = parse(text);
    if let Ok(d) = parsed {
        let nanos = format!("{}ns", d.as_nanos());
        assert_eq!(parse(&nanos), Ok(d), "{text:?} → {nanos:?}");
        let seconds = format!("{}.{:09}s", d.as_secs(), d.subsec_nanos());
        assert_eq!(parse(&seconds), Ok(d), "{text:?} → {seconds:?}");
    }
    match parse_flag(text) {
        Ok(d) => {
            assert!(FLAG_RANGE.contains(&d));
            let t = text.trim();
            let whole_millis = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
            if !whole_millis {
                assert_eq!(parse(t), Ok(d), "{text:?}");
            }
        }
        Err(_) => {
            if let Ok(d) = parsed {
                assert!(
                    !FLAG_RANGE.contains(&d) || text.trim() != text,
                    "{text:?} = {d:?} refused"
                );
            }
        }
    }
});
