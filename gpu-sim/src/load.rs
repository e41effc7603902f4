//! Load patterns: utilisation in percent as a function of scenario time, each with a
//! closed-form integral so that energy and byte counters are exact at any instant and do
//! not depend on how often anyone samples.

use serde::{Deserialize, Serialize};
use std::f64::consts::TAU;

/// Utilisation over time, in percent (0–100).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Load {
    /// No work at all.
    Idle,
    /// A fixed utilisation.
    Constant { percent: f64 },
    /// `min..max` along a sine wave.
    Sine {
        min: f64,
        max: f64,
        period_s: f64,
        #[serde(default)]
        phase_s: f64,
    },
    /// `high` for `duty` of each period, `low` for the rest (batch jobs).
    Square {
        low: f64,
        high: f64,
        period_s: f64,
        #[serde(default = "half")]
        duty: f64,
        #[serde(default)]
        phase_s: f64,
    },
}

fn half() -> f64 {
    0.5
}

impl Default for Load {
    fn default() -> Self {
        Load::Sine {
            min: 20.0,
            max: 95.0,
            period_s: 300.0,
            phase_s: 0.0,
        }
    }
}

impl Load {
    /// Utilisation at `t` seconds, clamped to 0–100.
    pub fn at(&self, t: f64) -> f64 {
        let v = match *self {
            Load::Idle => 0.0,
            Load::Constant { percent } => percent,
            Load::Sine {
                min,
                max,
                period_s,
                phase_s,
            } => {
                let mid = (min + max) / 2.0;
                let amp = (max - min) / 2.0;
                mid + amp * (TAU * (t + phase_s) / period_s.max(1e-9)).sin()
            }
            Load::Square {
                low,
                high,
                period_s,
                duty,
                phase_s,
            } => {
                let p = period_s.max(1e-9);
                let pos = (t + phase_s).rem_euclid(p) / p;
                if pos < duty { high } else { low }
            }
        };
        v.clamp(0.0, 100.0)
    }

    /// ∫₀ᵗ at(τ) dτ in percent·seconds. Exact for the unclamped pattern; scenarios keep
    /// their parameters inside 0–100, which [`crate::Scenario::validate`] checks.
    pub fn integral(&self, t: f64) -> f64 {
        match *self {
            Load::Idle => 0.0,
            Load::Constant { percent } => percent * t,
            Load::Sine {
                min,
                max,
                period_s,
                phase_s,
            } => {
                let mid = (min + max) / 2.0;
                let amp = (max - min) / 2.0;
                let w = TAU / period_s.max(1e-9);
                mid * t + amp / w * ((w * phase_s).cos() - (w * (t + phase_s)).cos())
            }
            Load::Square {
                low,
                high,
                period_s,
                duty,
                phase_s,
            } => {
                let p = period_s.max(1e-9);
                // Time spent "high" in [0, x): whole periods plus the part of the last one.
                let high_time = |x: f64| {
                    let whole = (x / p).floor();
                    let rest = x - whole * p;
                    whole * duty * p + rest.min(duty * p)
                };
                let h = high_time(t + phase_s) - high_time(phase_s);
                high * h + low * (t - h)
            }
        }
    }

    /// The same pattern started `delay_s` later.
    pub fn delayed(&self, delay_s: f64) -> Load {
        let mut l = self.clone();
        match &mut l {
            Load::Sine { phase_s, .. } | Load::Square { phase_s, .. } => *phase_s -= delay_s,
            Load::Idle | Load::Constant { .. } => {}
        }
        l
    }

    /// The bounds every parameter must respect.
    pub(crate) fn check(&self) -> Result<(), String> {
        let in_range = |v: f64| (0.0..=100.0).contains(&v);
        match *self {
            Load::Idle => Ok(()),
            Load::Constant { percent } if in_range(percent) => Ok(()),
            Load::Sine {
                min, max, period_s, ..
            } if in_range(min) && in_range(max) && min <= max && period_s > 0.0 => Ok(()),
            Load::Square {
                low,
                high,
                period_s,
                duty,
                ..
            } if in_range(low)
                && in_range(high)
                && period_s > 0.0
                && (0.0..=1.0).contains(&duty) =>
            {
                Ok(())
            }
            _ => Err(format!(
                "load {self:?}: percentages must lie in 0..=100, min <= max, period_s > 0 and duty in 0..=1"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric_integral(l: &Load, t: f64) -> f64 {
        let n = 200_000;
        let dt = t / n as f64;
        (0..n).map(|i| l.at((i as f64 + 0.5) * dt) * dt).sum()
    }

    #[test]
    fn closed_form_integrals_match_numeric_integration() {
        let loads = [
            Load::Constant { percent: 42.0 },
            Load::Sine {
                min: 10.0,
                max: 90.0,
                period_s: 37.0,
                phase_s: 5.0,
            },
            Load::Square {
                low: 5.0,
                high: 80.0,
                period_s: 10.0,
                duty: 0.3,
                phase_s: 2.5,
            },
        ];
        for l in &loads {
            for t in [0.0, 1.0, 13.7, 100.0, 333.3] {
                let exact = l.integral(t);
                let approx = numeric_integral(l, t);
                assert!(
                    (exact - approx).abs() < 0.05 + approx.abs() * 1e-4,
                    "{l:?} at {t}: {exact} vs {approx}"
                );
            }
        }
    }

    #[test]
    fn out_of_range_parameters_are_rejected() {
        assert!(Load::Constant { percent: 101.0 }.check().is_err());
        assert!(
            Load::Sine {
                min: 50.0,
                max: 10.0,
                period_s: 1.0,
                phase_s: 0.0
            }
            .check()
            .is_err()
        );
        assert!(Load::default().check().is_ok());
    }
}
