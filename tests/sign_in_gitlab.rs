//! "Sign in with GitLab" (SPEC 9) against the in-process GitLab of `support::gitlab`, which
//! speaks the OAuth 2.0 / OpenID Connect protocol as GitLab does: the whole round trip, and
//! everything envlens must refuse on the way.

use std::sync::Arc;

use axum::body::Body;
use axum::http::header::{COOKIE, LOCATION, SET_COOKIE};
use axum::http::{Request, StatusCode};
use envlens::auth::attempt::{Attempt, AttemptKey};
use envlens::auth::CSRF_HEADER;
use envlens::config::Limits;
use envlens::gitlab::api::{GitLab, Policy};
use envlens::gitlab::oidc::Oidc;
use envlens::state::AppState;
use envlens::web::Site;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

use crate::support::gitlab::TestGitLab;
use crate::support::{keys, postgres, TestApp, TestResponse, SESSION_KEY};

const PUBLIC_URL: &str = "http://envlens.test";
const CALLBACK: &str = "http://envlens.test/-/auth/gitlab/callback";
const CLIENT_ID: &str = "envlens-application-id";
const CLIENT_SECRET: &str = "envlens-application-secret";

/// envlens beside the test GitLab, where it is a registered OAuth application, with `alice`
/// (GitLab user 7) in its mirror; alice is signed in at GitLab.
async fn app_beside(gitlab: &TestGitLab) -> TestApp {
    {
        let mut oauth = gitlab.oauth.lock().unwrap();
        oauth.application = Some((CLIENT_ID.into(), CLIENT_SECRET.into(), CALLBACK.into()));
        oauth.signed_in = Some((7, "alice".into()));
    }
    let api = GitLab::new(&gitlab.url, None, Arc::default(), Policy::default()).unwrap();
    app_with(Oidc::new(api, CLIENT_ID, Some(CLIENT_SECRET))).await
}

async fn app_with(oidc: Oidc) -> TestApp {
    let database = postgres::fresh_database().await;
    let site = Site::new(PUBLIC_URL, envlens::web::DEFAULT_SESSION_LIFETIME)
        .unwrap()
        .with_gitlab(oidc);
    let state = AppState::new((*database).clone(), keys(), Limits::default()).with_site(site);
    let app = TestApp::owning(state, database);
    sqlx::query("INSERT INTO users (id, username, admin) VALUES (7, 'alice', false)")
        .execute(&app.db)
        .await
        .unwrap();
    app
}

fn location(res: &TestResponse) -> String {
    res.headers
        .get(LOCATION)
        .unwrap_or_else(|| panic!("no Location ({}): {}", res.status, res.text()))
        .to_str()
        .unwrap()
        .to_owned()
}

