//! Composite metric definitions (`--composite-metrics-file`: one `NAME = EXPRESSION` a
//! line, `#` comments) and their expressions alone (`--composite-metric`'s right side).
//! The first 16 bytes are two input values, the rest the file.
//! Invariants: nothing panics or overflows the stack (issue 27: a 20,000-term chain
//! aborted the adapter); an error names the file's line and stays short whatever the
//! line's length; an accepted expression has at most `MAX_TERMS` terms, lists its
//! inputs sorted and once, and evaluates to a finite number or an error, never ±Inf
//! or NaN, whatever its inputs (up to ±1e308).
#![no_main]

use gpu_metrics_adapter::query::composite::Catalog;
use gpu_metrics_adapter::query::expr::{Expr, MAX_DEPTH, MAX_TERMS};
use libfuzzer_sys::fuzz_target;

fn check(expr: &Expr, text: &str, a: f64, b: f64) {
    let inputs = expr.inputs();
    assert!(inputs.windows(2).all(|w| w[0] < w[1]), "{inputs:?}");
    let (terms, depth) = shape(expr);
    assert!(terms <= MAX_TERMS, "{terms} terms");
    // Each nesting level is at most three nodes deep (a + chain, a * chain, a call).
    assert!(depth <= 3 * MAX_DEPTH + 2, "{depth} deep");
    let input = |name: &str| match name.len() % 3 {
        0 => Some(a),
        1 => Some(b),
        _ => None,
    };
    if let Ok(v) = expr.eval(&input) {
        assert!(v.is_finite(), "{v} from {text:?}");
    }
    let copy = expr.clone();
    assert_eq!(&copy, expr);
}

/// Terms (numbers and names) and the depth of the tree.
fn shape(e: &Expr) -> (usize, usize) {
    let all = |es: &mut dyn Iterator<Item = &Expr>| {
        es.map(shape)
            .fold((0, 0), |(t, d), (t2, d2)| (t + t2, d.max(d2)))
    };
    let (terms, depth) = match e {
        Expr::Number(_) | Expr::Metric(_) => return (1, 1),
        Expr::Neg(a) => shape(a),
        Expr::Chain(first, rest) => {
            all(&mut std::iter::once(first.as_ref()).chain(rest.iter().map(|(_, e)| e)))
        }
        Expr::Min(args) | Expr::Max(args) => all(&mut args.iter()),
    };
    (terms, depth + 1)
}

fn value(bytes: &[u8]) -> f64 {
    let v = f64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    if v.is_finite() { v } else { 1e308 }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let (a, b) = (value(&data[..8]), value(&data[8..16]));
    let Ok(text) = std::str::from_utf8(&data[16..]) else {
        return;
    };
    let definitions = Catalog::parse_file("f", text);
    match Catalog::validate(&definitions) {
        Ok(composites) => {
            for ((_, expr), d) in composites.iter().zip(&definitions) {
                check(expr, &d.text, a, b);
            }
        }
        Err(e) => {
            let m = e.to_string();
            assert!(m.starts_with("f:"), "{m}");
            assert!(m.len() < 2048, "{} bytes: {m}", m.len());
        }
    }
    match Expr::parse(text) {
        Ok(expr) => check(&expr, text, a, b),
        Err(e) => assert!(e.at <= text.len() && e.message.len() < 512, "{e}"),
    }
});
