//! Pull-based deployments (SPEC 15) end to end: a Flux Kustomization bound to environment
//! `flux` (its `fluxResourcePath`) applies revisions in the test Kubernetes server (Flux's CRDs,
//! status as kustomize-controller writes it); envlens follows it through the watch cache,
//! records each new revision once (running, then success when the group is healthy or failed
//! at the settle deadline, with its snapshot), and creates and finishes the same deployment in
//! the test GitLab. Also: an environment's agent from GitLab's `cluster_agent`, checked against
//! `ci_access` by the sync.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envlens::config::file::Settings;
use envlens::history::worker::Worker as History;
use envlens::ingest::followups::Worker as Followups;
use envlens::pull::Watcher;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::environment_lookup::{api, app_with_api};
use crate::support::environment::{self, gitlab_labels, meta, World, NS, PROJECT};
use crate::support::gitlab::TestGitLab;
use crate::support::gitlab_rest::{self as rest, API_TOKEN};
use crate::support::gitops::{deploy_bound, deploy_bound_at, deployment_hook, serve_gitops_kinds};
use crate::support::kube_api::{KubeApi, Served};
use crate::support::reach::Reach;
use crate::support::TestApp;

const DEV: (i64, &str) = (2, "dev");

const FLUX_PATH: &str = "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/web";
/// The environment Flux deploys (id, name = slug).
const FLUX: (i64, &str) = (103, "flux");
const A: &str = "1111111111111111111111111111111111111111";
const B: &str = "2222222222222222222222222222222222222222";
const C: &str = "3333333333333333333333333333333333333333";

fn history(settle_timeout: &str) -> String {
    format!("history:\n  settle_poll: 100ms\n  retry_backoff: 100ms\n  settle_timeout: {settle_timeout}\n")
}

/// The environment's Deployment, `updated` of its 2 replicas rolled out (2: HEALTHY).
fn app(updated: u32) -> Value {
    let mut metadata = meta(NS, "web", "uid-flux-web", gitlab_labels(FLUX.1, "web"));
    metadata["generation"] = json!(1);
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "app", "image": "web:1"}]}}},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": updated,
                   "readyReplicas": updated, "availableReplicas": updated}})
}

/// The Kustomization as kustomize-controller leaves it after applying `revision` from its
/// source (`kind`), and its conditions.
fn kustomization(source: &str, revision: &str) -> Value {
    json!({"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": "web", "namespace": "flux-system", "uid": "uid-ks-web", "generation": 1},
        "spec": {"interval": "10m", "path": "./deploy", "prune": true, "targetNamespace": NS,
                 "sourceRef": {"kind": source, "name": "web"}},
        "status": {"observedGeneration": 1, "lastAppliedRevision": revision,
                   "lastAttemptedRevision": revision,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded",
                                   "message": format!("Applied revision: {revision}"),
                                   "lastTransitionTime": "2026-11-27T10:00:00Z", "observedGeneration": 1}],
                   "inventory": {"entries": [{"id": "shop_web_apps_Deployment", "v": "v1"}]}}})
}

/// source-controller's GitRepository following `branch`.
fn git_repository(branch: &str) -> Value {
    json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
        "metadata": {"name": "web", "namespace": "flux-system", "uid": "uid-repo-web"},
        "spec": {"interval": "1m", "url": "https://gitlab.example.com/acme/apps/web.git",
                 "ref": {"branch": branch}},
        "status": {"artifact": {"revision": format!("{branch}@sha1:{A}")}}})
}

struct Setup {
    world: World,
    api: KubeApi,
    _served: (Served, TempDir),
    clusters: Arc<envlens::k8s::clusters::Clusters>,
    history: History,
}

