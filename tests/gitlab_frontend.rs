//! GitLab's own frontend against envlens (SPEC 5.1): its five environment and agent queries,
//! loaded unchanged from `tests/fixtures/frontend_queries/` (or from `ENVLENS_GITLAB_QUERIES`,
//! a directory of GitLab's own files), run with the variables GitLab's frontend passes; the
//! fields they need (tokens, the authorized agents, the Flux resource path) and their batching.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::auth::mint_session;
use serde_json::{json, Value};

use crate::support::*;

const FLUX: &str = "helm.toolkit.fluxcd.io/v2/namespaces/flux-system/helmreleases/web";

/// acme (1) > acme/apps (2); acme/agents (10, private: agents 7 `prod` and 8 `ops`),
/// acme/apps/web (11, private). Users: 1 root (admin); 2 dev, developer of acme; 3 rita,
/// reporter of acme/apps/web; 4 gus, no membership.
///
/// Agent 7: `ci_access` for acme/apps (default namespace `apps`) and for acme/apps/web itself,
/// `user_access` (as the agent) for acme/apps/web. Agent 8: `ci_access` for acme/apps/web in
/// production only, `user_access` (as the user) for the group acme. Agent 7's tokens: 1
/// (active, used), 2 (revoked), 3 (active, never used).
async fn setup() -> TestApp {
    let app = TestApp::new().await;
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"}],
        "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"},
                     {"id": 11, "full_path": "acme/apps/web", "visibility": "private"}],
        "users": [{"id": 1, "username": "root", "admin": true}, {"id": 2, "username": "dev"},
                  {"id": 3, "username": "rita"}, {"id": 4, "username": "gus"}],
        "members": [{"user_id": 2, "source_type": "group", "source_id": 1, "access_level": 30},
                    {"user_id": 3, "source_type": "project", "source_id": 11, "access_level": 20}]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    for (id, name) in [(7, "prod"), (8, "ops")] {
        let path = format!("/api/v4/internal/kubernetes/agents/{id}");
        let res = app
            .internal(Method::PUT, &path, &json!({"project_id": 10, "name": name}))
            .await;
        assert_eq!(res.status, 201, "{}", res.text());
    }
    for (agent, config) in [
        (
            7,
            json!({"ci_access": {"groups": [{"id": "acme/apps", "default_namespace": "apps"}],
                                 "projects": [{"id": "acme/apps/web", "default_namespace": "web"}]},
                   "user_access": {"access_as": {"agent": {}}, "projects": [{"id": "acme/apps/web"}]}}),
        ),
        (
            8,
            json!({"ci_access": {"projects": [{"id": "acme/apps/web", "environments": ["production"]}]},
                   "user_access": {"access_as": {"user": {}}, "groups": [{"id": "acme"}]}}),
        ),
    ] {
        let res = app
            .internal(
                Method::POST,
                "/api/v4/internal/kubernetes/agent_configuration",
                &json!({"agent_id": agent, "agent_config": config}),
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let token = |id: i64, status: &str, used: Option<&str>| {
        json!({"id": id, "name": format!("token-{id}"), "description": null, "agent_id": 7, "status": status,
               "created_at": "2026-11-01T09:00:00.000Z", "created_by_user_id": 1, "last_used_at": used})
    };
    let tokens = json!([
        token(1, "active", Some("2026-11-21T10:05:00.000Z")),
        token(2, "revoked", Some("2026-11-21T10:06:00.000Z")),
        token(3, "active", None)
    ]);
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/7/tokens",
            &tokens,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    app
}

/// A successful deployment of `project`'s `env` through agent 7, with GitLab 18's keys.
async fn deploy(app: &TestApp, id: i64, project: (i64, &str), env: (i64, &str)) {
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": id, "iid": id, "status": "created", "ref": "main", "sha": "0a1b2c", "tag": false},
        "project": {"id": project.0, "full_path": project.1},
        "environment": {"id": env.0, "name": env.1, "slug": env.1, "tier": "production"},
        "job": {"id": id, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "dashboard": {"namespace": "web", "flux_resource_path": FLUX}}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hook = json!({"object_kind": "deployment", "deployment_id": id, "status": "success",
        "status_changed_at": "2026-11-21 10:00:00 UTC", "environment": env.1,
        "project": {"id": project.0, "path_with_namespace": project.1}});
    let res = app.hook("Deployment Hook", hook.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

const ROOT: (i64, &str) = (1, "root");
const DEV: (i64, &str) = (2, "dev");
const RITA: (i64, &str) = (3, "rita");
const GUS: (i64, &str) = (4, "gus");

async fn run(app: &TestApp, user: (i64, &str), query: &str, variables: &Value) -> Value {
    let (token, _) = mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(600)).unwrap();
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            json!({"query": query, "variables": variables}).to_string(),
        ))
        .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    assert!(
        body.get("errors").is_none(),
        "{user:?}: the query must validate and answer without errors: {body}"
    );
    body["data"].clone()
}

