//! Signing in to the dashboard (SPEC 9): one-time sign-in links, the `envlens_session`
//! cookie and its flags, the CSRF rule for the API and for signing out, pages that send
//! strangers to sign in, and redirects that never leave envlens.

use std::process::Command;

use axum::body::Body;
use axum::http::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use axum::http::{Request, StatusCode};

use axum::Router;
use envlens::auth::CSRF_HEADER;
use envlens::config::Limits;
use envlens::db::pool::Pool;
use envlens::state::AppState;
use envlens::web::session::Viewer;
use envlens::web::Site;
use serde_json::json;
use sqlx::PgPool;
use tower::ServiceExt;

use crate::support::{keys, postgres, TestApp, TestResponse};

/// The app with its dashboard at `public_url`, and a user `alice` (id 7) in the mirror.
async fn app_at(public_url: &str) -> TestApp {
    let database = postgres::fresh_database().await;
    let site = Site::new(public_url, envlens::web::DEFAULT_SESSION_LIFETIME).unwrap();
    let state = AppState::new((*database).clone(), keys(), Limits::default()).with_site(site);
    let app = TestApp::owning(state, database);
    add_user(&app.db, 7, "alice").await;
    app
}

async fn app() -> TestApp {
    app_at("http://envlens.test:8080").await
}

async fn add_user(db: &PgPool, id: i64, username: &str) {
    sqlx::query("INSERT INTO users (id, username, admin) VALUES ($1, $2, false)")
        .bind(id)
        .bind(username)
        .execute(db)
        .await
        .unwrap();
}

/// A one-time link's path, as `envlens token --sign-in` makes it.
async fn link_path(db: &PgPool, user_id: i64) -> String {
    let url =
        envlens::web::sign_in::create_link(&Pool::from(db.clone()), "http://envlens.test", user_id)
            .await
            .unwrap();
    url.strip_prefix("http://envlens.test").unwrap().to_owned()
}

async fn get(app: &TestApp, path: &str, cookie: Option<&str>) -> TestResponse {
    let mut req = Request::get(path);
    if let Some(cookie) = cookie {
        req = req.header(COOKIE, cookie);
    }
    app.send(req.body(Body::empty()).unwrap()).await
}

/// The POST of a sign-in link's page (its "Continue as ..." button), from `origin` when given.
async fn post(app: &TestApp, path: &str, origin: Option<&str>) -> TestResponse {
    let mut req = Request::post(path);
    if let Some(origin) = origin {
        req = req.header(ORIGIN, origin);
    }
    app.send(req.body(Body::empty()).unwrap()).await
}

fn location(res: &TestResponse) -> &str {
    res.headers
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no Location ({}): {}", res.status, res.text()))
}

fn set_cookie(res: &TestResponse) -> String {
    res.headers
        .get(SET_COOKIE)
        .expect("a Set-Cookie")
        .to_str()
        .unwrap()
        .to_owned()
}

/// A signed-in browser: its `Cookie` header and the session's CSRF token.
struct Browser {
    cookie: String,
    csrf: String,
}

async fn sign_in(app: &TestApp, user_id: i64) -> Browser {
    let res = post(app, &link_path(&app.db, user_id).await, None).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    let set = set_cookie(&res);
    let cookie = set.split(';').next().unwrap().to_owned();
    let value = cookie.strip_prefix("envlens_session=").unwrap();
    // The database has the id's SHA-256 only, beside the CSRF token the pages render.
    let csrf: String = sqlx::query_scalar(
        "SELECT csrf FROM web_sessions WHERE id_hash = sha256(convert_to($1, 'UTF8'))",
    )
    .bind(value)
    .fetch_one(&app.db)
    .await
    .unwrap();
    let stored = app.rows("SELECT * FROM web_sessions").await;
    assert!(!json!(stored).to_string().contains(value));
    Browser { cookie, csrf }
}

async fn api_user(app: &TestApp, cookie: &str, csrf: Option<&str>) -> TestResponse {
    let mut req = Request::get("/api/user").header(COOKIE, cookie);
    if let Some(csrf) = csrf {
        req = req.header(CSRF_HEADER, csrf);
    }
    app.send(req.body(Body::empty()).unwrap()).await
}

