//! The identity mirror: GitLab's system hooks (SPEC 4.1) and the bulk snapshot for backfill.

use std::collections::HashSet;

use axum::extract::State;
use axum::Json as JsonResponse;
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};

use crate::auth::Internal;
use crate::db::identity::{self as db, Snapshot};
use crate::error::{Error, Result};
use crate::gitlab::hook_scope::Footprint;
use crate::gitlab::validate;
use crate::http::extract::{from_value, Json};
use crate::state::AppState;

/// The system hook events envlens mirrors, in the payload shapes GitLab documents from 9.5 on.
/// Events it has no use for (`push`, `key_create`, a `merge_request` with only `object_kind`,
/// a name it does not know) are [`SystemHook::Ignored`]: GitLab sends every event to every
/// system hook and disables a receiver that keeps failing, so they are acknowledged rather
/// than refused.
#[derive(Debug)]
pub enum SystemHook {
    ProjectCreate(ProjectEvent),
    ProjectUpdate(ProjectEvent),
    ProjectRename(ProjectEvent),
    ProjectTransfer(ProjectEvent),
    ProjectDestroy(ProjectDestroyEvent),
    GroupCreate(GroupEvent),
    GroupRename(GroupEvent),
    GroupDestroy(GroupDestroyEvent),
    UserCreate(UserEvent),
    UserRename(UserEvent),
    UserDestroy(UserDestroyEvent),
    /// A blocked user tried to sign in: the one system hook that carries a user's `state`.
    UserFailedLogin(UserStateEvent),
    UserAddToTeam(TeamEvent),
    UserUpdateForTeam(TeamEvent),
    UserRemoveFromTeam(TeamEvent),
    UserAddToGroup(GroupMemberEvent),
    UserUpdateForGroup(GroupMemberEvent),
    UserRemoveFromGroup(GroupMemberEvent),
    /// An event envlens has no use for.
    Ignored,
}

/// Whether an event may create or rename users: the instance's webhook token may, a group's
/// may not (SPEC 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Users {
    Write,
    Keep,
}

/// What became of a well-formed event.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// It cannot be applied (a path another id holds, an access level envlens does not
    /// know); nothing was written, and the reason is logged and answered.
    Unapplied(String),
}

/// The events envlens applies, then those GitLab documents that it has no use for. Metrics
/// label an event by one of these names, or `other`, so that the label stays bounded.
const APPLIED_EVENTS: [&str; 20] = [
    "project_create",
    "project_destroy",
    "project_rename",
    "project_transfer",
    "project_update",
    "group_create",
    "group_destroy",
    "group_rename",
    "user_create",
    "user_destroy",
    "user_rename",
    "user_failed_login",
    "user_add_to_team",
    "user_remove_from_team",
    "user_update_for_team",
    "user_add_to_group",
    "user_remove_from_group",
    "user_update_for_group",
    "subgroup_create",
    "subgroup_destroy",
];
const UNUSED_EVENTS: [&str; 13] = [
    "key_create",
    "key_destroy",
    "push",
    "tag_push",
    "repository_update",
    "merge_request",
    "user_access_request_to_group",
    "user_access_request_to_project",
    "user_access_request_revoked_for_group",
    "user_access_request_revoked_for_project",
    "user_access_request_denied_for_group",
    "gitlab_subscription_member_approval",
    "gitlab_subscription_member_approvals",
];

/// The metric label of an event name: the name itself when GitLab documents it, else `other`.
pub fn event_label(name: &str) -> &'static str {
    APPLIED_EVENTS
        .iter()
        .chain(UNUSED_EVENTS.iter())
        .find(|known| **known == name)
        .copied()
        .unwrap_or("other")
}

