//! The GraphQL types of SPEC 5.1, named as in GitLab's schema.

use std::sync::Arc;

use async_graphql::connection::{Connection, Edge};
use async_graphql::dataloader::{DataLoader, HashMapCache};
use async_graphql::{
    Context, Enum, InputValueError, InputValueResult, Object, OutputType, Scalar, ScalarType,
    Value, ID,
};
use chrono::{DateTime, SecondsFormat, Utc};
use tokio::sync::{MappedMutexGuard, OnceCell};

use super::agents::{
    self, ClusterAgentAuthorizationCiAccess, ClusterAgentAuthorizationUserAccess, ClusterAgentToken,
};
use super::history;
use super::loaders::{
    feed_agents, load, AgentId, AgentOfDeployment, Db, DeploymentCount, EnvironmentName,
    LastDeployment, LoadError, ProjectId,
};
use super::org::{self, EnvironmentSort};
use super::resource_group::{self, HealthStatus, ResourceGroup};
use crate::auth::CurrentUser;
use crate::db::health;
use crate::db::lease::Lease;
use crate::db::read::{
    self, AgentDeploymentRow, AgentRow, DeploymentRow, EnvironmentFilter, EnvironmentRow, GroupRow,
    ProjectRow, Viewer,
};
use crate::error::Error;
use crate::gitlab::deployment_status::DeploymentStatus;

pub(super) type Result<T> = async_graphql::Result<T>;

/// `gid://gitlab/<Kind>/<id>`, GitLab's global ids.
pub(super) fn gid(kind: &str, id: i64) -> ID {
    ID(format!("gid://gitlab/{kind}/{id}"))
}

pub(super) fn loader<'a>(ctx: &Context<'a>) -> &'a DataLoader<Db, HashMapCache> {
    ctx.data_unchecked::<Arc<DataLoader<Db, HashMapCache>>>()
}

/// The request's connection (see `loaders::Db`), for one statement.
pub(super) async fn conn<'a>(ctx: &Context<'a>) -> Result<MappedMutexGuard<'a, Lease>> {
    loader(ctx).loader().conn().await.gql()
}

/// Who reads, for the reading rules: the session's user.
async fn viewer(ctx: &Context<'_>) -> Result<Viewer> {
    loader(ctx).loader().viewer().await.gql()
}

/// Our errors as GraphQL errors, never through `Display` alone (which would show causes).
pub(super) trait Gql<T> {
    fn gql(self) -> Result<T>;
}

impl<T> Gql<T> for std::result::Result<T, Error> {
    fn gql(self) -> Result<T> {
        self.map_err(|e| e.to_graphql())
    }
}

impl<T> Gql<T> for std::result::Result<T, LoadError> {
    fn gql(self) -> Result<T> {
        self.map_err(|e| e.to_graphql())
    }
}

/// GitLab's `Time`: an ISO 8601 timestamp.
#[derive(Debug, Clone, Copy)]
pub struct Time(pub DateTime<Utc>);

#[Scalar(name = "Time")]
impl ScalarType for Time {
    fn parse(value: Value) -> InputValueResult<Self> {
        match &value {
            Value::String(s) => DateTime::parse_from_rfc3339(s)
                .map(|t| Time(t.with_timezone(&Utc)))
                .map_err(|_| InputValueError::expected_type(value)),
            _ => Err(InputValueError::expected_type(value)),
        }
    }

