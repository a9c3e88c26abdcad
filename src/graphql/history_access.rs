//! What a viewer may see of a stored snapshot (SPEC 13, "history as live"). A snapshot is taken
//! as the agent, so it holds every kind the agent lists; a viewer of an `access_as: user` agent
//! is shown only the kinds that their impersonated identity may list now, by the decisions (and
//! from the cache) that the live group is shown by ([`crate::k8s::watch::WatchCache::access`]).
//! A viewer through the agent's own identity (`access_as: agent`) sees what the agent saw.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_graphql::Context;

use super::types::Result;
use crate::auth::CurrentUser;
use crate::error::Error;
use crate::gitlab::access::AccessAs;
use crate::history::snapshot::Entry;
use crate::k8s::clusters::Clusters;
use crate::k8s::grants::{AccessType, Grant};
use crate::resources::health::{self, Health};
use crate::resources::listing::ListError;
use crate::telemetry::RequestId;

/// A kind in a namespace: (namespace, API group, kind). Versions do not matter to RBAC.
type KindIn = (Option<String>, String, String);

fn kind_in(e: &Entry) -> KindIn {
    let group = e.api_version.rsplit_once('/').map_or("", |(g, _)| g);
    (e.namespace.clone(), group.to_owned(), e.kind.clone())
}

/// The kinds of some snapshots' resources that the viewer may not see now, and why.
#[derive(Default)]
pub(super) struct Sight {
    refused: BTreeMap<KindIn, ListError>,
}

impl Sight {
    pub fn shows(&self, e: &Entry) -> bool {
        self.refused.is_empty() || !self.refused.contains_key(&kind_in(e))
    }

    /// `entries` without those the viewer may not see.
    pub fn filter(&self, entries: Vec<Entry>) -> Vec<Entry> {
        match self.refused.is_empty() {
            true => entries,
            false => entries.into_iter().filter(|e| self.shows(e)).collect(),
        }
    }

    /// Whether anything is left out.
    pub fn hides_any(&self) -> bool {
        !self.refused.is_empty()
    }

    /// The kinds left out, each once, worded as the live group words a refused kind.
    pub fn errors(&self) -> impl Iterator<Item = &ListError> {
        let mut seen = std::collections::BTreeSet::new();
        self.refused
            .values()
            .filter(move |e| seen.insert((e.api_version.clone(), e.kind.clone())))
    }
}

/// What `viewer`, holding `grant` on the agent that took the snapshot, may see of `entries`.
/// Asks the agent's cluster (a 502 error when it cannot be reached, as the live group: nothing
/// is shown that was not decided). Gives the request's database connection back first.
pub(super) async fn sight<'e>(
    ctx: &Context<'_>,
    viewer: &CurrentUser,
    grant: &Grant,
    entries: impl IntoIterator<Item = &'e Entry>,
) -> Result<Sight> {
    if grant.authorization.access_as != AccessAs::User {
        return Ok(Sight::default());
    }
    // Each kind in each namespace once, with a version to name it by.
    let mut wanted: BTreeMap<KindIn, &str> = BTreeMap::new();
    for e in entries {
        wanted.entry(kind_in(e)).or_insert(&e.api_version);
    }
    if wanted.is_empty() {
        return Ok(Sight::default());
    }
    super::types::loader(ctx).loader().release().await;
    let clusters: &Arc<Clusters> = ctx.data_unchecked();
    let unreachable = |e: &dyn std::fmt::Display| Error::BadGateway(e.to_string()).to_graphql();
    let agent = &grant.agent;
    let cluster = clusters
        .for_agent(agent.id, &agent.project_full_path, &agent.name)
        .await
        .map_err(|e| unreachable(&e))?;
    let discovered = cluster
        .discovery
        .kinds()
        .await
        .map_err(|e| unreachable(&e))?;
    let mut headers = grant.impersonation(AccessType::from(viewer.via));
    if let Some(id) = ctx.data_opt::<RequestId>() {
        id.outgoing_headers(&mut headers);
    }
    let refusal = |(_, _, kind): &KindIn, api_version: &str, code, message| ListError {
        api_version: api_version.to_owned(),
        kind: kind.clone(),
        code,
        message,
    };
    let mut refused = BTreeMap::new();
    let mut namespaces: Vec<Option<String>> = wanted.keys().map(|k| k.0.clone()).collect();
    namespaces.dedup();
    for namespace in namespaces {
        let mut asked = Vec::new();
        let mut kinds = Vec::new();
        for (key, api_version) in wanted.iter().filter(|(k, _)| k.0 == namespace) {
            let served = discovered
                .kinds
                .iter()
                .find(|k| k.group == key.1 && k.kind == key.2);
            match served {
                Some(kind) => {
                    kinds.push(kind.clone());
                    asked.push((key, *api_version));
                }
                // Not listable now: nothing decides that the viewer may see it.
                None => {
                    let message = format!(
                        "the cluster does not serve {} now: whether you may list it cannot be asked",
                        key.2
                    );
                    refused.insert(key.clone(), refusal(key, api_version, None, message));
                }
            }
        }
        let decisions = cluster
            .watch
            .access(
                &headers,
                namespace.as_deref().unwrap_or(""),
                &kinds,
                clusters.response_timeout,
            )
            .await;
        for ((key, api_version), decision) in asked.into_iter().zip(decisions) {
            if let Some(failure) = decision {
                let error = refusal(key, api_version, failure.code, failure.message);
                refused.insert(key.clone(), error);
            }
        }
    }
    Ok(Sight { refused })
}

/// The health of the resources shown, as a group's health is made of its resources' (the
/// stored one may be caused by, and name, a resource the viewer may not see).
pub(super) fn health_of(shown: &[Entry]) -> Health {
    let healths: Vec<Option<Health>> = shown
        .iter()
        .map(|e| {
            e.health.map(|status| Health {
                status,
                message: e.health_message.clone(),
            })
        })
        .collect();
    health::aggregate(healths.iter().map(Option::as_ref), |i| {
        let e = &shown[i];
        (e.kind.as_str(), e.namespace.as_deref(), e.name.as_str())
    })
}
