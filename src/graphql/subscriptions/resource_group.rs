//! `resourceGroupUpdated(environmentId)`: the environment's resource group as a feed of
//! changes ([`feeds`](super::feeds)), with the user's right to see it checked again every
//! `kubernetes.access_cache`.

use std::borrow::Cow;
use std::sync::Arc;

use async_graphql::dataloader::{DataLoader, HashMapCache};
use async_graphql::futures_util::{stream, Stream};
use async_graphql::parser::types::{Field, SelectionSet};
use async_graphql::registry::Registry;
use async_graphql::resolver_utils::enum_value;
use async_graphql::{
    Context, ContextSelectionSet, OutputType, Positioned, ServerResult, SimpleObject, Value, ID,
};

use super::feeds::{FeedKey, GitOpsKey, Source, Subscriber, Update};
use super::Live;
use crate::db::read;
use crate::error::Error;
use crate::graphql::loaders::Db;
use crate::graphql::plain::{self, optional, string, Plain, PlainList};
use crate::graphql::resource_group::{
    HealthStatus, KubernetesResource, ResourceEdge, ResourceListError, FORBIDDEN_MESSAGE,
};
use crate::graphql::splice::{self, Splices};
use crate::graphql::types::{Gql, Result};
use crate::k8s::clusters::Clusters;
use crate::k8s::fetch::FetchOptions;
use crate::k8s::grants::{self, AccessType};
use crate::resources::delta::GroupDelta;
use crate::resources::group::label_selector;
use crate::resources::health::Customizations;

/// One message of `resourceGroupUpdated`.
#[derive(SimpleObject)]
pub struct ResourceGroupUpdate {
    /// The group's health now.
    health: HealthStatus,
    health_message: Option<String>,
    /// Added or changed resources (all of them when `complete`).
    upserted: PlainList<KubernetesResource>,
    /// The uids of resources gone.
    removed: Vec<ID>,
    edges_added: PlainList<ResourceEdge>,
    edges_removed: PlainList<ResourceEdge>,
    /// The group's warnings now.
    warnings: Vec<String>,
    /// The kinds that cannot be listed now.
    errors: Vec<ResourceListError>,
    /// The whole group: replace what came before.
    complete: bool,
}

impl From<&GroupDelta> for ResourceGroupUpdate {
    fn from(d: &GroupDelta) -> Self {
        ResourceGroupUpdate {
            health: d.health.status.into(),
            health_message: d.health.message.clone(),
            upserted: PlainList(d.upserted.iter().cloned().map(Into::into).collect()),
            removed: d.removed.iter().cloned().map(ID).collect(),
            edges_added: PlainList(d.edges_added.iter().map(ResourceEdge::from_uids).collect()),
            edges_removed: PlainList(
                d.edges_removed
                    .iter()
                    .map(ResourceEdge::from_uids)
                    .collect(),
            ),
            warnings: d.warnings.clone(),
            errors: d.errors.iter().cloned().map(Into::into).collect(),
            complete: d.complete,
        }
    }
}

/// A message of a feed as a subscriber's stream yields it: [`ResourceGroupUpdate`] to the
/// schema. On the socket (which splices, see `graphql::splice`) a plain selection answers the
/// text the feed's message keeps for it, rendered by the first subscriber who selects so and
/// shared by the others; any other selection, or another executor, resolves a
/// [`ResourceGroupUpdate`] as usual.
pub struct UpdateMessage(Arc<Update>);

impl OutputType for UpdateMessage {
    fn type_name() -> Cow<'static, str> {
        ResourceGroupUpdate::type_name()
    }

    fn qualified_type_name() -> String {
        ResourceGroupUpdate::qualified_type_name()
    }

    fn create_type_info(registry: &mut Registry) -> String {
        ResourceGroupUpdate::create_type_info(registry)
    }

    async fn resolve(
        &self,
        ctx: &ContextSelectionSet<'_>,
        field: &Positioned<Field>,
    ) -> ServerResult<Value> {
        let selection = &ctx.item.node;
        if let Some(splices) = ctx.data_opt::<Arc<Splices>>() {
            if plain::is_plain(selection) {
                let mut key = String::with_capacity(256);
                splice::fingerprint(selection, &mut key);
                let delta = &self.0.delta;
                let json = self
                    .0
                    .rendered
                    .get_or_render(&key, || plain::object(&Delta(delta), selection));
                return Ok(splices.placeholder(json));
            }
        }
        OutputType::resolve(&ResourceGroupUpdate::from(&self.0.delta), ctx, field).await
    }
}

