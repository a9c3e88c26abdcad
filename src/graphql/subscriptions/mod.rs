//! GraphQL subscriptions (SPEC 8.2): the socket they run over ([`socket`]), the live
//! resource group of an environment ([`resource_group`], over shared [`feeds`]), and the ops
//! feed of environments ([`environments`], fed by PostgreSQL `LISTEN`/`NOTIFY` so that every
//! replica hears what any of them recorded).

mod environments;
mod feeds;
mod resource_group;
pub mod socket;

use std::sync::Arc;

use async_graphql::futures_util::Stream;
use async_graphql::{Context, Subscription as SubscriptionObject, ID};
use tokio::sync::{watch, Semaphore};

use crate::db::pool::Pool;
use resource_group::UpdateMessage;
pub use socket::{Origins, SocketLimits};

use super::types::{DeploymentTier, Environment, Result};

/// What subscriptions share across connections: the bounds, the running feeds, the
/// notifications of the database. Cheap to clone.
#[derive(Clone)]
pub struct Live {
    pub(crate) origins: Arc<Origins>,
    pub(crate) limits: SocketLimits,
    connections: Arc<Semaphore>,
    pool: Pool,
    feeds: Arc<feeds::Feeds>,
    notices: Arc<environments::Notices>,
    /// Set when the server shuts down: every socket closes with 1001 (going away), so that
    /// clients reconnect to another replica.
    closing: Arc<watch::Sender<bool>>,
}

impl Live {
    pub fn new(pool: &Pool, origins: Origins, limits: SocketLimits) -> Self {
        Live {
            origins: Arc::new(origins),
            limits,
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            pool: pool.clone(),
            feeds: Arc::default(),
            notices: Arc::new(environments::Notices::new(pool.clone())),
            closing: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Starts relaying written environments to the notifications of every replica.
    pub fn relay_notices(&self) {
        self.notices.relay();
    }

    /// Closes every socket (the server is shutting down).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// With other origins (the configuration's, `--public-url`), the rest kept.
    pub fn with_origins(mut self, origins: Origins) -> Self {
        self.origins = Arc::new(origins);
        self
    }

    /// With other bounds; the count of open connections starts over.
    pub fn with_limits(mut self, limits: SocketLimits) -> Self {
        self.limits = limits;
        self.connections = Arc::new(Semaphore::new(limits.max_connections));
        self
    }

    /// Resource group feeds running now.
    pub fn feeds(&self) -> usize {
        self.feeds.len()
    }
}

pub struct Subscription;

#[SubscriptionObject]
impl Subscription {
    /// The resource group of an environment, live: first the whole group (`complete: true`),
    /// then what changed, changes within 100 ms in one message. A message with
    /// `complete: true` replaces everything before it. Ends with a `FORBIDDEN` error once the
    /// user's `user_access` to the agent is gone (checked every `kubernetes.access_cache`).
    async fn resource_group_updated(
        &self,
        ctx: &Context<'_>,
        environment_id: ID,
    ) -> Result<impl Stream<Item = Result<UpdateMessage>>> {
        resource_group::subscribe(ctx, &environment_id).await
    }

    /// An environment whenever its last deployment, its status or its group health changes,
    /// among those the user may read in the group (and its subgroups) or project, of the
    /// tier if given; with neither path, every environment the user may read.
    async fn environments_updated(
        &self,
        ctx: &Context<'_>,
        group_path: Option<ID>,
        project_path: Option<ID>,
        tier: Option<DeploymentTier>,
    ) -> Result<impl Stream<Item = Result<Environment>>> {
        environments::subscribe(ctx, group_path, project_path, tier).await
    }
}
