//! `Environment.events` (SPEC 17): the environment's timeline, the Kubernetes Events of its
//! group's resources (from the watch cache) and envlens' own (from PostgreSQL), newest first,
//! paged with opaque cursors ([`timeline::Cursor`]).
//!
//! Who sees what: the Kubernetes Events, and envlens' health events, only a viewer who may
//! see the group (`user_access` to the agent, and with `access_as: user` the Events and each
//! resource's kind allowed to them: the Events shown are those about the resources of the
//! group as the viewer sees it). Deployment events, every reader of the environment.

use std::collections::HashSet;
use std::sync::Arc;

use async_graphql::connection::{Connection, Edge};
use async_graphql::{SimpleObject, ID};

use super::resource_group;
use super::types::{conn, Gql, Result, Time};
use crate::db::events;
use crate::db::read::{AgentRow, EnvironmentRow};
use crate::error::Error;
use crate::k8s::clusters::Cluster;
use crate::resources::group::ResourceGroup;
use crate::resources::timeline::{self, Cursor, Entry, Filter};

/// One entry of the timeline.
#[derive(SimpleObject, Clone)]
pub struct EnvironmentEvent {
    /// The Kubernetes Event's uid, or `envlens-<n>` for envlens' own.
    id: ID,
    /// `Normal` or `Warning`.
    #[graphql(name = "type")]
    event_type: String,
    reason: String,
    message: String,
    /// How many times it happened: a Kubernetes Event series is one entry.
    count: i32,
    first_time: Time,
    last_time: Time,
    /// The uid of the resource it is about, when it is about one.
    resource_uid: Option<ID>,
    /// `KUBERNETES` or `ENVLENS`.
    source: String,
}

impl From<Entry> for EnvironmentEvent {
    fn from(e: Entry) -> Self {
        EnvironmentEvent {
            id: ID(e.id),
            event_type: e.event_type,
            reason: e.reason,
            message: e.message,
            count: e.count.min(i32::MAX as u32) as i32,
            first_time: Time(e.first_time),
            last_time: Time(e.last_time),
            resource_uid: e.resource_uid.map(ID),
            source: e.source.as_str().to_owned(),
        }
    }
}

const DEFAULT_PAGE: usize = 20;
pub const MAX_PAGE: usize = 100;

/// The filter of the arguments, or the error naming the argument that is wrong.
pub(super) fn filter(
    after: Option<&str>,
    since: Option<Time>,
    types: Option<Vec<String>>,
) -> Result<Filter> {
    let after =
        match after {
            None => None,
            Some(text) => Some(Cursor::decode(text).ok_or_else(|| {
                Error::invalid("after", "is not a cursor of this list").to_graphql()
            })?),
        };
    if let Some(bad) = types
        .iter()
        .flatten()
        .find(|t| !timeline::TYPES.contains(&t.as_str()))
    {
        return Err(Error::invalid(
            "types",
            format!("`{bad}` is not an event type: Normal or Warning"),
        )
        .to_graphql());
    }
    Ok(Filter {
        after,
        since: since.map(|t| t.0),
        types,
    })
}

/// The group's resources as the viewer sees them, and whether the Events may be shown: not
/// when the viewer's list of them was refused.
pub(super) fn visible(group: &ResourceGroup) -> Option<HashSet<&str>> {
    let refused = group
        .errors
        .iter()
        .any(|e| e.api_version == "v1" && e.kind == "Event" && e.code == Some(403));
    (!refused).then(|| group.resources.iter().map(|r| r.uid.as_str()).collect())
}

/// The page of `environment`'s timeline.
pub(super) async fn page(
    ctx: &async_graphql::Context<'_>,
    environment: &EnvironmentRow,
    agent: Option<(AgentRow, String)>,
    first: Option<i32>,
    after: Option<String>,
    since: Option<Time>,
    types: Option<Vec<String>>,
) -> Result<Connection<String, EnvironmentEvent>> {
    let first = first.map_or(Ok(DEFAULT_PAGE), |f| {
        usize::try_from(f)
            .ok()
            .filter(|f| *f <= MAX_PAGE)
            .ok_or_else(|| {
                Error::invalid("first", format!("must be between 0 and {MAX_PAGE}")).to_graphql()
            })
    })?;
    let filter = filter(after.as_deref(), since, types)?;
    let limit = first + 1;
    // The group as the viewer sees it; none for a viewer without `user_access`.
    let seen: Option<(Arc<ResourceGroup>, Option<Cluster>, String)> = match agent {
        None => None,
        Some((agent, namespace)) => {
            match resource_group::assemble(ctx, environment, &agent, &namespace).await {
                Ok(seen) => Some((seen.group, seen.cluster, namespace)),
                Err(e) if is_forbidden(&e) => None,
                Err(e) => return Err(e),
            }
        }
    };
    let kubernetes = match &seen {
        Some((group, Some(cluster), namespace)) => match visible(group) {
            Some(uids) => cluster
                .watch
                .timeline(namespace)
                .map(|events| events.page(&uids, &filter, limit))
                .unwrap_or_default(),
            None => Vec::new(),
        },
        _ => Vec::new(),
    };
    let own = events::page(
        &mut **conn(ctx).await?,
        environment.id,
        &filter,
        seen.is_some(),
        limit as i64,
    )
    .await
    .gql()?;
    let mut entries = timeline::merge(kubernetes, own, limit);
    let has_next = entries.len() > first;
    entries.truncate(first);
    let mut connection = Connection::new(filter.after.is_some(), has_next);
    connection.edges.extend(
        entries
            .into_iter()
            .map(|e| Edge::new(Cursor::of(&e).encode(), EnvironmentEvent::from(e))),
    );
    Ok(connection)
}

pub(super) fn is_forbidden(e: &async_graphql::Error) -> bool {
    let code = e.extensions.as_ref().and_then(|x| x.get("code"));
    matches!(code, Some(async_graphql::Value::String(c)) if c == "FORBIDDEN")
}
