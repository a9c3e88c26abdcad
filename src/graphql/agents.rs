//! The agent fields GitLab's own frontend asks for (SPEC 5.1): an agent's tokens, and the agents
//! that `ci_access` and `user_access` authorize for a project, with GitLab's names and types.
//!
//! Every field that shows an agent shows it only to those who may read it (GitLab's
//! `read_cluster_agent`, SPEC 13: `gitlab::access::read_cluster_agent`, loaded for a whole
//! list at once by the `AgentReadable` loader); to the others it is as if it did not exist.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{
    Context, Enum, InputValueError, InputValueResult, Json, Object, Scalar, ScalarType,
    SelectionField, Value,
};

use super::loaders::{
    load, AgentReadable, AgentTokens, AuthorizedAgent, CiAccessAgents, ProjectId, UserAccessAgents,
};
use super::types::{loader, node_fields, page, page_window, ClusterAgent, Gql, Result, Time};
use crate::db::read::{AgentRow, ProjectRow};
use crate::db::read_agents::TokenRow;

/// GitLab's `ClustersAgentTokenID`: a global ID, `gid://gitlab/Clusters::AgentToken/<id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClustersAgentTokenId(String);

const TOKEN_GID: &str = "gid://gitlab/Clusters::AgentToken/";

/// A `ClustersAgentTokenID` is a global ID. It is encoded as a string.
#[Scalar(name = "ClustersAgentTokenID")]
impl ScalarType for ClustersAgentTokenId {
    fn parse(value: Value) -> InputValueResult<Self> {
        match &value {
            Value::String(s)
                if s.strip_prefix(TOKEN_GID)
                    .is_some_and(|id| id.parse::<i64>().is_ok()) =>
            {
                Ok(ClustersAgentTokenId(s.clone()))
            }
            _ => Err(InputValueError::expected_type(value)),
        }
    }

    fn to_value(&self) -> Value {
        Value::String(self.0.clone())
    }
}

/// Agent token statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum AgentTokenStatus {
    /// Active agent token.
    Active,
    /// Revoked agent token.
    Revoked,
}

pub struct ClusterAgentToken(TokenRow);

#[Object]
impl ClusterAgentToken {
    /// Global ID of the token.
    async fn id(&self) -> ClustersAgentTokenId {
        ClustersAgentTokenId(format!("{TOKEN_GID}{}", self.0.id))
    }

    /// Name given to the token.
    async fn name(&self) -> Option<&str> {
        Some(&self.0.name)
    }

    /// Description of the token.
    async fn description(&self) -> Option<&str> {
        self.0.description.as_deref()
    }

    /// Timestamp the token was created.
    async fn created_at(&self) -> Option<Time> {
        Some(Time(self.0.created_at))
    }

    /// Timestamp the token was last used, as GitLab reports it.
    async fn last_used_at(&self) -> Option<Time> {
        self.0.last_used_at.map(Time)
    }

    /// Current status of the token.
    async fn status(&self) -> Option<AgentTokenStatus> {
        match self.0.status.as_str() {
            "active" => Some(AgentTokenStatus::Active),
            "revoked" => Some(AgentTokenStatus::Revoked),
            _ => None,
        }
    }
}

/// Whether the viewer may read the agent `agent_id`.
pub(super) async fn readable(ctx: &Context<'_>, agent_id: i64) -> Result<bool> {
    let found = load(ctx, [AgentReadable(agent_id)]).await.gql()?;
    Ok(found.into_values().next().unwrap_or(false))
}

/// The rows whose agent the viewer may read, in their order: one statement for the list, whose
/// answers the nodes' own fields then find in the request's cache.
pub(super) async fn keep_readable<T>(
    ctx: &Context<'_>,
    rows: Vec<T>,
    agent_id: impl Fn(&T) -> i64,
) -> Result<Vec<T>> {
    if rows.is_empty() {
        return Ok(rows);
    }
    let keys = rows.iter().map(|r| AgentReadable(agent_id(r)));
    let found = loader(ctx).load_many(keys).await.gql()?;
    Ok(rows
        .into_iter()
        .filter(|r| found.get(&AgentReadable(agent_id(r))) == Some(&true))
        .collect())
}