    fn to_value(&self) -> Value {
        Value::String(self.0.to_rfc3339_opts(SecondsFormat::Secs, true))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum DeploymentTier {
    Production,
    Staging,
    Testing,
    Development,
    Other,
}

impl DeploymentTier {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            DeploymentTier::Production => "production",
            DeploymentTier::Staging => "staging",
            DeploymentTier::Testing => "testing",
            DeploymentTier::Development => "development",
            DeploymentTier::Other => "other",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::Production,
            Self::Staging,
            Self::Testing,
            Self::Development,
            Self::Other,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }
}

const DEFAULT_PAGE: i32 = 20;
const MAX_PAGE: i32 = 100;

/// A page costs its size times what each node asks for, so the complexity limit bounds the
/// rows a query can make the server load.
pub(super) fn page_cost(first: Option<i32>, child_complexity: usize) -> usize {
    first.unwrap_or(DEFAULT_PAGE).clamp(0, MAX_PAGE) as usize * child_complexity
}

/// A page of `first` nodes after the cursor `after`, ordered by id; the cursor is the id.
/// `fetch(after, limit)` returns up to `limit` nodes, one more than the page to tell whether
/// another page follows.
/// The `(after, limit)` that [`page`] asks its fetch for, given the arguments; `None` when it
/// refuses them.
pub(super) fn page_window(first: Option<i32>, after: Option<&str>) -> Option<(Option<i64>, i64)> {
    let first = first.unwrap_or(DEFAULT_PAGE);
    if !(0..=MAX_PAGE).contains(&first) {
        return None;
    }
    let after = match after {
        None => None,
        Some(cursor) => Some(cursor.parse::<i64>().ok()?),
    };
    Some((after, first as i64 + 1))
}

pub(super) async fn page<N, F, Fut>(
    first: Option<i32>,
    after: Option<String>,
    fetch: F,
) -> Result<Connection<String, N>>
where
    N: OutputType,
    F: FnOnce(Option<i64>, i64) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<(i64, N)>>>,
{
    let first = first.unwrap_or(DEFAULT_PAGE);
    if !(0..=MAX_PAGE).contains(&first) {
        return Err(
            Error::invalid("first", format!("must be between 0 and {MAX_PAGE}")).to_graphql(),
        );
    }
    let after =
        match after {
            None => None,
            Some(cursor) => Some(cursor.parse::<i64>().map_err(|_| {
                Error::invalid("after", "is not a cursor of this list").to_graphql()
            })?),
        };
    let mut nodes = fetch(after, first as i64 + 1).await?;
    let has_next = nodes.len() > first as usize;
    nodes.truncate(first as usize);
    let mut connection = Connection::new(after.is_some(), has_next);
    connection.edges.extend(
        nodes
            .into_iter()
            .map(|(id, node)| Edge::new(id.to_string(), node)),
    );
    Ok(connection)
}

pub struct Query;

#[Object]
impl Query {
    /// A project by full path; `null` when it does not exist or the user may not read it.
    async fn project(&self, ctx: &Context<'_>, full_path: ID) -> Result<Option<Project>> {
        let row = loader(ctx)
            .loader()
            .readable_project(&full_path)
            .await
            .gql()?;
        Ok(row.map(Project))
    }

    /// A group by full path; `null` when it does not exist for the user.
    async fn group(&self, ctx: &Context<'_>, full_path: ID) -> Result<Option<Group>> {
        let viewer = viewer(ctx).await?;
        let row = read::visible_group(&mut **conn(ctx).await?, viewer, &full_path)
            .await
            .gql()?;
        Ok(row.map(Group))
    }

    /// The signed-in user.
    async fn current_user(&self, ctx: &Context<'_>) -> Result<UserCore> {
        let user: &CurrentUser = loader(ctx).loader().user().await.gql()?;
        Ok(UserCore {
            id: user.id,
            username: user.username.clone(),
        })
    }
}

pub struct UserCore {
    pub(super) id: i64,
    pub(super) username: String,
}

#[Object]
impl UserCore {
    async fn id(&self) -> ID {
        gid("User", self.id)
    }

    async fn username(&self) -> &str {
        &self.username
    }
}

pub struct Project(pub ProjectRow);

#[Object]
impl Project {
    async fn id(&self) -> ID {
        gid("Project", self.0.id)
    }

    async fn full_path(&self) -> ID {
        ID(self.0.full_path.clone())
    }

    async fn name(&self) -> &str {
        &self.0.path
    }

    /// The environment named `name`; `null` without a name (GitLab's argument is optional, and
    /// its frontend declares `$environmentName: String`).
    async fn environment(
        &self,
        ctx: &Context<'_>,
        name: Option<String>,
    ) -> Result<Option<Environment>> {
        let Some(name) = name.filter(|_| self.0.readable) else {
            return Ok(None);
        };
        let key = EnvironmentName(self.0.id, name);
        let rows = load(ctx, [key]).await.gql()?;
        Ok(rows.into_values().next().map(Environment::new))
    }