/// The support's GitLab and cluster, with Flux's kinds, the Kustomization at `main@sha1:A`
/// (its GitRepository on `main`), and environment `flux` bound to it by a deployment job
/// (`dashboard: flux_resource_path`) through agent 7 into `shop`.
async fn setup(updated: u32, settle_timeout: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    serve_gitops_kinds(&api);
    api.insert(app(updated));
    api.insert(git_repository("main"));
    api.insert(kustomization("GitRepository", &format!("main@sha1:{A}")));
    let served = api.serve(dir.path()).await;
    let history = history(settle_timeout);
    let world = environment::gitlab_via(Reach::Kubeconfig, &served, &history).await;
    deploy_bound(&world, 50, FLUX, FLUX_PATH).await;
    let settings =
        Settings::parse(&world.reached.config("  response_timeout: 3s\n", &history)).unwrap();
    let clusters = Arc::new(crate::support::clusters(&settings).await);
    let history = History::new(
        world.db.clone(),
        clusters.clone(),
        Arc::default(),
        settings.history,
    );
    Setup {
        world,
        api,
        _served: (served, dir),
        clusters,
        history,
    }
}

/// GitLab's Deployment Hook for deployment `id` of `flux`.
async fn hook(app: &TestApp, id: i64, status: &str) {
    deployment_hook(app, id, FLUX.1, status).await;
}

/// A test GitLab with acme/apps/web, whose token (envlens') has `scopes`.
async fn gitlab(scopes: &[&str]) -> TestGitLab {
    let gitlab = TestGitLab::start().await;
    gitlab.accept_access_token(API_TOKEN, 1, "envlens", scopes);
    gitlab
        .rest
        .with(|d| d.projects = vec![rest::project(PROJECT, "acme/apps/web", Some("main"))]);
    gitlab
}

/// `(deployment id, revision, status)` of `flux`'s pull-based deployments, newest first.
async fn pulls(app: &TestApp) -> Vec<(i64, String, String)> {
    envlens::db::pull::revisions(&app.db, FLUX.0).await.unwrap()
}

