//! The identity mirror: every system hook event GitLab sends, in GitLab's payload shapes, and
//! the bulk snapshot.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::*;

const IDENTITY: &str = "/api/v4/internal/identity";

async fn hook(app: &TestApp, body: Value) {
    let res = app.system_hook(&body).await;
    assert_eq!(res.status, 200, "{body}: {}", res.text());
    assert_eq!(res.json()["applied"], true);
}

fn group_create(id: i64, full_path: &str) -> Value {
    let path = full_path.rsplit('/').next().unwrap();
    json!({"created_at": "2026-11-21T10:00:00Z", "updated_at": "2026-11-21T10:00:00Z", "event_name": "group_create",
           "name": path, "path": path, "full_path": full_path, "group_id": id})
}

fn project_event(event: &str, id: i64, path_with_namespace: &str) -> Value {
    json!({"created_at": "2026-11-21T10:00:00Z", "updated_at": "2026-11-21T10:00:00Z", "event_name": event,
           "name": "App", "owner_email": "o@example.com", "owner_name": "Owner", "owners": [{"name": "Owner", "email": "o@example.com"}],
           "path": path_with_namespace.rsplit('/').next().unwrap(), "path_with_namespace": path_with_namespace,
           "project_id": id, "project_namespace_id": 900 + id, "project_visibility": "private"})
}

async fn groups(app: &TestApp) -> Vec<Value> {
    app.rows("SELECT id, parent_id, path, full_path, traversal_ids FROM namespaces ORDER BY id")
        .await
}

async fn projects(app: &TestApp) -> Vec<Value> {
    app.rows("SELECT id, namespace_id, path, full_path, visibility FROM projects ORDER BY id")
        .await
}

async fn members(app: &TestApp) -> Vec<Value> {
    app.rows("SELECT user_id, source_type, source_id, access_level FROM members ORDER BY 1, 2, 3")
        .await
}

#[tokio::test]
async fn groups_and_projects_form_a_hierarchy_from_their_paths() {
    let app = TestApp::new().await;
    hook(&app, group_create(1, "acme")).await;
    hook(&app, group_create(2, "acme/platform")).await;
    hook(
        &app,
        project_event("project_create", 10, "acme/platform/api"),
    )
    .await;
    hook(&app, project_event("project_create", 11, "jsmith/personal")).await;
    assert_eq!(
        groups(&app).await,
        vec![
            json!({"id": 1, "parent_id": null, "path": "acme", "full_path": "acme", "traversal_ids": [1]}),
            json!({"id": 2, "parent_id": 1, "path": "platform", "full_path": "acme/platform", "traversal_ids": [1, 2]}),
        ]
    );
    assert_eq!(
        projects(&app).await,
        vec![
            json!({"id": 10, "namespace_id": 2, "path": "api", "full_path": "acme/platform/api", "visibility": "private"}),
            json!({"id": 11, "namespace_id": null, "path": "personal", "full_path": "jsmith/personal", "visibility": "private"}),
        ]
    );
}

#[tokio::test]
async fn children_that_arrive_first_are_adopted_by_their_parent() {
    let app = TestApp::new().await;
    hook(
        &app,
        project_event("project_create", 10, "Acme/Platform/api"),
    )
    .await;
    hook(&app, group_create(2, "Acme/Platform")).await;
    hook(&app, group_create(1, "acme")).await;
    assert_eq!(groups(&app).await[1]["traversal_ids"], json!([1, 2]));
    assert_eq!(projects(&app).await[0]["namespace_id"], 2);
}

#[tokio::test]
async fn a_group_rename_moves_its_whole_subtree() {
    let app = TestApp::new().await;
    hook(&app, group_create(1, "acme")).await;
    hook(&app, group_create(2, "acme/platform")).await;
    hook(&app, group_create(3, "acme/platform/infra")).await;
    hook(&app, group_create(4, "other")).await;
    hook(
        &app,
        project_event("project_create", 10, "acme/platform/infra/api"),
    )
    .await;
    hook(
        &app,
        project_event("project_create", 11, "acme/platform-tools"),
    )
    .await;
    // A transfer of `platform` under `other`, with a new path.
    hook(&app, json!({"event_name": "group_rename", "group_id": 2, "path": "plat", "full_path": "other/plat",
                      "old_path": "platform", "old_full_path": "acme/platform", "name": "Plat",
                      "created_at": "2026-11-21T10:00:00Z", "updated_at": "2026-11-21T10:00:00Z"})).await;
    let g = groups(&app).await;
    assert_eq!(
        g[1],
        json!({"id": 2, "parent_id": 4, "path": "plat", "full_path": "other/plat", "traversal_ids": [4, 2]})
    );
    assert_eq!(
        g[2],
        json!({"id": 3, "parent_id": 2, "path": "infra", "full_path": "other/plat/infra", "traversal_ids": [4, 2, 3]})
    );
    let p = projects(&app).await;
    assert_eq!(p[0]["full_path"], "other/plat/infra/api");
    assert_eq!(p[0]["namespace_id"], 3);
    // A sibling whose path merely starts with the same letters stays put.
    assert_eq!(p[1]["full_path"], "acme/platform-tools");
    assert_eq!(p[1]["namespace_id"], 1);
}

