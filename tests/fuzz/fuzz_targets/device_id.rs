//! Kubelet device IDs (every device plugin's forms, GKE's, MIG, sharing replicas).
//! Invariant: the canonical form (`Display`) parses back to the same ID and prints the
//! same; a UUID form compares equal whatever the case of its hex digits.
#![no_main]

use gpu_exporter::attribution::device_id::DeviceId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(id) = text.parse::<DeviceId>() else {
        return;
    };
    let canonical = id.to_string();
    let again = canonical
        .parse::<DeviceId>()
        .unwrap_or_else(|e| panic!("canonical {canonical:?} of {text:?} does not parse: {e}"));
    assert_eq!(again, id, "{text:?} → {canonical:?}");
    assert_eq!(again.to_string(), canonical);
    // Upper-casing the hex digits (not the prefixes) names the same device.
    let upper: String = canonical
        .char_indices()
        .map(|(i, c)| {
            if i >= 4 && c.is_ascii_hexdigit() && !canonical.starts_with("nvidia") {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect();
    if let Ok(other) = upper.parse::<DeviceId>() {
        assert_eq!(other, id, "{canonical:?} vs {upper:?}");
    }
});
