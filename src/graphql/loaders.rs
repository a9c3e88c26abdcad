//! Batch loaders, created per request so no cache outlives the request or crosses users:
//! every list a query touches is loaded in one statement per level, never one per row.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_graphql::dataloader::{DataLoader, HashMapCache, Loader};
use async_graphql::{Context, QueryPathSegment};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use crate::auth::{CurrentUser, Session};
use crate::db::identity::{self, User};
use crate::db::lease::{Lease, Leases};
use crate::db::read::{
    self, AgentDeploymentRow, AgentRow, DeploymentRow, DeploymentWithAgent, EnvironmentRow,
    ProjectRow, Viewer,
};
use crate::db::read_agents::{self, TokenRow};
use crate::error::Error;
use crate::gitlab::access::{
    self, AccessAs, CiAuthorizations, CiMatch, SourceKind, UserAccessEntry,
};

/// Loader errors must be `Clone`.
pub type LoadError = Arc<crate::error::Error>;

/// The database as one viewer sees it, through the request's one connection; one loader
/// serves every key type below.
///
/// A request borrows its connection once ([`Leases`]), and every statement it runs (the
/// resolvers' and the loaders') takes turns on it: the statements of one request mostly wait
/// for each other anyway.
///
/// A resolver about to wait on something else for long (a cluster, for a resource group)
/// [`releases`](Db::release) the connection, so that slow clusters cannot hold them all; a
/// later statement of the same request takes one again.
///
/// The session's user is read by the request's first statement that needs them (see
/// [`SessionUser`]).
pub struct Db {
    leases: Leases,
    conn: Mutex<Option<Lease>>,
    user: SessionUser,
}

/// The user of a verified session, once a statement has read their row: `None` inside when
/// the mirror does not know them. Whoever answers the request must make sure it was read, and
/// refuse the request when the user is unknown ([`Db::user`]).
pub struct SessionUser {
    session: Session,
    found: OnceLock<Option<CurrentUser>>,
}

impl SessionUser {
    pub fn new(session: Session) -> Self {
        SessionUser {
            session,
            found: OnceLock::new(),
        }
    }

    /// The user, if a statement has read their row yet.
    fn known(&self) -> Option<Result<&CurrentUser, Error>> {
        self.found
            .get()
            .map(|user| user.as_ref().ok_or_else(unknown))
    }

    fn set(&self, user: Option<User>) -> Result<&CurrentUser, Error> {
        let via = self.session.via;
        let user = user.map(|u| CurrentUser {
            id: u.id,
            username: u.username,
            admin: u.admin,
            via,
        });
        // Another statement of the request may have read the same row first.
        let _ = self.found.set(user);
        self.known().expect("just set")
    }

    /// The user, reading their row on `db` unless a statement already did: an error when the
    /// mirror does not know them, which refuses the request like a forged token.
    async fn read(&self, db: impl sqlx::PgExecutor<'_>) -> Result<&CurrentUser, Error> {
        match self.known() {
            Some(user) => user,
            None => self.set(identity::find_user(db, self.session.user_id).await?),
        }
    }
}

fn unknown() -> Error {
    Error::Unauthorized("unknown user".into())
}

impl Db {
    /// The session's user, read on the request's connection unless a statement already did.
    pub async fn user(&self) -> Result<&CurrentUser, Error> {
        if let Some(user) = self.user.known() {
            return user;
        }
        let mut conn = self.conn().await?;
        self.user.read(&mut **conn).await
    }

    /// Who reads, for the reading rules.
    pub async fn viewer(&self) -> Result<Viewer, Error> {
        let user = self.user().await?;
        Ok(Viewer {
            user_id: user.id,
            admin: user.admin,
        })
    }

    /// The project at `full_path` if the user may read it; the user's row comes in the same
    /// statement when no statement has read it yet.
    pub async fn readable_project(&self, full_path: &str) -> Result<Option<ProjectRow>, Error> {
        if let Some(user) = self.user.known() {
            let user = user?;
            let viewer = Viewer {
                user_id: user.id,
                admin: user.admin,
            };
            return read::readable_project(&mut **self.conn().await?, viewer, full_path).await;
        }
        let found = read::user_and_readable_project(
            &mut **self.conn().await?,
            self.user.session.user_id,
            full_path,
        )
        .await?;
        let (user, project) = found.map_or((None, None), |(user, project)| (Some(user), project));
        self.user.set(user)?;
        Ok(project)
    }