#[tokio::test]
async fn project_rename_transfer_and_update() {
    let app = TestApp::new().await;
    hook(&app, group_create(1, "acme")).await;
    hook(&app, group_create(2, "beta")).await;
    hook(&app, project_event("project_create", 10, "acme/api")).await;
    let mut rename = project_event("project_rename", 10, "acme/api-v2");
    rename["old_path_with_namespace"] = json!("acme/api");
    hook(&app, rename).await;
    let mut transfer = project_event("project_transfer", 10, "beta/api-v2");
    transfer["old_path_with_namespace"] = json!("acme/api-v2");
    hook(&app, transfer).await;
    let mut update = project_event("project_update", 10, "beta/api-v2");
    update["project_visibility"] = json!("internal");
    hook(&app, update).await;
    assert_eq!(
        projects(&app).await,
        vec![
            json!({"id": 10, "namespace_id": 2, "path": "api-v2", "full_path": "beta/api-v2", "visibility": "internal"}),
        ]
    );
}

#[tokio::test]
async fn users_and_memberships() {
    let app = TestApp::new().await;
    hook(&app, json!({"event_name": "user_create", "user_id": 41, "username": "js", "name": "John", "email": "js@example.com"})).await;
    hook(&app, json!({"event_name": "user_rename", "user_id": 41, "username": "jsmith", "old_username": "js"})).await;
    let team = |event: &str, level: Option<&str>| {
        let mut body = json!({"event_name": event, "project_id": 74, "project_name": "StoreCloud", "project_path": "storecloud",
            "project_path_with_namespace": "jsmith/storecloud", "user_email": "js@example.com", "user_name": "John",
            "user_username": "jsmith", "user_id": 41, "project_visibility": "public"});
        if let Some(level) = level {
            body["access_level"] = json!(level);
        }
        body
    };
    let group = |event: &str, level: Option<&str>| {
        let mut body = json!({"event_name": event, "group_id": 78, "group_name": "StoreCloud", "group_path": "storecloud",
            "user_email": "js@example.com", "user_name": "John", "user_username": "jsmith", "user_id": 41});
        if let Some(level) = level {
            body["group_access"] = json!(level);
        }
        body
    };
    hook(&app, team("user_add_to_team", Some("Developer"))).await;
    hook(&app, group("user_add_to_group", Some("Reporter"))).await;
    assert_eq!(
        members(&app).await,
        vec![
            json!({"user_id": 41, "source_type": "group", "source_id": 78, "access_level": 20}),
            json!({"user_id": 41, "source_type": "project", "source_id": 74, "access_level": 30}),
        ]
    );
    // The membership event carried the project: it is mirrored too.
    assert_eq!(projects(&app).await[0]["visibility"], "public");
    hook(&app, team("user_update_for_team", Some("Maintainer"))).await;
    hook(&app, group("user_update_for_group", Some("Owner"))).await;
    assert_eq!(
        members(&app)
            .await
            .iter()
            .map(|m| m["access_level"].clone())
            .collect::<Vec<_>>(),
        vec![json!(50), json!(40)]
    );
    hook(&app, team("user_remove_from_team", None)).await;
    assert_eq!(members(&app).await.len(), 1);
    hook(&app, group("user_remove_from_group", None)).await;
    assert!(members(&app).await.is_empty());
    assert_eq!(
        app.rows("SELECT username, admin FROM users").await,
        vec![json!({"username": "jsmith", "admin": false})]
    );
}

