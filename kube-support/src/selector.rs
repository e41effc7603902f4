//! Kubernetes label selectors: the string form the HPA and KEDA put in
//! `labelSelector` / `metricLabelSelector`, and the JSON `LabelSelector` object that
//! `metric.selector` carries in custom-metrics responses.
//!
//! The string grammar follows `k8s.io/apimachinery/pkg/labels.Parse` token for token,
//! because the selectors we receive were produced (and will be re-parsed) by Go code:
//! accepting less would turn a working HPA into `FailedGetExternalMetric`, accepting
//! more would hide a typo that the API server itself rejects.
//!
//! ```text
//! selector    := "" | requirement ("," requirement)*
//! requirement := ["!"] KEY
//!              | KEY ("=" | "==" | "!=" | ">" | "<") VALUE?
//!              | KEY ("in" | "notin") "(" value-list? ")"
//! ```
//!
//! Upstream behaviours reproduced on purpose (each has a test):
//! - whitespace (`' '`, `\t`, `\r`, `\n`) may surround every token; `in`/`notin` need no
//!   space before `(`;
//! - `in`/`notin` are keywords only in operator position: `in in (notin)` is key `in`,
//!   value `notin`;
//! - a missing value is the empty value: `x=`, `x in ()`, `x in (a,)`, `x in (,a)` and
//!   `x in (a,,b)` all contain `""`; `x in (a,,)` is an error, as upstream;
//! - `!=` and `notin` also match objects that lack the key; `>`/`<` never do, and compare
//!   the label as a base-10 `i64` (labels that are not integers do not match);
//! - `!x=a` is an error (`!` takes no operator), as are trailing or doubled commas.
//!
//! Deliberate differences: input over [`MAX_SELECTOR_LEN`] bytes is rejected before
//! lexing; a NUL byte is an ordinary (invalid) character rather than upstream's accidental
//! end-of-input; `==` is stored and printed as `=`; requirements are kept sorted by
//! (key, operator, values) with duplicates removed, so [`Selector`] equality is
//! insensitive to input order. None of these change which label sets match.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::str::FromStr;

use serde_json::{Map, Value};

/// Longest selector string accepted. Selectors arrive in query strings from the HPA,
/// which sends a handful of requirements; the cap bounds the parser's work on hostile
/// input well below any realistic selector.
pub const MAX_SELECTOR_LEN: usize = 4096;

/// Longest label name part and label value (`validation.LabelValueMaxLength`).
const MAX_NAME_LEN: usize = 63;
/// Longest key prefix (`validation.DNS1123SubdomainMaxLength`).
const MAX_PREFIX_LEN: usize = 253;
/// Longest excerpt of user input echoed back in an error message.
const SNIPPET_LEN: usize = 64;

/// Read access to a set of labels, so that matching works on whatever map the caller
/// already holds instead of forcing a copy into one concrete type.
pub trait LabelLookup {
    /// The value of label `key`, or `None` when the label is absent. An empty value is
    /// present (`Some("")`), which matters for `!=`, `notin` and `!key`.
    fn get(&self, key: &str) -> Option<&str>;
}

impl<S: BuildHasher> LabelLookup for HashMap<String, String, S> {
    fn get(&self, key: &str) -> Option<&str> {
        HashMap::get(self, key).map(String::as_str)
    }
}

impl LabelLookup for BTreeMap<String, String> {
    fn get(&self, key: &str) -> Option<&str> {
        BTreeMap::get(self, key).map(String::as_str)
    }
}

/// Pairs are searched linearly; with duplicate keys the first pair wins.
impl LabelLookup for [(&str, &str)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

impl<const N: usize> LabelLookup for [(&str, &str); N] {
    fn get(&self, key: &str) -> Option<&str> {
        LabelLookup::get(self.as_slice(), key)
    }
}

impl LabelLookup for Vec<(&str, &str)> {
    fn get(&self, key: &str) -> Option<&str> {
        LabelLookup::get(self.as_slice(), key)
    }
}

/// Pairs are searched linearly; with duplicate keys the first pair wins.
impl LabelLookup for [(String, String)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl LabelLookup for Vec<(String, String)> {
    fn get(&self, key: &str) -> Option<&str> {
        LabelLookup::get(self.as_slice(), key)
    }
}

impl<T: LabelLookup + ?Sized> LabelLookup for &T {
    fn get(&self, key: &str) -> Option<&str> {
        (**self).get(key)
    }
}

/// How a [`Requirement`] relates a label to its values (`selection.Operator`).
///
/// `==` has no variant of its own: it means exactly `=`, and folding it keeps
/// equality and the canonical text simple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    /// `key`: the label is present, any value.
    Exists,
    /// `!key`: the label is absent.
    DoesNotExist,
    /// `key=value` (or `key==value`): present with exactly this value.
    Equals,
    /// `key!=value`: absent, or present with another value.
    NotEquals,
    /// `key in (a,b)`: present with one of the values.
    In,
    /// `key notin (a,b)`: absent, or present with none of the values.
    NotIn,
    /// `key>n`: present, an integer, and greater than `n`.
    GreaterThan,
    /// `key<n`: present, an integer, and less than `n`.
    LessThan,
}

impl Operator {
    /// Upstream's `selection.Operator` spelling, used in error messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Exists => "exists",
            Self::DoesNotExist => "!",
            Self::Equals => "=",
            Self::NotEquals => "!=",
            Self::In => "in",
            Self::NotIn => "notin",
            Self::GreaterThan => "gt",
            Self::LessThan => "lt",
        }
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in the input an error was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// Built programmatically ([`Requirement::new`]): there is no input text.
    Unspecified,
    /// Byte offset into the selector string.
    Byte(usize),
    /// Path into the JSON `LabelSelector`, e.g. `matchExpressions[1].values[0]`.
    Field(String),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unspecified => Ok(()),
            Self::Byte(pos) => write!(f, " at byte {pos}"),
            Self::Field(path) => write!(f, " at {path}"),
        }
    }
}

