//! Fans of actively cooled boards: each runs at a speed that follows the GPU
//! temperature, from its minimum at 30 °C to full speed 40 °C later (a fan curve as
//! the VBIOS applies it); boards without fans report none.

use crate::SimNode;

/// Lowest and highest fan speed, percent of the fan's maximum.
pub const FAN_MIN_PERCENT: u32 = 30;
pub const FAN_MAX_PERCENT: u32 = 100;
/// Fan speed at 100 %, RPM.
pub const FAN_MAX_RPM: u32 = 3600;

impl SimNode {
    /// Fans on GPU `gpu`.
    pub fn fans(&self, gpu: u32) -> u32 {
        self.gpus[gpu as usize].model.board.fans
    }

    /// Speed of fan `fan` of GPU `gpu` at `t`, percent; `None` for a fan the board lacks.
    /// Later fans run a few percent faster than the first (they cool the hotter end).
    pub fn fan_speed_percent(&self, gpu: u32, fan: u32, t: f64) -> Option<u32> {
        if fan >= self.fans(gpu) {
            return None;
        }
        let temp = f64::from(self.gpu_reading(gpu, t).gpu_temp_c);
        let curve = f64::from(FAN_MIN_PERCENT) + (temp - 30.0) * 70.0 / 40.0;
        let speed = curve.round() as i64 + 3 * i64::from(fan);
        Some(speed.clamp(FAN_MIN_PERCENT.into(), FAN_MAX_PERCENT.into()) as u32)
    }

    /// Speed of fan `fan` at `t`, RPM.
    pub fn fan_speed_rpm(&self, gpu: u32, fan: u32, t: f64) -> Option<u32> {
        self.fan_speed_percent(gpu, fan, t)
            .map(|p| p * FAN_MAX_RPM / 100)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Scenario, SimNode};

    #[test]
    fn a_fan_follows_the_temperature_within_its_range_and_fanless_boards_have_none() {
        let s = Scenario::parse_toml(
            "[[gpus]]\nmodel = \"NVIDIA RTX 6000 Ada Generation\"\nload = { kind = \"sine\", min = 0, max = 100, period_s = 100 }\n\
             [[gpus]]\nmodel = \"NVIDIA H100 80GB HBM3\"\n",
            "t",
        )
        .expect("scenario");
        let n = SimNode::new(&s, std::time::SystemTime::UNIX_EPOCH);
        assert_eq!((n.fans(0), n.fans(1)), (1, 0));
        assert_eq!(n.fan_speed_percent(1, 0, 0.0), None);
        assert_eq!(n.fan_speed_percent(0, 1, 0.0), None);
        let (mut lo, mut hi) = (u32::MAX, 0);
        for t in 0..100 {
            let t = f64::from(t);
            let speed = n.fan_speed_percent(0, 0, t).expect("one fan");
            assert!((30..=100).contains(&speed), "{speed}");
            // Hotter never means slower.
            let temp = n.gpu_reading(0, t).gpu_temp_c;
            for u in 0..100 {
                let u = f64::from(u);
                if n.gpu_reading(0, u).gpu_temp_c > temp {
                    assert!(n.fan_speed_percent(0, 0, u).unwrap() >= speed);
                }
            }
            lo = lo.min(speed);
            hi = hi.max(speed);
            assert_eq!(n.fan_speed_rpm(0, 0, t), Some(speed * 3600 / 100));
        }
        assert!(hi > lo, "the fan speed moves with the load: {lo}..{hi}");
    }
}