#[tokio::test]
async fn a_sign_in_link_starts_a_session_once() {
    let app = app().await;
    let path = link_path(&app.db, 7).await;
    assert!(path.starts_with("/-/sign-in/link/"), "{path}");
    // A GET (the person, or a chat application's link preview before them) shows whom the
    // link signs in and a button; it spends nothing.
    for _ in 0..2 {
        let res = get(&app, &path, None).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.text());
        assert!(res.headers.get(SET_COOKIE).is_none());
        assert_eq!(res.headers["cache-control"], "no-store");
        assert_eq!(res.headers["referrer-policy"], "same-origin");
        let html = res.text();
        assert!(
            html.contains(&format!("<form method=\"post\" action=\"{path}\">")),
            "{html}"
        );
        assert!(html.contains("Continue as alice</button>"), "{html}");
    }
    assert_eq!(app.rows("SELECT user_id FROM sign_in_links").await.len(), 1);
    assert!(app.rows("SELECT * FROM web_sessions").await.is_empty());

    // The page's POST, from envlens' own origin, signs the browser in.
    let res = post(&app, &path, Some("http://envlens.test:8080")).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    assert_eq!(location(&res), "/");
    let cookie = set_cookie(&res);
    let value = cookie
        .strip_prefix("envlens_session=")
        .and_then(|c| c.split(';').next())
        .unwrap();
    assert_eq!(value.len(), 43, "{cookie}");
    assert_eq!(
        cookie.strip_prefix(&format!("envlens_session={value}")),
        Some("; Path=/; Max-Age=43200; HttpOnly; SameSite=Lax"),
        "plain http: no Secure"
    );
    // Used up: the second post signs nobody in, and the page says so.
    let again = post(&app, &path, None).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN);
    assert!(again.headers.get(SET_COOKIE).is_none());
    assert!(again.text().contains("works once"), "{}", again.text());
    let page = get(&app, &path, None).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(!page.text().contains("Continue as"), "{}", page.text());
    // The link's row is gone, the session's has no secret in clear.
    assert!(app.rows("SELECT * FROM sign_in_links").await.is_empty());
    assert_eq!(
        app.rows("SELECT user_id FROM web_sessions").await,
        [json!({"user_id": 7})]
    );
}

#[tokio::test]
async fn another_sites_post_of_a_link_is_refused_and_spends_nothing() {
    let app = app().await;
    let path = link_path(&app.db, 7).await;
    // A page elsewhere that posts the link would sign its visitor in as alice.
    for origin in [
        "https://evil.example",
        "http://envlens.test",
        "https://envlens.test:8080",
        "null",
    ] {
        let res = post(&app, &path, Some(origin)).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{origin}");
        assert!(res.headers.get(SET_COOKIE).is_none(), "{origin}");
    }
    assert_eq!(app.rows("SELECT user_id FROM sign_in_links").await.len(), 1);
    // The link still works from its own page.
    let res = post(&app, &path, Some("http://envlens.test:8080")).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
}

#[tokio::test]
async fn expired_and_made_up_links_sign_nobody_in() {
    let app = app().await;
    let path = link_path(&app.db, 7).await;
    sqlx::query("UPDATE sign_in_links SET expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .unwrap();
    let res = get(&app, &path, None).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.text());
    let res = post(&app, &path, None).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.text());
    assert!(res.headers.get(SET_COOKIE).is_none());
    for made_up in [
        "/-/sign-in/link/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "/-/sign-in/link/short",
        "/-/sign-in/link/%00%0A",
    ] {
        let res = get(&app, made_up, None).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{made_up}");
        let res = post(&app, made_up, None).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{made_up}");
    }
    // Links live five minutes.
    link_path(&app.db, 7).await;
    let lifetimes = app
        .rows("SELECT expires_at - now() BETWEEN interval '299 seconds' AND interval '300 seconds' AS ok FROM sign_in_links")
        .await;
    assert_eq!(lifetimes, [json!({"ok": true})]);
}

#[tokio::test]
async fn cookies_are_secure_behind_https() {
    let app = app_at("https://envlens.example.com").await;
    let res = post(&app, &link_path(&app.db, 7).await, None).await;
    assert!(
        set_cookie(&res).ends_with("; HttpOnly; SameSite=Lax; Secure"),
        "{}",
        set_cookie(&res)
    );
}

