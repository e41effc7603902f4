//! The expression language of composite metrics: numbers, metric names, `+ - * /`,
//! unary minus, `min(...)`, `max(...)` and parentheses, e.g.
//! `max(gpu_utilization / 70, serving_requests_waiting / 50)`.
//!
//! Written by hand rather than with an expression crate: the grammar is five rules, and
//! the crates that fit (evalexpr and the like) bring their own value types, variables,
//! assignment and string functions that would all have to be refused again, while what
//! matters here (an unknown name or a missing input is an error, never a 0) is ours to
//! define either way.
//!
//! ```text
//! expr    = term (("+" | "-") term)*
//! term    = unary (("*" | "/") unary)*
//! unary   = "-" unary | primary
//! primary = NUMBER | NAME | NAME "(" expr ("," expr)* ")" | "(" expr ")"
//! ```
//!
//! Bounded, so that a hostile or mistaken definition is refused at startup instead of
//! overflowing the stack: an operator chain (`a + b - c`, `a * b / c`) is one node
//! holding its operands in a list, parsed and evaluated in a loop, so only nesting
//! (parentheses, unary minus, function arguments) recurses, and nesting is at most
//! [`MAX_DEPTH`] deep; an expression holds at most [`MAX_TERMS`] numbers and names.

use std::fmt;

/// `text` quoted for an error message, its first 40 characters only: a name or a
/// number in a hostile definition may be a megabyte long.
pub fn quoted(text: &str) -> String {
    const SHOWN: usize = 40;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Number(f64),
    Metric(String),
    Neg(Box<Expr>),
    /// The first operand, then each operator with its right operand, applied left to
    /// right: all `+`/`-`, or all `*`/`/` (precedence splits mixed chains).
    Chain(Box<Expr>, Vec<(Op, Expr)>),
    Min(Vec<Expr>),
    Max(Vec<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

/// Why an expression does not parse: what was expected, and at which character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub at: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at character {}: {}", self.at + 1, self.message)
    }
}

/// Expressions nest at most this deep (parentheses, unary minus, function calls): the
/// only recursion in parsing, evaluating, cloning and dropping an expression.
pub const MAX_DEPTH: usize = 64;

