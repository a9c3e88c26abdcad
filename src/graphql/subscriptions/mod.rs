//! GraphQL subscriptions (SPEC 8.2): the socket they run over ([`socket`]), the live
//! resource group of an environment ([`resource_group`], over shared [`feeds`]), and the ops
//! feed of environments ([`environments`], fed by PostgreSQL `LISTEN`/`NOTIFY` so that every
//! replica hears what any of them recorded).

mod environments;
mod events;
pub(crate) mod feeds;
pub mod health_keeper;
pub(crate) mod health_record;
mod resource_group;
mod routed;
pub mod socket;

use std::sync::Arc;

use async_graphql::futures_util::Stream;
use async_graphql::{Context, ErrorExtensions, Subscription as SubscriptionObject, ID};
use tokio::sync::{watch, Semaphore};

use crate::auth::Session;
use crate::db::pool::Pool;
use crate::db::slots::{Slot, SlotKind, Slots};
use crate::error::Error;
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
    /// Each user's subscriptions, counted across replicas (SPEC 13).
    slots: Slots,
    pool: Pool,
    feeds: Arc<feeds::Feeds>,
    notices: Arc<environments::Notices>,
    /// Writes the health changes of the groups in use (SPEC 17).
    recorder: health_record::Recorder,
    /// Set when the server shuts down: every socket closes with 1001 (going away), so that
    /// clients reconnect to another replica.
    closing: Arc<watch::Sender<bool>>,
}

impl Live {
    pub fn new(pool: &Pool, origins: Origins, limits: SocketLimits, slots: Slots) -> Self {
        let feeds: Arc<feeds::Feeds> = Arc::default();
        let notices = Arc::new(environments::Notices::new(pool.clone()));
        Live {
            origins: Arc::new(origins),
            limits,
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            slots,
            pool: pool.clone(),
            recorder: health_record::Recorder::new(pool.clone(), feeds.clone(), notices.clone()),
            feeds,
            notices,
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

    /// With other per-user slots.
    pub fn with_slots(mut self, slots: Slots) -> Self {
        self.slots = slots;
        self
    }

    /// With other bounds; the count of open connections starts over.
    pub fn with_limits(mut self, limits: SocketLimits) -> Self {
        self.limits = limits;
        self.connections = Arc::new(Semaphore::new(limits.max_connections));
        self
    }

    /// The recorder of health changes, which queries touch too.
    pub fn recorder(&self) -> health_record::Recorder {
        self.recorder.clone()
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
        let slot = slot(ctx).await?;
        let stream = resource_group::subscribe(ctx, &environment_id).await?;
        Ok(holding(stream, slot))
    }

    /// The environment's timeline (SPEC 17), live: each new entry, and a Kubernetes Event
    /// again whenever its series goes on (same `id`, a higher `count`). envlens' own events
    /// reach every replica's subscribers through PostgreSQL's notifications. Needs the
    /// user's `user_access` to the agent of the last successful deployment, checked again
    /// every `kubernetes.access_cache` (`FORBIDDEN` once gone).
    async fn environment_events_updated(
        &self,
        ctx: &Context<'_>,
        environment_id: ID,
    ) -> Result<impl Stream<Item = Result<crate::graphql::events::EnvironmentEvent>>> {
        let slot = slot(ctx).await?;
        let stream = events::subscribe(ctx, &environment_id).await?;
        Ok(holding(stream, slot))
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
        let slot = slot(ctx).await?;
        let stream = environments::subscribe(ctx, group_path, project_path, tier).await?;
        Ok(holding(stream, slot))
    }
}

/// A place among the user's subscriptions (`per_user.subscriptions`, across replicas and
/// sockets): the error `TOO_MANY_SUBSCRIPTIONS` beyond it.
async fn slot(ctx: &Context<'_>) -> Result<Slot> {
    let (Some(live), Some(session)) = (ctx.data_opt::<Live>(), ctx.data_opt::<Session>()) else {
        return Err(Error::Unauthorized("subscriptions need a signed-in user".into()).to_graphql());
    };
    let taken = live
        .slots
        .take(session.user_id, SlotKind::Subscription)
        .await
        .map_err(|e| e.to_graphql())?;
    taken.ok_or_else(|| {
        let max = live.slots.limits().subscriptions;
        async_graphql::Error::new(format!(
            "at most {max} subscriptions per user, over all their connections: complete one first"
        ))
        .extend_with(|_, e| e.set("code", "TOO_MANY_SUBSCRIPTIONS"))
    })
}

/// `stream`, holding `slot` for as long as it runs.
fn holding<S: Stream>(stream: S, slot: Slot) -> impl Stream<Item = S::Item> {
    use async_graphql::futures_util::StreamExt;
    stream.map(move |item| {
        let _held = &slot;
        item
    })
}
