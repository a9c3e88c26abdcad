//! The sync from GitLab's API (SPEC 12.3) against the in-process GitLab: a pass mirrors
//! groups, projects, users, memberships, agents with their configuration files and
//! environments through several pages, a 429 and a 500; a second pass writes nothing; what
//! GitLab no longer has goes only after a complete pass. Group webhooks' member, project and
//! subgroup events are applied as system hooks, and a push touching `.gitlab/agents/` reads the
//! project's agents again.
//!
//! The group webhook payloads are fixtures of our own (`tests/fixtures/webhook_events/`), written
//! from GitLab's documented examples (`webhook_events.md`) with values of ours; GitLab's own
//! copies run as well when this machine has them (`ENVLENS_GITLAB_MATERIAL`, else
//! `../shared/material/gitlab`, holding `webhook_events/<event>.json`).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use envlens::ingest::sync::{pass, Report, Scope};
use envlens::telemetry::Metrics;
use serde_json::{json, Value};

use crate::environment_lookup::{api, api_with_token, app_with_api};
use crate::support::gitlab::TestGitLab;
use crate::support::gitlab_rest::{self as rest, Fault};
use crate::support::TestApp;

/// Extra projects under acme/apps, so that every list of projects spans pages.
const FILLER: i64 = 130;

/// GitLab: acme (1) > acme/apps (2), acme/ops (3); acme/agents (10) with agent 7 `prod`
/// (ci_access for acme/apps, user_access for acme/apps/web), acme/apps/web (42) with two
/// environments, and [`FILLER`] more projects. Users: root (1, admin), dev (2, developer of
/// 42), rep (3, reporter of acme/apps), ops (4, maintainer of acme), guest-min (5, minimal access to acme).
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
        ];
        for i in 0..FILLER {
            d.projects
                .push(rest::project(1000 + i, &format!("acme/apps/svc-{i}"), None));
        }
        d.users = vec![
            rest::user(1, "root", true),
            rest::user(2, "dev", false),
            rest::user(3, "rep", false),
            rest::user(4, "ops", false),
            rest::user(5, "guest-min", false),
        ];
        d.group_members.insert(
            1,
            vec![rest::member(4, "ops", 40), rest::member(5, "guest-min", 5)],
        );
        d.group_members.insert(2, vec![rest::member(3, "rep", 20)]);
        d.project_members
            .insert(42, vec![rest::member(2, "dev", 30)]);
        d.agents
            .insert(10, vec![rest::agent(7, "prod", (10, "acme/agents"))]);
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "ci_access:\n  groups:\n    - id: acme/apps\n      default_namespace: apps\n\
             user_access:\n  access_as:\n    agent: {}\n  projects:\n    - id: acme/apps/web\n"
                .into(),
        );
        d.environments.insert(
            42,
            vec![
                rest::environment(100, "production", None, None, None),
                rest::environment(101, "review/fix-login", None, None, None),
            ],
        );
    });
}

async fn sync(app: &TestApp, gitlab: &TestGitLab, groups: &[&str]) -> Result<Report, String> {
    sync_with(app, gitlab, rest::API_TOKEN, groups).await
}

/// A pass with `token` as envlens' own.
async fn sync_with(
    app: &TestApp,
    gitlab: &TestGitLab,
    token: &str,
    groups: &[&str],
) -> Result<Report, String> {
    let scope = Scope {
        groups: groups.iter().map(|g| g.to_string()).collect(),
        max_projects: 10_000,
        timeout: Duration::from_secs(60),
    };
    let mut steps = Vec::new();
    let mut progress = |step: &str| steps.push(step.to_owned());
    let report = pass(
        &app.db,
        &api_with_token(gitlab, token),
        &scope,
        &Metrics::default(),
        &mut progress,
    )
    .await
    .map_err(|e| e.to_string());
    if report.is_ok() {
        assert!(
            steps.iter().any(|s| s.starts_with("projects read: ")),
            "{steps:?}"
        );
    }
    report
}

async fn rows(app: &TestApp, sql: &str) -> Vec<String> {
    sqlx::query_scalar(sql).fetch_all(&app.db).await.unwrap()
}

async fn mirror(app: &TestApp) -> Vec<String> {
    rows(
        app,
        "SELECT format('group %s %s %s', id, full_path, traversal_ids::text) FROM namespaces
         UNION ALL SELECT format('project %s %s ns=%s', id, full_path, namespace_id) FROM projects WHERE id < 1000
         UNION ALL SELECT format('user %s %s%s', id, username, CASE WHEN admin THEN ' admin' ELSE '' END) FROM users
         UNION ALL SELECT format('member %s %s %s %s', user_id, source_type, source_id, access_level) FROM members
         UNION ALL SELECT format('agent %s %s project=%s', id, name, project_id) FROM cluster_agents
         UNION ALL SELECT format('ci_access %s group=%s %s', agent_id, group_id, config->>'default_namespace') FROM agent_ci_access_authorizations
         UNION ALL SELECT format('user_access %s project=%s', agent_id, project_id) FROM agent_user_access_authorizations
         UNION ALL SELECT format('environment %s %s project=%s', id, name, project_id) FROM environments
         ORDER BY 1",
    )
    .await
}

