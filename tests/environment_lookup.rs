//! SPEC 12.2 with no change to the pipeline: a success Deployment Hook for a deployment that no
//! job described is looked up in GitLab's REST API (the in-process GitLab): the environment's
//! `cluster_agent` and `kubernetes_namespace` are recorded when its `last_deployment` is this
//! deployment; otherwise the reason is kept and nothing written. GitLab down: the hook is
//! acknowledged, the lookup kept and done later.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request};
use envlens::config::Limits;
use envlens::gitlab::api::{GitLab, Policy, Token};
use envlens::gitlab::Instance;
use envlens::ingest::followups::Worker;
use envlens::state::AppState;
use serde_json::{json, Value};

use crate::support::gitlab::TestGitLab;
use crate::support::gitlab_rest::{self as rest, API_TOKEN};
use crate::support::{keys, postgres, TestApp};

/// A client of the test GitLab with its API token (an administrator's); retries kept short for
/// the tests.
pub fn api(gitlab: &TestGitLab) -> GitLab {
    api_with_token(gitlab, API_TOKEN)
}

/// A client of the test GitLab with `token` (`API_TOKEN` or `REGULAR_API_TOKEN`).
pub fn api_with_token(gitlab: &TestGitLab, token: &str) -> GitLab {
    let policy = Policy {
        attempts: 3,
        backoff: std::time::Duration::from_millis(10),
        ..Policy::default()
    };
    GitLab::new(&gitlab.url, Some(Token::new(token)), Arc::default(), policy).unwrap()
}

/// envlens beside the test GitLab, with its API token.
pub async fn app_with_api(gitlab: &TestGitLab) -> TestApp {
    app_with_token(gitlab, API_TOKEN).await
}

/// envlens beside the test GitLab, with `token` as its own.
pub async fn app_with_token(gitlab: &TestGitLab, token: &str) -> TestApp {
    let database = postgres::fresh_database().await;
    let api = api_with_token(gitlab, token);
    let instance = Instance::new(
        api,
        "https://envlens.example.com",
        std::time::Duration::from_secs(60),
        None,
    );
    let state = AppState::new((*database).clone(), keys(), Limits::default()).with_gitlab(instance);
    TestApp::owning(state, database)
}

/// The mirror knows acme, acme/apps, acme/agents (10) and acme/apps/web (42), not the agent:
/// GitLab has agent 7 `prod` in acme/agents, whose configuration lets acme/apps deploy, and
/// environment 100 `production` of project 42 whose last deployment is `last`, through agent 7
/// into `shop`.
async fn setup(last: i64) -> (TestGitLab, TestApp) {
    let gitlab = TestGitLab::start().await;
    let app = app_with_api(&gitlab).await;
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/identity",
            &json!({
                "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"}],
                "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"},
                             {"id": 42, "full_path": "acme/apps/web", "visibility": "private"}],
                "users": [], "members": []
            }),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    gitlab.rest.with(|d| {
        d.projects
            .push(rest::project(10, "acme/agents", Some("main")));
        d.projects
            .push(rest::project(42, "acme/apps/web", Some("main")));
        d.agents
            .insert(10, vec![rest::agent(7, "prod", (10, "acme/agents"))]);
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "ci_access:\n  groups:\n    - id: acme/apps\n      default_namespace: apps\n".into(),
        );
        d.environments.insert(
            42,
            vec![rest::environment(
                100,
                "production",
                Some(last),
                Some(rest::agent(7, "prod", (10, "acme/agents"))),
                Some("shop"),
            )],
        );
        d.branches.insert((42, "main".into()), true);
    });
    (gitlab, app)
}

/// GitLab's Deployment Hook (its documented shape) for deployment `id` of `main`, no job's call
/// before.
async fn success_hook(app: &TestApp, id: i64) -> Value {
    success_hook_of(app, id, "main").await
}