#[tokio::test]
async fn the_api_takes_the_cookie_with_its_csrf_token() {
    let app = app().await;
    let browser = sign_in(&app, 7).await;
    let res = api_user(&app, &browser.cookie, Some(&browser.csrf)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"id": 7, "username": "alice", "admin": false})
    );
    let missing = api_user(&app, &browser.cookie, None).await;
    assert_eq!(missing.error(401)["message"], "missing CSRF token");
    let wrong = api_user(&app, &browser.cookie, Some("x")).await;
    assert_eq!(wrong.error(401)["message"], "CSRF token does not match");

    // GraphQL, as the dashboard's scripts ask it.
    let graphql = |csrf: Option<String>| {
        let mut req = Request::post("/api/graphql")
            .header(COOKIE, &browser.cookie)
            .header("content-type", "application/json");
        if let Some(csrf) = csrf {
            req = req.header(CSRF_HEADER, csrf);
        }
        req.body(Body::from(r#"{"query": "{ currentUser { username } }"}"#))
            .unwrap()
    };
    let res = app.send(graphql(Some(browser.csrf.clone()))).await;
    assert_eq!(
        res.json(),
        json!({"data": {"currentUser": {"username": "alice"}}})
    );
    let res = app.send(graphql(None)).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.text());
    assert!(res.json()["data"].is_null());
}

#[tokio::test]
async fn sign_out_needs_the_csrf_token_and_ends_the_session() {
    let app = app().await;
    let browser = sign_in(&app, 7).await;
    let sign_out = |body: String, csrf_header: Option<&str>| {
        let mut req = Request::post("/-/sign-out")
            .header(COOKIE, &browser.cookie)
            .header("content-type", "application/x-www-form-urlencoded");
        if let Some(csrf) = csrf_header {
            req = req.header(CSRF_HEADER, csrf);
        }
        req.body(Body::from(body)).unwrap()
    };
    // Another site's form cannot sign the user out: it does not know the token.
    for (body, header) in [
        (String::new(), None),
        ("csrf=guess".to_owned(), None),
        (format!("csrf={}", browser.csrf), Some("guess")),
    ] {
        let res = app.send(sign_out(body.clone(), header)).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{body} {header:?}");
        assert!(res.headers.get(SET_COOKIE).is_none());
    }
    assert_eq!(
        api_user(&app, &browser.cookie, Some(&browser.csrf))
            .await
            .status,
        StatusCode::OK
    );
    let res = app
        .send(sign_out(format!("csrf={}", browser.csrf), None))
        .await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    assert_eq!(location(&res), "/-/sign-in");
    assert_eq!(
        set_cookie(&res),
        "envlens_session=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax"
    );
    assert!(app.rows("SELECT * FROM web_sessions").await.is_empty());
    // The cookie a browser might still send is nobody's.
    let res = api_user(&app, &browser.cookie, Some(&browser.csrf)).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);

    // A script signs out with the header.
    let browser = sign_in(&app, 7).await;
    let res = app
        .send(
            Request::post("/-/sign-out")
                .header(COOKIE, &browser.cookie)
                .header(CSRF_HEADER, &browser.csrf)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, StatusCode::SEE_OTHER);
    assert!(app.rows("SELECT * FROM web_sessions").await.is_empty());
    // Signing out again, with no session left, only clears the cookie.
    let res = app.send(sign_out(String::new(), None)).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER);
    assert!(set_cookie(&res).contains("Max-Age=0"));
    assert_eq!(
        app.send(Request::get("/-/sign-out").body(Body::empty()).unwrap())
            .await
            .status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

/// A page of the dashboard, as `dash` writes them: for signed-in users.
fn page_router(db: &PgPool) -> Router {
    Router::new()
        .route(
            "/groups/{*path}",
            axum::routing::get(
                |viewer: Viewer| async move { format!("hello {}", viewer.username) },
            ),
        )
        .with_state(Pool::from(db.clone()))
}

async fn page(router: &Router, path: &str, cookie: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::get(path);
    if let Some(cookie) = cookie {
        req = req.header(COOKIE, cookie);
    }
    let res = router
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let location = res
        .headers()
        .get(LOCATION)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        location.unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned()),
    )
}