#[tokio::test]
async fn a_pass_mirrors_gitlab_and_the_next_writes_nothing() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    // On the way: a 429 with Retry-After, then a 500; both are waited out.
    gitlab.rest.fault(Fault::TooManyRequests { retry_after: 1 });
    gitlab.rest.fault(Fault::ServerError);
    let report = sync(&app, &gitlab, &[]).await.unwrap();
    assert_eq!(
        mirror(&app).await,
        vec![
            "agent 7 prod project=10",
            "ci_access 7 group=2 apps",
            "environment 100 production project=42",
            "environment 101 review/fix-login project=42",
            "group 1 acme {1}",
            "group 2 acme/apps {1,2}",
            "group 3 acme/ops {1,3}",
            "member 2 project 42 30",
            "member 3 group 2 20",
            "member 4 group 1 40",
            "member 5 group 1 5",
            "project 10 acme/agents ns=1",
            "project 42 acme/apps/web ns=2",
            "user 1 root admin",
            "user 2 dev",
            "user 3 rep",
            "user 4 ops",
            "user 5 guest-min",
            "user_access 7 project=42",
        ]
    );
    let projects: i64 = sqlx::query_scalar("SELECT count(*) FROM projects")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(projects, 2 + FILLER);
    assert_eq!(
        (report.groups, report.projects, report.users, report.members),
        (3, 2 + FILLER as usize, 5, 4)
    );
    assert_eq!((report.agents, report.configurations_applied), (1, 1));
    assert_eq!(report.environments, 2);
    assert!(report.rows_written > 0);
    // Keyset pages for the projects, offset pages elsewhere; the faults were retried.
    let calls = gitlab.rest.calls();
    assert!(calls.iter().any(|c| c.contains("id_after=")), "{calls:?}");
    // And `GET /user` (whether the token is an administrator's), which the REST log leaves out.
    assert_eq!(report.requests as usize, calls.len() + 1);

    // Nothing changed in GitLab: the same reads, nothing written.
    let before = app.fingerprint().await;
    let again = sync(&app, &gitlab, &[]).await.unwrap();
    assert_eq!(again.rows_written, 0, "{again}");
    assert_eq!(app.fingerprint().await, before);
    // Per project: members, agents, environments (one page each).
    assert_eq!(
        again.requests as usize,
        3 * (2 + FILLER as usize) + 1 /* config file */ + 3 /* group members */
            + 2 /* projects: 2 keyset pages */ + 1 /* groups */ + 1 /* users */
            + 1, /* the token's own user */
        "{again}"
    );
}

#[tokio::test]
async fn what_gitlab_no_longer_has_goes_after_a_complete_pass_only() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    sync(&app, &gitlab, &["acme"]).await.unwrap();
    // Within a group's scope too (users known only as members), an unchanged GitLab writes
    // nothing.
    let again = sync(&app, &gitlab, &["acme"]).await.unwrap();
    assert_eq!(
        (again.rows_written, again.configurations_applied),
        (0, 0),
        "{again}"
    );
    // A project outside the synced group (from a hook) stays whatever happens.
    let res = app
        .hook(
            "System Hook",
            json!({"event_name": "project_create", "project_id": 77, "path_with_namespace": "other/tool",
                   "project_visibility": "private", "name": "tool", "path": "tool", "owner_name": "o",
                   "owner_email": "o@example.com", "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"})
            .to_string(),
            None,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    gitlab.rest.with(|d| {
        d.projects.retain(|p| p["id"] != 1005);
        d.groups.retain(|g| g["id"] != 3);
        d.group_members.insert(2, vec![]);
        d.environments.get_mut(&42).unwrap().pop();
        d.agents.insert(10, vec![]);
    });
    // GitLab fails half way: nothing is removed, nothing written.
    let before = app.fingerprint().await;
    // Every attempt of one call (the test client tries three times).
    for _ in 0..3 {
        gitlab.rest.fault(Fault::ServerError);
    }
    let failed = sync(&app, &gitlab, &["acme"]).await.unwrap_err();
    assert!(failed.contains("500"), "{failed}");
    assert_eq!(app.fingerprint().await, before);
    // Complete: removed.
    let report = sync(&app, &gitlab, &["acme"]).await.unwrap();
    assert!(report.removed >= 5, "{report}");
    let m = mirror(&app).await;
    for gone in [
        "group 3 acme/ops {1,3}",
        "member 3 group 2 20",
        "environment 101 review/fix-login project=42",
        "agent 7 prod project=10",
    ] {
        assert!(!m.contains(&gone.to_owned()), "{gone} still in {m:?}");
    }
    let kept: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM projects WHERE id IN (77, 1005) ORDER BY id")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(kept, vec![77]);
    // A user who left the group is kept: an administrator's token lists them still.
    assert!(m.contains(&"user 3 rep".to_owned()));
}

