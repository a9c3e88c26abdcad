//! Small HTML helpers for the server-rendered pages: escaping, and a plain page shell for the
//! sign-in pages (the dashboard's own layout may replace it).

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

/// `text` with `&`, `<`, `>`, `"` and `'` escaped: safe in element content and quoted
/// attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A whole page: `title` is text (escaped here), `body` is HTML. The dashboard's stylesheet
/// and a header with the name, without the navigation of a signed-in user.
pub fn page(title: &str, body: &str) -> String {
    let icon = super::assets::path("favicon.svg");
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\">\
         <title>{} · envlens</title>\
         <link rel=\"icon\" href=\"{icon}\" type=\"image/svg+xml\">\
         <link rel=\"stylesheet\" href=\"{}\"></head>\n\
         <body><header class=\"top\"><span class=\"brand\">\
         <img src=\"{icon}\" alt=\"\" width=\"22\" height=\"22\">envlens</span></header>\n\
         <main id=\"main\" class=\"narrow\">\n{body}\n</main></body></html>\n",
        escape(title),
        super::assets::path("dashboard.css"),
    )
}

/// A page that says why something was refused, with its status; never cached.
pub fn refusal(status: StatusCode, title: &str, message: &str) -> Response {
    let body = format!(
        "<h1>{}</h1>\n<p>{}</p>\n<p><a href=\"/-/sign-in\">Sign in</a></p>",
        escape(title),
        escape(message)
    );
    (
        status,
        [(axum::http::header::CACHE_CONTROL, "no-store")],
        Html(page(title, &body)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert!(page("<x>", "").contains("<title>&lt;x&gt; · envlens</title>"));
    }
}
