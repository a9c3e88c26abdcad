//! What a GraphQL request's strings may hold, checked once for the whole request rather than by
//! each argument's resolver: every string argument written in the document and every string in
//! the variables reaches PostgreSQL as a lookup key, where a NUL is an error and a string longer
//! than any stored one can only find nothing. Either is a `BAD_USER_INPUT` error naming where.

use async_graphql::parser::types::{Directive, ExecutableDocument, Selection, SelectionSet};
use async_graphql::{Positioned, Value as ConstValue, Variables};
use async_graphql_value::Value;

use crate::gitlab::validate::MAX_FULL_PATH;

/// The longest string an argument or variable may hold: the longest full path envlens stores,
/// and so the longest key any lookup can match.
pub const MAX_STRING: usize = MAX_FULL_PATH;

/// The first string argument of the document that no lookup can take, as a message.
pub fn check_document(doc: &ExecutableDocument) -> Result<(), String> {
    for (_, op) in doc.operations.iter() {
        for var in &op.node.variable_definitions {
            if let Some(default) = &var.node.default_value {
                check_const(
                    &default.node,
                    &format!("default of ${}", var.node.name.node),
                )?;
            }
        }
        check_directives(&op.node.directives)?;
        check_set(&op.node.selection_set.node)?;
    }
    for fragment in doc.fragments.values() {
        check_directives(&fragment.node.directives)?;
        check_set(&fragment.node.selection_set.node)?;
    }
    Ok(())
}

/// The first string among the variables that no lookup can take, as a message.
pub fn check_variables(variables: &Variables) -> Result<(), String> {
    for (name, value) in variables.iter() {
        check_const(value, &format!("variable ${name}"))?;
    }
    Ok(())
}

fn check_set(set: &SelectionSet) -> Result<(), String> {
    for item in &set.items {
        match &item.node {
            Selection::Field(field) => {
                let field = &field.node;
                for (name, value) in &field.arguments {
                    check_value(
                        &value.node,
                        &format!("argument `{}` of `{}`", name.node, field.name.node),
                    )?;
                }
                check_directives(&field.directives)?;
                check_set(&field.selection_set.node)?;
            }
            Selection::FragmentSpread(spread) => check_directives(&spread.node.directives)?,
            Selection::InlineFragment(inline) => {
                check_directives(&inline.node.directives)?;
                check_set(&inline.node.selection_set.node)?;
            }
        }
    }
    Ok(())
}

fn check_directives(directives: &[Positioned<Directive>]) -> Result<(), String> {
    for directive in directives {
        for (name, value) in &directive.node.arguments {
            check_value(
                &value.node,
                &format!("argument `{}` of @{}", name.node, directive.node.name.node),
            )?;
        }
    }
    Ok(())
}

fn check_value(value: &Value, place: &str) -> Result<(), String> {
    match value {
        Value::String(s) => check_string(s, place),
        Value::List(items) => items.iter().try_for_each(|v| check_value(v, place)),
        Value::Object(fields) => fields.values().try_for_each(|v| check_value(v, place)),
        _ => Ok(()),
    }
}

fn check_const(value: &ConstValue, place: &str) -> Result<(), String> {
    match value {
        ConstValue::String(s) => check_string(s, place),
        ConstValue::List(items) => items.iter().try_for_each(|v| check_const(v, place)),
        ConstValue::Object(fields) => fields.values().try_for_each(|v| check_const(v, place)),
        _ => Ok(()),
    }
}

fn check_string(s: &str, place: &str) -> Result<(), String> {
    if s.contains('\0') {
        return Err(format!(
            "{place} must not contain the NUL character (\\u0000)"
        ));
    }
    if s.len() > MAX_STRING {
        return Err(format!("{place} must be at most {MAX_STRING} bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    fn doc(text: &str) -> Result<(), String> {
        check_document(&parse_query(text).unwrap())
    }

    #[test]
    fn strings_written_in_the_document() {
        assert!(doc(r#"{ project(fullPath: "a/b") { id } }"#).is_ok());
        assert_eq!(
            doc(r#"{ project(fullPath: "a\u0000") { id } }"#).unwrap_err(),
            "argument `fullPath` of `project` must not contain the NUL character (\\u0000)"
        );
        let long = "a".repeat(MAX_STRING + 1);
        assert!(doc(&format!(r#"{{ project(fullPath: "{long}") {{ id }} }}"#)).is_err());
        // Nested, in fragments, in directives and in defaults too.
        for text in [
            r#"{ project(fullPath: "a") { environments(states: ["x", "\u0000"]) { count } } }"#,
            r#"query { ...F } fragment F on Query { group(fullPath: "\u0000") { id } }"#,
            r#"{ project(fullPath: "a") @include(if: true) { ... @skip(if: false) { id } } }"#,
            r#"query Q($p: ID! = "\u0000") { project(fullPath: $p) { id } }"#,
        ] {
            let refused = text.contains("\\u0000");
            assert_eq!(doc(text).is_err(), refused, "{text}");
        }
    }

    #[test]
    fn strings_in_the_variables() {
        let vars = |v: serde_json::Value| Variables::from_json(v);
        assert!(check_variables(&vars(serde_json::json!({"p": "a/b", "n": 3}))).is_ok());
        assert_eq!(
            check_variables(&vars(serde_json::json!({"p": "a\u{0}b"}))).unwrap_err(),
            "variable $p must not contain the NUL character (\\u0000)"
        );
        assert!(check_variables(&vars(serde_json::json!({"p": {"x": ["\u{0}"]}}))).is_err());
        assert!(
            check_variables(&vars(serde_json::json!({"p": "a".repeat(MAX_STRING + 1)}))).is_err()
        );
    }
}
