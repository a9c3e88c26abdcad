//! SQL of the deployment history (SPEC 10): the snapshot jobs, the content-addressed manifests
//! and chunks, the snapshots, and retention.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::error::Result;

/// Queues the snapshot of a deployment, once: only when it is `success` and has an agent, so
/// both the status hook and the creation call may ask, in whichever order they arrive. True
/// when this call queued it.
pub async fn enqueue(conn: &mut PgConnection, deployment_id: i64) -> Result<bool> {
    let queued = sqlx::query(
        "INSERT INTO snapshot_jobs (deployment_id)
         SELECT d.id FROM deployments d JOIN agent_deployments a ON a.deployment_id = d.id
         WHERE d.id = $1 AND d.status = 'success'
         ON CONFLICT (deployment_id) DO NOTHING",
    )
    .bind(deployment_id)
    .execute(conn)
    .await?;
    Ok(queued.rows_affected() == 1)
}

/// A claimed job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Job {
    pub deployment_id: i64,
    pub phase: String,
    pub attempts: i32,
}

/// Claims the job due first for `lease_seconds`: SKIP LOCKED, so that claimers never wait on
/// each other, and a lease rather than a held transaction, so that a claimer that dies leaves
/// the job to another once the lease ends.
pub async fn claim(pool: &PgPool, lease_seconds: f64) -> Result<Option<Job>> {
    Ok(sqlx::query_as(
        "UPDATE snapshot_jobs SET claimed_until = now() + make_interval(secs => $1), updated_at = now()
         WHERE deployment_id = (
             SELECT deployment_id FROM snapshot_jobs
             WHERE phase IN ('taken', 'settling') AND due_at <= now()
               AND (claimed_until IS NULL OR claimed_until < now())
             ORDER BY due_at LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING deployment_id, phase, attempts",
    )
    .bind(lease_seconds)
    .fetch_optional(pool)
    .await?)
}

/// When the next job is due, if any is waiting.
pub async fn next_due(pool: &PgPool) -> Result<Option<DateTime<Utc>>> {
    Ok(sqlx::query_scalar(
        "SELECT min(GREATEST(due_at, COALESCE(claimed_until, due_at))) FROM snapshot_jobs
         WHERE phase IN ('taken', 'settling')",
    )
    .fetch_one(pool)
    .await?)
}

/// Leaves the job in `phase`, due again after `delay_seconds` (with the error of this
/// attempt, if any, and the attempt counted when `failed_attempt`), unclaimed.
pub async fn reschedule(
    pool: &PgPool,
    deployment_id: i64,
    phase: &str,
    delay_seconds: f64,
    error: Option<&str>,
    failed_attempt: bool,
) -> Result<()> {
    sqlx::query(
        "UPDATE snapshot_jobs SET phase = $2, due_at = now() + make_interval(secs => $3),
             last_error = $4, attempts = attempts + $5::int, claimed_until = NULL, updated_at = now()
         WHERE deployment_id = $1",
    )
    .bind(deployment_id)
    .bind(phase)
    .bind(delay_seconds)
    .bind(error)
    .bind(i32::from(failed_attempt))
    .execute(pool)
    .await?;
    Ok(())
}

/// Ends the job in `phase` (`done`, `superseded`, `failed`).
pub async fn finish(
    pool: &PgPool,
    deployment_id: i64,
    phase: &str,
    error: Option<&str>,
) -> Result<()> {
    reschedule(pool, deployment_id, phase, 0.0, error, error.is_some()).await
}

/// A job as `envlens history` and the tests read it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JobState {
    pub phase: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub due_at: DateTime<Utc>,
}

pub async fn job(conn: &mut PgConnection, deployment_id: i64) -> Result<Option<JobState>> {
    Ok(sqlx::query_as(
        "SELECT phase, attempts, last_error, due_at FROM snapshot_jobs WHERE deployment_id = $1",
    )
    .bind(deployment_id)
    .fetch_optional(conn)
    .await?)
}

/// What a job needs to read the deployment's resource group.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Target {
    pub environment_id: Option<i64>,
    pub project_id: i64,
    pub environment_slug: Option<String>,
    pub agent_id: i64,
    pub agent_name: String,
    pub agent_project_path: String,
    pub namespace: String,
    /// A newer successful deployment of the environment went through an agent: the cluster
    /// shows that one now.
    pub superseded: bool,
    /// A pull-based deployment (SPEC 15): its status follows the group's health.
    pub pull: bool,
}

