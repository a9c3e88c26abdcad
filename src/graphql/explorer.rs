//! The GraphQL explorer at `GET /-/graphql-explorer`: a page of our own (a query and variables
//! editor, a token field, the result, the schema), its script and its style, all compiled
//! into the binary. It loads nothing from any other host, so it works on a network without
//! internet; its Content-Security-Policy lets it reach this envlens only.

use std::sync::OnceLock;

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderName;
use axum::response::IntoResponse;

pub const PATH: &str = "/-/graphql-explorer";
pub const SCRIPT_PATH: &str = "/-/graphql-explorer/explorer.js";
pub const STYLE_PATH: &str = "/-/graphql-explorer/explorer.css";

/// Scripts and styles from this origin only, requests to this origin only, no frames, no
/// forms, no plugins.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src data:; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const CSP: HeaderName = HeaderName::from_static("content-security-policy");
const NOSNIFF: (HeaderName, &str) = (HeaderName::from_static("x-content-type-options"), "nosniff");

/// The page, with the schema (SDL) written into it once.
pub async fn page() -> impl IntoResponse {
    static PAGE: OnceLock<String> = OnceLock::new();
    let page = PAGE.get_or_init(|| {
        include_str!("explorer/index.html").replace("{{SDL}}", &escape_html(&super::sdl()))
    });
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
            (CSP, POLICY),
            NOSNIFF,
        ],
        page.as_str(),
    )
}

pub async fn script() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
            NOSNIFF,
        ],
        include_str!("explorer/explorer.js"),
    )
}

pub async fn style() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
            NOSNIFF,
        ],
        include_str!("explorer/explorer.css"),
    )
}

fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_html_would_read_as_markup() {
        assert_eq!(
            escape_html(r#"a <b> & "c""#),
            "a &lt;b&gt; &amp; &quot;c&quot;"
        );
    }
}