#[derive(Debug, Deserialize)]
pub struct ProjectEvent {
    project_id: i64,
    path_with_namespace: String,
    project_visibility: Option<String>,
    /// Only in `project_rename` and `project_transfer`: where the project was.
    old_path_with_namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ProjectDestroyEvent {
    project_id: i64,
}

#[derive(Debug, Deserialize)]
pub struct GroupEvent {
    group_id: i64,
    /// Absent from `group_create` before GitLab 11; then `path` is the full path of the
    /// top-level group (only a top-level group's path is its full path).
    full_path: Option<String>,
    path: Option<String>,
    /// Only in `group_rename`.
    old_full_path: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct GroupDestroyEvent {
    group_id: i64,
}

#[derive(Debug, Deserialize)]
pub struct UserEvent {
    user_id: i64,
    username: String,
}

#[derive(Debug, Deserialize)]
pub struct UserDestroyEvent {
    user_id: i64,
}

/// `user_failed_login`: `{user_id, username, state, ...}`.
#[derive(Debug, Deserialize)]
pub struct UserStateEvent {
    user_id: i64,
    username: String,
    state: String,
}

#[derive(Debug, Deserialize)]
pub struct TeamEvent {
    user_id: i64,
    user_username: String,
    project_id: i64,
    /// `project_access` before GitLab 11 (and in `user_remove_from_team` until 12); not
    /// needed in `user_remove_from_team`.
    #[serde(alias = "project_access")]
    access_level: Option<String>,
    project_path_with_namespace: Option<String>,
    project_visibility: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct GroupMemberEvent {
    user_id: i64,
    user_username: String,
    group_id: i64,
    /// Not needed in `user_remove_from_group`.
    group_access: Option<String>,
}

impl GroupEvent {
    /// The group's full path: `full_path`, else (older `group_create`) `path`.
    fn full_path(&self) -> Result<&str> {
        self.full_path
            .as_deref()
            .or(self.path.as_deref())
            .ok_or_else(|| Error::invalid("full_path", "missing field `full_path`"))
    }
}

impl SystemHook {
    /// Reads an event by its `event_name` (or, for the events that have none, such as the
    /// `merge_request` system hook, its `object_kind`). Not a serde-tagged enum: those buffer
    /// their input and lose the path of the field at fault.
    pub fn from_json(body: Value) -> Result<Self> {
        let name = match (body.get("event_name"), body.get("object_kind")) {
            (Some(Value::String(name)), _) => name.clone(),
            (Some(_), _) => return Err(Error::invalid("event_name", "must be a string")),
            (None, Some(Value::String(_))) => return Ok(SystemHook::Ignored),
            (None, _) => {
                return Err(Error::invalid(
                    "event_name",
                    "missing field `event_name` (or `object_kind`)",
                ))
            }
        };
        Ok(match name.as_str() {
            "project_create" => SystemHook::ProjectCreate(from_value(body, "")?),
            "project_update" => SystemHook::ProjectUpdate(from_value(body, "")?),
            "project_rename" => SystemHook::ProjectRename(from_value(body, "")?),
            "project_transfer" => SystemHook::ProjectTransfer(from_value(body, "")?),
            "project_destroy" => SystemHook::ProjectDestroy(from_value(body, "")?),
            // A group webhook's `Subgroup Hook` names a subgroup's creation and removal so.
            "group_create" | "subgroup_create" => SystemHook::GroupCreate(from_value(body, "")?),
            "group_rename" => SystemHook::GroupRename(from_value(body, "")?),
            "group_destroy" | "subgroup_destroy" => SystemHook::GroupDestroy(from_value(body, "")?),
            "user_create" => SystemHook::UserCreate(from_value(body, "")?),
            "user_rename" => SystemHook::UserRename(from_value(body, "")?),
            "user_destroy" => SystemHook::UserDestroy(from_value(body, "")?),
            "user_failed_login" => SystemHook::UserFailedLogin(from_value(body, "")?),
            "user_add_to_team" => SystemHook::UserAddToTeam(from_value(body, "")?),
            "user_update_for_team" => SystemHook::UserUpdateForTeam(from_value(body, "")?),
            "user_remove_from_team" => SystemHook::UserRemoveFromTeam(from_value(body, "")?),
            "user_add_to_group" => SystemHook::UserAddToGroup(from_value(body, "")?),
            "user_update_for_group" => SystemHook::UserUpdateForGroup(from_value(body, "")?),
            "user_remove_from_group" => SystemHook::UserRemoveFromGroup(from_value(body, "")?),
            _ => SystemHook::Ignored,
        })
    }

