//! An exact reader of `resource.Quantity` strings, every form upstream
//! `resource.ParseQuantity` accepts ([`parse_quantity`], [`milli_value`]), so that the
//! tests run the HPA's arithmetic on what the adapter answers, or on what a manifest
//! contains, without a Go round trip. It is the tests' independent oracle for the
//! adapter's writer (`gpu_metrics_adapter::api::quantity`).
//!
//! Parsing is exact: the mantissa is kept as a decimal digit string and scaled with a
//! small arbitrary-precision integer, so `milli_value("73.5004")` is 73501 exactly as
//! in Go, with no `f64` rounding on the way.

/// Longest quantity string accepted. Real quantities are a few dozen bytes; the cap
/// bounds the exact arithmetic on hostile input.
pub const MAX_QUANTITY_LEN: usize = 1024;

/// `2^63`, the first `f64` outside `i64`.
const I64_LIMIT: f64 = 9_223_372_036_854_775_808.0;

/// Why a quantity string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The empty string (upstream: "quantities must match the regular expression").
    #[error("quantity is empty")]
    Empty,
    /// Longer than [`MAX_QUANTITY_LEN`].
    #[error("quantity is {len} bytes long; the limit is {max} bytes")]
    TooLong {
        /// Length of the input in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not `<sign><digits>[.<digits>]<suffix>` (upstream `ErrFormatWrong`).
    #[error(
        "quantity {0:?} must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format(String),
    /// Well-formed but the suffix is not one of n u m k M G T P E, Ki…Ei or an exponent
    /// (upstream `ErrSuffix`).
    #[error("unable to parse quantity {0:?}: unknown suffix")]
    Suffix(String),
    /// The value does not fit the requested representation (an `f64`, or `i64` milli).
    #[error("quantity {0:?} is out of range")]
    OutOfRange(String),
}

/// Parses any quantity upstream `resource.ParseQuantity` accepts: `"81"`, `"73500m"`,
/// `"73.5"`, `"1.5e3"`, `"-500m"`, `"+1k"`, `".5"`, `"1."`, decimal suffixes
/// `n u m k M G T P E`, binary `Ki Mi Gi Ti Pi Ei`, exponents `e`/`E` with optional sign.
///
/// Like upstream, non-zero magnitudes below one nano-unit round up (away from zero) to
/// the nearest nano, and binary-suffixed values are capped at `2^63 − 1`. The result is
/// the nearest `f64` to that exact value.
///
/// Deliberate differences: strings without any digit (`"-"`, `"."`, `"m"`), which Go
/// silently reads as 0, are rejected; exponents outside `i32`, which Go truncates, are
/// [`QuantityError::OutOfRange`]; so are values too large for an `f64`.
pub fn parse_quantity(s: &str) -> Result<f64, QuantityError> {
    let parts = Parts::parse(s)?;
    if parts.digits.is_empty() {
        return Ok(0.0);
    }
    let mut magnitude = parts.magnitude();
    let mut exp10 = parts.exp10;
    if exp10 < -9 {
        // Upstream: amount.Round(amount, Nano, inf.RoundUp).
        let shift = (-9 - exp10).unsigned_abs();
        let inexact = magnitude.divide_by_pow10(shift, parts.max_digits());
        if inexact {
            magnitude.mul_add(1, 1);
        }
        exp10 = -9;
    }
    let text = format!("{}e{exp10}", magnitude.to_decimal());
    let value: f64 = text
        .parse()
        .map_err(|_| QuantityError::Format(snippet(s)))?;
    if !value.is_finite() {
        return Err(QuantityError::OutOfRange(snippet(s)));
    }
    // Upstream caps binary-SI amounts at maxAllowed = 2^63 - 1, which is 2^63 as an f64.
    let value = if parts.kibi > 0 {
        value.min(I64_LIMIT)
    } else {
        value
    };
    Ok(if parts.negative { -value } else { value })
}

