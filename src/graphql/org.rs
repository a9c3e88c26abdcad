//! The organization view (SPEC 18): each environment's kept group health
//! (`Environment.health`), and a group's environments filtered, sorted and counted by it,
//! all from `environment_health` without building any group.
//!
//! Who sees a health: the viewer needs `user_access` to the agent it was read through; under
//! `access_as: user`, their identity must also be allowed to list every kind of the group (the
//! watch cache's access reviews). Whoever may not see it gets `null`, and is neither counted
//! nor matched by a `health` filter. What is shown is the kept row, unless the agent's
//! connection is lost now (`UNKNOWN` with the connection's message, never the last healthy
//! state) or the group is not kept current (its last health, with the reason as message).

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::{Context, Enum, SimpleObject};
use axum::http::HeaderMap;
use chrono::{DateTime, SecondsFormat, Utc};

use super::resource_group::HealthStatus;
use super::types::{conn, loader, Gql, Result, Time};
use crate::db::health::{self, kinds_key, HealthRow, Order, Reader, Seen, Tally};
use crate::k8s::clusters::{Cluster, Clusters, NoConnection};
use crate::k8s::discovery::ApiKind;
use crate::k8s::grants::AccessType;

/// An environment's group health as kept.
#[derive(Debug, Clone, SimpleObject)]
pub struct EnvironmentHealth {
    pub status: HealthStatus,
    pub message: Option<String>,
    /// When the status or the message last changed.
    pub since: Time,
}

/// How many of the environments the viewer may see the health of have each status.
#[derive(Debug, Clone, SimpleObject)]
pub struct EnvironmentHealthCount {
    pub status: HealthStatus,
    pub count: i32,
}

/// The orders of `Group.environments`; without one, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum EnvironmentSort {
    /// Worst health first (SPEC 5.2's order), then the most recent change, then by id; no
    /// health last.
    HealthDesc,
    /// The most recently updated environment first, then by id.
    UpdatedDesc,
    /// By name, then by id.
    NameAsc,
}