fn set_cookies(res: &TestResponse) -> Vec<String> {
    res.headers
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// The `name=value` of the cookie `name` that `res` sets.
fn cookie_set(res: &TestResponse, name: &str) -> Option<String> {
    set_cookies(res)
        .into_iter()
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(|c| c.split(';').next().unwrap().to_owned())
}

/// The `name=value` of the attempt's cookie `res` sets: one per attempt, named after its state.
fn attempt_cookie_set(res: &TestResponse) -> Option<String> {
    set_cookies(res)
        .into_iter()
        .find(|c| c.starts_with("envlens_sign_in_"))
        .map(|c| c.split(';').next().unwrap().to_owned())
}

/// The cookie name of the attempt of `state`: the prefix and 16 hex digits of its SHA-256.
fn attempt_cookie_name(state: &str) -> String {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(state.as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("envlens_sign_in_{hex}")
}

fn query_param(url: &str, name: &str) -> Option<String> {
    let url = url::Url::parse(url).unwrap();
    url.query_pairs()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.into_owned())
}

/// The browser's first step: envlens sends it to GitLab. Returns GitLab's authorization URL
/// and the attempt's cookie.
async fn start(app: &TestApp, path: &str) -> (String, String) {
    let res = app
        .send(Request::get(path).body(Body::empty()).unwrap())
        .await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    let cookie = attempt_cookie_set(&res).expect("the attempt's cookie");
    let attempt = set_cookies(&res).into_iter().next().unwrap();
    let state = query_param(&location(&res), "state").unwrap();
    let (name, sealed) = cookie.split_once('=').unwrap();
    assert_eq!(name, attempt_cookie_name(&state));
    assert_eq!(opened(sealed).state, state);
    assert!(
        attempt.ends_with("; Path=/-/auth/; Max-Age=600; HttpOnly; SameSite=Lax"),
        "{attempt}"
    );
    (location(&res), cookie)
}

/// The key the server seals attempts with (from the test's session secret).
fn attempt_key() -> AttemptKey {
    AttemptKey::new(SESSION_KEY)
}

/// The attempt a cookie value carries.
fn opened(sealed: &str) -> Attempt {
    Attempt::open(sealed, &attempt_key(), chrono::Utc::now().timestamp()).expect("a sealed attempt")
}

/// Rows in every table of the database: what the server stores.
async fn stored_rows(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum((xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %I', table_name), false, true, '')))[1]::text::bigint), 0)::bigint
         FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// The browser at GitLab's authorization page: where GitLab sends it back to.
async fn at_gitlab(authorize_url: &str) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let res = client.get(authorize_url.parse().unwrap()).await.unwrap();
    let status = res.status();
    let location = res
        .headers()
        .get(LOCATION)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        status,
        StatusCode::FOUND,
        "{}",
        String::from_utf8_lossy(&body)
    );
    location.unwrap()
}

/// The browser back at envlens, with the attempt's cookie.
async fn back(app: &TestApp, redirect: &str, cookie: &str) -> TestResponse {
    let path = redirect.strip_prefix(PUBLIC_URL).expect("back to envlens");
    app.send(
        Request::get(path)
            .header(COOKIE, cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

async fn sessions(app: &TestApp) -> usize {
    app.rows("SELECT user_id FROM web_sessions").await.len()
}

#[tokio::test]
async fn a_known_user_signs_in_with_gitlab() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;

    // The sign-in page offers GitLab, keeping the page to return to.
    let page = app
        .send(
            Request::get("/-/sign-in?return_to=%2Fgroups%2Facme")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert!(
        page.text()
            .contains("href=\"/-/sign-in/gitlab?return_to=%2Fgroups%2Facme\""),
        "{}",
        page.text()
    );

    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab?return_to=%2Fgroups%2Facme").await;
    assert!(authorize.starts_with(&format!("{}/oauth/authorize?", gitlab.url)));
    for (name, value) in [
        ("response_type", "code"),
        ("client_id", CLIENT_ID),
        ("redirect_uri", CALLBACK),
        ("scope", "openid read_user"),
        ("code_challenge_method", "S256"),
    ] {
        assert_eq!(
            query_param(&authorize, name).as_deref(),
            Some(value),
            "{name}"
        );
    }
    let state = query_param(&authorize, "state").unwrap();
    assert!(cookie.starts_with(&format!("{}=", attempt_cookie_name(&state))));
    let nonce = query_param(&authorize, "nonce").unwrap();
    assert!(nonce.len() >= 32);
    // What stays until the callback travels with the browser, sealed; the server keeps
    // nothing of it.
    let carried = opened(cookie.split_once('=').unwrap().1);
    assert_eq!(carried.nonce, nonce);
    assert_eq!(carried.return_to, "/groups/acme");
    let remaining = carried.expires_at - chrono::Utc::now().timestamp();
    assert!((590..=600).contains(&remaining), "{remaining}");

    let redirect = at_gitlab(&authorize).await;
    let res = back(&app, &redirect, &cookie).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    assert_eq!(location(&res), "/groups/acme");
    let session = cookie_set(&res, "envlens_session").expect("a session");
    assert!(set_cookies(&res).iter().any(|c| c
        .starts_with(&format!("{}=;", attempt_cookie_name(&state)))
        && c.contains("Max-Age=0")));
    assert_eq!(gitlab.oauth.lock().unwrap().token_requests, 1);

    // The session is alice's: the API answers her with its CSRF token.
    let csrf: String = sqlx::query_scalar("SELECT csrf FROM web_sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let res = app
        .send(
            Request::get("/api/user")
                .header(COOKIE, &session)
                .header(CSRF_HEADER, csrf)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        res.json(),
        json!({"id": 7, "username": "alice", "admin": false})
    );

    // The same answer from GitLab again (a reload, a replay) signs nobody in: GitLab takes a
    // code once.
    let again = back(&app, &redirect, &cookie).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN, "{}", again.text());
    assert_eq!(sessions(&app).await, 1);
    assert_eq!(gitlab.oauth.lock().unwrap().token_requests, 2);
}

#[tokio::test]
async fn a_state_that_is_not_this_browsers_is_refused() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let redirect = at_gitlab(&authorize).await;
    let state = query_param(&redirect, "state").unwrap();
    let code = query_param(&redirect, "code").unwrap();
    let other = "A".repeat(43);
    // Another attempt of this server's, sealed for its own state.
    let (_, another) = start(&app, "/-/sign-in/gitlab").await;
    let another_sealed = another.split_once('=').unwrap().1;
    for (url, cookie) in [
        // Another state than the browser's cookie.
        (
            format!("{CALLBACK}?code={code}&state={other}"),
            cookie.clone(),
        ),
        // The right state in another browser (no cookie, or another attempt's).
        (redirect.clone(), String::new()),
        (
            redirect.clone(),
            format!("{}={other}", attempt_cookie_name(&other)),
        ),
        // The right cookie's name with another value.
        (
            redirect.clone(),
            format!("{}={other}", attempt_cookie_name(&state)),
        ),
        // A state envlens never issued, in the cookie too.
        (
            format!("{CALLBACK}?code={code}&state={other}"),
            format!("{}={other}", attempt_cookie_name(&other)),
        ),
        // No state at all.
        (format!("{CALLBACK}?code={code}"), cookie.clone()),
        // Another attempt's sealed value under this state's name.
        (
            redirect.clone(),
            format!("{}={another_sealed}", attempt_cookie_name(&state)),
        ),
    ] {
        let res = back(&app, &url, &cookie).await;
        assert!(
            res.status.is_client_error(),
            "{url} {cookie}: {}",
            res.status
        );
        assert!(cookie_set(&res, "envlens_session").is_none());
    }
    assert_eq!(sessions(&app).await, 0);
    assert_eq!(gitlab.oauth.lock().unwrap().token_requests, 0);
    // The genuine answer still works afterwards.
    assert!(cookie.starts_with(&format!("{}=", attempt_cookie_name(&state))));
    let res = back(&app, &redirect, &cookie).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    assert_eq!(sessions(&app).await, 1);
}

#[tokio::test]
async fn two_tabs_sign_in_at_once_in_either_order() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    for second_first in [true, false] {
        // One browser, two tabs: each attempt sets its own cookie, and the browser sends both.
        let (authorize_a, cookie_a) = start(&app, "/-/sign-in/gitlab?return_to=%2Fa").await;
        let (authorize_b, cookie_b) = start(&app, "/-/sign-in/gitlab?return_to=%2Fb").await;
        assert_ne!(cookie_a, cookie_b);
        let jar = format!("{cookie_a}; {cookie_b}");
        let (redirect_a, redirect_b) =
            (at_gitlab(&authorize_a).await, at_gitlab(&authorize_b).await);
        let order = if second_first {
            [(&redirect_b, "/b"), (&redirect_a, "/a")]
        } else {
            [(&redirect_a, "/a"), (&redirect_b, "/b")]
        };
        for (redirect, to) in order {
            let res = back(&app, redirect, &jar).await;
            assert_eq!(res.status, StatusCode::SEE_OTHER, "{to}: {}", res.text());
            assert_eq!(location(&res), to);
            assert!(cookie_set(&res, "envlens_session").is_some());
        }
    }
    assert_eq!(sessions(&app).await, 4);
}

#[tokio::test]
async fn an_attempt_cannot_be_completed_from_another_browser() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let (authorize_one, cookie_one) = start(&app, "/-/sign-in/gitlab").await;
    // Another browser with an attempt of its own: its cookie does not open the first's.
    let (authorize_two, cookie_two) = start(&app, "/-/sign-in/gitlab").await;
    let redirect_one = at_gitlab(&authorize_one).await;
    let res = back(&app, &redirect_one, &cookie_two).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.text());
    assert!(cookie_set(&res, "envlens_session").is_none());
    assert_eq!(sessions(&app).await, 0);
    assert_eq!(gitlab.oauth.lock().unwrap().token_requests, 0);
    // Each completes in its own browser.
    let res = back(&app, &redirect_one, &cookie_one).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    let res = back(&app, &at_gitlab(&authorize_two).await, &cookie_two).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    assert_eq!(sessions(&app).await, 2);
}

#[tokio::test]
async fn a_code_works_once_and_only_with_its_own_verifier() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let first = at_gitlab(&authorize).await;
    let code = query_param(&first, "code").unwrap();
    assert_eq!(
        back(&app, &first, &cookie).await.status,
        StatusCode::SEE_OTHER
    );

    // The used code, replayed within a new attempt of this browser: GitLab refuses it.
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let state = query_param(&authorize, "state").unwrap();
    let replay = format!("{CALLBACK}?code={code}&state={state}");
    let res = back(&app, &replay, &cookie).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.text());
    assert!(res.text().contains("invalid_grant"), "{}", res.text());
    assert_eq!(sessions(&app).await, 1);

    // A fresh code of one attempt, injected into another: its PKCE verifier does not match.
    let (authorize_a, _) = start(&app, "/-/sign-in/gitlab").await;
    let code_a = query_param(&at_gitlab(&authorize_a).await, "code").unwrap();
    let (authorize_b, cookie_b) = start(&app, "/-/sign-in/gitlab").await;
    let state_b = query_param(&authorize_b, "state").unwrap();
    let res = back(
        &app,
        &format!("{CALLBACK}?code={code_a}&state={state_b}"),
        &cookie_b,
    )
    .await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.text());
    assert!(res.text().contains("invalid_grant"));
    assert_eq!(sessions(&app).await, 1);
}

