//! GitLab's documented system hook payloads (`doc/administration/system_hooks.md`, current and
//! older versions), every file posted in the document's order: the answer to each, and exactly
//! the rows of the mirror each one adds and removes. Then events envlens does not know, events
//! it cannot apply, and their counts in `/metrics`.
//!
//! The payloads are fixtures of our own, committed in `tests/fixtures/system_hooks/<version>/`
//! as `NN-<event>.json`: written from GitLab's documented examples of each version (the same
//! events in the same order, the same keys, value types and nesting) with names, ids and other
//! values of ours, as GitLab's text is not committed here; the folder's README names the
//! document and commit each version was read from. When this machine also has GitLab's own
//! copies (the folder `ENVLENS_GITLAB_MATERIAL` names, else `material/gitlab` of the `shared/`
//! folder beside the checkout, holding `system_hooks/<version>/`), the same steps run on them
//! as well, GitLab's example names and ids read as ours ([`OURS`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::Request;
use serde_json::{json, Value};

use crate::support::*;

/// One version's payloads: a folder of `NN-<event>.json` files.
struct Payloads {
    dir: PathBuf,
    /// GitLab's own copies, with GitLab's example names and ids.
    gitlab: bool,
}

/// GitLab's documented payloads as GitLab wrote them, when this machine has them.
pub fn gitlab_material() -> Option<PathBuf> {
    [
        std::env::var_os("ENVLENS_GITLAB_MATERIAL").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/material/gitlab")),
    ]
    .into_iter()
    .flatten()
    .find(|dir| dir.is_dir())
}

/// A version's payloads: our fixtures (folder `ours`), always; GitLab's own (folder `gitlab` of
/// the material) too when this machine has them.
fn payloads(ours: &str, gitlab: &str) -> Vec<Payloads> {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/system_hooks")
        .join(ours);
    assert!(committed.is_dir(), "{} is missing", committed.display());
    let mut found = vec![Payloads {
        dir: committed,
        gitlab: false,
    }];
    match gitlab_material().map(|m| m.join("system_hooks").join(gitlab)) {
        Some(dir) if dir.is_dir() => found.push(Payloads { dir, gitlab: true }),
        _ => eprintln!("GitLab's own {gitlab} payloads are not on this machine: ours only"),
    }
    found
}

/// GitLab's example names and ids, and ours in their place in the fixtures: rows of the mirror
/// written from GitLab's own payloads are read through this, so one table of expected rows
/// holds for both.
const OURS: &[(&str, &str)] = &[
    ("74", "512"),
    ("73", "511"),
    ("41", "230"),
    ("26", "231"),
    ("58", "232"),
    ("78", "640"),
    ("{78}", "{640}"),
    ("64", "641"),
    ("{64}", "{641}"),
    ("jsmith/storecloud", "rtanaka/kelp-forest"),
    ("jsmith/underscore", "rtanaka/tide-tables"),
    ("scores/underscore", "almanac/tide-tables"),
    ("johnsmith", "rtanaka"),
    ("js", "rei"),
    ("user4", "mbrandt"),
    ("new-exciting-name", "sol-ortega"),
    ("storecloud", "kelp"),
    ("parent-group/better-name", "seaside/lighthouse"),
];

