//! The three kinds of callers, and every way their credentials can be wrong.

use axum::body::Body;
use axum::http::{header, Method, Request};
use jsonwebtoken::Algorithm;
use serde_json::{json, Value};

use crate::support::*;

const IDENTITY: &str = "/api/v4/internal/identity";

fn snapshot() -> String {
    json!({ "users": [{ "id": 1, "username": "alice" }] }).to_string()
}

fn with(mut claims: Value, changes: Value) -> Value {
    for (k, v) in changes.as_object().unwrap() {
        if v.is_null() {
            claims.as_object_mut().unwrap().remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    claims
}

#[tokio::test]
async fn internal_token_accepted() {
    let app = TestApp::new().await;
    let res = app
        .internal_raw(Method::PUT, IDENTITY, &internal_token(), snapshot())
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        app.rows("SELECT username FROM users").await,
        vec![json!({"username": "alice"})]
    );
}

#[tokio::test]
async fn internal_token_refused_in_every_bad_form() {
    let app = TestApp::new().await;
    let before = app.fingerprint().await;
    let good = internal_claims();
    // A header of {"alg":"none"} with the claims and no signature.
    let unsigned = {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.",
            b64.encode(r#"{"alg":"none","typ":"JWT"}"#),
            b64.encode(good.to_string())
        )
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "expired",
            sign(
                &with(good.clone(), json!({"iat": now() - 600, "exp": now() - 60})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "not yet valid",
            sign(
                &with(good.clone(), json!({"nbf": now() + 120})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "other secret",
            sign(&good, b"another-key-another-key-another-", Algorithm::HS256),
        ),
        ("alg none", unsigned),
        ("HS512", sign(&good, INTERNAL_KEY, Algorithm::HS512)),
        (
            "wrong aud",
            sign(
                &with(good.clone(), json!({"aud": "envlens-user"})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "wrong iss",
            sign(
                &with(good.clone(), json!({"iss": "gitlab-evil"})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "no exp",
            sign(
                &with(good.clone(), json!({"exp": null})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "no iat",
            sign(
                &with(good.clone(), json!({"iat": null})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "exp too far ahead",
            sign(
                &with(good.clone(), json!({"exp": now() + 3600})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "issued in the future",
            sign(
                &with(good.clone(), json!({"iat": now() + 120})),
                INTERNAL_KEY,
                Algorithm::HS256,
            ),
        ),
        ("garbage", "not-a-jwt".to_owned()),
    ];
    for (case, token) in cases {
        let res = app
            .internal_raw(Method::PUT, IDENTITY, &token, snapshot())
            .await;
        let error = res.error(401);
        assert_eq!(error["code"], "unauthorized", "{case}");
    }
    // The five-minute cap has no leeway: two seconds past it is refused. Signed just before it
    // is sent, as the server reads the cap against its own clock (a token signed among the
    // cases above could reach it a second later, under the cap).
    let token = sign(
        &with(good.clone(), json!({"exp": now() + 302})),
        INTERNAL_KEY,
        Algorithm::HS256,
    );
    let res = app
        .internal_raw(Method::PUT, IDENTITY, &token, snapshot())
        .await;
    assert_eq!(res.error(401)["code"], "unauthorized", "exp past the cap");
    let req = Request::put(IDENTITY).body(Body::from(snapshot())).unwrap();
    assert_eq!(
        app.send(req).await.error(401)["message"],
        "missing Gitlab-Envlens-Api-Request header"
    );
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn leeway_of_five_seconds() {
    let app = TestApp::new().await;
    let just_expired = sign(
        &with(internal_claims(), json!({"exp": now() - 2})),
        INTERNAL_KEY,
        Algorithm::HS256,
    );
    assert_eq!(
        app.internal_raw(Method::PUT, IDENTITY, &just_expired, snapshot())
            .await
            .status,
        200
    );
    let long_expired = sign(
        &with(internal_claims(), json!({"exp": now() - 30})),
        INTERNAL_KEY,
        Algorithm::HS256,
    );
    assert_eq!(
        app.internal_raw(Method::PUT, IDENTITY, &long_expired, snapshot())
            .await
            .status,
        401
    );
}

async fn app_with_alice() -> TestApp {
    let app = TestApp::new().await;
    let res = app
        .internal(
            Method::PUT,
            IDENTITY,
            &json!({"users": [{"id": 7, "username": "alice", "admin": true}]}),
        )
        .await;
    assert_eq!(res.status, 200);
    app
}

fn session_claims(user: i64) -> Value {
    json!({"iss": "gitlab", "aud": "envlens-user", "sub": user.to_string(), "username": "alice",
           "csrf": "csrf-123", "iat": now(), "exp": now() + 600})
}

fn cookie_request(token: &str, csrf: Option<&str>) -> Request<Body> {
    let mut req = Request::get("/api/user")
        .header(header::COOKIE, format!("theme=dark; _gitlab_kas={token}"));
    if let Some(csrf) = csrf {
        req = req.header("X-Csrf-Token", csrf);
    }
    req.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn session_as_bearer_token() {
    let app = app_with_alice().await;
    let res = app.get_as("/api/user", 7, "alice").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"id": 7, "username": "alice", "admin": true})
    );
}

#[tokio::test]
async fn session_cookie_needs_its_csrf_token() {
    let app = app_with_alice().await;
    let token = sign(&session_claims(7), SESSION_KEY, Algorithm::HS256);
    assert_eq!(
        app.send(cookie_request(&token, Some("csrf-123")))
            .await
            .status,
        200
    );
    assert_eq!(
        app.send(cookie_request(&token, None)).await.error(401)["message"],
        "missing CSRF token"
    );
    assert_eq!(
        app.send(cookie_request(&token, Some("csrf-124")))
            .await
            .error(401)["message"],
        "CSRF token does not match"
    );
    // A WebSocket carries it as a query parameter, and only a WebSocket may.
    let ws = |upgrade: bool| {
        let mut req = Request::get("/api/user?gitlab-csrf-token=csrf-123")
            .header(header::COOKIE, format!("_gitlab_kas={token}"));
        if upgrade {
            req = req.header(header::UPGRADE, "websocket");
        }
        req.body(Body::empty()).unwrap()
    };
    assert_eq!(app.send(ws(true)).await.status, 200);
    assert_eq!(app.send(ws(false)).await.status, 401);
    // A token whose `csrf` is empty matches no CSRF token, an empty one included.
    let blank = sign(
        &with(session_claims(7), json!({"csrf": ""})),
        SESSION_KEY,
        Algorithm::HS256,
    );
    for sent in [Some(""), None, Some("csrf-123")] {
        assert_eq!(
            app.send(cookie_request(&blank, sent)).await.status,
            401,
            "{sent:?}"
        );
    }
    // As a bearer token it needs none.
    let req = Request::get("/api/user")
        .header(header::AUTHORIZATION, format!("Bearer {blank}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(req).await.status, 200);
}

#[tokio::test]
async fn the_lifetime_cap_is_a_cap() {
    let app = TestApp::new().await;
    for (exp, status) in [(300, 200), (301, 401), (305, 401)] {
        let token = sign(
            &with(internal_claims(), json!({"exp": now() + exp})),
            INTERNAL_KEY,
            Algorithm::HS256,
        );
        let res = app
            .internal_raw(Method::PUT, IDENTITY, &token, snapshot())
            .await;
        assert_eq!(res.status.as_u16(), status, "exp in {exp}s: {}", res.text());
    }
}

#[tokio::test]
async fn session_refused_in_every_bad_form() {
    let app = app_with_alice().await;
    let good = session_claims(7);
    let cases = [
        (
            "unknown user",
            sign(&session_claims(8), SESSION_KEY, Algorithm::HS256),
        ),
        (
            "expired",
            sign(
                &with(good.clone(), json!({"iat": now() - 900, "exp": now() - 60})),
                SESSION_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "longer than a day",
            sign(
                &with(good.clone(), json!({"exp": now() + 2 * 86400})),
                SESSION_KEY,
                Algorithm::HS256,
            ),
        ),
        (
            "internal audience",
            sign(
                &with(good.clone(), json!({"aud": "envlens"})),
                SESSION_KEY,
                Algorithm::HS256,
            ),
        ),
        ("internal key", sign(&good, INTERNAL_KEY, Algorithm::HS256)),
        (
            "sub not an id",
            sign(
                &with(good.clone(), json!({"sub": "alice"})),
                SESSION_KEY,
                Algorithm::HS256,
            ),
        ),
    ];
    for (case, token) in cases {
        let req = Request::get("/api/user")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(app.send(req).await.status, 401, "{case}");
    }
    let basic = Request::get("/api/user")
        .header(header::AUTHORIZATION, "Basic YWxpY2U6eA==")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(basic).await.status, 401);
    let nothing = Request::get("/api/user").body(Body::empty()).unwrap();
    assert_eq!(
        app.send(nothing).await.error(401)["message"],
        "not signed in"
    );
}

#[tokio::test]
async fn webhook_token_checked_before_anything_else() {
    let app = TestApp::new().await;
    let before = app.fingerprint().await;
    let body = json!({"event_name": "user_create", "user_id": 1, "username": "alice"}).to_string();
    for token in [None, Some("wrong"), Some("webhook-tokenX"), Some("")] {
        let mut req = Request::post("/webhooks/gitlab").header("X-Gitlab-Event", "System Hook");
        if let Some(t) = token {
            req = req.header("X-Gitlab-Token", t);
        }
        let res = app.send(req.body(Body::from(body.clone())).unwrap()).await;
        assert_eq!(res.error(401)["code"], "unauthorized", "{token:?}");
    }
    assert_eq!(app.fingerprint().await, before);
}