/// An expression holds at most this many terms (numbers and metric names): a formula
/// over a handful of metrics needs tens.
pub const MAX_TERMS: usize = 1000;

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
    terms: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while let Some(c) = self.text[self.pos..].chars().next() {
            if !c.is_whitespace() {
                break;
            }
            self.pos += c.len_utf8();
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.text[self.pos..].chars().next()
    }

    fn error<T>(&self, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError {
            at: self.pos,
            message: message.into(),
        })
    }

    fn expect(&mut self, c: char) -> Result<(), ParseError> {
        match self.peek() {
            Some(got) if got == c => {
                self.pos += 1;
                Ok(())
            }
            Some(got) => self.error(format!("expected {c:?}, found {got:?}")),
            None => self.error(format!("expected {c:?}, found the end")),
        }
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.error(format!("nested deeper than {MAX_DEPTH}"));
        }
        let first = self.term()?;
        let mut rest = Vec::new();
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.pos += 1;
            let right = self.term()?;
            rest.push((if op == '+' { Op::Add } else { Op::Sub }, right));
        }
        self.depth -= 1;
        Ok(chain(first, rest))
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let first = self.unary()?;
        let mut rest = Vec::new();
        while let Some(op @ ('*' | '/')) = self.peek() {
            self.pos += 1;
            let right = self.unary()?;
            rest.push((if op == '*' { Op::Mul } else { Op::Div }, right));
        }
        Ok(chain(first, rest))
    }

    /// Counts one more term, refusing the one past [`MAX_TERMS`] where it starts.
    fn count_term(&mut self) -> Result<(), ParseError> {
        self.terms += 1;
        if self.terms > MAX_TERMS {
            return self.error(format!(
                "more than {MAX_TERMS} terms (numbers and metric names)"
            ));
        }
        Ok(())
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.peek() == Some('-') {
            self.pos += 1;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return self.error(format!("nested deeper than {MAX_DEPTH}"));
            }
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Neg(Box::new(inner)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        match self.peek() {
            Some('(') => {
                self.pos += 1;
                let e = self.expr()?;
                self.expect(')')?;
                Ok(e)
            }
            Some(c) if c.is_ascii_digit() || c == '.' => {
                self.count_term()?;
                self.number()
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                self.count_term()?;
                let start = self.pos;
                let len = self.text[start..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(self.text.len() - start);
                self.pos += len;
                let name = &self.text[start..self.pos];
                if self.peek() != Some('(') {
                    return Ok(Expr::Metric(name.to_string()));
                }
                let at = start;
                let function = match name {
                    "min" => Expr::Min,
                    "max" => Expr::Max,
                    other => {
                        return Err(ParseError {
                            at,
                            message: format!(
                                "unknown function {} (known: min, max)",
                                quoted(other)
                            ),
                        });
                    }
                };
                self.pos += 1;
                let mut args = vec![self.expr()?];
                while self.peek() == Some(',') {
                    self.pos += 1;
                    args.push(self.expr()?);
                }
                self.expect(')')?;
                Ok(function(args))
            }
            Some(c) => self.error(format!(
                "expected a number, a metric name, min(, max( or (, found {c:?}"
            )),
            None => self.error("expected a number, a metric name, min(, max( or (, found the end"),
        }
    }

    fn number(&mut self) -> Result<Expr, ParseError> {
        let start = self.pos;
        let bytes = self.text.as_bytes();
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_digit() || bytes[end] == b'.') {
            end += 1;
        }
        // An exponent: e, an optional sign, digits.
        if end < bytes.len() && (bytes[end] == b'e' || bytes[end] == b'E') {
            let mut e = end + 1;
            if e < bytes.len() && (bytes[e] == b'+' || bytes[e] == b'-') {
                e += 1;
            }
            if e < bytes.len() && bytes[e].is_ascii_digit() {
                while e < bytes.len() && bytes[e].is_ascii_digit() {
                    e += 1;
                }
                end = e;
            }
        }
        let text = &self.text[start..end];
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => {
                self.pos = end;
                Ok(Expr::Number(v))
            }
            _ => self.error(format!("{} is not a number", quoted(text))),
        }
    }
}

/// `first` alone, or the chain of it and `rest`.
fn chain(first: Expr, rest: Vec<(Op, Expr)>) -> Expr {
    if rest.is_empty() {
        first
    } else {
        Expr::Chain(Box::new(first), rest)
    }
}

impl Op {
    fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Op::Add => a + b,
            Op::Sub => a - b,
            Op::Mul => a * b,
            Op::Div => a / b,
        }
    }
}

impl Expr {
    /// Parse `text` whole.
    pub fn parse(text: &str) -> Result<Expr, ParseError> {
        let mut p = Parser {
            text,
            pos: 0,
            depth: 0,
            terms: 0,
        };
        let e = p.expr()?;
        match p.peek() {
            None => Ok(e),
            Some(c) => p.error(format!("unexpected {c:?} after a complete expression")),
        }
    }

