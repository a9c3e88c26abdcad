//! Which cluster an agent reaches, and what the proxy refuses whatever the RBAC says (SPEC 6
//! and 13), attack by attack, through the requests an attacker sends:
//! - a Maintainer of any synced project registers an agent of their own (the sync, then a Push
//!   Hook), and asks the proxy for envlens' own Secret through it: there is no default cluster,
//!   so nothing reaches any cluster (503), and the agent's environment says why;
//! - through an agent that does reach a cluster with a broad role, Secrets of envlens' own
//!   namespace, Secrets of every namespace, and `proxy` subresources are 403, after the
//!   `user_access` check and before anything is sent.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::auth::mint_session;
use envlens::config::Limits;
use envlens::gitlab::Instance;
use envlens::ingest::sync::{pass, Scope};
use envlens::state::AppState;
use envlens::telemetry::Metrics;
use serde_json::{json, Value};

use crate::environment_lookup::api as gitlab_api;
use crate::proxy;
use crate::support::gitlab::TestGitLab;
use crate::support::gitlab_rest as rest;
use crate::support::kube_api::{KubeApi, Served};
use crate::support::*;

/// envlens' own namespace in these tests, and its Secret (the session key among its values).
const OWN: &str = "envlens";
const OWN_SECRET: &str = "/k8s-proxy/api/v1/namespaces/envlens/secrets/envlens-envlens-secrets";

/// The cluster: envlens' Secret in its namespace, and the shop's Pod.
async fn cluster() -> (KubeApi, Served, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    api.insert(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "envlens-envlens-secrets", "namespace": OWN},
        "data": {"session-secret": "c2Vzc2lvbi1rZXktb2YtZW52bGVucw=="}}));
    api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop",
            "labels": {"app.gitlab.com/project_id": "66", "app.gitlab.com/environment_slug": "production"}},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]}}));
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

/// GitLab: acme (1) > acme/agents (10, `ops` (3) Maintainer) with the operators' agent 7 `prod`,
/// and acme/evil (66),
/// where `mal` (9) is Maintainer and has registered agent 99 `x`, whose `user_access` admits
/// acme/evil with the agent's own identity.
fn populate(gitlab: &TestGitLab) {
    gitlab.rest.with(|d| {
        d.groups = vec![rest::group(1, "acme")];
        d.projects = vec![
            rest::project(10, "acme/agents", Some("main")),
            rest::project(66, "acme/evil", Some("main")),
        ];
        d.users = vec![
            rest::user(1, "root", true),
            rest::user(3, "ops", false),
            rest::user(9, "mal", false),
        ];
        d.project_members
            .insert(10, vec![rest::member(3, "ops", 40)]);
        d.project_members
            .insert(66, vec![rest::member(9, "mal", 40)]);
        d.agents
            .insert(10, vec![rest::agent(7, "prod", (10, "acme/agents"))]);
        d.agents
            .insert(66, vec![rest::agent(99, "x", (66, "acme/evil"))]);
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "user_access:\n  access_as:\n    agent: {}\n  projects:\n    - id: acme/agents\n"
                .into(),
        );
        d.files.insert(
            (66, ".gitlab/agents/x/config.yaml".into(), "main".into()),
            "user_access:\n  access_as:\n    agent: {}\n  projects:\n    - id: acme/evil\n".into(),
        );
    });
}

/// envlens beside `gitlab`, whose configuration connects only agent 7 (by its context).
async fn app(gitlab: &TestGitLab, served: &Served) -> TestApp {
    let yaml = format!(
        "kubernetes:\n{}  own_namespace: {OWN}\n",
        served.connections(&["7"])
    );
    let settings = envlens::config::file::Settings::parse(&yaml).unwrap();
    let clusters = envlens::k8s::clusters::Clusters::load(&settings.kubernetes, Default::default())
        .await
        .unwrap();
    let instance = Instance::new(
        gitlab_api(gitlab),
        "https://envlens.example.com",
        Duration::from_secs(60),
        None,
    );
    let database = postgres::fresh_database().await;
    let state = AppState::new((*database).clone(), keys(), Limits::default())
        .with_clusters(clusters, settings.cors)
        .with_gitlab(instance);
    TestApp::owning(state, database)
}

fn get(user: (i64, &str), agent: i64, path: &str) -> Request<Body> {
    let (token, _) = mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(600)).unwrap();
    Request::get(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header("Gitlab-Agent-Id", agent.to_string())
        .body(Body::empty())
        .unwrap()
}

