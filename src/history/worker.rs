//! The snapshot jobs (SPEC 10): a job per successful deployment with an agent, queued in the
//! database by the status hook or the creation call (`db::history::enqueue`), claimed here.
//!
//! A job takes the first snapshot of the environment's resource group, read as the agent
//! (the cluster connection of the resource group, without a user's impersonation) from the
//! watch cache as a consistent read (`WatchCache::list_resource_group_consistent`: a write
//! the deploy job made just before GitLab's success is in it, though its watch event may not
//! have reached the cache yet); then, while the group is PROGRESSING, looks again every
//! `history.settle_poll` until it is not, or until `history.settle_timeout` has passed, and
//! takes the settled snapshot. A cluster that cannot be read is recorded on the job
//! (`last_error`) and tried again with a doubling wait; the deployment itself is never touched.
//!
//! Exactly once: a job is claimed with `FOR UPDATE SKIP LOCKED` and a lease, so replicas
//! share the queue; the snapshot's primary key (the deployment id) keeps a second writer, one
//! whose lease ran out, say, from writing twice. A job is a row before the hook is answered,
//! so a restart loses nothing: an unfinished job's lease ends and another claimer takes it.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use chrono::Utc;
use sqlx::PgPool;

use super::snapshot::{self, Snapshot};
use super::store;
use crate::config::file::HistorySettings;
use crate::db::history::{self as db, Job, Target};
use crate::error::Result;
use crate::k8s::clusters::Clusters;
use crate::k8s::fetch::FetchOptions;
use crate::resources::group::label_selector;
use crate::resources::health::{Customizations, HealthStatus};
use crate::resources::listing::ListError;

/// The longest wait between two attempts at an unreadable cluster.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Attempts at the first snapshot before the job gives up (about 40 minutes with the default
/// backoff). A newer deployment of the environment ends it sooner.
const MAX_ATTEMPTS: i32 = 12;

/// How long a claim holds before another claimer may take the job.
const LEASE: Duration = Duration::from_secs(120);

/// How long the first snapshot waits for the watch cache to hold what the cluster has at the
/// success hook (the deploy job's last writes may still be on their way to the watch) before
/// it lists the kinds still behind fresh.
const CATCH_UP: Duration = Duration::from_secs(2);

/// The longest the worker sleeps when nothing is due (a job queued by another replica is
/// seen within this).
const IDLE: Duration = Duration::from_secs(1);

/// What became of one job's turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// The first snapshot was stored; `settled` when the group was not PROGRESSING.
    Taken { settled: bool },
    /// Still PROGRESSING: looked again later.
    Settling,
    /// The settled snapshot was stored.
    Settled,
    /// A newer deployment of the environment succeeded first; nothing to take.
    Superseded,
    /// The cluster could not be read (or the deployment lacks what a snapshot needs); tried
    /// again later unless `gave_up`.
    Failed { error: String, gave_up: bool },
}

#[derive(Clone)]
pub struct Worker {
    pool: PgPool,
    clusters: Arc<Clusters>,
    health: Arc<Customizations>,
    settings: HistorySettings,
}

impl Worker {
    pub fn new(
        pool: PgPool,
        clusters: Arc<Clusters>,
        health: Arc<Customizations>,
        settings: HistorySettings,
    ) -> Self {
        Worker {
            pool,
            clusters,
            health,
            settings,
        }
    }

