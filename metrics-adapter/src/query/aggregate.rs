//! How a workload's per-pod values combine into one: `sum`, `avg` (`average`), `max`,
//! `min`, and percentiles `pNN` (`p50`, `p95`, `p99`, `p99.9`, ...).
//!
//! A percentile is Prometheus' `quantile()` over the pods (and numpy's default): the
//! values sorted, rank `h = (n - 1) · q`, linear interpolation between the values at
//! `floor(h)` and `ceil(h)`. So `p0` is the minimum, `p100` the maximum and `p50` the
//! median, and one pod's value is every percentile of one pod.
//!
//! Selected by a suffix on the metric name, `gpu_utilization:p95` (external metrics,
//! custom metrics of workloads and namespaces, metrics-api, KEDA), or by KEDA's
//! `aggregation` key. `:` because no metric name has one, and a Kubernetes metric name
//! may (the HPA only refuses `/` and `%`).

use std::fmt;

/// How per-pod values combine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Aggregation {
    Sum,
    Average,
    Max,
    Min,
    /// The q-quantile, 0 ≤ q ≤ 1.
    Quantile(f64),
}

impl Aggregation {
    /// `sum`, `avg`/`average`, `max`, `min`, `pNN`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Aggregation> {
        Some(match text {
            "sum" => Aggregation::Sum,
            "avg" | "average" => Aggregation::Average,
            "max" => Aggregation::Max,
            "min" => Aggregation::Min,
            _ => {
                let p: f64 = text.strip_prefix('p')?.parse().ok()?;
                if !(0.0..=100.0).contains(&p) || text.contains(['e', 'E', '+', '-']) {
                    return None;
                }
                Aggregation::Quantile(p / 100.0)
            }
        })
    }

    /// The values combined; `None` when there are none, or when the result is not a
    /// finite number: finite values whose sum overflows have no sum, like missing
    /// data, never ±Inf. The mean and percentiles of finite values are always finite
    /// (computed so that no step overflows); so are max and min.
    pub fn apply(self, values: &[f64]) -> Option<f64> {
        if values.is_empty() {
            return None;
        }
        let v = match self {
            Aggregation::Sum => values.iter().sum(),
            // Each value divided first: the sum of n values near f64::MAX overflows,
            // their mean does not.
            Aggregation::Average => {
                let n = values.len() as f64;
                let sum: f64 = values.iter().sum();
                if sum.is_finite() {
                    sum / n
                } else {
                    values.iter().map(|v| v / n).sum()
                }
            }
            Aggregation::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Aggregation::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
            Aggregation::Quantile(q) => {
                let mut sorted = values.to_vec();
                sorted.sort_by(f64::total_cmp);
                let rank = (sorted.len() - 1) as f64 * q;
                let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
                let (a, b, frac) = (sorted[lo], sorted[hi], rank - lo as f64);
                let gap = b - a;
                if gap.is_finite() {
                    a + frac * gap
                } else {
                    // -1e308 to 1e308: the gap overflows, the weighted mean does not.
                    a * (1.0 - frac) + b * frac
                }
            }
        };
        v.is_finite().then_some(v)
    }
}

impl fmt::Display for Aggregation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Aggregation::Sum => f.write_str("sum"),
            Aggregation::Average => f.write_str("avg"),
            Aggregation::Max => f.write_str("max"),
            Aggregation::Min => f.write_str("min"),
            Aggregation::Quantile(q) => write!(f, "p{}", q * 100.0),
        }
    }
}

/// `name:aggregation` split; `Err` names a suffix that is no aggregation.
pub fn split_suffix(name: &str) -> Result<(&str, Option<Aggregation>), NotAnAggregation> {
    match name.rsplit_once(':') {
        None => Ok((name, None)),
        Some((base, suffix)) => match Aggregation::parse(suffix) {
            Some(a) => Ok((base, Some(a))),
            None => Err(NotAnAggregation {
                requested: name.to_string(),
                suffix: suffix.to_string(),
            }),
        },
    }
}

/// A metric name's `:suffix` that names no aggregation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{requested}: {suffix:?} is not an aggregation (sum, avg, max, min, p0 to p100, e.g. p95)")]
pub struct NotAnAggregation {
    pub requested: String,
    pub suffix: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle: the q-quantile as the smallest interval of the empirical CDF
    /// (independent of the sort-and-interpolate above): for each candidate position
    /// between two order statistics, the fraction of values strictly below.
    fn oracle(values: &[f64], q: f64) -> f64 {
        // Count, for each value, how many are smaller and how many equal: its
        // order statistics span ranks [below, below + equal - 1].
        let n = values.len();
        let rank = (n - 1) as f64 * q;
        let kth = |k: usize| -> f64 {
            *values
                .iter()
                .find(|v| {
                    let below = values.iter().filter(|w| w < v).count();
                    let equal = values.iter().filter(|w| w == v).count();
                    below <= k && k < below + equal
                })
                .expect("some value holds rank k")
        };
        let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
        let frac = rank - rank.floor();
        kth(lo) * (1.0 - frac) + kth(hi) * frac
    }

