//! Pull-based deployments (SPEC 15): an environment bound to a Flux object (its
//! `fluxResourcePath`, through its agent) gets a deployment each time that object applies a new
//! revision: a Kustomization's `status.lastAppliedRevision`, a HelmRelease's newest
//! `status.history` entry ([`revision`]).
//!
//! The objects are followed through the watch cache of the agent's cluster connection (one
//! kind's view, as GitLab's watch API reads it: [`crate::k8s::watch::WatchCache::view_kind`]),
//! as the agent's own identity. Every change of the bound object, and every (re)start of its
//! follower, compares the revision with the environment's last recorded one in PostgreSQL
//! (`db::pull::record`, under the environment's row lock): a restart, a lagging feed or a
//! second replica records nothing twice, and a revision seen again after another (A, B, A)
//! records once more. The deployment starts `running` with its snapshot job; the history
//! worker ends it ([`crate::history::worker`]); GitLab's side is a follow-up
//! (`ingest::pull`), retried while GitLab is down.

pub mod revision;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use sqlx::PgPool;
use tokio::sync::broadcast::error::RecvError;

use crate::db::pull::{self as db, Applied, Bound};
use crate::k8s::clusters::{Cluster, Clusters};
use crate::k8s::discovery::ApiKind;
use crate::k8s::watch::{Change, KindView};
use revision::FluxPath;

/// Told the follow-up that creates a recorded deployment in GitLab, to try it at once.
pub type OnRecorded = Arc<dyn Fn(i64) + Send + Sync>;

/// Follows every bound environment's Flux object. Cheap to clone.
#[derive(Clone)]
pub struct Watcher {
    pool: PgPool,
    clusters: Arc<Clusters>,
    /// `None` without a GitLab token: deployments are envlens' own, with that reason.
    gitlab: Option<OnRecorded>,
    following: Arc<Mutex<HashMap<Bound, tokio::task::AbortHandle>>>,
}

/// Why no deployment is created in GitLab without a token.
pub const NO_TOKEN: &str = "envlens has no GitLab token (gitlab.token_file), so no deployment was \
     created in GitLab";

impl Watcher {
    pub fn new(pool: PgPool, clusters: Arc<Clusters>, gitlab: Option<OnRecorded>) -> Self {
        Watcher {
            pool,
            clusters,
            gitlab,
            following: Arc::default(),
        }
    }

    /// Stops following (shutdown; a test's restart).
    pub fn stop(&self) {
        let mut following = self.following.lock().unwrap_or_else(|e| e.into_inner());
        for (_, task) in following.drain() {
            task.abort();
        }
    }

    /// Reads the bound environments every `every` and follows each (a follower that stopped,
    /// its cluster unreachable say, starts again then).
    pub async fn run(self, every: Duration) {
        loop {
            if let Err(e) = self.follow_bound().await {
                tracing::warn!(error = %e, "pull-based deployments: cannot read the bound environments");
            }
            tokio::time::sleep(every).await;
        }
    }

