//! Work a GitLab hook leaves to be done with GitLab's REST API (SPEC 12.2, 12.3):
//! - after a `success` Deployment Hook for a deployment whose agent nobody described (no job
//!   called `POST /api/v4/ci/deployments`, no GitLab called 4.3), the lookup of its
//!   environment: `cluster_agent` and `kubernetes_namespace` are taken when the environment's
//!   `last_deployment` is this deployment;
//! - after a push touching `.gitlab/agents/`, the reading of that project's agents;
//! - a pull-based deployment's creation and final status in GitLab (`pull`, SPEC 15).
//!
//! The work is kept (`gitlab_followups`) in the transaction that acknowledges the hook, then
//! tried once at once with a short timeout; what fails (GitLab down, slow, rate limited) is
//! tried again by `serve`'s worker with backoff, up to [`MAX_ATTEMPTS`], so nothing
//! acknowledged is lost and nothing is tried forever. Each attempt is counted in
//! `envlens_gitlab_followups_total{kind,outcome}` and what came of it is kept with the row.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::{PgConnection, PgPool};

use super::deployments::{claim, record, KubernetesIn, Succeeded};
use super::sync::{agents, Failed};
use crate::db::followups::{self as db, Followup, AGENT_REFRESH, ENVIRONMENT_LOOKUP};
use crate::db::pull::{PULL_CREATE, PULL_FINISH};
use crate::db::{agents as db_agents, deployments, identity};
use crate::error::{Error, Result};
use crate::gitlab::access::Job;
use crate::gitlab::api::{encode, GitLab, Policy};
use crate::gitlab::rest::{self, environment_agent};
use crate::telemetry::Metrics;

/// Attempts before a follow-up is given up (its last error kept): about 8 hours of backoff.
pub const MAX_ATTEMPTS: i32 = 10;
/// How long a taken follow-up is left to its worker before another may take it.
const LEASE_SECONDS: f64 = 300.0;
/// The first retry's delay; doubled each attempt, at most an hour.
const FIRST_RETRY_SECONDS: f64 = 30.0;

/// In the transaction of a success hook: keeps the lookup of its deployment's environment when
/// no creation call decided its agent. The follow-up's id when one was kept.
pub async fn after_success(
    conn: &mut PgConnection,
    deployment: &Succeeded<'_>,
) -> Result<Option<i64>> {
    if db::creation_decided(&mut *conn, deployment.deployment_id).await? {
        return Ok(None);
    }
    db::add_lookup(
        conn,
        deployment.project_id,
        deployment.deployment_id,
        deployment.environment,
        deployment.git_ref,
    )
    .await
}

/// In the transaction of a push hook: keeps the refresh of the project's agents.
pub async fn after_push(conn: &mut PgConnection, project_id: i64) -> Result<i64> {
    db::add_refresh(conn, project_id).await
}

/// Does the work: one per GitLab instance.
#[derive(Clone)]
pub struct Worker {
    db: PgPool,
    api: GitLab,
    metrics: Arc<Metrics>,
}

impl Worker {
    pub fn new(db: PgPool, api: GitLab, metrics: Arc<Metrics>) -> Self {
        Worker { db, api, metrics }
    }

    /// Tries follow-up `id` once now, with one short attempt per call to GitLab, so that a
    /// hook's answer waits a few seconds at most; a failure leaves it to [`Worker::run_due`].
    pub async fn try_now(&self, id: i64) {
        let quick = self.api.with_policy(Policy {
            attempts: 1,
            timeout: Duration::from_secs(5),
            max_wait: Duration::ZERO,
            ..Policy::default()
        });
        match db::take(&self.db, Some(id), 1, LEASE_SECONDS).await {
            Ok(taken) => {
                for followup in taken {
                    self.run(&quick, followup).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot take a GitLab follow-up"),
        }
    }

    /// Runs up to `limit` follow-ups that are due; how many it ran.
    pub async fn run_due(&self, limit: i64) -> Result<usize> {
        let taken = db::take(&self.db, None, limit, LEASE_SECONDS).await?;
        let n = taken.len();
        for followup in taken {
            self.run(&self.api, followup).await;
        }
        Ok(n)
    }

    /// `serve`'s loop: what is due, every `every`.
    pub async fn run_forever(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Drain a backlog in batches, then wait for the next tick.
            loop {
                match self.run_due(16).await {
                    Ok(16) => continue,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read GitLab follow-ups");
                        break;
                    }
                }
            }
        }
    }