async fn success_hook_of(app: &TestApp, id: i64, git_ref: &str) -> Value {
    let body = json!({
        "object_kind": "deployment", "status": "success", "status_changed_at": "2026-11-24 10:00:00 +0100",
        "deployment_id": id, "deployable_id": 302, "deployable_url": "https://gitlab.example.com/acme/apps/web/-/jobs/302",
        "environment": "production", "environment_tier": "production", "environment_slug": "production",
        "environment_external_url": null,
        "project": {"id": 42, "name": "web", "path_with_namespace": "acme/apps/web", "visibility_level": 0,
                    "default_branch": "main"},
        "short_sha": "714a629c", "user": {"id": 2, "username": "dev"}, "user_url": "https://gitlab.example.com/dev",
        "commit_url": "https://gitlab.example.com/c", "commit_title": "Deploy", "ref": git_ref
    });
    let res = app.hook("Deployment Hook", body.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

async fn agent_row(app: &TestApp, deployment: i64) -> Option<(i64, String)> {
    sqlx::query_as(
        "SELECT agent_id, kubernetes_namespace FROM agent_deployments WHERE deployment_id = $1",
    )
    .bind(deployment)
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

async fn followup(app: &TestApp, deployment: i64) -> (i32, Option<String>, Option<String>) {
    sqlx::query_as(
        "SELECT attempts, outcome, last_error FROM gitlab_followups WHERE deployment_id = $1",
    )
    .bind(deployment)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

async fn metrics(app: &TestApp) -> String {
    app.send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .text()
}

#[tokio::test]
async fn the_environments_agent_is_recorded_when_this_is_its_last_deployment() {
    let (gitlab, app) = setup(9101).await;
    success_hook(&app, 9101).await;
    assert_eq!(agent_row(&app, 9101).await, Some((7, "shop".to_owned())));
    let (attempts, outcome, _) = followup(&app, 9101).await;
    assert_eq!(attempts, 1);
    assert!(outcome.unwrap().contains("acme/agents:prod"));
    // The agent came from GitLab with its configuration; the environment is mirrored.
    let env: (i64, String) =
        sqlx::query_as("SELECT d.environment_id, e.name FROM deployments d JOIN environments e ON e.id = d.environment_id WHERE d.id = 9101")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(env, (100, "production".to_owned()));
    let calls = gitlab.rest.calls();
    for expected in [
        "/api/v4/projects/42/environments?name=production",
        "/api/v4/projects/42/environments/100",
        "/api/v4/projects/10/cluster_agents",
        "/api/v4/projects/10/repository/files/.gitlab%2Fagents%2Fprod%2Fconfig.yaml/raw?ref=main",
    ] {
        assert!(
            calls.iter().any(|c| c.starts_with(expected)),
            "{expected} not in {calls:?}"
        );
    }
    assert!(metrics(&app).await.contains(
        r#"envlens_gitlab_followups_total{kind="environment_lookup",outcome="recorded"} 1"#
    ));
    // A redelivered hook looks nothing up again and writes nothing.
    let asked = gitlab.rest.calls().len();
    let before = app.fingerprint().await;
    success_hook(&app, 9101).await;
    assert_eq!(gitlab.rest.calls().len(), asked);
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn another_deployments_agent_is_not_taken() {
    let (_gitlab, app) = setup(9200).await;
    success_hook(&app, 9101).await;
    assert_eq!(agent_row(&app, 9101).await, None);
    let (_, outcome, _) = followup(&app, 9101).await;
    assert!(outcome
        .unwrap()
        .contains("last deployment is 9200, not 9101"));
    assert!(metrics(&app).await.contains(
        r#"envlens_gitlab_followups_total{kind="environment_lookup",outcome="not_last_deployment"} 1"#
    ));
}

#[tokio::test]
async fn gitlab_down_loses_nothing_the_lookup_is_done_later() {
    let (gitlab, app) = setup(9101).await;
    gitlab.rest.down.store(true, Ordering::SeqCst);
    // Acknowledged at once: the status is kept, the lookup waits.
    let answer = success_hook(&app, 9101).await;
    assert_eq!(answer["outcome"], "applied");
    assert_eq!(agent_row(&app, 9101).await, None);
    let (attempts, outcome, error) = followup(&app, 9101).await;
    assert_eq!((attempts, outcome), (1, None));
    assert!(error.unwrap().contains("500"));
    // Not yet due: the worker leaves it.
    let worker = Worker::new(app.db.clone(), api(&gitlab), Arc::default());
    assert_eq!(worker.run_due(16).await.unwrap(), 0);
    // GitLab is back and the retry is due.
    gitlab.rest.down.store(false, Ordering::SeqCst);
    sqlx::query("UPDATE gitlab_followups SET due_at = now()")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(worker.run_due(16).await.unwrap(), 1);
    assert_eq!(agent_row(&app, 9101).await, Some((7, "shop".to_owned())));
    assert_eq!(followup(&app, 9101).await.0, 2);
}

#[tokio::test]
async fn a_protected_branches_only_entry_asks_gitlab_whether_the_ref_is_protected() {
    let (gitlab, app) = setup(9101).await;
    gitlab.rest.with(|d| {
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "ci_access:\n  groups:\n    - id: acme/apps\n      protected_branches_only: true\n"
                .into(),
        );
        d.branches.insert((42, "main".into()), false);
    });
    success_hook(&app, 9101).await;
    assert_eq!(agent_row(&app, 9101).await, None);
    let (_, outcome, _) = followup(&app, 9101).await;
    assert!(outcome.unwrap().contains("protected_branches_only"));
}

/// Deployment 9101 of tag `v1.2.0` under an agent whose entry has `protected_branches_only`:
/// GitLab's environment says its last deployment's job ran for a tag (`deployable.tag`).
async fn tag_deploy(protected: Option<bool>) -> (TestGitLab, TestApp) {
    let (gitlab, app) = setup(9101).await;
    gitlab.rest.with(|d| {
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "ci_access:\n  groups:\n    - id: acme/apps\n      protected_branches_only: true\n"
                .into(),
        );
        let env = &mut d.environments.get_mut(&42).unwrap()[0]["last_deployment"];
        env["ref"] = json!("v1.2.0");
        env["deployable"]["ref"] = json!("v1.2.0");
        env["deployable"]["tag"] = json!(true);
        if let Some(protected) = protected {
            d.tags.insert((42, "v1.2.0".into()), protected);
        }
    });
    success_hook_of(&app, 9101, "v1.2.0").await;
    (gitlab, app)
}

#[tokio::test]
async fn a_protected_tag_passes_a_protected_branches_only_entry() {
    let (gitlab, app) = tag_deploy(Some(true)).await;
    assert_eq!(agent_row(&app, 9101).await, Some((7, "shop".to_owned())));
    let calls = gitlab.rest.calls();
    assert!(
        calls.contains(&"/api/v4/projects/42/repository/tags/v1.2.0".to_owned()),
        "{calls:?}"
    );
    // A tag is not looked up among the branches.
    assert!(!calls.iter().any(|c| c.contains("/repository/branches/")));
}

#[tokio::test]
async fn an_unprotected_tag_is_refused_by_a_protected_branches_only_entry() {
    for protected in [Some(false), None] {
        let (_gitlab, app) = tag_deploy(protected).await;
        assert_eq!(agent_row(&app, 9101).await, None, "{protected:?}");
        let (_, outcome, _) = followup(&app, 9101).await;
        let outcome = outcome.unwrap();
        assert!(outcome.contains("protected_branches_only"), "{outcome}");
        assert!(outcome.contains("\"v1.2.0\" is not protected"), "{outcome}");
    }
}
