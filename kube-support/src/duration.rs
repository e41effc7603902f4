//! Durations in Go's `time.ParseDuration` syntax, the one grammar every duration of
//! both products is read in: the flags Kubernetes components share with manifests
//! (`--kubernetes-refresh-interval=2s`, `--authorization-webhook-cache-authorized-ttl=2m0s`)
//! and exporter-toolkit's web config (`rate_limit.interval`).
//!
//! Written here by hand because no crate reads exactly Go's grammar: jiff's friendly
//! format also takes spaces, long unit names, days, weeks and ISO 8601 and refuses
//! fractions on all but the last unit, and the one Go port on crates.io panics on `µs`
//! (it mixes byte and character indices) and checks overflow against 2^62. A manifest
//! value that Go accepts must read the same here, and one Go refuses must be refused.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

/// Why a duration was refused (Go's three refusals, and ours).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration (Go's syntax: 300ms, 1.5s, 2m0s, 1h30m)")]
    Invalid(String),
    #[error("{0:?} is not a duration: a number needs a unit (ns, us, ms, s, m, h)")]
    MissingUnit(String),
    #[error("{text:?} is not a duration: unknown unit {unit:?} (use ns, us, ms, s, m, h)")]
    UnknownUnit { unit: String, text: String },
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{text:?} is outside {}..{}", Go(*.min), Go(*.max))]
    OutOfRange {
        text: String,
        min: Duration,
        max: Duration,
    },
}

/// Go's `time.ParseDuration`: an optional sign, then one or more decimal numbers, each
/// with an optional fraction and a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`),
/// as in `300ms`, `1.5h`, `2m0s`; a bare `0` is zero. Negative durations mean nothing
/// to any caller here and are refused.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(text.to_string());
    let (negative, mut s) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !s.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
            return Err(invalid());
        }
        let (whole, rest) = leading_int(s).ok_or_else(invalid)?;
        let pre = rest.len() != s.len();
        s = rest;
        let (mut fraction, mut scale, mut post) = (0u64, 1f64, false);
        if let Some(rest) = s.strip_prefix('.') {
            let (f, sc, r) = leading_fraction(rest);
            post = r.len() != rest.len();
            (fraction, scale, s) = (f, sc, r);
        }
        if !pre && !post {
            // No digits, as in ".s" or "-.s".
            return Err(invalid());
        }
        let unit_len = s
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit(text.to_string()));
        }
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        let nanos: u64 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(DurationError::UnknownUnit {
                    unit: unit.to_string(),
                    text: text.to_string(),
                });
            }
        };
        if whole > LIMIT / nanos {
            return Err(invalid());
        }
        let mut v = whole * nanos;
        if fraction > 0 {
            // f64 keeps fractions of hours exact to the nanosecond, as in Go.
            v += (fraction as f64 * (nanos as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        total = total
            .checked_add(v)
            .filter(|t| *t <= LIMIT)
            .ok_or_else(invalid)?;
    }
    if total > LIMIT - 1 {
        // Only -2^63 ns fits, and negatives are refused below anyway.
        return Err(if negative {
            DurationError::Negative(text.to_string())
        } else {
            invalid()
        });
    }
    if negative && total > 0 {
        return Err(DurationError::Negative(text.to_string()));
    }
    Ok(Duration::from_nanos(total))
}

/// What every interval and timeout flag of both products accepts: 10 ms to 1 h.
pub const FLAG_RANGE: RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(3600);

/// A duration flag of either product (clap's `value_parser`): Go's syntax ([`parse`]),
/// or a bare whole number of milliseconds as both products' flags have always
/// accepted, within [`FLAG_RANGE`].
pub fn parse_flag(text: &str) -> Result<Duration, DurationError> {
    let range = FLAG_RANGE;
    let t = text.trim();
    let duration = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| DurationError::Invalid(text.to_string()))?
    } else {
        parse(t)?
    };
    if !range.contains(&duration) {
        return Err(DurationError::OutOfRange {
            text: text.to_string(),
            min: *range.start(),
            max: *range.end(),
        });
    }
    Ok(duration)
}

/// Go keeps a duration within an int64 of nanoseconds; 2^63 itself only as -2^63.
const LIMIT: u64 = 1 << 63;

/// `[0-9]*` at the start of `s`, or `None` on overflow.
fn leading_int(s: &str) -> Option<(u64, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let mut x: u64 = 0;
    for b in s[..digits].bytes() {
        x = x.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        if x > LIMIT {
            return None;
        }
    }
    Some((x, &s[digits..]))
}

/// `[0-9]*` after a decimal point: the digits as an integer and their scale. Precision
/// stops accumulating on overflow (never an error), as in Go.
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    for b in s[..digits].bytes() {
        if overflow {
            continue;
        }
        match x
            .checked_mul(10)
            .and_then(|y| y.checked_add(u64::from(b - b'0')))
        {
            Some(y) if y <= LIMIT => {
                x = y;
                scale *= 10.0;
            }
            _ => overflow = true,
        }
    }
    (x, scale, &s[digits..])
}

/// A duration written in its largest exact unit (`10ms`, `1h`), for messages.
struct Go(Duration);