    /// One look at the bound environments: followers started for the new, stopped for the
    /// gone. How many are followed.
    ///
    /// With replicas sharing the clusters (SPEC 16), a replica follows the objects of the
    /// connections it holds: only its watch cache hears of their changes, and any other
    /// replica's follower would list once and then hear nothing. A connection that moves is
    /// followed by its new owner from its next look on, which reads the revision first, so a
    /// revision applied during the handover is recorded then.
    pub async fn follow_bound(&self) -> crate::error::Result<usize> {
        let mut bound = db::bound(&self.pool).await?;
        let mut held = HashMap::new();
        for b in &bound {
            if let Ok(cluster) = self
                .clusters
                .for_agent(b.agent_id, &b.agent_project_path, &b.agent_name)
                .await
            {
                held.insert(b.agent_id, cluster.watch.held());
            }
        }
        // An agent without a connection stays: its follower says why it cannot follow.
        bound.retain(|b| held.get(&b.agent_id).copied().unwrap_or(true));
        let mut following = self.following.lock().unwrap_or_else(|e| e.into_inner());
        following.retain(|b, task| {
            let keep = bound.contains(b) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for b in bound {
            if !following.contains_key(&b) {
                let this = self.clone();
                let key = b.clone();
                let task = tokio::spawn(async move {
                    let environment = b.environment_id;
                    if let Err(e) = this.follow(b).await {
                        tracing::info!(environment, error = %e, "pull-based deployments: follower stopped; started again at the next look");
                    }
                });
                following.insert(key, task.abort_handle());
            }
        }
        Ok(following.len())
    }

    /// Follows one bound object until its feed ends or a revision cannot be recorded.
    async fn follow(&self, b: Bound) -> Result<(), String> {
        let path = FluxPath::parse(&b.flux_resource_path)
            .filter(|p| p.is_kustomization() || p.is_helm_release())
            .ok_or_else(|| {
                format!(
                    "{} is no Kustomization or HelmRelease path",
                    b.flux_resource_path
                )
            })?;
        let cluster = self
            .clusters
            .for_agent(b.agent_id, &b.agent_project_path, &b.agent_name)
            .await
            .map_err(|e| e.to_string())?;
        let kinds = cluster
            .discovery
            .kinds()
            .await
            .map_err(|e| e.message)?
            .kinds;
        let find = |group: &str, version: Option<&str>, plural: &str| {
            kinds
                .iter()
                .find(|k| {
                    k.group == group && k.plural == plural && version.is_none_or(|v| k.version == v)
                })
                .cloned()
        };
        let kind = find(&path.group, Some(&path.version), &path.plural)
            .ok_or_else(|| format!("the cluster serves no {}", b.flux_resource_path))?;
        let repositories = find("source.toolkit.fluxcd.io", None, "gitrepositories");
        // Listen first, then read: no change falls between the two.
        let mut changes = cluster.watch.changes(&path.namespace);
        let view = self.view(&cluster, &path.namespace, &kind).await?;
        self.look(&b, &path, &cluster, &view, repositories.as_ref())
            .await?;
        loop {
            match changes.recv().await {
                Ok(c) if c.kind == kind => {
                    let ours = match &c.change {
                        Change::Applied(o) => name_of(o) == path.name,
                        Change::Deleted(_) => false,
                        Change::Reset => true,
                    };
                    if ours {
                        self.look(&b, &path, &cluster, &view, repositories.as_ref())
                            .await?;
                    }
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => {
                    self.look(&b, &path, &cluster, &view, repositories.as_ref())
                        .await?
                }
                Err(RecvError::Closed) => return Err("the watch cache's feed ended".into()),
            }
        }
    }

    async fn view(
        &self,
        cluster: &Cluster,
        namespace: &str,
        kind: &ApiKind,
    ) -> Result<KindView, String> {
        let timeout = self.clusters.response_timeout;
        let view = cluster
            .watch
            .view_kind(
                &cluster.discovery,
                &HeaderMap::new(),
                namespace,
                kind,
                500,
                timeout,
            )
            .await
            .map_err(|f| f.message)?;
        view.synced(timeout).await;
        Ok(view)
    }

    /// Reads the bound object's revision and records it if it is new.
    async fn look(
        &self,
        b: &Bound,
        path: &FluxPath,
        cluster: &Cluster,
        view: &KindView,
        repositories: Option<&ApiKind>,
    ) -> Result<(), String> {
        let objects = view.objects().map_err(|f| f.message)?;
        let Some(object) = objects.iter().find(|o| name_of(o) == path.name) else {
            return Ok(());
        };
        let manifest = object.manifest();
        let Some(applied) = revision::applied(path, &manifest) else {
            return Ok(());
        };
        let resource_version = manifest["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<i64>().ok());
        // The GitRepository's branch, read from the cache too, when the source is one.
        let repository = match (&applied.source, repositories) {
            (Some((kind, namespace, name)), Some(repositories)) if kind == "GitRepository" => {
                match self.view(cluster, namespace, repositories).await {
                    Ok(v) => v
                        .objects()
                        .ok()
                        .and_then(|o| o.iter().find(|o| name_of(o) == *name).map(|o| o.manifest())),
                    Err(_) => None,
                }
            }
            _ => None,
        };
        let git_ref = revision::git_ref(&applied, repository.as_ref());
        let reason = match &self.gitlab {
            None => Some(NO_TOKEN.to_owned()),
            Some(_) => revision::not_for_gitlab(&applied, git_ref.as_ref()),
        };
        let record = async {
            let mut tx = self.pool.begin().await?;
            let recorded = db::record(
                &mut tx,
                &Applied {
                    bound: b,
                    revision: &applied.revision,
                    resource_version,
                    sha: applied.sha.as_deref(),
                    git_ref: git_ref.as_ref().map(|(r, _)| r.as_str()),
                    tag: git_ref.as_ref().is_some_and(|(_, tag)| *tag),
                    gitlab_reason: reason.as_deref(),
                },
            )
            .await?;
            tx.commit().await?;
            crate::error::Result::Ok(recorded)
        };
        let recorded = record
            .await
            .map_err(|e: crate::error::Error| e.to_string())?;
        if let Some((own_id, followup)) = recorded {
            tracing::info!(environment = b.environment_id, deployment = own_id, revision = %applied.revision, "pull-based deployment recorded");
            if let (Some(tell), Some(followup)) = (&self.gitlab, followup) {
                tell(followup);
            }
        }
        Ok(())
    }
}

fn name_of(object: &crate::resources::object::Object) -> String {
    object
        .view
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or_default()
        .to_owned()
}