/// Waits (a minute at most) until `done` holds of the pull-based deployments.
async fn until(
    app: &TestApp,
    what: &str,
    done: impl Fn(&[(i64, String, String)]) -> bool,
) -> Vec<(i64, String, String)> {
    let start = Instant::now();
    loop {
        let now = pulls(app).await;
        if done(&now) {
            return now;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn revisions(pulls: &[(i64, String, String)]) -> Vec<String> {
    pulls.iter().rev().map(|(_, r, _)| r.clone()).collect()
}

/// Gives the history and the follow-ups turns until `done`, a minute at most.
async fn work_until(
    s: &Setup,
    followups: Option<&Followups>,
    what: &str,
    done: impl Fn(&[(i64, String, String)]) -> bool,
) -> Vec<(i64, String, String)> {
    let start = Instant::now();
    loop {
        s.history.run_until_idle().await.unwrap();
        if let Some(f) = followups {
            f.run_due(16).await.unwrap();
        }
        let now = pulls(&s.world).await;
        if done(&now) {
            return now;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scalar<T>(app: &TestApp, sql: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql).fetch_one(&app.db).await.unwrap()
}

/// A test GitLab whose token (envlens') has `scopes`, and the worker of the follow-ups that
/// tell it.
async fn told(s: &Setup, scopes: &[&str]) -> (TestGitLab, Followups) {
    let gitlab = gitlab(scopes).await;
    let followups = Followups::new(s.world.db.clone(), api(&gitlab), Arc::default());
    (gitlab, followups)
}

/// GitLab was sent nothing, and the deployment says why, in words that contain `because`.
async fn not_told(s: &Setup, gitlab: &TestGitLab, because: &str) {
    let reason: Option<String> =
        scalar(&s.world, "SELECT gitlab_reason FROM pull_deployments").await;
    assert!(
        reason.as_deref().is_some_and(|r| r.contains(because)),
        "{reason:?}"
    );
    assert_eq!(gitlab.rest.with(|d| d.writes.len()), 0);
}

impl Setup {
    /// A watcher following the bound environments; with `gitlab`, GitLab is to be told of each
    /// recorded deployment (as `serve` does with a token).
    async fn watching(&self, gitlab: bool) -> Watcher {
        let told: Option<envlens::pull::OnRecorded> = gitlab.then(|| Arc::new(|_| {}) as _);
        let watcher = Watcher::new(self.world.db.clone(), self.clusters.clone(), told);
        assert_eq!(watcher.follow_bound().await.unwrap(), 1, "flux is followed");
        watcher
    }
}

#[tokio::test]
async fn a_revision_change_is_recorded_once_here_and_in_gitlab() {
    let s = setup(2, "30s").await;
    let (gitlab, followups) = told(&s, &["api"]).await;
    let watcher = s.watching(true).await;

    // The revision applied when envlens first looks is recorded, running, with its snapshot job.
    let first = until(&s.world, "the first revision", |p| p.len() == 1).await;
    assert_eq!(revisions(&first), [format!("main@sha1:{A}")]);
    assert!(
        first[0].0 < 0,
        "envlens' own id until GitLab's is known: {first:?}"
    );
    assert_eq!(first[0].2, "running");

    // Healthy: success, and GitLab has it: created running, then finished.
    let done = work_until(&s, Some(&followups), "success in GitLab", |p| {
        p.len() == 1 && p[0].2 == "success" && p[0].0 > 0
    })
    .await;
    let mut writes = Vec::new();
    for _ in 0..200 {
        followups.run_due(16).await.unwrap();
        writes = gitlab.rest.with(|d| d.writes.clone());
        if writes.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        writes,
        vec![
            (
                "POST".to_owned(),
                "/api/v4/projects/42/deployments".to_owned(),
                json!({"environment": "flux", "sha": A, "ref": "main", "tag": false, "status": "running"})
            ),
            (
                "PUT".to_owned(),
                "/api/v4/projects/42/deployments/9001".to_owned(),
                json!({"status": "success"})
            ),
        ]
    );
    // envlens' deployment took GitLab's id; its agent, namespace and snapshot followed.
    assert_eq!(done[0].0, 9001);
    let gitlab_status = gitlab
        .rest
        .with(|d| d.deployments[&PROJECT][0]["status"].clone());
    assert_eq!(gitlab_status, "success");
    let agent: (i64, String, String) = sqlx::query_as(
        "SELECT agent_id, kubernetes_namespace, flux_resource_path FROM agent_deployments WHERE deployment_id = 9001",
    )
    .fetch_one(&s.world.db)
    .await
    .unwrap();
    assert_eq!(agent, (7, NS.to_owned(), FLUX_PATH.to_owned()));
    let healthy: Option<f64> = scalar(
        &s.world,
        "SELECT time_to_healthy FROM deployment_snapshots WHERE deployment_id = 9001",
    )
    .await;
    assert!(healthy.is_some_and(|t| t >= 0.0), "{healthy:?}");

    // The environment page's list shows it among the deployments, marked pull-based.
    let body = s.world.graphql((2, "dev"), r#"{ project(fullPath: "acme/apps/web") {
        environment(name: "flux") { deployments { nodes { id status sha pullBased { source revision gitlabReason } } } } } }"#).await;
    let nodes = body["data"]["project"]["environment"]["deployments"]["nodes"].clone();
    assert_eq!(nodes[0]["id"], "gid://gitlab/Deployment/9001", "{body}");
    assert_eq!(nodes[0]["pullBased"]["source"], FLUX_PATH, "{body}");
    assert_eq!(
        nodes[0]["pullBased"]["revision"],
        format!("main@sha1:{A}"),
        "{body}"
    );
    assert_eq!(
        nodes[1]["pullBased"],
        Value::Null,
        "the job's deployment: {body}"
    );
    watcher.stop();
}

/// `flux`'s deployments as the environment page lists them, `first` a page, every page
/// walked: `(id, pull-based)`.
async fn listed(app: &TestApp, first: i32) -> Vec<(String, bool)> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let query = format!(
            r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "flux") {{
              deployments(first: {first}{after}) {{ pageInfo {{ hasNextPage endCursor }}
                nodes {{ id pullBased {{ revision }} }} }} }} }} }}"#
        );
        let body = app.graphql(DEV, &query).await;
        let page = &body["data"]["project"]["environment"]["deployments"];
        let nodes = page["nodes"].as_array().unwrap_or_else(|| panic!("{body}"));
        all.extend(nodes.iter().map(|n| {
            (
                n["id"].as_str().unwrap().to_owned(),
                !n["pullBased"].is_null(),
            )
        }));
        if page["pageInfo"]["hasNextPage"] != true {
            return all;
        }
        after = format!(", after: {}", page["pageInfo"]["endCursor"]);
    }
}

