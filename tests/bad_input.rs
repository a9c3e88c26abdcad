//! Input that cannot be stored or is not one JSON value, on every REST endpoint (SPEC 3): a NUL
//! anywhere or a string over its column's limit is 422 naming the field, bytes after the JSON
//! value are 400, and neither changes anything.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::*;

/// A mirror with a project and an agent, so that every endpoint has something to act on.
async fn setup() -> TestApp {
    let app = TestApp::new().await;
    let res = app
        .internal(Method::PUT, "/api/v4/internal/identity", &identity())
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/7",
            &json!({"project_id": 10, "name": "prod"}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    app
}

fn identity() -> Value {
    json!({"groups": [{"id": 1, "full_path": "acme"}],
           "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"}],
           "users": [{"id": 1, "username": "alice"}],
           "members": [{"user_id": 1, "source_type": "group", "source_id": 1, "access_level": 30}]})
}

fn configuration() -> Value {
    json!({"agent_id": 7, "agent_config": {"ci_access": {"groups": [{"id": "acme"}]}}})
}

fn creation() -> Value {
    json!({"deployment": {"id": 1, "iid": 1, "status": "created", "ref": "main", "sha": "abc"},
           "project": {"id": 10, "full_path": "acme/agents"},
           "environment": {"id": 5, "name": "production", "slug": "production", "tier": "production"},
           "job": {"id": 3, "name": "deploy", "protected_ref": true},
           "kubernetes": {"agent": "acme/agents:prod", "namespace": "apps"}})
}

fn deployment_hook() -> Value {
    json!({"object_kind": "deployment", "deployment_id": 1, "status": "success",
           "status_changed_at": "2026-11-21 10:00:00 UTC", "environment": "production",
           "project": {"id": 10, "path_with_namespace": "acme/agents"}})
}

fn system_hook() -> Value {
    json!({"event_name": "user_create", "user_id": 2, "username": "bob"})
}

/// Sends `body` (as text) to one of the endpoints by name.
async fn send(app: &TestApp, endpoint: &str, body: String) -> TestResponse {
    let token = internal_token();
    match endpoint {
        "identity" => {
            app.internal_raw(Method::PUT, "/api/v4/internal/identity", &token, body)
                .await
        }
        "agent" => {
            app.internal_raw(
                Method::PUT,
                "/api/v4/internal/kubernetes/agents/7",
                &token,
                body,
            )
            .await
        }
        "configuration" => {
            app.internal_raw(
                Method::POST,
                "/api/v4/internal/kubernetes/agent_configuration",
                &token,
                body,
            )
            .await
        }
        "creation" => {
            app.internal_raw(Method::POST, "/api/v4/internal/deployments", &token, body)
                .await
        }
        "system hook" => app.hook("System Hook", body, None).await,
        "deployment hook" => app.hook("Deployment Hook", body, None).await,
        other => panic!("{other}"),
    }
}

/// `body` with `value` put at `pointer` (a JSON pointer; a last segment that is new is added).
fn with(mut body: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = body.pointer_mut(parent).unwrap();
    match parent {
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        Value::Object(fields) => {
            fields.insert(key.to_owned(), value);
        }
        _ => panic!("{pointer}"),
    }
    body
}

fn bodies() -> Vec<(&'static str, Value)> {
    vec![
        ("identity", identity()),
        ("agent", json!({"project_id": 10, "name": "prod"})),
        ("configuration", configuration()),
        ("creation", creation()),
        ("system hook", system_hook()),
        ("deployment hook", deployment_hook()),
    ]
}