#[tokio::test]
async fn id_tokens_for_others_are_refused() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let cases: [(Option<serde_json::Value>, Option<&str>, &str); 3] = [
        (Some(json!("another-application")), None, "audience"),
        (
            Some(json!([CLIENT_ID, "another-application"])),
            None,
            "several audiences",
        ),
        (None, Some("not-the-nonce-of-this-sign-in"), "nonce"),
    ];
    for (audience, nonce, why) in cases {
        {
            let mut oauth = gitlab.oauth.lock().unwrap();
            oauth.id_token_audience = audience;
            oauth.id_token_nonce = nonce.map(Into::into);
        }
        let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
        let res = back(&app, &at_gitlab(&authorize).await, &cookie).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{why}: {}", res.text());
        assert!(
            res.text().to_lowercase().contains(why),
            "{why}: {}",
            res.text()
        );
        assert!(cookie_set(&res, "envlens_session").is_none());
    }
    assert_eq!(sessions(&app).await, 0);
}

#[tokio::test]
async fn a_gitlab_user_envlens_does_not_know_is_added_and_a_blocked_one_refused() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    // GitLab vouches for bob, whom the mirror lacks: added from `/user`, no memberships.
    gitlab.oauth.lock().unwrap().signed_in = Some((99, "bob".into()));
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let res = back(&app, &at_gitlab(&authorize).await, &cookie).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    assert!(cookie_set(&res, "envlens_session").is_some());
    let bob: (String, i64) = sqlx::query_as(
        "SELECT username, (SELECT count(*) FROM members WHERE user_id = 99) FROM users WHERE id = 99",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(bob, ("bob".to_owned(), 0));
    // Taken as external meanwhile (a sync whose token GitLab shows no one's flag): GitLab's
    // profile at the next sign-in says bob is not.
    sqlx::query("UPDATE users SET external = true WHERE id = 99")
        .execute(&app.db)
        .await
        .unwrap();
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let res = back(&app, &at_gitlab(&authorize).await, &cookie).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    let external: bool = sqlx::query_scalar("SELECT external FROM users WHERE id = 99")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(!external);
    // A user the mirror knows as blocked is refused, saying so.
    sqlx::query("UPDATE users SET state = 'blocked' WHERE id = 99")
        .execute(&app.db)
        .await
        .unwrap();
    let before = sessions(&app).await;
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let res = back(&app, &at_gitlab(&authorize).await, &cookie).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    let page = res.text();
    assert!(page.contains("envlens does not let you in"), "{page}");
    assert!(page.contains("@bob (GitLab user 99)"), "{page}");
    assert_eq!(sessions(&app).await, before);

    // A user who says no at GitLab.
    gitlab.oauth.lock().unwrap().signed_in = None;
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let res = back(&app, &at_gitlab(&authorize).await, &cookie).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert!(res.text().contains("access_denied"), "{}", res.text());
    assert_eq!(gitlab.oauth.lock().unwrap().token_requests, 3);
}