#[tokio::test]
async fn destroys_remove_members() {
    let app = TestApp::new().await;
    app.internal(Method::PUT, IDENTITY, &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/sub"}, {"id": 3, "full_path": "zeta"}],
        "projects": [{"id": 10, "full_path": "acme/sub/api", "visibility": "private"}, {"id": 11, "full_path": "zeta/web", "visibility": "public"}],
        "users": [{"id": 5, "username": "ann"}, {"id": 6, "username": "bo"}],
        "members": [
            {"user_id": 5, "source_type": "group", "source_id": 1, "access_level": 30},
            {"user_id": 5, "source_type": "group", "source_id": 2, "access_level": 30},
            {"user_id": 5, "source_type": "project", "source_id": 10, "access_level": 40},
            {"user_id": 6, "source_type": "project", "source_id": 11, "access_level": 40},
            {"user_id": 6, "source_type": "group", "source_id": 3, "access_level": 10}
        ]
    })).await;
    hook(&app, json!({"event_name": "group_destroy", "group_id": 1, "full_path": "acme", "path": "acme", "name": "Acme"})).await;
    assert_eq!(groups(&app).await.len(), 1);
    assert_eq!(projects(&app).await.len(), 1);
    assert_eq!(members(&app).await.len(), 2);
    hook(&app, project_event("project_destroy", 11, "zeta/web")).await;
    assert_eq!(
        members(&app).await,
        vec![json!({"user_id": 6, "source_type": "group", "source_id": 3, "access_level": 10})]
    );
    hook(&app, json!({"event_name": "user_destroy", "user_id": 6, "username": "bo", "name": "Bo", "email": "bo@example.com"})).await;
    assert!(members(&app).await.is_empty());
    assert_eq!(
        app.rows("SELECT id FROM users").await,
        vec![json!({"id": 5})]
    );
}

#[tokio::test]
async fn a_redelivery_changes_nothing_twice() {
    let app = TestApp::new().await;
    let rename = |name: &str| {
        json!({"event_name": "user_rename", "user_id": 1, "username": name, "old_username": "x"})
            .to_string()
    };
    hook(
        &app,
        json!({"event_name": "user_create", "user_id": 1, "username": "first"}),
    )
    .await;
    assert_eq!(
        app.hook("System Hook", rename("second"), Some("uuid-1"))
            .await
            .json()["applied"],
        true
    );
    assert_eq!(
        app.hook("System Hook", rename("third"), Some("uuid-2"))
            .await
            .json()["applied"],
        true
    );
    // uuid-1 again, late: it must not undo the newer rename.
    let again = app
        .hook("System Hook", rename("second"), Some("uuid-1"))
        .await;
    assert_eq!(
        (again.status.as_u16(), again.json()["applied"].clone()),
        (200, json!(false))
    );
    assert_eq!(
        app.rows("SELECT username FROM users").await,
        vec![json!({"username": "third"})]
    );
}

#[tokio::test]
async fn concurrent_duplicate_deliveries_apply_once() {
    let app = TestApp::new().await;
    let body = json!({"event_name": "user_create", "user_id": 1, "username": "ann"}).to_string();
    let sends = (0..8).map(|_| app.hook("System Hook", body.clone(), Some("same-uuid")));
    let results = futures_util::future::join_all(sends).await;
    let applied = results
        .iter()
        .filter(|r| r.json()["applied"] == true)
        .count();
    assert!(results.iter().all(|r| r.status == 200));
    assert_eq!(applied, 1);
    assert_eq!(
        app.rows("SELECT count(*) AS n FROM webhook_deliveries")
            .await,
        vec![json!({"n": 1})]
    );
}