#[tokio::test]
async fn a_nul_anywhere_is_422_naming_the_field() {
    let app = setup().await;
    let before = app.fingerprint().await;
    let nul = json!("a\u{0}b");
    for (endpoint, pointer, field) in [
        ("identity", "/users/0/username", "users[0].username"),
        ("identity", "/groups/0/full_path", "groups[0].full_path"),
        ("agent", "/name", "name"),
        (
            "configuration",
            "/agent_config/ci_access/groups/0/id",
            "agent_config.ci_access.groups[0].id",
        ),
        (
            "configuration",
            "/agent_config/observability",
            "agent_config.observability",
        ),
        ("creation", "/deployment/ref", "deployment.ref"),
        ("creation", "/environment/name", "environment.name"),
        ("creation", "/job/name", "job.name"),
        ("creation", "/unused", "unused"),
        ("system hook", "/username", "username"),
        ("deployment hook", "/environment", "environment"),
        ("deployment hook", "/ref", "ref"),
    ] {
        let body = bodies()
            .into_iter()
            .find(|(e, _)| *e == endpoint)
            .unwrap()
            .1;
        let res = send(&app, endpoint, with(body, pointer, nul.clone()).to_string()).await;
        let error = res.error(422);
        assert_eq!(error["field"], field, "{endpoint} {pointer}");
        assert!(
            error["message"].as_str().unwrap().contains("NUL"),
            "{error}"
        );
    }
    // In a key of the configuration, stored as jsonb.
    let body = json!({"agent_id": 7, "agent_config": {"user_access": {"x\u{0}": 1}}});
    let res = send(&app, "configuration", body.to_string()).await;
    assert_eq!(res.error(422)["field"], "agent_config.user_access.x\\u0000");
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn strings_over_their_columns_limit_are_422() {
    let app = setup().await;
    let before = app.fingerprint().await;
    let megabyte = json!("a".repeat(1_000_000));
    let long_name = json!("a".repeat(256));
    let long_segment = json!(format!("acme/{}", "a".repeat(256)));
    for (endpoint, pointer, value, field) in [
        (
            "identity",
            "/users/0/username",
            &megabyte,
            "users[0].username",
        ),
        (
            "identity",
            "/users/0/username",
            &long_name,
            "users[0].username",
        ),
        (
            "identity",
            "/projects/0/full_path",
            &long_segment,
            "projects[0].full_path",
        ),
        (
            "creation",
            "/environment/name",
            &long_name,
            "environment.name",
        ),
        (
            "creation",
            "/project/full_path",
            &megabyte,
            "project.full_path",
        ),
        ("system hook", "/username", &megabyte, "username"),
        ("deployment hook", "/environment", &long_name, "environment"),
    ] {
        let body = bodies()
            .into_iter()
            .find(|(e, _)| *e == endpoint)
            .unwrap()
            .1;
        let res = send(
            &app,
            endpoint,
            with(body, pointer, value.clone()).to_string(),
        )
        .await;
        assert_eq!(res.error(422)["field"], field, "{endpoint} {pointer}");
    }
    // A delivery id goes into a primary key.
    let res = app
        .hook(
            "System Hook",
            system_hook().to_string(),
            Some(&"d".repeat(5000)),
        )
        .await;
    assert_eq!(res.error(400)["code"], "bad_request");
    assert_eq!(app.fingerprint().await, before);
    // 255 characters are GitLab's limit, and fit.
    let body = with(system_hook(), "/username", json!("b".repeat(255)));
    assert_eq!(
        send(&app, "system hook", body.to_string()).await.status,
        200
    );
}

#[tokio::test]
async fn bytes_after_the_json_value_are_400_on_every_endpoint() {
    let app = setup().await;
    let before = app.fingerprint().await;
    for (endpoint, body) in bodies() {
        for tail in [" garbage", "{}", "]", " \"x\""] {
            let res = send(&app, endpoint, format!("{body}{tail}")).await;
            assert_eq!(res.error(400)["code"], "bad_request", "{endpoint} {tail}");
        }
        // Malformed is 400 whatever field comes first, one of the wrong type included.
        let text = body.to_string();
        let first = body.as_object().unwrap().keys().next().unwrap();
        let broken = format!("{{\"{first}\": [[]], {}, }}", &text[1..text.len() - 1]);
        let res = send(&app, endpoint, broken).await;
        assert_eq!(res.error(400)["code"], "bad_request", "{endpoint}");
        // A body that is not an object.
        for not_object in ["[]", "[{}]", "null", "1", "\"x\""] {
            let res = send(&app, endpoint, not_object.to_owned()).await;
            assert_eq!(res.error(422)["code"], "invalid", "{endpoint} {not_object}");
        }
    }
    assert_eq!(app.fingerprint().await, before);
    // Trailing whitespace is still one JSON value.
    let res = send(&app, "system hook", format!("{}\n \t", system_hook())).await;
    assert_eq!(res.status, 200, "{}", res.text());
}
