//! User state (SPEC 13, "User state"): a user GitLab no longer lets in is refused everywhere,
//! whatever credential they still hold; an external user never reads internal projects; a
//! user GitLab vouches for but the mirror lacks is added, with no memberships.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::auth::dashboard;
use serde_json::{json, Value};

use crate::proxy::{bearer, cluster, config, populate, PODS};
use crate::support::gitlab::TestGitLab;
use crate::support::*;

/// A dashboard session (`envlens_session`) of `user`: the cookie and its CSRF token.
async fn dashboard_session(app: &TestApp, user: i64) -> (String, String) {
    let id = dashboard::new_secret();
    let csrf = dashboard::new_secret();
    envlens::db::sessions::create_session(
        &app.db,
        &dashboard::hash(&id),
        user,
        &csrf,
        Duration::from_secs(600),
    )
    .await
    .unwrap();
    (format!("{}={id}", dashboard::COOKIE_NAME), csrf)
}

async fn graphql_with(
    app: &TestApp,
    request: axum::http::request::Builder,
    query: &str,
) -> TestResponse {
    app.send(
        request
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json!({ "query": query }).to_string()))
            .unwrap(),
    )
    .await
}

fn failed_login(user: i64, username: &str, state: &str) -> Value {
    // GitLab's documented `user_failed_login` (doc/administration/system_hooks.md).
    json!({"event_name": "user_failed_login", "created_at": "2026-10-03T06:08:48Z",
           "updated_at": "2026-11-15T04:52:06Z", "name": username, "email": format!("{username}@example.com"),
           "user_id": user, "username": username, "state": state})
}

#[tokio::test]
async fn a_blocked_users_sessions_are_refused_after_the_hook() {
    let (_api, served, _dir) = cluster().await;
    let app = TestApp::with_config(&format!("{}  access_cache: 100ms\n", config(&served))).await;
    populate(&app).await;
    let (cookie, csrf) = dashboard_session(&app, 2).await;
    let with_cookie = || {
        Request::post("/api/graphql")
            .header(header::COOKIE, &cookie)
            .header("x-csrf-token", &csrf)
    };
    let query = "{ currentUser { username } }";
    // Before: the JWT session, the dashboard's session and the proxy all let pdev in.
    assert_eq!(app.get_as("/api/user", 2, "pdev").await.status, 200);
    let res = graphql_with(&app, with_cookie(), query).await;
    assert_eq!(
        res.json()["data"]["currentUser"]["username"],
        "pdev",
        "{}",
        res.text()
    );
    let res = app
        .send(bearer(2, 7, Method::GET, PODS).body(Body::empty()).unwrap())
        .await;
    assert_eq!(res.status, 200, "{}", res.text());

    // GitLab blocks pdev, who then tries to sign in at GitLab: the hook carries the state.
    let res = app.system_hook(&failed_login(2, "pdev", "blocked")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.get_as("/api/user", 2, "pdev").await.error(401)["code"],
        "unauthorized"
    );
    assert_eq!(graphql_with(&app, with_cookie(), query).await.status, 401);
    let res = app
        .send(bearer(2, 7, Method::GET, PODS).body(Body::empty()).unwrap())
        .await;
    assert_eq!(res.status, 401, "{}", res.text());
    // Others are not touched; unblocked, pdev is back.
    assert_eq!(app.get_as("/api/user", 3, "gmaint").await.status, 200);
    let res = app.system_hook(&failed_login(2, "pdev", "active")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(app.get_as("/api/user", 2, "pdev").await.status, 200);
    // Every state but `active` keeps them out.
    for state in [
        "deactivated",
        "banned",
        "blocked_pending_approval",
        "ldap_blocked",
        "Weird State!",
    ] {
        app.system_hook(&failed_login(2, "pdev", state)).await;
        assert_eq!(
            app.get_as("/api/user", 2, "pdev").await.status,
            401,
            "{state}"
        );
    }
}

#[tokio::test]
async fn an_external_user_reads_public_and_member_projects_never_internal_ones() {
    let app = TestApp::new().await;
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}],
        "projects": [{"id": 42, "full_path": "acme/web", "visibility": "internal"},
                     {"id": 43, "full_path": "acme/site", "visibility": "public"},
                     {"id": 44, "full_path": "acme/partner", "visibility": "internal"},
                     {"id": 45, "full_path": "acme/secret", "visibility": "private"}],
        "users": [{"id": 2, "username": "contractor", "external": true}, {"id": 3, "username": "staff"}],
        "members": [{"user_id": 2, "source_type": "project", "source_id": 44, "access_level": 20}]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let query = r#"{ internal: project(fullPath: "acme/web") { fullPath environments { nodes { name } } }
        public: project(fullPath: "acme/site") { fullPath }
        member: project(fullPath: "acme/partner") { fullPath }
        private: project(fullPath: "acme/secret") { fullPath } }"#;
    let ask = |user: (i64, &'static str)| {
        let (token, _) =
            envlens::auth::mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(600))
                .unwrap();
        graphql_with(
            &app,
            Request::post("/api/graphql").header(header::AUTHORIZATION, format!("Bearer {token}")),
            query,
        )
    };
    let res = ask((2, "contractor")).await;
    let data = &res.json()["data"];
    assert_eq!(data["internal"], Value::Null, "{}", res.text());
    assert_eq!(data["public"]["fullPath"], "acme/site");
    assert_eq!(data["member"]["fullPath"], "acme/partner");
    assert_eq!(data["private"], Value::Null);
    // Anyone else reads the internal project.
    let res = ask((3, "staff")).await;
    assert_eq!(
        res.json()["data"]["internal"]["fullPath"],
        "acme/web",
        "{}",
        res.text()
    );
}

