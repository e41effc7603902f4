//! Label selectors (`podSelector`, the HPA's `labelSelector`), string syntax.
//! Invariants: the canonical text parses back to an equal selector and prints the
//! same; without `>`/`<`, the `metav1.LabelSelector` object form reads back to a
//! selector that matches the same label sets (tried on sets built from its own keys
//! and values).
#![no_main]

use kube_support::selector::{Operator, Selector};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

fuzz_target!(|text: &str| {
    let Ok(selector) = Selector::parse(text) else {
        return;
    };
    let canonical = selector.to_string();
    let again = Selector::parse(&canonical)
        .unwrap_or_else(|e| panic!("canonical {canonical:?} of {text:?} does not parse: {e}"));
    assert_eq!(again, selector, "canonical text {canonical:?}");
    assert_eq!(again.to_string(), canonical);

    let object = selector.to_label_selector();
    let ordered = selector
        .requirements()
        .iter()
        .any(|r| matches!(r.operator(), Operator::GreaterThan | Operator::LessThan));
    if ordered {
        return;
    }
    let from_object = Selector::from_label_selector(&object)
        .unwrap_or_else(|e| panic!("object {object} of {canonical:?} does not read back: {e}"));
    // Label sets: none; each requirement's key alone with each of its values, and empty;
    // and all keys at once with their first value.
    let mut sets: Vec<BTreeMap<String, String>> = vec![BTreeMap::new()];
    let mut all = BTreeMap::new();
    for r in selector.requirements() {
        for v in r.values().iter().map(String::as_str).chain(["", "0"]) {
            sets.push(BTreeMap::from([(r.key().to_owned(), v.to_owned())]));
        }
        if let Some(v) = r.values().first() {
            all.insert(r.key().to_owned(), v.clone());
        }
    }
    sets.push(all);
    for labels in &sets {
        assert_eq!(
            from_object.matches(labels),
            selector.matches(labels),
            "{canonical:?} and its object form {object} disagree on {labels:?}"
        );
    }
});
