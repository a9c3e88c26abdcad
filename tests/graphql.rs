//! GraphQL (SPEC 5.1): the blueprint's query, GitLab's frontend query, reading rules, the
//! group dashboard with pagination, batching, limits, and the committed schema.

use std::cell::Cell;
use std::sync::Once;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::auth::mint_session;
use serde_json::{json, Value};
use tracing_subscriber::layer::SubscriberExt;

use crate::support::*;

/// acme (1) > acme/apps (2); acme/agents (10, agent 7 `prod`, private);
/// acme/apps/web (11, private), acme/apps/api (12, internal), other/secret (13, private).
/// Users: 1 admin; 2 reporter of acme (group); 3 guest of acme/apps/web; 4 developer of project 11.
async fn setup() -> TestApp {
    let app = TestApp::new().await;
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"}, {"id": 3, "full_path": "other"}],
        "projects": [
            {"id": 10, "full_path": "acme/agents", "visibility": "private"},
            {"id": 11, "full_path": "acme/apps/web", "visibility": "private"},
            {"id": 12, "full_path": "acme/apps/api", "visibility": "internal"},
            {"id": 13, "full_path": "other/secret", "visibility": "private"}
        ],
        "users": [{"id": 1, "username": "root", "admin": true}, {"id": 2, "username": "rita"},
                  {"id": 3, "username": "gus"}, {"id": 4, "username": "dev"}],
        "members": [
            {"user_id": 2, "source_type": "group", "source_id": 1, "access_level": 20},
            {"user_id": 3, "source_type": "project", "source_id": 11, "access_level": 10},
            {"user_id": 4, "source_type": "project", "source_id": 11, "access_level": 30}
        ]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    app.internal(
        Method::PUT,
        "/api/v4/internal/kubernetes/agents/7",
        &json!({"project_id": 10, "name": "prod"}),
    )
    .await;
    app.internal(
        Method::POST,
        "/api/v4/internal/kubernetes/agent_configuration",
        &json!({"agent_id": 7, "agent_config": {"ci_access": {"groups": [{"id": "acme/apps"}]}}}),
    )
    .await;
    app
}

/// A deployment of `project` to `env`, through agent 7 into `namespace`, finished `status`.
async fn deploy(
    app: &TestApp,
    id: i64,
    project: (i64, &str),
    env: (i64, &str, &str),
    namespace: &str,
    status: &str,
) {
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": id, "iid": id, "status": "created", "ref": "main", "sha": format!("sha{id}"), "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": project.0, "full_path": project.1},
        "environment": {"id": env.0, "name": env.1, "slug": env.1, "tier": env.2},
        "job": {"id": id, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": namespace}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hook = json!({"object_kind": "deployment", "deployment_id": id, "status": status,
        "status_changed_at": format!("2026-11-21 10:{:02}:00 UTC", id % 60), "environment": env.1,
        "project": {"id": project.0, "path_with_namespace": project.1}});
    assert_eq!(
        app.hook("Deployment Hook", hook.to_string(), None)
            .await
            .status,
        200
    );
}

async fn query(app: &TestApp, user: (i64, &str), query: &str) -> TestResponse {
    let (token, _) = mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(600)).unwrap();
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "query": query }).to_string()))
        .unwrap();
    app.send(req).await
}

/// `data` of a successful query.
async fn data(app: &TestApp, user: (i64, &str), q: &str) -> Value {
    let res = query(app, user, q).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    assert!(body.get("errors").is_none(), "{body}");
    body["data"].clone()
}

const ROOT: (i64, &str) = (1, "root");
const RITA: (i64, &str) = (2, "rita");
const GUS: (i64, &str) = (3, "gus");
const DEV: (i64, &str) = (4, "dev");