    /// Checks that every field the event needs is there and well formed, before anything is
    /// written. What fails here is malformed (a 422); values that are well formed but that
    /// envlens cannot use are left to [`SystemHook::apply`].
    pub fn validate(&self) -> Result<()> {
        match self {
            SystemHook::ProjectCreate(e)
            | SystemHook::ProjectUpdate(e)
            | SystemHook::ProjectRename(e)
            | SystemHook::ProjectTransfer(e) => {
                validate::positive("project_id", e.project_id)?;
                validate::full_path("path_with_namespace", &e.path_with_namespace)?;
                if let Some(old) = &e.old_path_with_namespace {
                    validate::full_path("old_path_with_namespace", old)?;
                }
            }
            SystemHook::ProjectDestroy(e) => validate::positive("project_id", e.project_id)?,
            SystemHook::GroupCreate(e) | SystemHook::GroupRename(e) => {
                validate::positive("group_id", e.group_id)?;
                if matches!(self, SystemHook::GroupRename(_)) && e.full_path.is_none() {
                    return Err(Error::invalid("full_path", "missing field `full_path`"));
                }
                let field = if e.full_path.is_some() {
                    "full_path"
                } else {
                    "path"
                };
                validate::full_path(field, e.full_path()?)?;
                if let Some(old) = &e.old_full_path {
                    validate::full_path("old_full_path", old)?;
                }
            }
            SystemHook::GroupDestroy(e) => validate::positive("group_id", e.group_id)?,
            SystemHook::UserCreate(e) | SystemHook::UserRename(e) => {
                validate::positive("user_id", e.user_id)?;
                validate::non_empty("username", &e.username)?;
            }
            SystemHook::UserDestroy(e) => validate::positive("user_id", e.user_id)?,
            SystemHook::UserFailedLogin(e) => {
                validate::positive("user_id", e.user_id)?;
                validate::non_empty("username", &e.username)?;
                validate::non_empty("state", &e.state)?;
            }
            SystemHook::UserAddToTeam(e)
            | SystemHook::UserUpdateForTeam(e)
            | SystemHook::UserRemoveFromTeam(e) => {
                validate::positive("user_id", e.user_id)?;
                validate::non_empty("user_username", &e.user_username)?;
                validate::positive("project_id", e.project_id)?;
                if let Some(path) = &e.project_path_with_namespace {
                    validate::full_path("project_path_with_namespace", path)?;
                }
                if !matches!(self, SystemHook::UserRemoveFromTeam(_)) {
                    required("access_level", &e.access_level)?;
                }
            }
            SystemHook::UserAddToGroup(e)
            | SystemHook::UserUpdateForGroup(e)
            | SystemHook::UserRemoveFromGroup(e) => {
                validate::positive("user_id", e.user_id)?;
                validate::non_empty("user_username", &e.user_username)?;
                validate::positive("group_id", e.group_id)?;
                if !matches!(self, SystemHook::UserRemoveFromGroup(_)) {
                    required("group_access", &e.group_access)?;
                }
            }
            SystemHook::Ignored => {}
        }
        Ok(())
    }

