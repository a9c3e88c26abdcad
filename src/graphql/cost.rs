//! What one GraphQL request may cost before it is refused, judged as early and as cheaply as
//! possible: the text's size, then its names counted in one pass over the bytes (before the
//! parser builds anything), then every selection of the parsed document, fragments expanded,
//! `__typename` and aliases included (async-graphql's complexity counts neither `__typename`
//! nor, when refused, what it cost to parse). Parsing itself runs on the blocking pool, a few
//! at a time ([`parse_slot`]), so that the runtime's threads stay free for the probes.

use std::sync::LazyLock;

use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use tokio::sync::Semaphore;

/// The longest query text: GitLab's largest frontend queries are a few KiB.
pub const MAX_TEXT: usize = 64 * 1024;
/// Names (fields, aliases, arguments, types, keywords) in a text: a cheap bound on the work of
/// parsing it; every selection has at least one.
pub const MAX_NAMES: usize = 5_000;
/// Selections of a document, fragments expanded, each at least 1 toward the cost; the same as
/// the complexity limit, which counts list fields by their page size.
pub const MAX_SELECTIONS: usize = 5_000;

/// Refuses a text by its size and its names, before it is parsed.
pub fn check_text(text: &str) -> Result<(), String> {
    if text.len() > MAX_TEXT {
        return Err(format!("the query is longer than {MAX_TEXT} bytes"));
    }
    if names(text.as_bytes()) > MAX_NAMES {
        return Err(format!("the query has more than {MAX_NAMES} names"));
    }
    Ok(())
}

/// Names in a GraphQL text (`[_A-Za-z][_0-9A-Za-z]*`), outside strings and comments.
fn names(text: &[u8]) -> usize {
    let mut count = 0;
    let mut i = 0;
    let word = |b: u8| b == b'_' || b.is_ascii_alphanumeric();
    while i < text.len() {
        match text[i] {
            b'#' => {
                while i < text.len() && text[i] != b'\n' && text[i] != b'\r' {
                    i += 1;
                }
            }
            b'"' if text[i..].starts_with(b"\"\"\"") => {
                i += 3;
                while i < text.len() && !text[i..].starts_with(b"\"\"\"") {
                    i += if text[i..].starts_with(b"\\\"\"\"") {
                        4
                    } else {
                        1
                    };
                }
                i += 3;
            }
            b'"' => {
                i += 1;
                while i < text.len() && text[i] != b'"' && text[i] != b'\n' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b if word(b) => {
                // A number (`12`, `1e5`) is no name.
                if !b.is_ascii_digit() {
                    count += 1;
                }
                while i < text.len() && word(text[i]) {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    count
}

/// Refuses a document with more than [`MAX_SELECTIONS`] selections, counting each fragment
/// every time it is spread (a fragment spread inside itself, which validation refuses, counts
/// once and stops).
pub fn check_document(doc: &ExecutableDocument) -> Result<(), String> {
    let mut budget = MAX_SELECTIONS;
    let mut stack = Vec::new();
    for (_, op) in doc.operations.iter() {
        spend(doc, &op.node.selection_set.node, &mut budget, &mut stack)?;
    }
    Ok(())
}

fn spend<'a>(
    doc: &'a ExecutableDocument,
    set: &'a SelectionSet,
    budget: &mut usize,
    stack: &mut Vec<&'a str>,
) -> Result<(), String> {
    for item in &set.items {
        match &item.node {
            Selection::Field(field) => {
                *budget = budget.checked_sub(1).ok_or_else(too_many)?;
                spend(doc, &field.node.selection_set.node, budget, stack)?;
            }
            Selection::InlineFragment(inline) => {
                spend(doc, &inline.node.selection_set.node, budget, stack)?
            }
            Selection::FragmentSpread(spread) => {
                let name = spread.node.fragment_name.node.as_str();
                if stack.contains(&name) {
                    continue;
                }
                if let Some(fragment) = doc.fragments.get(name) {
                    stack.push(name);
                    spend(doc, &fragment.node.selection_set.node, budget, stack)?;
                    stack.pop();
                }
            }
        }
    }
    Ok(())
}

fn too_many() -> String {
    format!("the query selects more than {MAX_SELECTIONS} fields, fragments expanded")
}

/// Parses run on the blocking pool, at most this many at once: a core's worth on a small
/// machine, so that parsing never takes every core from the probes and the other routes.
static PARSING: LazyLock<Semaphore> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Semaphore::new((cores / 2).max(1))
});

/// A turn to parse on the blocking pool; waits while others parse.
pub async fn parse_slot() -> tokio::sync::SemaphorePermit<'static> {
    PARSING.acquire().await.expect("never closed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    #[test]
    fn names_outside_strings_and_comments() {
        assert_eq!(names(b"{ project(fullPath: \"a b c\") { id } }"), 3);
        assert_eq!(names(b"# a b c\n{ x }"), 1);
        assert_eq!(names(br#"{ x(a: "q\"uoted \\" y) }"#), 3);
        assert_eq!(names(b"{ x(a: \"\"\"block \\\"\"\" still\"\"\") }"), 2);
        assert_eq!(names(b"{ x(first: 10, f: 1.5e3) }"), 3);
        assert_eq!(names(b"query Q($p: ID!) { a: b }"), 6);
    }

    #[test]
    fn refused_before_parsing() {
        assert!(check_text("{ currentUser { id } }").is_ok());
        assert!(check_text(&format!("{{ {} }}", " ".repeat(MAX_TEXT))).is_err());
        let many = format!("{{ {} }}", "a ".repeat(MAX_NAMES + 1));
        assert!(many.len() < MAX_TEXT);
        assert_eq!(
            check_text(&many).unwrap_err(),
            format!("the query has more than {MAX_NAMES} names")
        );
    }

    fn selections(text: &str) -> Result<(), String> {
        check_document(&parse_query(text).unwrap())
    }

    #[test]
    fn every_selection_counts_typename_and_fragments_included() {
        let typenames = format!("{{ {} }}", "__typename ".repeat(MAX_SELECTIONS + 1));
        assert!(selections(&typenames).is_err());
        let aliases: String = (0..MAX_SELECTIONS)
            .map(|i| format!("a{i}: __typename "))
            .collect();
        assert!(selections(&format!("{{ {aliases} }}")).is_ok());
        assert!(selections(&format!("{{ {aliases} x }}")).is_err());
        // 100 fields spread 100 times: 10,000 selections from a short text.
        let fields = "__typename ".repeat(100);
        let spreads = "...F ".repeat(100);
        let bomb = format!("{{ {spreads} }} fragment F on Query {{ {fields} }}");
        assert!(bomb.len() < 3000);
        assert!(selections(&bomb).is_err());
        // A fragment inside itself counts once (validation refuses it).
        assert!(
            selections("{ ...A } fragment A on Query { x ...B } fragment B on Query { ...A }")
                .is_ok()
        );
    }
}