    /// The request's connection, for one statement at a time: hold the guard no longer.
    pub async fn conn(&self) -> Result<MappedMutexGuard<'_, Lease>, crate::error::Error> {
        let mut guard = self.conn.lock().await;
        if guard.is_none() {
            *guard = Some(self.leases.acquire().await?);
        }
        Ok(MutexGuard::map(guard, |conn| {
            conn.as_mut().expect("taken just above")
        }))
    }

    /// Gives the connection back until the next statement.
    pub async fn release(&self) {
        self.conn.lock().await.take();
    }

    /// Closes the connection instead of giving it back: the request found the database
    /// unavailable (see `db::lease`).
    pub async fn discard(&self) {
        if let Some(lease) = self.conn.lock().await.take() {
            lease.discard();
        }
    }
}

/// The cache lives for the request: a list preloads what its nodes will ask for (see
/// `types::preload_*`), and the nodes' own loads are then answered from it. Keys that find no
/// row are cached too (as `None`), or every node would ask again. Batching therefore does not
/// rest on a timer, and there is none: a 1 ms batching delay per level cost the blueprint
/// query some 5 ms.
pub fn loader(leases: Leases, user: SessionUser) -> DataLoader<Db, HashMapCache> {
    let db = Db {
        leases,
        conn: Mutex::new(None),
        user,
    };
    DataLoader::with_cache(db, tokio::spawn, HashMapCache::default()).delay(Duration::ZERO)
}

/// The values of `keys`, through the request's DataLoader when the field is in a list, so that
/// the list's items share a statement. A field outside every list (no index on its path, as
/// under `project(fullPath)`) is resolved once per parent unless the query repeats it under
/// aliases: its keys are loaded on the spot, without the DataLoader's task and channel (two
/// task hand-offs per blueprint query), and neither looked up in nor added to its cache, which
/// lists preload with their own nodes' keys. Fields of one object that need the same row share
/// one read of their own (`types::Environment`); aliases read each on their own, as aliased
/// root fields always have.
pub async fn load<K, I>(
    ctx: &Context<'_>,
    keys: I,
) -> Result<HashMap<K, <Db as Loader<K>>::Value>, LoadError>
where
    Db: Loader<K, Error = LoadError>,
    K: Send + Sync + std::hash::Hash + Eq + Clone + 'static,
    I: IntoIterator<Item = K>,
{
    let loader = super::types::loader(ctx);
    let mut node = ctx.path_node.as_ref();
    while let Some(n) = node {
        if let QueryPathSegment::Index(_) = n.segment {
            return loader.load_many(keys).await;
        }
        node = n.parent;
    }
    let keys: Vec<K> = keys.into_iter().collect();
    loader.loader().load(&keys).await
}

/// A project by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProjectId(pub i64);

/// An environment by project id and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EnvironmentName(pub i64, pub String);

/// The last deployment of an environment in a status.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LastDeployment(pub i64, pub &'static str);

/// The `agent_deployments` row of a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AgentOfDeployment(pub i64);

/// An agent by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AgentId(pub i64);

fn by<K: std::hash::Hash + Eq, V>(rows: Vec<V>, key: impl Fn(&V) -> K) -> HashMap<K, V> {
    rows.into_iter().map(|row| (key(&row), row)).collect()
}

/// Every key gets an answer, `None` where no row was found.
fn every<K: std::hash::Hash + Eq + Clone, V>(
    keys: &[K],
    mut found: HashMap<K, V>,
) -> HashMap<K, Option<V>> {
    keys.iter().map(|k| (k.clone(), found.remove(k))).collect()
}

impl Loader<ProjectId> for Db {
    type Value = ProjectRow;
    type Error = LoadError;

    async fn load(&self, keys: &[ProjectId]) -> Result<HashMap<ProjectId, ProjectRow>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let viewer = self.viewer().await?;
        Ok(by(
            read::projects(&mut **self.conn().await?, viewer, &ids).await?,
            |p| ProjectId(p.id),
        ))
    }
}

impl Loader<EnvironmentName> for Db {
    type Value = EnvironmentRow;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[EnvironmentName],
    ) -> Result<HashMap<EnvironmentName, EnvironmentRow>, LoadError> {
        let keys: Vec<(i64, String)> = keys.iter().map(|k| (k.0, k.1.clone())).collect();
        Ok(by(
            read::environments_by_name(&mut **self.conn().await?, &keys).await?,
            |e| EnvironmentName(e.project_id, e.name.clone()),
        ))
    }
}

impl Loader<LastDeployment> for Db {
    type Value = Option<DeploymentWithAgent>;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[LastDeployment],
    ) -> Result<HashMap<LastDeployment, Option<DeploymentWithAgent>>, LoadError> {
        // One statement per status asked for (in practice, one).
        let mut by_status: HashMap<&'static str, Vec<i64>> = HashMap::new();
        for k in keys {
            by_status.entry(k.1).or_default().push(k.0);
        }
        let mut found = HashMap::new();
        let viewer = self.viewer().await?;
        for (status, environment_ids) in by_status {
            let rows =
                read::last_deployments(&mut **self.conn().await?, viewer, &environment_ids, status)
                    .await?;
            for d in rows {
                if let Some(env) = d.deployment.environment_id {
                    found.insert(LastDeployment(env, status), d);
                }
            }
        }
        Ok(every(keys, found))
    }
}

