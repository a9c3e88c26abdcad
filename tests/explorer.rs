//! `GET /` and the GraphQL explorer: everything the page needs comes from envlens itself,
//! and nothing in it names another host.

use axum::body::Body;
use axum::http::{header, Request};

use crate::support::*;

async fn get(app: &TestApp, path: &str) -> TestResponse {
    app.send(Request::get(path).body(Body::empty()).unwrap())
        .await
}

/// The values of every `src="..."` and `href="..."` attribute of a page.
fn references(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        for (i, _) in html.match_indices(attribute) {
            let rest = &html[i + attribute.len()..];
            out.push(rest[..rest.find('"').unwrap()].to_owned());
        }
    }
    out
}

#[tokio::test]
async fn the_root_leads_to_the_explorer() {
    let app = TestApp::new().await;
    let res = get(&app, "/").await;
    assert_eq!(res.status, 307);
    assert_eq!(res.headers[header::LOCATION], "/-/graphql-explorer");
}

#[tokio::test]
async fn the_explorer_is_served_whole_from_the_binary() {
    let app = TestApp::new().await;
    let page = get(&app, "/-/graphql-explorer").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.headers[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    let policy = page.headers["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
    ] {
        assert!(policy.contains(directive), "{policy}");
    }
    let html = page.text();
    // The schema is written into the page, escaped.
    assert!(html.contains("type Query {"), "{html}");
    assert!(!html.contains("{{SDL}}"));

    let refs = references(&html);
    assert_eq!(
        refs,
        vec![
            "/-/graphql-explorer/explorer.js",
            "data:,",
            "/-/graphql-explorer/explorer.css"
        ]
    );
    let mut texts = vec![html.clone()];
    for (path, content_type) in [
        (
            "/-/graphql-explorer/explorer.js",
            "text/javascript; charset=utf-8",
        ),
        (
            "/-/graphql-explorer/explorer.css",
            "text/css; charset=utf-8",
        ),
    ] {
        let res = get(&app, path).await;
        assert_eq!(res.status, 200, "{path}");
        assert_eq!(res.headers[header::CONTENT_TYPE], content_type, "{path}");
        texts.push(res.text());
    }
    for text in &texts {
        for external in ["http:", "https:", "ws:", "wss:", "//unpkg", "url("] {
            assert!(!text.contains(external), "`{external}` in:\n{text}");
        }
    }
    // The script's one request is to this envlens' GraphQL endpoint.
    let script = &texts[1];
    assert_eq!(script.matches("fetch(").count(), 1);
    assert!(script.contains("fetch('/api/graphql'"));
    for other in [
        "XMLHttpRequest",
        "WebSocket",
        "EventSource",
        "sendBeacon",
        "import(",
        "importScripts",
        "Worker(",
    ] {
        assert!(!script.contains(other), "{other}");
    }
}
