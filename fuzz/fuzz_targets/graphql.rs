//! GraphQL documents as `POST /api/graphql` takes them: the bounds on the text, the parse, the
//! bounds on selections and inputs, and the validation that measures depth and complexity
//! against the limits (`envlens::graphql::admit`). The input is the query text; a text that
//! starts with a JSON object line is that object's `query` and `variables`. The oracle: no
//! panic, and a refusal at the limits worded with its figures.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    let (query, variables) = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(mut request)) => (
            request
                .remove("query")
                .and_then(|q| q.as_str().map(str::to_owned)),
            request.remove("variables").unwrap_or(Value::Null),
        ),
        _ => (Some(text.into_owned()), Value::Null),
    };
    let Some(query) = query else {
        return;
    };
    if let Ok(figures) = runtime().block_on(envlens::graphql::admit(&query, variables)) {
        if let Some(refusal) = figures.refusal() {
            assert!(refusal.starts_with("Query has"), "{refusal}");
        }
    }
});