/// `ClusterAgent.tokens`: the agent's active tokens by id, as GitLab lists them; none unless the
/// viewer may read the agent (GitLab's `read_cluster_agent`: a Developer of a project it
/// deploys, whose environment page shows from `lastUsedAt` whether it is connected, sees them).
pub(super) async fn tokens(
    ctx: &Context<'_>,
    agent: &AgentRow,
    first: Option<i32>,
    after: Option<String>,
) -> Result<Connection<String, ClusterAgentToken>> {
    let readable = readable(ctx, agent.id).await?;
    page(first, after, |after, limit| async move {
        if !readable {
            return Ok(Vec::new());
        }
        let key = AgentTokens {
            agent_id: agent.id,
            after,
            limit,
        };
        let rows = load(ctx, [key]).await.gql()?;
        Ok(rows
            .into_values()
            .flatten()
            .map(|t| (t.id, ClusterAgentToken(t)))
            .collect())
    })
    .await
}

/// Authorized cluster agent, with the configuration of the `ci_access` entry that authorizes
/// the project (`{}` for the agent's own configuration project).
pub struct ClusterAgentAuthorizationCiAccess(AuthorizedAgent);

#[Object]
impl ClusterAgentAuthorizationCiAccess {
    /// Authorized cluster agent.
    async fn agent(&self) -> Option<ClusterAgent> {
        Some(ClusterAgent(self.0.agent.clone()))
    }

    /// Configuration for the authorized project.
    async fn config(&self) -> Option<Json<serde_json::Value>> {
        Some(Json(self.0.config.clone()))
    }
}

/// Authorized cluster agent, with the configuration of the `user_access` entry that admits the
/// viewer for the project.
pub struct ClusterAgentAuthorizationUserAccess(AuthorizedAgent);

#[Object]
impl ClusterAgentAuthorizationUserAccess {
    /// Authorized cluster agent.
    async fn agent(&self) -> Option<ClusterAgent> {
        Some(ClusterAgent(self.0.agent.clone()))
    }

    /// Configuration for the authorized project.
    async fn config(&self) -> Option<Json<serde_json::Value>> {
        Some(Json(self.0.config.clone()))
    }
}

/// Loads what the nodes' `agent` selects (its project, its tokens) for all of them at once.
async fn preload_nodes_agents(ctx: &Context<'_>, rows: &[AuthorizedAgent]) -> Result<()> {
    let agent_fields: Vec<SelectionField<'_>> = node_fields(ctx)
        .into_iter()
        .filter(|f| f.name() == "agent")
        .flat_map(|f| f.selection_set().collect::<Vec<_>>())
        .collect();
    if agent_fields.iter().any(|f| f.name() == "project") {
        let projects = rows.iter().map(|r| ProjectId(r.agent.project_id));
        loader(ctx).load_many(projects).await.gql()?;
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.agent.id).collect();
    preload_for_agents(ctx, agent_fields.into_iter(), &ids).await
}

/// Every node at once, the agent's id as cursor: a project has few agents.
fn whole<N: async_graphql::OutputType>(
    rows: Vec<AuthorizedAgent>,
    node: impl Fn(AuthorizedAgent) -> N,
) -> Connection<String, N> {
    let mut connection = Connection::new(false, false);
    connection.edges.extend(
        rows.into_iter()
            .map(|a| Edge::new(a.agent.id.to_string(), node(a))),
    );
    connection
}