#[tokio::test]
async fn the_blueprint_query() {
    let app = setup().await;
    deploy(
        &app,
        101,
        (11, "acme/apps/web"),
        (9, "production", "production"),
        "web-prod",
        "success",
    )
    .await;
    deploy(
        &app,
        102,
        (11, "acme/apps/web"),
        (9, "production", "production"),
        "web-next",
        "failed",
    )
    .await;
    let q = r#"{ project(fullPath: "acme/apps/web") { id environment(name: "production") { slug
        lastDeployment(status: SUCCESS) { id iid ref sha status finishedAt agent { id name project { fullPath } kubernetesNamespace webPath } } } } }"#;
    assert_eq!(
        data(&app, DEV, q).await,
        json!({"project": {"id": "gid://gitlab/Project/11", "environment": {"slug": "production",
        "lastDeployment": {"id": "gid://gitlab/Deployment/101", "iid": "101", "ref": "main", "sha": "sha101", "status": "SUCCESS",
            "finishedAt": "2026-11-21T10:41:00Z",
            "agent": {"id": "gid://gitlab/Clusters::Agent/7", "name": "prod", "project": {"fullPath": "acme/agents"},
                      "kubernetesNamespace": "web-prod", "webPath": "/acme/agents/-/cluster_agents/prod"}}}}})
    );
    // The failed one is the last FAILED deployment.
    let q = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") { lastDeployment(status: FAILED) { id agent { kubernetesNamespace } } } } }"#;
    assert_eq!(
        data(&app, DEV, q).await["project"]["environment"]["lastDeployment"],
        json!({"id": "gid://gitlab/Deployment/102", "agent": {"kubernetesNamespace": "web-next"}})
    );
}

#[tokio::test]
async fn gitlabs_frontend_query() {
    let app = setup().await;
    deploy(
        &app,
        101,
        (12, "acme/apps/api"),
        (21, "staging", "staging"),
        "api-staging",
        "success",
    )
    .await;
    let q = r#"{ project(fullPath: "ACME/apps/API") { environment(name: "staging") { id kubernetesNamespace clusterAgent { id name webPath } } } }"#;
    // A developer of a project that the agent's ci_access authorizes (acme/apps/web) reads it.
    assert_eq!(
        data(&app, DEV, q).await,
        json!({"project": {"environment": {"id": "gid://gitlab/Environment/21",
        "kubernetesNamespace": "api-staging", "clusterAgent": {"id": "gid://gitlab/Clusters::Agent/7", "name": "prod",
        "webPath": "/acme/agents/-/cluster_agents/prod"}}}})
    );
    // A reader of the internal project reads the environment, not its agent (SPEC 13).
    assert_eq!(
        data(&app, GUS, q).await["project"]["environment"]["clusterAgent"],
        Value::Null
    );
    // An environment without a successful deployment has no agent.
    deploy(
        &app,
        102,
        (12, "acme/apps/api"),
        (22, "review/x", "development"),
        "review",
        "running",
    )
    .await;
    let q = r#"{ project(fullPath: "acme/apps/api") { environment(name: "review/x") { kubernetesNamespace clusterAgent { id } } } }"#;
    assert_eq!(
        data(&app, GUS, q).await["project"]["environment"],
        json!({"kubernetesNamespace": null, "clusterAgent": null})
    );
}

