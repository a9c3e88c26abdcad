//! A feed of a connection another replica owns (SPEC 16): it hears of changes from the owner
//! ([`Forward::changes`]) and reads the group through it, as a view does
//! (`graphql::through_owner`); when the owner cannot be asked, it reads here and tries the
//! owner again shortly. Ownership is looked at again every [`LOOK_AGAIN`], so a feed follows
//! its connection through a handover or a failover.

use std::sync::Arc;
use std::time::Duration;

use super::feeds::{FeedKey, Source};
use crate::auth::Credential;
use crate::db::replicas::Member;
use crate::replicas::forward::{AsViewer, Changes, Forward, GroupAsk, NotForwarded};
use crate::resources::group::ResourceGroup;

/// The subscriber's way to the owners: the replicas' forwarding and their own credential;
/// `None` in a process that shares no connection, or without a credential to carry.
pub(super) fn as_viewer(ctx: &async_graphql::Context<'_>) -> Option<AsViewer> {
    let forward = ctx.data_opt::<Forward>()?.clone();
    let credential = ctx
        .data_opt::<Credential>()
        .filter(|c| !c.is_empty())?
        .clone();
    Some(AsViewer {
        forward,
        credential,
    })
}

/// How often a feed looks at who owns its connection, and how soon it asks again an owner
/// that did not answer.
const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// Where a feed hears of changes.
pub(super) enum Heard {
    /// This replica's watch cache, which the feed follows itself (every namespace its group
    /// spans).
    Here,
    /// The owner's, `id`.
    Owner { id: String, changes: Changes },
}

/// The owner of the feed's connection, when another live replica and the feed can read
/// through it (`through`: a subscriber's way there). A GitOps group is read here: the owner
/// answers labels groups only.
fn owner(source: &Source, key: &FeedKey, through: Option<&AsViewer>) -> Option<Member> {
    if key.gitops.is_some() {
        return None;
    }
    through?.forward.owner_of(&source.cluster.source)
}

fn ask(key: &FeedKey) -> GroupAsk {
    GroupAsk {
        agent: key.agent,
        namespaces: vec![key.namespace.clone()],
        selector: key.selector.clone(),
    }
}

/// Starts hearing of the changes of `key`'s namespace: from the owner when another replica
/// owns it and answers, else here.
pub(super) async fn listen(source: &Source, key: &FeedKey, through: Option<&AsViewer>) -> Heard {
    if let (Some(owner), Some(through)) = (owner(source, key, through), through) {
        match through
            .forward
            .changes(&owner, &through.credential, &ask(key))
            .await
        {
            Ok(changes) => {
                return Heard::Owner {
                    id: owner.id,
                    changes,
                }
            }
            Err(e) => {
                tracing::warn!(owner = %owner.advertise_url, error = ?e, "resource group feed: the owner's changes cannot be followed; reading here meanwhile");
            }
        }
    }
    Heard::Here
}

impl Heard {
    /// Whether [`Heard::next`] would never resolve: heard here, with no owner to look for
    /// (no way to one, or a GitOps group, read here).
    pub(super) fn quiet(&self, key: &FeedKey, through: Option<&AsViewer>) -> bool {
        matches!(self, Heard::Here) && (through.is_none() || key.gitops.is_some())
    }

    /// Resolves at the next change; `false` when the feed must [`listen`] again (the owner's
    /// changes ended, the connection's owner is another one now), which is a change too.
    pub(super) async fn next(
        &mut self,
        source: &Source,
        key: &FeedKey,
        through: Option<&AsViewer>,
    ) -> bool {
        if self.quiet(key, through) {
            // No owner to look for (`owner` is `None` throughout): no timer to wake for. A
            // health keeper's feeds carry no way to an owner, 10,000 of them waking every
            // `LOOK_AGAIN` for nothing (SPEC 18).
            return std::future::pending().await;
        }
        let mut look =
            tokio::time::interval_at(tokio::time::Instant::now() + LOOK_AGAIN, LOOK_AGAIN);
        loop {
            match self {
                Heard::Here => {
                    look.tick().await;
                    if owner(source, key, through).is_some() {
                        return false;
                    }
                }
                Heard::Owner { id, changes } => tokio::select! {
                    change = changes.next() => return change.is_some(),
                    _ = look.tick() => if owner(source, key, through).is_none_or(|o| o.id != *id) { return false },
                },
            }
        }
    }
}

/// The group through the owner, when another live replica owns the connection: its group,
/// or why it could not be read; `None` when it is read here (this replica holds the
/// connection, or the owner did not answer).
pub(super) async fn through_owner(
    source: &Source,
    key: &FeedKey,
    through: Option<&AsViewer>,
) -> Option<Result<Arc<ResourceGroup>, String>> {
    let owner = owner(source, key, through)?;
    let through = through?;
    match through
        .forward
        .resource_group(&owner, &through.credential, &ask(key))
        .await
    {
        Ok(group) => Some(Ok(group)),
        // The owner judged the credential the feed carries, its first subscriber's, who may
        // have lost access since; every subscriber is judged here (on subscribing and at each
        // recheck), so the others go on with the group read here.
        Err(NotForwarded::Decided(e)) => {
            tracing::info!(owner = %owner.advertise_url, reason = %e, "resource group feed: the owner refused the feed's credential; reading here");
            None
        }
        Err(NotForwarded::Unreachable(why)) => {
            tracing::warn!(owner = %owner.advertise_url, reason = %why, "resource group feed: the owner did not answer; reading here");
            None
        }
    }
}