#[tokio::test]
async fn a_pass_is_bounded() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    let scope = Scope {
        groups: vec![],
        max_projects: 50,
        timeout: Duration::from_secs(60),
    };
    let e = pass(
        &app.db,
        &api(&gitlab),
        &scope,
        &Metrics::default(),
        &mut |_: &str| {},
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("more than 50"), "{e}");
    gitlab.rest.fault(Fault::Slow(Duration::from_millis(1500)));
    let scope = Scope {
        max_projects: 10_000,
        timeout: Duration::from_millis(500),
        ..scope
    };
    let e = pass(
        &app.db,
        &api(&gitlab),
        &scope,
        &Metrics::default(),
        &mut |_: &str| {},
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("sync_timeout"), "{e}");
    let groups: i64 = sqlx::query_scalar("SELECT count(*) FROM namespaces")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(groups, 0);
}

// ---- Group webhooks and pushes ----

/// The folders of group webhook payloads in GitLab's documented shapes: ours, committed; and
/// GitLab's own when this machine has them.
fn documented_webhook_payloads() -> Vec<PathBuf> {
    let mut dirs =
        vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/webhook_events")];
    match crate::system_hooks::gitlab_material().map(|m| m.join("webhook_events")) {
        Some(dir) if dir.is_dir() => dirs.push(dir),
        _ => eprintln!("GitLab's own webhook payloads are not on this machine: ours only"),
    }
    dirs
}

async fn deliver(app: &TestApp, event: &str, body: &Value) -> Value {
    let res = app.hook(event, body.to_string(), None).await;
    assert!(res.status.is_success(), "{event}: {}", res.text());
    res.json()
}

/// Our own payloads in the documented shapes (`webhook_events.md`: group member, project and
/// subgroup events).
#[tokio::test]
async fn group_webhooks_are_applied_like_system_hooks() {
    let app = TestApp::new().await;
    let subgroup = json!({"created_at": "2026-11-20T09:40:12Z", "updated_at": "2026-11-20T09:40:12Z",
        "event_name": "subgroup_create", "name": "apps", "path": "apps", "full_path": "acme/apps",
        "group_id": 2, "parent_group_id": 1, "parent_name": "acme", "parent_path": "acme", "parent_full_path": "acme"});
    let root = json!({"event_name": "group_create", "created_at": "2026-11-20T09:40:12Z", "updated_at": "2026-11-20T09:40:12Z",
        "name": "acme", "path": "acme", "full_path": "acme", "group_id": 1});
    assert_eq!(
        deliver(&app, "System Hook", &root).await["outcome"],
        "applied"
    );
    assert_eq!(
        deliver(&app, "Subgroup Hook", &subgroup).await["outcome"],
        "applied"
    );
    let project = json!({"event_name": "project_create", "created_at": "2026-11-20T10:43:48Z", "updated_at": "2026-11-20T10:43:48Z",
        "name": "web", "path": "web", "path_with_namespace": "acme/apps/web", "project_id": 42,
        "project_namespace_id": 52, "owners": [{"name": "Dev", "email": "dev@example.com"}], "project_visibility": "internal"});
    assert_eq!(
        deliver(&app, "Project Hook", &project).await["outcome"],
        "applied"
    );
    let member = json!({"created_at": "2026-11-20T04:57:22Z", "updated_at": "2026-11-20T04:57:22Z",
        "group_name": "apps", "group_path": "apps", "group_id": 2, "user_username": "dev", "user_name": "Dev",
        "user_email": "dev@example.com", "user_id": 2, "group_access": "Developer", "group_plan": null,
        "expires_at": null, "event_name": "user_add_to_group"});
    assert_eq!(
        deliver(&app, "Member Hook", &member).await["outcome"],
        "applied"
    );
    let mut request = member.clone();
    request["event_name"] = json!("user_access_request_to_group");
    assert_eq!(
        deliver(&app, "Member Hook", &request).await["outcome"],
        "ignored"
    );
    let mirrored: Vec<String> = rows(
        &app,
        "SELECT format('group %s %s %s', id, full_path, traversal_ids::text) FROM namespaces
         UNION ALL SELECT format('project %s %s %s ns=%s', id, full_path, visibility, namespace_id) FROM projects
         UNION ALL SELECT format('member %s %s %s %s', user_id, source_type, source_id, access_level) FROM members ORDER BY 1",
    )
    .await;
    assert_eq!(
        mirrored,
        vec![
            "group 1 acme {1}",
            "group 2 acme/apps {1,2}",
            "member 2 group 2 30",
            "project 42 acme/apps/web internal ns=2",
        ]
    );
    let mut removed = member;
    removed["event_name"] = json!("user_remove_from_group");
    deliver(&app, "Member Hook", &removed).await;
    let mut destroyed = project;
    destroyed["event_name"] = json!("project_destroy");
    deliver(&app, "Project Hook", &destroyed).await;
    let mut gone = subgroup;
    gone["event_name"] = json!("subgroup_destroy");
    deliver(&app, "Subgroup Hook", &gone).await;
    let left = rows(
        &app,
        "SELECT full_path FROM namespaces UNION ALL SELECT full_path FROM projects
         UNION ALL SELECT user_id::text FROM members",
    )
    .await;
    assert_eq!(left, vec!["acme"]);
}