#[tokio::test]
async fn reading_rules() {
    let app = setup().await;
    deploy(
        &app,
        101,
        (11, "acme/apps/web"),
        (9, "production", "production"),
        "web",
        "success",
    )
    .await;
    let q = r#"{ project(fullPath: "acme/apps/web") { fullPath environment(name: "production") { name } } }"#;
    let visible =
        json!({"project": {"fullPath": "acme/apps/web", "environment": {"name": "production"}}});
    // Admin; reporter through an ancestor group; developer of the project.
    for user in [ROOT, RITA, DEV] {
        assert_eq!(data(&app, user, q).await, visible, "{user:?}");
    }
    // A guest may not read a private project's environments: the project is null, no error.
    assert_eq!(data(&app, GUS, q).await, json!({"project": null}));
    // Unknown and unreadable look the same.
    assert_eq!(
        data(&app, GUS, r#"{ project(fullPath: "nope/nothing") { id } }"#).await,
        json!({"project": null})
    );
    // An internal project is readable by every signed-in user.
    assert_eq!(
        data(
            &app,
            GUS,
            r#"{ project(fullPath: "acme/apps/api") { id } }"#
        )
        .await["project"]["id"],
        "gid://gitlab/Project/12"
    );
    // The agent's private project shows its path through the agent, but not its environments.
    let q = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") { lastDeployment(status: SUCCESS) {
        agent { project { fullPath environment(name: "production") { id } environments { nodes { id } } clusterAgents { nodes { id } } } } } } } }"#;
    assert_eq!(
        data(&app, DEV, q).await["project"]["environment"]["lastDeployment"]["agent"]["project"],
        json!({"fullPath": "acme/agents", "environment": null, "environments": {"nodes": []}, "clusterAgents": {"nodes": []}})
    );
    // Groups: visible to members and to readers of a project in them, not to others.
    assert_eq!(
        data(&app, DEV, r#"{ group(fullPath: "acme") { fullPath } }"#).await,
        json!({"group": {"fullPath": "acme"}})
    );
    assert_eq!(
        data(&app, DEV, r#"{ group(fullPath: "other") { fullPath } }"#).await,
        json!({"group": null})
    );
    assert_eq!(
        data(&app, DEV, r#"{ currentUser { id username } }"#).await,
        json!({"currentUser": {"id": "gid://gitlab/User/4", "username": "dev"}})
    );
}

#[tokio::test]
async fn credentials_and_request_forms() {
    let app = setup().await;
    let post = |headers: Vec<(&str, String)>, content_type: &str| {
        let mut req = Request::post("/api/graphql").header(header::CONTENT_TYPE, content_type);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.body(Body::from(
            json!({"query": "{ currentUser { username } }"}).to_string(),
        ))
        .unwrap()
    };
    let res = app.send(post(vec![], "application/json")).await;
    assert_eq!(res.status, 401);
    assert_eq!(
        res.json()["errors"][0]["extensions"]["code"],
        "UNAUTHENTICATED"
    );
    assert!(res.json().get("data").is_none());
    let (token, csrf) = mint_session(SESSION_KEY, 4, "dev", Duration::from_secs(600)).unwrap();
    let cookie = ("cookie", format!("_gitlab_kas={token}"));
    // The cookie needs its CSRF token, and a JSON body.
    assert_eq!(
        app.send(post(vec![cookie.clone()], "application/json"))
            .await
            .status,
        401
    );
    let with_csrf = vec![cookie.clone(), ("x-csrf-token", csrf.clone())];
    let res = app.send(post(with_csrf.clone(), "application/json")).await;
    assert_eq!(
        res.json()["data"],
        json!({"currentUser": {"username": "dev"}})
    );
    assert_eq!(
        app.send(post(with_csrf.clone(), "text/plain")).await.status,
        415
    );
    let get = Request::get("/api/graphql?query=%7BcurrentUser%7Busername%7D%7D")
        .header("cookie", format!("_gitlab_kas={token}"))
        .header("x-csrf-token", csrf)
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(get).await.status, 405);
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{\"query\": "))
        .unwrap();
    assert_eq!(
        app.send(req).await.json()["errors"][0]["extensions"]["code"],
        "BAD_USER_INPUT"
    );
}

