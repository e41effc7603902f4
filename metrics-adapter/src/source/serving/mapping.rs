//! User-defined serving metrics (`--serving-metric`), for engines or signals the
//! built-in profiles do not cover:
//!
//! `NAME=FAMILY{LABEL="VALUE",LABEL!="VALUE"}:AGGREGATION`
//!
//! - `NAME`: the metric served, lower case, digits and `_`, not a built-in name;
//! - `FAMILY`: the sample name in the engine's exposition (a counter's `_total`
//!   included, a histogram's `_sum` or `_count`);
//! - label matchers, optional: equal, or not equal;
//! - `AGGREGATION` over the matching series of one pod: `sum`, `avg`, `max`, `min`, or
//!   `rate` (the sum's increase per second between two scrapes, for counters).
//!
//! e.g. `--serving-metric 'llama_queue=my_engine_queue_depth{model="llama"}:sum'`.

use super::super::derive::Series;
use crate::error::Error;

/// How a mapping combines the matching series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    Sum,
    Avg,
    Max,
    Min,
    Rate,
}

/// One label matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub label: String,
    pub value: String,
    pub equal: bool,
}

/// One `--serving-metric`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    pub name: String,
    pub family: String,
    pub matchers: Vec<Matcher>,
    pub aggregation: Aggregation,
}

fn valid_family(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parse one `--serving-metric`; `reserved` names are taken (the built-in metrics).
pub fn parse(text: &str, reserved: &[&str]) -> Result<Mapping, Error> {
    let bad = |why: String| {
        Error::Config(format!(
            "--serving-metric {text:?}: {why} (expected NAME=FAMILY{{LABEL=\"VALUE\",…}}:sum|avg|max|min|rate)"
        ))
    };
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| bad("no `=` after the name".into()))?;
    let name = name.trim();
    let name_ok = name.len() <= 100
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !name_ok {
        return Err(bad(format!(
            "the name {name:?} must start with a lower-case letter and hold only lower-case letters, digits and _"
        )));
    }
    if reserved.contains(&name) {
        return Err(bad(format!("{name:?} is a built-in metric")));
    }
    let (selector, aggregation) = rest
        .rsplit_once(':')
        .filter(|(_, agg)| !agg.contains('}') && !agg.contains('"'))
        .ok_or_else(|| bad("no `:AGGREGATION` at the end".into()))?;
    let aggregation = match aggregation.trim() {
        "sum" => Aggregation::Sum,
        "avg" => Aggregation::Avg,
        "max" => Aggregation::Max,
        "min" => Aggregation::Min,
        "rate" => Aggregation::Rate,
        other => {
            return Err(bad(format!(
                "the aggregation {other:?} is not one of sum, avg, max, min, rate"
            )));
        }
    };
    let selector = selector.trim();
    let (family, labels) = match selector.split_once('{') {
        Some((family, labels)) => (
            family.trim(),
            Some(
                labels
                    .strip_suffix('}')
                    .ok_or_else(|| bad("the label matchers do not end in `}`".into()))?,
            ),
        ),
        None => (selector, None),
    };
    if !valid_family(family) {
        return Err(bad(format!("{family:?} is not a metric name")));
    }
    let mut matchers = Vec::new();
    for part in labels.into_iter().flat_map(|l| l.split(',')) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (label, value, equal) = match part.split_once("!=") {
            Some((l, v)) => (l, v, false),
            None => {
                let (l, v) = part
                    .split_once('=')
                    .ok_or_else(|| bad(format!("the matcher {part:?} has no = or !=")))?;
                (l, v, true)
            }
        };
        let label = label.trim();
        if !valid_label(label) {
            return Err(bad(format!("{label:?} is not a label name")));
        }
        let value = value
            .trim()
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .filter(|v| !v.contains('"'))
            .ok_or_else(|| bad(format!("the value of {label:?} must be in double quotes")))?;
        matchers.push(Matcher {
            label: label.to_string(),
            value: value.to_string(),
            equal,
        });
    }
    Ok(Mapping {
        name: name.to_string(),
        family: family.to_string(),
        matchers,
        aggregation,
    })
}