/// GitLab's documented group webhook examples, in our fixtures (and GitLab's own copies when
/// present): each is applied or ignored, and what they create they remove again.
#[tokio::test]
async fn documented_group_webhook_payloads_are_applied() {
    let steps = [
        ("Subgroup Hook", "subgroup_create.json", "applied"),
        ("Project Hook", "project_create.json", "applied"),
        ("Member Hook", "user_add_to_group.json", "applied"),
        ("Member Hook", "user_update_for_group.json", "applied"),
        (
            "Member Hook",
            "user_access_request_to_group.json",
            "ignored",
        ),
        (
            "Member Hook",
            "user_access_request_denied_for_group.json",
            "ignored",
        ),
        ("Member Hook", "user_remove_from_group.json", "applied"),
        ("Project Hook", "project_destroy.json", "applied"),
        ("Subgroup Hook", "subgroup_destroy.json", "applied"),
    ];
    for dir in documented_webhook_payloads() {
        let app = TestApp::new().await;
        let count = |app: &TestApp| {
            let db = app.db.clone();
            async move {
                let n: i64 = sqlx::query_scalar(
                    "SELECT (SELECT count(*) FROM namespaces) + (SELECT count(*) FROM projects) + (SELECT count(*) FROM members)",
                )
                .fetch_one(&db)
                .await
                .unwrap();
                n
            }
        };
        let mut most = 0;
        for (event, file, outcome) in steps {
            let path = dir.join(file);
            let body: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(
                deliver(&app, event, &body).await["outcome"],
                outcome,
                "{}",
                path.display()
            );
            most = most.max(count(&app).await);
        }
        // The subgroup, the project and the membership were all there at once.
        assert_eq!(most, 3, "{}", dir.display());
        assert_eq!(count(&app).await, 0, "{}", dir.display());
    }
}

/// A push event in GitLab's documented shape to acme/agents (10).
fn push(git_ref: &str, modified: &[&str]) -> Value {
    json!({"object_kind": "push", "event_name": "push",
        "before": "95790bf891e76fee5e1747ab589903a6a1f80f22", "after": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
        "ref": git_ref, "ref_protected": true, "checkout_sha": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
        "user_id": 4, "user_name": "Ops", "user_username": "ops", "user_email": "ops@example.com", "user_avatar": null,
        "project_id": 10,
        "project": {"id": 10, "name": "agents", "description": "", "web_url": "https://gitlab.example.com/acme/agents",
                    "avatar_url": null, "namespace": "acme", "visibility_level": 0,
                    "path_with_namespace": "acme/agents", "default_branch": "main"},
        "repository": {"name": "agents", "url": "git@gitlab.example.com:acme/agents.git", "visibility_level": 0},
        "commits": [{"id": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7", "message": "Let ops deploy", "title": "Let ops deploy",
                     "timestamp": "2026-11-24T10:00:00+01:00", "url": "https://gitlab.example.com/c",
                     "author": {"name": "Ops", "email": "ops@example.com"},
                     "added": [], "modified": modified, "removed": []}],
        "total_commits_count": 1})
}

#[tokio::test]
async fn a_push_touching_agents_reads_their_configuration_again() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    sync(&app, &gitlab, &["acme"]).await.unwrap();
    let ci_access = || {
        rows(&app, "SELECT format('%s %s', group_id, config->>'default_namespace') FROM agent_ci_access_authorizations ORDER BY 1")
    };
    assert_eq!(ci_access().await, vec!["2 apps"]);
    gitlab.rest.with(|d| {
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "ci_access:\n  groups:\n    - id: acme/apps\n      default_namespace: web\n    - id: acme/ops\n".into(),
        );
    });
    // Elsewhere, or not under .gitlab/agents/: ignored, nothing asked of GitLab.
    let asked = gitlab.rest.calls().len();
    let answer = deliver(
        &app,
        "Push Hook",
        &push("refs/heads/topic", &[".gitlab/agents/prod/config.yaml"]),
    )
    .await;
    assert_eq!(answer["outcome"], "ignored");
    let answer = deliver(&app, "Push Hook", &push("refs/heads/main", &["README.md"])).await;
    assert_eq!(answer["outcome"], "ignored");
    assert_eq!(gitlab.rest.calls().len(), asked);
    // The agent's file on the default branch: read again, applied.
    let answer = deliver(
        &app,
        "Push Hook",
        &push("refs/heads/main", &[".gitlab/agents/prod/config.yaml"]),
    )
    .await;
    assert_eq!(answer["outcome"], "applied");
    assert_eq!(ci_access().await, vec!["2 web", "3 "]);
    // GitLab down: acknowledged, kept, done once GitLab is back.
    gitlab.rest.with(|d| {
        d.files.insert(
            (10, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
            "ci_access:\n  groups:\n    - id: acme/ops\n".into(),
        );
    });
    gitlab.rest.down.store(true, Ordering::SeqCst);
    let answer = deliver(
        &app,
        "Push Hook",
        &push("refs/heads/main", &[".gitlab/agents/prod/config.yaml"]),
    )
    .await;
    assert_eq!(answer["outcome"], "applied");
    assert_eq!(ci_access().await, vec!["2 web", "3 "]);
    gitlab.rest.down.store(false, Ordering::SeqCst);
    sqlx::query("UPDATE gitlab_followups SET due_at = now()")
        .execute(&app.db)
        .await
        .unwrap();
    let worker =
        envlens::ingest::followups::Worker::new(app.db.clone(), api(&gitlab), Default::default());
    assert_eq!(worker.run_due(16).await.unwrap(), 1);
    assert_eq!(ci_access().await, vec!["3 "]);
}

