//! Parsed query documents, kept by query text, and which of their requests passed validation.
//!
//! GitLab's frontend sends a few fixed query texts, with their arguments as variables, so the
//! same text arrives over and over; parsing it was some 9% of the CPU of a blueprint query.
//! Parsing is a pure function of the text, so a parsed document can stand in for the text in
//! any later request, whoever sends it.
//!
//! Validation was the next 8%. Its strict rules are a function of the document, the operation
//! chosen and, through one rule (`ArgumentsOfCorrectType`), the variables' values. When every
//! variable the document declares is a `String`, `ID`, `Boolean` or `Int` (with or without
//! `!`), that rule's verdict on a value depends only on its kind (absent, null, boolean,
//! string, whole number that fits 64 signed bits, other number): a variable can only stand
//! where its own type is expected (`VariableInAllowedPosition`), and those scalars accept a
//! value by its kind alone. So a request whose document, operation name and declared variables'
//! kinds are those of a request that was answered without any error ([`Prepared::validated`])
//! would pass the strict rules again, and is checked in async-graphql's fast mode instead,
//! which still applies the complexity and depth limits (they read the values: `first: $n`).
//! Anything else (enums, lists, input objects, custom scalars) is validated in full each time.
//!
//! async-graphql's `ApolloPersistedQueries` extension keeps documents only for clients that
//! send a `persistedQuery` hash instead of the text, which GitLab's frontend does not.

use std::num::NonZeroUsize;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use async_graphql::parser::parse_query;
use async_graphql::parser::types::{BaseType, ExecutableDocument};
use async_graphql::{Name, ServerError, Value as ConstValue, Variables};
use lru::LruCache;

use super::{cost, inputs};

/// Texts longer than this are parsed every time: a dashboard's query is a few KiB at most.
const MAX_TEXT: usize = 16 * 1024;
/// Documents kept: far more than the distinct queries of GitLab's frontend, and at most
/// `ENTRIES * MAX_TEXT` of text (a document takes a few times its text).
const ENTRIES: usize = 256;
/// Validated operation names and variables' kinds kept per document.
const SIGNATURES: usize = 16;

struct Entry {
    doc: ExecutableDocument,
    /// Whether it is within the selection limit and its string arguments can all be looked
    /// up ([`checks`]).
    checks: Result<(), String>,
    /// The variables declared by any of its operations, once each, when every one is of a type
    /// whose values validate by their kind alone; `None` otherwise.
    declared: Option<Vec<Name>>,
    /// [`Signature`]s of requests answered without error, most recent last.
    validated: Mutex<Vec<Signature>>,
}

/// What strict validation depends on beside the document: the operation chosen and the kind of
/// each declared variable's value. Variables the document does not declare are not part of it:
/// a document that uses one fails validation whatever its value.
#[derive(Debug, PartialEq)]
struct Signature {
    operation: Option<String>,
    /// One byte per declared variable, in [`Entry::declared`]'s order.
    kinds: Box<[u8]>,
}

static DOCUMENTS: LazyLock<Mutex<LruCache<Box<str>, Arc<Entry>>>> =
    LazyLock::new(|| Mutex::new(LruCache::new(NonZeroUsize::new(ENTRIES).expect("not 0"))));

/// What [`prepare`] found out about a request.
#[derive(Default)]
pub struct Prepared {
    /// The request's document: a refusal at a limit measures it again (`limits`).
    document: Option<Arc<Entry>>,
    /// The document and the request's signature, when a verdict on it can be kept.
    kept: Option<(Arc<Entry>, Signature)>,
    validated: bool,
}

impl Prepared {
    /// The request's parsed document.
    pub fn document(&self) -> Option<&ExecutableDocument> {
        self.document.as_ref().map(|entry| &entry.doc)
    }

    /// A request of the same signature was answered without error: strict validation would
    /// pass, the fast mode suffices.
    pub fn validated(&self) -> bool {
        self.validated
    }

    /// The request was answered without any error, so it passed validation: later requests of
    /// its signature need not run the strict rules.
    pub fn passed(self) {
        let Some((entry, signature)) = self.kept else {
            return;
        };
        if self.validated {
            return;
        }
        let mut validated = relock(&entry.validated);
        if !validated.contains(&signature) {
            if validated.len() == SIGNATURES {
                validated.remove(0);
            }
            validated.push(signature);
        }
    }
}