#[track_caller]
fn assert_status(res: &TestResponse, code: u16, message: &str) {
    assert_eq!(res.status, code, "{}", res.text());
    let status = res.json();
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["code"], code, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains(message),
        "{status}"
    );
    assert_eq!(res.headers.get("gitlab-unauthorized"), None);
}

/// A push in GitLab's documented shape to acme/evil (66) touching the agent's configuration.
fn push_to_evil() -> Value {
    json!({"object_kind": "push", "event_name": "push",
        "before": "95790bf891e76fee5e1747ab589903a6a1f80f22", "after": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
        "ref": "refs/heads/main", "ref_protected": true, "checkout_sha": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
        "user_id": 9, "user_name": "Mal", "user_username": "mal", "user_email": "mal@example.com", "user_avatar": null,
        "project_id": 66,
        "project": {"id": 66, "name": "evil", "description": "", "web_url": "https://gitlab.example.com/acme/evil",
                    "avatar_url": null, "namespace": "acme", "visibility_level": 0,
                    "path_with_namespace": "acme/evil", "default_branch": "main"},
        "repository": {"name": "evil", "url": "git@gitlab.example.com:acme/evil.git", "visibility_level": 0},
        "commits": [{"id": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7", "message": "Reach the cluster", "title": "Reach the cluster",
                     "timestamp": "2026-11-24T10:00:00+01:00", "url": "https://gitlab.example.com/c",
                     "author": {"name": "Mal", "email": "mal@example.com"},
                     "added": [], "modified": [".gitlab/agents/x/config.yaml"], "removed": []}],
        "total_commits_count": 1})
}

#[tokio::test]
async fn an_agent_without_an_entry_reaches_no_cluster() {
    let (api, served, _dir) = cluster().await;
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app(&gitlab, &served).await;
    let scope = Scope {
        groups: vec!["acme".into()],
        max_projects: 1_000,
        timeout: Duration::from_secs(60),
    };
    pass(
        &app.db,
        &gitlab_api(&gitlab),
        &scope,
        &Metrics::default(),
        &mut |_| {},
    )
    .await
    .unwrap();
    // The attacker's push: their agent's configuration is read again and applied.
    gitlab.rest.with(|d| {
        d.files.insert(
            (66, ".gitlab/agents/x/config.yaml".into(), "main".into()),
            "user_access:\n  access_as:\n    agent: {}\n  projects:\n    - id: acme/evil\n  groups:\n    - id: acme\n".into(),
        );
    });
    let res = app
        .hook("Push Hook", push_to_evil().to_string(), None)
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    assert_eq!(res.json()["outcome"], "applied", "{}", res.text());
    let registered: Vec<Value> = app
        .rows("SELECT name FROM cluster_agents WHERE id = 99")
        .await;
    assert_eq!(registered, [json!({"name": "x"})]);

    // Their own GitLab session, their own agent, envlens' Secret: refused by its path (SPEC
    // 13's order: credentials, user_access, path, connection), and nothing is sent anywhere.
    let sent = api.requests().len();
    let mal = (9, "mal");
    let res = app.send(get(mal, 99, OWN_SECRET)).await;
    assert_status(&res, 403, "Secrets of namespace envlens");
    // Any other request through it: no cluster connection.
    for path in [
        "/k8s-proxy/api/v1/namespaces/shop/secrets",
        "/k8s-proxy/api/v1/namespaces/shop/pods",
        "/k8s-proxy/api/v1/namespaces/shop/pods?watch=true",
        "/k8s-proxy/version",
    ] {
        let res = app.send(get(mal, 99, path)).await;
        assert_status(
            &res,
            503,
            "No cluster connection is configured for agent 99",
        );
    }
    // GitLab's watch API asks for a token first: refused the same way.
    let res = app
        .send(get(
            mal,
            99,
            "/k8s-proxy/watch?kas-websocket-token-request=true",
        ))
        .await;
    assert_status(
        &res,
        503,
        "No cluster connection is configured for agent 99",
    );
    assert_eq!(api.requests().len(), sent, "a request reached the cluster");

    // A deployment through the agent (its own project is always authorized): the environment's
    // group says why it shows nothing, and asks nothing of any cluster.
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/deployments",
            &json!({
                "deployment": {"id": 500, "iid": 1, "status": "success", "ref": "main", "sha": "0a1b2c", "tag": false,
                               "created_at": "2026-11-21T10:00:00Z"},
                "project": {"id": 66, "full_path": "acme/evil"},
                "environment": {"id": 600, "name": "production", "slug": "production", "tier": "production"},
                "job": {"id": 700, "name": "deploy", "protected_ref": true, "user_id": 9},
                "kubernetes": {"agent": "acme/evil:x", "namespace": "shop"}
            }),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let query = r#"{ project(fullPath: "acme/evil") { environment(name: "production") {
        resourceGroup { health healthMessage resources { name } errors { apiVersion kind code message } } } } }"#;
    let body = app.graphql(mal, query).await;
    assert!(body.get("errors").is_none(), "{body}");
    let group = &body["data"]["project"]["environment"]["resourceGroup"];
    let message = "No cluster connection is configured for agent 99";
    assert_eq!(
        group["errors"],
        json!([{"apiVersion": "", "kind": "", "code": 503, "message": message}])
    );
    assert_eq!(group["resources"], json!([]));
    assert_eq!(group["health"], "UNKNOWN");
    assert_eq!(api.requests().len(), sent, "a request reached the cluster");

    // The operators' agent, which has an entry, still reaches its cluster.
    let res = app
        .send(get((3, "ops"), 7, "/k8s-proxy/api/v1/namespaces/shop/pods"))
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