/// `envlens sync` as an administrator runs it: steps on stderr, the report on stdout, the
/// mirror filled; a token GitLab refuses fails it, naming the endpoint and not the token.
#[tokio::test]
async fn the_sync_command_reports_its_pass() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let (database_url, _database) = crate::telemetry::database_url().await;
    let dir = tempfile::tempdir().unwrap();
    let run = |token: &str| {
        std::fs::write(dir.path().join("token"), token).unwrap();
        std::fs::write(
            dir.path().join("envlens.yaml"),
            format!(
                "gitlab:\n  url: {}\n  token_file: {}\n  groups: [acme]\n",
                gitlab.url,
                dir.path().join("token").display()
            ),
        )
        .unwrap();
        let (config, url, data) = (
            dir.path().join("envlens.yaml"),
            database_url.clone(),
            dir.path().join("data"),
        );
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_envlens"))
                .args(["sync", "--json", "--config"])
                .arg(config)
                .env("DATABASE_URL", url)
                .env("ENVLENS_DATA_DIR", data)
                .output()
                .unwrap()
        })
    };
    let out = run(rest::API_TOKEN).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("projects read: 132/132"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["projects"], 132);
    assert_eq!(report["agents"], 1);
    let out = run("glpat-revoked").await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("GitLab refused the token for /groups/:id"),
        "{stderr}"
    );
    assert!(!stderr.contains("glpat-revoked"), "{stderr}");
}

/// `envlens sync` beside a `serve` whose pass is running: it says so, with the running pass'
/// step, waits for that pass to end, then runs its own and exits 0. With `--no-wait` it fails
/// at once, as it did before.
#[tokio::test]
async fn the_sync_command_waits_for_a_running_pass() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let (database_url, database) = crate::telemetry::database_url().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), rest::API_TOKEN).unwrap();
    std::fs::write(
        dir.path().join("envlens.yaml"),
        format!(
            "gitlab:\n  url: {}\n  token_file: {}\n  groups: [acme]\n",
            gitlab.url,
            dir.path().join("token").display()
        ),
    )
    .unwrap();
    let command = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_envlens"));
        command
            .args(["sync", "--json", "--config"])
            .arg(dir.path().join("envlens.yaml"))
            .args(args)
            .env("DATABASE_URL", &database_url)
            .env("ENVLENS_DATA_DIR", dir.path().join("data"));
        command
    };

    // `serve`'s pass, held at its first list of group members: the group, its subgroups and
    // the two pages of projects answered.
    gitlab.rest.held.store(true, Ordering::SeqCst);
    for _ in 0..4 {
        gitlab.rest.fault(Fault::Slow(Duration::ZERO));
    }
    gitlab.rest.fault(Fault::Held);
    let serve = tokio::spawn({
        let (pool, api) = ((*database).clone(), api(&gitlab));
        async move {
            let scope = Scope {
                groups: vec!["acme".into()],
                max_projects: 10_000,
                timeout: Duration::from_secs(120),
            };
            pass(&pool, &api, &scope, &Metrics::default(), &mut |_: &str| {}).await
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let shown: Vec<String> = sqlx::query_scalar(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'envlens sync: %'",
        )
        .fetch_all(&*database)
        .await
        .unwrap();
        if shown == ["envlens sync: projects: 132"] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{shown:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut no_wait = command(&["--no-wait"]);
    let out = tokio::task::spawn_blocking(move || no_wait.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "another envlens is running a sync pass on this database: this one is skipped"
        ),
        "{stderr}"
    );

    let mut child = command(&[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = lines.send(line);
        }
    });
    let mut said = Vec::new();
    let waiting = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), heard.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no line saying it waits: {said:?}"));
        said.push(line.clone());
        if line.contains("waiting for it") {
            break line;
        }
    };
    assert!(
        waiting.ends_with(
            "another envlens is running a sync pass on this database (projects: 132): waiting for it"
        ),
        "{waiting}"
    );
    // Still waiting while the other pass is held.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(child.try_wait().unwrap().is_none());
    assert!(
        gitlab.rest.calls().len() < 10,
        "only `serve`'s calls so far"
    );

    gitlab.rest.held.store(false, Ordering::SeqCst);
    let report = serve.await.unwrap().unwrap();
    assert_eq!(report.projects, 132);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    reader.join().unwrap();
    while let Ok(line) = heard.try_recv() {
        said.push(line);
    }
    assert!(out.status.success(), "{said:#?}");
    let ended = said
        .iter()
        .position(|l| l.ends_with("the other pass ended: this one starts"))
        .unwrap_or_else(|| panic!("{said:#?}"));
    let read = said
        .iter()
        .position(|l| l.ends_with("projects read: 132/132"))
        .unwrap_or_else(|| panic!("{said:#?}"));
    assert!(ended < read, "{said:#?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["projects"], 132);
    // No session keeps the pass' name once it ended. A backend whose client (the exited
    // process) went away leaves pg_stat_activity a moment later, at PostgreSQL's pace.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let shown: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'envlens sync: %'",
        )
        .fetch_one(&*database)
        .await
        .unwrap();
        if shown == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{shown} sessions keep the name"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// README "Beside a GitLab as shipped", end to end with nothing but GitLab's features: the
