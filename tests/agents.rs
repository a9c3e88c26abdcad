//! Agents and their configuration: registration, path resolution, authorizations.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::*;

const CONFIGURATION: &str = "/api/v4/internal/kubernetes/agent_configuration";

/// acme (1) > acme/platform (2) > acme/platform/agents (project 10, the agents' home);
/// acme/app (11); other (3) > other/web (12).
async fn app_with_projects() -> TestApp {
    let app = TestApp::new().await;
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/platform"}, {"id": 3, "full_path": "other"}],
        "projects": [
            {"id": 10, "full_path": "acme/platform/agents", "visibility": "private"},
            {"id": 11, "full_path": "acme/app", "visibility": "private"},
            {"id": 12, "full_path": "other/web", "visibility": "public"}
        ]
    })).await;
    assert_eq!(res.status, 200);
    app
}

async fn register(app: &TestApp, id: i64, project_id: i64, name: &str) -> TestResponse {
    app.internal(
        Method::PUT,
        &format!("/api/v4/internal/kubernetes/agents/{id}"),
        &json!({"project_id": project_id, "name": name}),
    )
    .await
}

async fn configure(app: &TestApp, agent_id: i64, config: Value) -> TestResponse {
    app.internal(
        Method::POST,
        CONFIGURATION,
        &json!({"agent_id": agent_id, "agent_config": config}),
    )
    .await
}

#[tokio::test]
async fn registering_an_agent() {
    let app = app_with_projects().await;
    let res = register(&app, 7, 10, "prod").await;
    assert_eq!(res.status, 201);
    assert_eq!(
        res.json(),
        json!({"id": 7, "project_id": 10, "name": "prod"})
    );
    assert_eq!(register(&app, 7, 10, "production").await.status, 200);
    assert_eq!(
        app.rows("SELECT id, project_id, name FROM cluster_agents")
            .await,
        vec![json!({"id": 7, "project_id": 10, "name": "production"})]
    );
}