#[tokio::test]
async fn pull_based_deployments_stand_among_gitlabs_by_time() {
    let s = setup(2, "30s").await;
    let watcher = s.watching(false).await;
    // Recorded after the job's deployment 50, with an id of envlens' own (negative).
    let pulled = until(&s.world, "A", |p| p.len() == 1).await[0].0;
    assert!(pulled < 0, "{pulled}");
    watcher.stop();
    // Then GitLab creates deployment 60, a moment later.
    let later = (chrono::Utc::now() + chrono::Duration::seconds(2)).to_rfc3339();
    deploy_bound_at(&s.world, 60, FLUX, FLUX_PATH, &later).await;
    let gid = |id: i64| format!("gid://gitlab/Deployment/{id}");
    let expected = vec![(gid(60), false), (gid(pulled), true), (gid(50), false)];
    assert_eq!(listed(&s.world, 20).await, expected, "newest first");
    // Page after page, the same order.
    assert_eq!(listed(&s.world, 1).await, expected, "a page each");
}

#[tokio::test]
async fn a_b_a_records_three_and_the_same_revision_nothing() {
    let s = setup(2, "30s").await;
    let watcher = s.watching(false).await;
    until(&s.world, "A", |p| p.len() == 1).await;
    // The same revision again (a later reconciliation, new conditions): nothing.
    let mut again = kustomization("GitRepository", &format!("main@sha1:{A}"));
    again["status"]["conditions"][0]["lastTransitionTime"] = json!("2026-11-27T11:00:00Z");
    s.api.insert(again);
    s.api
        .insert(kustomization("GitRepository", &format!("main@sha1:{B}")));
    until(&s.world, "B", |p| p.len() == 2).await;
    s.api
        .insert(kustomization("GitRepository", &format!("main@sha1:{A}")));
    let three = until(&s.world, "A again", |p| p.len() == 3).await;
    assert_eq!(
        revisions(&three),
        [
            format!("main@sha1:{A}"),
            format!("main@sha1:{B}"),
            format!("main@sha1:{A}")
        ]
    );
    // Without a GitLab token: envlens' own, with the reason.
    let reasons: Vec<Option<String>> =
        sqlx::query_scalar("SELECT gitlab_reason FROM pull_deployments")
            .fetch_all(&s.world.db)
            .await
            .unwrap();
    assert!(
        reasons
            .iter()
            .all(|r| r.as_deref() == Some(envlens::pull::NO_TOKEN)),
        "{reasons:?}"
    );
    watcher.stop();
}

#[tokio::test]
async fn a_restart_does_not_record_the_revision_twice() {
    let s = setup(2, "30s").await;
    let first = s.watching(false).await;
    until(&s.world, "A", |p| p.len() == 1).await;
    first.stop();
    // envlens again (and a second replica beside it): both look at A at their start.
    let again = s.watching(false).await;
    let replica = s.watching(false).await;
    s.api
        .insert(kustomization("GitRepository", &format!("main@sha1:{C}")));
    let after = until(&s.world, "C", |p| p.len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        revisions(&pulls(&s.world).await),
        [format!("main@sha1:{A}"), format!("main@sha1:{C}")],
        "{after:?}"
    );
    again.stop();
    replica.stop();
}