pub async fn target(pool: &PgPool, deployment_id: i64) -> Result<Option<Target>> {
    Ok(sqlx::query_as(
        "SELECT d.environment_id, d.project_id, e.slug AS environment_slug, a.agent_id,
                c.name AS agent_name, p.full_path AS agent_project_path,
                a.kubernetes_namespace AS namespace,
                EXISTS (SELECT 1 FROM deployments n JOIN agent_deployments na ON na.deployment_id = n.id
                        WHERE n.environment_id = d.environment_id AND n.status = 'success'
                          -- envlens' own ids (pull-based, negative) are newer as they are made.
                          AND CASE WHEN d.id < 0 OR n.id < 0 THEN n.created_at > d.created_at
                                   ELSE n.id > d.id END) AS superseded,
                EXISTS (SELECT 1 FROM pull_deployments x WHERE x.deployment_id = d.id) AS pull
         FROM deployments d
         JOIN agent_deployments a ON a.deployment_id = d.id
         JOIN cluster_agents c ON c.id = a.agent_id
         JOIN projects p ON p.id = c.project_id
         LEFT JOIN environments e ON e.id = d.environment_id
         WHERE d.id = $1",
    )
    .bind(deployment_id)
    .fetch_optional(pool)
    .await?)
}

/// Serializes the writers and the collector of one environment's history (a key space of
/// its own: the two-integer advisory locks).
pub async fn lock_environment(conn: &mut PgConnection, environment_id: i64) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(1936614772, ($1 % 2147483647)::int)")
        .bind(environment_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Which of `hashes` the environment does not store yet, in `table` (`history_manifests` or
/// `history_chunks`).
async fn missing(
    conn: &mut PgConnection,
    table: Table,
    environment_id: i64,
    hashes: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>> {
    let sql = format!(
        "SELECT h FROM unnest($2::bytea[]) h
         WHERE NOT EXISTS (SELECT 1 FROM {} t WHERE t.environment_id = $1 AND t.hash = h)",
        table.name()
    );
    Ok(sqlx::query_scalar(&sql)
        .bind(environment_id)
        .bind(hashes)
        .fetch_all(conn)
        .await?)
}

async fn insert(
    conn: &mut PgConnection,
    table: Table,
    environment_id: i64,
    hashes: &[Vec<u8>],
    bodies: &[Vec<u8>],
) -> Result<()> {
    let sql = format!(
        "INSERT INTO {} (environment_id, hash, body)
         SELECT $1, h, b FROM unnest($2::bytea[], $3::bytea[]) AS t(h, b)
         ON CONFLICT DO NOTHING",
        table.name()
    );
    sqlx::query(&sql)
        .bind(environment_id)
        .bind(hashes)
        .bind(bodies)
        .execute(conn)
        .await?;
    Ok(())
}

#[derive(Clone, Copy)]
enum Table {
    Manifests,
    Chunks,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Manifests => "history_manifests",
            Table::Chunks => "history_chunks",
        }
    }
}

pub async fn missing_manifests(
    conn: &mut PgConnection,
    environment_id: i64,
    hashes: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>> {
    missing(conn, Table::Manifests, environment_id, hashes).await
}

pub async fn missing_chunks(
    conn: &mut PgConnection,
    environment_id: i64,
    hashes: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>> {
    missing(conn, Table::Chunks, environment_id, hashes).await
}

pub async fn insert_manifests(
    conn: &mut PgConnection,
    environment_id: i64,
    hashes: &[Vec<u8>],
    bodies: &[Vec<u8>],
) -> Result<()> {
    insert(conn, Table::Manifests, environment_id, hashes, bodies).await
}

pub async fn insert_chunks(
    conn: &mut PgConnection,
    environment_id: i64,
    hashes: &[Vec<u8>],
    bodies: &[Vec<u8>],
) -> Result<()> {
    insert(conn, Table::Chunks, environment_id, hashes, bodies).await
}

/// The first snapshot of a deployment.
pub struct NewSnapshot<'a> {
    pub deployment_id: i64,
    pub environment_id: i64,
    pub health: &'a str,
    pub health_message: Option<&'a str>,
    pub chunks: &'a [Vec<u8>],
    pub errors: Option<serde_json::Value>,
    /// The group was not PROGRESSING: this snapshot is the settled one too (time to healthy 0
    /// when HEALTHY).
    pub settled: bool,
}

/// Records the first snapshot; false (and nothing written) when the deployment has one: the
/// primary key is what makes a snapshot happen once.
pub async fn insert_snapshot(conn: &mut PgConnection, s: &NewSnapshot<'_>) -> Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO deployment_snapshots (deployment_id, environment_id, taken_at, health, health_message, chunks, errors,
                                           settled_at, settled_health, settled_message, time_to_healthy)
         VALUES ($1, $2, now(), $3, $4, $5, $6, CASE WHEN $7 THEN now() END, CASE WHEN $7 THEN $3 END,
                 CASE WHEN $7 THEN $4 END, CASE WHEN $7 AND $3 = 'Healthy' THEN 0 END)
         ON CONFLICT (deployment_id) DO NOTHING",
    )
    .bind(s.deployment_id)
    .bind(s.environment_id)
    .bind(s.health)
    .bind(s.health_message)
    .bind(s.chunks)
    .bind(&s.errors)
    .bind(s.settled)
    .execute(conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// The settled snapshot: `chunks` `None` when the resources are those of the first one.
/// `time_to_healthy` is computed from the stored `taken_at` when the group is healthy.
pub async fn settle(
    conn: &mut PgConnection,
    deployment_id: i64,
    health: &str,
    message: Option<&str>,
    chunks: Option<&[Vec<u8>]>,
    healthy: bool,
) -> Result<bool> {
    let settled = sqlx::query(
        "UPDATE deployment_snapshots SET settled_at = GREATEST(now(), taken_at), settled_health = $2,
             settled_message = $3, settled_chunks = $4,
             time_to_healthy = CASE WHEN $5 THEN GREATEST(extract(epoch FROM now() - taken_at)::float8, 0) END
         WHERE deployment_id = $1 AND settled_at IS NULL",
    )
    .bind(deployment_id)
    .bind(health)
    .bind(message)
    .bind(chunks)
    .bind(healthy)
    .execute(conn)
    .await?;
    Ok(settled.rows_affected() == 1)
}

/// Keeps the snapshots of the newest `keep` deployments of the environment; then forgets the
/// chunks no snapshot names, and the finished jobs of the deployments whose snapshots went.
/// Returns how many snapshots went.
pub async fn prune(conn: &mut PgConnection, environment_id: i64, keep: i64) -> Result<u64> {
    let gone = sqlx::query(
        "DELETE FROM deployment_snapshots WHERE environment_id = $1 AND deployment_id < ALL (
             SELECT deployment_id FROM deployment_snapshots WHERE environment_id = $1
             ORDER BY deployment_id DESC LIMIT $2)",
    )
    .bind(environment_id)
    .bind(keep)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if gone > 0 {
        sqlx::query(
            "DELETE FROM history_chunks c WHERE c.environment_id = $1 AND NOT EXISTS (
                 SELECT 1 FROM deployment_snapshots s WHERE s.environment_id = $1
                   AND (c.hash = ANY (s.chunks) OR c.hash = ANY (s.settled_chunks)))",
        )
        .bind(environment_id)
        .execute(&mut *conn)
        .await?;
        // Finished jobs of deployments without a snapshot now: a late hook for one queues a
        // job again, which then finds a newer deployment and ends as superseded.
        sqlx::query(
            "DELETE FROM snapshot_jobs j USING deployments d
             WHERE d.id = j.deployment_id AND d.environment_id = $1
               AND j.phase IN ('done', 'superseded', 'failed')
               AND NOT EXISTS (SELECT 1 FROM deployment_snapshots s WHERE s.deployment_id = j.deployment_id)",
        )
        .bind(environment_id)
        .execute(&mut *conn)
        .await?;
    }
    Ok(gone)
}

