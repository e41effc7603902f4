//! Quantities: the adapter's writer (`format_quantity`) against the tests' exact reader
//! of every form upstream accepts (tests/src/quantity.rs), and the reader on any text.
//! Invariants: what the adapter writes reads back as exactly the milli-units it meant
//! (`round(v × 1000)`); a quantity the reader accepts, written back through the adapter
//! at milli precision, is within half a milli (plus f64 rounding) of the reader's value.
#![no_main]

#[allow(dead_code)]
#[path = "../../src/quantity.rs"]
mod reader;

use gpu_metrics_adapter::api::quantity::{format_milli, format_quantity};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(bytes) = data.get(..8) {
        let v = f64::from_le_bytes(bytes.try_into().unwrap_or_default());
        if let Some(text) = format_quantity(v) {
            let milli = reader::milli_value(&text)
                .unwrap_or_else(|e| panic!("{v:e} was written {text:?}, which does not read: {e}"));
            assert_eq!(milli as f64, (v * 1000.0).round(), "{v:e} written {text:?}");
            assert_eq!(format_milli(milli), text);
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(value) = reader::parse_quantity(text) {
        assert!(value.is_finite());
        if let Some(written) = format_quantity(value) {
            let back = reader::parse_quantity(&written)
                .unwrap_or_else(|e| panic!("{text:?} → {written:?} does not read: {e}"));
            let tolerance = 0.0005 + value.abs() * 4.0 * f64::EPSILON;
            assert!(
                (back - value).abs() <= tolerance,
                "{text:?} = {value:e}, written {written:?} = {back:e}"
            );
        }
    }
    let _ = reader::milli_value(text);
});