#[tokio::test]
async fn bad_registrations() {
    let app = app_with_projects().await;
    register(&app, 7, 10, "prod").await;
    let before = app.fingerprint().await;
    assert_eq!(
        register(&app, 8, 10, "prod").await.error(409)["code"],
        "conflict"
    );
    assert_eq!(
        register(&app, 8, 99, "prod").await.error(404)["message"],
        "project 99 is not in the identity mirror"
    );
    assert_eq!(
        register(&app, 8, 10, "Prod_1").await.error(422)["field"],
        "name"
    );
    assert_eq!(register(&app, 0, 10, "x").await.error(422)["field"], "id");
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/seven",
            &json!({"project_id": 10, "name": "x"}),
        )
        .await;
    assert_eq!(res.error(422)["field"], "id");
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/8",
            &json!({"name": "x"}),
        )
        .await;
    assert_eq!(res.error(422)["field"], "project_id");
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn configuration_resolves_paths_inside_the_agents_top_level_group() {
    let app = app_with_projects().await;
    register(&app, 7, 10, "prod").await;
    let res = configure(&app, 7, json!({
        "ci_access": {
            "projects": [
                {"id": "ACME/App", "default_namespace": "apps", "environments": ["production"], "protected_branches_only": true},
                {"id": "other/web"},
                {"id": "acme/missing"}
            ],
            "groups": [{"id": "acme/platform", "access_as": {"ci_job": {}}}]
        },
        "user_access": {"access_as": {"user": {}}, "groups": [{"id": "acme"}], "projects": [{"id": "acme/app"}]},
        "observability": {"logging": {"level": "debug"}}
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({
            "agent_id": 7,
            "ci_access": {"projects": 1, "groups": 1},
            "user_access": {"projects": 1, "groups": 1},
            "unresolved": [
                // Outside the top-level group `acme` of the agent's project.
                {"section": "ci_access", "kind": "project", "id": "other/web"},
                {"section": "ci_access", "kind": "project", "id": "acme/missing"}
            ]
        })
    );
    assert_eq!(app.rows("SELECT project_id, group_id, config FROM agent_ci_access_authorizations ORDER BY project_id NULLS LAST").await, vec![
        json!({"project_id": 11, "group_id": null, "config": {"id": "ACME/App", "default_namespace": "apps", "environments": ["production"], "protected_branches_only": true}}),
        json!({"project_id": null, "group_id": 2, "config": {"id": "acme/platform", "protected_branches_only": false, "access_as": {"ci_job": {}}}}),
    ]);
    assert_eq!(app.rows("SELECT project_id, group_id, config FROM agent_user_access_authorizations ORDER BY project_id NULLS LAST").await, vec![
        json!({"project_id": 11, "group_id": null, "config": {"access_as": {"user": {}}}}),
        json!({"project_id": null, "group_id": 1, "config": {"access_as": {"user": {}}}}),
    ]);
    // The whole file is kept, keys envlens does not read included.
    assert_eq!(
        app.rows("SELECT config -> 'observability' AS o FROM cluster_agents")
            .await,
        vec![json!({"o": {"logging": {"level": "debug"}}})]
    );
}

#[tokio::test]
async fn a_new_configuration_replaces_the_authorizations() {
    let app = app_with_projects().await;
    register(&app, 7, 10, "prod").await;
    configure(&app, 7, json!({"ci_access": {"projects": [{"id": "acme/app"}]}, "user_access": {"access_as": {"agent": {}}, "groups": [{"id": "acme"}]}})).await;
    let res = configure(
        &app,
        7,
        json!({"ci_access": {"groups": [{"id": "acme"}, {"id": "Acme"}]}}),
    )
    .await;
    assert_eq!(res.json()["ci_access"], json!({"projects": 0, "groups": 1}));
    assert_eq!(
        app.rows("SELECT project_id, group_id FROM agent_ci_access_authorizations")
            .await,
        vec![json!({"project_id": null, "group_id": 1})]
    );
    assert!(app
        .rows("SELECT * FROM agent_user_access_authorizations")
        .await
        .is_empty());
}

#[tokio::test]
async fn bad_configurations_change_nothing() {
    let app = app_with_projects().await;
    register(&app, 7, 10, "prod").await;
    configure(
        &app,
        7,
        json!({"ci_access": {"projects": [{"id": "acme/app"}]}}),
    )
    .await;
    let before = app.fingerprint().await;
    assert_eq!(
        configure(&app, 8, json!({})).await.error(404)["message"],
        "agent 8 is not registered"
    );
    let many: Vec<Value> = (0..501)
        .map(|i| json!({"id": format!("acme/p{i}")}))
        .collect();
    let cases = [
        (
            json!({"ci_access": {"projects": many}}),
            "agent_config.ci_access.projects",
        ),
        (
            json!({"ci_access": {"projects": [{"id": 5}]}}),
            "agent_config.ci_access.projects[0].id",
        ),
        (
            json!({"ci_access": {"groups": [{"id": "acme", "protected_branches_only": "yes"}]}}),
            "agent_config.ci_access.groups[0].protected_branches_only",
        ),
        (
            json!({"user_access": {"access_as": {"agent": {}, "user": {}}}}),
            "agent_config.user_access.access_as",
        ),
        (json!("ci_access: {}"), "agent_config"),
    ];
    for (config, field) in cases {
        assert_eq!(
            configure(&app, 7, config.clone()).await.error(422)["field"],
            field,
            "{config}"
        );
    }
    let res = app
        .internal(Method::POST, CONFIGURATION, &json!({"agent_config": {}}))
        .await;
    assert_eq!(res.error(422)["field"], "agent_id");
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn destroying_the_agents_project_removes_the_agent() {
    let app = app_with_projects().await;
    register(&app, 7, 10, "prod").await;
    configure(
        &app,
        7,
        json!({"ci_access": {"projects": [{"id": "acme/app"}]}}),
    )
    .await;
    let res = app.system_hook(&json!({"event_name": "project_destroy", "project_id": 10, "path_with_namespace": "acme/platform/agents"})).await;
    assert_eq!(res.status, 200);
    assert!(app.rows("SELECT * FROM cluster_agents").await.is_empty());
    assert!(app
        .rows("SELECT * FROM agent_ci_access_authorizations")
        .await
        .is_empty());
}

fn token(id: i64, name: &str, status: &str, last_used_at: Option<&str>) -> Value {
    // As GitLab's REST API answers it; `token` only in a creation's answer, never stored.
    json!({"id": id, "name": name, "description": null, "agent_id": 7, "status": status,
           "created_at": "2022-03-25T14:12:11.497Z", "created_by_user_id": 1,
           "last_used_at": last_used_at, "token": "glagent-secret"})
}

async fn put_tokens(app: &TestApp, agent: i64, tokens: &Value) -> TestResponse {
    app.internal(
        Method::PUT,
        &format!("/api/v4/internal/kubernetes/agents/{agent}/tokens"),
        tokens,
    )
    .await
}

#[tokio::test]
async fn an_agents_tokens_are_replaced_as_a_whole() {
    let app = app_with_projects().await;
    register(&app, 7, 10, "prod").await;
    register(&app, 8, 10, "staging").await;
    let tokens = json!([
        token(1, "abcd", "active", Some("2026-11-21T10:00:00Z")),
        token(2, "old", "revoked", None),
    ]);
    let res = put_tokens(&app, 7, &tokens).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json(), json!({"agent_id": 7, "tokens": 2, "active": 1}));
    let stored = "SELECT id, agent_id, name, status, created_by_user_id, last_used_at::text FROM cluster_agent_tokens ORDER BY id";
    assert_eq!(
        app.rows(stored).await,
        vec![
            json!({"id": 1, "agent_id": 7, "name": "abcd", "status": "active", "created_by_user_id": 1,
                   "last_used_at": "2026-11-21 10:00:00+00"}),
            json!({"id": 2, "agent_id": 7, "name": "old", "status": "revoked", "created_by_user_id": 1,
                   "last_used_at": null}),
        ]
    );
    // The next list replaces it: token 2 is gone, 3 is new, and GitLab's string user id is taken.
    let mut three = token(3, "new", "active", None);
    three["created_by_user_id"] = json!("5");
    let res = put_tokens(&app, 7, &json!([token(1, "abcd", "active", None), three])).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        app.rows("SELECT id, created_by_user_id FROM cluster_agent_tokens ORDER BY id")
            .await,
        vec![
            json!({"id": 1, "created_by_user_id": 1}),
            json!({"id": 3, "created_by_user_id": 5})
        ]
    );
    // The secret is nowhere.
    assert!(!app.fingerprint().await.contains("glagent-secret"));
    // An empty list removes them all.
    assert_eq!(put_tokens(&app, 7, &json!([])).await.status, 200);
    assert!(app
        .rows("SELECT id FROM cluster_agent_tokens")
        .await
        .is_empty());
}

#[tokio::test]
async fn bad_token_lists_name_their_field_and_change_nothing() {
    let app = app_with_projects().await;
    register(&app, 7, 10, "prod").await;
    register(&app, 8, 10, "staging").await;
    let mut other = token(9, "theirs", "active", None);
    other["agent_id"] = json!(8);
    assert_eq!(put_tokens(&app, 8, &json!([other])).await.status, 200);
    assert_eq!(
        put_tokens(&app, 7, &json!([token(1, "abcd", "active", None)]))
            .await
            .status,
        200
    );
    let before = app.fingerprint().await;
    let with = |key: &str, value: Value| {
        let mut t = token(2, "new", "active", None);
        t[key] = value;
        json!([token(1, "abcd", "active", None), t])
    };
    let cases = [
        (with("id", json!(0)), "[1].id"),
        (with("id", json!(1)), "[1].id"),
        (with("name", json!("")), "[1].name"),
        (with("name", json!("a".repeat(256))), "[1].name"),
        (with("name", json!("a\u{0}b")), "[1].name"),
        (
            with("description", json!("d".repeat(1025))),
            "[1].description",
        ),
        (with("agent_id", json!(8)), "[1].agent_id"),
        (with("status", json!("expired")), "[1].status"),
        (with("created_at", json!("yesterday")), "[1].created_at"),
        (
            with("created_by_user_id", json!("root")),
            "[1].created_by_user_id",
        ),
        (with("last_used_at", json!(5)), "[1].last_used_at"),
        (json!({"tokens": []}), ""),
    ];
    for (body, field) in cases {
        let res = put_tokens(&app, 7, &body).await;
        assert_eq!(res.error(422)["field"], field, "{body}");
    }
    // Another agent's token id: a conflict. An unknown agent: 404.
    let res = put_tokens(&app, 7, &json!([token(9, "theirs", "active", None)])).await;
    assert_eq!(
        res.error(409)["message"],
        "token 9 belongs to agent 8: GitLab's token ids are unique"
    );
    assert_eq!(put_tokens(&app, 70, &json!([])).await.status, 404);
    assert_eq!(
        put_tokens(&app, 0, &json!([])).await.error(422)["field"],
        "id"
    );
    // Internal authentication, like every internal route.
    let res = app
        .internal_raw(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/7/tokens",
            "not-a-token",
            "[]".into(),
        )
        .await;
    assert_eq!(res.status, 401);
    assert_eq!(app.fingerprint().await, before);
}