    #[graphql(complexity = "page_cost(first, child_complexity)")]
    async fn environments(
        &self,
        ctx: &Context<'_>,
        name: Option<String>,
        search: Option<String>,
        states: Option<Vec<String>>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Environment>> {
        let readable = self.0.readable;
        page(first, after, |after, limit| async move {
            if !readable {
                return Ok(Vec::new());
            }
            let filter = EnvironmentFilter {
                name: name.as_deref(),
                search: search.as_deref(),
                states: states.as_deref(),
                after,
                limit,
                ..Default::default()
            };
            let rows = read::project_environments(&mut **conn(ctx).await?, self.0.id, &filter)
                .await
                .gql()?;
            preload(ctx, &rows).await?;
            let nodes: Vec<Environment> = rows.into_iter().map(Environment::new).collect();
            seed_health(ctx, &nodes).await?;
            Ok(nodes.into_iter().map(|e| (e.row.id, e)).collect())
        })
        .await
    }

    /// The project's agent named `name`; `null` when there is none the viewer may read.
    async fn cluster_agent(&self, ctx: &Context<'_>, name: String) -> Result<Option<ClusterAgent>> {
        if !self.0.readable {
            return Ok(None);
        }
        let rows = read::project_agents(&mut **conn(ctx).await?, self.0.id, Some(&name))
            .await
            .gql()?;
        let rows = agents::keep_readable(ctx, rows, |a| a.id).await?;
        Ok(rows.into_iter().next().map(ClusterAgent))
    }

    /// A deployment of the project by its iid (GitLab's `Project.deployment`).
    async fn deployment(&self, ctx: &Context<'_>, iid: ID) -> Result<Option<Deployment>> {
        let Ok(iid) = iid.parse::<i64>() else {
            return Err(
                Error::invalid("iid", format!("`{}` is not an iid", iid.as_str())).to_graphql(),
            );
        };
        if !self.0.readable {
            return Ok(None);
        }
        let row = read::deployment_by_iid(&mut **conn(ctx).await?, self.0.id, iid)
            .await
            .gql()?;
        Ok(row.map(Deployment))
    }

    /// Authorized cluster agents for the project through the `ci_access` keyword.
    async fn ci_access_authorized_agents(
        &self,
        ctx: &Context<'_>,
    ) -> Result<Option<Connection<String, ClusterAgentAuthorizationCiAccess>>> {
        agents::ci_access_authorized(ctx, &self.0).await
    }

    /// Authorized cluster agents for the project through the `user_access` keyword: those
    /// that admit the signed-in user.
    async fn user_access_authorized_agents(
        &self,
        ctx: &Context<'_>,
    ) -> Result<Option<Connection<String, ClusterAgentAuthorizationUserAccess>>> {
        agents::user_access_authorized(ctx, &self.0).await
    }

    /// The project's agents that the viewer may read.
    async fn cluster_agents(&self, ctx: &Context<'_>) -> Result<Connection<String, ClusterAgent>> {
        let rows = match self.0.readable {
            true => read::project_agents(&mut **conn(ctx).await?, self.0.id, None)
                .await
                .gql()?,
            false => Vec::new(),
        };
        let rows = agents::keep_readable(ctx, rows, |a| a.id).await?;
        let ids: Vec<i64> = rows.iter().map(|a| a.id).collect();
        agents::preload_for_agents(ctx, node_fields(ctx).into_iter(), &ids).await?;
        let mut connection = Connection::new(false, false);
        connection.edges.extend(
            rows.into_iter()
                .map(|a| Edge::new(a.id.to_string(), ClusterAgent(a))),
        );
        Ok(connection)
    }
}

pub struct Group(pub GroupRow);

#[Object]
impl Group {
    async fn id(&self) -> ID {
        gid("Group", self.0.id)
    }

    async fn full_path(&self) -> ID {
        ID(self.0.full_path.clone())
    }

    async fn name(&self) -> &str {
        &self.0.path
    }

