//! GitLab's side of a pull-based deployment (SPEC 15), as follow-ups retried while GitLab is
//! down (`followups`): `pull_create` creates the deployment in GitLab
//! (`POST /projects/:id/deployments`, `doc/api/deployments.md`), keeps GitLab's id and gives
//! it to envlens' own deployment; `pull_finish` sends the final status
//! (`PUT /projects/:id/deployments/:deployment_id`). Only with a token of scope `api`: a token
//! without it (`GET /personal_access_tokens/self`) leaves the deployment envlens' own, with
//! that reason.

use axum::http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;

use super::sync::Failed;
use crate::db::pull as db;
use crate::error::Error;
use crate::gitlab::api::{ApiError, GitLab};

/// What GitLab answers of a deployment, as far as envlens reads it.
#[derive(Debug, Deserialize)]
struct Created {
    id: i64,
}

/// `GET /personal_access_tokens/self`, as far as envlens reads it.
#[derive(Debug, Deserialize)]
struct TokenSelf {
    #[serde(default)]
    scopes: Vec<String>,
}

type Outcome = Result<(&'static str, String), Failed>;

/// Keeps why GitLab is not told, and says so.
async fn not_told(pool: &PgPool, own_id: i64, reason: String) -> Outcome {
    sqlx::query("UPDATE pull_deployments SET gitlab_reason = $2 WHERE own_id = $1")
        .bind(own_id)
        .bind(&reason)
        .execute(pool)
        .await
        .map_err(Error::from)?;
    Ok(("not_sent", reason))
}

/// `pull_create`: the deployment created in GitLab once, then given GitLab's id.
pub async fn create(pool: &PgPool, api: &GitLab, own_id: i64) -> Outcome {
    let Some(pull) = db::pull(pool, own_id).await? else {
        return Ok(("gone", format!("no pull-based deployment {own_id}")));
    };
    if let Some(reason) = pull.gitlab_reason {
        return Ok(("not_sent", reason));
    }
    let gitlab_id = match pull.gitlab_id {
        Some(id) => id,
        None => {
            // An access token says its scopes; another kind of token (404) is left to GitLab.
            let token: Option<TokenSelf> = api
                .get_optional(
                    "/personal_access_tokens/self",
                    "/api/v4/personal_access_tokens/self",
                    None,
                )
                .await?;
            if token.is_some_and(|t| !t.scopes.iter().any(|s| s == "api")) {
                let reason = "envlens' GitLab token has no `api` scope, so no deployment was \
                              created in GitLab"
                    .to_owned();
                return not_told(pool, own_id, reason).await;
            }
            let (Some(sha), Some(git_ref)) = (&pull.sha, &pull.git_ref) else {
                let reason = "the revision names no commit or no branch".to_owned();
                return not_told(pool, own_id, reason).await;
            };
            let body = json!({"environment": pull.environment, "sha": sha, "ref": git_ref,
                              "tag": pull.tag.unwrap_or(false), "status": "running"});
            let created: Result<Created, ApiError> = api
                .send_json(
                    Method::POST,
                    "/projects/:id/deployments",
                    &format!("/api/v4/projects/{}/deployments", pull.project_id),
                    &body,
                )
                .await;
            let created = match created {
                Ok(created) => created,
                Err(ApiError::Status { status, .. })
                    if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS =>
                {
                    let reason = format!(
                        "GitLab refused to create the deployment ({status}), so it is envlens' own"
                    );
                    return not_told(pool, own_id, reason).await;
                }
                Err(e) => return Err(e.into()),
            };
            db::set_gitlab_id(pool, own_id, created.id).await?;
            created.id
        }
    };
    let mut tx = pool.begin().await.map_err(Error::from)?;
    db::take_gitlab_id(&mut tx, own_id, gitlab_id).await?;
    tx.commit().await.map_err(Error::from)?;
    Ok((
        "created",
        format!("created in GitLab as deployment {gitlab_id}"),
    ))
}

/// `pull_finish`: GitLab told the deployment's final status, once GitLab has it.
pub async fn finish(pool: &PgPool, api: &GitLab, own_id: i64) -> Outcome {
    let Some(pull) = db::pull(pool, own_id).await? else {
        return Ok(("gone", format!("no pull-based deployment {own_id}")));
    };
    if let Some(reason) = pull.gitlab_reason {
        return Ok(("not_sent", reason));
    }
    let Some(gitlab_id) = pull.gitlab_id else {
        return Err(Failed::Setup(
            "GitLab has not created the deployment yet".to_owned(),
        ));
    };
    let _: serde_json::Value = api
        .send_json(
            Method::PUT,
            "/projects/:id/deployments/:deployment_id",
            &format!(
                "/api/v4/projects/{}/deployments/{gitlab_id}",
                pull.project_id
            ),
            &json!({"status": pull.status}),
        )
        .await?;
    Ok((
        "finished",
        format!("GitLab's deployment {gitlab_id} is {}", pull.status),
    ))
}