#[tokio::test]
async fn group_environments_across_subgroups_with_cursors() {
    let app = setup().await;
    // Production environments in two readable projects, one unreadable (other/), one staging.
    deploy(
        &app,
        101,
        (11, "acme/apps/web"),
        (31, "production", "production"),
        "web",
        "success",
    )
    .await;
    deploy(
        &app,
        102,
        (12, "acme/apps/api"),
        (32, "production", "production"),
        "api",
        "success",
    )
    .await;
    deploy(
        &app,
        103,
        (12, "acme/apps/api"),
        (33, "staging", "staging"),
        "api-s",
        "success",
    )
    .await;
    deploy(
        &app,
        104,
        (10, "acme/agents"),
        (34, "production", "production"),
        "agents",
        "success",
    )
    .await;
    let page = |after: &str| {
        format!(
            r#"{{ group(fullPath: "acme") {{ environments(tier: PRODUCTION, first: 2{after}) {{
        pageInfo {{ hasNextPage endCursor }} nodes {{ id project {{ fullPath }} kubernetesNamespace }} }} }} }}"#
        )
    };
    let first = data(&app, ROOT, &page("")).await["group"]["environments"].clone();
    assert_eq!(
        first["nodes"],
        json!([
        {"id": "gid://gitlab/Environment/31", "project": {"fullPath": "acme/apps/web"}, "kubernetesNamespace": "web"},
        {"id": "gid://gitlab/Environment/32", "project": {"fullPath": "acme/apps/api"}, "kubernetesNamespace": "api"}])
    );
    assert_eq!(first["pageInfo"]["hasNextPage"], true);
    let cursor = first["pageInfo"]["endCursor"].as_str().unwrap();
    let second = data(&app, ROOT, &page(&format!(", after: \"{cursor}\""))).await["group"]
        ["environments"]
        .clone();
    assert_eq!(second["nodes"][0]["id"], "gid://gitlab/Environment/34");
    assert_eq!(second["pageInfo"]["hasNextPage"], false);
    // Gus reads only the internal project here: the private ones are left out.
    let gus = data(&app, GUS, &page("")).await["group"]["environments"]["nodes"].clone();
    assert_eq!(
        gus.as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].clone())
            .collect::<Vec<_>>(),
        vec![json!("gid://gitlab/Environment/32")]
    );
    // Search, and a bad page size.
    let q = r#"{ group(fullPath: "acme") { environments(search: "STAG") { nodes { name } } } }"#;
    assert_eq!(
        data(&app, ROOT, q).await["group"]["environments"]["nodes"],
        json!([{"name": "staging"}])
    );
    let res = query(
        &app,
        ROOT,
        r#"{ group(fullPath: "acme") { environments(first: 1000) { nodes { id } } } }"#,
    )
    .await;
    assert_eq!(
        res.json()["errors"][0]["extensions"]["code"],
        "BAD_USER_INPUT"
    );
}

thread_local! {
    static STATEMENTS: Cell<usize> = const { Cell::new(0) };
}

/// The statements this thread has run so far (see [`count_statements`]).
pub(crate) fn statements() -> usize {
    STATEMENTS.with(Cell::get)
}

/// Counts the statements sqlx runs, per thread: each test runs on its own current-thread
/// runtime, the loaders' tasks included. Installed once, globally, because sqlx's log callsite
/// is registered before any test-scoped subscriber could be, and would stay disabled.
struct StatementCounter;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StatementCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            STATEMENTS.with(|n| n.set(n.get() + 1));
        }
    }
}

pub(crate) fn count_statements() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(StatementCounter);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the tests");
    });
}

/// The statements of each page of the group dashboard over `projects` projects of 4
/// production environments each, 100 environments a page (the largest page).
async fn statements_per_page(projects: i64) -> Vec<usize> {
    count_statements();
    let app = setup().await;
    let mut id = 1000;
    for p in 0..projects {
        let project = (100 + p, format!("acme/apps/p{p}"));
        for e in 0..4 {
            id += 1;
            deploy(
                &app,
                id,
                (project.0, &project.1),
                (id, &format!("env{e}"), "production"),
                "ns",
                "success",
            )
            .await;
        }
    }
    let mut pages = Vec::new();
    let mut after = String::new();
    let mut seen = 0;
    loop {
        let q = format!(
            r#"{{ group(fullPath: "acme") {{ environments(tier: PRODUCTION, first: 100{after}) {{
            pageInfo {{ hasNextPage endCursor }}
            nodes {{ name project {{ fullPath }} clusterAgent {{ name }} kubernetesNamespace
                     lastDeployment(status: SUCCESS) {{ id agent {{ name project {{ fullPath }} kubernetesNamespace webPath }} }} }} }} }} }}"#
        );
        let before = STATEMENTS.with(Cell::get);
        let page = data(&app, ROOT, &q).await["group"]["environments"].clone();
        pages.push(STATEMENTS.with(Cell::get) - before);
        let nodes = page["nodes"].as_array().unwrap();
        assert!(nodes
            .iter()
            .all(|n| n["lastDeployment"]["agent"]["kubernetesNamespace"] == "ns"));
        seen += nodes.len();
        if page["pageInfo"]["hasNextPage"] != true {
            break;
        }
        after = format!(
            ", after: \"{}\"",
            page["pageInfo"]["endCursor"].as_str().unwrap()
        );
    }
    assert_eq!(seen as i64, projects * 4);
    pages
}