#[tokio::test]
async fn events_it_does_not_mirror_are_acknowledged_and_ignored() {
    let app = TestApp::new().await;
    let before = app.fingerprint().await;
    for body in [
        json!({"event_name": "key_create", "id": 4, "key": "ssh-rsa ..."}),
        json!({"event_name": "repository_update", "changes": []}),
    ] {
        let res = app.system_hook(&body).await;
        assert_eq!(
            (res.status.as_u16(), res.json()["applied"].clone()),
            (202, json!(false))
        );
    }
    let res = app
        .hook(
            "Push Hook",
            json!({"object_kind": "push"}).to_string(),
            None,
        )
        .await;
    assert_eq!(res.status, 202);
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn bad_hooks_get_their_status_and_change_nothing() {
    let app = TestApp::new().await;
    hook(&app, group_create(1, "acme")).await;
    let before = app.fingerprint().await;
    let cases = [
        ("{\"event_name\": ", 400, None),
        ("[1, 2]", 422, Some("")),
        ("{\"user_id\": 1}", 422, Some("event_name")),
        (
            r#"{"event_name": "user_add_to_team", "user_id": 1, "user_username": "a", "project_id": 3}"#,
            422,
            Some("access_level"),
        ),
        (
            r#"{"event_name": "user_create", "user_id": 1}"#,
            422,
            Some("username"),
        ),
        (
            r#"{"event_name": "user_create", "user_id": "one", "username": "a"}"#,
            422,
            Some("user_id"),
        ),
        (
            r#"{"event_name": "user_create", "user_id": -1, "username": "a"}"#,
            422,
            Some("user_id"),
        ),
        (
            r#"{"event_name": "user_create", "user_id": 1, "username": " "}"#,
            422,
            Some("username"),
        ),
        (
            r#"{"event_name": "group_create", "group_id": 2, "full_path": "acme//x"}"#,
            422,
            Some("full_path"),
        ),
        (
            r#"{"event_name": "user_add_to_group", "user_id": 1, "user_username": "a", "group_id": 3}"#,
            422,
            Some("group_access"),
        ),
    ];
    for (body, status, field) in cases {
        let res = app
            .hook("System Hook", body.to_owned(), Some("uuid-bad"))
            .await;
        let error = res.error(status);
        if let Some(field) = field {
            assert_eq!(error["field"], field, "{body}");
        }
    }
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn bulk_snapshot_upserts_everything_in_one_go() {
    let app = TestApp::new().await;
    hook(
        &app,
        json!({"event_name": "user_create", "user_id": 9, "username": "kept"}),
    )
    .await;
    let res = app.internal(Method::PUT, IDENTITY, &json!({
        "groups": [{"id": 2, "full_path": "acme/sub"}, {"id": 1, "full_path": "acme"}],
        "projects": [{"id": 10, "full_path": "acme/sub/api", "visibility": "internal"}],
        "users": [{"id": 5, "username": "ann", "admin": true}],
        "members": [{"user_id": 9, "source_type": "group", "source_id": 1, "access_level": 30}]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"groups": 2, "projects": 1, "users": 1, "members": 1})
    );
    assert_eq!(groups(&app).await[1]["traversal_ids"], json!([1, 2]));
    assert_eq!(projects(&app).await[0]["namespace_id"], 2);
    // Rows the snapshot does not name stay.
    assert_eq!(
        app.rows("SELECT id, admin FROM users ORDER BY id").await,
        vec![
            json!({"id": 5, "admin": true}),
            json!({"id": 9, "admin": false})
        ]
    );
}

#[tokio::test]
async fn a_bad_snapshot_changes_nothing_and_names_the_field() {
    let app = TestApp::new().await;
    let before = app.fingerprint().await;
    let cases = [
        (
            json!({"projects": [{"id": 1, "full_path": "a/b", "visibility": "hidden"}]}),
            "projects[0].visibility",
        ),
        (
            json!({"projects": [{"id": 1, "full_path": "a/b"}]}),
            "projects[0].visibility",
        ),
        (
            json!({"groups": [{"id": 1, "full_path": "a"}, {"id": 1, "full_path": "b"}]}),
            "groups[1].id",
        ),
        (
            json!({"groups": [{"id": 1, "full_path": "a"}, {"id": 2, "full_path": "A"}]}),
            "groups[1].full_path",
        ),
        (
            json!({"users": [{"id": 0, "username": "x"}]}),
            "users[0].id",
        ),
        (
            json!({"members": [{"user_id": 1, "source_type": "team", "source_id": 1, "access_level": 30}]}),
            "members[0].source_type",
        ),
        (
            json!({"members": [{"user_id": 1, "source_type": "group", "source_id": 1, "access_level": 31}]}),
            "members[0].access_level",
        ),
        (
            json!({"users": [{"id": 1, "username": "a"}], "members": [{"user_id": 1, "source_type": "group", "source_id": 1, "access_level": 30}, {"user_id": 2, "source_type": "group", "source_id": 1, "access_level": 30}]}),
            "members[1].user_id",
        ),
        (json!({"teams": []}), "teams"),
    ];
    for (body, field) in cases {
        let res = app.internal(Method::PUT, IDENTITY, &body).await;
        assert_eq!(res.error(422)["field"], field, "{body}");
    }
    let res = app
        .internal_raw(
            Method::PUT,
            IDENTITY,
            &internal_token(),
            "{\"users\": [".into(),
        )
        .await;
    assert_eq!(res.error(400)["code"], "bad_request");
    assert_eq!(app.fingerprint().await, before);
}