    async fn run(&self, api: &GitLab, f: Followup) {
        let kind = match f.kind.as_str() {
            AGENT_REFRESH => AGENT_REFRESH,
            PULL_CREATE => PULL_CREATE,
            PULL_FINISH => PULL_FINISH,
            _ => ENVIRONMENT_LOOKUP,
        };
        let result = match (kind, f.deployment_id) {
            (AGENT_REFRESH, _) => agents::refresh_project(&self.db, api, f.project_id)
                .await
                .map(|done| ("refreshed", done)),
            (PULL_CREATE, Some(own_id)) => super::pull::create(&self.db, api, own_id).await,
            (PULL_FINISH, Some(own_id)) => super::pull::finish(&self.db, api, own_id).await,
            (PULL_CREATE | PULL_FINISH, None) => Ok(("gone", "without its deployment".to_owned())),
            _ => self.lookup(api, &f).await,
        };
        let stored = match result {
            Ok((label, outcome)) => {
                self.metrics.gitlab_followup(kind, label);
                tracing::info!(kind, project_id = f.project_id, deployment_id = f.deployment_id, outcome = %outcome, "GitLab follow-up done");
                db::finish(&self.db, f.id, &outcome).await
            }
            Err(e) if f.attempts + 1 >= MAX_ATTEMPTS => {
                self.metrics.gitlab_followup(kind, "gave_up");
                tracing::warn!(kind, project_id = f.project_id, deployment_id = f.deployment_id, error = %e, "GitLab follow-up given up");
                let outcome = format!("gave up after {} attempts: {e}", f.attempts + 1);
                db::finish(&self.db, f.id, &outcome).await
            }
            Err(e) => {
                self.metrics.gitlab_followup(kind, "retry");
                let delay = (FIRST_RETRY_SECONDS * 2f64.powi(f.attempts)).min(3600.0);
                tracing::info!(kind, project_id = f.project_id, deployment_id = f.deployment_id, error = %e, retry_in_seconds = delay, "GitLab follow-up to be retried");
                db::retry(&self.db, f.id, &e.to_string(), delay).await
            }
        };
        if let Err(e) = stored {
            // Its lease runs out and it is taken again: nothing is lost.
            tracing::warn!(error = %e, "cannot record a GitLab follow-up's outcome");
        }
    }