/// sync brings the identity and the agent, GitLab's success hook (no job call) has envlens look
/// the environment up, and a user's own GitLab token asks GraphQL for the agent.
#[tokio::test]
async fn the_readme_path_ends_with_graphql_naming_the_agent() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    gitlab.rest.with(|d| {
        d.environments.get_mut(&42).unwrap()[0] = rest::environment(
            100,
            "production",
            Some(9301),
            Some(rest::agent(7, "prod", (10, "acme/agents"))),
            Some("shop"),
        );
        d.branches.insert((42, "main".into()), true);
    });
    let app = app_with_api(&gitlab).await;
    sync(&app, &gitlab, &["acme"]).await.unwrap();
    let hook = json!({
        "object_kind": "deployment", "status": "success", "status_changed_at": "2026-11-24 10:00:00 +0100",
        "deployment_id": 9301, "deployable_id": 302, "deployable_url": null,
        "environment": "production", "environment_tier": "production", "environment_slug": "production",
        "environment_external_url": null,
        "project": {"id": 42, "name": "web", "path_with_namespace": "acme/apps/web", "visibility_level": 0},
        "short_sha": "714a629c", "user": {"id": 2, "username": "dev"}, "ref": "main"});
    deliver(&app, "Deployment Hook", &hook).await;
    gitlab.accept_token("glpat-dev-readme", 2, "dev");
    let query = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") { slug
        lastDeployment(status: SUCCESS) { agent { id name project { fullPath } kubernetesNamespace } } } } }"#;
    let res = app
        .send(
            axum::http::Request::post("/api/graphql")
                .header("authorization", "Bearer glpat-dev-readme")
                .header("content-type", "application/json")
                .body(axum::body::Body::from(
                    json!({ "query": query }).to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json()["data"]["project"]["environment"]["lastDeployment"]["agent"],
        json!({"id": "gid://gitlab/Clusters::Agent/7", "name": "prod",
               "project": {"fullPath": "acme/agents"}, "kubernetesNamespace": "shop"})
    );
}

/// The configuration keys README "Beside a GitLab as shipped" shows are the ones envlens reads.
#[test]
fn the_readme_gitlab_settings_parse() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let after = &readme[readme
        .find("The keys, with their defaults:")
        .expect("the README's block")..];
    let block = after
        .split("```yaml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let settings = envlens::config::file::Settings::parse(block).unwrap();
    let gitlab = settings.gitlab.unwrap();
    assert_eq!(gitlab.groups, vec!["acme".to_owned()]);
    assert_eq!(gitlab.sync_interval, Duration::from_secs(3600));
    assert_eq!(gitlab.sync_timeout, Duration::from_secs(1800));
    assert_eq!(gitlab.sync_max_projects, 10_000);
}

/// Two replicas' passes at once: one runs, the other is skipped.
#[tokio::test]
async fn one_pass_at_a_time() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    gitlab.rest.fault(Fault::Slow(Duration::from_millis(800)));
    let (a, b) = tokio::join!(sync(&app, &gitlab, &["acme"]), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sync(&app, &gitlab, &["acme"]).await
    });
    assert!(a.is_ok(), "{a:?}");
    assert!(b.unwrap_err().contains("another envlens"));
    assert!(sync(&app, &gitlab, &["acme"]).await.is_ok());
}

/// A configuration file that is not YAML, or that envlens refuses, leaves its agent as it was
/// and the pass goes on.
#[tokio::test]
async fn a_bad_configuration_file_is_counted_not_fatal() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    sync(&app, &gitlab, &["acme"]).await.unwrap();
    let before = mirror(&app).await;
    let file = (
        10,
        ".gitlab/agents/prod/config.yaml".to_owned(),
        "main".to_owned(),
    );
    for bad in ["ci_access: [", "ci_access:\n  groups: 7\n"] {
        gitlab
            .rest
            .with(|d| d.files.insert(file.clone(), bad.to_owned()));
        let report = sync(&app, &gitlab, &["acme"]).await.unwrap();
        assert_eq!(report.configurations_not_applied, 1, "{bad}: {report}");
        assert_eq!(mirror(&app).await, before, "{bad}");
    }
}

