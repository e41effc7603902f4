//! Short descriptions of the XID codes operators meet most, for the `err_msg` label
//! dcgm-exporter puts on `DCGM_FI_DEV_XID_ERRORS`. Anything else is `unknown`.

/// (XID, description), sorted by XID.
const XID_MESSAGES: &[(u64, &str)] = &[
    (8, "GPU stopped processing"),
    (13, "Graphics Engine Exception"),
    (31, "GPU memory page fault"),
    (32, "Invalid or corrupted push buffer stream"),
    (38, "Driver firmware error"),
    (43, "GPU stopped processing"),
    (45, "Preemptive cleanup, due to previous errors"),
    (48, "Double Bit ECC Error"),
    (56, "Display Engine error"),
    (57, "Error programming video memory interface"),
    (61, "Internal micro-controller breakpoint/warning"),
    (62, "Internal micro-controller halt"),
    (63, "ECC page retirement or row remapping recording event"),
    (64, "ECC page retirement or row remapper recording failure"),
    (68, "NVDEC0 Exception"),
    (69, "Graphics Engine class error"),
    (74, "NVLINK Error"),
    (79, "GPU has fallen off the bus"),
    (92, "High single-bit ECC error rate"),
    (94, "Contained ECC error"),
    (95, "Uncontained ECC error"),
    (109, "Context Switch Timeout Error"),
    (119, "GSP RPC Timeout"),
    (120, "GSP Error"),
    (121, "C2C Link corrected error"),
    (123, "SPI PMU RPC write fail"),
    (140, "Unrecovered ECC Error"),
    (143, "GPU Initialization Failure"),
    (149, "NVLink fatal error"),
    (154, "GPU recovery action changed"),
];

/// The description of an XID code, or `unknown`.
pub fn message(code: u64) -> &'static str {
    XID_MESSAGES
        .binary_search_by_key(&code, |(c, _)| *c)
        .map(|i| XID_MESSAGES[i].1)
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_is_sorted_and_lookups_work() {
        assert!(super::XID_MESSAGES.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(super::message(79), "GPU has fallen off the bus");
        assert_eq!(super::message(99999), "unknown");
    }
}
