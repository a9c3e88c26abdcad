//! SQL of the identity mirror: groups, projects, users, memberships.
//!
//! Groups and projects are keyed by GitLab's ids; their hierarchy follows from their full
//! paths, so an event may arrive before its parent group does: [`relink`] recomputes parents
//! and `traversal_ids` of a subtree whenever paths change.

use sqlx::{PgConnection, PgExecutor};

use super::violated_constraint;
use crate::error::{Error, Result};
use crate::gitlab::hook_scope::{Footprint, Kind, Located};

/// A user as the reading rules see them. Only an active user is one (`active_users`, see
/// migration 0052): a blocked, deactivated or banned user is found by none of these reads.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub admin: bool,
    /// GitLab's external users read internal projects only where they are members.
    pub external: bool,
}

/// The user `id`, if the mirror has them and they are active.
pub async fn find_user(db: impl PgExecutor<'_>, id: i64) -> Result<Option<User>> {
    Ok(
        sqlx::query_as("SELECT id, username, admin, external FROM active_users WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// Whether the mirror has the user `id`, whatever their state.
pub async fn user_mirrored(db: impl PgExecutor<'_>, id: i64) -> Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM users WHERE id = $1)")
            .bind(id)
            .fetch_one(db)
            .await?,
    )
}

/// GitLab's word on a user: their state, and their `external` flag when the answer has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserState {
    pub state: String,
    pub external: Option<bool>,
}

/// Adds a user GitLab vouched for (their token, their sign-in) that the mirror lacks, with no
/// memberships; a user the mirror has meanwhile is left as it is. An answer without the
/// `external` flag (GitLab shows it to administrators and to the user themselves) adds them as
/// external: an unknown flag opens no internal project (SPEC 13).
pub async fn add_vouched_user(
    conn: &mut PgConnection,
    id: i64,
    username: &str,
    state: &UserState,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO users (id, username, state, external) VALUES ($1, $2, $3, COALESCE($4, true))
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(username)
    .bind(&state.state)
    .bind(state.external)
    .execute(conn)
    .await
    .map_err(|e| taken(e, &format!("user {id} ({username})")))?;
    Ok(())
}

/// Records GitLab's state of a user the mirror has (`external` kept when `None`); false when
/// the mirror has no such user.
pub async fn set_user_state(db: impl PgExecutor<'_>, id: i64, state: &UserState) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE users SET state = $2, external = COALESCE($3, external), updated_at = now()
         WHERE id = $1 AND (state, external) IS DISTINCT FROM ($2, COALESCE($3, external))",
    )
    .bind(id)
    .bind(&state.state)
    .bind(state.external)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records a user's `external` flag as GitLab's profile of them says (their sign-in).
pub async fn set_user_external(db: impl PgExecutor<'_>, id: i64, external: bool) -> Result<()> {
    sqlx::query(
        "UPDATE users SET external = $2, updated_at = now() WHERE id = $1 AND external <> $2",
    )
    .bind(id)
    .bind(external)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn find_user_by_username(
    db: impl PgExecutor<'_>,
    username: &str,
) -> Result<Option<User>> {
    Ok(sqlx::query_as(
        "SELECT id, username, admin, external FROM active_users WHERE lower(username) = lower($1)",
    )
    .bind(username)
    .fetch_optional(db)
    .await?)
}

/// Turns a violation of a path or username uniqueness into a 409 that names it.
fn taken(e: sqlx::Error, what: &str) -> Error {
    match violated_constraint(&e) {
        Some("namespaces_full_path_key") => {
            Error::Conflict(format!("another group already has the path of {what}"))
        }
        Some("projects_full_path_key") => {
            Error::Conflict(format!("another project already has the path of {what}"))
        }
        Some("users_username_key") => {
            Error::Conflict(format!("another user already has the username of {what}"))
        }
        _ => e.into(),
    }
}

/// The last segment of a full path: the `path` of its project or group.
pub(super) fn last_segment(full_path: &str) -> &str {
    full_path.rsplit('/').next().unwrap_or(full_path)
}

pub async fn upsert_group(conn: &mut PgConnection, id: i64, full_path: &str) -> Result<()> {
    write_group(conn, id, full_path).await?;
    relink(conn, Some(full_path)).await
}

async fn write_group(conn: &mut PgConnection, id: i64, full_path: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO namespaces (id, path, full_path) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET path = EXCLUDED.path, full_path = EXCLUDED.full_path, updated_at = now()
         WHERE (namespaces.path, namespaces.full_path) IS DISTINCT FROM (EXCLUDED.path, EXCLUDED.full_path)",
    )
    .bind(id)
    .bind(last_segment(full_path))
    .bind(full_path)
    .execute(&mut *conn)
    .await
    .map_err(|e| taken(e, &format!("group {id} ({full_path})")))?;
    Ok(())
}

/// Renames or moves a group with everything below it. The subtree moves from the path the
/// mirror has for the group, falling back to `old_full_path` when the group is new to it.
pub async fn move_group(
    conn: &mut PgConnection,
    id: i64,
    old_full_path: &str,
    full_path: &str,
) -> Result<()> {
    let stored: Option<String> =
        sqlx::query_scalar("SELECT full_path FROM namespaces WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    let old = stored.as_deref().unwrap_or(old_full_path).to_owned();
    write_group(conn, id, full_path).await?;
    if old.to_lowercase() != full_path.to_lowercase() {
        for table in ["namespaces", "projects"] {
            sqlx::query(&format!(
                "UPDATE {table} SET full_path = $2 || substr(full_path, length($1) + 1), updated_at = now()
                 WHERE envlens_below(full_path, lower($1))"
            ))
            .bind(&old)
            .bind(full_path)
            .execute(&mut *conn)
            .await
            .map_err(|e| taken(e, &format!("a descendant of group {id} moved to {full_path}")))?;
        }
    }
    relink(conn, Some(full_path)).await
}

/// Deletes a group, its subgroups and their projects (with their agents, environments and
/// deployments), and every membership in them.
pub async fn delete_group(conn: &mut PgConnection, id: i64) -> Result<()> {
    let path: Option<String> =
        sqlx::query_scalar("SELECT lower(full_path) FROM namespaces WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    sqlx::query("DELETE FROM members WHERE source_type = 'group' AND source_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    let Some(path) = path else {
        return Ok(());
    };
    sqlx::query(
        "DELETE FROM members m WHERE
           (m.source_type = 'project' AND m.source_id IN (SELECT id FROM projects WHERE envlens_in_subtree(full_path, $1)))
        OR (m.source_type = 'group' AND m.source_id IN (SELECT id FROM namespaces WHERE envlens_in_subtree(full_path, $1)))",
    )
    .bind(&path)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM projects WHERE envlens_in_subtree(full_path, $1)")
        .bind(&path)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM namespaces WHERE envlens_in_subtree(full_path, $1)")
        .bind(&path)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Creates or updates a project; `visibility` `None` keeps what the mirror has (private when new).
/// Relinks only when the row changed, so the common case (a deployment of a known project)
/// writes nothing.
pub async fn upsert_project(
    conn: &mut PgConnection,
    id: i64,
    full_path: &str,
    visibility: Option<&str>,
) -> Result<()> {
    let changed: Option<i32> = sqlx::query_scalar(
        "INSERT INTO projects (id, path, full_path, visibility) VALUES ($1, $2, $3, COALESCE($4, 'private'))
         ON CONFLICT (id) DO UPDATE SET path = EXCLUDED.path, full_path = EXCLUDED.full_path,
             visibility = COALESCE($4, projects.visibility), updated_at = now()
         WHERE (projects.path, projects.full_path, projects.visibility)
               IS DISTINCT FROM (EXCLUDED.path, EXCLUDED.full_path, COALESCE($4, projects.visibility))
         RETURNING 1",
    )
    .bind(id)
    .bind(last_segment(full_path))
    .bind(full_path)
    .bind(visibility)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| taken(e, &format!("project {id} ({full_path})")))?;
    match changed {
        Some(_) => relink(conn, Some(full_path)).await,
        None => Ok(()),
    }
}

/// Deletes a project (with its agents, environments and deployments) and its memberships.
pub async fn delete_project(conn: &mut PgConnection, id: i64) -> Result<()> {
    sqlx::query("DELETE FROM members WHERE source_type = 'project' AND source_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM projects WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Creates or renames a user; `admin` `None` keeps what the mirror has (not admin when new).
pub async fn upsert_user(
    conn: &mut PgConnection,
    id: i64,
    username: &str,
    admin: Option<bool>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO users (id, username, admin) VALUES ($1, $2, COALESCE($3, false))
         ON CONFLICT (id) DO UPDATE SET username = EXCLUDED.username, admin = COALESCE($3, users.admin), updated_at = now()
         WHERE (users.username, users.admin) IS DISTINCT FROM (EXCLUDED.username, COALESCE($3, users.admin))",
    )
    .bind(id)
    .bind(username)
    .bind(admin)
    .execute(&mut *conn)
    .await
    .map_err(|e| taken(e, &format!("user {id} ({username})")))?;
    Ok(())
}

/// Deletes a user; their memberships go with them.
pub async fn delete_user(conn: &mut PgConnection, id: i64) -> Result<()> {
    sqlx::query("DELETE FROM users WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn set_member(
    conn: &mut PgConnection,
    user_id: i64,
    source_type: &str,
    source_id: i64,
    access_level: i32,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO members (user_id, source_type, source_id, access_level) VALUES ($1, $2, $3, $4)
         ON CONFLICT (user_id, source_type, source_id) DO UPDATE SET access_level = EXCLUDED.access_level",
    )
    .bind(user_id)
    .bind(source_type)
    .bind(source_id)
    .bind(access_level)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn remove_member(
    conn: &mut PgConnection,
    user_id: i64,
    source_type: &str,
    source_id: i64,
) -> Result<()> {
    sqlx::query("DELETE FROM members WHERE user_id = $1 AND source_type = $2 AND source_id = $3")
        .bind(user_id)
        .bind(source_type)
        .bind(source_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// A bulk snapshot, as columns.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub group_ids: Vec<i64>,
    pub group_paths: Vec<String>,
    pub project_ids: Vec<i64>,
    pub project_paths: Vec<String>,
    pub project_visibilities: Vec<String>,
    pub user_ids: Vec<i64>,
    pub usernames: Vec<String>,
    pub user_admins: Vec<bool>,
    /// GitLab's `state` of each user; `None` keeps the mirror's (`active` when new).
    pub user_states: Vec<Option<String>>,
    /// Their `external` flag; `None` keeps the mirror's (not external when new).
    pub user_externals: Vec<Option<bool>>,
    pub member_user_ids: Vec<i64>,
    pub member_source_types: Vec<String>,
    pub member_source_ids: Vec<i64>,
    pub member_access_levels: Vec<i32>,
}

/// Upserts a whole snapshot (one statement per table), then relinks every path. Returns the
/// index of the first member whose user is neither in the snapshot nor in the mirror.
pub async fn apply_snapshot(conn: &mut PgConnection, s: &Snapshot) -> Result<Option<usize>> {
    sqlx::query(
        "INSERT INTO namespaces (id, path, full_path)
         SELECT id, regexp_replace(full_path, '^.*/', ''), full_path FROM UNNEST($1::bigint[], $2::text[]) AS t(id, full_path)
         ON CONFLICT (id) DO UPDATE SET path = EXCLUDED.path, full_path = EXCLUDED.full_path, updated_at = now()
         WHERE (namespaces.path, namespaces.full_path) IS DISTINCT FROM (EXCLUDED.path, EXCLUDED.full_path)",
    )
    .bind(&s.group_ids)
    .bind(&s.group_paths)
    .execute(&mut *conn)
    .await
    .map_err(|e| taken(e, "a group in the snapshot"))?;
    sqlx::query(
        "INSERT INTO projects (id, path, full_path, visibility)
         SELECT id, regexp_replace(full_path, '^.*/', ''), full_path, visibility
         FROM UNNEST($1::bigint[], $2::text[], $3::text[]) AS t(id, full_path, visibility)
         ON CONFLICT (id) DO UPDATE SET path = EXCLUDED.path, full_path = EXCLUDED.full_path,
             visibility = EXCLUDED.visibility, updated_at = now()
         WHERE (projects.path, projects.full_path, projects.visibility)
               IS DISTINCT FROM (EXCLUDED.path, EXCLUDED.full_path, EXCLUDED.visibility)",
    )
    .bind(&s.project_ids)
    .bind(&s.project_paths)
    .bind(&s.project_visibilities)
    .execute(&mut *conn)
    .await
    .map_err(|e| taken(e, "a project in the snapshot"))?;
    sqlx::query(
        "INSERT INTO users (id, username, admin) SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::boolean[])
         ON CONFLICT (id) DO UPDATE SET username = EXCLUDED.username, admin = EXCLUDED.admin, updated_at = now()
         WHERE (users.username, users.admin) IS DISTINCT FROM (EXCLUDED.username, EXCLUDED.admin)",
    )
    .bind(&s.user_ids)
    .bind(&s.usernames)
    .bind(&s.user_admins)
    .execute(&mut *conn)
    .await
    .map_err(|e| taken(e, "a user in the snapshot"))?;
    // GitLab's state and external flag where the snapshot has them (NULL: the mirror's kept).
    sqlx::query(
        "UPDATE users u SET state = COALESCE(t.state, u.state), external = COALESCE(t.external, u.external),
             updated_at = now()
         FROM UNNEST($1::bigint[], $2::text[], $3::boolean[]) AS t(id, state, external)
         WHERE u.id = t.id
           AND (u.state, u.external) IS DISTINCT FROM (COALESCE(t.state, u.state), COALESCE(t.external, u.external))",
    )
    .bind(&s.user_ids)
    .bind(&s.user_states)
    .bind(&s.user_externals)
    .execute(&mut *conn)
    .await
    .map_err(|e| taken(e, "a user in the snapshot"))?;
    let unknown: Option<i64> = sqlx::query_scalar(
        "SELECT ord - 1 FROM UNNEST($1::bigint[]) WITH ORDINALITY AS t(user_id, ord)
         WHERE NOT EXISTS (SELECT 1 FROM users u WHERE u.id = t.user_id) ORDER BY ord LIMIT 1",
    )
    .bind(&s.member_user_ids)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(index) = unknown {
        return Ok(Some(index as usize));
    }
    sqlx::query(
        "INSERT INTO members (user_id, source_type, source_id, access_level)
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::int[])
         ON CONFLICT (user_id, source_type, source_id) DO UPDATE SET access_level = EXCLUDED.access_level
         WHERE members.access_level IS DISTINCT FROM EXCLUDED.access_level",
    )
    .bind(&s.member_user_ids)
    .bind(&s.member_source_types)
    .bind(&s.member_source_ids)
    .bind(&s.member_access_levels)
    .execute(&mut *conn)
    .await?;
    relink(conn, None).await?;
    Ok(None)
}

/// Recomputes, for the groups and projects at or below `prefix` (everything when `None`),
/// the parent group from the path, and each group's `traversal_ids` (top-level group first).
pub async fn relink(conn: &mut PgConnection, prefix: Option<&str>) -> Result<()> {
    let prefix = prefix.map(str::to_lowercase);
    sqlx::query(
        "UPDATE namespaces n SET parent_id = p.id
         FROM namespaces c LEFT JOIN namespaces p ON lower(p.full_path) = envlens_parent_path(c.full_path)
         WHERE n.id = c.id AND ($1::text IS NULL OR envlens_in_subtree(c.full_path, $1))
           AND n.parent_id IS DISTINCT FROM p.id",
    )
    .bind(&prefix)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "WITH RECURSIVE sub AS (
             SELECT id, parent_id FROM namespaces WHERE $1::text IS NULL OR envlens_in_subtree(full_path, $1)
         ), walk (id, ids) AS (
             SELECT s.id, COALESCE(p.traversal_ids, '{}') || s.id
             FROM sub s LEFT JOIN namespaces p ON p.id = s.parent_id
             WHERE s.parent_id IS NULL OR NOT EXISTS (SELECT 1 FROM sub x WHERE x.id = s.parent_id)
             UNION ALL
             SELECT s.id, w.ids || s.id FROM sub s JOIN walk w ON s.parent_id = w.id
         )
         UPDATE namespaces n SET traversal_ids = w.ids FROM walk w
         WHERE n.id = w.id AND n.traversal_ids IS DISTINCT FROM w.ids",
    )
    .bind(&prefix)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE projects pr SET namespace_id = p.id
         FROM projects c LEFT JOIN namespaces p ON lower(p.full_path) = envlens_parent_path(c.full_path)
         WHERE pr.id = c.id AND ($1::text IS NULL OR envlens_in_subtree(c.full_path, $1))
           AND pr.namespace_id IS DISTINCT FROM p.id",
    )
    .bind(&prefix)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A project's full path, when the mirror has it.
pub async fn project_path(db: impl PgExecutor<'_>, id: i64) -> Result<Option<String>> {
    Ok(
        sqlx::query_scalar("SELECT full_path FROM projects WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// The mirror's rows for what a webhook event names by id (`gitlab::hook_scope`), in one
/// statement: each project's and group's full path, each deployment's and deploy job's project
/// path (a job's through its kept request and the deployments that name it; empty where the
/// mirror lacks the project), and the users it has.
pub async fn locate(conn: &mut PgConnection, footprint: &Footprint) -> Result<Located> {
    let projects: Vec<i64> = footprint.projects.iter().map(|p| p.0).collect();
    let groups: Vec<i64> = footprint.groups.iter().map(|g| g.0).collect();
    let rows: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT 'project', id, full_path FROM projects WHERE id = ANY ($1)
         UNION ALL SELECT 'group', id, full_path FROM namespaces WHERE id = ANY ($2)
         UNION ALL SELECT 'user', id, '' FROM users WHERE id = ANY ($3)
         UNION ALL SELECT 'deployment', d.id, COALESCE(p.full_path, '')
             FROM deployments d LEFT JOIN projects p ON p.id = d.project_id WHERE d.id = ANY ($4)
         UNION ALL SELECT 'job', r.job_id, COALESCE(p.full_path, '')
             FROM ci_deployment_requests r LEFT JOIN projects p ON p.id = r.project_id
             WHERE r.job_id = ANY ($5)
         UNION ALL SELECT 'job', d.job_id, COALESCE(p.full_path, '')
             FROM deployments d LEFT JOIN projects p ON p.id = d.project_id WHERE d.job_id = ANY ($5)",
    )
    .bind(&projects)
    .bind(&groups)
    .bind(&footprint.users)
    .bind(&footprint.deployments)
    .bind(&footprint.jobs)
    .fetch_all(conn)
    .await?;
    let mut located = Located::default();
    for (kind, id, path) in rows {
        if let Some(kind) = Kind::parse(&kind) {
            located.rows.entry((kind, id)).or_default().push(path);
        }
    }
    Ok(located)
}