    /// The environments of every project in the group and its subgroups that the user may
    /// read: the organization-level view. `health` keeps those whose health the viewer sees
    /// and is one of these; `sort` orders them (by id without one).
    #[graphql(complexity = "page_cost(first, child_complexity)")]
    #[allow(clippy::too_many_arguments)]
    async fn environments(
        &self,
        ctx: &Context<'_>,
        tier: Option<DeploymentTier>,
        search: Option<String>,
        health: Option<Vec<HealthStatus>>,
        sort: Option<EnvironmentSort>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Environment>> {
        if health.is_some() || sort.is_some() {
            return self
                .arranged(ctx, tier, search, health, sort, first, after)
                .await;
        }
        page(first, after, |after, limit| async move {
            let filter = EnvironmentFilter {
                tier: tier.map(DeploymentTier::as_str),
                search: search.as_deref(),
                after,
                limit,
                ..Default::default()
            };
            let viewer = viewer(ctx).await?;
            let rows =
                read::group_environments(&mut **conn(ctx).await?, viewer, self.0.id, &filter)
                    .await
                    .gql()?;
            preload(ctx, &rows).await?;
            let nodes: Vec<Environment> = rows.into_iter().map(Environment::new).collect();
            seed_health(ctx, &nodes).await?;
            Ok(nodes.into_iter().map(|e| (e.row.id, e)).collect())
        })
        .await
    }

    /// How many of the group's environments (of `tier`) have each health, among those whose
    /// health the viewer may see; worst first.
    async fn environment_health_counts(
        &self,
        ctx: &Context<'_>,
        tier: Option<DeploymentTier>,
    ) -> Result<Vec<org::EnvironmentHealthCount>> {
        let viewer = viewer(ctx).await?;
        let projects = org::projects(ctx, viewer, self.0.id).await?;
        let scope = health::Scope {
            viewer,
            group_id: self.0.id,
            projects: &projects,
            tier: tier.map(DeploymentTier::as_str),
            search: None,
        };
        let (decisions, tallies) = org::decided(ctx, scope).await?;
        Ok(decisions.counts(&tallies))
    }
}

impl Group {
    /// `environments` filtered or sorted by health: the viewer's access decided per agent
    /// that read the group's kept healths, then PostgreSQL filters, sorts and cuts the page
    /// with those decisions; the cursor is the position in that order.
    #[allow(clippy::too_many_arguments)]
    async fn arranged(
        &self,
        ctx: &Context<'_>,
        tier: Option<DeploymentTier>,
        search: Option<String>,
        wanted: Option<Vec<HealthStatus>>,
        sort: Option<EnvironmentSort>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Environment>> {
        page(first, after, |after, limit| async move {
            let viewer = viewer(ctx).await?;
            let projects = org::projects(ctx, viewer, self.0.id).await?;
            let scope = health::Scope {
                viewer,
                group_id: self.0.id,
                projects: &projects,
                tier: tier.map(DeploymentTier::as_str),
                search: search.as_deref(),
            };
            let (decisions, _) = org::decided(ctx, scope).await?;
            let wanted: Option<Vec<&str>> = wanted
                .as_ref()
                .map(|w| w.iter().map(|s| s.name()).collect());
            let start = after.map_or(0, |a| a.saturating_add(1).max(0));
            let listed = health::page(
                &mut **conn(ctx).await?,
                scope,
                &decisions.seen(),
                wanted.as_deref(),
                org::order(sort),
                start,
                limit,
            )
            .await
            .gql()?;
            let window: Vec<(i64, Environment)> = listed
                .into_iter()
                .enumerate()
                .map(|(at, listed)| {
                    let shown = listed.health.as_ref().and_then(|h| decisions.show(h));
                    let node = Environment::new(listed.row);
                    let _ = node.health.set(shown);
                    (start + at as i64, node)
                })
                .collect();
            let rows: Vec<EnvironmentRow> = window.iter().map(|(_, e)| e.row.clone()).collect();
            preload(ctx, &rows).await?;
            Ok(window)
        })
        .await
    }
}

/// Reads the health of `nodes` at once when the page's nodes select it, so that a page costs
/// one statement and one decision per agent, not one per environment.
async fn seed_health(ctx: &Context<'_>, nodes: &[Environment]) -> Result<()> {
    if nodes.is_empty() || !node_fields(ctx).iter().any(|f| f.name() == "health") {
        return Ok(());
    }
    let ids: Vec<i64> = nodes.iter().map(|e| e.row.id).collect();
    let rows = crate::db::health::of_environments(&mut **conn(ctx).await?, &ids)
        .await
        .gql()?;
    let mut shown = org::shown(ctx, &rows).await?;
    for node in nodes {
        let _ = node.health.set(shown.remove(&node.row.id));
    }
    Ok(())
}

/// The fields a page's nodes select, through `nodes` or `edges { node }`.
pub(super) fn node_fields<'a>(ctx: &'a Context<'_>) -> Vec<async_graphql::SelectionField<'a>> {
    let look = ctx.look_ahead();
    let nodes = look.field("nodes").selection_fields();
    let edge_nodes = look.field("edges").field("node").selection_fields();
    nodes
        .into_iter()
        .chain(edge_nodes)
        .flat_map(|node| node.selection_set().collect::<Vec<_>>())
        .collect()
}

/// Loads the agents of `deployments` with their projects, one statement per kind of row.
async fn preload_agents(ctx: &Context<'_>, deployments: impl Iterator<Item = i64>) -> Result<()> {
    let loader = loader(ctx);
    let rows = loader
        .load_many(deployments.map(AgentOfDeployment))
        .await
        .gql()?;
    let agents = loader
        .load_many(rows.values().flatten().map(|r| AgentId(r.agent_id)))
        .await
        .gql()?;
    loader
        .load_many(agents.values().map(|a| ProjectId(a.project_id)))
        .await
        .gql()?;
    Ok(())
}

/// Loads what the nodes of a page of deployments select (their agents), so that a page costs
/// the same number of statements whatever its size.
async fn preload_deployments(ctx: &Context<'_>, deployments: &[DeploymentRow]) -> Result<()> {
    if node_fields(ctx).iter().any(|f| f.name() == "agent") {
        preload_agents(ctx, deployments.iter().map(|d| d.id)).await?;
    }
    Ok(())
}

/// Loads what the nodes of a page of environments will ask for, one statement per kind of
/// row, so that a page costs the same number of statements whatever its size. The nodes'
/// own loads are then answered from the request's cache. Reads the query ahead: only what
/// the nodes select is loaded.
async fn preload(ctx: &Context<'_>, environments: &[EnvironmentRow]) -> Result<()> {
    let mut statuses = std::collections::BTreeSet::new();
    let mut projects = Vec::new();
    let mut counts = false;
    let mut agents = Vec::new();
    for field in node_fields(ctx) {
        match field.name() {
            "clusterAgent" => {
                statuses.insert(DeploymentStatus::Success.as_str());
                agents.push(field);
            }
            "kubernetesNamespace" | "fluxResourcePath" => {
                statuses.insert(DeploymentStatus::Success.as_str());
            }
            "deploymentsDisplayCount" => counts = true,
            "lastDeployment" => {
                let arguments = field.arguments().ok().into_iter().flatten();
                let status = arguments
                    .into_iter()
                    .find(|(name, _)| name.as_str() == "status");
                if let Some((_, Value::Enum(status))) = status {
                    if let Some(status) = DeploymentStatus::parse(&status.to_ascii_lowercase()) {
                        statuses.insert(status.as_str());
                    }
                }
            }
            "project" => projects.push(field),
            _ => {}
        }
    }
    let loader = loader(ctx);
    if !projects.is_empty() {
        let ids: Vec<i64> = environments.iter().map(|e| e.project_id).collect();
        loader
            .load_many(ids.iter().copied().map(ProjectId))
            .await
            .gql()?;
        let fields = projects.iter().flat_map(|p| p.selection_set());
        agents::preload_for_projects(ctx, fields, &ids).await?;
    }
    if counts {
        let keys = environments.iter().map(|e| DeploymentCount(e.id));
        loader.load_many(keys).await.gql()?;
    }
    for status in statuses {
        // Their agents come with them.
        let keys = environments.iter().map(|e| LastDeployment(e.id, status));
        let last = feed_agents(loader, loader.load_many(keys).await.gql()?).await;
        if status == DeploymentStatus::Success.as_str() && !agents.is_empty() {
            let deployments = last.values().map(|d| AgentOfDeployment(d.id));
            let rows = loader.load_many(deployments).await.gql()?;
            let agent_ids: Vec<i64> = rows.values().flatten().map(|r| r.agent_id).collect();
            let fields = agents.iter().flat_map(|a| a.selection_set());
            agents::preload_for_agents(ctx, fields, &agent_ids).await?;
        }
    }
    Ok(())
}

pub struct Environment {
    pub(super) row: EnvironmentRow,
    /// The last successful deployment, read once for every field that shows it
    /// (`clusterAgent`, `kubernetesNamespace`, `resourceGroup`, `lastDeployment(status:
    /// SUCCESS)`): outside lists its loads do not go through the DataLoader's cache (see
    /// `loaders::load`).
    last_success: OnceCell<Option<DeploymentRow>>,
    /// What the viewer sees of its kept health, when a list read it for every node at once.
    health: std::sync::OnceLock<Option<org::EnvironmentHealth>>,
}

impl Environment {
    pub fn new(row: EnvironmentRow) -> Self {
        Environment {
            row,
            last_success: OnceCell::new(),
            health: std::sync::OnceLock::new(),
        }
    }

