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

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::{Context, Enum, SimpleObject};
use chrono::SecondsFormat;

use super::resource_group::HealthStatus;
use super::types::{conn, loader, Gql, Result, Time};
use crate::db::health::{HealthRow, Listed};
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
/// left out. One `user_access` decision per agent, one access review per agent, namespace and
/// set of kinds.
pub(super) async fn shown(
    ctx: &Context<'_>,
    rows: &[HealthRow],
) -> Result<HashMap<i64, EnvironmentHealth>> {
    let mut out = HashMap::new();
    if rows.is_empty() {
        return Ok(out);
    }
    let user = loader(ctx).loader().user().await.gql()?;
    let clusters: &Arc<Clusters> = ctx.data_unchecked();
    let mut grants = HashMap::new();
    for row in rows {
        if let Entry::Vacant(entry) = grants.entry(row.agent_id) {
            let grant = clusters
                .grants
                .authorize(&mut **conn(ctx).await?, row.agent_id, user.id)
                .await
                .gql()?;
            entry.insert(grant);
        }
    }
    // What follows may ask clusters: the connection goes back meanwhile.
    loader(ctx).loader().release().await;
    let mut reviewed: HashMap<(i64, &str, &[String]), bool> = HashMap::new();
    let mut connections = HashMap::new();
    for row in rows {
        let Some(Some(grant)) = grants.get(&row.agent_id) else {
            continue;
        };
        if let Entry::Vacant(entry) = connections.entry(row.agent_id) {
            let cluster = clusters
                .for_agent(row.agent_id, &row.agent_project, &row.agent_name)
                .await;
            entry.insert(cluster);
        }
        let cluster = &connections[&row.agent_id];
        let headers = grant.impersonation(AccessType::from(user.via));
        if !headers.is_empty() {
            let key = (row.agent_id, row.namespace.as_str(), row.kinds.as_slice());
            let allowed = match reviewed.get(&key) {
                Some(allowed) => *allowed,
                None => {
                    let allowed = match cluster {
                        Ok(cluster) => {
                            let kinds: Option<Vec<ApiKind>> =
                                row.kinds.iter().map(|k| api_kind(k)).collect();
                            match kinds {
                                Some(kinds) => cluster
                                    .watch
                                    .access(
                                        &headers,
                                        &row.namespace,
                                        &kinds,
                                        clusters.response_timeout,
                                    )
                                    .await
                                    .iter()
                                    .all(Option::is_none),
                                None => false,
                            }
                        }
                        // Nobody can be asked: fails closed.
                        Err(_) => false,
                    };
                    reviewed.insert(key, allowed);
                    allowed
                }
            };
            if !allowed {
                continue;
            }
        }
        let Some(status) = HealthStatus::parse(&row.status) else {
            continue;
        };
        let open = cluster
            .as_ref()
            .ok()
            .and_then(|c| c.condition.circuit().open());
        let health = match (open, cluster) {
            (Some(open), _) => EnvironmentHealth {
                status: HealthStatus::Unknown,
                message: Some(format!(
                    "The agent's cluster cannot be reached: {}",
                    open.said()
                )),
                since: Time(open.since.max(row.since)),
            },
            (None, Err(none)) => EnvironmentHealth {
                status: HealthStatus::Unknown,
                message: Some(format!("The agent's cluster cannot be reached: {none}")),
                since: Time(row.since),
            },
            (None, Ok(_)) => EnvironmentHealth {
                status,
                message: match row.unkept_since {
                    Some(at) => Some(unkept_message(at)),
                    None => row.message.clone(),
                },
                since: Time(row.since),
            },
        };
        out.insert(row.environment_id, health);
    }
    Ok(out)
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

/// The environments of `listed` that `health` admits (every one without a filter; with one,
/// only those whose health the viewer sees and is listed), in `sort`'s order, each with what
/// the viewer sees of its health.
pub(super) fn arrange(
    listed: Vec<Listed>,
    shown: &mut HashMap<i64, EnvironmentHealth>,
    health: Option<&[HealthStatus]>,
    sort: Option<EnvironmentSort>,
) -> Vec<(Listed, Option<EnvironmentHealth>)> {
    let mut out: Vec<(Listed, Option<EnvironmentHealth>)> = listed
        .into_iter()
        .map(|l| {
            let h = shown.remove(&l.row.id);
            (l, h)
        })
        .filter(|(_, h)| match health {
            None => true,
            Some(wanted) => h.as_ref().is_some_and(|h| wanted.contains(&h.status)),
        })
        .collect();
    let by_id = |a: &Listed, b: &Listed| a.row.id.cmp(&b.row.id);
    match sort {
        None => out.sort_by(|a, b| by_id(&a.0, &b.0)),
        Some(EnvironmentSort::HealthDesc) => out.sort_by(|a, b| {
            worst_first(a.1.as_ref(), b.1.as_ref()).then_with(|| by_id(&a.0, &b.0))
        }),
        Some(EnvironmentSort::UpdatedDesc) => out.sort_by(|a, b| {
            b.0.updated_at
                .cmp(&a.0.updated_at)
                .then_with(|| by_id(&a.0, &b.0))
        }),
        Some(EnvironmentSort::NameAsc) => out.sort_by(|a, b| {
            a.0.row
                .name
                .cmp(&b.0.row.name)
                .then_with(|| by_id(&a.0, &b.0))
        }),
    }
    out
}

/// Worst first, then the most recent change; no health last.
fn worst_first(a: Option<&EnvironmentHealth>, b: Option<&EnvironmentHealth>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => b
            .status
            .severity()
            .cmp(&a.status.severity())
            .then_with(|| b.since.0.cmp(&a.since.0)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// Each status with how many of `shown` have it, worst first.
pub(super) fn counts(shown: &HashMap<i64, EnvironmentHealth>) -> Vec<EnvironmentHealthCount> {
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
            count: shown.values().filter(|h| h.status == status).count() as i32,
        })
        .collect()
}