    /// The metric names it reads, sorted, each once.
    pub fn inputs(&self) -> Vec<&str> {
        fn walk<'a>(e: &'a Expr, out: &mut Vec<&'a str>) {
            match e {
                Expr::Number(_) => {}
                Expr::Metric(m) => out.push(m),
                Expr::Neg(a) => walk(a, out),
                Expr::Chain(first, rest) => {
                    walk(first, out);
                    rest.iter().for_each(|(_, e)| walk(e, out));
                }
                Expr::Min(args) | Expr::Max(args) => args.iter().for_each(|a| walk(a, out)),
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The value, reading each metric through `input`. `Err` names the first input
    /// that has no value, or says a step is not a finite number (a division by zero,
    /// an overflow, an input that is not finite): never a made-up 0, never ±Inf or NaN.
    pub fn eval(&self, input: &dyn Fn(&str) -> Option<f64>) -> Result<f64, EvalError> {
        let v = match self {
            Expr::Number(n) => *n,
            Expr::Metric(m) => input(m).ok_or_else(|| EvalError::Missing(m.clone()))?,
            Expr::Neg(a) => -a.eval(input)?,
            Expr::Chain(first, rest) => {
                let mut acc = first.eval(input)?;
                for (op, e) in rest {
                    acc = op.apply(acc, e.eval(input)?);
                    if !acc.is_finite() {
                        return Err(EvalError::NotFinite);
                    }
                }
                acc
            }
            Expr::Min(args) => fold(args, input, f64::min)?,
            Expr::Max(args) => fold(args, input, f64::max)?,
        };
        if v.is_finite() {
            Ok(v)
        } else {
            Err(EvalError::NotFinite)
        }
    }
}

fn fold(
    args: &[Expr],
    input: &dyn Fn(&str) -> Option<f64>,
    f: fn(f64, f64) -> f64,
) -> Result<f64, EvalError> {
    let mut acc: Option<f64> = None;
    for a in args {
        let v = a.eval(input)?;
        acc = Some(acc.map_or(v, |x| f(x, v)));
    }
    // The parser never builds an empty argument list.
    acc.ok_or(EvalError::NotFinite)
}

/// Why an expression has no value for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvalError {
    Missing(String),
    NotFinite,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str, vars: &[(&str, f64)]) -> Result<f64, EvalError> {
        let e = Expr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        e.eval(&|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
    }

    #[test]
    fn precedence_associativity_and_functions_follow_arithmetic() {
        let (u, q) = (84.0_f64, 30.0_f64);
        let vars = [("gpu_utilization", u), ("serving_requests_waiting", q)];
        // Each case against the same arithmetic written in Rust.
        for (text, want) in [
            ("1 + 2 * 3", 1.0 + 2.0 * 3.0),
            ("(1 + 2) * 3", (1.0 + 2.0) * 3.0),
            ("10 - 4 - 3", 10.0 - 4.0 - 3.0),
            ("64 / 4 / 2", 64.0 / 4.0 / 2.0),
            ("-2 * -3", -2.0 * -3.0),
            ("1.5e2 + .5", 150.0 + 0.5),
            (
                "max(gpu_utilization/70, serving_requests_waiting/50)",
                (u / 70.0).max(q / 50.0),
            ),
            (
                "min(gpu_utilization, 50, serving_requests_waiting) * 2",
                u.min(50.0).min(q) * 2.0,
            ),
            ("max(1)", 1.0),
            ("gpu_utilization - -serving_requests_waiting", u - -q),
        ] {
            assert_eq!(eval(text, &vars), Ok(want), "{text}");
        }
    }

    #[test]
    fn a_missing_input_or_a_division_by_zero_is_an_error_not_a_zero() {
        assert_eq!(
            eval("max(a, b)", &[("a", 1.0)]),
            Err(EvalError::Missing("b".into()))
        );
        assert_eq!(
            eval("a / b", &[("a", 1.0), ("b", 0.0)]),
            Err(EvalError::NotFinite)
        );
        assert_eq!(
            eval("a / b", &[("a", 0.0), ("b", 0.0)]),
            Err(EvalError::NotFinite)
        );
    }

    #[test]
    fn bad_expressions_say_what_is_wrong_and_where() {
        for (text, at, says) in [
            ("", 0, "found the end"),
            ("max(a, b", 8, "expected ')'"),
            ("a +", 3, "found the end"),
            ("a b", 2, "unexpected 'b'"),
            ("avg(a)", 0, "unknown function \"avg\""),
            ("a % 2", 2, "unexpected '%'"),
            ("1..2", 0, "not a number"),
            ("max()", 4, "found ')'"),
        ] {
            let e = Expr::parse(text).expect_err(text);
            assert_eq!(e.at, at, "{text}: {e}");
            assert!(e.message.contains(says), "{text}: {e}");
        }
        let deep = format!("{}1{}", "(".repeat(200), ")".repeat(200));
        assert!(Expr::parse(&deep).unwrap_err().message.contains("deeper"));
        let negs = format!("{}1", "-".repeat(200));
        assert!(Expr::parse(&negs).unwrap_err().message.contains("deeper"));
    }

    /// Issue 27: a chain of 20,000 terms (or a megabyte of `*1`) is refused where the
    /// term past the cap starts, instead of a tree as deep as the chain.
    #[test]
    fn chains_past_the_term_cap_are_refused_where_the_cap_is_passed() {
        let term = "gpu_utilization+";
        let long = format!("{}gpu_utilization", term.repeat(19_999));
        let e = Expr::parse(&long).unwrap_err();
        assert!(e.message.contains("more than 1000 terms"), "{e}");
        assert_eq!(e.at, MAX_TERMS * term.len(), "where term 1001 starts: {e}");
        let mega = format!("gpu_utilization{}", "*1".repeat(500_000));
        let e = Expr::parse(&mega).unwrap_err();
        assert_eq!(
            e.at,
            "gpu_utilization".len() + (MAX_TERMS - 1) * 2 + 1,
            "{e}"
        );
        // Terms inside min/max and parentheses count too.
        let args = format!("max({}a)", "a, ".repeat(MAX_TERMS));
        assert!(Expr::parse(&args).unwrap_err().message.contains("terms"));
        // At the cap, it parses.
        let at_cap = format!("{}a", "a - ".repeat(MAX_TERMS - 1));
        assert!(Expr::parse(&at_cap).is_ok());
    }

    /// A chain at the cap is evaluated, listed, cloned and dropped in a loop: on a
    /// 64 KiB stack, where the recursion over a 1,000-deep tree overflows.
    #[test]
    fn a_chain_at_the_cap_needs_no_deep_stack() {
        let sum = format!("{}a", "a + ".repeat(MAX_TERMS - 1));
        let product = format!("a{}", " * 1 / 1".repeat((MAX_TERMS - 1) / 2));
        let (sum, product) = (Expr::parse(&sum).unwrap(), Expr::parse(&product).unwrap());
        let got = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let input = |n: &str| (n == "a").then_some(1.5);
                let copy = sum.clone();
                let out = (copy.eval(&input), product.eval(&input), copy.inputs().len());
                drop((sum, copy, product));
                out
            })
            .unwrap()
            .join()
            .expect("no stack overflow");
        assert_eq!(got, (Ok(1.5 * MAX_TERMS as f64), Ok(1.5), 1));
    }

    /// Finite inputs whose sum, product or quotient overflows give no value, as a
    /// division by zero does; so does an input that is not finite.
    #[test]
    fn an_overflow_is_not_finite_never_an_infinity() {
        let big = [("a", 1e308), ("b", 1e308), ("c", -1e308)];
        for text in [
            "a + b",
            "a * 10",
            "a / 1e-10",
            "c - a",
            "max(a + b, 1)",
            "-(a+b)",
        ] {
            assert_eq!(eval(text, &big), Err(EvalError::NotFinite), "{text}");
        }
        // An intermediate overflow is not rescued by what follows.
        assert_eq!(eval("a + b - b", &big), Err(EvalError::NotFinite));
        assert_eq!(eval("a + c", &big), Ok(0.0));
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            assert_eq!(eval("a * 0", &[("a", bad)]), Err(EvalError::NotFinite));
            assert_eq!(eval("a", &[("a", bad)]), Err(EvalError::NotFinite));
        }
    }

    #[test]
    fn inputs_are_listed_once_sorted() {
        let e = Expr::parse("max(b/2, a, b * a) + c").unwrap();
        assert_eq!(e.inputs(), ["a", "b", "c"]);
    }
}
