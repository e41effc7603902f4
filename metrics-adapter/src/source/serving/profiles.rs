//! The built-in engine profiles: which of an engine's own metrics give each serving
//! signal. The engine is recognised from its families' name prefix; names are the
//! engines' own (the fixtures name the source file each comes from).
//!
//! | signal | vLLM | SGLang | TGI | Triton |
//! |---|---|---|---|---|
//! | waiting | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` | `tgi_queue_size` | `nv_inference_pending_request_count` |
//! | running | `vllm:num_requests_running` | `sglang:num_running_reqs` | `tgi_batch_current_size` | `nv_trt_llm_request_metrics{request_type="active"}` (TensorRT-LLM backend) |
//! | KV cache (0–1) | `vllm:kv_cache_usage_perc`, older `vllm:gpu_cache_usage_perc` | `sglang:token_usage` | `tgi_batch_current_max_tokens` / `max_batch_total_tokens` from the engine's `GET /info` ([`super::info`]) | `nv_trt_llm_kv_cache_block_metrics`: `fraction`, else `used`/`max` |
//! | tokens (counter) | `vllm:generation_tokens_total` | `sglang:generation_tokens_total` | `tgi_request_generated_tokens_sum` | none |
//! | TTFT (histogram) | `vllm:time_to_first_token_seconds` | `sglang:time_to_first_token_seconds` | none | `nv_inference_first_response_histogram_ms` |
//!
//! Over several series of one family (models, data-parallel engines): counts and
//! tokens are summed, ratios averaged, histogram buckets summed per bound.

use super::super::derive::Series;

/// The labels the profiles read: histogram buckets and the sub-series they select.
pub const LABELS: [&str; 3] = ["le", "kv_cache_block_type", "request_type"];

/// A serving engine the adapter knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    Vllm,
    Sglang,
    Tgi,
    Triton,
}

impl Engine {
    pub const ALL: [Engine; 4] = [Engine::Vllm, Engine::Sglang, Engine::Tgi, Engine::Triton];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Tgi => "tgi",
            Engine::Triton => "triton",
        }
    }

    /// The name prefixes of the engine's own families.
    fn prefixes(self) -> &'static [&'static str] {
        match self {
            Engine::Vllm => &["vllm:"],
            Engine::Sglang => &["sglang:"],
            Engine::Tgi => &["tgi_"],
            Engine::Triton => &["nv_inference_", "nv_trt_llm_"],
        }
    }

    /// The engine whose family `name` is, if any.
    pub fn of_family(name: &str) -> Option<Engine> {
        Engine::ALL
            .into_iter()
            .find(|e| e.prefixes().iter().any(|p| name.starts_with(p)))
    }

    /// The sample names the profile reads.
    pub fn wants(self, name: &str) -> bool {
        let families: &[&str] = match self {
            Engine::Vllm => &[
                "vllm:num_requests_waiting",
                "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "vllm:generation_tokens_total",
                "vllm:time_to_first_token_seconds_bucket",
            ],
            Engine::Sglang => &[
                "sglang:num_queue_reqs",
                "sglang:num_running_reqs",
                "sglang:token_usage",
                "sglang:generation_tokens_total",
                "sglang:time_to_first_token_seconds_bucket",
            ],
            Engine::Tgi => &[
                "tgi_queue_size",
                "tgi_batch_current_size",
                "tgi_batch_current_max_tokens",
                "tgi_request_generated_tokens_sum",
            ],
            Engine::Triton => &[
                "nv_inference_pending_request_count",
                "nv_trt_llm_request_metrics",
                "nv_trt_llm_kv_cache_block_metrics",
                "nv_inference_first_response_histogram_ms_bucket",
            ],
        };
        families.contains(&name)
    }

    /// The signals in one scrape's series of this engine.
    pub fn signals(self, series: &[Series]) -> Signals {
        let f = |name: &'static str| Family { series, name };
        match self {
            Engine::Vllm => Signals {
                waiting: f("vllm:num_requests_waiting").sum(None),
                running: f("vllm:num_requests_running").sum(None),
                kv_cache: f("vllm:kv_cache_usage_perc")
                    .mean(None)
                    .or_else(|| f("vllm:gpu_cache_usage_perc").mean(None)),
                kv_cache_tokens: None,
                tokens_total: f("vllm:generation_tokens_total").sum(None),
                ttft: f("vllm:time_to_first_token_seconds_bucket").buckets(1.0),
            },
            Engine::Sglang => Signals {
                waiting: f("sglang:num_queue_reqs").sum(None),
                running: f("sglang:num_running_reqs").sum(None),
                kv_cache: f("sglang:token_usage").mean(None),
                kv_cache_tokens: None,
                tokens_total: f("sglang:generation_tokens_total").sum(None),
                ttft: f("sglang:time_to_first_token_seconds_bucket").buckets(1.0),
            },
            Engine::Tgi => Signals {
                waiting: f("tgi_queue_size").sum(None),
                running: f("tgi_batch_current_size").sum(None),
                // The ratio needs the capacity from /info: the reader divides.
                kv_cache: None,
                kv_cache_tokens: f("tgi_batch_current_max_tokens").sum(None),
                tokens_total: f("tgi_request_generated_tokens_sum").sum(None),
                ttft: None,
            },
            Engine::Triton => {
                let blocks = f("nv_trt_llm_kv_cache_block_metrics");
                let kv_cache = blocks
                    .mean(Some(("kv_cache_block_type", "fraction")))
                    .or_else(|| {
                        let used = blocks.sum(Some(("kv_cache_block_type", "used")))?;
                        let max = blocks.sum(Some(("kv_cache_block_type", "max")))?;
                        (max > 0.0).then(|| used / max)
                    });
                Signals {
                    waiting: f("nv_inference_pending_request_count").sum(None),
                    running: f("nv_trt_llm_request_metrics").sum(Some(("request_type", "active"))),
                    kv_cache,
                    kv_cache_tokens: None,
                    tokens_total: None,
                    // Milliseconds.
                    ttft: f("nv_inference_first_response_histogram_ms_bucket").buckets(1e-3),
                }
            }
        }
    }
}