    /// SPEC 12.2 with no change to the pipeline: the environment's agent and namespace, when
    /// its last deployment is this one. `(metric label, outcome in words)`.
    async fn lookup(
        &self,
        api: &GitLab,
        f: &Followup,
    ) -> std::result::Result<(&'static str, String), Failed> {
        let (Some(deployment_id), Some(name)) = (f.deployment_id, f.environment.as_deref()) else {
            return Ok(("gone", "a lookup without its deployment".to_owned()));
        };
        let project_id = f.project_id;
        if db::creation_decided(&self.db, deployment_id).await? {
            return Ok((
                "decided",
                "the deployment's agent was decided by its job".to_owned(),
            ));
        }
        let known = {
            let mut conn = self.db.acquire().await.map_err(Error::from)?;
            deployments::environment_id(&mut conn, project_id, name).await?
        };
        let environment_id = match known {
            Some(id) => Some(id),
            None => {
                let found: Vec<rest::Environment> = api
                    .get_all(
                        "/projects/:id/environments",
                        &format!(
                            "/api/v4/projects/{project_id}/environments?name={}",
                            encode(name)
                        ),
                        None,
                    )
                    .await?;
                found.into_iter().find(|e| e.name == name).map(|e| e.id)
            }
        };
        let environment: Option<rest::Environment> = match environment_id {
            Some(id) => {
                api.get_optional(
                    "/projects/:id/environments/:environment_id",
                    &format!("/api/v4/projects/{project_id}/environments/{id}"),
                    None,
                )
                .await?
            }
            None => None,
        };
        let Some(environment) = environment else {
            return Ok((
                "gone",
                format!("GitLab has no environment {name} in project {project_id}"),
            ));
        };
        let taken = match environment_agent(&environment, deployment_id) {
            Ok(taken) => taken,
            Err(not) => return Ok((not.label(), not.reason(deployment_id))),
        };
        // An agent the mirror does not have yet: its configuration project's agents first.
        if db_agents::find(&self.db, taken.agent_id).await?.is_none() {
            agents::refresh_project(&self.db, api, taken.config_project_id).await?;
        }
        let protected_ref = match f.git_ref.as_deref() {
            Some(git_ref) => ref_protected(api, project_id, git_ref, taken.tag).await?,
            None => false,
        };

        let mut kubernetes = json!({"agent": taken.reference});
        if let Some(namespace) = &taken.namespace {
            kubernetes["namespace"] = json!(namespace);
        }
        if let Some(path) = &taken.flux_resource_path {
            kubernetes["flux_resource_path"] = json!(path);
        }
        let kubernetes: KubernetesIn =
            serde_json::from_value(kubernetes).map_err(|e| Error::Internal(e.into()))?;
        let target = match kubernetes.target() {
            Ok(target) => target,
            Err(e) => {
                return Ok((
                    "refused",
                    format!("GitLab's environment names {}: {e}", taken.reference),
                ))
            }
        };

        let mut tx = self.db.begin().await.map_err(Error::from)?;
        if let Some(job_id) = deployments::job_of(&mut tx, deployment_id).await? {
            deployments::lock_job(&mut tx, job_id).await?;
        }
        let project_path = identity::project_path(&mut *tx, project_id)
            .await?
            .unwrap_or_default();
        deployments::put_environment(
            &mut tx,
            &deployments::Environment {
                id: environment.id,
                project_id,
                name: &environment.name,
                slug: &environment.slug,
                tier: environment.tier.as_deref().filter(|t| TIERS.contains(t)),
            },
        )
        .await?;
        deployments::link_environment(&mut tx, deployment_id, environment.id).await?;
        if claim(&mut tx, deployment_id, Some(&target))
            .await?
            .is_some()
        {
            return Ok((
                "decided",
                "the deployment's agent was decided meanwhile".to_owned(),
            ));
        }
        let job = Job {
            project_path: &project_path,
            environment: &environment.name,
            git_ref: f.git_ref.as_deref().unwrap_or_default(),
            protected_ref,
        };
        let (status, axum::Json(answer)) = record(
            &mut tx,
            deployment_id,
            &job,
            project_id,
            Some(&target),
            true,
        )
        .await?;
        tx.commit().await.map_err(Error::from)?;
        Ok(if status.as_u16() == 201 {
            (
                "recorded",
                format!(
                    "agent {} and namespace {} recorded from the environment",
                    taken.reference,
                    answer["agent_deployment"]["kubernetes_namespace"]
                        .as_str()
                        .unwrap_or_default()
                ),
            )
        } else {
            (
                "refused",
                answer["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
    }
}

/// Whether GitLab protects the deployment's ref, as `protected_branches_only` asks: a tag's
/// protection is GitLab's protected tags (wildcards included), a branch's its protected
/// branches. A ref GitLab no longer has (404) is not protected.
async fn ref_protected(
    api: &GitLab,
    project_id: i64,
    git_ref: &str,
    tag: bool,
) -> std::result::Result<bool, Failed> {
    Ok(if tag {
        let tag: Option<rest::Tag> = api
            .get_optional(
                "/projects/:id/repository/tags/:tag_name",
                &format!(
                    "/api/v4/projects/{project_id}/repository/tags/{}",
                    encode(git_ref)
                ),
                None,
            )
            .await?;
        tag.is_some_and(|t| t.protected)
    } else {
        let branch: Option<rest::Branch> = api
            .get_optional(
                "/projects/:id/repository/branches/:branch",
                &format!(
                    "/api/v4/projects/{project_id}/repository/branches/{}",
                    encode(git_ref)
                ),
                None,
            )
            .await?;
        branch.is_some_and(|b| b.protected)
    })
}

const TIERS: [&str; 5] = ["production", "staging", "testing", "development", "other"];