/// Parse every `--serving-metric`, refusing duplicates.
pub fn parse_all(texts: &[String], reserved: &[&str]) -> Result<Vec<Mapping>, Error> {
    let mut out: Vec<Mapping> = Vec::new();
    for text in texts {
        let m = parse(text, reserved)?;
        if out.iter().any(|o| o.name == m.name) {
            return Err(Error::Config(format!(
                "--serving-metric: {:?} is defined twice",
                m.name
            )));
        }
        out.push(m);
    }
    Ok(out)
}

impl Mapping {
    fn matches(&self, s: &Series) -> bool {
        s.name == self.family
            && self
                .matchers
                .iter()
                .all(|m| (s.label(&m.label).unwrap_or("") == m.value) == m.equal)
    }

    /// The mapping over one scrape's series: for `rate`, the sum (the caller takes the
    /// rate across scrapes). None when no series matches.
    pub fn evaluate(&self, series: &[Series]) -> Option<f64> {
        let mut values = series
            .iter()
            .filter(|s| self.matches(s))
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .peekable();
        values.peek()?;
        Some(match self.aggregation {
            Aggregation::Sum | Aggregation::Rate => values.sum(),
            Aggregation::Max => values.fold(f64::MIN, f64::max),
            Aggregation::Min => values.fold(f64::MAX, f64::min),
            Aggregation::Avg => {
                let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
                sum / f64::from(n)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, labels: &[(&str, &str)], value: f64) -> Series {
        Series {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    #[test]
    fn mappings_parse_and_aggregate_their_matching_series() {
        let m = parse(
            r#"llama_queue=my:queue_depth{model="llama", shard!="b"}:sum"#,
            &["serving_requests_waiting"],
        )
        .unwrap();
        assert_eq!(m.family, "my:queue_depth");
        assert_eq!(m.matchers.len(), 2);
        let s = [
            series("my:queue_depth", &[("model", "llama"), ("shard", "a")], 3.0),
            series(
                "my:queue_depth",
                &[("model", "llama"), ("shard", "b")],
                100.0,
            ),
            series("my:queue_depth", &[("model", "llama")], 4.0),
            series("my:queue_depth", &[("model", "other")], 1000.0),
            series("my:other", &[("model", "llama")], 1000.0),
        ];
        assert_eq!(m.evaluate(&s), Some(7.0));
        let max = parse("q=my:queue_depth:max", &[]).unwrap();
        assert_eq!(max.evaluate(&s), Some(1000.0));
        let avg = parse(r#"q=my:queue_depth{model="llama"}:avg"#, &[]).unwrap();
        assert_eq!(avg.evaluate(&s), Some(107.0 / 3.0));
        let none = parse(r#"q=my:queue_depth{model="x"}:min"#, &[]).unwrap();
        assert_eq!(
            none.evaluate(&s),
            None,
            "no matching series is no value, not 0"
        );
    }

    #[test]
    fn bad_mappings_say_what_is_wrong() {
        for (text, why) in [
            ("noequals", "no `=`"),
            ("Q=x:sum", "must start with a lower-case"),
            ("serving_requests_waiting=x:sum", "built-in"),
            ("q=x", "no `:AGGREGATION`"),
            ("q=x:median", "not one of sum"),
            ("q=1x:sum", "not a metric name"),
            ("q=x{a=\"1\":sum", "do not end in"),
            ("q=x{a}:sum", "has no = or !="),
            ("q=x{a=1}:sum", "double quotes"),
            ("q=x{1a=\"1\"}:sum", "not a label name"),
        ] {
            let e = parse(text, &["serving_requests_waiting"])
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        let twice = ["q=x:sum".to_string(), "q=y:sum".to_string()];
        let e = parse_all(&twice, &[]).unwrap_err().to_string();
        assert_eq!(e, "--serving-metric: \"q\" is defined twice");
    }
}