#[tokio::test]
async fn the_group_query_runs_the_same_statements_for_5_or_50_projects() {
    let small = statements_per_page(5).await;
    let large = statements_per_page(50).await;
    assert_eq!(small.len(), 1);
    assert_eq!(large.len(), 2, "200 environments in pages of 100");
    assert!(small[0] > 0, "statements are counted");
    for page in large {
        assert_eq!(
            page, small[0],
            "statements grow with the number of projects: N+1"
        );
    }
}

/// The statements of one page of an environment's deployments with their agents.
async fn statements_for_deployments(deployments: i64) -> usize {
    count_statements();
    let app = setup().await;
    for id in 1..=deployments {
        deploy(
            &app,
            id,
            (11, "acme/apps/web"),
            (9, "production", "production"),
            "web",
            "success",
        )
        .await;
    }
    let q = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
        deployments(first: 100) { nodes { id agent { name kubernetesNamespace webPath project { fullPath } } } } } } }"#;
    let before = STATEMENTS.with(Cell::get);
    let nodes = data(&app, DEV, q).await["project"]["environment"]["deployments"]["nodes"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(nodes as i64, deployments);
    STATEMENTS.with(Cell::get) - before
}

#[tokio::test]
async fn a_page_of_deployments_runs_the_same_statements_for_3_or_60() {
    assert_eq!(
        statements_for_deployments(3).await,
        statements_for_deployments(60).await
    );
}

/// The blueprint query: the session's user with the project, the environment, and the last
/// deployment with its agent and the agent's project (benches/graphql.pgbench runs the same).
#[tokio::test]
async fn the_blueprint_query_runs_three_statements() {
    count_statements();
    let app = setup().await;
    deploy(
        &app,
        101,
        (11, "acme/apps/web"),
        (9, "production", "production"),
        "web-prod",
        "success",
    )
    .await;
    let q = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") { slug
        lastDeployment(status: SUCCESS) { agent { id name project { fullPath } kubernetesNamespace } } } } }"#;
    let before = STATEMENTS.with(Cell::get);
    let agent =
        data(&app, DEV, q).await["project"]["environment"]["lastDeployment"]["agent"].clone();
    assert_eq!(agent["project"]["fullPath"], "acme/agents");
    assert_eq!(STATEMENTS.with(Cell::get) - before, 3);
    // GitLab's frontend query, and every field that shows the last successful deployment at
    // once: the deployment is read once for all of them; whether the viewer may read its agent
    // (SPEC 13) is one more statement.
    let q = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") { id
        kubernetesNamespace clusterAgent { id name webPath }
        lastDeployment(status: SUCCESS) { id agent { kubernetesNamespace } } } } }"#;
    let before = STATEMENTS.with(Cell::get);
    let environment = data(&app, DEV, q).await["project"]["environment"].clone();
    assert_eq!(environment["kubernetesNamespace"], "web-prod");
    assert_eq!(environment["clusterAgent"]["name"], "prod");
    assert_eq!(
        environment["lastDeployment"]["agent"]["kubernetesNamespace"],
        "web-prod"
    );
    assert_eq!(STATEMENTS.with(Cell::get) - before, 4);
}

