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

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::{Context, Enum, SimpleObject};
use chrono::{DateTime, SecondsFormat, Utc};

use super::resource_group::HealthStatus;
use super::types::{conn, loader, Gql, Result, Time};
use crate::db::health::{kinds_key, HealthRow, Order, Reader, Seen};
use crate::k8s::clusters::Clusters;
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
    let decisions = Decisions::new(ctx, &readers).await?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((r.environment_id, decisions.show(r)?)))
        .collect())
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
    impersonating: bool,
    /// The connection is down: why, and since when if known.
    down: Option<(String, Option<DateTime<Utc>>)>,
}

impl Decisions {
    /// Decides over `readers` as the request's user.
    pub(super) async fn new(ctx: &Context<'_>, readers: &[Reader]) -> Result<Decisions> {
        let mut out = Decisions {
            agents: HashMap::new(),
            reviewed: HashMap::new(),
        };
        if readers.is_empty() {
            return Ok(out);
        }
        let user = loader(ctx).loader().user().await.gql()?;
        let clusters: &Arc<Clusters> = ctx.data_unchecked();
        let mut grants = HashMap::new();
        for r in readers {
            if let Entry::Vacant(entry) = grants.entry(r.agent_id) {
                let grant = clusters
                    .grants
                    .authorize(&mut **conn(ctx).await?, r.agent_id, user.id)
                    .await
                    .gql()?;
                entry.insert(grant);
            }
        }
        // What follows may ask clusters: the connection goes back meanwhile.
        loader(ctx).loader().release().await;
        let mut connections = HashMap::new();
        for r in readers {
            let Some(Some(grant)) = grants.get(&r.agent_id) else {
                out.agents.insert(r.agent_id, None);
                continue;
            };
            if let Entry::Vacant(entry) = connections.entry(r.agent_id) {
                let cluster = clusters
                    .for_agent(r.agent_id, &r.agent_project, &r.agent_name)
                    .await;
                entry.insert(cluster);
            }
            let cluster = &connections[&r.agent_id];
            let headers = grant.impersonation(AccessType::from(user.via));
            let impersonating = !headers.is_empty();
            out.agents.entry(r.agent_id).or_insert_with(|| {
                let down = match cluster {
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
                Some(Agent {
                    impersonating,
                    down,
                })
            });
            if !impersonating {
                continue;
            }
            let key = (r.agent_id, r.namespace.clone(), r.kinds.clone());
            if out.reviewed.contains_key(&key) {
                continue;
            }
            let allowed = match cluster {
                Ok(cluster) => {
                    let kinds: Option<Vec<ApiKind>> = r.kinds.iter().map(|k| api_kind(k)).collect();
                    match kinds {
                        Some(kinds) => cluster
                            .watch
                            .access(&headers, &r.namespace, &kinds, clusters.response_timeout)
                            .await
                            .iter()
                            .all(Option::is_none),
                        None => false,
                    }
                }
                // Nobody can be asked: fails closed.
                Err(_) => false,
            };
            out.reviewed.insert(key, allowed);
        }
        Ok(out)
    }

    /// What the viewer sees of `row`: nothing where they may not; `UNKNOWN` with the reason
    /// where the agent's connection is down; else the kept health, with why it is not kept
    /// current if so.
    pub(super) fn show(&self, row: &HealthRow) -> Option<EnvironmentHealth> {
        let agent = self.agents.get(&row.agent_id)?.as_ref()?;
        if agent.impersonating {
            let key = (row.agent_id, row.namespace.clone(), row.kinds.clone());
            if !self.reviewed.get(&key).copied().unwrap_or(false) {
                return None;
            }
        }
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

    /// The decisions as the statements that filter, sort and count apply them.
    pub(super) fn seen(&self) -> Seen {
        let mut seen = Seen::default();
        for (agent_id, agent) in &self.agents {
            let Some(agent) = agent else { continue };
            if !agent.impersonating {
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

/// Each status with its count in `counted` (status, count), worst first, zeros too.
pub(super) fn counts(counted: &[(String, i64)]) -> Vec<EnvironmentHealthCount> {
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
            count: counted
                .iter()
                .filter(|(s, _)| s == status.name())
                .map(|(_, n)| *n as i32)
                .sum(),
        })
        .collect()
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