/// Why a selector was rejected. The message names the offending text and where it is,
/// because it is returned verbatim in a `400 BadRequest` to whoever wrote the HPA.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The input exceeds [`MAX_SELECTOR_LEN`].
    #[error("label selector is {len} bytes long; the limit is {max} bytes")]
    TooLong {
        /// Length of the rejected input in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A token appeared where the grammar does not allow it.
    #[error(
        "unable to parse label selector: found {found} at byte {position}, expected {expected}"
    )]
    Syntax {
        /// Byte offset of the unexpected token.
        position: usize,
        /// The token as written (quoted), or `end of string`.
        found: String,
        /// What the grammar allows there.
        expected: &'static str,
    },
    /// A label key is not a valid qualified name.
    #[error("invalid label key {key:?}{location}: {reason}")]
    InvalidKey {
        /// Where the key is.
        location: Location,
        /// The key (shortened if very long).
        key: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A value is not a valid label value.
    #[error("invalid value {value:?} for label key {key:?}{location}: {reason}")]
    InvalidValue {
        /// Where the value is.
        location: Location,
        /// The requirement's key.
        key: String,
        /// The value (shortened if very long).
        value: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The operator got the wrong number or kind of values.
    #[error("invalid values for operator '{operator}' on label key {key:?}{location}: {reason}")]
    InvalidValues {
        /// Where the requirement is.
        location: Location,
        /// The requirement's key.
        key: String,
        /// The operator.
        operator: Operator,
        /// What is wrong.
        reason: String,
    },
    /// The JSON `LabelSelector` has the wrong shape or an unknown operator.
    #[error("invalid label selector object{location}: {reason}")]
    InvalidObject {
        /// Where in the object.
        location: Location,
        /// What is wrong.
        reason: String,
    },
}

impl SelectorError {
    /// Byte offset of the problem in the selector string, when it came from one.
    pub fn position(&self) -> Option<usize> {
        match self {
            Self::Syntax { position, .. } => Some(*position),
            Self::InvalidKey { location, .. }
            | Self::InvalidValue { location, .. }
            | Self::InvalidValues { location, .. }
            | Self::InvalidObject { location, .. } => match location {
                Location::Byte(pos) => Some(*pos),
                Location::Unspecified | Location::Field(_) => None,
            },
            Self::TooLong { .. } => None,
        }
    }
}

/// One `key <op> values` clause. Invariants (enforced by [`Requirement::new`], the only
/// constructor): the key and every value are valid; `values` is sorted and free of
/// duplicates; `Exists`/`DoesNotExist` have no values, `=`/`!=` exactly one, `in`/`notin`
/// at least one, and `>`/`<` exactly one, the canonical decimal form of an `i64`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Requirement {
    // Field order is the sort order of a selector's requirements.
    key: String,
    operator: Operator,
    values: Vec<String>,
}

/// What [`check_requirement`] found wrong, before it is given a location.
enum Problem {
    Key(String),
    Value { index: usize, reason: String },
    Values(String),
}

impl Requirement {
    /// Validates like upstream `labels.NewRequirement`: the key is a qualified name, every
    /// value a label value (the empty string included), and the value count fits the
    /// operator; `>`/`<` need one integer.
    pub fn new<I, S>(key: &str, operator: Operator, values: I) -> Result<Self, SelectorError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let values: Vec<String> = values.into_iter().map(Into::into).collect();
        Self::build(key, operator, values, |_| Location::Unspecified)
    }

    /// Shared by every constructor: `locate(None)` is where the requirement is,
    /// `locate(Some(i))` where its i-th input value is.
    fn build(
        key: &str,
        operator: Operator,
        mut values: Vec<String>,
        locate: impl Fn(Option<usize>) -> Location,
    ) -> Result<Self, SelectorError> {
        if let Err(problem) = check_requirement(key, operator, &values) {
            return Err(match problem {
                Problem::Key(reason) => SelectorError::InvalidKey {
                    location: locate(None),
                    key: snippet(key),
                    reason,
                },
                Problem::Value { index, reason } => SelectorError::InvalidValue {
                    location: locate(Some(index)),
                    key: snippet(key),
                    value: values.get(index).map(|v| snippet(v)).unwrap_or_default(),
                    reason,
                },
                Problem::Values(reason) => SelectorError::InvalidValues {
                    location: locate(None),
                    key: snippet(key),
                    operator,
                    reason,
                },
            });
        }
        if matches!(operator, Operator::GreaterThan | Operator::LessThan) {
            // check_requirement proved there is exactly one value and that it parses;
            // storing the canonical spelling makes `x>05` and `x>5` equal.
            values = values
                .iter()
                .filter_map(|v| v.parse::<i64>().ok())
                .map(|n| n.to_string())
                .collect();
        }
        values.sort();
        values.dedup();
        Ok(Self {
            key: key.to_owned(),
            operator,
            values,
        })
    }

    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, sorted and without duplicates (empty for `Exists`/`DoesNotExist`).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    fn has_value(&self, value: &str) -> bool {
        self.values
            .binary_search_by(|v| v.as_str().cmp(value))
            .is_ok()
    }

    /// Whether `labels` satisfy this requirement, with upstream's semantics for absent
    /// labels: `!=`/`notin` match them, `>`/`<` do not.
    pub fn matches<L: LabelLookup + ?Sized>(&self, labels: &L) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Equals | Operator::In => value.is_some_and(|v| self.has_value(v)),
            Operator::NotEquals | Operator::NotIn => value.is_none_or(|v| !self.has_value(v)),
            Operator::GreaterThan | Operator::LessThan => {
                // Go's strconv.ParseInt(s, 10, 64) and Rust's i64 parser accept the same
                // language (optional sign, ASCII digits, no underscores), so a label that
                // upstream compares is compared here too.
                let (Some(label), Some(bound)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    label > bound
                } else {
                    label < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    /// Upstream's `Requirement.String()` layout, which `parse` reads back unchanged:
    /// `!k`, `k`, `k=v`, `k!=v`, `k>n`, `k<n`, `k in (a,b)`, `k notin (a,b)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.key;
        let first = self.values.first().map_or("", String::as_str);
        match self.operator {
            Operator::Exists => f.write_str(key),
            Operator::DoesNotExist => write!(f, "!{key}"),
            Operator::Equals => write!(f, "{key}={first}"),
            Operator::NotEquals => write!(f, "{key}!={first}"),
            Operator::GreaterThan => write!(f, "{key}>{first}"),
            Operator::LessThan => write!(f, "{key}<{first}"),
            Operator::In | Operator::NotIn => {
                // Sorted values put "" first, which prints as "(,a)" or "()": both
                // parse back to a set containing the empty value.
                write!(f, "{key} {} ({})", self.operator, self.values.join(","))
            }
        }
    }
}

