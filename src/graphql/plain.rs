//! Long lists of plain data, answered without async-graphql's machinery for each field.
//!
//! async-graphql resolves every field of every object as a boxed future, polled through a
//! `FuturesUnordered` of its object: about 0.6 µs a field. A resource group of 1,000 resources
//! and as many edges is some 15,000 fields, 7 to 9 ms of a view whose listing takes about 20.
//! Resources, their health, Events and edges are data held in memory, so when a query selects
//! them with plain fields only (no fragment, no directive, no `__typename`: the shape of
//! GitLab's queries), [`PlainList`] writes them straight into the answer; any other selection
//! goes through async-graphql as before. The two give the same answer, which the tests check.
//!
//! The schema has no extensions (`graphql::schema`); one that watched each field's resolution
//! would not see these.

use std::borrow::Cow;

use async_graphql::indexmap::IndexMap;
use async_graphql::parser::types::{Field, Selection, SelectionSet};
use async_graphql::registry::Registry;
use async_graphql::{ContextSelectionSet, Name, OutputType, Positioned, ServerResult, Value};

/// An object whose fields can be read without async resolution.
pub trait Plain {
    /// The value of field `name` (a field of the type; validation has checked that), with
    /// `selection` the field's own selection set when its type is an object or a list of them.
    fn field(&self, name: &str, selection: &SelectionSet) -> Value;
}

/// A list field of plain objects: the schema sees `[T!]!`, as for `Vec<T>`.
pub struct PlainList<T>(pub Vec<T>);

impl<T: OutputType + Plain> OutputType for PlainList<T> {
    fn type_name() -> Cow<'static, str> {
        Vec::<T>::type_name()
    }

    fn qualified_type_name() -> String {
        Vec::<T>::qualified_type_name()
    }

    fn create_type_info(registry: &mut Registry) -> String {
        Vec::<T>::create_type_info(registry)
    }

    async fn resolve(
        &self,
        ctx: &ContextSelectionSet<'_>,
        field: &Positioned<Field>,
    ) -> ServerResult<Value> {
        let selection = &ctx.item.node;
        if is_plain(selection) {
            Ok(list(&self.0, selection))
        } else {
            OutputType::resolve(&self.0, ctx, field).await
        }
    }
}

/// Fields only, each without directives and under a response key of its own (async-graphql
/// merges the selections of a key given twice), and so on all the way down.
pub fn is_plain(selection: &SelectionSet) -> bool {
    let mut keys: Vec<&str> = Vec::with_capacity(selection.items.len());
    selection.items.iter().all(|item| match &item.node {
        Selection::Field(field) => {
            let field = &field.node;
            let key = field.response_key().node.as_str();
            let first = !keys.contains(&key);
            keys.push(key);
            first
                && field.directives.is_empty()
                && field.name.node != "__typename"
                && is_plain(&field.selection_set.node)
        }
        Selection::FragmentSpread(_) | Selection::InlineFragment(_) => false,
    })
}

/// `item`'s answer to a plain `selection`: its fields by response key, in the query's order.
pub fn object(item: &impl Plain, selection: &SelectionSet) -> Value {
    let mut fields: IndexMap<Name, Value> = IndexMap::with_capacity(selection.items.len());
    for field in &selection.items {
        if let Selection::Field(field) = &field.node {
            let field = &field.node;
            let value = item.field(&field.name.node, &field.selection_set.node);
            fields.insert(field.response_key().node.clone(), value);
        }
    }
    Value::Object(fields)
}

/// A list of objects, each answering `selection`.
pub fn list<T: Plain>(items: &[T], selection: &SelectionSet) -> Value {
    Value::List(items.iter().map(|item| object(item, selection)).collect())
}

/// A string field.
pub fn string(text: &str) -> Value {
    Value::String(text.to_owned())
}

/// An optional field: `null` when absent.
pub fn optional<T>(value: Option<&T>, f: impl FnOnce(&T) -> Value) -> Value {
    value.map_or(Value::Null, f)
}