/// The quantity in integer milli-units as upstream `Quantity.MilliValue()` computes it,
/// i.e. what the HPA sums and compares: exact, and rounded up in magnitude when the
/// value has finer than milli precision (`"73.5004"` → 73501, `"1n"` → 1).
///
/// For negative values this rounds away from zero (`"-0.5004"` → −501), as upstream's
/// int64 fast path does; upstream's big-decimal path (values with more than 18 digits or
/// finer than nano) rounds some negatives toward +∞ instead, which we treat as a bug and
/// do not copy. Results that do not fit an `i64` are [`QuantityError::OutOfRange`] where
/// Go silently overflows.
pub fn milli_value(s: &str) -> Result<i64, QuantityError> {
    let parts = Parts::parse(s)?;
    if parts.digits.is_empty() {
        return Ok(0);
    }
    let mut magnitude = parts.magnitude();
    let exp10 = parts.exp10.saturating_add(3);
    let out_of_range = || QuantityError::OutOfRange(snippet(s));
    let rounded_up = if exp10 >= 0 {
        for _ in 0..exp10 {
            magnitude.mul_add(10, 0);
            // Past 96 bits the result cannot fit an i64; stopping here also bounds the
            // loop for exponents like e2147483647.
            if magnitude.limbs() > 3 {
                return Err(out_of_range());
            }
        }
        false
    } else {
        magnitude.divide_by_pow10(exp10.unsigned_abs(), parts.max_digits())
    };
    let magnitude = magnitude
        .to_u128()
        .and_then(|m| m.checked_add(u128::from(rounded_up)))
        .ok_or_else(out_of_range)?;
    let magnitude = i128::try_from(magnitude).map_err(|_| out_of_range())?;
    let signed = if parts.negative {
        -magnitude
    } else {
        magnitude
    };
    i64::try_from(signed).map_err(|_| out_of_range())
}

/// At most 64 characters of the input, for error messages.
fn snippet(s: &str) -> String {
    match s.char_indices().nth(64) {
        None => s.to_owned(),
        Some((cut, _)) => format!("{}...", &s[..cut]),
    }
}

/// A syntactically valid quantity: `±digits × 10^exp10 × 1024^kibi`.
struct Parts {
    negative: bool,
    /// Significant decimal digits, no leading or trailing zeros; empty for zero.
    digits: String,
    exp10: i64,
    /// 0 for decimal suffixes, 1 for Ki … 6 for Ei.
    kibi: u32,
}

impl Parts {
    /// Upstream's `parseQuantityString` + `suffixer.interpret`, minus the digit-less
    /// forms (see [`parse_quantity`]).
    fn parse(s: &str) -> Result<Self, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        if s.len() > MAX_QUANTITY_LEN {
            return Err(QuantityError::TooLong {
                len: s.len(),
                max: MAX_QUANTITY_LEN,
            });
        }
        let format_error = || QuantityError::Format(snippet(s));
        let (negative, unsigned) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let integer_len = unsigned.bytes().take_while(u8::is_ascii_digit).count();
        let (integer, rest) = unsigned.split_at(integer_len);
        let (fraction, suffix) = match rest.strip_prefix('.') {
            Some(after_dot) => {
                let fraction_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
                after_dot.split_at(fraction_len)
            }
            None => ("", rest),
        };
        if integer.is_empty() && fraction.is_empty() {
            return Err(format_error());
        }
        let (exp10, kibi) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 1),
            "Mi" => (0, 2),
            "Gi" => (0, 3),
            "Ti" => (0, 4),
            "Pi" => (0, 5),
            "Ei" => (0, 6),
            _ => {
                let exponent = suffix
                    .strip_prefix(['e', 'E'])
                    .filter(|e| !e.is_empty())
                    .map(str::parse::<i64>);
                match exponent {
                    // Go truncates the exponent to int32; we refuse instead.
                    Some(Ok(e)) if i32::try_from(e).is_ok() => (e, 0),
                    Some(Ok(_)) => return Err(QuantityError::OutOfRange(snippet(s))),
                    _ if is_suffix_shaped(suffix) => {
                        return Err(QuantityError::Suffix(snippet(s)));
                    }
                    _ => return Err(format_error()),
                }
            }
        };
        let mut digits = format!("{integer}{fraction}");
        let leading_zeros = digits.bytes().take_while(|b| *b == b'0').count();
        digits.drain(..leading_zeros);
        let trailing_zeros = digits.bytes().rev().take_while(|b| *b == b'0').count();
        digits.truncate(digits.len() - trailing_zeros);
        // Lengths are at most MAX_QUANTITY_LEN and the exponent fits i32: no overflow.
        let exp10 = exp10 - fraction.len() as i64 + trailing_zeros as i64;
        Ok(Self {
            negative,
            digits,
            exp10,
            kibi,
        })
    }

    /// `digits × 1024^kibi`.
    fn magnitude(&self) -> Magnitude {
        let mut magnitude = Magnitude::default();
        for digit in self.digits.bytes() {
            magnitude.mul_add(10, u32::from(digit - b'0'));
        }
        for _ in 0..self.kibi {
            magnitude.mul_add(1024, 0);
        }
        magnitude
    }

    /// An upper bound on the decimal digits of [`Parts::magnitude`]: 1024^6 = 2^60 adds
    /// fewer than 19.
    fn max_digits(&self) -> u64 {
        self.digits.len() as u64 + 19
    }
}

