//! The Prometheus text exposition (format 0.0.4, and OpenMetrics text, whose samples
//! read the same), as the serving engines serve it: their Python and Rust Prometheus
//! clients offer no protobuf. Only the samples of wanted families are kept; the
//! others are skipped by name, unparsed.

use super::super::derive::{Decoded, Series};
use super::super::limits::{MAX_LABELS_PER_SERIES, Rejection};
use crate::error::Error;
use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

/// Whether a content type is a text exposition (an empty one is taken as text, as
/// Prometheus does).
pub fn is_text(content_type: &str) -> bool {
    let ct = content_type.trim().to_ascii_lowercase();
    ct.is_empty() || ct.starts_with("text/plain") || ct.starts_with("application/openmetrics-text")
}

/// The samples of `body` whose names `wanted` accepts, at most `max_series` of them,
/// with the labels `keep` names. Every sample name is offered to `wanted`, so it also
/// sees what is there. A sample with more than [`MAX_LABELS_PER_SERIES`] labels is
/// refused and counted, the rest kept. A sample with the name and the whole label set
/// of one already kept (labels not kept included) is an exact duplicate: dropped and
/// counted, never summed as if a second engine had sent it.
pub fn parse(
    body: &[u8],
    max_series: usize,
    mut wanted: impl FnMut(&str) -> bool,
    keep: impl Fn(&str) -> bool,
) -> Result<Decoded, Error> {
    let text = std::str::from_utf8(body)
        .map_err(|e| Error::Decode(format!("the exposition is not UTF-8: {e}")))?;
    let mut out = Vec::new();
    let mut over_labels = 0;
    let mut duplicates = 0;
    // Each kept sample's identity: its name and every label pair, in any order.
    let mut seen: HashSet<u64> = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let end = line
            .find(|c: char| c == '{' || c.is_ascii_whitespace())
            .unwrap_or(line.len());
        let name = &line[..end];
        if !wanted(name) {
            continue;
        }
        let bad = |why: &str| Error::Decode(format!("line {}: {why}: {line:?}", n + 1));
        let mut rest = &line[end..];
        let mut labels = Vec::new();
        let mut identity = hash_of(&name);
        if let Some(after) = rest.strip_prefix('{') {
            let count;
            (rest, count) = parse_labels(after, &mut labels, &keep, &mut identity)
                .map_err(|why| bad(&why.to_string()))?;
            if count > MAX_LABELS_PER_SERIES {
                over_labels += 1;
                continue;
            }
        }
        let value = rest
            .split_ascii_whitespace()
            .next()
            .ok_or_else(|| bad("no value"))?;
        let value = parse_value(value).ok_or_else(|| bad("the value is not a number"))?;
        if !seen.insert(identity) {
            duplicates += 1;
            continue;
        }
        if out.len() >= max_series {
            return Err(Error::OverLimit {
                reason: Rejection::SeriesLimit,
                message: format!(
                    "the engine reports more than {max_series} series of the served families (--max-series-per-target)"
                ),
            });
        }
        out.push(Series {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(Decoded {
        series: out,
        over_labels,
        duplicates,
    })
}

fn hash_of(value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// A sample value: a float, or `+Inf`, `-Inf`, `NaN`.
fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

/// `name="value",…}` after the opening brace: the pairs `keep` names into `labels`
/// (none past [`MAX_LABELS_PER_SERIES`]), what follows the closing brace, and how many
/// pairs there were.
pub(in crate::source) fn parse_labels<'a>(
    mut rest: &'a str,
    labels: &mut Vec<(String, String)>,
    keep: impl Fn(&str) -> bool,
    identity: &mut u64,
) -> Result<(&'a str, usize), LabelSyntax> {
    let mut count = 0;
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((after, count));
        }
        let eq = rest.find('=').ok_or(LabelSyntax::NoValue)?;
        let name = rest[..eq].trim();
        if name.is_empty() {
            return Err(LabelSyntax::EmptyName);
        }
        rest = rest[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or(LabelSyntax::Unquoted)?;
        count += 1;
        let kept = count <= MAX_LABELS_PER_SERIES && keep(name);
        let mut value = String::new();
        let mut push = |c: char| {
            if kept {
                value.push(c)
            }
        };
        let mut chars = rest.char_indices();
        let close = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => push('\n'),
                    Some((_, c)) => push(c),
                    None => return Err(LabelSyntax::Unterminated),
                },
                Some((_, c)) => push(c),
                None => return Err(LabelSyntax::Unterminated),
            }
        };
        // Every pair counts towards the sample's identity, kept or not; added, so that
        // the order the pairs come in does not matter.
        *identity = identity.wrapping_add(hash_of(&(name, &rest[..close])));
        if kept {
            labels.push((name.to_string(), value));
        }
        rest = rest[close + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err(LabelSyntax::NoComma);
        }
    }
}