#[tokio::test]
async fn a_group_not_healthy_by_the_deadline_fails() {
    let s = setup(0, "2s").await;
    let (gitlab, followups) = told(&s, &["api"]).await;
    let watcher = s.watching(true).await;
    let failed = work_until(&s, Some(&followups), "failed", |p| {
        p.len() == 1 && p[0].2 == "failed"
    })
    .await;
    let id = failed[0].0;
    let healthy: Option<f64> = scalar(
        &s.world,
        &format!("SELECT time_to_healthy FROM deployment_snapshots WHERE deployment_id = {id}"),
    )
    .await;
    assert_eq!(healthy, None);
    for _ in 0..200 {
        followups.run_due(16).await.unwrap();
        if gitlab.rest.with(|d| d.writes.len()) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let writes = gitlab.rest.with(|d| d.writes.clone());
    assert_eq!(
        writes.last().unwrap().2,
        json!({"status": "failed"}),
        "{writes:?}"
    );
    watcher.stop();
}

#[tokio::test]
async fn without_a_branch_envlens_records_its_own_with_the_reason() {
    let s = setup(2, "30s").await;
    s.api
        .insert(kustomization("OCIRepository", "latest@sha256:4b1e0c5d2a"));
    let (gitlab, followups) = told(&s, &["api"]).await;
    let watcher = s.watching(true).await;
    let done = work_until(&s, Some(&followups), "success", |p| {
        p.len() == 1 && p[0].2 == "success"
    })
    .await;
    assert!(done[0].0 < 0, "never GitLab's: {done:?}");
    not_told(&s, &gitlab, "OCIRepository").await;
    watcher.stop();
}

#[tokio::test]
async fn gitlabs_hook_for_it_is_matched_not_doubled() {
    let s = setup(0, "30s").await;
    let (_gitlab, followups) = told(&s, &["api"]).await;
    let watcher = s.watching(true).await;
    until(&s.world, "recorded", |p| p.len() == 1).await;
    // GitLab's hook for the deployment it is about to create (9001) comes first.
    hook(&s.world, 9001, "running").await;
    work_until(&s, Some(&followups), "GitLab's id", |p| {
        p.len() == 1 && p[0].0 == 9001
    })
    .await;
    hook(&s.world, 9001, "running").await;
    let count: i64 = scalar(
        &s.world,
        &format!("SELECT count(*) FROM deployments WHERE environment_id = {} OR environment_name = 'flux'", FLUX.0),
    )
    .await;
    assert_eq!(count, 2, "the job's deployment and Flux's, once each");
    watcher.stop();
}

/// GitLab: acme (1) > acme/apps (2) with web (42), acme/ops (3) with tools (43); agent 7 of
/// acme/agents (10) lets acme/apps deploy (default namespace `apps`). Each project has an
/// environment naming agent 7 and a Kustomization, without any deployment.
fn populate(gitlab: &TestGitLab) {
    gitlab.rest.with(|d| {
        d.groups = vec![
            rest::group(1, "acme"),
            rest::group(2, "acme/apps"),
            rest::group(3, "acme/ops"),
        ];
        d.projects = vec![
            rest::project(10, "acme/agents", Some("main")),
            rest::project(42, "acme/apps/web", Some("main")),
            rest::project(43, "acme/ops/tools", Some("main")),
        ];
        d.users = vec![rest::user(1, "root", true)];
        d.group_members.insert(1, vec![rest::member(1, "root", 50)]);
        d.agents
            .insert(10, vec![rest::agent(7, "prod", (10, "acme/agents"))]);
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "ci_access:\n  groups:\n    - id: acme/apps\n      default_namespace: apps\n".into(),
        );
        for (project, env) in [(42, 100), (43, 110)] {
            let mut e = rest::environment(
                env,
                "production",
                None,
                Some(rest::agent(7, "prod", (10, "acme/agents"))),
                None,
            );
            e["flux_resource_path"] = json!(FLUX_PATH);
            d.environments.insert(project, vec![e]);
        }
    });
}