/// The last deployments of environments in a status, as loaded by the `LastDeployment` loader.
/// Their agents came in the same statement: they go to the cache of the loaders that
/// `agent { ... project { ... } }` asks, so that the blueprint query runs one statement for its
/// last deployment, agent and agent's project.
pub async fn feed_agents(
    loader: &DataLoader<Db, HashMapCache>,
    found: HashMap<LastDeployment, Option<DeploymentWithAgent>>,
) -> HashMap<LastDeployment, DeploymentRow> {
    let mut deployments = HashMap::with_capacity(found.len());
    let (mut rows, mut agents, mut projects) = (Vec::new(), Vec::new(), Vec::new());
    for (key, d) in found {
        let Some(d) = d else { continue };
        let id = d.deployment.id;
        match d.agent {
            Some((row, agent, project)) => {
                rows.push((AgentOfDeployment(id), Some(row)));
                agents.push((AgentId(agent.id), agent));
                projects.push((ProjectId(project.id), project));
            }
            None => rows.push((AgentOfDeployment(id), None)),
        }
        deployments.insert(key, d.deployment);
    }
    loader.feed_many(rows).await;
    loader.feed_many(agents).await;
    loader.feed_many(projects).await;
    deployments
}

impl Loader<AgentOfDeployment> for Db {
    type Value = Option<AgentDeploymentRow>;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[AgentOfDeployment],
    ) -> Result<HashMap<AgentOfDeployment, Option<AgentDeploymentRow>>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let found = by(
            read::agent_deployments(&mut **self.conn().await?, &ids).await?,
            |r| AgentOfDeployment(r.deployment_id),
        );
        Ok(every(keys, found))
    }
}

impl Loader<AgentId> for Db {
    type Value = AgentRow;
    type Error = LoadError;

    async fn load(&self, keys: &[AgentId]) -> Result<HashMap<AgentId, AgentRow>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        Ok(by(
            read::agents(&mut **self.conn().await?, &ids).await?,
            |a| AgentId(a.id),
        ))
    }
}

/// The number of deployments of an environment, counted up to `read::DEPLOYMENTS_COUNTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeploymentCount(pub i64);

impl Loader<DeploymentCount> for Db {
    type Value = i64;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[DeploymentCount],
    ) -> Result<HashMap<DeploymentCount, i64>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let counts = read::deployment_counts(&mut **self.conn().await?, &ids).await?;
        Ok(counts
            .into_iter()
            .map(|(id, count)| (DeploymentCount(id), count))
            .collect())
    }
}

/// Whether the viewer may read an agent (GitLab's `read_cluster_agent`, SPEC 13): every agent
/// field that shows one asks this first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AgentReadable(pub i64);

impl Loader<AgentReadable> for Db {
    type Value = bool;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[AgentReadable],
    ) -> Result<HashMap<AgentReadable, bool>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let viewer = self.viewer().await?;
        let rows = read_agents::agent_readers(&mut **self.conn().await?, viewer, &ids).await?;
        let mut found: HashMap<AgentReadable, bool> = keys.iter().map(|k| (*k, false)).collect();
        for row in rows {
            let readable = access::read_cluster_agent(viewer.admin, &row.readers());
            found.insert(AgentReadable(row.agent_id), readable);
        }
        Ok(found)
    }
}

/// A page of an agent's active tokens: `limit` of them after the token id `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AgentTokens {
    pub agent_id: i64,
    pub after: Option<i64>,
    pub limit: i64,
}

impl Loader<AgentTokens> for Db {
    type Value = Vec<TokenRow>;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[AgentTokens],
    ) -> Result<HashMap<AgentTokens, Vec<TokenRow>>, LoadError> {
        // One statement per page asked for (in practice, one).
        let mut pages: HashMap<(Option<i64>, i64), Vec<i64>> = HashMap::new();
        for k in keys {
            pages
                .entry((k.after, k.limit))
                .or_default()
                .push(k.agent_id);
        }
        let mut found: HashMap<AgentTokens, Vec<TokenRow>> =
            keys.iter().map(|k| (*k, Vec::new())).collect();
        for ((after, limit), agent_ids) in pages {
            let rows =
                read_agents::active_tokens(&mut **self.conn().await?, &agent_ids, after, limit)
                    .await?;
            for row in rows {
                let key = AgentTokens {
                    agent_id: row.agent_id,
                    after,
                    limit,
                };
                found.entry(key).or_default().push(row);
            }
        }
        Ok(found)
    }
}