    /// What the event touches, for the rule of a group's webhook token
    /// ([`crate::gitlab::hook_scope::decide`]).
    pub fn footprint(&self) -> Footprint {
        let mut f = Footprint::default();
        match self {
            SystemHook::ProjectCreate(e)
            | SystemHook::ProjectUpdate(e)
            | SystemHook::ProjectRename(e)
            | SystemHook::ProjectTransfer(e) => {
                f.paths
                    .push(("path_with_namespace", e.path_with_namespace.clone()));
                if let Some(old) = &e.old_path_with_namespace {
                    f.paths.push(("old_path_with_namespace", old.clone()));
                }
                f.projects.push((e.project_id, false));
            }
            SystemHook::ProjectDestroy(e) => f.projects.push((e.project_id, true)),
            SystemHook::GroupCreate(e) | SystemHook::GroupRename(e) => {
                let field = if e.full_path.is_some() {
                    "full_path"
                } else {
                    "path"
                };
                if let Ok(path) = e.full_path() {
                    f.paths.push((field, path.to_owned()));
                }
                if let Some(old) = &e.old_full_path {
                    f.paths.push(("old_full_path", old.clone()));
                }
                f.groups.push((e.group_id, false));
            }
            SystemHook::GroupDestroy(e) => f.groups.push((e.group_id, true)),
            SystemHook::UserCreate(_) => f.instance_wide = Some("a user_create event"),
            SystemHook::UserRename(_) => f.instance_wide = Some("a user_rename event"),
            SystemHook::UserDestroy(_) => f.instance_wide = Some("a user_destroy event"),
            SystemHook::UserFailedLogin(_) => f.instance_wide = Some("a user_failed_login event"),
            SystemHook::UserAddToTeam(e)
            | SystemHook::UserUpdateForTeam(e)
            | SystemHook::UserRemoveFromTeam(e) => {
                if let Some(path) = &e.project_path_with_namespace {
                    f.paths.push(("project_path_with_namespace", path.clone()));
                }
                f.projects.push((e.project_id, true));
                if !matches!(self, SystemHook::UserRemoveFromTeam(_)) {
                    f.users.push(e.user_id);
                }
            }
            SystemHook::UserAddToGroup(e)
            | SystemHook::UserUpdateForGroup(e)
            | SystemHook::UserRemoveFromGroup(e) => {
                f.groups.push((e.group_id, true));
                if !matches!(self, SystemHook::UserRemoveFromGroup(_)) {
                    f.users.push(e.user_id);
                }
            }
            SystemHook::Ignored => {}
        }
        f
    }

    /// Applies a validated event inside the caller's transaction. On
    /// [`Outcome::Unapplied`] the transaction may be aborted: the caller rolls it back.
    /// `users` says whether a membership event may create or rename its user: a group's
    /// webhook may not (its user was found in the mirror before).
    pub async fn apply(&self, conn: &mut PgConnection, users: Users) -> Result<Outcome> {
        match self.write(conn, users).await {
            // GitLab's paths and usernames are unique at any moment: a conflict means the
            // mirror missed, or has not yet received, the event that freed the path.
            Err(Error::Conflict(reason)) => Ok(Outcome::Unapplied(reason)),
            other => other,
        }
    }