    /// The deployment with the highest id in `status`, its agent in the loaders' cache.
    async fn last(
        &self,
        ctx: &Context<'_>,
        status: DeploymentStatus,
    ) -> Result<Option<DeploymentRow>> {
        let read = || async {
            let key = LastDeployment(self.row.id, status.as_str());
            let last = feed_agents(loader(ctx), load(ctx, [key]).await.gql()?).await;
            Ok(last.into_values().next())
        };
        if status == DeploymentStatus::Success {
            self.last_success.get_or_try_init(read).await.cloned()
        } else {
            read().await
        }
    }

    /// The GitOps sources the environment is bound to (SPEC 15): the Flux object its
    /// `fluxResourcePath` names, and the Argo CD Application Maintainers bound it to.
    pub(super) async fn gitops_sources(
        &self,
        ctx: &Context<'_>,
        row: &AgentDeploymentRow,
    ) -> Result<Vec<crate::gitops::ObjRef>> {
        super::gitops::bound_sources(&mut **conn(ctx).await?, self.row.id, row)
            .await
            .gql()
    }

    /// The environment's agent (SPEC 15): that of its last successful deployment, with its
    /// `agent_deployments` row; else the agent GitLab's environments API names for it, as the
    /// sync read it and `ci_access` allowed it (`deployment_id` 0: no deployment).
    pub(super) async fn last_agent(
        &self,
        ctx: &Context<'_>,
    ) -> Result<Option<(AgentRow, AgentDeploymentRow)>> {
        if let Some(d) = self.last(ctx, DeploymentStatus::Success).await? {
            if let Some(found) = deployment_agent(ctx, d.id).await? {
                return Ok(Some(found));
            }
        }
        let named = crate::db::pull::environment_agents(&mut **conn(ctx).await?, &[self.row.id])
            .await
            .gql()?;
        let Some((_, agent_id, kubernetes_namespace, flux_resource_path)) =
            named.into_iter().next()
        else {
            return Ok(None);
        };
        let agent = loader(ctx).load_one(AgentId(agent_id)).await.gql()?;
        Ok(agent.map(|a| {
            let row = AgentDeploymentRow {
                deployment_id: 0,
                agent_id,
                kubernetes_namespace,
                flux_resource_path,
            };
            (a, row)
        }))
    }
}

/// The Flux object an environment's `fluxResourcePath` binds it to, when it names one.
fn bound_flux_source(row: &AgentDeploymentRow) -> Option<crate::gitops::ObjRef> {
    let path = crate::gitops::path::parse(row.flux_resource_path.as_deref()?)?;
    super::gitops::bound_source(&path)
}

pub(super) async fn deployment_agent(
    ctx: &Context<'_>,
    deployment_id: i64,
) -> Result<Option<(AgentRow, AgentDeploymentRow)>> {
    let Some(row) = loader(ctx)
        .load_one(AgentOfDeployment(deployment_id))
        .await
        .gql()?
        .flatten()
    else {
        return Ok(None);
    };
    let agent = loader(ctx).load_one(AgentId(row.agent_id)).await.gql()?;
    Ok(agent.map(|a| (a, row)))
}

pub(super) async fn project(ctx: &Context<'_>, id: i64) -> Result<Project> {
    let row = loader(ctx).load_one(ProjectId(id)).await.gql()?;
    row.map(Project)
        .ok_or_else(|| Error::NotFound(format!("project {id}")).to_graphql())
}

#[Object]
impl Environment {
    async fn id(&self) -> ID {
        gid("Environment", self.row.id)
    }