/// The KV-cache families that are a usage ratio, 0 to 1.
const RATIOS: [&str; 3] = [
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
];

/// Whether a sample of a family a profile reads is in the range its meaning allows:
/// every one is a count, a queue, a token total, a histogram bucket or a ratio, so
/// none is negative; the KV-cache ratios are at most 1; a time-to-first-token bucket's
/// bound is not negative. Samples of other families (user mappings) may be any finite
/// number.
pub fn in_range(s: &Series) -> bool {
    if !Engine::of_family(&s.name).is_some_and(|e| e.wants(&s.name)) {
        return true;
    }
    let ratio = RATIOS.contains(&s.name.as_str())
        || (s.name == "nv_trt_llm_kv_cache_block_metrics"
            && s.label("kv_cache_block_type") == Some("fraction"));
    let bound_ok = !s.name.ends_with("_bucket")
        || match s.label("le") {
            Some("+Inf" | "Inf") | None => true,
            Some(le) => le.parse::<f64>().is_ok_and(|le| le >= 0.0),
        };
    s.value >= 0.0 && (!ratio || s.value <= 1.0) && bound_ok
}

/// What one scrape of an engine says, before rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Signals {
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_cache: Option<f64>,
    /// KV-cache tokens held, where the engine exports no ratio (TGI): the usage is
    /// this over the capacity ([`kv_usage`]).
    pub kv_cache_tokens: Option<f64>,
    /// Generated tokens so far (a counter).
    pub tokens_total: Option<f64>,
    /// Time-to-first-token histogram: cumulative (upper bound in seconds, count),
    /// sorted by bound, the last +Inf.
    pub ttft: Option<Vec<(f64, f64)>>,
}

/// KV-cache usage from the tokens held and the cache's capacity in tokens, 0 to 1;
/// None without both (never an invented 0).
pub fn kv_usage(tokens: Option<f64>, capacity: Option<f64>) -> Option<f64> {
    let (tokens, capacity) = (tokens?, capacity?);
    (capacity > 0.0 && tokens.is_finite()).then(|| (tokens / capacity).clamp(0.0, 1.0))
}