/// The sync mirrors each user's `state` and `external` (SPEC 13): a user GitLab blocked
/// loses their session at the pass, and gets it back once GitLab lets them in again.
#[tokio::test]
async fn the_sync_carries_user_state_and_a_blocked_users_session_is_refused() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    let app = app_with_api(&gitlab).await;
    sync(&app, &gitlab, &[]).await.unwrap();
    assert_eq!(app.get_as("/api/user", 2, "dev").await.status, 200);
    gitlab.rest.with(|d| {
        d.users[1]["state"] = json!("blocked");
        d.users[2]["external"] = json!(true);
    });
    sync(&app, &gitlab, &[]).await.unwrap();
    let users = rows(
        &app,
        "SELECT format('%s %s %s', username, state, external) FROM users ORDER BY id",
    )
    .await;
    assert_eq!(
        users,
        [
            "root active f",
            "dev blocked f",
            "rep active t",
            "ops active f",
            "guest-min active f"
        ]
    );
    assert_eq!(app.get_as("/api/user", 2, "dev").await.status, 401);
    gitlab.rest.with(|d| d.users[1]["state"] = json!("active"));
    sync(&app, &gitlab, &[]).await.unwrap();
    assert_eq!(app.get_as("/api/user", 2, "dev").await.status, 200);

    // A pass with a token that is no administrator's reads no `/users`: the members API's
    // state is the one it has.
    gitlab.rest.with(|d| {
        d.project_members.get_mut(&42).unwrap()[0]["state"] = json!("ldap_blocked");
    });
    sync_with(&app, &gitlab, rest::REGULAR_API_TOKEN, &["acme"])
        .await
        .unwrap();
    assert_eq!(app.get_as("/api/user", 2, "dev").await.status, 401);
}

// ---- Every user, with an administrator's token only (issue 37, item 5) ----

/// The mirror's users: `username state external[ admin]`, by id.
async fn users(app: &TestApp) -> Vec<String> {
    rows(
        app,
        "SELECT format('%s %s %s%s', username, state, external, CASE WHEN admin THEN ' admin' ELSE '' END)
         FROM users ORDER BY id",
    )
    .await
}

/// acme/apps/web (42, with its environments) public, acme/agents (10) internal, the rest
/// private.
fn with_visibilities(gitlab: &TestGitLab) {
    gitlab.rest.with(|d| {
        for p in &mut d.projects {
            match p["id"].as_i64() {
                Some(42) => p["visibility"] = json!("public"),
                Some(10) => p["visibility"] = json!("internal"),
                _ => {}
            }
        }
    });
}

const READS: &str = r#"{ public: project(fullPath: "acme/apps/web") { environments { nodes { name } } }
    internal: project(fullPath: "acme/agents") { fullPath }
    private: project(fullPath: "acme/apps/svc-0") { fullPath } }"#;