#[tokio::test]
async fn a_user_gitlab_vouches_for_is_added_with_no_memberships() {
    let gitlab = TestGitLab::start().await;
    let app = crate::environment_lookup::app_with_api(&gitlab).await;
    gitlab.accept_token("glpat-newcomer", 99, "newcomer");
    let res = app
        .send(
            Request::get("/api/user")
                .header(header::AUTHORIZATION, "Bearer glpat-newcomer")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"id": 99, "username": "newcomer", "admin": false})
    );
    let (state, memberships): (String, i64) = sqlx::query_as(
        "SELECT u.state, (SELECT count(*) FROM members m WHERE m.user_id = u.id) FROM users u WHERE u.id = 99",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((state.as_str(), memberships), ("active", 0));
    // Their profile was read once, with their own token.
    assert_eq!(
        gitlab
            .user_requests
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // A session GitLab minted for a user the mirror lacks is still refused: only GitLab's own
    // word on a token adds a user.
    assert_eq!(app.get_as("/api/user", 77, "ghost").await.status, 401);
}

#[tokio::test]
async fn a_signed_in_users_state_is_read_again_from_gitlab() {
    let gitlab = TestGitLab::start().await;
    let app = crate::environment_lookup::app_with_api(&gitlab).await;
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/identity",
            &json!({
            "groups": [], "projects": [], "users": [{"id": 2, "username": "dev"}], "members": []}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // GitLab has deactivated dev; no hook said so.
    let mut dev = crate::support::gitlab_rest::user(2, "dev", false);
    dev["state"] = json!("deactivated");
    gitlab.rest.with(|d| d.users = vec![dev]);
    assert_eq!(app.get_as("/api/user", 2, "dev").await.status, 401);
    let state: String = sqlx::query_scalar("SELECT state FROM users WHERE id = 2")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(state, "deactivated");
    assert!(
        gitlab.rest.calls().iter().any(|c| c == "/api/v4/users/2"),
        "{:?}",
        gitlab.rest.calls()
    );
}