/// A feed's change read as plain fields of `ResourceGroupUpdate`.
struct Delta<'a>(&'a GroupDelta);

impl Plain for Delta<'_> {
    fn field(&self, name: &str, selection: &SelectionSet) -> Value {
        let d = self.0;
        let strings = |items: &[String]| Value::List(items.iter().map(|s| string(s)).collect());
        match name {
            "health" => enum_value(HealthStatus::from(d.health.status)),
            "healthMessage" => optional(d.health.message.as_ref(), |m| string(m)),
            "upserted" => plain::list(&d.upserted, selection),
            "removed" => strings(&d.removed),
            "edgesAdded" => plain::list(&d.edges_added, selection),
            "edgesRemoved" => plain::list(&d.edges_removed, selection),
            "warnings" => strings(&d.warnings),
            "errors" => plain::list(&d.errors, selection),
            "complete" => Value::Boolean(d.complete),
            _ => Value::Null,
        }
    }
}

/// The environment id of a global id `gid://gitlab/Environment/<n>`.
pub(super) fn environment_id(id: &ID) -> Result<i64> {
    id.strip_prefix("gid://gitlab/Environment/")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            Error::Invalid {
                field: "environmentId".into(),
                message: "must be a global ID like gid://gitlab/Environment/9".into(),
            }
            .to_graphql()
        })
}

type Loader = Arc<DataLoader<Db, HashMapCache>>;

/// Where a subscriber's group comes from now.
pub(super) struct Target {
    pub key: FeedKey,
    pub source: Source,
}

/// What a subscription keeps between messages.
struct Running {
    db: Loader,
    clusters: Arc<Clusters>,
    health: Arc<Customizations>,
    live: Live,
    environment: i64,
    key: FeedKey,
    subscriber: Subscriber,
    recheck: tokio::time::Interval,
    /// Rechecks in a row that could not decide ([`crate::auth::recheck`]).
    undecided: crate::auth::recheck::Undecided,
    /// The subscriber's way to the owner of the connection (SPEC 16).
    through: Option<crate::replicas::forward::AsViewer>,
    done: bool,
}

pub(super) async fn subscribe(
    ctx: &Context<'_>,
    environment: &ID,
) -> Result<impl Stream<Item = Result<UpdateMessage>>> {
    let environment = environment_id(environment)?;
    let db: Loader = ctx.data::<Loader>()?.clone();
    let clusters: Arc<Clusters> = ctx.data::<Arc<Clusters>>()?.clone();
    let health: Arc<Customizations> = ctx.data::<Arc<Customizations>>()?.clone();
    let live: Live = ctx.data::<Live>()?.clone();
    let target = target(&db, &clusters, &health, environment).await;
    db.loader().release().await;
    let through = super::routed::as_viewer(ctx);
    let Target { key, mut source } = target?;
    source.through = through.clone();
    let subscriber = live.feeds.subscribe(key.clone(), || source);
    let every = clusters
        .grants
        .ttl()
        .max(std::time::Duration::from_millis(100));
    let recheck = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let running = Running {
        db,
        clusters,
        health,
        live,
        environment,
        key,
        subscriber,
        recheck,
        undecided: Default::default(),
        through,
        done: false,
    };
    Ok(stream::unfold(running, |mut s| async move {
        let item = s.next().await?;
        Some((item, s))
    }))
}