#[tokio::test]
async fn attempts_expire_and_return_only_to_envlens() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    // An attempt sealed ten minutes and a second ago (the server's key, its own words).
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab").await;
    let (name, sealed) = cookie.split_once('=').unwrap();
    let mut attempt = opened(sealed);
    attempt.expires_at = chrono::Utc::now().timestamp() - 1;
    let expired = format!("{name}={}", attempt.seal(&attempt_key()));
    let redirect = at_gitlab(&authorize).await;
    let res = back(&app, &redirect, &expired).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert!(res.text().contains("expired"), "{}", res.text());
    // Made longer by the browser: not one the server sealed.
    attempt.expires_at = chrono::Utc::now().timestamp() + 3600;
    let another = AttemptKey::new(b"not the server's session secret!");
    let forged = format!("{name}={}", attempt.seal(&another));
    let res = back(&app, &redirect, &forged).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert!(res.text().contains("did not start here"), "{}", res.text());

    for return_to in [
        "https%3A%2F%2Fevil.example%2F",
        "%2F%2Fevil.example",
        "%2F%5Cevil.example",
    ] {
        let (authorize, cookie) =
            start(&app, &format!("/-/sign-in/gitlab?return_to={return_to}")).await;
        let res = back(&app, &at_gitlab(&authorize).await, &cookie).await;
        assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
        assert_eq!(location(&res), "/", "{return_to}");
    }
}