/// The query file `name`, unchanged.
fn query_file(name: &str) -> String {
    let dir = std::env::var_os("ENVLENS_GITLAB_QUERIES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frontend_queries")
        });
    let path = dir.join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn agent_7(with_project: bool, tokens: Value) -> Value {
    let mut agent = json!({"id": "gid://gitlab/Clusters::Agent/7", "name": "prod",
                           "webPath": "/acme/agents/-/cluster_agents/prod", "tokens": {"nodes": tokens}});
    if with_project {
        agent["project"] = json!({"id": "gid://gitlab/Project/10", "fullPath": "acme/agents"});
    }
    agent
}

/// Agent 7's active tokens, as a developer of its project sees them.
fn active_tokens() -> Value {
    json!([{"id": "gid://gitlab/Clusters::AgentToken/1", "lastUsedAt": "2026-11-21T10:05:00Z"},
           {"id": "gid://gitlab/Clusters::AgentToken/3", "lastUsedAt": null}])
}

#[tokio::test]
async fn gitlabs_five_queries_answer_a_reader_and_hide_the_project_from_others() {
    let app = setup().await;
    deploy(&app, 101, (11, "acme/apps/web"), (9, "production")).await;
    let environment_variables =
        json!({"projectFullPath": "acme/apps/web", "environmentName": "production"});

    // getEnvironmentClusterAgent, as the environment page sends it.
    let q = query_file("environment_cluster_agent.query.graphql");
    let expected = |tokens: Value| {
        json!({"project": {"id": "gid://gitlab/Project/11", "environment": {
            "id": "gid://gitlab/Environment/9", "deploymentsDisplayCount": "1",
            "fluxResourcePath": FLUX, "kubernetesNamespace": "web", "clusterAgent": agent_7(true, tokens)}}})
    };
    for user in [ROOT, DEV] {
        assert_eq!(
            run(&app, user, &q, &environment_variables).await,
            expected(active_tokens()),
            "{user:?}"
        );
    }
    // A reporter of the project reads the environment, not its agent (GitLab's
    // `read_cluster_agent` needs Developer).
    let mut hidden = expected(json!([]));
    hidden["project"]["environment"]["clusterAgent"] = Value::Null;
    assert_eq!(run(&app, RITA, &q, &environment_variables).await, hidden);
    assert_eq!(
        run(&app, GUS, &q, &environment_variables).await,
        json!({"project": null})
    );

    // The two older shapes of the same query.
    for (file, flux) in [
        (
            "environment_cluster_agent_with_namespace.query.graphql",
            false,
        ),
        (
            "environment_cluster_agent_with_flux_resource.query.graphql",
            true,
        ),
    ] {
        let q = query_file(file);
        let mut environment = json!({"id": "gid://gitlab/Environment/9", "kubernetesNamespace": "web",
                                     "clusterAgent": agent_7(false, active_tokens())});
        if flux {
            environment["fluxResourcePath"] = json!(FLUX);
        }
        assert_eq!(
            run(&app, DEV, &q, &environment_variables).await,
            json!({"project": {"id": "gid://gitlab/Project/11", "environment": environment}}),
            "{file}"
        );
        assert_eq!(
            run(&app, GUS, &q, &environment_variables).await,
            json!({"project": null}),
            "{file}"
        );
    }

    // getK8sClusterAgentQuery: the agent in its configuration project.
    let q = query_file("k8s_cluster_agent.query.graphql");
    let variables = json!({"projectPath": "acme/agents", "agentName": "prod"});
    assert_eq!(
        run(&app, DEV, &q, &variables).await,
        json!({"project": {"id": "gid://gitlab/Project/10", "clusterAgent": {
            "id": "gid://gitlab/Clusters::Agent/7", "webPath": "/acme/agents/-/cluster_agents/prod",
            "tokens": {"nodes": active_tokens()}}}})
    );
    for user in [RITA, GUS] {
        assert_eq!(
            run(&app, user, &q, &variables).await,
            json!({"project": null}),
            "{user:?}"
        );
    }

    // getUserAuthorizedAgents, as the environment form sends it.
    let q = query_file("user_authorized_agents.query.graphql");
    let variables = json!({"projectFullPath": "acme/apps/web"});
    let agents = |ids: &[(i64, &str)]| {
        let nodes: Vec<Value> = ids
            .iter()
            .map(|(id, name)| json!({"agent": {"id": format!("gid://gitlab/Clusters::Agent/{id}"), "name": name}}))
            .collect();
        json!({"project": {"id": "gid://gitlab/Project/11", "userAccessAuthorizedAgents": {"nodes": nodes}}})
    };
    // A developer through the group: agent 7 (the project's entry), agent 8 (acme's).
    assert_eq!(
        run(&app, DEV, &q, &variables).await,
        agents(&[(7, "prod"), (8, "ops")])
    );
    assert_eq!(
        run(&app, ROOT, &q, &variables).await,
        agents(&[(7, "prod"), (8, "ops")])
    );
    // A reporter reads the project, and no agent admits them.
    assert_eq!(run(&app, RITA, &q, &variables).await, agents(&[]));
    assert_eq!(
        run(&app, GUS, &q, &variables).await,
        json!({"project": null})
    );
}

