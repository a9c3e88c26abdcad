//! Deployments from the deploy job itself (SPEC 12.2), for a GitLab that does not call envlens:
//! `POST /api/v4/ci/deployments` with the job's CI/CD ID token and its `environment:kubernetes`
//! (`{"agent", "namespace"}`, or GitLab 18's `dashboard` shape), joined with GitLab's Deployment
//! Hook, which names the deployment of that job (`deployable_id`), in whichever order they come.
//! Both end as the creation call of SPEC 4.3 does: the same `ci_access` decision, the same row,
//! the same answers, replays included. Before the hook the job is answered all the same, since
//! the decision needs no deployment id: 200 with the reason when it may not use the agent, 202
//! with the agent and namespace when it may (`deployment_id` null until the hook names it).

use axum::extract::State;
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::Json as JsonResponse;
use serde_json::{json, Value};
use sqlx::PgConnection;

use super::deployments::{
    agent_deployment, authorize, claim, record, refused, Answer, KubernetesIn, Outcome,
};
use crate::db::deployments::{self as db, CiRequest};
use crate::db::identity;
use crate::error::{Error, Result};
use crate::gitlab::access::Job;
use crate::gitlab::id_token::Refused;
use crate::http::extract::Json;
use crate::state::AppState;

/// `POST /api/v4/ci/deployments`.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(kubernetes): Json<KubernetesIn>,
) -> Result<Answer> {
    let Some(gitlab) = &state.gitlab else {
        return Err(Error::NotFound(
            "deployments from CI/CD ID tokens need `gitlab.url` in envlens' configuration file"
                .into(),
        ));
    };
    let token = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            Error::Unauthorized("send the job's CI/CD ID token as `Authorization: Bearer`".into())
        })?;
    let job = match gitlab.id_tokens.verify(token.trim()).await {
        Ok(job) => job,
        Err(Refused::Keys(e)) => return Err(Error::BadGateway(e.to_string())),
        Err(refused) => return Err(Error::Unauthorized(refused.to_string())),
    };
    let id =
        |claim: &str, value: &str| {
            value.parse::<i64>().ok().filter(|v| *v > 0).ok_or_else(|| {
                Error::Unauthorized(format!("the ID token's `{claim}` is not an id"))
            })
        };
    let project_id = id("project_id", &job.project_id)?;
    let job_id = id("job_id", &job.job_id)?;
    let environment = job.environment.clone().ok_or_else(|| {
        Error::invalid(
            "environment",
            "the ID token names no environment: only a job with `environment:` deploys",
        )
    })?;
    let target = kubernetes.target()?;
    let request = CiRequest {
        job_id,
        project_id,
        environment,
        ref_protected: job.ref_protected == "true",
        git_ref: job.git_ref.clone().unwrap_or_default(),
        kubernetes: sqlx::types::Json(kubernetes_json(&kubernetes)),
    };

    let mut tx = state.db.begin().await?;
    db::lock_job(&mut tx, job_id).await?;
    identity::upsert_project(&mut tx, project_id, &job.project_path, None).await?;
    let kept = db::put_ci_request(&mut tx, &request).await?;
    if let Some(earlier) = kept.earlier {
        if earlier != request {
            return Err(Error::Conflict(format!(
                "job {job_id} already asked for {}",
                earlier.kubernetes.0
            )));
        }
    }
    let job = Job {
        project_path: &job.project_path,
        environment: &request.environment,
        git_ref: &request.git_ref,
        protected_ref: request.ref_protected,
    };
    let answer = match kept.deployment_id {
        Some(deployment_id) => match claim(&mut tx, deployment_id, Some(&target)).await? {
            Some(earlier) => earlier,
            None => {
                record(
                    &mut tx,
                    deployment_id,
                    &job,
                    project_id,
                    Some(&target),
                    true,
                )
                .await?
            }
        },
        // GitLab's hook has not named the deployment yet, but the decision needs none: a
        // refusal is final at once, an allowed job learns its agent and namespace now. The
        // hook records the row under the same rules.
        None => match authorize(&mut tx, &job, project_id, &target).await? {
            Outcome::Refused(reason) => refused(None, &reason),
            Outcome::Written(row) => (
                StatusCode::ACCEPTED,
                JsonResponse(json!({
                    "deployment_id": null,
                    "agent_deployment": agent_deployment(&row),
                    "reason": format!("waiting for GitLab's deployment hook of job {job_id}: the deployment is recorded with this agent and namespace when it names it"),
                })),
            ),
        },
    };
    tx.commit().await?;
    Ok(answer)
}

/// When a Deployment Hook names the deployment of a job that asked first: records its agent
/// as the job's call would have. Nothing when the job did not ask, or its deployment was
/// already decided (a redelivered hook).
pub(super) async fn join_hook(
    conn: &mut PgConnection,
    deployment_id: i64,
    job_id: i64,
    project_path: &str,
) -> Result<()> {
    db::lock_job(conn, job_id).await?;
    db::link_job(conn, deployment_id, job_id).await?;
    let Some(request) = db::ci_request(conn, job_id).await? else {
        return Ok(());
    };
    let kubernetes: KubernetesIn = match serde_json::from_value(request.kubernetes.0.clone()) {
        Ok(k) => k,
        // Kept only after it parsed; a later version that reads it differently says so.
        Err(e) => {
            tracing::warn!(job_id, error = %e, "a kept CI deployment request no longer parses");
            return Ok(());
        }
    };
    let target = kubernetes.target()?;
    if claim(conn, deployment_id, Some(&target)).await?.is_some() {
        return Ok(());
    }
    let job = Job {
        project_path,
        environment: &request.environment,
        git_ref: &request.git_ref,
        protected_ref: request.ref_protected,
    };
    let (status, JsonResponse(answer)) = record(
        conn,
        deployment_id,
        &job,
        request.project_id,
        Some(&target),
        true,
    )
    .await?;
    tracing::info!(job_id, deployment_id, status = status.as_u16(), %answer, "CI deployment joined with its hook");
    Ok(())
}

/// The request's `kubernetes` section as it is kept: what `KubernetesIn` reads back.
fn kubernetes_json(k: &KubernetesIn) -> Value {
    serde_json::to_value(k).unwrap_or(Value::Null)
}
