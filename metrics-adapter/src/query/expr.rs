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

use std::fmt;

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Number(f64),
    Metric(String),
    Neg(Box<Expr>),
    Binary(Op, Box<Expr>, Box<Expr>),
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

/// Expressions nest at most this deep, so a hostile flag cannot overflow the stack.
const MAX_DEPTH: usize = 64;

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
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
        let mut left = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.pos += 1;
            let right = self.term()?;
            let op = if op == '+' { Op::Add } else { Op::Sub };
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        self.depth -= 1;
        Ok(left)
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.unary()?;
        while let Some(op @ ('*' | '/')) = self.peek() {
            self.pos += 1;
            let right = self.unary()?;
            let op = if op == '*' { Op::Mul } else { Op::Div };
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
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
            Some(c) if c.is_ascii_digit() || c == '.' => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
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
                            message: format!("unknown function {other:?} (known: min, max)"),
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
            _ => self.error(format!("{text:?} is not a number")),
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
                Expr::Binary(_, a, b) => {
                    walk(a, out);
                    walk(b, out);
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
    /// that has no value, or says the result is not a finite number (a division by
    /// zero): never a made-up 0.
    pub fn eval(&self, input: &dyn Fn(&str) -> Option<f64>) -> Result<f64, EvalError> {
        let v = match self {
            Expr::Number(n) => *n,
            Expr::Metric(m) => input(m).ok_or_else(|| EvalError::Missing(m.clone()))?,
            Expr::Neg(a) => -a.eval(input)?,
            Expr::Binary(op, a, b) => {
                let (a, b) = (a.eval(input)?, b.eval(input)?);
                match op {
                    Op::Add => a + b,
                    Op::Sub => a - b,
                    Op::Mul => a * b,
                    Op::Div => a / b,
                }
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

    #[test]
    fn inputs_are_listed_once_sorted() {
        let e = Expr::parse("max(b/2, a, b * a) + c").unwrap();
        assert_eq!(e.inputs(), ["a", "b", "c"]);
    }
}