/// What `READS` shows: the public project's environments, whether the internal and the private
/// projects are there.
fn reads(answer: &Value) -> (Vec<String>, bool, bool) {
    let data = &answer["data"];
    assert!(answer["errors"].is_null(), "{answer}");
    let names = data["public"]["environments"]["nodes"]
        .as_array()
        .map(|n| {
            n.iter()
                .map(|e| e["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    (
        names,
        !data["internal"].is_null(),
        !data["private"].is_null(),
    )
}

#[tokio::test]
async fn an_administrators_sync_mirrors_every_user_members_or_not() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    with_visibilities(&gitlab);
    gitlab.rest.with(|d| {
        d.users.push(rest::user(6, "newcomer", false));
        let mut away = rest::user(7, "away", false);
        away["state"] = json!("deactivated");
        d.users.push(away);
        let mut contractor = rest::user(8, "contractor", false);
        contractor["external"] = json!(true);
        d.users.push(contractor);
    });
    let app = app_with_api(&gitlab).await;
    // Scoped to a group (`gitlab.groups`), with an administrator's token: still every user,
    // members of something or not.
    let report = sync(&app, &gitlab, &["acme"]).await.unwrap();
    assert_eq!((report.users, report.members), (8, 4), "{report}");
    assert_eq!(
        users(&app).await,
        [
            "root active f admin",
            "dev active f",
            "rep active f",
            "ops active f",
            "guest-min active f",
            "newcomer active f",
            "away deactivated f",
            "contractor active t",
        ]
    );
    // The newcomer, a member of nothing, is someone: what GitLab lets anyone read, and null
    // for the rest. The external contractor reads no internal project; the deactivated user
    // is refused.
    let expected = vec!["production".to_owned(), "review/fix-login".to_owned()];
    assert_eq!(
        reads(&app.graphql((6, "newcomer"), READS).await),
        (expected.clone(), true, false)
    );
    assert_eq!(
        reads(&app.graphql((8, "contractor"), READS).await),
        (expected, false, false)
    );
    assert_eq!(app.get_as("/api/user", 7, "away").await.status, 401);
    // GitLab deletes the newcomer: the next complete pass removes them.
    gitlab.rest.with(|d| d.users.retain(|u| u["id"] != 6));
    let report = sync(&app, &gitlab, &["acme"]).await.unwrap();
    assert_eq!(report.users, 7, "{report}");
    assert_eq!(app.get_as("/api/user", 6, "newcomer").await.status, 401);
}

#[tokio::test]
async fn a_sync_with_a_token_that_is_no_administrators_does_not_pretend() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    with_visibilities(&gitlab);
    gitlab.rest.with(|d| {
        d.users[2]["external"] = json!(true);
        d.users.push(rest::user(6, "newcomer", false));
    });
    let app = app_with_api(&gitlab).await;
    sync(&app, &gitlab, &[]).await.unwrap();
    let known = users(&app).await;
    assert!(
        known.contains(&"root active f admin".to_owned()),
        "{known:?}"
    );
    // Then envlens runs with a regular user's token. A new member of acme/apps/web, whom
    // GitLab knows as external, and someone GitLab has added since.
    gitlab.rest.with(|d| {
        let mut contractor = rest::user(8, "contractor", false);
        contractor["external"] = json!(true);
        d.users.push(contractor);
        d.users.push(rest::user(9, "later", false));
        d.project_members
            .get_mut(&42)
            .unwrap()
            .push(rest::member(8, "contractor", 30));
    });
    let calls_before = gitlab.rest.calls().len();
    let mut steps = Vec::new();
    let report = pass(
        &app.db,
        &api_with_token(&gitlab, rest::REGULAR_API_TOKEN),
        &Scope {
            groups: vec![],
            max_projects: 10_000,
            timeout: Duration::from_secs(60),
        },
        &Metrics::default(),
        &mut |s: &str| steps.push(s.to_owned()),
    )
    .await
    .unwrap();
    // GitLab shows such a token nobody's admin or external flag: the sync takes the users it
    // sees as members, says so, keeps what an administrator's pass knew, removes nobody, and
    // takes the new member as external until GitLab says otherwise.
    assert!(
        steps.iter().any(|s| s.starts_with("users: members only")),
        "{steps:?}"
    );
    let users_read: Vec<String> = gitlab.rest.calls()[calls_before..]
        .iter()
        .filter(|c| c.starts_with("/api/v4/users"))
        .cloned()
        .collect();
    assert!(users_read.is_empty(), "{users_read:?}");
    assert_eq!(report.users, 5, "{report}");
    assert_eq!(
        users(&app).await,
        [
            "root active f admin",
            "dev active f",
            "rep active t",
            "ops active f",
            "guest-min active f",
            "newcomer active f",
            "contractor active t",
        ]
    );
    let expected = vec!["production".to_owned(), "review/fix-login".to_owned()];
    assert_eq!(
        reads(&app.graphql((8, "contractor"), READS).await),
        (expected, false, false)
    );
}

#[tokio::test]
async fn users_gitlab_vouches_for_read_what_gitlab_lets_them() {
    let gitlab = TestGitLab::start().await;
    populate(&gitlab);
    with_visibilities(&gitlab);
    gitlab
        .rest
        .with(|d| d.users.push(rest::user(12, "proxyonly", false)));
    // envlens' own token is a regular user's: GitLab shows it no one's `external` flag.
    let app = crate::environment_lookup::app_with_token(&gitlab, rest::REGULAR_API_TOKEN).await;
    sync_with(&app, &gitlab, rest::REGULAR_API_TOKEN, &[])
        .await
        .unwrap();
    let ask = |token: &str| {
        axum::http::Request::post("/api/graphql")
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(axum::body::Body::from(
                json!({ "query": READS }).to_string(),
            ))
            .unwrap()
    };
    let expected = vec!["production".to_owned(), "review/fix-login".to_owned()];
    // A member of nothing with a GitLab token: public and internal projects, null for the
    // private one.
    gitlab.accept_token("glpat-newcomer", 10, "newcomer");
    let res = app.send(ask("glpat-newcomer")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(reads(&res.json()), (expected.clone(), true, false));
    // An external user (their own profile says so): no internal project.
    let mut outsider = crate::support::gitlab::own_user(&gitlab.url, 11, "outsider");
    outsider["external"] = json!(true);
    gitlab.add_token(
        "glpat-outsider",
        crate::support::gitlab::TestToken {
            user: outsider,
            kind: crate::support::gitlab::TokenKind::Access {
                scopes: vec!["api".into()],
                active: true,
            },
        },
    );
    let res = app.send(ask("glpat-outsider")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(reads(&res.json()), (expected.clone(), false, false));
    // A `k8s_proxy` token may not read its own profile: envlens reads the user with its own
    // token, whose answer has no `external` flag. Unknown, it opens nothing.
    gitlab.accept_access_token("glpat-proxyonly", 12, "proxyonly", &["k8s_proxy"]);
    let res = app
        .send(
            axum::http::Request::get("/k8s-proxy/api/v1/namespaces/shop/pods")
                .header("authorization", "Bearer glpat-proxyonly")
                .header("Gitlab-Agent-Id", "7")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 401, "{}", res.text());
    assert_eq!(
        users(&app).await.last().map(String::as_str),
        Some("proxyonly active t")
    );
    assert_eq!(
        reads(&app.graphql((12, "proxyonly"), READS).await),
        (expected, false, false)
    );
}