#[tokio::test]
async fn gitlabs_cluster_agent_binds_an_environment_without_a_deployment_as_ci_access_allows() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    let scope = envlens::ingest::sync::Scope {
        groups: vec!["acme".into()],
        max_projects: 100,
        timeout: Duration::from_secs(60),
    };
    envlens::ingest::sync::pass(
        &app.db,
        &api(&gitlab),
        &scope,
        &Default::default(),
        &mut |_| {},
    )
    .await
    .unwrap();
    // acme/apps/web may use agent 7: the environment is bound, in the entry's default namespace.
    let bound = envlens::db::pull::bound(&app.db).await.unwrap();
    assert_eq!(bound.len(), 1, "{bound:?}");
    assert_eq!(
        (
            bound[0].environment_id,
            bound[0].agent_id,
            bound[0].namespace.as_str(),
            bound[0].flux_resource_path.as_str()
        ),
        (100, 7, "apps", FLUX_PATH)
    );
    let body = app.graphql((1, "root"), r#"{ project(fullPath: "acme/apps/web") {
        environment(name: "production") { kubernetesNamespace fluxResourcePath clusterAgent { name } } } }"#).await;
    let env = &body["data"]["project"]["environment"];
    assert_eq!(env["kubernetesNamespace"], "apps", "{body}");
    assert_eq!(env["fluxResourcePath"], FLUX_PATH, "{body}");
    assert_eq!(env["clusterAgent"]["name"], "prod", "{body}");
    // acme/ops/tools may not: refused, in words, and nothing shows.
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM environment_agents WHERE environment_id = 110")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(
        reason.contains("acme/ops/tools is not authorized to use agent acme/agents:prod"),
        "{reason}"
    );
    let body = app
        .graphql(
            (1, "root"),
            r#"{ project(fullPath: "acme/ops/tools") {
        environment(name: "production") { kubernetesNamespace clusterAgent { name } } } }"#,
        )
        .await;
    assert_eq!(
        body["data"]["project"]["environment"]["kubernetesNamespace"],
        Value::Null,
        "{body}"
    );
    // GitLab names no agent any more: the binding goes.
    gitlab
        .rest
        .with(|d| d.environments.get_mut(&42).unwrap()[0]["cluster_agent"] = Value::Null);
    envlens::ingest::sync::pass(
        &app.db,
        &api(&gitlab),
        &scope,
        &Default::default(),
        &mut |_| {},
    )
    .await
    .unwrap();
    assert!(envlens::db::pull::bound(&app.db).await.unwrap().is_empty());
}

#[tokio::test]
async fn gitlab_down_loses_nothing_the_deployment_is_created_later() {
    let s = setup(2, "30s").await;
    let (gitlab, followups) = told(&s, &["api"]).await;
    gitlab
        .rest
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let watcher = s.watching(true).await;
    let done = work_until(&s, Some(&followups), "success", |p| {
        p.len() == 1 && p[0].2 == "success"
    })
    .await;
    assert!(done[0].0 < 0, "GitLab is down: {done:?}");
    let (attempts, error): (i32, Option<String>) = sqlx::query_as(
        "SELECT attempts, last_error FROM gitlab_followups WHERE kind = 'pull_create'",
    )
    .fetch_one(&s.world.db)
    .await
    .unwrap();
    assert!(
        attempts >= 1 && error.as_deref().is_some_and(|e| e.contains("500")),
        "{attempts} {error:?}"
    );
    // Not due yet: left alone.
    assert_eq!(followups.run_due(16).await.unwrap(), 0);
    // GitLab is back and the retries are due: created, then finished, once each.
    gitlab
        .rest
        .down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..3 {
        sqlx::query("UPDATE gitlab_followups SET due_at = now() WHERE finished_at IS NULL")
            .execute(&s.world.db)
            .await
            .unwrap();
        followups.run_due(16).await.unwrap();
    }
    let writes: Vec<(String, Value)> = gitlab.rest.with(|d| {
        d.writes
            .iter()
            .map(|(m, _, b)| (m.clone(), b["status"].clone()))
            .collect()
    });
    assert_eq!(
        writes,
        vec![
            ("POST".to_owned(), json!("running")),
            ("PUT".to_owned(), json!("success"))
        ]
    );
    assert_eq!(pulls(&s.world).await[0].0, 9001);
    watcher.stop();
}

#[tokio::test]
async fn a_token_without_the_api_scope_creates_nothing_in_gitlab() {
    let s = setup(2, "30s").await;
    let (gitlab, followups) = told(&s, &["read_api"]).await;
    let watcher = s.watching(true).await;
    work_until(&s, Some(&followups), "success", |p| {
        p.len() == 1 && p[0].2 == "success"
    })
    .await;
    for _ in 0..3 {
        followups.run_due(16).await.unwrap();
    }
    not_told(&s, &gitlab, "no `api` scope").await;
    watcher.stop();
}

