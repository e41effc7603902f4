//! The exporter's `/metrics` query string as a long poll reads it (`newer_than`,
//! `wait`; issue 27: `wait=1e308s` panicked the handler).
//! Invariants: never panics; a long poll is held at most the cap; an unreadable `wait`
//! is the only refusal; a query without a non-empty `newer_than` is never held.
#![no_main]

use gpu_exporter::serving::http::read_hold_query;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|query: &str| {
    let cap = Duration::from_secs(2);
    let has_token = query
        .split('&')
        .any(|pair| pair.strip_prefix("newer_than=").is_some_and(|t| !t.is_empty()));
    match read_hold_query(query, cap) {
        Ok(Some(wait)) => {
            assert!(wait <= cap, "{query:?} held {wait:?}");
            assert!(has_token, "{query:?} held without a token");
        }
        Ok(None) => assert!(!has_token, "{query:?} not held"),
        Err(e) => {
            assert!(
                query.split('&').any(|pair| pair.starts_with("wait=")),
                "{query:?} refused without a wait: {e}"
            );
            // The message names the value, bounded.
            assert!(e.to_string().len() < 512);
        }
    }
});
