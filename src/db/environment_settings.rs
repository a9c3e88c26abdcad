//! SQL of what project Maintainers set on an environment (SPEC 15, migration 0057): namespaces
//! beyond its deployment's, and the Argo CD Application bound to it; and the one fact their
//! permission needs, the user's role in the project.

use sqlx::PgExecutor;

use crate::error::Result;

/// The namespaces added to the environment, in the order they were given; none by default.
pub async fn namespaces(db: impl PgExecutor<'_>, environment_id: i64) -> Result<Vec<String>> {
    let found: Option<Vec<String>> =
        sqlx::query_scalar("SELECT namespaces FROM environment_settings WHERE environment_id = $1")
            .bind(environment_id)
            .fetch_optional(db)
            .await?;
    Ok(found.unwrap_or_default())
}

/// What a GitOps view of the environment reads before it lists, in one round trip: the
/// namespaces added to it ([`namespaces`]) and those its sources spanned when last read
/// ([`spanned_namespaces`]), each empty when there are none.
pub async fn gitops_namespaces(
    db: impl PgExecutor<'_>,
    environment_id: i64,
) -> Result<(Vec<String>, Vec<String>)> {
    let found: (Option<Vec<String>>, Option<Vec<String>>) = sqlx::query_as(
        "SELECT (SELECT namespaces FROM environment_settings WHERE environment_id = $1),
                (SELECT namespaces FROM gitops_spanned_namespaces WHERE environment_id = $1)",
    )
    .bind(environment_id)
    .fetch_one(db)
    .await?;
    Ok((found.0.unwrap_or_default(), found.1.unwrap_or_default()))
}

/// The namespaces the environment's GitOps sources spanned when last read (migration 0066): a
/// hint of which to list first, none before its first view.
pub async fn spanned_namespaces(
    db: impl PgExecutor<'_>,
    environment_id: i64,
) -> Result<Vec<String>> {
    let found: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT namespaces FROM gitops_spanned_namespaces WHERE environment_id = $1",
    )
    .bind(environment_id)
    .fetch_optional(db)
    .await?;
    Ok(found.unwrap_or_default())
}

/// Keeps `namespaces` as those the environment's GitOps sources spanned when last read.
pub async fn set_spanned_namespaces(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    namespaces: &[String],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO gitops_spanned_namespaces (environment_id, namespaces) VALUES ($1, $2)
         ON CONFLICT (environment_id) DO UPDATE
           SET namespaces = excluded.namespaces, updated_at = now()
           WHERE gitops_spanned_namespaces.namespaces <> excluded.namespaces",
    )
    .bind(environment_id)
    .bind(namespaces)
    .execute(db)
    .await?;
    Ok(())
}

/// Replaces the namespaces added to the environment.
pub async fn set_namespaces(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    namespaces: &[String],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO environment_settings (environment_id, namespaces) VALUES ($1, $2)
         ON CONFLICT (environment_id) DO UPDATE
           SET namespaces = excluded.namespaces, updated_at = now()",
    )
    .bind(environment_id)
    .bind(namespaces)
    .execute(db)
    .await?;
    Ok(())
}

/// The Argo CD Application bound to the environment, `(namespace, name)`; `None` when unbound.
/// What the grouping code reads to add the Application's `status.resources` as a source.
pub async fn argo_application(
    db: impl PgExecutor<'_>,
    environment_id: i64,
) -> Result<Option<(String, String)>> {
    let found: Option<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT argo_application_namespace, argo_application_name FROM environment_settings
         WHERE environment_id = $1",
    )
    .bind(environment_id)
    .fetch_optional(db)
    .await?;
    Ok(match found {
        Some((Some(namespace), Some(name))) => Some((namespace, name)),
        _ => None,
    })
}

/// Binds the environment to an Argo CD Application, or unbinds it (`None`).
pub async fn set_argo_application(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    application: Option<(&str, &str)>,
) -> Result<()> {
    let (namespace, name) = application.unzip();
    sqlx::query(
        "INSERT INTO environment_settings (environment_id, argo_application_namespace, argo_application_name)
         VALUES ($1, $2, $3)
         ON CONFLICT (environment_id) DO UPDATE
           SET argo_application_namespace = excluded.argo_application_namespace,
               argo_application_name = excluded.argo_application_name, updated_at = now()",
    )
    .bind(environment_id)
    .bind(namespace)
    .bind(name)
    .execute(db)
    .await?;
    Ok(())
}

/// The user's access level in the project: the highest of their memberships of it and of its
/// ancestor groups (GitLab's effective role); `None` without any. Admins are judged by the
/// caller.
pub async fn project_access_level(
    db: impl PgExecutor<'_>,
    user_id: i64,
    project_id: i64,
) -> Result<Option<i32>> {
    Ok(sqlx::query_scalar(
        "SELECT max(m.access_level) FROM projects p LEFT JOIN namespaces n ON n.id = p.namespace_id
         JOIN members m ON m.user_id = $1
           AND ((m.source_type = 'project' AND m.source_id = p.id)
             OR (m.source_type = 'group' AND m.source_id = ANY (n.traversal_ids)))
         WHERE p.id = $2",
    )
    .bind(user_id)
    .bind(project_id)
    .fetch_one(db)
    .await?)
}
