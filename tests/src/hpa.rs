//! The HPA's replica calculation (kubernetes/kubernetes:
//! pkg/controller/podautoscaler/replica_calculator.go, as summarised in the project's
//! Kubernetes reference §(d)), for checking what the adapter's answers make an HPA do.
//! Values are milli-units, as the HPA reads quantities (`MilliValue()`).

/// Default tolerance: no change while the usage ratio is within 10 % of 1.
pub const TOLERANCE: f64 = 0.1;

fn within(r: f64) -> bool {
    (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&r)
}

/// External or Object metric with an `AverageValue` target: the items' sum over the
/// target times the current replicas.
pub fn average_value(current: i64, items_milli: &[i64], target_milli: i64) -> i64 {
    let usage: i64 = items_milli.iter().sum();
    let r = usage as f64 / (target_milli as f64 * current as f64);
    if within(r) {
        current
    } else {
        (usage as f64 / target_milli as f64).ceil() as i64
    }
}

/// External or Object metric with a `Value` target: the items' sum over the target,
/// scaled by the ready pods (or, from zero, the ratio alone).
pub fn value(current: i64, ready_pods: i64, items_milli: &[i64], target_milli: i64) -> i64 {
    let usage: i64 = items_milli.iter().sum();
    let r = usage as f64 / target_milli as f64;
    if current == 0 {
        return r.ceil() as i64;
    }
    if within(r) {
        current
    } else {
        (r * ready_pods as f64).ceil() as i64
    }
}

/// Pods metric with an `AverageValue` target: per-pod values of ready pods, `missing`
/// pods without a value (counted as the target when scaling down, 0 when scaling up).
pub fn pods_average_value(
    current: i64,
    values_milli: &[i64],
    missing: i64,
    target_milli: i64,
) -> i64 {
    if values_milli.is_empty() {
        return current;
    }
    let n = values_milli.len() as f64;
    let sum: f64 = values_milli.iter().map(|v| *v as f64).sum();
    let r = sum / n / target_milli as f64;
    if missing == 0 {
        return if within(r) {
            current
        } else {
            (r * n).ceil() as i64
        };
    }
    let fill = if r < 1.0 { target_milli as f64 } else { 0.0 };
    let total = n + missing as f64;
    let r2 = (sum + fill * missing as f64) / total / target_milli as f64;
    if within(r2) || (r < 1.0) != (r2 < 1.0) {
        return current;
    }
    let desired = (r2 * total).ceil() as i64;
    // A new count against the direction of the first ratio keeps the current one.
    if (r > 1.0 && desired < current) || (r < 1.0 && desired > current) {
        current
    } else {
        desired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked examples of the reference.
    #[test]
    fn reference_examples() {
        // 1: External AverageValue 60, 4 replicas, 55+62+58+61 = 236: within → 4.
        assert_eq!(
            average_value(4, &[55_000, 62_000, 58_000, 61_000], 60_000),
            4
        );
        // 2: 80+85+90+75 = 330: ceil(5.5) → 6.
        assert_eq!(
            average_value(4, &[80_000, 85_000, 90_000, 75_000], 60_000),
            6
        );
        // 3: External Value 50, one item 80, 3 ready pods: ceil(1.6 × 3) → 5.
        assert_eq!(value(3, 3, &[80_000], 50_000), 5);
        // 4: Pods AverageValue 70, values 90, 95, 100 and one missing: damped → 4.
        assert_eq!(
            pods_average_value(4, &[90_000, 95_000, 100_000], 1, 70_000),
            4
        );
        // 5: one item per GPU (3 pods × 2 GPUs at 80) would ask for 7; per pod, 4.
        assert_eq!(average_value(3, &[80_000; 6], 70_000), 7);
        assert_eq!(average_value(3, &[80_000; 3], 70_000), 4);
    }
}