    /// Works the queue until the task is dropped.
    pub async fn run(self) {
        loop {
            match self.run_once().await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "deployment history: cannot work the queue"),
            }
            let wait = match db::next_due(&self.pool).await {
                Ok(Some(due)) => (due - Utc::now()).to_std().unwrap_or_default().min(IDLE),
                _ => IDLE,
            };
            tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
        }
    }

    /// Claims the job due first and gives it a turn; `None` when none is due.
    pub async fn run_once(&self) -> Result<Option<(i64, Turn)>> {
        let Some(job) = db::claim(&self.pool, LEASE.as_secs_f64()).await? else {
            return Ok(None);
        };
        let turn = self.turn(&job).await?;
        match &turn {
            Turn::Failed { error, .. } => tracing::warn!(
                deployment = job.deployment_id,
                attempt = job.attempts + 1,
                error = %error,
                "deployment history: no snapshot yet"
            ),
            turn => tracing::debug!(deployment = job.deployment_id, ?turn, "deployment history"),
        }
        Ok(Some((job.deployment_id, turn)))
    }

    /// Gives turns until no job is due (due ones only: a settling job waits its poll).
    pub async fn run_until_idle(&self) -> Result<Vec<(i64, Turn)>> {
        let mut turns = Vec::new();
        while let Some(turn) = self.run_once().await? {
            turns.push(turn);
        }
        Ok(turns)
    }

    async fn turn(&self, job: &Job) -> Result<Turn> {
        let id = job.deployment_id;
        let target = match db::target(&self.pool, id).await? {
            Some(t) => t,
            None => {
                let error = "the deployment has no agent any more";
                db::finish(&self.pool, id, "failed", Some(error)).await?;
                return Ok(Turn::Failed {
                    error: error.into(),
                    gave_up: true,
                });
            }
        };
        let (Some(environment_id), Some(slug)) = (target.environment_id, &target.environment_slug)
        else {
            return self
                .failed(job, "the deployment's environment is not known yet".into())
                .await;
        };
        if job.phase == "settling" {
            return self.settle(job, &target, slug).await;
        }
        if target.superseded {
            self.conclude(id, &target, "canceled").await?;
            db::finish(&self.pool, id, "superseded", None).await?;
            return Ok(Turn::Superseded);
        }
        let (snap, errors) = match self.read(&target, slug, Read::Consistent).await {
            Ok(read) => read,
            Err(error) => return self.failed(job, error).await,
        };
        let keep = i64::from(self.settings.keep_per_environment);
        let done = settled(&target, snap.health);
        store::save_first(&self.pool, id, environment_id, &snap, &errors, done, keep).await?;
        if !done {
            let poll = self.settings.settle_poll.as_secs_f64();
            db::reschedule(&self.pool, id, "settling", poll, None, false).await?;
            return Ok(Turn::Taken { settled: false });
        }
        // Already settled: the first snapshot is the settled one (`save_first` said so).
        self.conclude(id, &target, "success").await?;
        db::finish(&self.pool, id, "done", None).await?;
        Ok(Turn::Taken { settled: true })
    }

    async fn settle(&self, job: &Job, target: &Target, slug: &str) -> Result<Turn> {
        let id = job.deployment_id;
        let Some(first) = db::snapshot(&mut *self.pool.acquire().await?, id).await? else {
            // Retention took it (a burst of newer deployments): nothing left to settle.
            db::finish(&self.pool, id, "superseded", None).await?;
            return Ok(Turn::Superseded);
        };
        let elapsed = (Utc::now() - first.taken_at).to_std().unwrap_or_default();
        let timed_out = elapsed >= self.settings.settle_timeout;
        if target.superseded {
            store::settle_unseen(&self.pool, &first).await?;
            self.conclude(id, target, "canceled").await?;
            db::finish(&self.pool, id, "superseded", None).await?;
            return Ok(Turn::Superseded);
        }
        let poll = self.settings.settle_poll.as_secs_f64();
        match self.read(target, slug, Read::Cached).await {
            Ok((snap, _)) if settled(target, snap.health) || timed_out => {
                store::save_settled(&self.pool, &first, &snap).await?;
                let healthy = snap.health == HealthStatus::Healthy;
                self.conclude(id, target, if healthy { "success" } else { "failed" })
                    .await?;
                db::finish(&self.pool, id, "done", None).await?;
                Ok(Turn::Settled)
            }
            Ok(_) => {
                db::reschedule(&self.pool, id, "settling", poll, None, false).await?;
                Ok(Turn::Settling)
            }
            Err(error) if timed_out => {
                store::settle_unseen(&self.pool, &first).await?;
                self.conclude(id, target, "failed").await?;
                db::finish(&self.pool, id, "done", Some(&error)).await?;
                Ok(Turn::Failed {
                    error,
                    gave_up: true,
                })
            }
            Err(error) => {
                db::reschedule(&self.pool, id, "settling", poll, Some(&error), true).await?;
                Ok(Turn::Failed {
                    error,
                    gave_up: false,
                })
            }
        }
    }

    /// A pull-based deployment ends with its rollout (SPEC 15): `success` once the group is
    /// healthy, `failed` at the settle deadline, `canceled` when a newer one took over; GitLab
    /// is told through a follow-up kept in the same transaction. Nothing for the others.
    async fn conclude(&self, id: i64, target: &Target, status: &str) -> Result<()> {
        if target.pull {
            let mut tx = self.pool.begin().await?;
            crate::db::pull::finish(&mut tx, id, status).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    /// Records a failed attempt at the first snapshot: due again after the backoff, or given
    /// up after [`MAX_ATTEMPTS`].
    async fn failed(&self, job: &Job, error: String) -> Result<Turn> {
        let attempt = job.attempts + 1;
        if attempt >= MAX_ATTEMPTS {
            let mut tx = self.pool.begin().await?;
            crate::db::pull::finish(&mut tx, job.deployment_id, "failed").await?;
            tx.commit().await?;
            db::finish(&self.pool, job.deployment_id, "failed", Some(&error)).await?;
            return Ok(Turn::Failed {
                error,
                gave_up: true,
            });
        }
        let wait = backoff(self.settings.retry_backoff, job.attempts);
        db::reschedule(
            &self.pool,
            job.deployment_id,
            "taken",
            wait.as_secs_f64(),
            Some(&error),
            true,
        )
        .await?;
        Ok(Turn::Failed {
            error,
            gave_up: false,
        })
    }

    /// The environment's resource group as the agent sees it, as a snapshot, with the kinds the
    /// cluster refuses (403: they stay refused, the snapshot is taken without them). Any other
    /// failure to list a kind makes the group unreadable: a snapshot missing a kind would
    /// show its resources as removed.
    async fn read(
        &self,
        target: &Target,
        slug: &str,
        how: Read,
    ) -> std::result::Result<(Snapshot, Vec<ListError>), String> {
        let cluster = self
            .clusters
            .for_agent(
                target.agent_id,
                &target.agent_project_path,
                &target.agent_name,
            )
            .await
            .map_err(|e| e.to_string())?;
        let options = FetchOptions {
            request_timeout: self.clusters.response_timeout,
            agent: Some(target.agent_id),
            ..FetchOptions::default()
        };
        let (namespace, selector) = (&target.namespace, label_selector(target.project_id, slug));
        let group = match how {
            Read::Consistent => {
                cluster
                    .watch
                    .resource_group_consistent(
                        &cluster.discovery,
                        &HeaderMap::new(),
                        namespace,
                        &selector,
                        &options,
                        &self.health,
                        CATCH_UP,
                    )
                    .await
            }
            Read::Cached => {
                cluster
                    .watch
                    .resource_group(
                        &cluster.discovery,
                        &HeaderMap::new(),
                        namespace,
                        &selector,
                        &options,
                        &self.health,
                    )
                    .await
            }
        }
        .map_err(|e| e.to_string())?;
        let unreadable: Vec<String> = group
            .errors
            .iter()
            .filter(|e| e.code != Some(403))
            .map(|e| format!("{} {}: {}", e.api_version, e.kind, e.message))
            .collect();
        if !unreadable.is_empty() {
            let more = match unreadable.len() {
                n if n > 3 => format!(" (and {} more)", n - 3),
                _ => String::new(),
            };
            return Err(format!(
                "cannot list {} kind(s): {}{more}",
                unreadable.len(),
                unreadable[..unreadable.len().min(3)].join("; ")
            ));
        }
        let errors = group.errors.clone();
        let snap = tokio::task::spawn_blocking(move || snapshot::take(&group))
            .await
            .map_err(|e| e.to_string())?;
        Ok((snap, errors))
    }
}

/// Whether a rollout has settled at `health`: no longer PROGRESSING; for a pull-based
/// deployment, whose status it decides, HEALTHY (else it waits for the deadline).
fn settled(target: &Target, health: HealthStatus) -> bool {
    if target.pull {
        health == HealthStatus::Healthy
    } else {
        health != HealthStatus::Progressing
    }
}

/// How a snapshot reads the group.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// At least as new as the cluster at the hook: the deployment's own writes are in it.
    Consistent,
    /// The cache as it is: a settling rollout is looked at again anyway.
    Cached,
}

/// `base` doubled per earlier failed attempt, at most [`MAX_BACKOFF`].
pub fn backoff(base: Duration, earlier_attempts: i32) -> Duration {
    let doublings = u32::try_from(earlier_attempts.clamp(0, 16)).unwrap_or(0);
    base.saturating_mul(1 << doublings).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let base = Duration::from_secs(5);
        assert_eq!(backoff(base, 0), Duration::from_secs(5));
        assert_eq!(backoff(base, 1), Duration::from_secs(10));
        assert_eq!(backoff(base, 3), Duration::from_secs(40));
        assert_eq!(backoff(base, 7), MAX_BACKOFF);
        assert_eq!(backoff(base, 1000), MAX_BACKOFF);
        assert_eq!(backoff(base, -1), base);
    }
}