/// A parsed label selector: the AND of its requirements. The empty selector matches
/// every label set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    /// Sorted and deduplicated, so equal selectors compare equal whatever the input order.
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector that matches everything (the empty string).
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses the string syntax exactly as `labels.Parse` does (see the module docs).
    /// An empty or all-whitespace string is the selector that matches everything.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        if input.len() > MAX_SELECTOR_LEN {
            return Err(SelectorError::TooLong {
                len: input.len(),
                max: MAX_SELECTOR_LEN,
            });
        }
        let tokens = lex(input);
        Parser { tokens, next: 0 }.selector()
    }

    /// A selector from requirements built with [`Requirement::new`].
    pub fn from_requirements(requirements: impl IntoIterator<Item = Requirement>) -> Self {
        let mut requirements: Vec<Requirement> = requirements.into_iter().collect();
        requirements.sort();
        requirements.dedup();
        Self { requirements }
    }

    /// The requirements, sorted by key, then operator, then values.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True when the selector has no requirements and so matches every label set.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches<L: LabelLookup + ?Sized>(&self, labels: &L) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// The single value the selector forces `key` to have (through `key=v` or
    /// `key in (v)`), if any: lets a caller look one series up directly instead of
    /// scanning, e.g. KEDA's `scaledobject.keda.sh/name=<so>`.
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        self.requirements
            .iter()
            .filter(|r| r.key == key)
            .find(|r| matches!(r.operator, Operator::Equals | Operator::In) && r.values.len() == 1)
            .and_then(|r| r.values.first())
            .map(String::as_str)
    }

    /// Reads a JSON `metav1.LabelSelector` (`matchLabels`, `matchExpressions` with
    /// operators `In`, `NotIn`, `Exists`, `DoesNotExist`) with the validation of
    /// upstream `LabelSelectorAsSelector`.
    ///
    /// `null` and `{}` both give the selector that matches everything. Upstream maps a
    /// nil selector to `labels.Nothing()`, but `Nothing().String()` is `""`, so on the
    /// wire (the HPA's `labelSelector` query parameter) a null selector has always meant
    /// "no restriction"; this keeps that meaning. Unknown fields are ignored, as Go's
    /// JSON decoder does.
    pub fn from_label_selector(object: &Value) -> Result<Self, SelectorError> {
        let fields = match object {
            Value::Null => return Ok(Self::everything()),
            Value::Object(fields) => fields,
            other => {
                return Err(shape_error(
                    "",
                    format!("expected an object, found {}", kind_of(other)),
                ));
            }
        };
        let mut requirements = Vec::new();
        match fields.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (key, value) in labels {
                    let path = format!("matchLabels[{key:?}]");
                    let value = value.as_str().ok_or_else(|| {
                        shape_error(
                            &path,
                            format!("expected a string, found {}", kind_of(value)),
                        )
                    })?;
                    let location = Location::Field(path);
                    requirements.push(Requirement::build(
                        key,
                        Operator::Equals,
                        vec![value.to_owned()],
                        |_| location.clone(),
                    )?);
                }
            }
            Some(other) => {
                return Err(shape_error(
                    "matchLabels",
                    format!("expected an object, found {}", kind_of(other)),
                ));
            }
        }
        match fields.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(expressions)) => {
                for (index, expression) in expressions.iter().enumerate() {
                    requirements.push(expression_requirement(index, expression)?);
                }
            }
            Some(other) => {
                return Err(shape_error(
                    "matchExpressions",
                    format!("expected an array, found {}", kind_of(other)),
                ));
            }
        }
        Ok(Self::from_requirements(requirements))
    }

    /// The JSON `LabelSelector` for `metric.selector` in custom-metrics responses, or
    /// `null` for the empty selector (what custom-metrics-apiserver adapters emit when
    /// no `metricLabelSelector` was given).
    ///
    /// Upstream's `ParseToLabelSelector` fails on `!=`, `>` and `<`, which would turn a
    /// valid request into a 500; instead `k!=v` is written as the equivalent
    /// `NotIn [v]`, a second `=` on the same key as `In [v]`, and `>`/`<` as operators
    /// `Gt`/`Lt` (the `NodeSelectorRequirement` spelling). Go clients decode the operator
    /// as a plain string and the HPA ignores this field, so nothing breaks, and the
    /// output describes exactly the selector that was applied. Only In, NotIn, Exists
    /// and DoesNotExist are read back by [`Selector::from_label_selector`].
    pub fn to_label_selector(&self) -> Value {
        if self.is_empty() {
            return Value::Null;
        }
        let mut match_labels = Map::new();
        let mut match_expressions = Vec::new();
        for requirement in &self.requirements {
            let (operator, values) = match requirement.operator {
                Operator::Equals => {
                    let value = requirement.values.first().cloned().unwrap_or_default();
                    if !match_labels.contains_key(&requirement.key) {
                        match_labels.insert(requirement.key.clone(), Value::String(value));
                        continue;
                    }
                    ("In", vec![value])
                }
                Operator::NotEquals => ("NotIn", requirement.values.clone()),
                Operator::In => ("In", requirement.values.clone()),
                Operator::NotIn => ("NotIn", requirement.values.clone()),
                Operator::Exists => ("Exists", Vec::new()),
                Operator::DoesNotExist => ("DoesNotExist", Vec::new()),
                Operator::GreaterThan => ("Gt", requirement.values.clone()),
                Operator::LessThan => ("Lt", requirement.values.clone()),
            };
            let mut expression = Map::new();
            expression.insert("key".to_owned(), Value::String(requirement.key.clone()));
            expression.insert("operator".to_owned(), Value::String(operator.to_owned()));
            // `values` is omitempty in Go.
            if !values.is_empty() {
                expression.insert(
                    "values".to_owned(),
                    Value::Array(values.into_iter().map(Value::String).collect()),
                );
            }
            match_expressions.push(Value::Object(expression));
        }
        let mut object = Map::new();
        if !match_labels.is_empty() {
            object.insert("matchLabels".to_owned(), Value::Object(match_labels));
        }
        if !match_expressions.is_empty() {
            object.insert(
                "matchExpressions".to_owned(),
                Value::Array(match_expressions),
            );
        }
        Value::Object(object)
    }
}

impl fmt::Display for Selector {
    /// Canonical text: requirements in sorted order, comma-separated, no spaces except
    /// around `in`/`notin`. `Selector::parse` of the output gives back an equal selector.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, requirement) in self.requirements.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        Self::parse(input)
    }
}

fn expression_requirement(index: usize, expression: &Value) -> Result<Requirement, SelectorError> {
    let path = format!("matchExpressions[{index}]");
    let Value::Object(fields) = expression else {
        return Err(shape_error(
            &path,
            format!("expected an object, found {}", kind_of(expression)),
        ));
    };
    let key = match fields.get("key") {
        Some(Value::String(key)) => key.as_str(),
        None | Some(Value::Null) => "",
        Some(other) => {
            return Err(shape_error(
                &format!("{path}.key"),
                format!("expected a string, found {}", kind_of(other)),
            ));
        }
    };
    let operator = match fields.get("operator") {
        Some(Value::String(operator)) => match operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(shape_error(
                    &format!("{path}.operator"),
                    format!(
                        "{:?} is not a valid label selector operator",
                        snippet(other)
                    ),
                ));
            }
        },
        None | Some(Value::Null) => {
            return Err(shape_error(
                &format!("{path}.operator"),
                "\"\" is not a valid label selector operator".to_owned(),
            ));
        }
        Some(other) => {
            return Err(shape_error(
                &format!("{path}.operator"),
                format!("expected a string, found {}", kind_of(other)),
            ));
        }
    };
    let values = match fields.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut values = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let value = item.as_str().ok_or_else(|| {
                    shape_error(
                        &format!("{path}.values[{i}]"),
                        format!("expected a string, found {}", kind_of(item)),
                    )
                })?;
                values.push(value.to_owned());
            }
            values
        }
        Some(other) => {
            return Err(shape_error(
                &format!("{path}.values"),
                format!("expected an array, found {}", kind_of(other)),
            ));
        }
    };
    Requirement::build(key, operator, values, |value| match value {
        None => Location::Field(path.clone()),
        Some(i) => Location::Field(format!("{path}.values[{i}]")),
    })
}

