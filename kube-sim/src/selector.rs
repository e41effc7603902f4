//! Field selectors, as the API server parses and applies them; label selectors are
//! `kube_support::selector`, the parser the adapter serves HPAs with.
//!
//! The exporter's pod watch depends on the API server filtering by `spec.nodeName` and
//! `status.phase`, and on it turning "stops matching" into a `DELETED` event, and the
//! adapter's EndpointSlice watch on the `kubernetes.io/service-name` label; the fake
//! must therefore evaluate selectors exactly enough that a wrong selector in a client
//! fails a test instead of silently matching everything.

/// Why a selector was rejected (the API server answers 400 BadRequest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SelectorError {
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
    #[error("invalid field selector: {0:?}: expected <field>=<value>, ==, or !=")]
    MalformedField(String),
    /// A label selector the API server's own parser refuses.
    #[error(transparent)]
    Label(#[from] kube_support::selector::SelectorError),
}

/// The fields a field selector can name (the subset of the API server's field sets the
/// fake models).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Name,
    Namespace,
    NodeName,
    Phase,
    /// `spec.driver` (ResourceSlices).
    Driver,
}

/// The fields every kind of object can be selected by.
pub(crate) const OBJECT_FIELDS: &[Field] = &[Field::Name, Field::Namespace];

/// The fields ResourceSlices can be selected by (cluster-scoped: no namespace).
pub(crate) const RESOURCE_SLICE_FIELDS: &[Field] = &[Field::Name, Field::NodeName, Field::Driver];

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
            "spec.driver" => Some(Field::Driver),
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
                Field::Driver => "",
            }
        }
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
        // ResourceSlices: by node and driver; cluster-scoped, so no namespace.
        assert!(
            FieldSelector::parse(
                "spec.nodeName=n,spec.driver=gpu.nvidia.com",
                RESOURCE_SLICE_FIELDS
            )
            .is_ok()
        );
        assert_eq!(
            FieldSelector::parse("metadata.namespace=x", RESOURCE_SLICE_FIELDS),
            Err(SelectorError::UnsupportedField("metadata.namespace".into()))
        );
        assert_eq!(
            FieldSelector::parse("spec.driver=x", POD_FIELDS),
            Err(SelectorError::UnsupportedField("spec.driver".into()))
        );
    }
}