/// The session's user is read by the first statement that needs them, or after the query
/// when none did; a user the mirror does not know gets a 401 without data whatever the query.
#[tokio::test]
async fn a_user_the_mirror_does_not_know_is_refused_whatever_the_query() {
    let app = setup().await;
    let ghost = (99, "ghost");
    for q in [
        r#"{ project(fullPath: "acme/apps/api") { fullPath environment(name: "production") { slug } } }"#,
        r#"{ project(fullPath: "nowhere") { fullPath } }"#,
        r#"{ group(fullPath: "acme") { fullPath } }"#,
        "{ currentUser { username } }",
        "{ __typename }",
        "{ noSuchField }",
        "{ project(fullPath: ",
    ] {
        let res = query(&app, ghost, q).await;
        assert_eq!(res.status, 401, "{q}: {}", res.text());
        assert_eq!(
            res.json()["errors"][0]["extensions"]["code"],
            "UNAUTHENTICATED",
            "{q}"
        );
        assert!(res.json().get("data").is_none(), "{q}");
    }
    // Refused before execution too: 401 before 415.
    let (token, _) = mint_session(SESSION_KEY, ghost.0, ghost.1, Duration::from_secs(600)).unwrap();
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from("{ __typename }"))
        .unwrap();
    assert_eq!(app.send(req).await.status, 401);
    // Known users still get the project as they may read it, through the same first statement.
    assert_eq!(
        data(
            &app,
            GUS,
            r#"{ project(fullPath: "acme/apps/web") { fullPath } }"#
        )
        .await,
        json!({"project": null})
    );
    assert_eq!(
        data(&app, DEV, r#"{ a: project(fullPath: "acme/apps/web") { fullPath } b: project(fullPath: "other/secret") { fullPath } me: currentUser { username } }"#).await,
        json!({"a": {"fullPath": "acme/apps/web"}, "b": null, "me": {"username": "dev"}})
    );
    assert_eq!(
        data(&app, DEV, "{ __typename }").await,
        json!({"__typename": "Query"})
    );
}