/// The message of a group not kept current since `since`.
pub fn unkept_message(since: chrono::DateTime<chrono::Utc>) -> String {
    format!(
        "Not kept current: over the watch budget since {}",
        since.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// What the viewer sees of each of `rows`, by environment id; those they may not see are
/// left out.
pub(super) async fn shown(
    ctx: &Context<'_>,
    rows: &[HealthRow],
) -> Result<HashMap<i64, EnvironmentHealth>> {
    let readers: Vec<Reader> = rows.iter().map(HealthRow::reader).collect();
    let mut decisions = Decisions::agents(ctx, readers.iter().map(Reader::agent)).await?;
    decisions.review(ctx, &readers).await;
    Ok(rows
        .iter()
        .filter_map(|r| Some((r.environment_id, decisions.show(r)?)))
        .collect())
}

/// The projects of group `group_id` and its subgroups that `viewer` may read: the scope of
/// [`decided`] and of the page, read once per request.
pub(super) async fn projects(
    ctx: &Context<'_>,
    viewer: crate::db::read::Viewer,
    group_id: i64,
) -> Result<Vec<i64>> {
    health::projects(&mut **conn(ctx).await?, viewer, group_id)
        .await
        .gql()
}

/// The viewer's decisions over the agents (and, under impersonation, the namespaces and kinds)
/// that the scope's kept healths were read through, with the scope's healths counted by what
/// each decision covers: by agent and status, and for an impersonating agent by namespace,
/// kinds and status. One statement where no agent impersonates the viewer, two where one does.
pub(super) async fn decided(
    ctx: &Context<'_>,
    scope: health::Scope<'_>,
) -> Result<(Decisions, Vec<Tally>)> {
    let tallies = health::tally(&mut **conn(ctx).await?, scope, None)
        .await
        .gql()?;
    let mut decisions = Decisions::agents(ctx, tallies.iter().map(Tally::agent)).await?;
    let impersonating = decisions.impersonating();
    if impersonating.is_empty() {
        return Ok((decisions, tallies));
    }
    let by_reader = health::tally(&mut **conn(ctx).await?, scope, Some(&impersonating))
        .await
        .gql()?;
    let readers: Vec<Reader> = by_reader.iter().filter_map(Tally::reader).collect();
    decisions.review(ctx, &readers).await;
    let tallies = tallies
        .into_iter()
        .filter(|t| !impersonating.contains(&t.agent_id))
        .chain(by_reader)
        .collect();
    Ok((decisions, tallies))
}

/// The viewer's decisions over the agents, and under impersonation the namespaces and kinds,
/// that some kept healths were read through: one `user_access` decision per agent, one access
/// review per agent, namespace and set of kinds.
pub(super) struct Decisions {
    /// Per agent: `None` where the viewer may not use it.
    agents: HashMap<i64, Option<Agent>>,
    /// Under impersonation: whether the viewer's identity may list every kind.
    reviewed: HashMap<(i64, String, Vec<String>), bool>,
}

/// What the viewer may use of an agent, and its connection now.
struct Agent {
    /// Under impersonation: the identity to review, and the connection that reviews it.
    impersonating: Option<(HeaderMap, std::result::Result<Cluster, NoConnection>)>,
    /// The connection is down: why, and since when if known.
    down: Option<(String, Option<DateTime<Utc>>)>,
}

impl Decisions {
    /// Decides over `agents` (id, project path, name) as the request's user: their
    /// `user_access`, their connections now, whether they impersonate. Under impersonation
    /// nothing is shown until [`Decisions::review`].
    pub(super) async fn agents<'a>(
        ctx: &Context<'_>,
        agents: impl Iterator<Item = (i64, &'a str, &'a str)>,
    ) -> Result<Decisions> {
        let mut out = Decisions {
            agents: HashMap::new(),
            reviewed: HashMap::new(),
        };
        let mut pending = Vec::new();
        let mut listed = std::collections::HashSet::new();
        for agent in agents {
            if listed.insert(agent.0) {
                pending.push(agent);
            }
        }
        if pending.is_empty() {
            return Ok(out);
        }
        let user = loader(ctx).loader().user().await.gql()?;
        let clusters: &Arc<Clusters> = ctx.data_unchecked();
        // One statement for the agents not decided in the last seconds, not one per agent.
        let ids: Vec<i64> = pending.iter().map(|a| a.0).collect();
        let grants = clusters
            .grants
            .authorize_all(&mut **conn(ctx).await?, &ids, user.id)
            .await
            .gql()?;
        // What follows may ask clusters: the connection goes back meanwhile.
        loader(ctx).loader().release().await;
        for ((agent_id, project, name), grant) in pending.into_iter().zip(grants) {
            let Some(grant) = grant else {
                out.agents.insert(agent_id, None);
                continue;
            };
            let cluster = clusters.for_agent(agent_id, project, name).await;
            let down = match &cluster {
                Ok(cluster) => cluster.condition.circuit().open().map(|open| {
                    (
                        format!("The agent's cluster cannot be reached: {}", open.said()),
                        Some(open.since),
                    )
                }),
                Err(none) => Some((
                    format!("The agent's cluster cannot be reached: {none}"),
                    None,
                )),
            };
            let headers = grant.impersonation(AccessType::from(user.via));
            let impersonating = (!headers.is_empty()).then_some((headers, cluster));
            out.agents.insert(
                agent_id,
                Some(Agent {
                    impersonating,
                    down,
                }),
            );
        }
        Ok(out)
    }

    /// The agents whose healths show only where the viewer's own identity may list every kind.
    pub(super) fn impersonating(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .agents
            .iter()
            .filter(|(_, a)| a.as_ref().is_some_and(|a| a.impersonating.is_some()))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Reviews, once each, the namespaces and kinds of `readers` whose agent impersonates the
    /// viewer: whether their identity may list every kind. Nobody to ask fails closed.
    pub(super) async fn review(&mut self, ctx: &Context<'_>, readers: &[Reader]) {
        let clusters: &Arc<Clusters> = ctx.data_unchecked();
        for r in readers {
            let Some(Some(Agent {
                impersonating: Some((headers, cluster)),
                ..
            })) = self.agents.get(&r.agent_id)
            else {
                continue;
            };
            let key = (r.agent_id, r.namespace.clone(), r.kinds.clone());
            if self.reviewed.contains_key(&key) {
                continue;
            }
            let allowed = match cluster {
                Ok(cluster) => {
                    let kinds: Option<Vec<ApiKind>> = r.kinds.iter().map(|k| api_kind(k)).collect();
                    match kinds {
                        Some(kinds) => cluster
                            .watch
                            .access(headers, &r.namespace, &kinds, clusters.response_timeout)
                            .await
                            .iter()
                            .all(Option::is_none),
                        None => false,
                    }
                }
                // Nobody can be asked: fails closed.
                Err(_) => false,
            };
            self.reviewed.insert(key, allowed);
        }
    }

    /// The agent of a health read through `agent_id`, `namespace` and `kinds`, when the viewer
    /// may see that health.
    fn visible(&self, agent_id: i64, namespace: &str, kinds: &[String]) -> Option<&Agent> {
        let agent = self.agents.get(&agent_id)?.as_ref()?;
        if agent.impersonating.is_some() {
            let key = (agent_id, namespace.to_owned(), kinds.to_vec());
            if !self.reviewed.get(&key).copied().unwrap_or(false) {
                return None;
            }
        }
        Some(agent)
    }

    /// What the viewer sees of `row`: nothing where they may not; `UNKNOWN` with the reason
    /// where the agent's connection is down; else the kept health, with why it is not kept
    /// current if so.
    pub(super) fn show(&self, row: &HealthRow) -> Option<EnvironmentHealth> {
        let agent = self.visible(row.agent_id, &row.namespace, &row.kinds)?;
        let status = HealthStatus::parse(&row.status)?;
        Some(match &agent.down {
            Some((message, since)) => EnvironmentHealth {
                status: HealthStatus::Unknown,
                message: Some(message.clone()),
                since: Time(since.map_or(row.since, |s| s.max(row.since))),
            },
            None => EnvironmentHealth {
                status,
                message: match row.unkept_since {
                    Some(at) => Some(unkept_message(at)),
                    None => row.message.clone(),
                },
                since: Time(row.since),
            },
        })
    }

    /// Each status with how many of `tallies` the viewer sees with it, as [`Decisions::show`]
    /// shows them (`UNKNOWN` where the agent is down), worst first, zeros too. A tally of an
    /// impersonating agent counts only by reader.
    pub(super) fn counts(&self, tallies: &[Tally]) -> Vec<EnvironmentHealthCount> {
        let mut counted: HashMap<&str, i64> = HashMap::new();
        for t in tallies {
            let agent = match (&t.namespace, &t.kinds) {
                (Some(namespace), Some(kinds)) => self.visible(t.agent_id, namespace, kinds),
                _ => self
                    .agents
                    .get(&t.agent_id)
                    .and_then(Option::as_ref)
                    .filter(|a| a.impersonating.is_none()),
            };
            let (Some(agent), Some(status)) = (agent, HealthStatus::parse(&t.status)) else {
                continue;
            };
            let status = if agent.down.is_some() {
                HealthStatus::Unknown
            } else {
                status
            };
            *counted.entry(status.name()).or_default() += t.count;
        }
        let mut statuses = [
            HealthStatus::Unknown,
            HealthStatus::Degraded,
            HealthStatus::Missing,
            HealthStatus::Progressing,
            HealthStatus::Suspended,
            HealthStatus::Healthy,
        ];
        statuses.sort_by_key(|s| std::cmp::Reverse(s.severity()));
        statuses
            .into_iter()
            .map(|status| EnvironmentHealthCount {
                status,
                count: counted.get(status.name()).copied().unwrap_or(0) as i32,
            })
            .collect()
    }

    /// The decisions as the statements that filter and sort apply them.
    pub(super) fn seen(&self) -> Seen {
        let mut seen = Seen::default();
        for (agent_id, agent) in &self.agents {
            let Some(agent) = agent else { continue };
            if agent.impersonating.is_none() {
                seen.agents.push(*agent_id);
            }
            if let Some((_, since)) = &agent.down {
                seen.down.push((*agent_id, *since));
            }
        }
        for ((agent_id, namespace, kinds), allowed) in &self.reviewed {
            if *allowed {
                seen.reviewed
                    .push((*agent_id, namespace.clone(), kinds_key(kinds)));
            }
        }
        seen
    }
}

/// `group/version/plural/Kind` as the recorder keeps it.
fn api_kind(text: &str) -> Option<ApiKind> {
    let mut parts = text.splitn(4, '/');
    let (group, version, plural, kind) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some(ApiKind {
        group: group.to_owned(),
        version: version.to_owned(),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
        namespaced: true,
        watchable: true,
    })
}

/// The statement's order for `sort`.
pub(super) fn order(sort: Option<EnvironmentSort>) -> Order {
    match sort {
        None => Order::Id,
        Some(EnvironmentSort::HealthDesc) => Order::WorstFirst,
        Some(EnvironmentSort::UpdatedDesc) => Order::UpdatedDesc,
        Some(EnvironmentSort::NameAsc) => Order::NameAsc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_kind_is_no_kind_a_review_could_allow() {
        assert!(api_kind("apps/v1/deployments/Deployment").is_some());
        assert!(api_kind("unknown apps/v1 Deployment").is_none());
        assert!(api_kind("unknown v1 Pod").is_none());
    }
}