fn as_ours(line: &str) -> String {
    line.split(' ')
        .map(|word| {
            OURS.iter()
                .find(|(gitlab, _)| *gitlab == word)
                .map_or(word, |(_, ours)| ours)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The mirror as one line per row, so that a step's effect is a set difference.
async fn mirror(app: &TestApp, payloads: &Payloads) -> BTreeSet<String> {
    let lines: Vec<String> = sqlx::query_scalar(
        "SELECT format('group %s %s parent=%s %s', id, full_path, coalesce(parent_id::text, '-'), traversal_ids::text) FROM namespaces
         UNION ALL SELECT format('project %s %s %s ns=%s', id, full_path, visibility, coalesce(namespace_id::text, '-')) FROM projects
         UNION ALL SELECT format('user %s %s%s%s', id, username, CASE WHEN admin THEN ' admin' ELSE '' END,
                                 CASE WHEN state <> 'active' THEN ' ' || state ELSE '' END) FROM users
         UNION ALL SELECT format('member %s %s %s %s', user_id, source_type, source_id, access_level) FROM members",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    lines
        .into_iter()
        .map(|l| if payloads.gitlab { as_ours(&l) } else { l })
        .collect()
}

fn rows(lines: &[&str]) -> BTreeSet<String> {
    lines.iter().map(|l| l.to_string()).collect()
}

/// One fixture: its file, the answer (`applied` 200, `ignored` 202, or an error status), and
/// the rows it adds (`+...`) and removes (`-...`).
type Step = (&'static str, &'static str, &'static [&'static str]);

async fn post_in_order(payloads: &Payloads, steps: &[Step]) -> TestApp {
    let dir = &payloads.dir;
    let version = dir.display();
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".json") || name.ends_with(".txt"))
        .collect();
    files.sort();
    let named: Vec<String> = steps.iter().map(|s| s.0.to_owned()).collect();
    assert_eq!(
        named, files,
        "every payload of {version}, in order, has its expectations"
    );

    let app = TestApp::new().await;
    for (file, answer, delta) in steps {
        let body = std::fs::read_to_string(dir.join(file)).unwrap();
        let before = mirror(&app, payloads).await;
        let res = app.hook("System Hook", body, None).await;
        let got = match (res.status.as_u16(), res.json().get("outcome")) {
            (200, Some(Value::String(o))) if o == "applied" => "applied".to_owned(),
            (202, Some(Value::String(o))) if o == "ignored" => "ignored".to_owned(),
            (status, _) => format!("{status} {}", res.text()),
        };
        let after = mirror(&app, payloads).await;
        let mut changes: Vec<String> = after.difference(&before).map(|l| format!("+{l}")).collect();
        changes.extend(before.difference(&after).map(|l| format!("-{l}")));
        changes.sort();
        let mut expected: Vec<String> = delta.iter().map(|s| s.to_string()).collect();
        expected.sort();
        let got = (got.as_str(), changes);
        if answer.starts_with('4') {
            assert!(got.0.starts_with(answer), "{version}/{file}: {}", got.0);
            assert_eq!(got.1, expected, "{version}/{file}");
        } else {
            assert_eq!(got, (*answer, expected), "{version}/{file}");
        }
    }
    app
}

async fn metrics(app: &TestApp) -> String {
    app.send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .text()
}

#[track_caller]
fn counted(metrics: &str, event: &str, outcome: &str, n: u64) {
    let line =
        format!("envlens_webhook_events_total{{event=\"{event}\",outcome=\"{outcome}\"}} {n}\n");
    assert!(metrics.contains(&line), "no `{line}` in:\n{metrics}");
}

const KELP_FOREST: &str = "project 512 rtanaka/kelp-forest private ns=-";
const TIDE_TABLES_MOVED: &str = "project 511 almanac/tide-tables internal ns=-";
const RTANAKA: &str = "user 230 rtanaka";
const MAINTAINER_640: &str = "member 230 group 640 40";
const LIGHTHOUSE: &str = "group 641 seaside/lighthouse parent=- {641}";
const RENAMED: &str = "user 232 sol-ortega";
const BLOCKED: &str = "user 231 mbrandt blocked";

/// The current document's payloads, in its order, and what each writes.
const CURRENT: &[Step] = &[
    (
        "01-project_create.json",
        "applied",
        &["+project 512 rtanaka/kelp-forest private ns=-"],
    ),
    ("02-project_destroy.json", "applied", &[]),
    (
        "03-project_rename.json",
        "applied",
        &["+project 511 rtanaka/tide-tables internal ns=-"],
    ),
    (
        "04-project_transfer.json",
        "applied",
        &[
            "+project 511 almanac/tide-tables internal ns=-",
            "-project 511 rtanaka/tide-tables internal ns=-",
        ],
    ),
    ("05-project_update.json", "applied", &[]),
    (
        "06-user_access_request_revoked_for_group.json",
        "ignored",
        &[],
    ),
    (
        "07-user_access_request_revoked_for_project.json",
        "ignored",
        &[],
    ),
    ("08-user_access_request_to_group.json", "ignored", &[]),
    ("09-user_access_request_to_project.json", "ignored", &[]),
    (
        "10-user_add_to_team.json",
        "applied",
        &["+user 230 rtanaka", "+member 230 project 512 40"],
    ),
    (
        "11-user_remove_from_team.json",
        "applied",
        &["-member 230 project 512 40"],
    ),
    (
        "12-user_update_for_team.json",
        "applied",
        &["+member 230 project 512 40"],
    ),
    (
        "13-user_create.json",
        "applied",
        &["+user 230 rei", "-user 230 rtanaka"],
    ),
    (
        "14-user_destroy.json",
        "applied",
        &["-user 230 rei", "-member 230 project 512 40"],
    ),
    (
        "15-user_failed_login.json",
        "applied",
        &["+user 231 mbrandt blocked"],
    ),
    ("16-user_rename.json", "applied", &["+user 232 sol-ortega"]),
    ("17-key_create.json", "ignored", &[]),
    ("18-key_destroy.json", "ignored", &[]),
    // No `full_path` in the document: a top-level group's `path` is its full path.
    (
        "19-group_create.json",
        "applied",
        &["+group 640 kelp parent=- {640}"],
    ),
    (
        "20-group_destroy.json",
        "applied",
        &["-group 640 kelp parent=- {640}"],
    ),
    (
        "21-group_rename.json",
        "applied",
        &["+group 641 seaside/lighthouse parent=- {641}"],
    ),
    // A membership of a group the mirror does not have (any more) is kept: GitLab
    // delivers hooks from background jobs, in no fixed order.
    (
        "22-user_add_to_group.json",
        "applied",
        &["+user 230 rtanaka", "+member 230 group 640 40"],
    ),
    (
        "23-user_remove_from_group.json",
        "applied",
        &["-member 230 group 640 40"],
    ),
    (
        "24-user_update_for_group.json",
        "applied",
        &["+member 230 group 640 40"],
    ),
    ("25-push.json", "ignored", &[]),
    ("26-tag_push.json", "ignored", &[]),
    // `object_kind`, no `event_name`: sent when "merge request events" is ticked.
    ("27-merge_request.json", "ignored", &[]),
    ("28-repository_update.json", "ignored", &[]),
    (
        "29-gitlab_subscription_member_approval.json",
        "ignored",
        &[],
    ),
    (
        "30-gitlab_subscription_member_approvals.json",
        "ignored",
        &[],
    ),
    (
        "31-gitlab_subscription_member_approvals.json",
        "ignored",
        &[],
    ),
];

#[tokio::test]
async fn current_documented_payloads() {
    for payloads in payloads("current", "current") {
        let app = post_in_order(&payloads, CURRENT).await;
        assert_eq!(
            mirror(&app, &payloads).await,
            rows(&[
                TIDE_TABLES_MOVED,
                KELP_FOREST,
                LIGHTHOUSE,
                RTANAKA,
                RENAMED,
                BLOCKED,
                MAINTAINER_640
            ])
        );
        let m = metrics(&app).await;
        counted(&m, "project_create", "applied", 1);
        counted(&m, "user_add_to_team", "applied", 1);
        counted(&m, "merge_request", "ignored", 1);
        counted(&m, "user_access_request_to_group", "ignored", 1);
        counted(&m, "gitlab_subscription_member_approvals", "ignored", 2);
        assert!(!m.contains("outcome=\"rejected\""), "{m}");
    }
}

/// GitLab 12–13: the document shows `project_visibility: "visibilitylevel|private"`, a value
/// envlens does not know: the project is mirrored with the visibility the mirror has (private
/// when new), and the membership is applied.
#[tokio::test]
async fn gitlab_12_documented_payloads() {
    for payloads in payloads("gitlab-12", "old-014ab2eb067") {
        post_in_order(
            &payloads,
            &[
                (
                    "06-user_add_to_team.json",
                    "applied",
                    &[
                        "+user 230 rtanaka",
                        "+project 512 rtanaka/kelp-forest private ns=-",
                        "+member 230 project 512 40",
                    ],
                ),
                (
                    "07-user_remove_from_team.json",
                    "applied",
                    &["-member 230 project 512 40"],
                ),
            ],
        )
        .await;
    }
}

/// The payloads GitLab 10.4 to 11.8 documented (their files are numbered alike), and what
/// each writes.
const GITLAB_10_4_TO_11_8: &[Step] = &[
    (
        "01-project_create.json",
        "applied",
        &["+project 512 rtanaka/kelp-forest private ns=-"],
    ),
    ("02-project_destroy.json", "applied", &[]),
    (
        "03-project_rename.json",
        "applied",
        &["+project 511 rtanaka/tide-tables internal ns=-"],
    ),
    (
        "04-project_transfer.json",
        "applied",
        &[
            "+project 511 almanac/tide-tables internal ns=-",
            "-project 511 rtanaka/tide-tables internal ns=-",
        ],
    ),
    ("05-project_update.json", "applied", &[]),
    (
        "06-user_add_to_team.json",
        "applied",
        &["+user 230 rtanaka", "+member 230 project 512 40"],
    ),
    (
        "07-user_remove_from_team.json",
        "applied",
        &["-member 230 project 512 40"],
    ),
    (
        "08-user_create.json",
        "applied",
        &["+user 230 rei", "-user 230 rtanaka"],
    ),
    ("09-user_destroy.json", "applied", &["-user 230 rei"]),
    (
        "10-user_failed_login.json",
        "applied",
        &["+user 231 mbrandt blocked"],
    ),
    ("11-user_rename.json", "applied", &["+user 232 sol-ortega"]),
    ("12-key_create.json", "ignored", &[]),
    ("13-key_destroy.json", "ignored", &[]),
    (
        "14-group_create.json",
        "applied",
        &["+group 640 kelp parent=- {640}"],
    ),
    (
        "15-group_destroy.json",
        "applied",
        &["-group 640 kelp parent=- {640}"],
    ),
    (
        "16-group_rename.json",
        "applied",
        &["+group 641 seaside/lighthouse parent=- {641}"],
    ),
    (
        "17-user_add_to_group.json",
        "applied",
        &["+user 230 rtanaka", "+member 230 group 640 40"],
    ),
    (
        "18-user_remove_from_group.json",
        "applied",
        &["-member 230 group 640 40"],
    ),
    ("19-push.json", "ignored", &[]),
    ("20-tag_push.json", "ignored", &[]),
    ("21-merge_request.json", "ignored", &[]),
    ("22-repository_update.json", "ignored", &[]),
    // The document's block as printed: a comma before `}`, so not JSON.
    ("22-repository_update.txt", "400", &[]),
];

/// What GitLab 10.4 to 11.8's documented payloads leave in the mirror.
async fn assert_10_4_to_11_8_mirror(app: &TestApp, payloads: &Payloads) {
    assert_eq!(
        mirror(app, payloads).await,
        rows(&[
            TIDE_TABLES_MOVED,
            KELP_FOREST,
            LIGHTHOUSE,
            RTANAKA,
            RENAMED,
            BLOCKED
        ])
    );
}

/// GitLab 11.8: `access_level` in `user_add_to_team`, still `project_access` in
/// `user_remove_from_team`; `group_create` without `full_path`.
#[tokio::test]
async fn gitlab_11_8_documented_payloads() {
    for payloads in payloads("gitlab-11.8", "old-fb7fbfd92a3") {
        let app = post_in_order(&payloads, GITLAB_10_4_TO_11_8).await;
        assert_10_4_to_11_8_mirror(&app, &payloads).await;
        let m = metrics(&app).await;
        counted(&m, "other", "rejected", 1);
        counted(&m, "merge_request", "ignored", 1);
    }
}

/// GitLab 10.4: `project_access` and `group_access` named `Master`, the first `merge_request`
/// system hook.
#[tokio::test]
async fn gitlab_10_4_documented_payloads() {
    for payloads in payloads("gitlab-10.4", "old-4431246da59") {
        let app = post_in_order(&payloads, GITLAB_10_4_TO_11_8).await;
        assert_10_4_to_11_8_mirror(&app, &payloads).await;
    }
}

/// GitLab 9.5–10.0: `Master`, `group_create` with `owner_*` and no `full_path`.
#[tokio::test]
async fn gitlab_9_5_documented_payloads() {
    for payloads in payloads("gitlab-9.5", "old-2a5b5323c33") {
        let app = post_in_order(
            &payloads,
            &[
                (
                    "01-project_create.json",
                    "applied",
                    &["+project 512 rtanaka/kelp-forest private ns=-"],
                ),
                ("02-project_destroy.json", "applied", &[]),
                (
                    "03-project_rename.json",
                    "applied",
                    &["+project 511 rtanaka/tide-tables internal ns=-"],
                ),
                (
                    "04-project_transfer.json",
                    "applied",
                    &[
                        "+project 511 almanac/tide-tables internal ns=-",
                        "-project 511 rtanaka/tide-tables internal ns=-",
                    ],
                ),
                ("05-project_update.json", "applied", &[]),
                (
                    "06-user_add_to_team.json",
                    "applied",
                    &["+user 230 rtanaka", "+member 230 project 512 40"],
                ),
                (
                    "07-user_remove_from_team.json",
                    "applied",
                    &["-member 230 project 512 40"],
                ),
                (
                    "08-user_create.json",
                    "applied",
                    &["+user 230 rei", "-user 230 rtanaka"],
                ),
                ("09-user_destroy.json", "applied", &["-user 230 rei"]),
                ("10-key_create.json", "ignored", &[]),
                ("11-key_destroy.json", "ignored", &[]),
                (
                    "12-group_create.json",
                    "applied",
                    &["+group 640 kelp parent=- {640}"],
                ),
                // Its members come after it here; a member of a mirrored group, then removed.
                (
                    "13-group_destroy.json",
                    "applied",
                    &["-group 640 kelp parent=- {640}"],
                ),
                (
                    "14-user_add_to_group.json",
                    "applied",
                    &["+user 230 rtanaka", "+member 230 group 640 40"],
                ),
                (
                    "15-user_remove_from_group.json",
                    "applied",
                    &["-member 230 group 640 40"],
                ),
                ("16-push.json", "ignored", &[]),
                ("17-tag_push.json", "ignored", &[]),
                ("18-repository_update.json", "ignored", &[]),
                ("18-repository_update.txt", "400", &[]),
            ],
        )
        .await;
        assert_eq!(
            mirror(&app, &payloads).await,
            rows(&[TIDE_TABLES_MOVED, KELP_FOREST, RTANAKA])
        );
    }
}

/// Unknown event names and kinds, and other `X-Gitlab-Event` types: 202, nothing written,
/// counted as `other`.
#[tokio::test]
async fn events_envlens_does_not_know_are_acknowledged() {
    let app = TestApp::new().await;
    let before = app.fingerprint().await;
    for body in [
        json!({"event_name": "project_archived", "project_id": 1}),
        json!({"event_name": "member_invited", "user_id": "not even a number"}),
        json!({"object_kind": "pipeline", "object_attributes": {"id": 1}}),
        json!({"object_kind": "note", "event_type": "note"}),
    ] {
        let res = app.system_hook(&body).await;
        assert_eq!(res.status, 202, "{body}: {}", res.text());
        assert_eq!(res.json()["outcome"], "ignored", "{body}");
    }
    let res = app
        .hook(
            "Pipeline Hook",
            json!({"object_kind": "pipeline"}).to_string(),
            None,
        )
        .await;
    assert_eq!(
        (res.status.as_u16(), res.json()["outcome"].clone()),
        (202, json!("ignored"))
    );
    assert_eq!(app.fingerprint().await, before);
    counted(&metrics(&app).await, "other", "ignored", 5);
}

/// Well-formed events that cannot be applied: 202 with the reason, nothing written (the
/// delivery id neither, so a redelivery is tried again), counted as `unapplied`.
#[tokio::test]
async fn events_that_cannot_be_applied_are_acknowledged_and_counted() {
    let app = TestApp::new().await;
    for body in [
        json!({"event_name": "group_create", "group_id": 1, "path": "acme", "full_path": "acme"}),
        json!({"event_name": "user_create", "user_id": 1, "username": "ann"}),
        json!({"event_name": "project_create", "project_id": 5, "path_with_namespace": "acme/api"}),
    ] {
        assert_eq!(
            app.system_hook(&body).await.json()["outcome"],
            "applied",
            "{body}"
        );
    }
    let before = app.fingerprint().await;
    let cases = [
        // Paths and usernames another id holds in the mirror.
        (
            json!({"event_name": "group_create", "group_id": 9, "full_path": "ACME"}),
            "group_create",
            "path",
        ),
        (
            json!({"event_name": "project_create", "project_id": 6, "path_with_namespace": "acme/API"}),
            "project_create",
            "path",
        ),
        (
            json!({"event_name": "user_rename", "user_id": 2, "username": "Ann", "old_username": "bob"}),
            "user_rename",
            "username",
        ),
        (
            json!({"event_name": "user_add_to_team", "user_id": 2, "user_username": "bob", "project_id": 6,
                "project_path_with_namespace": "acme/api", "access_level": "Developer"}),
            "user_add_to_team",
            "path",
        ),
        // An access level envlens does not know.
        (
            json!({"event_name": "user_add_to_team", "user_id": 1, "user_username": "ann", "project_id": 5,
                "access_level": "Admin"}),
            "user_add_to_team",
            "`Admin`",
        ),
        (
            json!({"event_name": "user_update_for_group", "user_id": 1, "user_username": "ann", "group_id": 1,
                "group_access": "Superuser"}),
            "user_update_for_group",
            "`Superuser`",
        ),
    ];
    for (body, _, reason) in &cases {
        let res = app
            .hook("System Hook", body.to_string(), Some("uuid-unapplied"))
            .await;
        assert_eq!(res.status, 202, "{body}: {}", res.text());
        let answer = res.json();
        assert_eq!(answer["outcome"], "unapplied", "{body}");
        let text = answer["reason"].as_str().unwrap();
        assert!(text.contains(reason), "{body}: {text}");
    }
    assert_eq!(app.fingerprint().await, before);
    let m = metrics(&app).await;
    counted(&m, "group_create", "unapplied", 1);
    counted(&m, "user_add_to_team", "unapplied", 2);
    counted(&m, "user_rename", "unapplied", 1);
    counted(&m, "group_create", "applied", 1);

    // Once the path is free, the same delivery applies.
    app.system_hook(&json!({"event_name": "group_destroy", "group_id": 1}))
        .await;
    let res = app
        .hook(
            "System Hook",
            cases[0].0.to_string(),
            Some("uuid-unapplied"),
        )
        .await;
    assert_eq!(
        (res.status.as_u16(), res.json()["outcome"].clone()),
        (200, json!("applied"))
    );
}

/// Malformed bodies stay 4xx (and are counted as rejected): GitLab's own payloads never are.
#[tokio::test]
async fn malformed_hooks_are_rejected_and_counted() {
    let app = TestApp::new().await;
    for (body, status) in [
        ("{\"event_name\": ", 400),
        ("{\"event_name\": \"user_create\"} x", 400),
        ("{\"event_name\": 5}", 422),
        ("{\"event_name\": \"group_create\", \"group_id\": 3}", 422),
        ("{\"event_name\": \"group_rename\", \"group_id\": 3, \"path\": \"a\"}", 422),
        ("{\"event_name\": \"user_add_to_team\", \"user_id\": 1, \"user_username\": \"a\", \"project_id\": \"3\", \"access_level\": \"Developer\"}", 422),
    ] {
        let res = app.hook("System Hook", body.to_owned(), None).await;
        assert_eq!(res.status, status, "{body}: {}", res.text());
    }
    let m = metrics(&app).await;
    counted(&m, "other", "rejected", 3);
    counted(&m, "group_create", "rejected", 1);
    counted(&m, "group_rename", "rejected", 1);
    counted(&m, "user_add_to_team", "rejected", 1);
}
