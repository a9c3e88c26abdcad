//! SPEC 13, "Webhook tokens per source": the Owner of group `b` holds `b`'s webhook token
//! (`gitlab.webhooks` in the configuration file) and sends, to `/webhooks/gitlab`, whatever
//! they like under it. Only events inside `b`'s subtree are applied; the rest is a 403 that
//! changes nothing. The instance's token still does everything.
//!
//! The payloads are GitLab's documented shapes (`doc/user/project/integrations/
//! webhook_events.md`: group member, project, subgroup, deployment and push events, as
//! `gitlab_sync` and `ci_deployments` send them).

use axum::http::Method;
use envlens::config::Limits;
use envlens::gitlab::Instance;
use envlens::state::AppState;
use serde_json::{json, Value};

use crate::environment_lookup::api;
use crate::support::gitlab::TestGitLab;
use crate::support::{keys, postgres, TestApp};

const B_TOKEN: &str = "token-of-group-b-owners";

struct World {
    app: TestApp,
    gitlab: TestGitLab,
    /// Holds the token file.
    _dir: tempfile::TempDir,
}

/// The mirror: groups `a` (1), `b` (2), `b/sub` (3); projects `a/agents` (10), `a/app` (20),
/// `b/app` (30); users mallory (1, Owner of `b`), alice (2, Owner of `a`), dev (3, no
/// membership). envlens reads its configuration file, whose `gitlab.webhooks` gives `b` a
/// token, and can reach GitLab (a push's follow-up needs it).
async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("b-token");
    std::fs::write(&token_file, format!("{B_TOKEN}\n")).unwrap();
    let gitlab = TestGitLab::start().await;
    let yaml = format!(
        "gitlab:\n  url: {}\n  webhooks:\n    - group: b\n      token_file: {}\n",
        gitlab.url,
        token_file.display()
    );
    let settings = envlens::config::file::Settings::parse(&yaml).unwrap();
    let keys = keys()
        .with_group_webhooks(envlens::cli::group_webhooks(&settings).unwrap())
        .unwrap();
    let database = postgres::fresh_database().await;
    let instance = Instance::new(
        api(&gitlab),
        "https://envlens.example.com",
        std::time::Duration::from_secs(60),
        None,
    );
    let state = AppState::new((*database).clone(), keys, Limits::default()).with_gitlab(instance);
    let app = TestApp::owning(state, database);
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/identity",
            &json!({
                "groups": [{"id": 1, "full_path": "a"}, {"id": 2, "full_path": "b"},
                           {"id": 3, "full_path": "b/sub"}],
                "projects": [{"id": 10, "full_path": "a/agents", "visibility": "private"},
                             {"id": 20, "full_path": "a/app", "visibility": "private"},
                             {"id": 30, "full_path": "b/app", "visibility": "private"}],
                "users": [{"id": 1, "username": "mallory"}, {"id": 2, "username": "alice"},
                          {"id": 3, "username": "dev"}],
                "members": [{"user_id": 1, "source_type": "group", "source_id": 2, "access_level": 50},
                            {"user_id": 2, "source_type": "group", "source_id": 1, "access_level": 50}]
            }),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    World {
        app,
        gitlab,
        _dir: dir,
    }
}

/// GitLab's group member event (`user_add_to_group`) for `group` (id, path) and `user`.
fn member_hook(group: (i64, &str), user: (i64, &str), access: &str) -> Value {
    json!({"created_at": "2026-11-20T04:57:22Z", "updated_at": "2026-11-20T04:57:22Z",
        "group_name": group.1, "group_path": group.1, "group_id": group.0,
        "user_username": user.1, "user_name": user.1, "user_email": format!("{}@example.com", user.1),
        "user_id": user.0, "group_access": access, "group_plan": null, "expires_at": null,
        "event_name": "user_add_to_group"})
}

/// A project event moving `project` from `from` to `to` (GitLab's `project_transfer` shape).
fn transfer(project: i64, from: &str, to: &str) -> Value {
    json!({"created_at": "2026-11-20T10:43:48Z", "updated_at": "2026-11-20T10:43:48Z",
        "event_name": "project_transfer", "name": "app", "path": "app",
        "path_with_namespace": to, "project_id": project, "project_namespace_id": 52,
        "owners": [{"name": "Mallory", "email": "mallory@example.com"}],
        "project_visibility": "private", "old_path_with_namespace": from})
}