/// Why a label set is not `name="value",…}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LabelSyntax {
    #[error("a label without a value")]
    NoValue,
    #[error("an empty label name")]
    EmptyName,
    #[error("a label value not in quotes")]
    Unquoted,
    #[error("an unterminated label value")]
    Unterminated,
    #[error("labels not separated by commas")]
    NoComma,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_labels_escapes_and_special_values() {
        let body = br#"# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a \"b\" \\c\nd"} 4.0
vllm:ttft_bucket{le="+Inf",} 7 1700000000000
other_metric 1
vllm:x NaN
vllm:y -Inf
"#;
        let mut seen = Vec::new();
        let series = parse(
            body,
            10,
            |n| {
                seen.push(n.to_string());
                n.starts_with("vllm:")
            },
            |_| true,
        )
        .unwrap()
        .series;
        assert_eq!(seen.len(), 5, "every sample's name is offered");
        assert_eq!(series.len(), 4);
        assert_eq!(series[0].label("model_name"), Some("a \"b\" \\c\nd"));
        assert_eq!(series[0].value, 4.0);
        assert_eq!(series[1].label("le"), Some("+Inf"));
        assert_eq!(series[1].value, 7.0, "the timestamp is not the value");
        assert!(series[2].value.is_nan());
        assert_eq!(series[3].value, f64::NEG_INFINITY);
    }

    #[test]
    fn malformed_wanted_lines_and_too_many_series_are_refused() {
        for (bad, why) in [
            (
                &b"vllm:a{x=\"1\" 2"[..],
                "line 1: labels not separated by commas",
            ),
            (
                b"vllm:a 1\nvllm:a{x=1} 2",
                "line 2: a label value not in quotes",
            ),
            (b"vllm:a 2x", "line 1: the value is not a number"),
            (b"vllm:a", "line 1: no value"),
            (
                b"vllm:a{x=\"1\"y=\"2\"} 1",
                "line 1: labels not separated by commas",
            ),
            (b"vllm:a{x=\"1} 1", "line 1: an unterminated label value"),
            (b"vllm:a{=\"1\"} 1", "line 1: an empty label name"),
            (b"vllm:a{x} 1", "line 1: a label without a value"),
            (b"\xff", "the exposition is not UTF-8"),
        ] {
            let e = parse(bad, 10, |_| true, |_| true)
                .map(|s| s.series.len())
                .expect_err(&String::from_utf8_lossy(bad));
            assert!(
                matches!(e, Error::Decode(_)) && e.to_string().contains(why),
                "{:?}: {e}",
                String::from_utf8_lossy(bad)
            );
        }
        // A malformed line of an unwanted family is skipped, not refused.
        assert_eq!(
            parse(b"other{x=1} 2\nvllm:a 1", 10, |n| n == "vllm:a", |_| true)
                .unwrap()
                .series
                .len(),
            1
        );
        let many: String = (0..11)
            .map(|i| format!("vllm:a{{i=\"{i}\"}} 1\n"))
            .collect();
        assert!(matches!(
            parse(many.as_bytes(), 10, |_| true, |_| true),
            Err(Error::OverLimit {
                reason: Rejection::SeriesLimit,
                ..
            })
        ));
    }

    /// A sample with more labels than the bound is refused and counted, the others
    /// kept; only the labels asked for are copied out.
    #[test]
    fn a_sample_over_the_label_bound_is_refused_and_only_kept_labels_copied() {
        let labels = |n: usize| {
            (0..n)
                .map(|i| format!("l{i}=\"v\""))
                .collect::<Vec<_>>()
                .join(",")
        };
        let body = format!(
            "vllm:a{{{}}} 1\nvllm:a{{le=\"1\",{}}} 2\nvllm:a{{le=\"2\"}} 3\n",
            labels(MAX_LABELS_PER_SERIES + 1),
            labels(MAX_LABELS_PER_SERIES - 1)
        );
        let decoded = parse(body.as_bytes(), 10, |_| true, |l| l == "le").unwrap();
        assert_eq!(decoded.over_labels, 1);
        let got: Vec<(&[(String, String)], f64)> = decoded
            .series
            .iter()
            .map(|s| (s.labels.as_slice(), s.value))
            .collect();
        let le = |v: &str| vec![("le".to_string(), v.to_string())];
        assert_eq!(got, [(&le("1")[..], 2.0), (&le("2")[..], 3.0)]);
    }

    /// Two engines' series that differ only in a label the decoder does not keep are
    /// both kept (they are summed later); the same series twice, in any label order, is
    /// kept once and counted.
    #[test]
    fn exact_duplicates_are_dropped_whatever_labels_are_kept() {
        let keep_none = |_: &str| false;
        let body = b"q{engine=\"0\",m=\"a\"} 1\nq{engine=\"1\",m=\"a\"} 2\nq{m=\"a\",engine=\"0\"} 1\nq 5\nq 5\n";
        let d = parse(body, 10, |_| true, keep_none).unwrap();
        let values: Vec<f64> = d.series.iter().map(|s| s.value).collect();
        assert_eq!(values, [1.0, 2.0, 5.0]);
        assert!(
            d.series.iter().all(|s| s.labels.is_empty()),
            "no label kept"
        );
        assert_eq!(d.duplicates, 2);
    }
}