    async fn write(&self, conn: &mut PgConnection, users: Users) -> Result<Outcome> {
        let done = match self {
            SystemHook::ProjectCreate(e)
            | SystemHook::ProjectUpdate(e)
            | SystemHook::ProjectRename(e)
            | SystemHook::ProjectTransfer(e) => {
                let visibility = known_visibility(e.project_id, &e.project_visibility);
                db::upsert_project(conn, e.project_id, &e.path_with_namespace, visibility).await
            }
            SystemHook::ProjectDestroy(e) => db::delete_project(conn, e.project_id).await,
            SystemHook::GroupCreate(e) => db::upsert_group(conn, e.group_id, e.full_path()?).await,
            SystemHook::GroupRename(e) => {
                let full_path = e.full_path()?;
                let old = e.old_full_path.as_deref().unwrap_or(full_path);
                db::move_group(conn, e.group_id, old, full_path).await
            }
            SystemHook::GroupDestroy(e) => db::delete_group(conn, e.group_id).await,
            SystemHook::UserCreate(e) | SystemHook::UserRename(e) => {
                db::upsert_user(conn, e.user_id, &e.username, None).await
            }
            SystemHook::UserDestroy(e) => db::delete_user(conn, e.user_id).await,
            SystemHook::UserFailedLogin(e) => {
                db::upsert_user(conn, e.user_id, &e.username, None).await?;
                let state = db::UserState {
                    state: validate::user_state(&e.state),
                    external: None,
                };
                db::set_user_state(&mut *conn, e.user_id, &state)
                    .await
                    .map(|_| ())
            }
            SystemHook::UserAddToTeam(e) | SystemHook::UserUpdateForTeam(e) => {
                let level = match level("access_level", &e.access_level)? {
                    Ok(level) => level,
                    Err(reason) => return Ok(Outcome::Unapplied(reason)),
                };
                if users == Users::Write {
                    db::upsert_user(conn, e.user_id, &e.user_username, None).await?;
                }
                if let Some(path) = &e.project_path_with_namespace {
                    let visibility = known_visibility(e.project_id, &e.project_visibility);
                    db::upsert_project(conn, e.project_id, path, visibility).await?;
                }
                db::set_member(conn, e.user_id, "project", e.project_id, level).await
            }
            SystemHook::UserRemoveFromTeam(e) => {
                db::remove_member(conn, e.user_id, "project", e.project_id).await
            }
            SystemHook::UserAddToGroup(e) | SystemHook::UserUpdateForGroup(e) => {
                let level = match level("group_access", &e.group_access)? {
                    Ok(level) => level,
                    Err(reason) => return Ok(Outcome::Unapplied(reason)),
                };
                if users == Users::Write {
                    db::upsert_user(conn, e.user_id, &e.user_username, None).await?;
                }
                db::set_member(conn, e.user_id, "group", e.group_id, level).await
            }
            SystemHook::UserRemoveFromGroup(e) => {
                db::remove_member(conn, e.user_id, "group", e.group_id).await
            }
            SystemHook::Ignored => Ok(()),
        };
        done.map(|()| Outcome::Applied)
    }
}

fn required<'a>(field: &str, value: &'a Option<String>) -> Result<&'a str> {
    value
        .as_deref()
        .ok_or_else(|| Error::invalid(field, format!("missing field `{field}`")))
}

/// The access level a membership event grants; missing is malformed. A name envlens does not
/// know (a level newer than envlens, say) is no reason for GitLab to disable the hook: it is
/// the reason the event is not applied.
fn level(field: &str, name: &Option<String>) -> Result<std::result::Result<i32, String>> {
    let name = required(field, name)?;
    Ok(validate::access_level_named(name).ok_or_else(|| {
        format!(
            "`{field}` `{name}` is not an access level envlens knows (Guest, Planner, Reporter, \
             Developer, Maintainer or Master, Owner, Minimal Access)"
        )
    }))
}

/// A project's visibility, when it is one envlens knows. Another value (GitLab 12's
/// documentation shows `visibilitylevel|private`) leaves the mirror's as it is (private for a
/// new project) rather than failing the whole event.
fn known_visibility(project_id: i64, value: &Option<String>) -> Option<&str> {
    let value = value.as_deref()?;
    if validate::visibility("project_visibility", value).is_ok() {
        Some(value)
    } else {
        tracing::warn!(
            project_id,
            visibility = value,
            "unknown project visibility in a system hook: the mirror keeps the one it has"
        );
        None
    }
}

/// `PUT /api/v4/internal/identity`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentitySnapshot {
    #[serde(default)]
    groups: Vec<GroupRow>,
    #[serde(default)]
    projects: Vec<ProjectRow>,
    #[serde(default)]
    users: Vec<UserRow>,
    #[serde(default)]
    members: Vec<MemberRow>,
}

#[derive(Debug, Deserialize)]
struct GroupRow {
    id: i64,
    full_path: String,
}

