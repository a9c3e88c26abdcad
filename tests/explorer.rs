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
async fn the_root_is_the_dashboard_which_asks_to_sign_in_first() {
    let app = TestApp::new().await;
    let res = get(&app, "/").await;
    assert_eq!(res.status, 303);
    let location = res.headers[header::LOCATION].to_str().unwrap();
    assert!(location.starts_with("/-/sign-in"), "{location}");
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

/// With Debian's `chromium` installed: the explorer loaded in a headless browser, whose
/// network log shows that every request the page made went to envlens, and whose console
/// shows no load the Content-Security-Policy refused (an attempt to reach another host) and
/// no script error. Skipped without chromium.
#[tokio::test]
async fn a_headless_browser_loads_the_explorer_from_envlens_alone() {
    if std::process::Command::new("chromium")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no chromium on this machine (apt-get install chromium): skipped");
        return;
    }
    let app = TestApp::new().await;
    let state =
        envlens::state::AppState::new(app.db.clone(), keys(), envlens::config::Limits::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(envlens::run(
        state,
        listener,
        async { stopped.await.unwrap_or(()) },
        std::time::Duration::from_secs(5),
    ));

    let dir = tempfile::tempdir().unwrap();
    let net_log = dir.path().join("net.json");
    let url = format!("{origin}/-/graphql-explorer");
    let args = vec![
        "--headless=new".to_owned(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--no-first-run".into(),
        // The browser's own background requests stay on this machine too.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1".into(),
        "--enable-logging=stderr".into(),
        "--virtual-time-budget=3000".into(),
        format!("--user-data-dir={}", dir.path().join("profile").display()),
        format!("--log-net-log={}", net_log.display()),
        "--dump-dom".into(),
        url,
    ];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("chromium")
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let _ = stop.send(());
    server.await.unwrap().unwrap();

    let dom = String::from_utf8_lossy(&out.stdout);
    let console = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{console}");
    // The explorer rendered with its schema.
    assert!(dom.contains("envlens GraphQL explorer"), "{dom}");
    assert!(dom.contains("type Query {"), "{dom}");
    for problem in ["Content Security Policy", "Uncaught", "net::ERR_"] {
        assert!(!console.contains(problem), "`{problem}` in:\n{console}");
    }

    // Every request the page initiated, from the browser's network log.
    let log: serde_json::Value = serde_json::from_slice(&std::fs::read(&net_log).unwrap()).unwrap();
    let start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"].clone();
    let mut from_page: Vec<String> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == start_job && e["params"]["initiator"] == origin.as_str())
        .map(|e| e["params"]["url"].as_str().unwrap().to_owned())
        .collect();
    from_page.sort();
    from_page.dedup();
    assert!(
        from_page.contains(&format!("{origin}/-/graphql-explorer/explorer.js")),
        "{from_page:?}"
    );
    assert!(
        from_page.contains(&format!("{origin}/-/graphql-explorer/explorer.css")),
        "{from_page:?}"
    );
    for url in &from_page {
        assert!(url.starts_with(&format!("{origin}/")), "{url}");
    }
}

/// The query the explorer opens with runs, as `root` of `examples/identity.json`, without
/// errors: it cannot drift from the schema unnoticed.
#[tokio::test]
async fn the_explorer_query_runs_against_the_example_identity() {
    let app = TestApp::new().await;
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/identity.json"
    ))
    .unwrap();
    let snapshot: serde_json::Value = serde_json::from_str(&example).unwrap();
    let res = app
        .internal(
            axum::http::Method::PUT,
            "/api/v4/internal/identity",
            &snapshot,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());

    let html = get(&app, "/-/graphql-explorer").await.text();
    let start = html.find("<textarea id=\"query\"").unwrap();
    let start = start + html[start..].find('>').unwrap() + 1;
    let end = start + html[start..].find("</textarea>").unwrap();
    let query = &html[start..end];
    let (token, _) =
        envlens::auth::mint_session(SESSION_KEY, 1, "root", std::time::Duration::from_secs(60))
            .unwrap();
    let res = app
        .send(
            Request::post("/api/graphql")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    serde_json::json!({ "query": query }).to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(body["data"]["currentUser"]["username"], "root");
    assert_eq!(body["data"]["project"]["fullPath"], "acme/platform/shop");
}