/// The same query text with different variables: one parsed document serves both.
#[tokio::test]
async fn uploads_still_coming_hold_no_database_connection() {
    let app = setup().await;
    let (token, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    // More requests than the database has connections for GraphQL (8 in the tests), each
    // with a body that never ends.
    let uploads: Vec<_> = (0..12)
        .map(|_| {
            let req = Request::post("/api/graphql")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(futures_util::stream::pending::<
                    Result<axum::body::Bytes, std::io::Error>,
                >()))
                .unwrap();
            let router = app.router.clone();
            tokio::spawn(async move { tower::ServiceExt::oneshot(router, req).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        data(
            &app,
            DEV,
            r#"{ project(fullPath: "acme/apps/web") { fullPath } }"#,
        ),
    )
    .await
    .expect("answered while the uploads wait");
    assert_eq!(answer["project"]["fullPath"], "acme/apps/web");
    for upload in uploads {
        assert!(!upload.is_finished(), "the uploads are still waiting");
        upload.abort();
    }
}

#[tokio::test]
async fn one_query_text_with_different_variables() {
    let app = setup().await;
    let text = "query P($p: ID!) { project(fullPath: $p) { fullPath } }";
    let (token, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    for (path, expected) in [
        ("acme/apps/web", json!({"fullPath": "acme/apps/web"})),
        ("other/secret", Value::Null),
        ("acme/apps/api", json!({"fullPath": "acme/apps/api"})),
    ] {
        let req = Request::post("/api/graphql")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                json!({ "query": text, "variables": {"p": path} }).to_string(),
            ))
            .unwrap();
        let res = app.send(req).await;
        assert_eq!(res.json()["data"]["project"], expected, "{path}");
    }
}

/// A query that passed validation once is then checked in the fast mode (`graphql::documents`):
/// a later request of the same text must still meet the limits with its own values, and get
/// the strict rules' answer when a variable's kind differs.
#[tokio::test]
async fn a_validated_query_text_still_meets_its_limits_and_types() {
    let app = setup().await;
    let mut text = String::from("query Wide($p: ID!, $n: Int) {");
    for i in 0..60 {
        text.push_str(&format!(
            " p{i}: project(fullPath: $p) {{ environments(first: $n) {{ nodes {{ id name slug }} }} }}"
        ));
    }
    text.push_str(" }");
    let (token, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    let send = |variables: Value| {
        let req = Request::post("/api/graphql")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                json!({ "query": text, "variables": variables }).to_string(),
            ))
            .unwrap();
        app.send(req)
    };
    for _ in 0..2 {
        let res = send(json!({"p": "acme/apps/web", "n": 1})).await;
        assert!(res.json().get("errors").is_none(), "{}", res.text());
        assert_eq!(
            res.json()["data"]["p59"]["environments"]["nodes"],
            json!([])
        );
    }
    // 60 projects, each a page of 100 nodes of 4: the figure the variable makes.
    let res = send(json!({"p": "acme/apps/web", "n": 100})).await;
    assert_eq!(
        res.json()["errors"][0]["message"],
        "Query has complexity of 24060, which exceeds max complexity of 5000"
    );
    for (variables, argument) in [
        (json!({"p": true, "n": 1}), "fullPath"),
        (json!({"p": "acme/apps/web", "n": "one"}), "first"),
        (json!({"p": "acme/apps/web", "n": 1.5}), "first"),
    ] {
        let res = send(variables.clone()).await;
        let message = res.json()["errors"][0]["message"].clone();
        assert!(
            message.as_str().is_some_and(
                |m| m.starts_with(&format!("Invalid value for argument \"{argument}\""))
            ),
            "{variables}: {}",
            res.text()
        );
    }
}

#[tokio::test]
async fn depth_and_complexity_limits() {
    let app = setup().await;
    let mut deep = String::from("fullPath");
    for _ in 0..8 {
        deep = format!("environments(first: 1) {{ nodes {{ project {{ {deep} }} }} }}");
    }
    let res = query(
        &app,
        ROOT,
        &format!(r#"{{ project(fullPath: "acme/apps/web") {{ {deep} }} }}"#),
    )
    .await;
    assert_eq!(
        res.json()["errors"][0]["message"],
        "Query has depth of 26, which exceeds max depth of 12"
    );
    assert_eq!(
        res.json()["errors"][0]["extensions"]["code"],
        "GRAPHQL_VALIDATION_FAILED"
    );
    let mut wide = String::new();
    for i in 0..60 {
        wide.push_str(&format!(r#" p{i}: project(fullPath: "acme/apps/web") {{ environments(first: 100) {{ nodes {{ id name slug }} }} }}"#));
    }
    let res = query(&app, ROOT, &format!("{{{wide} }}")).await;
    assert_eq!(
        res.json()["errors"][0]["message"],
        "Query has complexity of 24060, which exceeds max complexity of 5000"
    );
    assert_eq!(
        res.json()["errors"][0]["extensions"]["code"],
        "GRAPHQL_VALIDATION_FAILED"
    );
}

#[test]
fn schema_graphql_is_generated_from_the_code() {
    let committed = include_str!("../schema.graphql");
    assert!(
        committed == envlens::graphql::sdl(),
        "schema.graphql differs from the code: run `cargo run -- print-schema > schema.graphql`"
    );
}

/// Every error has `extensions.code` (SPEC 3), async-graphql's own included, and strings no
/// lookup can take are refused before any statement runs.
#[tokio::test]
async fn every_error_has_a_code() {
    let app = setup().await;
    let (token, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    let post = |body: String| {
        let req = Request::post("/api/graphql")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        app.send(req)
    };
    let long = "a".repeat(5000);
    for (body, code) in [
        (json!({"query": "{ currentUser { "}), "GRAPHQL_PARSE_FAILED"),
        (json!({"query": "{ nope }"}), "GRAPHQL_VALIDATION_FAILED"),
        (
            json!({"query": "{ currentUser { username } }", "operationName": "Other"}),
            "OPERATION_RESOLUTION_FAILURE",
        ),
        (
            json!({"query": "query A { currentUser { id } } query B { currentUser { id } }"}),
            "OPERATION_RESOLUTION_FAILURE",
        ),
        (
            json!({"query": "query A { currentUser { id } } query B { currentUser { id } }", "operationName": "C"}),
            "OPERATION_RESOLUTION_FAILURE",
        ),
        (
            json!({"query": "{ project(fullPath: \"a\\u0000b\") { id } }"}),
            "BAD_USER_INPUT",
        ),
        (
            json!({"query": "query P($p: ID!) { project(fullPath: $p) { id } }", "variables": {"p": "a\u{0}b"}}),
            "BAD_USER_INPUT",
        ),
        (
            json!({"query": "query P($p: ID!) { project(fullPath: $p) { id } }", "variables": {"p": long}}),
            "BAD_USER_INPUT",
        ),
        (
            json!({"query": format!("{{ project(fullPath: \"{long}\") {{ id }} }}")}),
            "BAD_USER_INPUT",
        ),
        (
            json!({"query": "{ project(fullPath: \"acme/apps/web\") { environments(search: \"\\u0000\") { count } } }"}),
            "BAD_USER_INPUT",
        ),
    ] {
        let res = post(body.to_string()).await;
        assert_eq!(res.status, 200, "{body}: {}", res.text());
        assert_eq!(
            res.json()["errors"][0]["extensions"]["code"],
            code,
            "{body}: {}",
            res.text()
        );
    }
    // A body that is no GraphQL request: 400, never an empty query.
    for body in [
        "{}",
        r#"{"variables": {}}"#,
        r#"{"query": null}"#,
        "[]",
        r#"{"query": "{ currentUser { id } }"} x"#,
    ] {
        let res = post(body.to_owned()).await;
        assert_eq!(res.status, 400, "{body}: {}", res.text());
        assert_eq!(
            res.json()["errors"][0]["extensions"]["code"],
            "BAD_USER_INPUT"
        );
    }
}

/// A document is bounded before it is parsed (its size, its names) and after (every selection,
/// `__typename`, aliases and fragment spreads included), each refusal a `BAD_USER_INPUT`.
#[tokio::test]
async fn costly_documents_are_refused() {
    let app = setup().await;
    let typenames = |n: usize| -> String {
        let aliases: String = (0..n).map(|i| format!("t{i}: __typename ")).collect();
        format!("{{ {aliases} }}")
    };
    let spreads = format!(
        "{{ {} }} fragment F on Query {{ {} }}",
        "...F ".repeat(100),
        "__typename ".repeat(100)
    );
    for (text, message) in [
        (typenames(55_000), "the query is longer than 65536 bytes"),
        (
            "{ currentUser { id } }".repeat(10_000),
            "the query is longer than 65536 bytes",
        ),
        (
            format!("{{ {} }}", "a ".repeat(6_000)),
            "the query has more than 5000 names",
        ),
        (
            spreads,
            "the query selects more than 5000 fields, fragments expanded",
        ),
        (
            format!(
                "{{ {} }} fragment G on Query {{ {} }}",
                "...G ".repeat(51),
                "__typename ".repeat(100)
            ),
            "the query selects more than 5000 fields, fragments expanded",
        ),
    ] {
        let res = query(&app, DEV, &text).await;
        assert_eq!(res.status, 200, "{}", res.text());
        let error = &res.json()["errors"][0];
        assert_eq!(error["message"], message);
        assert_eq!(error["extensions"]["code"], "BAD_USER_INPUT");
    }
    let res = query(&app, DEV, &typenames(100)).await;
    assert_eq!(res.json()["data"]["t99"], "Query");
}