    #[test]
    fn percentiles_match_an_independent_rank_computation() {
        // Deterministic pseudo-random sets of 1 to 40 values, with ties.
        let mut seed = 0x2545_f491_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for n in 1..=40 {
            let values: Vec<f64> = (0..n).map(|_| (next() % 50) as f64 * 1.5).collect();
            for p in ["p0", "p50", "p90", "p95", "p99", "p99.9", "p100"] {
                let a = Aggregation::parse(p).unwrap();
                let Aggregation::Quantile(q) = a else {
                    panic!("{p}")
                };
                let got = a.apply(&values).unwrap();
                let want = oracle(&values, q);
                assert!(
                    (got - want).abs() < 1e-9,
                    "{p} of {values:?}: {got} vs {want}"
                );
            }
            let max = values.iter().copied().fold(f64::MIN, f64::max);
            let min = values.iter().copied().fold(f64::MAX, f64::min);
            assert_eq!(
                Aggregation::parse("p100").unwrap().apply(&values),
                Some(max)
            );
            assert_eq!(Aggregation::parse("p0").unwrap().apply(&values), Some(min));
        }
        // numpy.percentile([1, 2, 3, 4], 95) == 3.85 (linear interpolation).
        let got = Aggregation::parse("p95")
            .unwrap()
            .apply(&[4.0, 1.0, 3.0, 2.0]);
        assert!((got.unwrap() - 3.85).abs() < 1e-12, "{got:?}");
        assert_eq!(Aggregation::Sum.apply(&[]), None);
    }

    /// Issue 27: values near f64::MAX. A sum that overflows has no value; the mean
    /// and every percentile stay finite and between the extremes; non-finite results
    /// are never answered.
    #[test]
    fn finite_values_never_combine_into_an_infinity_or_nan() {
        let big = [1e308, 1e308, -1e308, 5.0];
        assert_eq!(Aggregation::Sum.apply(&[1e308, 1e308]), None);
        assert_eq!(Aggregation::Sum.apply(&[-1e308, -1e308]), None);
        // A partial sum that overflows is no value either, though a later term would
        // bring it back.
        assert_eq!(Aggregation::Sum.apply(&big[..3]), None);
        assert_eq!(Aggregation::Sum.apply(&[1e308, -1e308, 5.0]), Some(5.0));
        let mean = Aggregation::Average.apply(&[1e308, 1e308]).unwrap();
        assert_eq!(mean, 1e308);
        let mean = Aggregation::Average.apply(&big).unwrap();
        // (1e308 + 1e308 - 1e308 + 5) / 4, computed exactly by the oracle in parts.
        assert!((mean - 1e308 / 4.0).abs() <= 1e292, "{mean}");
        for p in ["p0", "p10", "p50", "p95", "p99.9", "p100"] {
            let a = Aggregation::parse(p).unwrap();
            let v = a.apply(&big).unwrap_or_else(|| panic!("{p}: no value"));
            assert!((-1e308..=1e308).contains(&v), "{p}: {v}");
        }
        // p50 of [-1e308, 5, 1e308, 1e308]: rank 1.5, half-way between 5 and 1e308.
        let p50 = Aggregation::parse("p50").unwrap().apply(&big).unwrap();
        assert_eq!(p50, 5.0 * 0.5 + 1e308 * 0.5);
        // p25 of [-1e308, 1e308]: the gap overflows, the weighted mean is 0.5e308 below.
        let p25 = Aggregation::parse("p25")
            .unwrap()
            .apply(&[1e308, -1e308])
            .unwrap();
        assert_eq!(p25, -1e308 * 0.75 + 1e308 * 0.25);
        assert_eq!(Aggregation::Max.apply(&big), Some(1e308));
        assert_eq!(Aggregation::Min.apply(&big), Some(-1e308));
    }

    #[test]
    fn suffixes_parse_and_bad_ones_are_named() {
        assert_eq!(
            split_suffix("gpu_utilization:p95"),
            Ok(("gpu_utilization", Some(Aggregation::Quantile(0.95))))
        );
        assert_eq!(split_suffix("pressure"), Ok(("pressure", None)));
        assert_eq!(split_suffix("x:avg"), Ok(("x", Some(Aggregation::Average))));
        for bad in ["x:p101", "x:median", "x:p-1", "x:p", "x:p1e1"] {
            let e = split_suffix(bad).unwrap_err().to_string();
            assert!(e.contains("not an aggregation"), "{bad}: {e}");
        }
    }
}