/// An agent authorized for a project, with the configuration of the entry that authorizes it.
#[derive(Debug, Clone)]
pub struct AuthorizedAgent {
    pub agent: AgentRow,
    pub config: serde_json::Value,
}

/// The agents whose `ci_access` authorizes a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CiAccessAgents(pub i64);

/// The agents whose `user_access` admits the viewer for a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UserAccessAgents(pub i64);

/// Consecutive rows of one (project, agent), in the order the statement gave them.
fn per_project_and_agent<R>(
    rows: Vec<R>,
    key: impl Fn(&R) -> (i64, i64),
) -> Vec<((i64, i64), Vec<R>)> {
    let mut groups: Vec<((i64, i64), Vec<R>)> = Vec::new();
    for row in rows {
        let k = key(&row);
        match groups.last_mut() {
            Some((last, rows)) if *last == k => rows.push(row),
            _ => groups.push((k, vec![row])),
        }
    }
    groups
}

impl Loader<CiAccessAgents> for Db {
    type Value = Vec<AuthorizedAgent>;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[CiAccessAgents],
    ) -> Result<HashMap<CiAccessAgents, Vec<AuthorizedAgent>>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let rows = read_agents::ci_authorizations(&mut **self.conn().await?, &ids).await?;
        let mut found: HashMap<CiAccessAgents, Vec<AuthorizedAgent>> =
            keys.iter().map(|k| (*k, Vec::new())).collect();
        for ((project_id, _), rows) in
            per_project_and_agent(rows, |r| (r.for_project_id, r.agent.id))
        {
            let mut auth = CiAuthorizations::default();
            let agent = rows[0].agent.clone();
            for row in rows {
                match (row.kind.as_str(), row.depth) {
                    ("config", _) => auth.is_config_project = true,
                    ("project", _) => auth.project = Some(row.config),
                    (_, Some(depth)) => auth.groups.push((depth as usize, row.config)),
                    (_, None) => {}
                }
            }
            let config = match access::ci_authorization(&auth) {
                None => continue,
                Some(CiMatch::ConfigProject) => serde_json::json!({}),
                Some(CiMatch::Entry(config)) => config.clone(),
            };
            found
                .entry(CiAccessAgents(project_id))
                .or_default()
                .push(AuthorizedAgent { agent, config });
        }
        Ok(found)
    }
}

impl Loader<UserAccessAgents> for Db {
    type Value = Vec<AuthorizedAgent>;
    type Error = LoadError;

    async fn load(
        &self,
        keys: &[UserAccessAgents],
    ) -> Result<HashMap<UserAccessAgents, Vec<AuthorizedAgent>>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let viewer = self.viewer().await?;
        let rows =
            read_agents::user_authorizations(&mut **self.conn().await?, viewer, &ids).await?;
        let mut found: HashMap<UserAccessAgents, Vec<AuthorizedAgent>> =
            keys.iter().map(|k| (*k, Vec::new())).collect();
        for ((project_id, _), rows) in
            per_project_and_agent(rows, |r| (r.for_project_id, r.agent.id))
        {
            // Every entry of an agent carries the section's `access_as`.
            let access_as = AccessAs::from_config(rows[0].config.get("access_as"));
            let entries: Vec<UserAccessEntry> = rows
                .iter()
                .map(|r| UserAccessEntry {
                    kind: if r.kind == "project" {
                        SourceKind::Project
                    } else {
                        SourceKind::Group
                    },
                    id: r.source_id,
                    access_level: r.access_level,
                })
                .collect();
            let Some(admitted) = access::user_access_for_project(viewer.admin, access_as, &entries)
            else {
                continue;
            };
            let row = &rows[admitted];
            found
                .entry(UserAccessAgents(project_id))
                .or_default()
                .push(AuthorizedAgent {
                    agent: row.agent.clone(),
                    config: row.config.clone(),
                });
        }
        Ok(found)
    }
}

/// Forgets every row the loader has cached: a subscription keeps one loader for its
/// connection, and each of its messages must show the rows as they are now.
pub fn forget(loader: &DataLoader<Db, HashMapCache>) {
    loader.clear::<ProjectId>();
    loader.clear::<EnvironmentName>();
    loader.clear::<LastDeployment>();
    loader.clear::<AgentOfDeployment>();
    loader.clear::<AgentId>();
    loader.clear::<DeploymentCount>();
    loader.clear::<AgentTokens>();
    loader.clear::<AgentReadable>();
    loader.clear::<CiAccessAgents>();
    loader.clear::<UserAccessAgents>();
}