/// The bodies of every chunk the environment keeps (for collecting manifests).
pub async fn all_chunks(conn: &mut PgConnection, environment_id: i64) -> Result<Vec<Vec<u8>>> {
    Ok(
        sqlx::query_scalar("SELECT body FROM history_chunks WHERE environment_id = $1")
            .bind(environment_id)
            .fetch_all(conn)
            .await?,
    )
}

/// Forgets the environment's manifests other than `keep`.
pub async fn delete_manifests_except(
    conn: &mut PgConnection,
    environment_id: i64,
    keep: &[Vec<u8>],
) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM history_manifests WHERE environment_id = $1 AND NOT (hash = ANY ($2::bytea[]))",
    )
    .bind(environment_id)
    .bind(keep)
    .execute(conn)
    .await?
    .rows_affected())
}

/// A deployment's snapshot row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SnapshotRow {
    pub deployment_id: i64,
    pub environment_id: i64,
    pub taken_at: DateTime<Utc>,
    pub health: String,
    pub health_message: Option<String>,
    pub chunks: Vec<Vec<u8>>,
    pub errors: Option<serde_json::Value>,
    pub settled_at: Option<DateTime<Utc>>,
    pub settled_health: Option<String>,
    pub settled_message: Option<String>,
    pub settled_chunks: Option<Vec<Vec<u8>>>,
    pub time_to_healthy: Option<f64>,
}