#[derive(Debug, Deserialize)]
struct ProjectRow {
    id: i64,
    full_path: String,
    visibility: String,
}

#[derive(Debug, Deserialize)]
struct UserRow {
    id: i64,
    username: String,
    #[serde(default)]
    admin: bool,
    /// GitLab's `state` (`active`, `blocked`, ...); absent keeps the mirror's.
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    external: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct MemberRow {
    user_id: i64,
    source_type: String,
    source_id: i64,
    access_level: i32,
}

impl IdentitySnapshot {
    /// Checks every row, and that no id, path or membership appears twice.
    fn into_columns(self) -> Result<Snapshot> {
        let mut s = Snapshot::default();
        let mut seen = Uniques::default();
        for (i, g) in self.groups.into_iter().enumerate() {
            validate::positive(&format!("groups[{i}].id"), g.id)?;
            validate::full_path(&format!("groups[{i}].full_path"), &g.full_path)?;
            seen.check(&format!("groups[{i}].id"), ("group", g.id.to_string()))?;
            seen.check(
                &format!("groups[{i}].full_path"),
                ("group path", g.full_path.to_lowercase()),
            )?;
            s.group_ids.push(g.id);
            s.group_paths.push(g.full_path);
        }
        for (i, p) in self.projects.into_iter().enumerate() {
            validate::positive(&format!("projects[{i}].id"), p.id)?;
            validate::full_path(&format!("projects[{i}].full_path"), &p.full_path)?;
            validate::visibility(&format!("projects[{i}].visibility"), &p.visibility)?;
            seen.check(&format!("projects[{i}].id"), ("project", p.id.to_string()))?;
            seen.check(
                &format!("projects[{i}].full_path"),
                ("project path", p.full_path.to_lowercase()),
            )?;
            s.project_ids.push(p.id);
            s.project_paths.push(p.full_path);
            s.project_visibilities.push(p.visibility);
        }
        for (i, u) in self.users.into_iter().enumerate() {
            validate::positive(&format!("users[{i}].id"), u.id)?;
            validate::non_empty(&format!("users[{i}].username"), &u.username)?;
            seen.check(&format!("users[{i}].id"), ("user", u.id.to_string()))?;
            seen.check(
                &format!("users[{i}].username"),
                ("username", u.username.to_lowercase()),
            )?;
            s.user_ids.push(u.id);
            s.usernames.push(u.username);
            s.user_admins.push(u.admin);
            s.user_states
                .push(u.state.as_deref().map(validate::user_state));
            s.user_externals.push(u.external);
        }
        for (i, m) in self.members.into_iter().enumerate() {
            validate::positive(&format!("members[{i}].user_id"), m.user_id)?;
            validate::source_type(&format!("members[{i}].source_type"), &m.source_type)?;
            validate::positive(&format!("members[{i}].source_id"), m.source_id)?;
            validate::access_level(&format!("members[{i}].access_level"), m.access_level)?;
            seen.check(
                &format!("members[{i}]"),
                (
                    "member",
                    format!("{}/{}/{}", m.user_id, m.source_type, m.source_id),
                ),
            )?;
            s.member_user_ids.push(m.user_id);
            s.member_source_types.push(m.source_type);
            s.member_source_ids.push(m.source_id);
            s.member_access_levels.push(m.access_level);
        }
        Ok(s)
    }
}

#[derive(Default)]
struct Uniques(HashSet<(&'static str, String)>);

impl Uniques {
    fn check(&mut self, field: &str, key: (&'static str, String)) -> Result<()> {
        let message = format!("{} `{}` appears twice in the snapshot", key.0, key.1);
        if self.0.insert(key) {
            Ok(())
        } else {
            Err(Error::invalid(field, message))
        }
    }
}

/// `PUT /api/v4/internal/identity`.
pub async fn put_snapshot(
    _: Internal,
    State(state): State<AppState>,
    Json(body): Json<IdentitySnapshot>,
) -> Result<JsonResponse<Value>> {
    let counts = import(state.db.pg(), body).await?;
    state.metrics.mirror_applied();
    Ok(JsonResponse(counts))
}

/// Upserts a whole snapshot in one transaction; rows it does not name are left as they are.
/// The bulk endpoint and `envlens identity import` both come here. Answers the number of rows
/// of each kind.
pub async fn import(db: &PgPool, snapshot: IdentitySnapshot) -> Result<Value> {
    let snapshot = snapshot.into_columns()?;
    let mut tx = db.begin().await?;
    if let Some(i) = db::apply_snapshot(&mut tx, &snapshot).await? {
        return Err(Error::invalid(
            format!("members[{i}].user_id"),
            format!(
                "user {} is neither in the snapshot nor in the mirror",
                snapshot.member_user_ids[i]
            ),
        ));
    }
    tx.commit().await?;
    Ok(json!({
        "groups": snapshot.group_ids.len(),
        "projects": snapshot.project_ids.len(),
        "users": snapshot.user_ids.len(),
        "members": snapshot.member_user_ids.len(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value) -> Result<SystemHook> {
        SystemHook::from_json(body)
    }

    fn field(result: Result<impl std::fmt::Debug>) -> String {
        match result {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("not a field error: {other:?}"),
        }
    }

    #[test]
    fn events_without_use_are_ignored_not_refused() {
        for body in [
            json!({"event_name": "key_create", "id": 4}),
            json!({"event_name": "a_future_event", "anything": [1]}),
            json!({"object_kind": "merge_request", "user": {"name": "A"}}),
            json!({"object_kind": "gitlab_subscription_member_approval", "action": "enqueue"}),
        ] {
            assert!(
                matches!(read(body.clone()), Ok(SystemHook::Ignored)),
                "{body}"
            );
        }
    }

    #[test]
    fn what_is_not_an_event_is_refused() {
        assert_eq!(field(read(json!({"user_id": 1}))), "event_name");
        assert_eq!(field(read(json!({"event_name": 7}))), "event_name");
        assert_eq!(field(read(json!({"object_kind": 7}))), "event_name");
        assert_eq!(
            field(read(
                json!({"event_name": "user_create", "user_id": "1", "username": "a"})
            )),
            "user_id"
        );
    }

    #[test]
    fn older_shapes_are_read() {
        let team = read(
            json!({"event_name": "user_add_to_team", "user_id": 1, "user_username": "a",
                                "project_id": 2, "project_access": "Master"}),
        )
        .unwrap();
        let SystemHook::UserAddToTeam(e) = &team else {
            panic!("{team:?}")
        };
        assert_eq!(level("access_level", &e.access_level).unwrap(), Ok(40));
        team.validate().unwrap();

        let group = read(
            json!({"event_name": "group_create", "group_id": 78, "path": "storecloud",
                                 "owner_email": null, "owner_name": null}),
        )
        .unwrap();
        let SystemHook::GroupCreate(e) = &group else {
            panic!("{group:?}")
        };
        assert_eq!(e.full_path().unwrap(), "storecloud");
        group.validate().unwrap();

        // A rename always names the new full path.
        let rename =
            read(json!({"event_name": "group_rename", "group_id": 1, "path": "b"})).unwrap();
        assert_eq!(field(rename.validate()), "full_path");
    }

    #[test]
    fn an_unknown_level_is_a_reason_not_a_refusal() {
        let reason = level("group_access", &Some("Superuser".into()))
            .unwrap()
            .unwrap_err();
        assert!(reason.contains("`Superuser`"), "{reason}");
        assert_eq!(field(level("group_access", &None)), "group_access");
    }

    #[test]
    fn metric_labels_are_bounded() {
        assert_eq!(event_label("user_create"), "user_create");
        assert_eq!(event_label("merge_request"), "merge_request");
        assert_eq!(event_label("whatever-GitLab-sends-next"), "other");
    }
}