#[tokio::test]
async fn the_proxy_refuses_its_own_secrets_and_proxy_subresources_whatever_the_rbac() {
    let (api, served, _dir) = proxy::cluster().await;
    api.insert(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "envlens-envlens-secrets", "namespace": OWN},
        "data": {"session-secret": "c2Vzc2lvbi1rZXktb2YtZW52bGVucw=="}}));
    api.insert(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "apps"}, "data": {"password": "aHVudGVyMg=="}}));
    // The test cluster allows every request: only envlens stands in the way.
    let app = proxy::setup(&proxy::config(&served)).await;
    let (pdev, rep) = ((2, "pdev"), (5, "rep"));

    // Without `user_access` (a reporter), the answer is the same 401 as for any path.
    let res = app.send(get(rep, 9, OWN_SECRET)).await;
    assert_eq!(res.status, 401, "{}", res.text());
    assert_eq!(res.headers["gitlab-unauthorized"], "true");

    let sent = api.requests().len();
    for (path, message) in [
        (OWN_SECRET, "Secrets of namespace envlens"),
        (
            "/k8s-proxy/api/v1/namespaces/envlens/secrets",
            "Secrets of namespace envlens",
        ),
        (
            "/k8s-proxy/api/v1/namespaces/envlens/%73ecrets/envlens-envlens-secrets",
            "Secrets of namespace envlens",
        ),
        (
            "/k8s-proxy/api/v1/watch/namespaces/envlens/secrets",
            "Secrets of namespace envlens",
        ),
        ("/k8s-proxy/api/v1/secrets", "Secrets of all namespaces"),
        (
            "/k8s-proxy/api/v1/secrets?watch=true",
            "Secrets of all namespaces",
        ),
        (
            "/k8s-proxy/api/v1/nodes/node-1/proxy/configz",
            "proxy subresources",
        ),
        (
            "/k8s-proxy/api/v1/namespaces/apps/pods/web-1/proxy/metrics",
            "proxy subresources",
        ),
        (
            "/k8s-proxy/api/v1/namespaces/apps/services/web:80/proxy/",
            "proxy subresources",
        ),
        (
            "/k8s-proxy/api/v1/proxy/namespaces/apps/pods/web-1",
            "proxy subresources",
        ),
    ] {
        for agent in [7, 9] {
            let res = app.send(get(pdev, agent, path)).await;
            assert_eq!(res.status, 403, "{path}: {}", res.text());
            let status = res.json();
            assert_eq!(status["reason"], "Forbidden", "{path}");
            assert!(
                status["message"].as_str().unwrap().contains(message),
                "{path}: {status}"
            );
        }
    }
    assert_eq!(
        api.requests().len(),
        sent,
        "a refused request reached the cluster"
    );

    // Another namespace's Secrets are the cluster's to decide: passed on, and answered.
    let res = app
        .send(get(pdev, 9, "/k8s-proxy/api/v1/namespaces/apps/secrets/db"))
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["data"]["password"], "aHVudGVyMg==");
}