/// The series of one family in a scrape.
struct Family<'a> {
    series: &'a [Series],
    name: &'a str,
}

impl Family<'_> {
    fn values<'s>(&'s self, matcher: Option<(&'s str, &'s str)>) -> impl Iterator<Item = f64> + 's {
        self.series
            .iter()
            .filter(move |s| s.name == self.name)
            .filter(move |s| matcher.is_none_or(|(k, v)| s.label(k) == Some(v)))
            .map(|s| s.value)
            .filter(|v| v.is_finite())
    }

    fn sum(&self, matcher: Option<(&str, &str)>) -> Option<f64> {
        self.values(matcher)
            .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
    }

    fn mean(&self, matcher: Option<(&str, &str)>) -> Option<f64> {
        let (sum, n) = self
            .values(matcher)
            .fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
        (n > 0).then(|| sum / f64::from(n))
    }

    /// The family's buckets summed per bound, bounds scaled by `unit` to seconds.
    fn buckets(&self, unit: f64) -> Option<Vec<(f64, f64)>> {
        let mut out: Vec<(f64, f64)> = Vec::new();
        for s in self.series.iter().filter(|s| s.name == self.name) {
            let Some(le) = s.label("le").and_then(|le| match le {
                "+Inf" | "Inf" => Some(f64::INFINITY),
                _ => le.parse::<f64>().ok(),
            }) else {
                continue;
            };
            if !s.value.is_finite() {
                continue;
            }
            let le = le * unit;
            match out.iter_mut().find(|(b, _)| *b == le) {
                Some(slot) => slot.1 += s.value,
                None => out.push((le, s.value)),
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        (out.last().is_some_and(|(le, _)| le.is_infinite())).then_some(out)
    }
}

/// The `q` quantile of cumulative `buckets` (as PromQL's `histogram_quantile`: linear
/// within the bucket holding the rank; the largest finite bound if it falls in +Inf).
/// None without observations.
pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            if count == lower.1 {
                return Some(le);
            }
            let start = if lower.0 == 0.0 && le < 0.0 {
                le
            } else {
                lower.0
            };
            return Some(start + (le - start) * (rank - lower.1) / (count - lower.1));
        }
        lower = (le, count);
    }
    None
}