#[tokio::test]
async fn authorized_agents_with_the_entry_that_authorizes() {
    let app = setup().await;
    let q = r#"query($p: ID!) { project(fullPath: $p) {
        ciAccessAuthorizedAgents { nodes { agent { id project { fullPath } } config } }
        userAccessAuthorizedAgents { nodes { agent { name } config } } } }"#;
    // acme/apps/web: agent 7's own project entry wins over acme/apps' (4.3's order); agent 8's
    // entry with its environments (listed: the job's environment is checked at deployment).
    let data = run(&app, DEV, q, &json!({"p": "acme/apps/web"})).await;
    assert_eq!(
        data["project"]["ciAccessAuthorizedAgents"]["nodes"],
        json!([
            {"agent": {"id": "gid://gitlab/Clusters::Agent/7", "project": {"fullPath": "acme/agents"}},
             "config": {"default_namespace": "web", "protected_branches_only": false}},
            {"agent": {"id": "gid://gitlab/Clusters::Agent/8", "project": {"fullPath": "acme/agents"}},
             "config": {"environments": ["production"], "protected_branches_only": false}},
        ])
    );
    assert_eq!(
        data["project"]["userAccessAuthorizedAgents"]["nodes"],
        json!([
            {"agent": {"name": "prod"}, "config": {"access_as": {"agent": {}}}},
            {"agent": {"name": "ops"}, "config": {"access_as": {"user": {}}}},
        ])
    );
    // The agents' own configuration project: always authorized, with no entry. user_access
    // lists acme for agent 8, and acme/agents lies in it.
    let data = run(&app, DEV, q, &json!({"p": "acme/agents"})).await;
    assert_eq!(
        data["project"]["ciAccessAuthorizedAgents"]["nodes"],
        json!([
            {"agent": {"id": "gid://gitlab/Clusters::Agent/7", "project": {"fullPath": "acme/agents"}}, "config": {}},
            {"agent": {"id": "gid://gitlab/Clusters::Agent/8", "project": {"fullPath": "acme/agents"}}, "config": {}},
        ])
    );
    assert_eq!(
        data["project"]["userAccessAuthorizedAgents"]["nodes"],
        json!([{"agent": {"name": "ops"}, "config": {"access_as": {"user": {}}}}])
    );
    // A project the user may not read is null, whatever asks for it.
    assert_eq!(
        run(&app, GUS, q, &json!({"p": "acme/apps/web"})).await,
        json!({"project": null})
    );
}

