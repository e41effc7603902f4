use super::*;

#[test]
fn rates_need_two_readings_and_a_forward_counter() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_secs(2);
    let c = Convert::RatePerSec(1000.0);
    assert_eq!(convert_value(Raw::U64(5000), c, None, t1), None);
    assert_eq!(
        convert_value(Raw::U64(9000), c, Some((5000.0, t0)), t1),
        Some(Value::Int(2))
    );
    assert_eq!(convert_value(Raw::U64(10), c, Some((5000.0, t0)), t1), None);
}

#[test]
fn conversions_use_dcgm_units() {
    let now = Instant::now();
    assert_eq!(
        convert_value(Raw::U64(287_415), Convert::Float(1000.0), None, now),
        Some(Value::Float(287.415))
    );
    assert_eq!(
        convert_value(Raw::U64(3 << 20 | 5), Convert::IntDiv(1 << 20), None, now),
        Some(Value::Int(3))
    );
}

#[test]
fn whole_unit_conversions_scale_float_readings_and_round_products() {
    let now = Instant::now();
    // A float reading divided down to whole units: 7.5 MiB in bytes is 7 MiB.
    assert_eq!(
        convert_value(
            Raw::F64(7.5 * 1048576.0),
            Convert::IntDiv(1 << 20),
            None,
            now
        ),
        Some(Value::Int(7))
    );
    // Scaled up: 0.25 of a unit, times 1000, is 250.
    assert_eq!(
        convert_value(Raw::F64(0.25), Convert::IntMul(1000.0), None, now),
        Some(Value::Int(250))
    );
}

#[test]
fn a_rate_over_no_elapsed_time_is_not_reported() {
    let t0 = Instant::now();
    let c = Convert::RatePerSec(1.0);
    // Two readings at the same instant: no time to divide by, whatever the counter did.
    assert_eq!(convert_value(Raw::U64(9), c, Some((5.0, t0)), t0), None);
    assert_eq!(convert_value(Raw::U64(5), c, Some((5.0, t0)), t0), None);
}