/// The observations between two cumulative histograms of the same layout, or None
/// (layouts differ, or the counts fell: the engine restarted).
pub fn delta(now: &[(f64, f64)], before: &[(f64, f64)]) -> Option<Vec<(f64, f64)>> {
    if now.len() != before.len() {
        return None;
    }
    now.iter()
        .zip(before)
        .map(|(&(le, n), &(le0, n0))| (le == le0 && n >= n0).then_some((le, n - n0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::serving::text;

    fn signals_of(fixture: &str) -> (Engine, Signals) {
        let mut engines = Vec::new();
        let wanted = |n: &str| match Engine::of_family(n) {
            Some(e) => {
                if !engines.contains(&e) {
                    engines.push(e);
                }
                e.wants(n)
            }
            None => false,
        };
        let series = text::parse(fixture.as_bytes(), 10_000, wanted, |l| LABELS.contains(&l))
            .unwrap()
            .series;
        assert_eq!(engines.len(), 1, "one engine recognised: {engines:?}");
        (engines[0], engines[0].signals(&series))
    }

    /// Each fixture is the engine's real exposition (names from the file its header
    /// cites); the expected signals are read off the fixture's own lines.
    #[test]
    fn vllm_profile_reads_its_fixture() {
        let (engine, s) = signals_of(include_str!("fixtures/vllm.txt"));
        assert_eq!(engine, Engine::Vllm);
        assert_eq!(s.waiting, Some(5.0 + 2.0), "summed over the two engines");
        assert_eq!(s.running, Some(3.0 + 1.0));
        assert_eq!(s.kv_cache, Some((0.25 + 0.75) / 2.0), "averaged");
        assert_eq!(s.tokens_total, Some(1200.0 + 300.0));
        let ttft = s.ttft.unwrap();
        assert_eq!(ttft.last(), Some(&(f64::INFINITY, 10.0 + 4.0)));
    }

    #[test]
    fn older_vllm_names_the_kv_cache_gpu_cache_usage_perc() {
        let (_, s) = signals_of(include_str!("fixtures/vllm-v0.txt"));
        assert_eq!(s.kv_cache, Some(0.42));
        assert_eq!(s.waiting, Some(9.0));
    }

    #[test]
    fn sglang_profile_reads_its_fixture() {
        let (engine, s) = signals_of(include_str!("fixtures/sglang.txt"));
        assert_eq!(engine, Engine::Sglang);
        assert_eq!(s.waiting, Some(6.0));
        assert_eq!(s.running, Some(12.0));
        assert_eq!(s.kv_cache, Some(0.28));
        assert_eq!(s.tokens_total, Some(7557572.0));
        assert_eq!(s.ttft.unwrap().last(), Some(&(f64::INFINITY, 50.0)));
    }

    #[test]
    fn tgi_profile_reads_its_fixture_and_its_kv_cache_needs_the_capacity() {
        let (engine, s) = signals_of(include_str!("fixtures/tgi.txt"));
        assert_eq!(engine, Engine::Tgi);
        assert_eq!(s.waiting, Some(8.0));
        assert_eq!(s.running, Some(4.0));
        assert_eq!(s.tokens_total, Some(5120.0));
        assert_eq!((s.kv_cache, s.ttft), (None, None));
        // The fixture's tgi_batch_current_max_tokens over /info's max_batch_total_tokens.
        assert_eq!(s.kv_cache_tokens, Some(2048.0));
        assert_eq!(kv_usage(s.kv_cache_tokens, Some(16384.0)), Some(0.125));
        assert_eq!(
            kv_usage(s.kv_cache_tokens, None),
            None,
            "no capacity, no value"
        );
        assert_eq!(
            kv_usage(s.kv_cache_tokens, Some(1024.0)),
            Some(1.0),
            "clamped"
        );
        assert_eq!(kv_usage(None, Some(16384.0)), None);
    }

    #[test]
    fn triton_profile_reads_its_fixture() {
        let (engine, s) = signals_of(include_str!("fixtures/triton.txt"));
        assert_eq!(engine, Engine::Triton);
        assert_eq!(s.waiting, Some(3.0 + 1.0), "pending over both models");
        assert_eq!(s.running, Some(2.0));
        assert_eq!(s.kv_cache, Some(0.5), "the fraction block type");
        let ttft = s.ttft.unwrap();
        assert_eq!(ttft[0], (0.1, 1.0), "milliseconds to seconds");
        // Without the fraction, used over max.
        let older = include_str!("fixtures/triton.txt").replace(
            "kv_cache_block_type=\"fraction\"",
            "kv_cache_block_type=\"other\"",
        );
        let (_, s) = signals_of(&older);
        assert_eq!(s.kv_cache, Some(1560.0 / 6240.0));
    }

    #[test]
    fn quantiles_interpolate_like_histogram_quantile() {
        let b = [(0.1, 0.0), (0.5, 50.0), (1.0, 90.0), (f64::INFINITY, 100.0)];
        // p50: rank 50 at the top of (0.1, 0.5].
        assert!((quantile(0.5, &b).unwrap() - 0.5).abs() < 1e-12);
        // p25: rank 25, halfway through (0.1, 0.5].
        assert!((quantile(0.25, &b).unwrap() - 0.3).abs() < 1e-12);
        // p95: in +Inf: the largest finite bound.
        assert_eq!(quantile(0.95, &b), Some(1.0));
        assert_eq!(quantile(0.5, &[(1.0, 0.0), (f64::INFINITY, 0.0)]), None);
        let before = [(0.1, 0.0), (0.5, 40.0), (1.0, 80.0), (f64::INFINITY, 90.0)];
        assert_eq!(
            delta(&b, &before),
            Some(vec![
                (0.1, 0.0),
                (0.5, 10.0),
                (1.0, 10.0),
                (f64::INFINITY, 10.0)
            ])
        );
        assert_eq!(delta(&before, &b), None, "a restart");
    }
}