/// Whether `text`'s document is kept: then [`prepare`] parses nothing.
pub fn is_kept(text: &str) -> bool {
    text.len() <= MAX_TEXT && relock(&DOCUMENTS).contains(text)
}

/// Gives the request its parsed document, from the cache or parsed now and kept, and tells
/// whether it is known to pass validation. The `Err` is the request's answer, an error with
/// its code: a text too costly to parse or to run (`cost`), a syntax error, or a string
/// argument or variable that no lookup can take (`inputs`). Parsing can take milliseconds:
/// unless [`is_kept`], call it off the runtime's threads.
pub fn prepare(request: &mut async_graphql::Request) -> Result<Prepared, ServerError> {
    inputs::check_variables(&request.variables).map_err(bad_input)?;
    if request.query.len() > MAX_TEXT {
        // Parsed here all the same, for its checks, but not kept.
        let doc = parse(&request.query)?;
        checks(&doc).map_err(bad_input)?;
        request.set_parsed_query(doc.clone());
        return Ok(Prepared {
            document: Some(Arc::new(Entry {
                doc,
                checks: Ok(()),
                declared: None,
                validated: Mutex::default(),
            })),
            ..Prepared::default()
        });
    }
    let cached = relock(&DOCUMENTS).get(request.query.as_str()).cloned();
    let entry = match cached {
        Some(entry) => entry,
        None => {
            let doc = parse(&request.query)?;
            let entry = Arc::new(Entry {
                declared: kinded_variables(&doc),
                checks: checks(&doc),
                doc,
                validated: Mutex::default(),
            });
            relock(&DOCUMENTS).put(request.query.as_str().into(), entry.clone());
            entry
        }
    };
    entry.checks.clone().map_err(bad_input)?;
    // Cloned outside the cache's lock; a clone shares the document's names and costs a
    // fraction of a parse.
    request.set_parsed_query(entry.doc.clone());
    let signature = entry.declared.as_deref().and_then(|declared| {
        signature(
            request.operation_name.as_deref(),
            declared,
            &request.variables,
        )
    });
    Ok(match signature {
        Some(signature) => {
            let validated = relock(&entry.validated).contains(&signature);
            Prepared {
                document: Some(entry.clone()),
                validated,
                kept: Some((entry, signature)),
            }
        }
        None => Prepared {
            document: Some(entry),
            ..Prepared::default()
        },
    })
}

/// The text's document, if its size and names allow parsing it and it parses.
pub(super) fn parse(text: &str) -> Result<ExecutableDocument, ServerError> {
    cost::check_text(text).map_err(bad_input)?;
    parse_query(text).map_err(|e| coded(e.into(), "GRAPHQL_PARSE_FAILED"))
}

/// What a parsed document must pass before it runs, whatever its variables.
pub(super) fn checks(doc: &ExecutableDocument) -> Result<(), String> {
    cost::check_document(doc)?;
    inputs::check_document(doc)
}

fn bad_input(message: String) -> ServerError {
    coded(ServerError::new(message, None), "BAD_USER_INPUT")
}

fn coded(mut error: ServerError, code: &str) -> ServerError {
    error
        .extensions
        .get_or_insert_with(Default::default)
        .set("code", code);
    error
}

/// The variables declared by the document's operations, sorted and once each, if every one is
/// a `String`, `ID`, `Boolean` or `Int`.
fn kinded_variables(doc: &ExecutableDocument) -> Option<Vec<Name>> {
    let mut names = Vec::new();
    for (_, op) in doc.operations.iter() {
        for v in &op.node.variable_definitions {
            let BaseType::Named(ty) = &v.node.var_type.node.base else {
                return None;
            };
            if !matches!(ty.as_str(), "String" | "ID" | "Boolean" | "Int") {
                return None;
            }
            names.push(v.node.name.node.clone());
        }
    }
    names.sort_unstable();
    names.dedup();
    Some(names)
}

/// The operation name and the kind of each of `declared` in `variables`; `None` when a value
/// is a list, an object or anything else whose validity its kind does not settle.
fn signature(
    operation: Option<&str>,
    declared: &[Name],
    variables: &Variables,
) -> Option<Signature> {
    let kinds = declared
        .iter()
        .map(|name| match variables.get(name) {
            None => Some(b'-'),
            Some(ConstValue::Null) => Some(b'0'),
            Some(ConstValue::Boolean(_)) => Some(b'b'),
            Some(ConstValue::String(_)) => Some(b's'),
            Some(ConstValue::Number(n)) if n.is_i64() => Some(b'i'),
            Some(ConstValue::Number(_)) => Some(b'n'),
            Some(_) => None,
        })
        .collect::<Option<Box<[u8]>>>()?;
    Some(Signature {
        operation: operation.map(str::to_owned),
        kinds,
    })
}