fn shape_error(path: &str, reason: String) -> SelectorError {
    let location = if path.is_empty() {
        Location::Unspecified
    } else {
        Location::Field(path.to_owned())
    };
    SelectorError::InvalidObject { location, reason }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most [`SNIPPET_LEN`] characters of `text`, so error messages stay readable when
/// the input is a 4 KiB blob.
fn snippet(text: &str) -> String {
    match text.char_indices().nth(SNIPPET_LEN) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}...", &text[..cut]),
    }
}

/// Upstream's `NewRequirement` checks, in its order: key, value count for the operator,
/// then each value.
fn check_requirement(key: &str, operator: Operator, values: &[String]) -> Result<(), Problem> {
    validate_key(key).map_err(|rule| Problem::Key(rule.to_string()))?;
    match operator {
        Operator::In | Operator::NotIn => {
            if values.is_empty() {
                return Err(Problem::Values(
                    "for 'in', 'notin' operators, values set can't be empty".to_owned(),
                ));
            }
        }
        Operator::Equals | Operator::NotEquals => {
            if values.len() != 1 {
                return Err(Problem::Values(
                    "exact-match compatibility requires one single value".to_owned(),
                ));
            }
        }
        Operator::Exists | Operator::DoesNotExist => {
            if !values.is_empty() {
                return Err(Problem::Values(
                    "values set must be empty for exists and does not exist".to_owned(),
                ));
            }
        }
        Operator::GreaterThan | Operator::LessThan => {
            if values.len() != 1 {
                return Err(Problem::Values(
                    "for 'Gt', 'Lt' operators, exactly one value is required".to_owned(),
                ));
            }
            for (index, value) in values.iter().enumerate() {
                if value.parse::<i64>().is_err() {
                    return Err(Problem::Value {
                        index,
                        reason: "for 'Gt', 'Lt' operators, the value must be an integer".to_owned(),
                    });
                }
            }
        }
    }
    for (index, value) in values.iter().enumerate() {
        validate_value(value).map_err(|rule| Problem::Value {
            index,
            reason: rule.to_string(),
        })?;
    }
    Ok(())
}

const NAME_RULE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// `validation.IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain of at most
/// 253 characters, name at most 63 characters of `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
fn validate_key(key: &str) -> Result<(), NameRule> {
    let name = match key.split_once('/') {
        None => key,
        Some((_, name)) if name.contains('/') => return Err(NameRule::TwoSlashes),
        Some((prefix, name)) => {
            if prefix.is_empty() {
                return Err(NameRule::EmptyPrefix);
            }
            if prefix.len() > MAX_PREFIX_LEN {
                return Err(NameRule::LongPrefix);
            }
            if !is_dns1123_subdomain(prefix) {
                return Err(NameRule::PrefixNotDns);
            }
            name
        }
    };
    if name.is_empty() {
        return Err(NameRule::EmptyName);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameRule::LongName);
    }
    if !is_qualified_name_part(name) {
        return Err(NameRule::NameCharacters);
    }
    Ok(())
}

/// `validation.IsValidLabelValue`: empty, or at most 63 characters of the name rule.
fn validate_value(value: &str) -> Result<(), NameRule> {
    if value.len() > MAX_NAME_LEN {
        return Err(NameRule::LongValue);
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        return Err(NameRule::ValueCharacters);
    }
    Ok(())
}

/// Which of apimachinery's label key and value rules a name breaks, in its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum NameRule {
    #[error("a label key may contain at most one '/' (an optional DNS subdomain prefix)")]
    TwoSlashes,
    #[error("prefix part must be non-empty")]
    EmptyPrefix,
    #[error("prefix part must be no more than {MAX_PREFIX_LEN} characters")]
    LongPrefix,
    #[error(
        "prefix part must be a lowercase DNS-1123 subdomain: lowercase alphanumeric characters, '-' or '.', starting and ending with an alphanumeric character"
    )]
    PrefixNotDns,
    #[error("name part must be non-empty")]
    EmptyName,
    #[error("name part must be no more than {MAX_NAME_LEN} characters")]
    LongName,
    #[error("name part {NAME_RULE}")]
    NameCharacters,
    #[error("must be no more than {MAX_NAME_LEN} characters")]
    LongValue,
    #[error("a valid label value {NAME_RULE}")]
    ValueCharacters,
}

fn is_qualified_name_part(text: &str) -> bool {
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn is_dns1123_subdomain(text: &str) -> bool {
    text.split('.').all(|label| {
        let bytes = label.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
            }
            _ => false,
        }
    })
}

/// A lexer token. `In`/`NotIn` are keywords only where an operator is expected;
/// elsewhere [`Tok::ident`] turns them back into identifiers, as upstream's `Values`
/// parser context does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok<'a> {
    End,
    Comma,
    Open,
    Close,
    Bang,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    In,
    NotIn,
    Ident(&'a str),
}

impl<'a> Tok<'a> {
    fn ident(self) -> Option<&'a str> {
        match self {
            Self::Ident(text) => Some(text),
            Self::In => Some("in"),
            Self::NotIn => Some("notin"),
            _ => None,
        }
    }

    /// How the token is shown in a syntax error.
    fn describe(self) -> String {
        let text = match self {
            Self::End => return "end of string".to_owned(),
            Self::Comma => ",",
            Self::Open => "(",
            Self::Close => ")",
            Self::Bang => "!",
            Self::Eq => "=",
            Self::DoubleEq => "==",
            Self::NotEq => "!=",
            Self::Gt => ">",
            Self::Lt => "<",
            Self::In => "in",
            Self::NotIn => "notin",
            Self::Ident(text) => text,
        };
        format!("'{}'", snippet(text))
    }
}

fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(byte: u8) -> bool {
    matches!(byte, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Splits the whole input into (token, byte offset) pairs, ending with `End`. Every
/// special character is a token by itself, except that `!=` and `==` are read as one
/// (upstream's longest match; `!==` is `!=` then `=`). Everything between specials and
/// whitespace is one identifier, to be validated by the parser.
fn lex(input: &str) -> Vec<(Tok<'_>, usize)> {
    let bytes = input.as_bytes();
    let mut tokens = Vec::new();
    let mut pos = 0;
    loop {
        while bytes.get(pos).is_some_and(|b| is_whitespace(*b)) {
            pos += 1;
        }
        let Some(&byte) = bytes.get(pos) else {
            tokens.push((Tok::End, pos));
            return tokens;
        };
        let start = pos;
        let next = bytes.get(pos + 1).copied();
        let (tok, len) = match (byte, next) {
            (b'!', Some(b'=')) => (Tok::NotEq, 2),
            (b'=', Some(b'=')) => (Tok::DoubleEq, 2),
            (b'!', _) => (Tok::Bang, 1),
            (b'=', _) => (Tok::Eq, 1),
            (b'(', _) => (Tok::Open, 1),
            (b')', _) => (Tok::Close, 1),
            (b',', _) => (Tok::Comma, 1),
            (b'>', _) => (Tok::Gt, 1),
            (b'<', _) => (Tok::Lt, 1),
            _ => {
                let mut end = pos;
                while bytes
                    .get(end)
                    .is_some_and(|b| !is_special(*b) && !is_whitespace(*b))
                {
                    end += 1;
                }
                // Token boundaries are ASCII bytes, so these are char boundaries.
                let text = input.get(start..end).unwrap_or_default();
                let tok = match text {
                    "in" => Tok::In,
                    "notin" => Tok::NotIn,
                    _ => Tok::Ident(text),
                };
                (tok, end - start)
            }
        };
        tokens.push((tok, start));
        pos += len;
    }
}

/// Recursive descent over the token list, mirroring upstream's `Parser`.
struct Parser<'a> {
    /// Always ends with `Tok::End` (see [`lex`]).
    tokens: Vec<(Tok<'a>, usize)>,
    next: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> (Tok<'a>, usize) {
        // The last token is End and is never consumed past, so `next` stays in range;
        // the fallback only keeps this total.
        self.tokens.get(self.next).copied().unwrap_or((Tok::End, 0))
    }

    fn bump(&mut self) -> (Tok<'a>, usize) {
        let token = self.peek();
        if token.0 != Tok::End {
            self.next += 1;
        }
        token
    }

    fn error(token: (Tok<'_>, usize), expected: &'static str) -> SelectorError {
        SelectorError::Syntax {
            position: token.1,
            found: token.0.describe(),
            expected,
        }
    }

    fn selector(mut self) -> Result<Selector, SelectorError> {
        let mut requirements = Vec::new();
        if self.peek().0 == Tok::End {
            return Ok(Selector::everything());
        }
        loop {
            let token = self.peek();
            if token.0 != Tok::Bang && token.0.ident().is_none() {
                return Err(Self::error(token, "'!', a label key, or end of string"));
            }
            requirements.push(self.requirement()?);
            let token = self.bump();
            match token.0 {
                Tok::End => return Ok(Selector::from_requirements(requirements)),
                Tok::Comma => {
                    let after = self.peek();
                    if after.0 != Tok::Bang && after.0.ident().is_none() {
                        return Err(Self::error(after, "'!' or a label key after ','"));
                    }
                }
                _ => return Err(Self::error(token, "',' or end of string")),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let mut token = self.bump();
        let negated = token.0 == Tok::Bang;
        if negated {
            token = self.bump();
        }
        let Some(key) = token.0.ident() else {
            return Err(Self::error(token, "a label key"));
        };
        let key_pos = token.1;
        if let Err(rule) = validate_key(key) {
            return Err(SelectorError::InvalidKey {
                location: Location::Byte(key_pos),
                key: snippet(key),
                reason: rule.to_string(),
            });
        }
        if negated || matches!(self.peek().0, Tok::End | Tok::Comma) {
            // After `!key`, anything but ',' or the end is reported by the caller, as
            // upstream does ("!x=a": found '=', expected ',' or end of string).
            let operator = if negated {
                Operator::DoesNotExist
            } else {
                Operator::Exists
            };
            return Requirement::build(key, operator, Vec::new(), |_| Location::Byte(key_pos));
        }
        let op_token = self.bump();
        let operator = match op_token.0 {
            Tok::In => Operator::In,
            Tok::NotIn => Operator::NotIn,
            Tok::Eq | Tok::DoubleEq => Operator::Equals,
            Tok::NotEq => Operator::NotEquals,
            Tok::Gt => Operator::GreaterThan,
            Tok::Lt => Operator::LessThan,
            _ => return Err(Self::error(op_token, "one of in, notin, =, ==, !=, >, <")),
        };
        let values = match operator {
            Operator::In | Operator::NotIn => self.value_set()?,
            _ => vec![self.exact_value(op_token.1)?],
        };
        let positions: Vec<usize> = values.iter().map(|(_, pos)| *pos).collect();
        let values = values.into_iter().map(|(value, _)| value).collect();
        Requirement::build(key, operator, values, |index| {
            Location::Byte(
                index
                    .and_then(|i| positions.get(i).copied())
                    .unwrap_or(key_pos),
            )
        })
    }

    /// The value after `=`, `!=`, `>`, `<`: absent (end or ',') means "".
    fn exact_value(&mut self, op_pos: usize) -> Result<(String, usize), SelectorError> {
        let token = self.peek();
        if matches!(token.0, Tok::End | Tok::Comma) {
            return Ok((String::new(), op_pos));
        }
        let token = self.bump();
        match token.0.ident() {
            Some(value) => Ok((value.to_owned(), token.1)),
            None => Err(Self::error(token, "a label value")),
        }
    }

    /// `( … )` after `in`/`notin`, with upstream's handling of empty slots.
    fn value_set(&mut self) -> Result<Vec<(String, usize)>, SelectorError> {
        let open = self.bump();
        if open.0 != Tok::Open {
            return Err(Self::error(open, "'('"));
        }
        let token = self.peek();
        if token.0 == Tok::Close {
            self.bump();
            return Ok(vec![(String::new(), token.1)]);
        }
        if token.0 != Tok::Comma && token.0.ident().is_none() {
            return Err(Self::error(token, "',', ')' or a label value"));
        }
        let values = self.value_list()?;
        let close = self.bump();
        if close.0 != Tok::Close {
            return Err(Self::error(close, "')'"));
        }
        Ok(values)
    }

    /// Upstream's `parseIdentifiersList`, quirks included: a leading or trailing ',' and
    /// ",," add the empty value, but ",,)" is an error.
    fn value_list(&mut self) -> Result<Vec<(String, usize)>, SelectorError> {
        let mut values = Vec::new();
        loop {
            let token = self.bump();
            if let Some(value) = token.0.ident() {
                values.push((value.to_owned(), token.1));
                let after = self.peek();
                match after.0 {
                    Tok::Comma => continue,
                    Tok::Close => return Ok(values),
                    _ => return Err(Self::error(after, "',' or ')'")),
                }
            }
            if token.0 != Tok::Comma {
                return Err(Self::error(token, "',' or a label value"));
            }
            if values.is_empty() {
                values.push((String::new(), token.1));
            }
            let after = self.peek();
            if after.0 == Tok::Close {
                values.push((String::new(), after.1));
                return Ok(values);
            }
            if after.0 == Tok::Comma {
                self.bump();
                values.push((String::new(), after.1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn sel(text: &str) -> Selector {
        match Selector::parse(text) {
            Ok(selector) => selector,
            Err(err) => panic!("{text:?} should parse: {err}"),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn upstream_good_strings_parse_and_print_without_spaces() {
        // kubernetes/apimachinery pkg/labels/selector_test.go TestSelectorParse.
        for (input, canonical) in [
            ("x=a,y=b,z=c", "x=a,y=b,z=c"),
            ("", ""),
            ("x!=a,y=b", "x!=a,y=b"),
            ("x=", "x="),
            ("x= ", "x="),
            ("x=,z= ", "x=,z="),
            ("x= ,z= ", "x=,z="),
            ("!x", "!x"),
            ("x>1", "x>1"),
            ("x>1,z<5", "x>1,z<5"),
        ] {
            assert_eq!(sel(input).to_string(), canonical, "{input:?}");
        }
    }

    #[test]
    fn upstream_bad_strings_are_rejected() {
        for input in ["x=a||y=b", "x==a==b", "!x=a", "x<a"] {
            assert!(Selector::parse(input).is_err(), "{input:?} should fail");
        }
    }

    #[test]
    fn every_operator_matches_as_upstream() {
        let present = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("gen", "7"),
            ("empty", ""),
        ]);
        // (selector, matches `present`, matches empty label set)
        let cases = [
            ("app=web", true, false),
            ("app==web", true, false),
            ("app=db", false, false),
            ("app!=db", true, true),
            ("app!=web", false, true),
            ("missing!=x", true, true),
            ("app in (web,db)", true, false),
            ("app in (db)", false, false),
            ("missing in (x)", false, false),
            ("app notin (web)", false, true),
            ("app notin (db,cache)", true, true),
            ("missing notin (x)", true, true),
            ("app", true, false),
            ("missing", false, false),
            ("!app", false, true),
            ("!missing", true, true),
            ("gen>5", true, false),
            ("gen>7", false, false),
            ("gen<8", true, false),
            ("gen<7", false, false),
            ("app>1", false, false), // not an integer: no match
            ("missing<10", false, false),
            ("empty=", true, false),
            ("empty in ()", true, false),
            ("empty", true, false),
            ("!empty", false, true),
            ("empty!=", false, true),
            ("app=web,tier=front", true, false),
            ("app=web,tier=back", false, false),
            ("", true, true),
        ];
        let nothing: BTreeMap<String, String> = BTreeMap::new();
        for (text, on_present, on_empty) in cases {
            let selector = sel(text);
            assert_eq!(
                selector.matches(&present),
                on_present,
                "{text:?} on present"
            );
            assert_eq!(selector.matches(&nothing), on_empty, "{text:?} on empty");
        }
    }

    #[test]
    fn greater_and_less_than_compare_signed_i64_labels() {
        let negative = [("n", "-3")];
        assert!(sel("n<0").matches(&negative));
        assert!(!sel("n>0").matches(&negative));
        assert!(sel("n>0").matches(&[("n", "+4")]));
        assert!(!sel("n>0").matches(&[("n", "99999999999999999999")]));
        assert!(!sel("n>0").matches(&[("n", "1_000")]));
        assert!(sel("n>9223372036854775806").matches(&[("n", "9223372036854775807")]));
        assert_eq!(sel("n>0005").to_string(), "n>5");
        assert_eq!(sel("n>0005"), sel("n>5"));
        // The bound itself must be a valid label value, so no sign.
        assert!(Selector::parse("n>-1").is_err());
        assert!(Selector::parse("n>99999999999999999999").is_err());
        assert!(Selector::parse("n>").is_err());
    }

    #[test]
    fn whitespace_keywords_and_empty_values_follow_upstream() {
        let cases = [
            ("  x  =  a  ,  y  ", "x=a,y"),
            ("\tx\r\n!=\na", "x!=a"),
            ("x in(a,b)", "x in (a,b)"),
            ("x notin(b,a)", "x notin (a,b)"),
            ("x in (b, a ,a)", "x in (a,b)"),
            ("in in (in)", "in in (in)"),
            ("notin notin (notin,in)", "notin notin (in,notin)"),
            ("in", "in"),
            ("!notin", "!notin"),
            ("in=notin", "in=notin"),
            ("x in ()", "x in ()"),
            ("x in (,)", "x in ()"),
            ("x in (a,)", "x in (,a)"),
            ("x in (,a)", "x in (,a)"),
            ("x in (a,,b)", "x in (,a,b)"),
            ("x in (,,a)", "x in (,a)"),
            ("x notin ()", "x notin ()"),
            (
                "example.com/failure-domain == primary",
                "example.com/failure-domain=primary",
            ),
            ("b=1,a=2,b=1", "a=2,b=1"),
            ("a==b", "a=b"),
            ("   ", ""),
        ];
        for (input, canonical) in cases {
            assert_eq!(sel(input).to_string(), canonical, "{input:?}");
        }
        assert_eq!(sel("x in (foo,,baz),y,z notin ()").requirements().len(), 3);
        assert_eq!(sel("a=1,b=2"), sel("b=2 , a==1"));
    }

    #[test]
    fn syntax_errors_name_the_token_and_its_byte() {
        let cases: [(&str, usize, &str); 16] = [
            (",", 0, "','"),
            ("a,", 2, "end of string"),
            ("a,,b", 2, "','"),
            ("a b", 2, "'b'"),
            ("a=b c", 4, "'c'"),
            ("!x=a", 2, "'='"),
            ("!!x", 1, "'!'"),
            ("x==a==b", 4, "'=='"),
            ("x!==a", 3, "'='"),
            ("x in a", 5, "'a'"),
            ("x in (a", 7, "end of string"),
            ("x in (a b)", 8, "'b'"),
            ("x in (a,,)", 9, "')'"),
            ("x in (=)", 6, "'='"),
            ("x=(a)", 2, "'('"),
            ("a!", 1, "'!'"),
        ];
        for (input, position, found) in cases {
            match Selector::parse(input) {
                Err(SelectorError::Syntax {
                    position: p,
                    found: f,
                    ..
                }) => {
                    assert_eq!((p, f.as_str()), (position, found), "{input:?}");
                }
                other => panic!("{input:?}: expected a syntax error, got {other:?}"),
            }
        }
        let message = Selector::parse("a=b c")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "unable to parse label selector: found 'c' at byte 4, expected ',' or end of string"
        );
    }

    #[test]
    fn invalid_keys_and_values_are_rejected_with_their_position() {
        let name63 = "a".repeat(63);
        let name64 = "a".repeat(64);
        let prefix253 = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(prefix253.len(), 253);
        let prefix254 = format!("{prefix253}e");
        let good = [
            name63.clone(),
            format!("{prefix253}/{name63}"),
            "A_b.c-D".to_owned(),
            "9".to_owned(),
            "k8s.io/x".to_owned(),
            "a-b.c/n".to_owned(),
        ];
        for key in &good {
            assert!(Selector::parse(&format!("{key}=v")).is_ok(), "{key:?}");
        }
        let bad = [
            name64.clone(),
            format!("{prefix254}/x"),
            "_x".to_owned(),
            "x_".to_owned(),
            "-x".to_owned(),
            "/x".to_owned(),
            "x/".to_owned(),
            "a/b/c".to_owned(),
            "Upper.Case/x".to_owned(),
            "a..b/x".to_owned(),
            "-a/x".to_owned(),
            "a_b/x".to_owned(),
            "caf\u{e9}".to_owned(),
            "a\0b".to_owned(),
            "\"x\"".to_owned(),
        ];
        for key in &bad {
            match Selector::parse(&format!(" {key}=v")) {
                Err(SelectorError::InvalidKey { location, .. }) => {
                    assert_eq!(location, Location::Byte(1), "{key:?}");
                }
                other => panic!("{key:?}: expected InvalidKey, got {other:?}"),
            }
        }
        for value in [name64.as_str(), "_v", "v-", "a/b", "caf\u{e9}", "'x'"] {
            let input = format!("k in (ok, {value})");
            match Selector::parse(&input) {
                Err(SelectorError::InvalidValue { location, .. }) => {
                    assert_eq!(location, Location::Byte(10), "{value:?}");
                }
                other => panic!("{value:?}: expected InvalidValue, got {other:?}"),
            }
        }
        assert!(Selector::parse(&format!("k={name63}")).is_ok());
        let err = Selector::parse("_zoo=bar").map(|_| ()).unwrap_err();
        assert_eq!(err.position(), Some(0));
        assert!(err.to_string().contains("\"_zoo\""), "{err}");
    }

    #[test]
    fn oversized_input_is_rejected_before_parsing() {
        let long = format!("a={}", "b".repeat(MAX_SELECTOR_LEN));
        assert_eq!(
            Selector::parse(&long),
            Err(SelectorError::TooLong {
                len: MAX_SELECTOR_LEN + 2,
                max: MAX_SELECTOR_LEN
            })
        );
        // Exactly at the limit is parsed (and fails only on its merits).
        let many = vec!["a"; MAX_SELECTOR_LEN / 2].join(",");
        assert!(many.len() < MAX_SELECTOR_LEN);
        assert_eq!(sel(&many).requirements().len(), 1);
        let at_limit = format!("{}{}", " ".repeat(MAX_SELECTOR_LEN - 3), "a=b");
        assert_eq!(sel(&at_limit).to_string(), "a=b");
    }

    #[test]
    fn requirement_new_validates_like_new_requirement() {
        assert!(Requirement::new("a", Operator::In, Vec::<String>::new()).is_err());
        assert!(Requirement::new("a", Operator::Equals, ["x", "y"]).is_err());
        assert!(Requirement::new("a", Operator::Exists, ["x"]).is_err());
        assert!(Requirement::new("a", Operator::GreaterThan, ["x"]).is_err());
        assert!(Requirement::new("a", Operator::GreaterThan, ["1", "2"]).is_err());
        assert!(Requirement::new("", Operator::Exists, Vec::<String>::new()).is_err());
        let req = Requirement::new("a", Operator::NotIn, ["z", "", "z"]).map_err(|e| e.to_string());
        let req = req.as_ref().map(Requirement::values);
        assert_eq!(req, Ok(&["".to_owned(), "z".to_owned()][..]));
    }

    #[test]
    fn label_lookup_implementations_agree() {
        let selector = sel("app=web,!gone,n>1");
        let btree = labels(&[("app", "web"), ("n", "2")]);
        let hash: HashMap<String, String> = btree.clone().into_iter().collect();
        let pairs = [("app", "web"), ("n", "2")];
        let pair_vec = pairs.to_vec();
        let owned: Vec<(String, String)> = btree.clone().into_iter().collect();
        assert!(selector.matches(&btree));
        assert!(selector.matches(&hash));
        assert!(selector.matches(&pairs));
        assert!(selector.matches(&pairs[..]));
        assert!(selector.matches(&pair_vec));
        assert!(selector.matches(&owned));
        assert!(selector.matches(&owned[..]));
        assert!(selector.matches(&&btree));
        // First pair wins on duplicates.
        assert!(sel("a=1").matches(&[("a", "1"), ("a", "2")]));
    }

    #[test]
    fn requires_exact_match_finds_the_forced_value() {
        let selector = sel("scaledobject.keda.sh/name=llm,app in (a,b),tier in (x)");
        assert_eq!(
            selector.requires_exact_match("scaledobject.keda.sh/name"),
            Some("llm")
        );
        assert_eq!(selector.requires_exact_match("tier"), Some("x"));
        assert_eq!(selector.requires_exact_match("app"), None);
        assert_eq!(selector.requires_exact_match("other"), None);
        assert_eq!(sel("a!=b").requires_exact_match("a"), None);
    }

    #[test]
    fn label_selector_object_round_trips() {
        let object = json!({
            "matchLabels": {"app": "web", "example.com/team": "ml"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "back"]},
                {"key": "zone", "operator": "NotIn", "values": ["a"]},
                {"key": "gpu", "operator": "Exists"},
                {"key": "spot", "operator": "DoesNotExist", "values": []},
            ],
            "unknownField": 1,
        });
        let selector = Selector::from_label_selector(&object).map_err(|e| e.to_string());
        assert_eq!(
            selector.as_ref().map(ToString::to_string),
            Ok(
                "app=web,example.com/team=ml,gpu,!spot,tier in (back,front),zone notin (a)"
                    .to_owned()
            )
        );
        let back = selector.as_ref().map(Selector::to_label_selector);
        assert_eq!(
            back,
            Ok(json!({
                "matchLabels": {"app": "web", "example.com/team": "ml"},
                "matchExpressions": [
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "spot", "operator": "DoesNotExist"},
                    {"key": "tier", "operator": "In", "values": ["back", "front"]},
                    {"key": "zone", "operator": "NotIn", "values": ["a"]},
                ],
            }))
        );
        assert_eq!(
            Selector::from_label_selector(&json!(null)),
            Ok(Selector::everything())
        );
        assert_eq!(
            Selector::from_label_selector(&json!({})),
            Ok(Selector::everything())
        );
        assert_eq!(
            Selector::from_label_selector(&json!({"matchLabels": null, "matchExpressions": null})),
            Ok(Selector::everything())
        );
        assert_eq!(Selector::everything().to_label_selector(), Value::Null);
    }

    #[test]
    fn to_label_selector_represents_every_operator() {
        let selector = sel("a=1,a=2,b!=x,n>3,m<4");
        assert_eq!(
            selector.to_label_selector(),
            json!({
                "matchLabels": {"a": "1"},
                "matchExpressions": [
                    {"key": "a", "operator": "In", "values": ["2"]},
                    {"key": "b", "operator": "NotIn", "values": ["x"]},
                    {"key": "m", "operator": "Lt", "values": ["4"]},
                    {"key": "n", "operator": "Gt", "values": ["3"]},
                ],
            })
        );
    }

    #[test]
    fn label_selector_object_errors_say_where() {
        let cases = [
            (json!("a=b"), ""),
            (json!({"matchLabels": []}), "matchLabels"),
            (json!({"matchLabels": {"a": 1}}), "matchLabels[\"a\"]"),
            (json!({"matchExpressions": {}}), "matchExpressions"),
            (json!({"matchExpressions": [1]}), "matchExpressions[0]"),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "matchExpressions[0].operator",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "in", "values": ["1"]}]}),
                "matchExpressions[0].operator",
            ),
            (
                json!({"matchExpressions": [{"key": "a"}]}),
                "matchExpressions[0].operator",
            ),
            (
                json!({"matchExpressions": [{"key": 1, "operator": "Exists"}]}),
                "matchExpressions[0].key",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}),
                "matchExpressions[0].values",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": [true]}]}),
                "matchExpressions[0].values[0]",
            ),
        ];
        for (object, path) in cases {
            match Selector::from_label_selector(&object) {
                Err(SelectorError::InvalidObject { location, .. }) => {
                    let expected = if path.is_empty() {
                        Location::Unspecified
                    } else {
                        Location::Field(path.to_owned())
                    };
                    assert_eq!(location, expected, "{object}");
                }
                other => panic!("{object}: expected InvalidObject, got {other:?}"),
            }
        }
        let validation = [
            (json!({"matchLabels": {"_a": "b"}}), "InvalidKey"),
            (json!({"matchLabels": {"a": "b c"}}), "InvalidValue"),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "InvalidValues",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
                "InvalidValues",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "InvalidValues",
            ),
            (
                json!({"matchExpressions": [{"operator": "Exists"}]}),
                "InvalidKey",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "-bad"]}]}),
                "InvalidValue",
            ),
        ];
        for (object, kind) in validation {
            let err = Selector::from_label_selector(&object)
                .map(|_| ())
                .unwrap_err();
            assert!(format!("{err:?}").starts_with(kind), "{object}: {err:?}");
        }
        let err = Selector::from_label_selector(&json!({"matchExpressions": [
            {"key": "a", "operator": "In", "values": ["ok", "-bad"]}]}))
        .map(|_| ())
        .unwrap_err();
        assert!(
            err.to_string().contains("at matchExpressions[0].values[1]"),
            "{err}"
        );
    }

    // ---- property tests ----

    fn key_strategy() -> impl Strategy<Value = String> {
        let name = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?";
        let prefix =
            "[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?){0,3}";
        prop_oneof![
            3 => name.prop_map(String::from),
            1 => (prefix, name).prop_map(|(p, n)| format!("{p}/{n}")),
            1 => prop::sample::select(vec!["in".to_owned(), "notin".to_owned(), "a".to_owned()]),
        ]
    }

    fn value_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?".prop_map(String::from),
            1 => prop::sample::select(vec![String::new(), "in".to_owned(), "notin".to_owned()]),
        ]
    }

    fn requirement_strategy() -> impl Strategy<Value = Requirement> {
        let ops = prop::sample::select(vec![
            Operator::Exists,
            Operator::DoesNotExist,
            Operator::Equals,
            Operator::NotEquals,
            Operator::In,
            Operator::NotIn,
            Operator::GreaterThan,
            Operator::LessThan,
        ]);
        (
            key_strategy(),
            ops,
            prop::collection::vec(value_strategy(), 1..4),
            any::<u32>(),
        )
            .prop_map(|(key, op, values, number)| {
                let values = match op {
                    Operator::Exists | Operator::DoesNotExist => Vec::new(),
                    Operator::Equals | Operator::NotEquals => values[..1].to_vec(),
                    Operator::GreaterThan | Operator::LessThan => vec![number.to_string()],
                    Operator::In | Operator::NotIn => values,
                };
                match Requirement::new(&key, op, values) {
                    Ok(requirement) => requirement,
                    Err(err) => panic!("generated requirement is invalid: {err}"),
                }
            })
    }

    fn selector_strategy() -> impl Strategy<Value = Selector> {
        prop::collection::vec(requirement_strategy(), 0..6).prop_map(Selector::from_requirements)
    }

    /// Strings built from the selector alphabet, far likelier than random text to reach
    /// deep parser states.
    fn selector_like_text() -> impl Strategy<Value = String> {
        let pieces = prop::sample::select(vec![
            "a", "b", "k8s.io/", "x", "in", "notin", "=", "==", "!", "!=", ">", "<", ",", "(", ")",
            " ", "\t", "1", "-", "_", ".", "/", "\0", "é",
        ]);
        prop::collection::vec(pieces, 0..24).prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn parse_never_panics(text in any::<String>()) {
            let _ = Selector::parse(&text);
        }

        #[test]
        fn parse_of_selector_like_text_is_stable(text in selector_like_text()) {
            if let Ok(selector) = Selector::parse(&text) {
                let printed = selector.to_string();
                prop_assert_eq!(Selector::parse(&printed), Ok(selector), "printed {:?}", printed);
            }
        }

        #[test]
        fn display_round_trips(selector in selector_strategy()) {
            let printed = selector.to_string();
            prop_assert_eq!(Selector::parse(&printed), Ok(selector.clone()), "printed {:?}", printed);
            prop_assert_eq!(selector.is_empty(), printed.is_empty());
        }

        #[test]
        fn label_selector_object_round_trips_semantically(
            selector in selector_strategy(),
            label_values in prop::collection::vec(value_strategy(), 3),
        ) {
            let object = selector.to_label_selector();
            let has_gt_lt = selector.requirements().iter().any(|r| {
                matches!(r.operator(), Operator::GreaterThan | Operator::LessThan)
            });
            let back = Selector::from_label_selector(&object);
            if has_gt_lt {
                prop_assert!(back.is_err());
            } else {
                let back = back.map_err(|e| TestCaseError::fail(e.to_string()))?;
                // Same answers on label sets built from the selector's own keys and values.
                for requirement in selector.requirements() {
                    for value in requirement.values().iter().chain(&label_values) {
                        let set = [(requirement.key(), value.as_str())];
                        prop_assert_eq!(selector.matches(&set), back.matches(&set));
                    }
                    let none: [(&str, &str); 0] = [];
                    prop_assert_eq!(selector.matches(&none), back.matches(&none));
                }
            }
        }

        #[test]
        fn negative_operators_match_absent_keys(requirement in requirement_strategy()) {
            let none: [(&str, &str); 0] = [];
            let expected = matches!(
                requirement.operator(),
                Operator::DoesNotExist | Operator::NotEquals | Operator::NotIn
            );
            prop_assert_eq!(requirement.matches(&none), expected);
        }
    }
}