/// The environment page lists the deployments Flux made among the others, marked pull-based,
/// with the revision and why GitLab was not told (Chromium, over the demo).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_page_lists_flux_deployments_marked_pull_based() {
    let Some(browser) = crate::support::browser::Browser::launch().await else {
        return;
    };
    let demo = crate::support::demo::Demo::start().await;
    let db = &demo.app.db;
    // The demo's acme/web/site production, bound to a Kustomization through its agent.
    let bound: envlens::db::pull::Bound = sqlx::query_as(
        "SELECT e.id AS environment_id, e.project_id, e.name AS environment, a.id AS agent_id,
                p.full_path AS agent_project_path, a.name AS agent_name,
                ad.kubernetes_namespace AS namespace, $1 AS flux_resource_path
         FROM environments e JOIN projects ep ON ep.id = e.project_id
         JOIN deployments d ON d.environment_id = e.id
         JOIN agent_deployments ad ON ad.deployment_id = d.id
         JOIN cluster_agents a ON a.id = ad.agent_id JOIN projects p ON p.id = a.project_id
         WHERE ep.full_path = 'acme/web/site' AND e.name = 'production' ORDER BY d.id DESC LIMIT 1",
    )
    .bind(FLUX_PATH)
    .fetch_one(db)
    .await
    .unwrap();
    let revision = format!("main@sha1:{B}");
    let mut tx = db.begin().await.unwrap();
    envlens::db::pull::record(
        &mut tx,
        &envlens::db::pull::Applied {
            bound: &bound,
            revision: &revision,
            resource_version: Some(1),
            sha: Some(B),
            git_ref: Some("main"),
            tag: false,
            gitlab_reason: Some(envlens::pull::NO_TOKEN),
        },
    )
    .await
    .unwrap()
    .unwrap();
    tx.commit().await.unwrap();

    let page = browser.page().await;
    page.screen(1440, false).await;
    demo.sign_in(&page).await;
    page.goto(&format!(
        "{}/environments?project=acme/web/site&name=production",
        demo.url
    ))
    .await;
    let r = page
        .wait_for(
            "document.body.innerText.includes('Pull-based (Flux)')",
            Duration::from_secs(20),
        )
        .await;
    crate::dashboard::check(&page, "pull-based", r).await;
    page.screenshot(&crate::dashboard::shots().join("environment-pull-based.png"))
        .await;
    let row = page
        .eval("[...document.querySelectorAll('tbody tr')].map(r => r.innerText).find(t => t.includes('Pull-based'))")
        .await;
    let row = row.as_str().unwrap_or_default().to_owned();
    assert!(row.contains(&revision), "{row}");
    assert!(row.contains("no GitLab token"), "{row}");
    assert!(row.contains("Running"), "{row}");
}

/// Replicas sharing the clusters (SPEC 16): a replica follows the Flux objects of the
/// connections it holds only; another replica's follower would list once and then hear of no
/// change. Not held: nothing followed, nothing recorded; held: followed and recorded.
#[tokio::test]
async fn a_replica_follows_the_flux_objects_of_the_connections_it_holds_only() {
    use envlens::k8s::watch::fence::Fences;
    let s = setup(2, "30s").await;
    let settings = Settings::parse(
        &s.world
            .reached
            .config("  response_timeout: 3s\n", &history("30s")),
    )
    .unwrap();
    let fences = Fences::shared();
    let clusters = Arc::new(
        envlens::k8s::clusters::Clusters::load_fenced(
            &settings.kubernetes,
            Default::default(),
            fences.clone(),
        )
        .await
        .unwrap(),
    );
    let watcher = Watcher::new(s.world.db.clone(), clusters.clone(), None);
    s.api.reset_request_counts();
    assert_eq!(
        watcher.follow_bound().await.unwrap(),
        0,
        "followed without the hold"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        pulls(&s.world).await.is_empty(),
        "recorded without the hold"
    );
    assert_eq!(
        s.api
            .request_count("list", "kustomizations.kustomize.toolkit.fluxcd.io"),
        0
    );

    let cluster = clusters.for_agent(7, "acme/agents", "prod").await.unwrap();
    fences
        .fence(&cluster.source)
        .grant(1, tokio::time::Instant::now() + Duration::from_secs(3600));
    assert_eq!(watcher.follow_bound().await.unwrap(), 1, "held: followed");
    let first = until(&s.world, "the first revision", |p| p.len() == 1).await;
    assert_eq!(revisions(&first), [format!("main@sha1:{A}")]);
    watcher.stop();
}