    async fn name(&self) -> &str {
        &self.row.name
    }

    async fn slug(&self) -> &str {
        &self.row.slug
    }

    async fn tier(&self) -> Option<DeploymentTier> {
        self.row.tier.as_deref().and_then(DeploymentTier::parse)
    }

    async fn state(&self) -> &str {
        &self.row.state
    }

    async fn project(&self, ctx: &Context<'_>) -> Result<Project> {
        project(ctx, self.row.project_id).await
    }

    /// The deployment with the highest id in `status`.
    async fn last_deployment(
        &self,
        ctx: &Context<'_>,
        status: DeploymentStatus,
    ) -> Result<Option<Deployment>> {
        Ok(self.last(ctx, status).await?.map(Deployment))
    }

    /// Newest first: by creation time, as GitLab's id order is, so that a pull-based
    /// deployment (SPEC 15) stands among GitLab's by when it was recorded.
    #[graphql(complexity = "page_cost(first, child_complexity)")]
    async fn deployments(
        &self,
        ctx: &Context<'_>,
        statuses: Option<Vec<DeploymentStatus>>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Deployment>> {
        let statuses: Option<Vec<String>> =
            statuses.map(|s| s.iter().map(|s| s.as_str().to_owned()).collect());
        page(first, after, |before, limit| async move {
            let rows = read::environment_deployments(
                &mut **conn(ctx).await?,
                self.row.id,
                statuses.as_deref(),
                before,
                limit,
            )
            .await
            .gql()?;
            preload_deployments(ctx, &rows).await?;
            Ok(rows.into_iter().map(|d| (d.id, Deployment(d))).collect())
        })
        .await
    }

    /// The agent of the last successful deployment, when the viewer may read it.
    async fn cluster_agent(&self, ctx: &Context<'_>) -> Result<Option<ClusterAgent>> {
        let Some((agent, _)) = self.last_agent(ctx).await? else {
            return Ok(None);
        };
        Ok(agents::readable(ctx, agent.id)
            .await?
            .then_some(ClusterAgent(agent)))
    }

    /// The namespace of the last successful deployment.
    async fn kubernetes_namespace(&self, ctx: &Context<'_>) -> Result<Option<String>> {
        Ok(self
            .last_agent(ctx)
            .await?
            .map(|(_, row)| row.kubernetes_namespace))
    }

    /// The Flux resource path of the last successful deployment (`environment:kubernetes:
    /// dashboard:flux_resource_path`, or the deprecated `flux_resource_path`).
    async fn flux_resource_path(&self, ctx: &Context<'_>) -> Result<Option<String>> {
        Ok(self
            .last_agent(ctx)
            .await?
            .and_then(|(_, row)| row.flux_resource_path))
    }

    /// The number of deployments, exact up to 999 and `999+` beyond, as GitLab shows it.
    async fn deployments_display_count(&self, ctx: &Context<'_>) -> Result<Option<String>> {
        let counts = load(ctx, [DeploymentCount(self.row.id)]).await.gql()?;
        let count = counts.into_values().next().unwrap_or(0);
        Ok(Some(if count >= read::DEPLOYMENTS_COUNTED {
            format!("{}+", read::DEPLOYMENTS_COUNTED - 1)
        } else {
            count.to_string()
        }))
    }

    /// The live resources of the last successful deployment's namespace, labelled for this
    /// environment, and what they own; `null` when no successful deployment went through an
    /// agent. Needs the user's `user_access` to that agent.
    ///
    /// An environment bound to a Flux object by its `fluxResourcePath` has that object's
    /// inventory too, across the namespaces it names (SPEC 15).
    #[graphql(complexity = "resource_group::COST + child_complexity")]
    async fn resource_group(&self, ctx: &Context<'_>) -> Result<Option<ResourceGroup>> {
        let Some((agent, row)) = self.last_agent(ctx).await? else {
            return Ok(None);
        };
        let sources = self.gitops_sources(ctx, &row).await?;
        if sources.is_empty() {
            return resource_group::load(ctx, &self.row, agent, row.kubernetes_namespace)
                .await
                .map(Some);
        }
        let labels = Some(row.kubernetes_namespace).filter(|ns| !ns.is_empty());
        resource_group::load_gitops(ctx, &self.row, agent, labels, sources)
            .await
            .map(Some)
    }

    /// The Flux actions asked for on the environment (SPEC 15), newest first, refusals
    /// included. Only for viewers with `user_access` to the agent: none for others.
    #[graphql(complexity = "page_cost(first, child_complexity)")]
    async fn flux_actions(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, super::flux_actions::FluxAction>> {
        super::flux_actions::page_of(ctx, self, first, after).await
    }

    /// The namespaces project Maintainers added to the environment, beyond its deployment's:
    /// its labels source applies in them too (SPEC 15).
    async fn added_namespaces(&self, ctx: &Context<'_>) -> Result<Vec<String>> {
        crate::db::environment_settings::namespaces(&mut **conn(ctx).await?, self.row.id)
            .await
            .gql()
    }

    /// The Argo CD Application bound to the environment, `<namespace>/<name>` in the cluster of
    /// its agent; null when unbound.
    async fn argo_application(&self, ctx: &Context<'_>) -> Result<Option<String>> {
        let bound =
            crate::db::environment_settings::argo_application(&mut **conn(ctx).await?, self.row.id)
                .await
                .gql()?;
        Ok(bound.map(|(namespace, name)| format!("{namespace}/{name}")))
    }

    /// GitLab's sync status of the Flux object the environment is bound to by its
    /// `fluxResourcePath` (SPEC 15); null without one, when it is not found, or without the
    /// viewer's `user_access` to the agent.
    #[graphql(complexity = "resource_group::COST")]
    async fn flux_sync_status(
        &self,
        ctx: &Context<'_>,
    ) -> Result<Option<super::gitops::FluxSyncStatus>> {
        let Some((agent, row)) = self.last_agent(ctx).await? else {
            return Ok(None);
        };
        let Some(source) = bound_flux_source(&row) else {
            return Ok(None);
        };
        // Only the bound object is read, not its group.
        super::gitops::source_status(ctx, &self.row, &agent, &source)
            .await
            .or(Ok(None))
    }

    /// Its group's health as kept current (SPEC 18), without building the group: `null` when
    /// the viewer lacks `user_access` to the agent (or, under `access_as: user`, may not list
    /// every kind of the group), and when no group was ever read. `UNKNOWN` with the
    /// connection's message while the agent's connection is lost.
    async fn health(&self, ctx: &Context<'_>) -> Result<Option<org::EnvironmentHealth>> {
        if let Some(seeded) = self.health.get() {
            return Ok(seeded.clone());
        }
        let rows = crate::db::health::of_environments(&mut **conn(ctx).await?, &[self.row.id])
            .await
            .gql()?;
        Ok(org::shown(ctx, &rows).await?.remove(&self.row.id))
    }

    /// The environment's timeline (SPEC 17), newest first by last time: the Kubernetes Events
    /// of its group's resources (a series once, with its count) and envlens' own events
    /// (deployments started and finished, health changes). `types` keeps `Normal` or
    /// `Warning` ones, `since` those last seen at or after it. The Kubernetes Events and the
    /// health changes need the viewer's `user_access` to the agent; without it the timeline
    /// has the deployments only.
    #[graphql(complexity = "resource_group::COST + page_cost(first, child_complexity)")]
    async fn events(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
        since: Option<Time>,
        types: Option<Vec<String>>,
    ) -> Result<Connection<String, super::events::EnvironmentEvent>> {
        let agent = self
            .last_agent(ctx)
            .await?
            .map(|(agent, row)| (agent, row.kubernetes_namespace));
        super::events::page(ctx, &self.row, agent, first, after, since, types).await
    }
}

pub struct Deployment(pub DeploymentRow);

/// A deployment Flux made (SPEC 15).
#[derive(async_graphql::SimpleObject)]
pub struct PullDeployment {
    /// The Flux resource path of the object that applied it.
    pub source: String,
    /// The revision it applied, as Flux wrote it (`main@sha1:…`).
    pub revision: String,
    /// Why no deployment was created in GitLab (no branch, no `api` token); null when one was.
    pub gitlab_reason: Option<String>,
}

#[Object]
impl Deployment {
    async fn id(&self) -> ID {
        gid("Deployment", self.0.id)
    }

    async fn iid(&self) -> Option<ID> {
        self.0.iid.map(|iid| ID(iid.to_string()))
    }

    #[graphql(name = "ref")]
    async fn git_ref(&self) -> Option<&str> {
        self.0.git_ref.as_deref()
    }

    async fn sha(&self) -> Option<&str> {
        self.0.sha.as_deref()
    }

    async fn tag(&self) -> Option<bool> {
        self.0.tag
    }

    async fn status(&self) -> Option<DeploymentStatus> {
        DeploymentStatus::parse(&self.0.status)
    }

    async fn created_at(&self) -> Time {
        Time(self.0.created_at)
    }

    async fn updated_at(&self) -> Time {
        Time(self.0.updated_at)
    }

    async fn finished_at(&self) -> Option<Time> {
        self.0.finished_at.map(Time)
    }

    /// The environment deployed to; null until GitLab has named it.
    async fn environment(&self, ctx: &Context<'_>) -> Result<Option<Environment>> {
        let Some(id) = self.0.environment_id else {
            return Ok(None);
        };
        let row = read::environment_by_id(&mut **conn(ctx).await?, id)
            .await
            .gql()?;
        Ok(row.map(Environment::new))
    }

    /// Set when Flux made the deployment (SPEC 15: a new revision its bound object applied),
    /// not a deployment job.
    async fn pull_based(&self, ctx: &Context<'_>) -> Result<Option<PullDeployment>> {
        let made = crate::db::pull::made_by_flux(&mut **conn(ctx).await?, self.0.id)
            .await
            .gql()?;
        Ok(
            made.map(|(source, revision, gitlab_reason)| PullDeployment {
                source,
                revision,
                gitlab_reason,
            }),
        )
    }

    /// The agent and namespace the deployment job deployed to (its `agent_deployments` row).
    async fn agent(&self, ctx: &Context<'_>) -> Result<Option<DeploymentAgent>> {
        Ok(deployment_agent(ctx, self.0.id)
            .await?
            .map(|(agent, row)| DeploymentAgent {
                agent,
                namespace: row.kubernetes_namespace,
            }))
    }

    /// The environment's resources as this deployment left them (SPEC 10): snapshotted when it
    /// succeeded, and again when its rollout settled. Null without an agent, or until the
    /// snapshot is taken. Needs the user's `user_access` to the agent.
    #[graphql(complexity = "history::ROW_COST + child_complexity")]
    async fn snapshot(&self, ctx: &Context<'_>) -> Result<Option<history::ResourceSnapshot>> {
        history::snapshot(ctx, &self.0).await
    }

    /// Where the taking of the snapshot stands: pending, retrying after the cluster could not be
    /// read (with the error), settling, done. Null without an agent or before a success. Needs
    /// the user's `user_access` to the agent.
    #[graphql(complexity = "history::ROW_COST + child_complexity")]
    async fn snapshot_status(&self, ctx: &Context<'_>) -> Result<Option<history::SnapshotStatus>> {
        history::status(ctx, &self.0).await
    }

    /// What this deployment changed, against `since` (a deployment of the same environment
    /// with a snapshot) or the environment's previous successful deployment with a snapshot.
    /// Null without a snapshot. Needs the user's `user_access` to the agent.
    #[graphql(complexity = "history::COST + child_complexity")]
    async fn changes(
        &self,
        ctx: &Context<'_>,
        since: Option<ID>,
    ) -> Result<Option<history::ResourceChanges>> {
        history::changes(ctx, &self.0, since).await
    }
}

pub struct DeploymentAgent {
    pub(super) agent: AgentRow,
    pub(super) namespace: String,
}

/// `/<project path>/-/cluster_agents/<name>`, the agent's page in GitLab.
async fn agent_web_path(ctx: &Context<'_>, agent: &AgentRow) -> Result<String> {
    let project = project(ctx, agent.project_id).await?;
    Ok(format!(
        "/{}/-/cluster_agents/{}",
        project.0.full_path, agent.name
    ))
}

#[Object]
impl DeploymentAgent {
    async fn id(&self) -> ID {
        gid("Clusters::Agent", self.agent.id)
    }

    async fn name(&self) -> &str {
        &self.agent.name
    }

    /// The agent's configuration project.
    async fn project(&self, ctx: &Context<'_>) -> Result<Project> {
        project(ctx, self.agent.project_id).await
    }

    async fn kubernetes_namespace(&self) -> &str {
        &self.namespace
    }

    async fn web_path(&self, ctx: &Context<'_>) -> Result<String> {
        agent_web_path(ctx, &self.agent).await
    }
}

pub struct ClusterAgent(pub AgentRow);

#[Object]
impl ClusterAgent {
    async fn id(&self) -> ID {
        gid("Clusters::Agent", self.0.id)
    }

    async fn name(&self) -> &str {
        &self.0.name
    }

    async fn project(&self, ctx: &Context<'_>) -> Result<Project> {
        project(ctx, self.0.project_id).await
    }

    async fn web_path(&self, ctx: &Context<'_>) -> Result<String> {
        agent_web_path(ctx, &self.0).await
    }

    async fn created_at(&self) -> Option<Time> {
        Some(Time(self.0.created_at))
    }

    /// Tokens associated with the cluster agent: its active ones, as GitLab reports them.
    #[graphql(complexity = "page_cost(first, child_complexity)")]
    async fn tokens(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Option<Connection<String, ClusterAgentToken>>> {
        agents::tokens(ctx, &self.0, first, after).await.map(Some)
    }

    /// How envlens reaches the agent's cluster, and how its last request there went.
    async fn connection(&self, ctx: &Context<'_>) -> Result<super::connection::AgentConnection> {
        super::connection::of(ctx, self).await
    }
}