/// Whether `suffix` has upstream's suffix shape `[eEinumkKMGTP]*[-+]?[0-9]*`, which
/// decides between `ErrSuffix` and `ErrFormatWrong`.
fn is_suffix_shaped(suffix: &str) -> bool {
    let letters = suffix
        .bytes()
        .take_while(|b| b"eEinumkKMGTP".contains(b))
        .count();
    let rest = &suffix.as_bytes()[letters..];
    let rest = rest
        .strip_prefix(b"-")
        .or_else(|| rest.strip_prefix(b"+"))
        .unwrap_or(rest);
    rest.iter().all(u8::is_ascii_digit)
}

/// A non-negative integer in little-endian base 2^32: just the arithmetic needed to scale
/// a decimal mantissa exactly.
#[derive(Debug, Default, Clone)]
struct Magnitude(Vec<u32>);

impl Magnitude {
    /// `self = self × mul + add`.
    fn mul_add(&mut self, mul: u32, add: u32) {
        let mut carry = u64::from(add);
        for limb in &mut self.0 {
            let value = u64::from(*limb) * u64::from(mul) + carry;
            *limb = value as u32; // low half; the high half carries
            carry = value >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32); // carry < 2^32 since mul, add < 2^32
        }
        self.trim();
    }

    /// `self = self / div`, returning the remainder.
    fn div_rem(&mut self, div: u32) -> u32 {
        let mut remainder = 0u64;
        for limb in self.0.iter_mut().rev() {
            let current = (remainder << 32) | u64::from(*limb);
            *limb = (current / u64::from(div)) as u32; // < 2^32 because remainder < div
            remainder = current % u64::from(div);
        }
        self.trim();
        remainder as u32 // < div
    }

    /// `self = floor(self / 10^power)`; returns whether anything non-zero was discarded.
    /// `max_digits` bounds the decimal length of `self`: dividing by more than that
    /// leaves 0, which is answered without looping (powers can be ~2^31).
    fn divide_by_pow10(&mut self, mut power: u64, max_digits: u64) -> bool {
        if self.is_zero() {
            return false;
        }
        if power > max_digits {
            self.0.clear();
            return true;
        }
        let mut inexact = false;
        while power > 0 {
            let step = power.min(9);
            // step <= 9, so 10^step fits a u32.
            inexact |= self.div_rem(10u32.pow(step as u32)) != 0;
            power -= step;
        }
        inexact
    }

    fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    fn limbs(&self) -> usize {
        self.0.len()
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn to_u128(&self) -> Option<u128> {
        if self.0.len() > 4 {
            return None;
        }
        Some(
            self.0
                .iter()
                .rev()
                .fold(0u128, |acc, limb| (acc << 32) | u128::from(*limb)),
        )
    }

    fn to_decimal(&self) -> String {
        if self.is_zero() {
            return "0".to_owned();
        }
        let mut rest = self.clone();
        let mut chunks = Vec::new();
        while !rest.is_zero() {
            chunks.push(rest.div_rem(1_000_000_000));
        }
        let mut text = String::with_capacity(chunks.len() * 9);
        for (index, chunk) in chunks.iter().rev().enumerate() {
            if index == 0 {
                text.push_str(&chunk.to_string());
            } else {
                text.push_str(&format!("{chunk:09}"));
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_metrics_adapter::api::{format_milli, format_quantity};
    use proptest::prelude::*;

    #[test]
    fn parse_quantity_accepts_upstream_forms() {
        let cases: [(&str, f64); 30] = [
            ("81", 81.0),
            ("73500m", 73.5),
            ("73.5", 73.5),
            ("1.5e3", 1500.0),
            ("1.5E3", 1500.0),
            ("15e-1", 1.5),
            ("1e+3", 1000.0),
            ("-500m", -0.5),
            ("+500m", 0.5),
            ("1k", 1000.0),
            ("1M", 1e6),
            ("2G", 2e9),
            ("1T", 1e12),
            ("1P", 1e15),
            ("1E", 1e18),
            ("5n", 5e-9),
            ("5u", 5e-6),
            ("1Ki", 1024.0),
            ("1.5Ki", 1536.0),
            ("1Mi", 1_048_576.0),
            ("1Gi", 1_073_741_824.0),
            ("1Ti", 1_099_511_627_776.0),
            ("1Pi", 1_125_899_906_842_624.0),
            ("1Ei", 1_152_921_504_606_846_976.0),
            (".5", 0.5),
            ("5.", 5.0),
            ("007", 7.0),
            ("-0", 0.0),
            ("0.0000000001", 1e-9), // rounded up to one nano, as upstream
            ("16Ei", I64_LIMIT),    // capped at 2^63 - 1 (2^63 as f64), as upstream
        ];
        for (text, expected) in cases {
            assert_eq!(parse_quantity(text), Ok(expected), "{text:?}");
        }
        assert_eq!(parse_quantity("-0.0000000001"), Ok(-1e-9));
        assert_eq!(parse_quantity("1e-2000000000"), Ok(1e-9));
        assert_eq!(parse_quantity("0e999999999"), Ok(0.0));
        assert_eq!(parse_quantity("1e30"), Ok(1e30)); // no cap for decimal SI
        assert!(parse_quantity("-0").is_ok_and(|v| v.is_sign_positive()));
    }

    #[test]
    fn parse_quantity_rejects_malformed_input() {
        let format = [
            "abc", " 1", "1 ", "1.2.3", "--1", "0x10", "1_000", "1,5", "-", "+", ".", "m", "Ki",
            "1e 3", "\u{661}",
        ];
        for text in format {
            assert_eq!(
                parse_quantity(text),
                Err(QuantityError::Format(text.to_owned())),
                "{text:?}"
            );
        }
        let suffix = ["1kk", "1K", "1e", "1e+", "1ki", "1mi", "1Kii", "1m5", "1E-"];
        for text in suffix {
            assert_eq!(
                parse_quantity(text),
                Err(QuantityError::Suffix(text.to_owned())),
                "{text:?}"
            );
        }
        assert_eq!(parse_quantity(""), Err(QuantityError::Empty));
        assert_eq!(
            parse_quantity("1e400"),
            Err(QuantityError::OutOfRange("1e400".to_owned()))
        );
        assert_eq!(
            parse_quantity("1e2147483648"),
            Err(QuantityError::OutOfRange("1e2147483648".to_owned()))
        );
        let long = "1".repeat(MAX_QUANTITY_LEN + 1);
        assert_eq!(
            parse_quantity(&long),
            Err(QuantityError::TooLong {
                len: MAX_QUANTITY_LEN + 1,
                max: MAX_QUANTITY_LEN
            })
        );
        let message = parse_quantity("1kk").map(|_| ()).unwrap_err().to_string();
        assert_eq!(message, "unable to parse quantity \"1kk\": unknown suffix");
    }

    #[test]
    fn milli_value_matches_hpa_rounding() {
        let cases: [(&str, i64); 22] = [
            ("73.5004", 73_501),
            ("73.5", 73_500),
            ("64250m", 64_250),
            ("1", 1000),
            ("0", 0),
            ("-0", 0),
            ("0e999999999", 0),
            ("-500m", -500),
            ("-0.5004", -501),
            ("1n", 1),
            ("0.0000000001", 1),
            ("1e-999999999", 1),
            ("-1e-999999999", -1),
            ("1Ki", 1_024_000),
            ("1.5Ki", 1_536_000),
            ("0.0001Ki", 103), // 102.4 milli, rounded up
            ("1.5e3", 1_500_000),
            ("9223372036854775807m", i64::MAX),
            ("-9223372036854775808m", i64::MIN),
            ("9223372036854775.807", i64::MAX),
            ("9223372036854775.8069", i64::MAX),
            ("8Pi", 9_007_199_254_740_992_000),
        ];
        for (text, expected) in cases {
            assert_eq!(milli_value(text), Ok(expected), "{text:?}");
        }
        for text in [
            "9223372036854775808m",
            "-9223372036854775809m",
            "1e16",
            "8Ei",
            "1e2147483647",
            "9223372036854775.8071",
        ] {
            assert_eq!(
                milli_value(text),
                Err(QuantityError::OutOfRange(text.to_owned())),
                "{text:?}"
            );
        }
        assert!(milli_value("").is_err());
        assert!(milli_value("1x").is_err());
    }

    #[test]
    fn hpa_external_average_value_example_from_the_reference() {
        // Reference (d) example 2: items 80, 85, 90, 75 against target 60 on 4 replicas.
        let items = [80.0, 85.0, 90.0, 75.0];
        let usage: i64 = items
            .iter()
            .filter_map(|v| format_quantity(*v))
            .map(|q| milli_value(&q).unwrap_or_default())
            .sum();
        let target = milli_value("60").unwrap_or_default();
        assert_eq!(usage, 330_000);
        assert_eq!((usage + target - 1) / target, 6);
    }

    fn quantity_like_text() -> impl Strategy<Value = String> {
        let pieces = prop::sample::select(vec![
            "0",
            "1",
            "9",
            "5",
            ".",
            "-",
            "+",
            "e",
            "E",
            "i",
            "n",
            "u",
            "m",
            "k",
            "K",
            "M",
            "G",
            "T",
            "P",
            "Ki",
            "Ei",
            "99999999999",
            " ",
            "x",
        ]);
        prop::collection::vec(pieces, 0..12).prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn parsers_never_panic(text in any::<String>()) {
            let _ = parse_quantity(&text);
            let _ = milli_value(&text);
        }

        #[test]
        fn parsers_never_panic_on_quantity_like_text(text in quantity_like_text()) {
            let parsed = parse_quantity(&text);
            let milli = milli_value(&text);
            // Both accept exactly the same strings, except that milli_value can overflow
            // where an f64 cannot and vice versa.
            if let (Ok(_), Err(err)) | (Err(err), Ok(_)) = (&parsed.map(|_| ()), &milli.map(|_| ())) {
                prop_assert!(matches!(err, QuantityError::OutOfRange(_)), "{:?}: {:?}", text, err);
            }
        }

        #[test]
        fn formatted_milli_round_trips(milli in -(1i64 << 50)..(1i64 << 50)) {
            let value = milli as f64 / 1000.0;
            let text = format_milli(milli);
            prop_assert_eq!(format_quantity(value), Some(text.clone()));
            prop_assert_eq!(milli_value(&text), Ok(milli));
            prop_assert_eq!(parse_quantity(&text), Ok(value));
        }

        #[test]
        fn milli_value_is_ceiling_of_exact_decimal(
            integer in 0u64..1_000_000_000,
            fraction in "[0-9]{0,8}",
            negative in any::<bool>(),
        ) {
            let text = format!("{}{integer}.{fraction}", if negative { "-" } else { "" });
            // Exact oracle in i128: value = (integer × 10^len + fraction) / 10^len.
            let scale = 10i128.pow(fraction.len() as u32);
            let numerator = (i128::from(integer) * scale + fraction.parse::<i128>().unwrap_or(0)) * 1000;
            let magnitude = (numerator + scale - 1) / scale;
            let expected = if negative { -magnitude } else { magnitude };
            prop_assert_eq!(milli_value(&text).map(i128::from), Ok(expected), "{}", text);
        }
    }
}