/// GitLab's deployment event for `project` (id, path).
fn deployment_hook(id: i64, project: (i64, &str)) -> Value {
    json!({"object_kind": "deployment", "status": "success", "status_changed_at": "2026-11-24 10:00:00 +0100",
        "deployment_id": id, "deployable_id": 700 + id,
        "deployable_url": format!("https://gitlab.example.com/{}/-/jobs/{}", project.1, 700 + id),
        "environment": "production", "environment_tier": "production", "environment_slug": "production",
        "environment_external_url": null,
        "project": {"id": project.0, "name": "app", "path_with_namespace": project.1, "visibility_level": 0},
        "short_sha": "714a629c", "user": {"id": 1, "username": "mallory"}, "user_url": "https://gitlab.example.com/mallory",
        "commit_url": "https://gitlab.example.com/c", "commit_title": "Deploy", "ref": "main"})
}

/// GitLab's push event to `project`'s default branch, touching an agent's configuration file.
fn agent_push(project: (i64, &str)) -> Value {
    json!({"object_kind": "push", "event_name": "push",
        "before": "95790bf891e76fee5e1747ab589903a6a1f80f22", "after": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
        "ref": "refs/heads/main", "ref_protected": true, "checkout_sha": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
        "user_id": 1, "user_name": "Mallory", "user_username": "mallory", "user_email": "m@example.com", "user_avatar": null,
        "project_id": project.0,
        "project": {"id": project.0, "name": "agents", "description": "", "web_url": "https://gitlab.example.com/x",
                    "avatar_url": null, "namespace": "x", "visibility_level": 0,
                    "path_with_namespace": project.1, "default_branch": "main"},
        "repository": {"name": "agents", "url": "git@gitlab.example.com:x.git", "visibility_level": 0},
        "commits": [{"id": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7", "message": "m", "title": "m",
                     "timestamp": "2026-11-24T10:00:00+01:00", "url": "https://gitlab.example.com/c",
                     "author": {"name": "Mallory", "email": "m@example.com"},
                     "added": [], "modified": [".gitlab/agents/prod/config.yaml"], "removed": []}],
        "total_commits_count": 1})
}

/// Sends `body` as `event` under `b`'s token, expects a 403 in SPEC 3's shape, and checks
/// that nothing changed (the delivery id included).
async fn refused(w: &World, event: &str, body: &Value) {
    let before = w.app.fingerprint().await;
    let followups_before = followups(&w.app).await;
    let res = w
        .app
        .hook_with(B_TOKEN, event, body.to_string(), Some("delivery-1"))
        .await;
    assert_eq!(
        res.error(403)["code"],
        "forbidden",
        "{event}: {}",
        res.text()
    );
    assert_eq!(
        w.app.fingerprint().await,
        before,
        "{event} changed the mirror"
    );
    assert_eq!(followups(&w.app).await, followups_before);
}