impl Running {
    async fn next(&mut self) -> Option<Result<UpdateMessage>> {
        if self.done {
            return None;
        }
        loop {
            tokio::select! {
                message = self.subscriber.next() => {
                    return match message {
                        Some(Ok(update)) => Some(Ok(UpdateMessage(update))),
                        Some(Err(message)) => {
                            self.done = true;
                            Some(Err(Error::BadGateway(message.to_string()).to_graphql()))
                        }
                        None => None,
                    };
                }
                _ = self.recheck.tick() => {
                    let target = target(&self.db, &self.clusters, &self.health, self.environment).await;
                    self.db.loader().release().await;
                    if target.is_ok() {
                        self.undecided.decided();
                    }
                    match target {
                        Ok(target) if target.key == self.key => {}
                        Ok(Target { key, mut source }) => {
                            source.through = self.through.clone();
                            // Another deployment, namespace or identity: the new group, whole.
                            self.subscriber = self.live.feeds.subscribe(key.clone(), || source);
                            self.key = key;
                        }
                        Err(e) if is_refusal(&e) => {
                            // Whether the agent refuses or the project went out of reach, the
                            // subscriber hears the same: its access is gone.
                            self.done = true;
                            return Some(Err(Error::Forbidden(FORBIDDEN_MESSAGE.to_owned()).to_graphql()));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e.message, "resource group subscription: cannot check access; trying again later");
                            if self.undecided.failed() {
                                // Access fails closed: the last decision stands no longer.
                                self.done = true;
                                return Some(Err(e));
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A refusal ends the subscription; a database away ends it only after a few rechecks
/// ([`crate::auth::recheck`]).
fn is_refusal(e: &async_graphql::Error) -> bool {
    let code = e.extensions.as_ref().and_then(|x| x.get("code"));
    matches!(code, Some(async_graphql::Value::String(c)) if c == "FORBIDDEN" || c == "NOT_FOUND")
}

/// The environment's group as the user may see it now: readable environment, its agent (the
/// last successful deployment's, else GitLab's `cluster_agent`), `user_access` to that agent (not from the cache: this is the
/// check that ends a subscription), the agent's cluster and the impersonation.
pub(super) async fn target(
    db: &Loader,
    clusters: &Arc<Clusters>,
    health: &Arc<Customizations>,
    environment: i64,
) -> Result<Target> {
    let not_found = || {
        Error::NotFound(format!(
            "environment {environment} is not there, or has no agent (no successful deployment through one, none named by GitLab)"
        ))
        .to_graphql()
    };
    let user = db.loader().user().await.gql()?.clone();
    let viewer = db.loader().viewer().await.gql()?;
    let env = {
        let mut conn = db.loader().conn().await.gql()?;
        crate::db::live::readable_environment(&mut **conn, viewer, environment)
            .await
            .gql()?
    }
    .ok_or_else(not_found)?;
    // Its agent: that of its last successful deployment, else the one GitLab's environments
    // API names for it (SPEC 15), as a view finds it.
    let found = {
        let mut conn = db.loader().conn().await.gql()?;
        let last = read::last_deployments(&mut **conn, viewer, &[environment], "success")
            .await
            .gql()?;
        match last.into_iter().next().and_then(|d| d.agent) {
            Some(found) => Some(found),
            None => crate::db::pull::environment_agent(&mut conn, viewer, environment)
                .await
                .gql()?,
        }
    };
    let Some((row, agent, project)) = found else {
        return Err(not_found());
    };
    let grant = {
        let mut conn = db.loader().conn().await.gql()?;
        grants::authorize(&mut **conn, agent.id, user.id)
            .await
            .gql()?
    };
    let Some(grant) = grant else {
        return Err(Error::Forbidden(FORBIDDEN_MESSAGE.to_owned()).to_graphql());
    };
    // A GitOps environment's group: its sources, and its labels source where a view applies
    // it (SPEC 15).
    let gitops = {
        let mut conn = db.loader().conn().await.gql()?;
        let sources = crate::graphql::gitops::bound_sources(&mut **conn, environment, &row)
            .await
            .gql()?;
        let labels_namespaces = match row.kubernetes_namespace.as_str() {
            _ if sources.is_empty() => Vec::new(),
            "" => Vec::new(),
            first => {
                let added = crate::db::environment_settings::namespaces(&mut **conn, environment)
                    .await
                    .gql()?;
                crate::resources::namespaces::spanned(first, &added)
            }
        };
        (!sources.is_empty()).then_some(GitOpsKey {
            sources,
            labels_namespaces,
        })
    };
    db.loader().release().await;
    let cluster = clusters
        .for_agent(agent.id, &project.full_path, &agent.name)
        .await
        .map_err(|none| Error::from(none).to_graphql())?;
    let headers = grant.impersonation(AccessType::from(user.via));
    let selector = label_selector(env.project_id, &env.slug);
    let key = match gitops {
        None => FeedKey::new(agent.id, &row.kubernetes_namespace, &selector, &headers),
        Some(gitops) => FeedKey::gitops(agent.id, &selector, &headers, gitops),
    };
    let source = Source {
        cluster,
        headers,
        options: FetchOptions {
            request_timeout: clusters.response_timeout,
            agent: Some(agent.id),
            ..FetchOptions::default()
        },
        health: health.clone(),
        through: None,
        recheck: clusters.grants.ttl(),
    };
    Ok(Target { key, source })
}
