//! Label and field selectors, as the API server parses and applies them.
//!
//! The exporter's pod watch depends on the API server filtering by `spec.nodeName` and
//! `status.phase`, and on it turning "stops matching" into a `DELETED` event, and the
//! adapter's EndpointSlice watch on the `kubernetes.io/service-name` label; the fake
//! must therefore evaluate selectors exactly enough that a wrong selector in a client
//! fails a test instead of silently matching everything.

use std::collections::BTreeMap;

/// Why a selector was rejected (the API server answers 400 BadRequest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SelectorError {
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
    #[error("invalid field selector: {0:?}: expected <field>=<value>, ==, or !=")]
    MalformedField(String),
    #[error("unable to parse requirement: {0:?}")]
    MalformedLabel(String),
}

/// The fields a field selector can name (the subset of the API server's field sets the
/// fake models).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Name,
    Namespace,
    NodeName,
    Phase,
}

/// The fields every kind of object can be selected by.
pub(crate) const OBJECT_FIELDS: &[Field] = &[Field::Name, Field::Namespace];

/// The fields pods can be selected by.
pub(crate) const POD_FIELDS: &[Field] =
    &[Field::Name, Field::Namespace, Field::NodeName, Field::Phase];

impl Field {
    /// The field `name` names, if it is one of `supported` (the API server refuses
    /// fields a kind does not define, e.g. `spec.nodeName` on EndpointSlices).
    fn parse(name: &str, supported: &[Field]) -> Result<Field, SelectorError> {
        let field = match name {
            "metadata.name" => Some(Field::Name),
            "metadata.namespace" => Some(Field::Namespace),
            "spec.nodeName" => Some(Field::NodeName),
            "status.phase" => Some(Field::Phase),
            _ => None,
        };
        field
            .filter(|f| supported.contains(f))
            .ok_or_else(|| SelectorError::UnsupportedField(name.to_string()))
    }
}

/// What a field selector looks at in one object.
pub(crate) trait Fields {
    fn field(&self, field: Field) -> &str;
}

/// A parsed field selector: every term must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<(Field, bool, String)>);

impl FieldSelector {
    /// Parses `a=b,c==d,e!=f` over the `supported` fields; empty selects everything.
    pub(crate) fn parse(text: &str, supported: &[Field]) -> Result<FieldSelector, SelectorError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError::MalformedField(term.to_string()));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(SelectorError::MalformedField(term.to_string()));
            }
            terms.push((
                Field::parse(field, supported)?,
                equal,
                value.trim().to_string(),
            ));
        }
        Ok(FieldSelector(terms))
    }

    pub(crate) fn matches(&self, object: &impl Fields) -> bool {
        self.0
            .iter()
            .all(|(field, equal, value)| (object.field(*field) == value) == *equal)
    }
}

/// One label requirement.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h` (and `==`); empty selects
    /// everything.
    pub(crate) fn parse(text: &str) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_top_level(text)? {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(LabelSelector(requirements))
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// Splits on the commas that separate requirements (not those inside `(…)`).
fn split_top_level(text: &str) -> Result<Vec<&str>, SelectorError> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| SelectorError::MalformedLabel(text.to_string()))?;
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError::MalformedLabel(text.to_string()));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(term: &str) -> Result<Requirement, SelectorError> {
    let bad = || SelectorError::MalformedLabel(term.to_string());
    let key = |k: &str| -> Result<String, SelectorError> {
        let k = k.trim();
        if k.is_empty() || k.contains(|c: char| c.is_whitespace() || "=!(),".contains(c)) {
            Err(bad())
        } else {
            Ok(k.to_string())
        }
    };
    if let Some(k) = term.strip_prefix('!') {
        return Ok(Requirement::NotExists(key(k)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k)?, value(v).ok_or_else(bad)?));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(key(k)?, value(v).ok_or_else(bad)?));
    }
    if let Some(open) = term.find('(') {
        let head = term[..open].trim_end();
        let values = term[open + 1..].strip_suffix(')').ok_or_else(bad)?;
        let values = values
            .split(',')
            .map(|v| value(v).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()?;
        let (k, op) = head.rsplit_once(char::is_whitespace).ok_or_else(bad)?;
        return match op {
            "in" => Ok(Requirement::In(key(k)?, values)),
            "notin" => Ok(Requirement::NotIn(key(k)?, values)),
            _ => Err(bad()),
        };
    }
    Ok(Requirement::Exists(key(term)?))
}

/// A label value: possibly empty, no whitespace inside or selector punctuation.
fn value(v: &str) -> Option<String> {
    let v = v.trim();
    (!v.contains(|c: char| c.is_whitespace() || "=!(),".contains(c))).then(|| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pod {
        name: &'static str,
        node: &'static str,
        phase: &'static str,
    }

    impl Fields for Pod {
        fn field(&self, field: Field) -> &str {
            match field {
                Field::Name => self.name,
                Field::Namespace => "default",
                Field::NodeName => self.node,
                Field::Phase => self.phase,
            }
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn field_selectors_and_their_terms() {
        let pod = Pod {
            name: "a",
            node: "node-a",
            phase: "Running",
        };
        let yes = [
            "",
            "spec.nodeName=node-a",
            "spec.nodeName==node-a",
            "spec.nodeName=node-a,status.phase!=Succeeded,status.phase!=Failed",
            " metadata.name = a , metadata.namespace=default",
        ];
        let no = [
            "spec.nodeName=node-b",
            "spec.nodeName=node-a,status.phase!=Running",
            "metadata.name!=a",
        ];
        for s in yes {
            assert!(
                FieldSelector::parse(s, POD_FIELDS).unwrap().matches(&pod),
                "{s}"
            );
        }
        for s in no {
            assert!(
                !FieldSelector::parse(s, POD_FIELDS).unwrap().matches(&pod),
                "{s}"
            );
        }
        assert_eq!(
            FieldSelector::parse("spec.restartPolicy=Always", POD_FIELDS)
                .unwrap_err()
                .to_string(),
            "field label not supported: spec.restartPolicy"
        );
        assert!(matches!(
            FieldSelector::parse("spec.nodeName", POD_FIELDS),
            Err(SelectorError::MalformedField(_))
        ));
        // A field of another kind is refused, as the API server refuses it.
        assert_eq!(
            FieldSelector::parse("spec.nodeName=node-a", OBJECT_FIELDS),
            Err(SelectorError::UnsupportedField("spec.nodeName".into()))
        );
        assert!(FieldSelector::parse("metadata.name=a", OBJECT_FIELDS).is_ok());
    }

    #[test]
    fn label_selectors_cover_every_operator() {
        let l = labels(&[("app", "web"), ("tier", "gpu"), ("empty", "")]);
        let yes = [
            "",
            "app=web",
            "app==web",
            "app!=db",
            "missing!=x",
            "app in (web, db)",
            "app in(web)",
            "app notin (db)",
            "missing notin (db)",
            "tier",
            "!missing",
            "empty=",
            "app=web,tier=gpu,!missing,app in (web,x)",
        ];
        let no = [
            "app=db",
            "app!=web",
            "app in (db,x)",
            "missing in (x)",
            "app notin (web)",
            "missing",
            "!app",
            "app=web,tier=cpu",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
        for bad in [
            "app in (web",
            "app)",
            "app oops (x)",
            "a b",
            "=x",
            "!",
            "app=a b",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }
}
