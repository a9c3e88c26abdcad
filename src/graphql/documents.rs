//! Parsed query documents, kept by query text.
//!
//! GitLab's frontend sends a few fixed query texts, with their arguments as variables, so the
//! same text arrives over and over; parsing it was some 9% of the CPU of a blueprint query.
//! Parsing is a pure function of the text, so a parsed document can stand in for the text in
//! any later request, whoever sends it. Everything else still runs on every request:
//! async-graphql's nesting and directive checks of the document, and validation, whose
//! complexity limit depends on the variables' values.
//!
//! async-graphql's `ApolloPersistedQueries` extension keeps parsed documents only for clients
//! that send a `persistedQuery` hash instead of the text, which GitLab's frontend does not.

use std::num::NonZeroUsize;
use std::sync::{Arc, LazyLock, Mutex};

use async_graphql::parser::parse_query;
use async_graphql::parser::types::ExecutableDocument;
use lru::LruCache;

/// Texts longer than this are parsed every time: a dashboard's query is a few KiB at most.
const MAX_TEXT: usize = 16 * 1024;
/// Documents kept: far more than the distinct queries of GitLab's frontend, and at most
/// `ENTRIES * MAX_TEXT` of text (a document takes a few times its text).
const ENTRIES: usize = 256;

static DOCUMENTS: LazyLock<Mutex<LruCache<Box<str>, Arc<ExecutableDocument>>>> =
    LazyLock::new(|| Mutex::new(LruCache::new(NonZeroUsize::new(ENTRIES).expect("not 0"))));

/// Gives the request its parsed document, from the cache or parsed now and kept. A text that
/// does not parse is left to async-graphql, which answers the syntax error.
pub fn prepare(request: &mut async_graphql::Request) {
    if request.query.len() > MAX_TEXT {
        return;
    }
    let cached = lock().get(request.query.as_str()).cloned();
    let doc = match cached {
        Some(doc) => doc,
        None => match parse_query(&request.query) {
            Ok(doc) => {
                let doc = Arc::new(doc);
                lock().put(request.query.as_str().into(), doc.clone());
                doc
            }
            Err(_) => return,
        },
    };
    // Cloned outside the lock; a clone shares the document's names and costs a fraction of
    // a parse.
    request.set_parsed_query(ExecutableDocument::clone(&doc));
}

fn lock() -> std::sync::MutexGuard<'static, LruCache<Box<str>, Arc<ExecutableDocument>>> {
    // Holds no invariant a panic could break: a poisoned cache is still a cache.
    DOCUMENTS.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> async_graphql::Request {
        let mut request = async_graphql::Request::new(text);
        prepare(&mut request);
        request
    }

    #[test]
    fn keeps_a_text_once_and_bounds_the_cache() {
        let text = "query Unit($p: ID!) { project(fullPath: $p) { id } }";
        let mut r = request(text);
        assert!(r.parsed_query().is_ok());
        assert!(lock().contains(text));
        for i in 0..ENTRIES + 10 {
            request(&format!("{{ project(fullPath: \"unit/{i}\") {{ id }} }}"));
        }
        let cache = lock();
        assert!(cache.len() <= ENTRIES);
        assert!(
            !cache.contains(text),
            "the least recently used text went first"
        );
    }

    #[test]
    fn leaves_what_does_not_parse_or_is_too_long() {
        let broken = "{ project(fullPath: ";
        request(broken);
        assert!(!lock().contains(broken));
        let long = format!("{{ currentUser {{ id }} }}{}", " ".repeat(MAX_TEXT));
        request(&long);
        assert!(!lock().contains(long.as_str()));
    }
}