async fn followups(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM gitlab_followups")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

async fn members(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT format('%s %s %s %s', user_id, source_type, source_id, access_level) FROM members ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_groups_token_cannot_make_its_owner_owner_of_another_group() {
    let w = world().await;
    // The attack: mallory, Owner of b, makes herself Owner of a.
    refused(
        &w,
        "Member Hook",
        &member_hook((1, "a"), (1, "mallory"), "Owner"),
    )
    .await;
    // The same under another kind of event, and for a user the mirror lacks.
    refused(
        &w,
        "Subgroup Hook",
        &member_hook((1, "a"), (1, "mallory"), "Owner"),
    )
    .await;
    refused(
        &w,
        "Member Hook",
        &member_hook((1, "a"), (9, "eve"), "Owner"),
    )
    .await;
    // A user account is the instance's: creating or renaming one is refused.
    let user_create = json!({"event_name": "user_create", "created_at": "2026-11-20T04:57:22Z",
        "updated_at": "2026-11-20T04:57:22Z", "name": "Alice", "email": "a@example.com",
        "user_id": 2, "username": "mallory-now"});
    refused(&w, "Member Hook", &user_create).await;
    assert_eq!(members(&w.app).await, ["1 group 2 50", "2 group 1 50"]);
}

#[tokio::test]
async fn a_groups_token_changes_its_own_subtree() {
    let w = world().await;
    let res = w
        .app
        .hook_with(
            B_TOKEN,
            "Member Hook",
            member_hook((3, "sub"), (3, "dev"), "Developer").to_string(),
            None,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["outcome"], "applied");
    assert_eq!(
        members(&w.app).await,
        ["1 group 2 50", "2 group 1 50", "3 group 3 30"]
    );
    // A user the mirror lacks is not created: acknowledged, not applied.
    let before = w.app.fingerprint().await;
    let res = w
        .app
        .hook_with(
            B_TOKEN,
            "Member Hook",
            member_hook((3, "sub"), (9, "eve"), "Developer").to_string(),
            None,
        )
        .await;
    assert_eq!(
        (res.status.as_u16(), res.json()["outcome"].clone()),
        (202, json!("unapplied"))
    );
    assert_eq!(w.app.fingerprint().await, before);
    // Nor is a known one renamed by the payload's username.
    let res = w
        .app
        .hook_with(
            B_TOKEN,
            "Member Hook",
            member_hook((2, "b"), (3, "root"), "Maintainer").to_string(),
            None,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let name: String = sqlx::query_scalar("SELECT username FROM users WHERE id = 3")
        .fetch_one(&w.app.db)
        .await
        .unwrap();
    assert_eq!(name, "dev");
    // A move inside the subtree is the group's own business.
    let res = w
        .app
        .hook_with(
            B_TOKEN,
            "Project Hook",
            transfer(30, "b/app", "b/sub/app").to_string(),
            None,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

#[tokio::test]
async fn a_groups_token_cannot_move_projects_across_its_border() {
    let w = world().await;
    // Out of b, into a.
    refused(&w, "Project Hook", &transfer(30, "b/app", "a/app-stolen")).await;
    // a's project into b, whatever the payload says it was.
    refused(&w, "Project Hook", &transfer(20, "b/app2", "b/app2")).await;
    refused(&w, "Project Hook", &transfer(20, "a/app", "b/app2")).await;
    // a's project "created" under b; a's group "created" under b; a's project destroyed.
    let mut create = transfer(20, "b/x", "b/x");
    create["event_name"] = json!("project_create");
    refused(&w, "Project Hook", &create).await;
    let subgroup = json!({"created_at": "2026-11-20T09:40:12Z", "updated_at": "2026-11-20T09:40:12Z",
        "event_name": "subgroup_create", "name": "a", "path": "a", "full_path": "b/a",
        "group_id": 1, "parent_group_id": 2, "parent_name": "b", "parent_path": "b", "parent_full_path": "b"});
    refused(&w, "Subgroup Hook", &subgroup).await;
    let mut destroy = transfer(20, "a/app", "a/app");
    destroy["event_name"] = json!("project_destroy");
    refused(&w, "Project Hook", &destroy).await;
}

#[tokio::test]
async fn a_groups_token_sends_no_system_hook() {
    let w = world().await;
    let group_create = json!({"event_name": "group_create", "created_at": "2026-11-20T09:40:12Z",
        "updated_at": "2026-11-20T09:40:12Z", "name": "sub2", "path": "sub2", "full_path": "b/sub2", "group_id": 4});
    // Even one that names only b's subtree.
    refused(&w, "System Hook", &group_create).await;
}

#[tokio::test]
async fn a_groups_token_reports_no_deployment_and_no_push_outside_it() {
    let w = world().await;
    refused(&w, "Deployment Hook", &deployment_hook(1, (20, "a/app"))).await;
    // a's project under b's path.
    refused(&w, "Deployment Hook", &deployment_hook(2, (20, "b/app"))).await;
    // An agent's configuration outside b: not read again, GitLab not asked.
    let asked = w.gitlab.rest.calls().len();
    refused(&w, "Push Hook", &agent_push((10, "a/agents"))).await;
    refused(&w, "Push Hook", &agent_push((10, "b/agents"))).await;
    assert_eq!(w.gitlab.rest.calls().len(), asked);
    // Inside b: the deployment is recorded.
    let res = w
        .app
        .hook_with(
            B_TOKEN,
            "Deployment Hook",
            deployment_hook(3, (30, "b/app")).to_string(),
            None,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // A deployment of b's project that names a's deployment: refused.
    w.app
        .hook(
            "Deployment Hook",
            deployment_hook(4, (20, "a/app")).to_string(),
            None,
        )
        .await;
    refused(&w, "Deployment Hook", &deployment_hook(4, (30, "b/app"))).await;
}

#[tokio::test]
async fn the_instance_token_still_does_everything() {
    let w = world().await;
    for (event, body) in [
        (
            "Member Hook",
            member_hook((1, "a"), (1, "mallory"), "Owner"),
        ),
        ("Project Hook", transfer(30, "b/app", "a/app2")),
        ("Deployment Hook", deployment_hook(1, (20, "a/app"))),
    ] {
        let res = w.app.hook(event, body.to_string(), None).await;
        assert_eq!(res.status, 200, "{event}: {}", res.text());
        assert_eq!(res.json()["outcome"], "applied", "{event}");
    }
    let res = w
        .app
        .hook(
            "Member Hook",
            member_hook((1, "a"), (9, "eve"), "Developer").to_string(),
            None,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = w
        .app
        .hook("Push Hook", agent_push((10, "a/agents")).to_string(), None)
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["outcome"], "applied");
    // A token nobody configured stays a 401.
    let res = w
        .app
        .hook_with("token-of-group-b-owner", "Member Hook", "{}".into(), None)
        .await;
    assert_eq!(res.error(401)["code"], "unauthorized");
}