/// SPEC 13: an agent, its configuration and its tokens need GitLab's `read_cluster_agent`.
/// Added to `setup`: 5 rex, reporter of acme/agents and acme/apps/web; 6 ivy, no membership,
/// with acme/agents internal; 7 dana, developer of acme/apps/web only (which both agents'
/// `ci_access` authorize, and which agent 7 deploys).
#[tokio::test]
async fn agents_need_developer_where_they_serve() {
    let app = setup().await;
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "internal"}],
        "users": [{"id": 5, "username": "rex"}, {"id": 6, "username": "ivy"}, {"id": 7, "username": "dana"}],
        "members": [{"user_id": 5, "source_type": "project", "source_id": 10, "access_level": 20},
                    {"user_id": 5, "source_type": "project", "source_id": 11, "access_level": 20},
                    {"user_id": 7, "source_type": "project", "source_id": 11, "access_level": 30}]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    deploy(&app, 101, (11, "acme/apps/web"), (9, "production")).await;
    let (rex, ivy, dana) = ((5, "rex"), (6, "ivy"), (7, "dana"));
    let q = r#"query($p: ID!) { project(fullPath: $p) { fullPath
        clusterAgents { nodes { name } } clusterAgent(name: "prod") { name tokens { nodes { id } } }
        ciAccessAuthorizedAgents { nodes { agent { name } config } } } }"#;
    let nothing = |path: &str| {
        json!({"project": {"fullPath": path, "clusterAgents": {"nodes": []}, "clusterAgent": null,
                           "ciAccessAuthorizedAgents": {"nodes": []}}})
    };
    // The reporter, and a reader of the internal project, see no agent.
    for user in [rex, ivy] {
        assert_eq!(
            run(&app, user, q, &json!({"p": "acme/agents"})).await,
            nothing("acme/agents"),
            "{user:?}"
        );
    }
    assert_eq!(
        run(&app, rex, q, &json!({"p": "acme/apps/web"})).await,
        nothing("acme/apps/web")
    );
    // A developer of the agents' project sees them, their configuration and their tokens.
    let data = run(&app, DEV, q, &json!({"p": "acme/agents"})).await;
    assert_eq!(
        data["project"]["clusterAgents"]["nodes"],
        json!([{"name": "prod"}, {"name": "ops"}])
    );
    assert_eq!(
        data["project"]["clusterAgent"]["tokens"]["nodes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        data["project"]["ciAccessAuthorizedAgents"]["nodes"],
        json!([{"agent": {"name": "prod"}, "config": {}}, {"agent": {"name": "ops"}, "config": {}}])
    );
    // A developer of a project that the agents' ci_access authorizes sees them there.
    let data = run(&app, dana, q, &json!({"p": "acme/apps/web"})).await;
    assert_eq!(
        data["project"]["ciAccessAuthorizedAgents"]["nodes"],
        json!([
            {"agent": {"name": "prod"}, "config": {"default_namespace": "web", "protected_branches_only": false}},
            {"agent": {"name": "ops"}, "config": {"environments": ["production"], "protected_branches_only": false}},
        ])
    );
    // ... and, on GitLab's environment page, the agent that deployed it with its tokens'
    // `lastUsedAt`, from which GitLab tells whether it is connected.
    let q = query_file("environment_cluster_agent.query.graphql");
    let variables = json!({"projectFullPath": "acme/apps/web", "environmentName": "production"});
    let environment = run(&app, dana, &q, &variables).await["project"]["environment"].clone();
    assert_eq!(environment["clusterAgent"], agent_7(true, active_tokens()));
    let environment = run(&app, rex, &q, &variables).await["project"]["environment"].clone();
    assert_eq!(environment["clusterAgent"], Value::Null);
}

