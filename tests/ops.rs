//! Liveness, readiness, metrics, and the answers every route shares: 404, 413, 400, timeouts.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use envlens::config::Limits;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn liveness_and_readiness() {
    let app = TestApp::new().await;
    let live = app
        .send(Request::get("/-/liveness").body(Body::empty()).unwrap())
        .await;
    assert_eq!((live.status.as_u16(), live.text().as_str()), (200, "ok"));
    let ready = app
        .send(Request::get("/-/readiness").body(Body::empty()).unwrap())
        .await;
    assert_eq!(ready.status, 200);
    // Without a database the process lives on, but is not ready.
    app.db.close().await;
    let ready = app
        .send(Request::get("/-/readiness").body(Body::empty()).unwrap())
        .await;
    assert_eq!(ready.error(503)["code"], "unavailable");
    let live = app
        .send(Request::get("/-/liveness").body(Body::empty()).unwrap())
        .await;
    assert_eq!(live.status, 200);
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_status() {
    let app = TestApp::new().await;
    for _ in 0..3 {
        app.send(Request::get("/-/liveness").body(Body::empty()).unwrap())
            .await;
    }
    app.send(
        Request::put("/api/v4/internal/kubernetes/agents/12")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let metrics = app
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await;
    assert_eq!(
        metrics.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = metrics.text();
    assert!(
        text.contains(
            r#"envlens_http_requests_total{method="GET",route="/-/liveness",status="200"} 3"#
        ),
        "{text}"
    );
    // The route pattern, never the raw path with its id.
    assert!(text.contains(r#"envlens_http_requests_total{method="PUT",route="/api/v4/internal/kubernetes/agents/{id}",status="401"} 1"#), "{text}");
    assert!(text.contains(r#"envlens_http_request_duration_seconds_count{method="GET",route="/-/liveness",status="200"} 3"#));
}

#[tokio::test]
async fn unknown_route_is_a_json_404() {
    let app = TestApp::new().await;
    let res = app
        .send(Request::get("/api/v4/nothing").body(Body::empty()).unwrap())
        .await;
    assert_eq!(
        res.error(404),
        json!({"code": "not_found", "message": "no route for GET /api/v4/nothing"})
    );
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let app = TestApp::with_limits(Limits {
        body_limit: 1024,
        ..Limits::default()
    })
    .await;
    let before = app.fingerprint().await;
    let users: Vec<_> = (1..100)
        .map(|i| json!({"id": i, "username": format!("user{i}")}))
        .collect();
    let big = json!({ "users": users }).to_string();
    assert!(big.len() > 1024);
    let res = app
        .internal_raw(
            Method::PUT,
            "/api/v4/internal/identity",
            &internal_token(),
            big.clone(),
        )
        .await;
    assert_eq!(res.error(413)["code"], "payload_too_large");
    let res = app.hook("System Hook", big, None).await;
    assert_eq!(
        res.error(413)["message"],
        "request body is larger than the limit of 1024 bytes"
    );
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn a_request_that_outlives_its_timeout_is_503_and_rolled_back() {
    let app = TestApp::with_limits(Limits {
        request_timeout: Duration::from_secs(1),
        ..Limits::default()
    })
    .await;
    app.system_hook(&json!({"event_name": "user_create", "user_id": 1, "username": "alice"}))
        .await;
    let before = app.fingerprint().await;
    // Another transaction holds the user's row, so the rename waits on its lock.
    let mut blocker = app.db.begin().await.unwrap();
    sqlx::query("SELECT * FROM users WHERE id = 1 FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let res = app.system_hook(&json!({"event_name": "user_rename", "user_id": 1, "username": "bob", "old_username": "alice"})).await;
    assert_eq!(res.error(503)["message"], "request timed out after 1s");
    blocker.rollback().await.unwrap();
    assert_eq!(app.fingerprint().await, before);
}