#[tokio::test]
async fn pages_send_strangers_to_sign_in_and_back() {
    let app = app().await;
    let router = page_router(&app.db);
    let (status, to) = page(&router, "/groups/acme?tier=production", None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        to,
        "/-/sign-in?return_to=%2Fgroups%2Facme%3Ftier%3Dproduction"
    );
    // A cookie that is no session is a stranger's too.
    let (status, _) = page(
        &router,
        "/groups/acme",
        Some("envlens_session=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);

    let browser = sign_in(&app, 7).await;
    let (status, body) = page(&router, "/groups/acme", Some(&browser.cookie)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "hello alice"));
    // Pages need no CSRF token to be read.
    // The sign-in page sends a signed-in user on, to envlens' own pages only.
    for (return_to, expected) in [
        (
            "%2Fgroups%2Facme%3Ftier%3Dproduction",
            "/groups/acme?tier=production",
        ),
        ("%2F%2Fevil.example%2F", "/"),
        ("https%3A%2F%2Fevil.example%2F", "/"),
        ("%2F%5Cevil.example", "/"),
        ("%2F%09%2Fevil.example", "/"),
        ("javascript%3Aalert(1)", "/"),
        ("%2F-%2Fsign-in", "/"),
    ] {
        let res = get(
            &app,
            &format!("/-/sign-in?return_to={return_to}"),
            Some(&browser.cookie),
        )
        .await;
        assert_eq!(res.status, StatusCode::SEE_OTHER, "{return_to}");
        assert_eq!(location(&res), expected, "{return_to}");
    }

    // Sessions end: when they expire, and with their user.
    sqlx::query("UPDATE web_sessions SET expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(
        page(&router, "/groups/acme", Some(&browser.cookie)).await.0,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        api_user(&app, &browser.cookie, Some(&browser.csrf))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let browser = sign_in(&app, 7).await;
    sqlx::query("DELETE FROM users WHERE id = 7")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(
        page(&router, "/groups/acme", Some(&browser.cookie)).await.0,
        StatusCode::SEE_OTHER
    );
    assert!(app.rows("SELECT * FROM web_sessions").await.is_empty());
}

#[tokio::test]
async fn the_sign_in_page_says_how_to_get_a_link() {
    let app = app().await;
    let res = get(&app, "/-/sign-in?return_to=%2Fgroups%2Facme", None).await;
    assert_eq!(res.status, StatusCode::OK);
    let html = res.text();
    assert!(html.contains("envlens token --user"), "{html}");
    // Without GitLab configured, no button that cannot work.
    assert!(!html.contains("Sign in with GitLab"), "{html}");
    let res = get(&app, "/-/sign-in/gitlab", None).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND);
    // A return_to that is not UTF-8 is not followed, and no error.
    let res = get(&app, "/-/sign-in?return_to=%FF", None).await;
    assert_eq!(res.status, StatusCode::OK);
    assert!(!res.text().contains("return_to"), "{}", res.text());
}

#[tokio::test]
async fn envlens_token_prints_a_one_time_link() {
    let database = postgres::fresh_database().await;
    add_user(&database, 7, "alice").await;
    let url = database.url();
    let data_dir = tempfile::tempdir().unwrap();
    let data = data_dir.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_envlens"))
            .args(["token", "--user", "alice", "--sign-in"])
            .args(["--public-url", "https://envlens.example.com/"])
            .args(["--database-url", &url])
            .env("ENVLENS_DATA_DIR", data)
            .env_remove("ENVLENS_PUBLIC_URL")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let path = stdout
        .trim()
        .strip_prefix("https://envlens.example.com/-/sign-in/link/")
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(path.len(), 43);
    assert!(stderr.contains("five minutes"), "{stderr}");
    // A link needs no secret: none was generated.
    assert_eq!(std::fs::read_dir(data_dir.path()).unwrap().count(), 0);
    let state = AppState::new((*database).clone(), keys(), Limits::default());
    let app = TestApp::owning(state, database);
    let res = get(&app, &format!("/-/sign-in/link/{path}"), None).await;
    assert!(res.text().contains("Continue as alice"), "{}", res.text());
    let res = post(&app, &format!("/-/sign-in/link/{path}"), None).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER);
    assert_eq!(location(&res), "/");
}

#[tokio::test]
async fn a_websocket_carries_the_csrf_token_in_its_query() {
    let app = app().await;
    let browser = sign_in(&app, 7).await;
    // The proxy authenticates first, then asks about the agent: its message says which refused.
    let proxy = |query: String, upgrade: bool| {
        let mut req = Request::get(format!("/k8s-proxy/api/v1/pods?gitlab-agent-id=1{query}"))
            .header(COOKIE, &browser.cookie);
        if upgrade {
            req = req
                .header("connection", "upgrade")
                .header("upgrade", "websocket");
        }
        req.body(Body::empty()).unwrap()
    };
    let message = |res: TestResponse| res.json()["message"].as_str().unwrap().to_owned();
    let csrf = format!("&gitlab-csrf-token={}", browser.csrf);
    assert_eq!(
        message(app.send(proxy(String::new(), true)).await),
        "missing CSRF token"
    );
    assert_eq!(
        message(app.send(proxy("&gitlab-csrf-token=x".into(), true)).await),
        "CSRF token does not match"
    );
    assert_eq!(
        message(app.send(proxy(csrf.clone(), true)).await),
        "agent 1 does not exist or its user_access does not allow you"
    );
    // Only a WebSocket may carry it so: a plain request needs the header.
    assert_eq!(
        message(app.send(proxy(csrf, false)).await),
        "missing CSRF token"
    );
}
