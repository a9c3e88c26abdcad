//! The health keeper (SPEC 18): every environment with a cluster connection has its group's
//! health kept current, not computed on a view. Each round reads which environments are bound
//! to an agent (their last successful deployment went through one) and keeps each one's health
//! recorder running ([`Recorder::keep`]): a reader of the watch cache like any view, following
//! the group's feed as the agent's own identity and writing its health when it changes.
//!
//! What it keeps is bounded by `kubernetes.health_budget_objects`, counted in the groups'
//! resources: the most recently viewed groups first, then the others by id; from the first
//! group that does not fit, the rest are not kept, and their kept health is marked
//! `unkept_since` (shown as `Not kept current: over the watch budget since <time>`) until a
//! recorder reads the group again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use tokio::time::Instant;

use super::feeds::{FeedKey, Source};
use super::health_record::Recorder;
use super::Live;
use crate::db::health::{self, Bound};
use crate::db::pool::Pool;
use crate::k8s::clusters::{Cluster, Clusters};
use crate::k8s::fetch::FetchOptions;
use crate::resources::group::label_selector;
use crate::resources::health::Customizations;

/// Keeps the health of every environment with a connection, within its budget.
pub struct Keeper {
    pool: Pool,
    clusters: Arc<Clusters>,
    health: Arc<Customizations>,
    recorder: Recorder,
    budget: usize,
    every: Duration,
}

impl Keeper {
    /// A keeper that looks for bound environments every `every`, keeping at most `budget`
    /// resources' groups.
    pub fn new(
        pool: &Pool,
        clusters: Arc<Clusters>,
        health: Arc<Customizations>,
        live: &Live,
        budget: usize,
        every: Duration,
    ) -> Self {
        Keeper {
            pool: pool.clone(),
            clusters,
            health,
            recorder: live.recorder(),
            budget,
            every,
        }
    }

    /// Rounds until the task is aborted.
    pub async fn run(self) {
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "health keeper: cannot read the bound environments; trying again");
            }
            tokio::time::sleep(self.every).await;
        }
    }

    /// One round: keeps what fits the budget, lets the rest go.
    ///
    /// With replicas sharing the clusters (SPEC 16), each keeps the environments of the
    /// connections it holds: their owner writes their health, which every replica reads from
    /// the database, and nobody else lists their groups. A connection that moves is kept by
    /// its new owner from its next round on, and let go by the old one.
    pub async fn round(&self) -> crate::error::Result<()> {
        let bound = health::bound(self.pool.pg()).await?;
        let mut here = Vec::with_capacity(bound.len());
        for b in bound {
            // No connection: its health stays null.
            if let Ok(cluster) = self
                .clusters
                .for_agent(b.agent_id, &b.agent_project, &b.agent_name)
                .await
            {
                if cluster.watch.held() {
                    here.push((b, cluster));
                }
            }
        }
        let (kept, over) = within_budget(
            here.iter().map(|(b, _)| Candidate {
                environment: b.environment_id,
                viewed: self.recorder.viewed(b.environment_id),
                size: self.recorder.size(b.environment_id),
            }),
            self.budget,
        );
        let kept: HashSet<i64> = kept.into_iter().collect();
        // One source per agent, shared by the feeds started this round (~470 B each, SPEC 18).
        let mut sources = HashMap::new();
        for (b, cluster) in here.iter() {
            if kept.contains(&b.environment_id) {
                self.keep(b, cluster, &mut sources);
            } else {
                self.recorder.unpin(b.environment_id);
            }
        }
        let all: HashSet<i64> = here.iter().map(|(b, _)| b.environment_id).collect();
        for environment in self.recorder.recording() {
            if !all.contains(&environment) {
                self.recorder.unpin(environment);
            }
        }
        health::unkept(self.pool.pg(), &over, chrono::Utc::now()).await
    }

    fn keep(&self, b: &Bound, cluster: &Cluster, sources: &mut HashMap<i64, Arc<Source>>) {
        let selector = label_selector(b.project_id, &b.slug);
        let none = HeaderMap::new();
        let key = FeedKey::new(b.agent_id, &b.namespace, &selector, &none);
        self.recorder.keep(b.environment_id, key, || {
            sources
                .entry(b.agent_id)
                .or_insert_with(|| {
                    Arc::new(Source {
                        cluster: cluster.clone(),
                        headers: HeaderMap::new(),
                        options: FetchOptions {
                            request_timeout: self.clusters.response_timeout,
                            agent: Some(b.agent_id),
                            ..FetchOptions::default()
                        },
                        health: self.health.clone(),
                        through: None,
                        recheck: self.clusters.grants.ttl(),
                    })
                })
                .clone()
        });
    }
}

/// An environment the keeper may keep.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub environment: i64,
    /// When its group was last viewed here.
    pub viewed: Option<Instant>,
    /// Its group's resources when last read; unknown before.
    pub size: Option<usize>,
}

/// Which environments to keep within `budget` resources, and which not: most recently viewed
/// first, never viewed last, then by id; from the first group that does not fit on, none. A
/// group of unknown size is kept while the budget is not used up (it is measured then).
pub fn within_budget(
    candidates: impl IntoIterator<Item = Candidate>,
    budget: usize,
) -> (Vec<i64>, Vec<i64>) {
    let mut candidates: Vec<Candidate> = candidates.into_iter().collect();
    candidates.sort_by(|a, b| {
        b.viewed
            .cmp(&a.viewed)
            .then_with(|| a.environment.cmp(&b.environment))
    });
    let (mut kept, mut over) = (Vec::new(), Vec::new());
    let mut used = 0usize;
    for c in candidates {
        let fits = over.is_empty()
            && match c.size {
                Some(size) => used + size <= budget,
                None => used < budget,
            };
        if fits {
            used += c.size.unwrap_or(0);
            kept.push(c.environment);
        } else {
            over.push(c.environment);
        }
    }
    (kept, over)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(environment: i64, viewed: Option<u64>, size: Option<usize>) -> Candidate {
        let base = Instant::now();
        Candidate {
            environment,
            viewed: viewed.map(|s| base + Duration::from_secs(s)),
            size,
        }
    }

    #[test]
    fn the_most_recently_viewed_are_kept_first_and_the_rest_past_the_budget_are_not() {
        let (kept, over) = within_budget(
            [
                c(1, None, Some(10)),
                c(2, Some(5), Some(10)),
                c(3, Some(9), Some(10)),
                c(4, None, Some(1)),
            ],
            25,
        );
        assert_eq!(kept, vec![3, 2]);
        // 1 does not fit: 4, smaller and less recently viewed, is not kept either.
        assert_eq!(over, vec![1, 4]);
    }

    #[test]
    fn a_group_of_unknown_size_is_kept_while_the_budget_is_not_used_up() {
        let (kept, over) =
            within_budget([c(1, None, None), c(2, None, Some(5)), c(3, None, None)], 5);
        assert_eq!(kept, vec![1, 2]);
        assert_eq!(over, vec![3]);
        let (kept, over) = within_budget([c(1, None, None)], 0);
        assert!(kept.is_empty());
        assert_eq!(over, vec![1]);
    }
}
