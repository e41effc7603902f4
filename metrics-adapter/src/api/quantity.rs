//! `resource.Quantity` strings and `metav1.Time` timestamps as the metrics APIs write
//! them.
//!
//! Quantities are written in one simple form ([`format_quantity`]: integer milli-units,
//! see reference (b) "Quantity and timestamp rules"); the exact reader of every form
//! upstream accepts lives with the tests that run the HPA's arithmetic on our answers
//! (`tests/src/quantity.rs`), since nothing here reads quantities.

use std::time::SystemTime;

/// `2^63`, the first `f64` outside `i64`.
const I64_LIMIT: f64 = 9_223_372_036_854_775_808.0;

/// Encodes `v` the way this adapter writes every metric value: `milli = round(v × 1000)`
/// (halves away from zero), then `"{milli / 1000}"` when that is exact, else
/// `"{milli}m"`. Examples: 2 → `"2"`, 0.5 → `"500m"`, 64.25 → `"64250m"`, −0.5 →
/// `"-500m"`, 1000 → `"1000"`.
///
/// Milli precision matches what the HPA computes with (`MilliValue()`), so nothing it
/// could see is lost. Returns `None` for NaN, ±∞ and values whose milli count does not
/// fit an `i64`: those must be skipped, not sent, because the HPA cannot represent them.
pub fn format_quantity(v: f64) -> Option<String> {
    if !v.is_finite() {
        return None;
    }
    let scaled = (v * 1000.0).round();
    if !(-I64_LIMIT..I64_LIMIT).contains(&scaled) {
        return None;
    }
    // In range and integral, so the cast is exact.
    Some(format_milli(scaled as i64))
}

/// The quantity string for an integer number of milli-units (see [`format_quantity`]);
/// for callers that already sum in milli-units, as the HPA does.
pub fn format_milli(milli: i64) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// `t` as RFC 3339 in UTC with second precision, e.g. `2026-09-01T08:15:30Z`: the
/// format `metav1.Time` marshals to. Sub-second parts are floored (also before 1970);
/// times outside jiff's years −9999..9999 are clamped to its range.
pub fn rfc3339_seconds(t: SystemTime) -> String {
    let ts = jiff::Timestamp::try_from(t).unwrap_or(if t < SystemTime::UNIX_EPOCH {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    });
    let floored = ts.as_second() - i64::from(ts.subsec_nanosecond() < 0);
    jiff::Timestamp::from_second(floored)
        .unwrap_or(ts)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn format_quantity_uses_integer_milli_units() {
        let cases: [(f64, &str); 17] = [
            (0.0, "0"),
            (-0.0, "0"),
            (2.0, "2"),
            (0.5, "500m"),
            (-0.5, "-500m"),
            (64.25, "64250m"),
            (73.5, "73500m"),
            (77.0, "77"),
            (1000.0, "1000"),
            (1500.0, "1500"),
            (0.0004, "0"),
            (0.0005, "1m"),
            (-0.0005, "-1m"),
            (0.0015, "2m"),
            (1e15, "1000000000000000"),
            (-1234.5678, "-1234568m"),
            (9.2e15, "9200000000000000"),
        ];
        for (value, expected) in cases {
            assert_eq!(format_quantity(value).as_deref(), Some(expected), "{value}");
        }
        for value in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            9.3e15,
            -9.3e15,
            f64::MAX,
        ] {
            assert_eq!(format_quantity(value), None, "{value}");
        }
        assert_eq!(format_milli(i64::MIN), "-9223372036854775808m");
        assert_eq!(format_milli(-3000), "-3");
    }

    #[test]
    fn rfc3339_known_dates() {
        let cases: [(i64, &str); 13] = [
            (0, "1970-01-01T00:00:00Z"),
            (1, "1970-01-01T00:00:01Z"),
            (-1, "1969-12-31T23:59:59Z"),
            (1_788_250_530, "2026-09-01T08:15:30Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_709_251_199, "2024-02-29T23:59:59Z"),
            (4_107_499_200, "2100-02-28T12:00:00Z"),
            (4_107_542_400, "2100-03-01T00:00:00Z"),
            (-2_203_891_200, "1900-03-01T00:00:00Z"),
            (-11_670_998_400, "1600-02-29T00:00:00Z"),
            (94_694_399, "1972-12-31T23:59:59Z"),
            (2_147_483_648, "2038-01-19T03:14:08Z"),
            // jiff's last representable second.
            (253_402_207_199, "9999-12-30T21:59:59Z"),
        ];
        for (seconds, expected) in cases {
            let t = if seconds >= 0 {
                UNIX_EPOCH + Duration::from_secs(seconds.unsigned_abs())
            } else {
                UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
            };
            assert_eq!(rfc3339_seconds(t), expected, "{seconds}");
        }
    }

    #[test]
    fn rfc3339_from_system_time_truncates_to_seconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_788_250_530_999);
        assert_eq!(rfc3339_seconds(t), "2026-09-01T08:15:30Z");
        assert_eq!(rfc3339_seconds(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let before = UNIX_EPOCH - Duration::from_millis(500);
        assert_eq!(rfc3339_seconds(before), "1969-12-31T23:59:59Z");
        let before = UNIX_EPOCH - Duration::from_secs(86_400);
        assert_eq!(rfc3339_seconds(before), "1969-12-31T00:00:00Z");
        let now = rfc3339_seconds(SystemTime::now());
        assert_eq!(now.len(), 20, "{now}");
    }
}
