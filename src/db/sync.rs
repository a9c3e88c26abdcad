//! SQL of a sync pass from GitLab's API (SPEC 12.3) beyond the identity snapshot's: users seen
//! only as members, the removal of what GitLab no longer has (after a complete pass only), and
//! how many rows the pass's transaction wrote.

use sqlx::PgConnection;

use crate::error::Result;

/// Creates or renames users seen as members, keeping the admin and external flags the mirror
/// has, with the state the members API shows (`None` keeps the mirror's; `active` when new).
/// The members API does not say who is external: a user new to the mirror counts as external
/// (no internal project they are not a member of) until GitLab says otherwise (an
/// administrator's sync, their own profile at sign-in), so that an unknown flag opens nothing.
pub async fn put_member_users(
    conn: &mut PgConnection,
    ids: &[i64],
    usernames: &[String],
    states: &[Option<String>],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO users (id, username, external) SELECT id, username, true FROM UNNEST($1::bigint[], $2::text[]) AS t(id, username)
         ON CONFLICT (id) DO UPDATE SET username = EXCLUDED.username, updated_at = now()
         WHERE users.username IS DISTINCT FROM EXCLUDED.username",
    )
    .bind(ids)
    .bind(usernames)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE users u SET state = t.state, updated_at = now()
         FROM UNNEST($1::bigint[], $2::text[]) AS t(id, state)
         WHERE u.id = t.id AND t.state IS NOT NULL AND u.state <> t.state",
    )
    .bind(ids)
    .bind(states)
    .execute(conn)
    .await?;
    Ok(())
}

/// What a complete pass saw, to remove the rest.
pub struct Seen<'a> {
    /// Lower-cased full paths of the top-level groups synced; `None`: every group.
    pub roots: Option<&'a [String]>,
    /// Whether `user_ids` is every user of the instance (an administrator's token): only then
    /// are the users it lacks removed.
    pub all_users: bool,
    pub group_ids: &'a [i64],
    pub project_ids: &'a [i64],
    /// Every user GitLab listed, and those seen as members.
    pub user_ids: &'a [i64],
    /// Direct memberships: `(user, 'group'|'project', source)` as columns.
    pub member_users: &'a [i64],
    pub member_types: &'a [String],
    pub member_sources: &'a [i64],
    pub agent_ids: &'a [i64],
    pub environment_ids: &'a [i64],
}

/// Removes, within the pass's scope, the groups, projects (with their agents, environments and
/// deployments), users, memberships, agents and environments GitLab no longer has. The number
/// of rows removed directly (cascades not counted).
pub async fn remove_unseen(conn: &mut PgConnection, seen: &Seen<'_>) -> Result<u64> {
    let mut removed = 0;
    let in_scope = |column: &str| {
        format!(
            "($1::text[] IS NULL OR EXISTS (SELECT 1 FROM unnest($1::text[]) r WHERE envlens_in_subtree({column}, r)))"
        )
    };
    removed += sqlx::query(&format!(
        "DELETE FROM members m WHERE NOT EXISTS (
             SELECT 1 FROM UNNEST($2::bigint[], $3::text[], $4::bigint[]) s(u, t, i)
             WHERE s.u = m.user_id AND s.t = m.source_type AND s.i = m.source_id)
         AND ((m.source_type = 'group' AND m.source_id IN (SELECT id FROM namespaces WHERE {}))
           OR (m.source_type = 'project' AND m.source_id IN (SELECT id FROM projects WHERE {})))",
        in_scope("full_path"),
        in_scope("full_path"),
    ))
    .bind(seen.roots)
    .bind(seen.member_users)
    .bind(seen.member_types)
    .bind(seen.member_sources)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    removed += sqlx::query(&format!(
        "DELETE FROM cluster_agents a USING projects p WHERE p.id = a.project_id
         AND p.id = ANY ($2::bigint[]) AND a.id <> ALL ($3::bigint[]) AND {}",
        in_scope("p.full_path")
    ))
    .bind(seen.roots)
    .bind(seen.project_ids)
    .bind(seen.agent_ids)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    removed += sqlx::query(&format!(
        "DELETE FROM environments e USING projects p WHERE p.id = e.project_id
         AND p.id = ANY ($2::bigint[]) AND e.id <> ALL ($3::bigint[]) AND {}",
        in_scope("p.full_path")
    ))
    .bind(seen.roots)
    .bind(seen.project_ids)
    .bind(seen.environment_ids)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    removed += sqlx::query(&format!(
        "DELETE FROM projects WHERE id <> ALL ($2::bigint[]) AND {}",
        in_scope("full_path")
    ))
    .bind(seen.roots)
    .bind(seen.project_ids)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    removed += sqlx::query(&format!(
        "DELETE FROM namespaces WHERE id <> ALL ($2::bigint[]) AND {}",
        in_scope("full_path")
    ))
    .bind(seen.roots)
    .bind(seen.group_ids)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if seen.all_users {
        removed += sqlx::query("DELETE FROM users WHERE id <> ALL ($1::bigint[])")
            .bind(seen.user_ids)
            .execute(&mut *conn)
            .await?
            .rows_affected();
    }
    Ok(removed)
}

/// Rows inserted, updated and deleted so far by the current transaction, in every table.
pub async fn rows_written(conn: &mut PgConnection) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_xact_user_tables",
    )
    .fetch_one(conn)
    .await?)
}

/// The advisory lock key of a sync pass ("envlens sync" as an integer).
const PASS_LOCK: i64 = 0x656e_766c_656e_7353;

/// Takes the lock of sync passes on this session, if no other replica holds it: one pass at a
/// time across every envlens of a database. Released by [`unlock_pass`] or the session's end.
pub async fn try_lock_pass(conn: &mut PgConnection) -> Result<bool> {
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(PASS_LOCK)
        .fetch_one(conn)
        .await?)
}

/// Releases the lock, and the step [`show_step`] showed.
pub async fn unlock_pass(conn: &mut PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(PASS_LOCK)
        .execute(&mut *conn)
        .await?;
    sqlx::query("RESET application_name").execute(conn).await?;
    Ok(())
}

/// What the session holding the lock names itself while it runs a pass: [`STEP_PREFIX`] and
/// the pass' last step. PostgreSQL shows every session's `application_name` in
/// `pg_stat_activity` (to its administrators too), and keeps its first 63 bytes.
const STEP_PREFIX: &str = "envlens sync: ";

/// Shows the pass' step (`projects read: 200/1300`) as the lock's session's name, for
/// another envlens waiting for the pass ([`running_step`]).
pub async fn show_step(conn: &mut PgConnection, step: &str) -> Result<()> {
    sqlx::query("SELECT set_config('application_name', $1, false)")
        .bind(format!("{STEP_PREFIX}{step}"))
        .execute(conn)
        .await?;
    Ok(())
}

/// The step of the pass that holds the lock on this database, as its session shows it; `None`
/// when no pass runs, or one that shows none (an envlens before this one).
pub async fn running_step(conn: &mut PgConnection) -> Result<Option<String>> {
    let name: Option<String> = sqlx::query_scalar(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.classid = ($1 >> 32)::oid AND l.objid = ($1 & 4294967295)::oid
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
         LIMIT 1",
    )
    .bind(PASS_LOCK)
    .fetch_optional(conn)
    .await?;
    Ok(name.and_then(|n| n.strip_prefix(STEP_PREFIX).map(str::to_owned)))
}