/// `Project.ciAccessAuthorizedAgents`: the agents whose `ci_access` authorizes the project
/// (SPEC 4.3's rule, `gitlab::access::ci_authorization`) and that the viewer may read; `null`
/// for a project the viewer may not read.
pub(super) async fn ci_access_authorized(
    ctx: &Context<'_>,
    project: &ProjectRow,
) -> Result<Option<Connection<String, ClusterAgentAuthorizationCiAccess>>> {
    if !project.readable {
        return Ok(None);
    }
    let rows = load(ctx, [CiAccessAgents(project.id)]).await.gql()?;
    let rows: Vec<AuthorizedAgent> = rows.into_values().flatten().collect();
    let rows = keep_readable(ctx, rows, |r| r.agent.id).await?;
    preload_nodes_agents(ctx, &rows).await?;
    Ok(Some(whole(rows, ClusterAgentAuthorizationCiAccess)))
}

/// `Project.userAccessAuthorizedAgents`: the agents whose `user_access` admits the viewer for
/// the project (SPEC 5.2's rule, `gitlab::access::user_access_for_project`); `null` for a
/// project the viewer may not read.
pub(super) async fn user_access_authorized(
    ctx: &Context<'_>,
    project: &ProjectRow,
) -> Result<Option<Connection<String, ClusterAgentAuthorizationUserAccess>>> {
    if !project.readable {
        return Ok(None);
    }
    let rows = load(ctx, [UserAccessAgents(project.id)]).await.gql()?;
    let rows: Vec<AuthorizedAgent> = rows.into_values().flatten().collect();
    preload_nodes_agents(ctx, &rows).await?;
    Ok(Some(whole(rows, ClusterAgentAuthorizationUserAccess)))
}

/// Loads what `fields` (selected on agents in a list) will ask for their `agent_ids`: whether
/// the viewer may read them, and the tokens of those they may, one statement per page asked,
/// whatever the number of agents.
pub(super) async fn preload_for_agents<'a>(
    ctx: &Context<'_>,
    fields: impl Iterator<Item = SelectionField<'a>>,
    agent_ids: &[i64],
) -> Result<()> {
    let agent_ids = keep_readable(ctx, agent_ids.to_vec(), |id| *id).await?;
    for field in fields.filter(|f| f.name() == "tokens") {
        let arguments = field.arguments().unwrap_or_default();
        let argument = |name: &str| {
            arguments
                .iter()
                .find(|(n, _)| n.as_str() == name)
                .map(|(_, v)| v.clone())
        };
        let first = match argument("first") {
            Some(Value::Number(n)) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
            _ => None,
        };
        let after = match argument("after") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        };
        // Arguments the field refuses are refused there, with nothing to preload.
        let Some((after, limit)) = page_window(first, after.as_deref()) else {
            continue;
        };
        let keys = agent_ids.iter().map(|&agent_id| AgentTokens {
            agent_id,
            after,
            limit,
        });
        loader(ctx).load_many(keys).await.gql()?;
    }
    Ok(())
}

/// Loads what `fields` (selected on projects in a list) will ask for `project_ids`: the agents
/// authorized for them and whether the viewer may read them, one statement for all.
pub(super) async fn preload_for_projects<'a>(
    ctx: &Context<'_>,
    fields: impl Iterator<Item = SelectionField<'a>>,
    project_ids: &[i64],
) -> Result<()> {
    for field in fields {
        match field.name() {
            "ciAccessAuthorizedAgents" => {
                let keys = project_ids.iter().copied().map(CiAccessAgents);
                let found = loader(ctx).load_many(keys).await.gql()?;
                // Which of them the viewer may read, for every project at once.
                let agents = found.values().flatten().map(|a| AgentReadable(a.agent.id));
                loader(ctx).load_many(agents).await.gql()?;
            }
            "userAccessAuthorizedAgents" => {
                let keys = project_ids.iter().copied().map(UserAccessAgents);
                loader(ctx).load_many(keys).await.gql()?;
            }
            _ => {}
        }
    }
    Ok(())
}