#[tokio::test]
async fn gitlab_away_is_a_503_page() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let policy = Policy {
        attempts: 1,
        ..Policy::default()
    };
    let api = GitLab::new(&url, None, Arc::default(), policy).unwrap();
    let app = app_with(Oidc::new(api, CLIENT_ID, None)).await;
    let res = app
        .send(
            Request::get("/-/sign-in/gitlab")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        res.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        res.text()
    );
    assert!(res.text().contains("GitLab cannot be reached"));
}

/// SPEC 13: a sign-in attempt stores nothing on the server before GitLab answers, so ten
/// thousand attempts started meanwhile (as anyone may start them) neither push out a real one
/// nor grow what the server keeps.
#[tokio::test]
async fn ten_thousand_attempts_neither_push_out_a_real_one_nor_grow_the_server() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let (authorize, cookie) = start(&app, "/-/sign-in/gitlab?return_to=%2Fgroups%2Facme").await;
    let before = stored_rows(&app).await;
    for _ in 0..10_000 {
        let res = app
            .send(
                Request::get("/-/sign-in/gitlab")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    }
    assert_eq!(
        stored_rows(&app).await,
        before,
        "the server stored the attempts"
    );
    let res = back(&app, &at_gitlab(&authorize).await, &cookie).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.text());
    assert_eq!(location(&res), "/groups/acme");
    assert!(cookie_set(&res, "envlens_session").is_some());
}