fn relock<T>(lock: &Mutex<T>) -> MutexGuard<'_, T> {
    // Holds no invariant a panic could break: a poisoned cache is still a cache.
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache is the process' own: one test filling it would evict another's documents.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn request(text: &str) -> async_graphql::Request {
        let mut request = async_graphql::Request::new(text);
        let _ = prepare(&mut request);
        request
    }

    fn cached(text: &str) -> bool {
        relock(&DOCUMENTS).contains(text)
    }

    #[test]
    fn keeps_a_text_once_and_bounds_the_cache() {
        let _serial = relock(&SERIAL);
        let text = "query Unit($p: ID!) { project(fullPath: $p) { id } }";
        let mut r = request(text);
        assert!(r.parsed_query().is_ok());
        assert!(cached(text));
        for i in 0..ENTRIES + 10 {
            request(&format!("{{ project(fullPath: \"unit/{i}\") {{ id }} }}"));
        }
        assert!(relock(&DOCUMENTS).len() <= ENTRIES);
        assert!(!cached(text), "the least recently used text went first");
    }

    #[test]
    fn leaves_what_does_not_parse_or_is_too_long() {
        let _serial = relock(&SERIAL);
        let broken = "{ project(fullPath: ";
        let mut r = async_graphql::Request::new(broken);
        let error = prepare(&mut r).err().expect("a syntax error");
        assert_eq!(
            error.extensions.unwrap().get("code"),
            Some(&ConstValue::from("GRAPHQL_PARSE_FAILED"))
        );
        assert!(!cached(broken));
        let long = format!("{{ currentUser {{ id }} }}{}", " ".repeat(MAX_TEXT));
        request(&long);
        assert!(!cached(long.as_str()));
    }

    fn with(text: &str, operation: Option<&str>, variables: serde_json::Value) -> Prepared {
        let mut request =
            async_graphql::Request::new(text).variables(Variables::from_json(variables));
        request.operation_name = operation.map(str::to_owned);
        prepare(&mut request).unwrap()
    }

    #[test]
    fn a_validated_signature_is_remembered_by_kinds_not_values() {
        let _serial = relock(&SERIAL);
        let text = "query Kinds($p: ID!, $n: String) { project(fullPath: $p) { id } }";
        let vars = |p: serde_json::Value| serde_json::json!({ "p": p, "n": "x" });
        assert!(!with(text, None, vars("a/b".into())).validated());
        with(text, None, vars("a/b".into())).passed();
        assert!(with(text, None, vars("other/path".into())).validated());
        // Another kind, another operation name, a variable more or less: not yet seen.
        assert!(!with(text, None, vars(42.into())).validated());
        assert!(!with(text, None, vars(serde_json::Value::Null)).validated());
        assert!(!with(text, None, vars(1.5.into())).validated());
        assert!(!with(text, Some("Kinds"), vars("a/b".into())).validated());
        assert!(!with(text, None, serde_json::json!({ "p": "a/b" })).validated());
        // Variables the document does not declare play no part, whatever their names.
        let extra = serde_json::json!({ "p": "c/d", "n": "y", "n\0b\0p": true, "x": [1] });
        assert!(with(text, None, extra).validated());
        // A list's or an object's validity is not its kind's: never kept.
        let list = with(text, None, vars(serde_json::json!(["a/b"])));
        assert!(list.kept.is_none());
        list.passed();
        assert!(!with(text, None, vars(serde_json::json!(["a/b"]))).validated());
    }

    #[test]
    fn documents_with_other_variable_types_are_always_validated() {
        let _serial = relock(&SERIAL);
        for text in [
            "query E($t: DeploymentTier) { project(fullPath: \"a\") { id } }",
            "query L($p: [ID!]) { project(fullPath: \"a\") { id } }",
            "query A($p: ID!) { a: project(fullPath: $p) { id } } query B($t: DeploymentTier) { b: project(fullPath: \"x\") { id } }",
        ] {
            let prepared = with(text, None, serde_json::json!({}));
            assert!(prepared.kept.is_none(), "{text}");
            prepared.passed();
            assert!(!with(text, None, serde_json::json!({})).validated(), "{text}");
        }
    }
}