#[tokio::test]
async fn tokens_page_by_id_and_count_like_gitlab() {
    let app = setup().await;
    let q = r#"query($after: String) { project(fullPath: "acme/agents") { clusterAgent(name: "prod") {
        tokens(first: 1, after: $after) { pageInfo { hasNextPage endCursor }
                                          nodes { id name description createdAt lastUsedAt status } } } } }"#;
    let page = run(&app, DEV, q, &json!({})).await["project"]["clusterAgent"]["tokens"].clone();
    assert_eq!(
        page,
        json!({"pageInfo": {"hasNextPage": true, "endCursor": "1"},
               "nodes": [{"id": "gid://gitlab/Clusters::AgentToken/1", "name": "token-1", "description": null,
                          "createdAt": "2026-11-01T09:00:00Z", "lastUsedAt": "2026-11-21T10:05:00Z", "status": "ACTIVE"}]})
    );
    // The revoked token 2 is not listed, as GitLab lists only active tokens.
    let page = run(&app, DEV, q, &json!({"after": "1"})).await["project"]["clusterAgent"]["tokens"]
        .clone();
    assert_eq!(page["pageInfo"]["hasNextPage"], false);
    assert_eq!(
        page["nodes"][0]["id"],
        "gid://gitlab/Clusters::AgentToken/3"
    );
    // An environment with more than 999 deployments shows `999+`, as GitLab does.
    deploy(&app, 1, (11, "acme/apps/web"), (9, "production")).await;
    sqlx::query(
        "INSERT INTO deployments (id, project_id, environment_id, status)
         SELECT 1000 + g, 11, 9, 'success' FROM generate_series(1, 999) g",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let q = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") { deploymentsDisplayCount } } }"#;
    assert_eq!(
        run(&app, DEV, q, &json!({})).await["project"]["environment"]["deploymentsDisplayCount"],
        "999+"
    );
    // Without a name, GitLab's optional argument, there is no environment to show.
    let q = r#"{ project(fullPath: "acme/apps/web") { environment { id } } }"#;
    assert_eq!(
        run(&app, DEV, q, &json!({})).await["project"]["environment"],
        Value::Null
    );
}

/// The statements of a page of the group dashboard over `projects` projects, each node asking
/// every field of this issue.
async fn statements_for(projects: i64) -> usize {
    crate::graphql::count_statements();
    let app = setup().await;
    for p in 0..projects {
        let path = format!("acme/apps/p{p}");
        deploy(&app, 100 + p, (100 + p, &path), (100 + p, "production")).await;
    }
    let q = r#"{ group(fullPath: "acme") { environments(first: 40) { nodes {
        fluxResourcePath deploymentsDisplayCount clusterAgent { name tokens(first: 5) { nodes { id lastUsedAt } } }
        project { userAccessAuthorizedAgents { nodes { agent { name } } }
                  ciAccessAuthorizedAgents { nodes { agent { name project { fullPath } } config } } } } } } }"#;
    let before = crate::graphql::statements();
    let data = run(&app, ROOT, q, &json!({})).await;
    let nodes = data["group"]["environments"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len() as i64, projects);
    assert!(nodes.iter().all(|n| n["fluxResourcePath"] == FLUX
        && n["clusterAgent"]["tokens"]["nodes"]
            .as_array()
            .unwrap()
            .len()
            == 2));
    crate::graphql::statements() - before
}

#[tokio::test]
async fn the_new_fields_run_the_same_statements_for_3_or_30_projects() {
    let small = statements_for(3).await;
    assert!(small > 0, "statements are counted");
    assert_eq!(small, statements_for(30).await, "N+1");
}
