//! A resource group of a connection that another replica owns, read through that owner
//! (SPEC 16, `replicas::forward`): the one hook the views take before reading the watch cache.

use std::sync::Arc;

use async_graphql::Context;

use super::resource_group::FORBIDDEN_MESSAGE;
use super::types::Result;
use crate::auth::Credential;
use crate::error::Error;
use crate::k8s::clusters::Cluster;
use crate::replicas::forward::{Forward, GroupAsk, NotForwarded};
use crate::resources::group::ResourceGroup;

/// Where a view is read.
pub(super) enum Through {
    /// The owner's answer: its group, or its decision (FORBIDDEN, the cluster unreachable).
    Owner(Result<Arc<ResourceGroup>>),
    /// Here: this replica holds the connection, shares none, owns it by the hash, has no
    /// credential to carry (a dashboard page's own session), or the owner did not answer, in
    /// which case `warning` says so and the group is listed here, fresh from the cluster.
    Here { warning: Option<String> },
}

/// Asks the owner of `cluster`'s connection for the group of `selector` in `namespaces`
/// through `agent`, as the viewer, when another live replica owns it.
pub(super) async fn through_owner(
    ctx: &Context<'_>,
    cluster: &Cluster,
    agent: i64,
    namespaces: &[String],
    selector: &str,
) -> Through {
    let here = Through::Here { warning: None };
    let Some(forward) = ctx.data_opt::<Forward>() else {
        return here;
    };
    let Some(owner) = forward.owner_of(&cluster.source) else {
        return here;
    };
    let Some(credential) = ctx.data_opt::<Credential>().filter(|c| !c.is_empty()) else {
        return here;
    };
    let ask = GroupAsk {
        agent,
        namespaces: namespaces.to_vec(),
        selector: selector.to_owned(),
    };
    match forward.resource_group(&owner, credential, &ask).await {
        Ok(group) => Through::Owner(Ok(group)),
        Err(NotForwarded::Decided(Error::Forbidden(_))) => Through::Owner(Err(Error::Forbidden(
            FORBIDDEN_MESSAGE.to_owned(),
        )
        .to_graphql())),
        Err(NotForwarded::Decided(e)) => Through::Owner(Err(e.to_graphql())),
        Err(NotForwarded::Unreachable(why)) => {
            tracing::warn!(owner = %owner.id, url = %owner.advertise_url, agent, reason = %why,
                "replicas: the owner of the agent's connection did not answer; listing here");
            Through::Here {
                warning: Some(format!(
                    "Listed by this replica: the replica that watches this agent's cluster \
                     ({}) did not answer: {why}",
                    owner.advertise_url
                )),
            }
        }
    }
}

/// `group` with `warning` among its warnings, when there is one.
pub(super) fn warned(group: Arc<ResourceGroup>, warning: Option<String>) -> Arc<ResourceGroup> {
    match warning {
        None => group,
        Some(warning) => {
            let mut group = Arc::unwrap_or_clone(group);
            group.warnings.push(warning);
            Arc::new(group)
        }
    }
}