const SNAPSHOT_COLUMNS: &str =
    "deployment_id, environment_id, taken_at, health, health_message, chunks, errors, \
     settled_at, settled_health, settled_message, settled_chunks, time_to_healthy";

pub async fn snapshot(conn: &mut PgConnection, deployment_id: i64) -> Result<Option<SnapshotRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {SNAPSHOT_COLUMNS} FROM deployment_snapshots WHERE deployment_id = $1"
    ))
    .bind(deployment_id)
    .fetch_optional(conn)
    .await?)
}

/// The snapshot of the environment's newest deployment before `deployment_id` that has one.
pub async fn previous_snapshot(
    conn: &mut PgConnection,
    environment_id: i64,
    deployment_id: i64,
) -> Result<Option<SnapshotRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {SNAPSHOT_COLUMNS} FROM deployment_snapshots
         WHERE environment_id = $1 AND deployment_id < $2 ORDER BY deployment_id DESC LIMIT 1"
    ))
    .bind(environment_id)
    .bind(deployment_id)
    .fetch_optional(conn)
    .await?)
}

/// The bodies of `hashes`, in their order (a missing one is left out).
pub async fn chunk_bodies(
    conn: &mut PgConnection,
    environment_id: i64,
    hashes: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>> {
    Ok(sqlx::query_scalar(
        "SELECT c.body FROM unnest($2::bytea[]) WITH ORDINALITY AS h(hash, i)
         JOIN history_chunks c ON c.environment_id = $1 AND c.hash = h.hash ORDER BY h.i",
    )
    .bind(environment_id)
    .bind(hashes)
    .fetch_all(conn)
    .await?)
}

/// The stored manifests of `hashes`, with their hashes.
pub async fn manifests(
    conn: &mut PgConnection,
    environment_id: i64,
    hashes: &[Vec<u8>],
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    Ok(sqlx::query_as(
        "SELECT hash, body FROM history_manifests WHERE environment_id = $1 AND hash = ANY ($2::bytea[])",
    )
    .bind(environment_id)
    .bind(hashes)
    .fetch_all(conn)
    .await?)
}

/// A deployment's id by project path, environment name and (optionally) iid; the newest
/// successful one without an iid.
pub async fn find_deployment(
    conn: &mut PgConnection,
    project_path: &str,
    environment: &str,
    iid: Option<i64>,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT d.id FROM deployments d JOIN projects p ON p.id = d.project_id
         JOIN environments e ON e.id = d.environment_id
         WHERE lower(p.full_path) = lower($1) AND e.name = $2
           AND ($3::bigint IS NULL AND d.status = 'success' OR d.iid = $3)
         ORDER BY d.id DESC LIMIT 1",
    )
    .bind(project_path)
    .bind(environment)
    .bind(iid)
    .fetch_optional(conn)
    .await?)
}

/// A deployment by id, as GraphQL shows it.
pub async fn deployment(
    conn: &mut PgConnection,
    id: i64,
) -> Result<Option<crate::db::read::DeploymentRow>> {
    Ok(sqlx::query_as(
        "SELECT id, iid, environment_id, status, ref, sha, tag, created_at, updated_at, finished_at
         FROM deployments WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?)
}