impl fmt::Display for Go {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.as_nanos();
        let units: [(u128, &str); 6] = [
            (3_600_000_000_000, "h"),
            (60_000_000_000, "m"),
            (1_000_000_000, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
            (1, "ns"),
        ];
        match units.iter().find(|(size, _)| n % size == 0 && n >= *size) {
            Some((size, unit)) => write!(f, "{}{unit}", n / size),
            None => write!(f, "0s"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    /// Go's own table (`time_test.go`, `parseDurationTests`), the non-negative cases.
    #[test]
    fn reads_what_go_reads() {
        let s = 1_000_000_000u64;
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("5s", ns(5 * s)),
            ("30s", ns(30 * s)),
            ("1478s", ns(1478 * s)),
            ("+5s", ns(5 * s)),
            ("-0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("5.0s", ns(5 * s)),
            ("5.6s", ns(5 * s + 600_000_000)),
            ("5.s", ns(5 * s)),
            (".5s", ns(500_000_000)),
            ("1.0s", ns(s)),
            ("1.00s", ns(s)),
            ("1.004s", ns(s + 4_000_000)),
            ("1.0040s", ns(s + 4_000_000)),
            ("100.00100s", ns(100 * s + 1_000_000)),
            ("10ns", ns(10)),
            ("11us", ns(11_000)),
            ("12µs", ns(12_000)),
            ("12μs", ns(12_000)),
            ("13ms", ns(13_000_000)),
            ("14s", ns(14 * s)),
            ("15m", ns(15 * 60 * s)),
            ("16h", ns(16 * 3600 * s)),
            ("3h30m", ns((3 * 3600 + 30 * 60) * s)),
            ("10.5s4m", ns(4 * 60 * s + 10 * s + 500_000_000)),
            ("1h2m3s4ms5us6ns", ns(3723 * s + 4_005_006)),
            (
                "39h9m14.425s",
                ns((39 * 3600 + 9 * 60 + 14) * s + 425_000_000),
            ),
            ("52763797000ns", ns(52_763_797_000)),
            ("0.3333333333333333333h", ns(20 * 60 * s)),
            ("9007199254740993ns", ns(9_007_199_254_740_993)),
            ("9223372036854775807ns", ns(9_223_372_036_854_775_807)),
            ("9223372036854775.807us", ns(9_223_372_036_854_775_807)),
            ("9223372036s854ms775us807ns", ns(9_223_372_036_854_775_807)),
            ("0.100000000000000000000h", ns(6 * 60 * s)),
            ("0.830103483285477580700h", ns(49 * 60 * s + 48_372_539_827)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(*want), "{text}");
        }
    }

    /// Go's table of refusals, plus negatives (which Go reads and we refuse).
    #[test]
    fn refuses_what_go_refuses() {
        for text in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "\u{85}\u{85}",
            "\u{fffd}",
            "9223372036854775810ns",
            "9223372036854775808ns",
            "3000000h",
            "1 s",
            " 1s",
            "1s ",
            "1hour",
        ] {
            assert!(parse(text).is_err(), "{text:?} should be refused");
        }
        assert_eq!(parse("3"), Err(DurationError::MissingUnit("3".into())));
        assert_eq!(
            parse("1d"),
            Err(DurationError::UnknownUnit {
                unit: "d".into(),
                text: "1d".into()
            })
        );
        assert_eq!(parse("-5s"), Err(DurationError::Negative("-5s".into())));
        assert_eq!(
            parse("-9223372036854775808ns"),
            Err(DurationError::Negative("-9223372036854775808ns".into()))
        );
    }

    #[test]
    fn flags_take_go_syntax_or_bare_milliseconds_within_their_range() {
        let ok = [
            ("10s", Duration::from_secs(10)),
            ("500ms", Duration::from_millis(500)),
            ("2m0s", Duration::from_secs(120)),
            ("1m30s", Duration::from_secs(90)),
            ("1h0m0s", Duration::from_secs(3600)),
            ("1.5s", Duration::from_millis(1500)),
            ("1500", Duration::from_millis(1500)),
            (" 2s ", Duration::from_secs(2)),
            ("10ms", Duration::from_millis(10)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_flag(text), Ok(want), "{text}");
        }
        let e = parse_flag("9ms").expect_err("below");
        assert_eq!(e.to_string(), "\"9ms\" is outside 10ms..1h");
        let e = parse_flag("1h0m0.001s").expect_err("above");
        assert_eq!(e.to_string(), "\"1h0m0.001s\" is outside 10ms..1h");
        for text in ["", "2h", "1.5", "fast", "2x", "-5s", "99999999999999999999"] {
            assert!(parse_flag(text).is_err(), "{text}");
        }
    }

    proptest::proptest! {
        /// Go's own printing of a duration (`Duration.String`) reads back to itself.
        #[test]
        fn reads_back_go_s_printing(n in 0u64..(1 << 63)) {
            let d = Duration::from_nanos(n);
            proptest::prop_assert_eq!(parse(&go_string(d)), Ok(d));
        }
    }

    /// Go's `Duration.String`, for the property test: `72h3m0.5s`, `1.5ms`, `0s`.
    fn go_string(d: Duration) -> String {
        let n = d.as_nanos() as u64;
        if n == 0 {
            return "0s".into();
        }
        let frac = |v: u64, digits: u32| -> String {
            let s = format!("{:0width$}", v, width = digits as usize);
            let s = s.trim_end_matches('0');
            if s.is_empty() {
                String::new()
            } else {
                format!(".{s}")
            }
        };
        if n < 1_000 {
            return format!("{n}ns");
        }
        if n < 1_000_000 {
            return format!("{}{}µs", n / 1_000, frac(n % 1_000, 3));
        }
        if n < 1_000_000_000 {
            return format!("{}{}ms", n / 1_000_000, frac(n % 1_000_000, 6));
        }
        let secs = n / 1_000_000_000;
        let sub = frac(n % 1_000_000_000, 9);
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        match (h, m) {
            (0, 0) => format!("{s}{sub}s"),
            (0, _) => format!("{m}m{s}{sub}s"),
            _ => format!("{h}h{m}m{s}{sub}s"),
        }
    }
}
