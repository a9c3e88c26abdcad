//! `Environment.resourceGroup` (SPEC 5.2): the live resources of the namespace that the last
//! successful deployment went to, listed as the user (impersonated when the agent's
//! `user_access` says `access_as: {user: {}}`), with their health and dependency graph.

use std::sync::Arc;

use std::borrow::Cow;

use async_graphql::parser::types::{Field, SelectionSet};
use async_graphql::registry::Registry;
use async_graphql::resolver_utils::enum_value;
use async_graphql::{
    ComplexObject, Context, ContextSelectionSet, Enum, Json, OutputType, Positioned, ScalarType,
    ServerResult, SimpleObject, Value, ID,
};

use super::away::AwayViews;
use super::causes::{self, Causes, LogView, ResourceCause};
use super::gitops::{FluxSyncStatus, ResourceGroupSource};
use super::plain::{self, optional, string, Plain};
use super::splice::{self, Rendered, Splices};
use super::subscriptions::feeds::{FeedKey, Source};
use super::subscriptions::health_record::Recorder;
use super::through_owner::{through_owner, warned, Through};
use super::types::{conn, project, DeploymentAgent, Gql, Result, Time};
use crate::db::environment_settings;
use crate::db::read::{AgentRow, EnvironmentRow};
use crate::error::Error;
use crate::k8s::clusters::{Cluster, Clusters};
use crate::k8s::fetch::FetchOptions;
use crate::k8s::gitops;
use crate::k8s::grants::{AccessType, Grant};
use crate::resources::graph::{Edge, EdgeType};
use crate::resources::group::{self, label_selector};
use crate::resources::health::{self, Customizations, Health};
use crate::resources::listing::{ListError, ResourceEvent};
use crate::resources::namespaces;
use crate::resources::object::Object;
use crate::telemetry::RequestId;
use axum::http::HeaderMap;

/// What a user without `user_access` to the agent reads (GitLab's wording).
pub const FORBIDDEN_MESSAGE: &str = "You don't have access to an agent that deployed to this \
     environment. Please contact agent administrator if you are allowed in \"user_access\" in \
     agent config file.";

/// A resource group is a round of requests to a cluster, so it counts like a page of 25 rows:
/// the complexity limit lets a query ask for a handful, never a whole dashboard's worth.
pub const COST: usize = 500;

/// Checks the user's `user_access` to `agent`, then lists and assembles the group of
/// `environment` in `namespace`.
///
/// The request's database connection is given back before the cluster is asked, so
/// that slow clusters hold no connection. Assembly (health and edges, linear but CPU-bound on a
/// large group) runs on the blocking pool, away from the request threads.
pub async fn load(
    ctx: &Context<'_>,
    environment: &EnvironmentRow,
    agent: AgentRow,
    namespace: String,
) -> Result<ResourceGroup> {
    let assembled = assemble(ctx, environment, &agent, &namespace).await?;
    // A crash's previous log is read as the listing is: the same identity (SPEC 17).
    let logs = assembled.cluster.map(|cluster| {
        let clusters: &Arc<Clusters> = ctx.data_unchecked();
        Arc::new(LogView::new(
            cluster.client.clone(),
            agent.id,
            assembled.headers,
            namespace.clone(),
            clusters.response_timeout,
            causes::cache(ctx),
        ))
    });
    Ok(ResourceGroup::new(
        DeploymentAgent { agent, namespace },
        assembled.group,
        logs,
    ))
}

/// What [`assemble`] read.
pub(super) struct Assembled {
    pub group: Arc<group::ResourceGroup>,
    /// The cluster it came from: `None` for an agent without a cluster connection.
    pub cluster: Option<Cluster>,
    /// The viewer's headers of its requests (impersonation, the request's ids).
    pub headers: HeaderMap,
}

/// What [`load`] shows, as the assembled group, with the cluster it came from and the
/// viewer's headers. Whatever shows the group's resources, or what is about them (the
/// timeline's Events, a crash's previous log), reads them here, with the same checks.
pub(super) async fn assemble(
    ctx: &Context<'_>,
    environment: &EnvironmentRow,
    agent: &AgentRow,
    namespace: &str,
) -> Result<Assembled> {
    // The labels source applies in the namespaces Maintainers added too (SPEC 15); read
    // before `connect` gives the request's database connection back.
    let added = environment_settings::namespaces(&mut **conn(ctx).await?, environment.id)
        .await
        .gql()?;
    let selector = label_selector(environment.project_id, &environment.slug);
    let (cluster, headers, options) = match connect(ctx, environment, agent).await? {
        Ok(connected) => connected,
        Err(none) => return Ok(unreadable(namespace, &selector, none)),
    };
    // From the watch cache (SPEC 8.1): the same answer as a fresh list, from memory, and
    // the same group as the last view's while nothing changed (assembled off the runtime's
    // threads when something did).
    let custom: &Arc<Customizations> = ctx.data_unchecked();
    let spanned = namespaces::spanned(namespace, &added);
    let groups = spanned.iter().map(|namespace| {
        cluster.watch.resource_group(
            &cluster.discovery,
            &headers,
            namespace,
            &selector,
            &options,
            custom,
        )
    });
    // A connection another replica owns is read through it (SPEC 16).
    let assembled = match through_owner(ctx, &cluster, agent.id, &spanned, &selector).await {
        Through::Owner(group) => group?,
        Through::Here { warning } => {
            let assembled = async_graphql::futures_util::future::try_join_all(groups)
                .await
                .map(namespaces::merge);
            match assembled {
                Ok(assembled) => warned(assembled, warning),
                Err(e) => return unreachable_or(e, namespace, &selector),
            }
        }
    };
    let assembled = while_away(ctx, &cluster, assembled);
    // The group is in use: its health changes are recorded while it is (SPEC 17).
    if let Some(recorder) = ctx.data_opt::<Recorder>() {
        let clusters: &Arc<Clusters> = ctx.data_unchecked();
        let key = FeedKey::new(agent.id, namespace, &selector, &HeaderMap::new());
        recorder.touch(environment.id, key, || {
            Arc::new(Source {
                cluster: cluster.clone(),
                headers: HeaderMap::new(),
                options: FetchOptions {
                    request_timeout: clusters.response_timeout,
                    agent: Some(agent.id),
                    ..FetchOptions::default()
                },
                health: custom.clone(),
                through: None,
                recheck: clusters.grants.ttl(),
            })
        });
    }
    Ok(Assembled {
        group: assembled,
        cluster: Some(cluster),
        headers,
    })
}

/// The viewer's way to `agent`'s cluster, after their `user_access` is checked: the cluster,
/// the headers of their requests (impersonation, the request's ids) and the options; or why
/// the agent has no cluster connection. The request's database connection is given back first.
pub(super) async fn connect(
    ctx: &Context<'_>,
    environment: &EnvironmentRow,
    agent: &AgentRow,
) -> Result<std::result::Result<(Cluster, HeaderMap, FetchOptions), String>> {
    crate::telemetry::record_agent(agent.id, Some(&environment.name));
    let (user, grant) = authorize(ctx, agent.id).await?;
    let clusters: &Arc<Clusters> = ctx.data_unchecked();
    let agent_project = project(ctx, agent.project_id).await?;
    super::types::loader(ctx).loader().release().await;
    let cluster = match clusters
        .for_agent(agent.id, &agent_project.0.full_path, &agent.name)
        .await
    {
        Ok(cluster) => cluster,
        Err(none) => return Ok(Err(none.to_string())),
    };
    let options = FetchOptions {
        request_timeout: clusters.response_timeout,
        agent: Some(agent.id),
        ..FetchOptions::default()
    };
    let mut headers = grant.impersonation(AccessType::from(user.via));
    if let Some(id) = ctx.data_opt::<RequestId>() {
        id.outgoing_headers(&mut headers);
    }
    Ok(Ok((cluster, headers, options)))
}

/// The group of an agent without a cluster connection (SPEC 6): one entry of code 503.
fn unreadable(namespace: &str, selector: &str, why: String) -> Assembled {
    Assembled {
        group: Arc::new(group::ResourceGroup::unreadable(
            namespace, selector, 503, why,
        )),
        cluster: None,
        headers: HeaderMap::new(),
    }
}

/// A listing that failed: the connection answered 503 before any kind could be listed (an
/// agent not connected to GitLab's agent server, a token it refused): one entry of code 503,
/// as for an agent without a connection (SPEC 6, 14); anything else is a 502.
fn unreachable_or(
    e: crate::k8s::fetch::FetchError,
    namespace: &str,
    selector: &str,
) -> Result<Assembled> {
    match e {
        crate::k8s::fetch::FetchError::Discovery(e) if e.code == Some(503) => {
            Ok(unreadable(namespace, selector, e.message))
        }
        e => Err(Error::BadGateway(e.to_string()).to_graphql()),
    }
}

/// While the agent's circuit is open, the group as last seen, with a warning: one view of the
/// group per opening, so rendered once (`away`).
fn while_away(
    ctx: &Context<'_>,
    cluster: &Cluster,
    assembled: Arc<group::ResourceGroup>,
) -> Arc<group::ResourceGroup> {
    match cluster.condition.circuit().open() {
        Some(open) => match ctx.data_opt::<Arc<AwayViews>>() {
            Some(away) => away.of(&assembled, &open),
            None => Arc::new(assembled.while_away(open.since, &open.said())),
        },
        None => assembled,
    }
}

/// The group of an environment bound to GitOps sources (SPEC 15): the sources' objects across
/// the namespaces they name, what those own, and the labels source in `labels_namespace` when
/// the environment has one. Read through the watch cache as the viewer, with the same checks as
/// [`load`].
pub async fn load_gitops(
    ctx: &Context<'_>,
    environment: &EnvironmentRow,
    agent: AgentRow,
    labels_namespace: Option<String>,
    sources: Vec<crate::gitops::ObjRef>,
) -> Result<ResourceGroup> {
    let selector = label_selector(environment.project_id, &environment.slug);
    let first = labels_namespace
        .clone()
        .or_else(|| sources.iter().find_map(|s| s.namespace.clone()))
        .unwrap_or_default();
    let deployed = DeploymentAgent {
        agent: agent.clone(),
        namespace: first.clone(),
    };
    // The labels source applies in the namespaces Maintainers added too (SPEC 15); the
    // namespaces its sources spanned when last read come in the same statement, a hint of what
    // to list first (`gitops::resource_group`).
    let (added, spanned_before) =
        environment_settings::gitops_namespaces(&mut **conn(ctx).await?, environment.id)
            .await
            .gql()?;
    let (cluster, headers, options) = match connect(ctx, environment, &agent).await? {
        Ok(connected) => connected,
        Err(none) => {
            let assembled = unreadable(&first, &selector, none);
            return Ok(ResourceGroup::new(deployed, assembled.group, None));
        }
    };
    let custom: &Arc<Customizations> = ctx.data_unchecked();
    let reader = gitops::Reader {
        watch: &cluster.watch,
        memo: &cluster.gitops,
        client: &cluster.client,
        discovery: &cluster.discovery,
        headers: &headers,
        options: &options,
    };
    let labels = labels_namespace.map(|namespace| gitops::LabelsSource {
        namespaces: namespaces::spanned(&namespace, &added),
        selector: selector.clone(),
    });
    let grouped =
        gitops::resource_group(&reader, &sources, labels.as_ref(), &spanned_before, custom).await;
    let grouped = match grouped {
        Ok(grouped) => grouped,
        Err(e) => {
            let assembled = unreachable_or(e, &first, &selector)?;
            return Ok(ResourceGroup::new(deployed, assembled.group, None));
        }
    };
    if grouped.spanned != spanned_before {
        // Kept for the next first view, a restart's included; the group is shown without it.
        let kept = environment_settings::set_spanned_namespaces(
            &mut **conn(ctx).await?,
            environment.id,
            &grouped.spanned,
        )
        .await;
        if let Err(e) = kept {
            tracing::warn!(environment_id = environment.id, error = %e,
                "the namespaces of a GitOps group could not be kept");
        }
    }
    let group = while_away(ctx, &cluster, grouped.group);
    let mut shown = ResourceGroup::new(
        DeploymentAgent {
            agent,
            namespace: group.namespace.clone(),
        },
        group,
        None,
    );
    shown.namespaces = grouped.namespaces;
    shown.sources = grouped.sources.into_iter().map(Into::into).collect();
    Ok(shown)
}

/// The user and their `user_access` grant on the agent; the FORBIDDEN error of SPEC 5.2
/// without one. Whatever shows an agent's resources (the live group, the deployment history)
/// checks here.
pub(super) async fn authorize<'a>(
    ctx: &Context<'a>,
    agent_id: i64,
) -> Result<(&'a crate::auth::CurrentUser, Arc<Grant>)> {
    let user = super::types::loader(ctx).loader().user().await.gql()?;
    let clusters: &Arc<Clusters> = ctx.data_unchecked();
    let grant = clusters
        .grants
        .authorize(&mut **conn(ctx).await?, agent_id, user.id)
        .await
        .gql()?;
    match grant {
        Some(grant) => Ok((user, grant)),
        None => Err(Error::Forbidden(FORBIDDEN_MESSAGE.to_owned()).to_graphql()),
    }
}

#[derive(SimpleObject)]
pub struct ResourceGroup {
    /// The agent and namespace of the last successful deployment.
    agent: DeploymentAgent,
    /// The first of `namespaces`.
    namespace: String,
    /// Every namespace the group spans: the deployment's, and those its GitOps sources name.
    namespaces: Vec<String>,
    /// The GitOps sources the group is the union of, beside the labels (none for a group of
    /// labels only).
    sources: Vec<ResourceGroupSource>,
    /// The selector the resources were listed with: the two labels GitLab preserves; empty
    /// when the group has no labels source.
    label_selector: String,
    /// The worst health among the resources; HEALTHY when none has a health.
    health: HealthStatus,
    /// Names up to three resources that cause `health`.
    health_message: Option<String>,
    /// Ordered by apiVersion, kind, namespace and name.
    resources: Resources,
    /// Parent to child.
    edges: Edges,
    /// Why the group is not healthy: the cause of each root (a resource no edge leads to)
    /// that is not healthy, in resource order; none for a healthy group.
    causes: Causes,
    warnings: Vec<String>,
    /// Kinds that could not be listed; the rest is still shown.
    errors: Vec<ResourceListError>,
}

impl ResourceGroup {
    fn new(
        agent: DeploymentAgent,
        group: Arc<group::ResourceGroup>,
        logs: Option<Arc<LogView>>,
    ) -> Self {
        ResourceGroup {
            agent,
            namespace: group.namespace.clone(),
            namespaces: vec![group.namespace.clone()],
            sources: Vec::new(),
            label_selector: group.label_selector.clone(),
            health: group.health.status.into(),
            health_message: group.health.message.clone(),
            warnings: group.warnings.clone(),
            errors: group.errors.iter().cloned().map(Into::into).collect(),
            resources: Resources(group.clone(), logs.clone()),
            causes: Causes {
                group: group.clone(),
                logs,
            },
            edges: Edges(group),
        }
    }
}

/// `resources` of a group shared with the watch cache (and with other viewers): a plain
/// selection ([`plain`]) is written straight from the shared resources; any other goes through
/// async-graphql, from copies made for this answer.
/// A `cause` among the fields sends the selection through async-graphql too.
pub struct Resources(Arc<group::ResourceGroup>, Option<Arc<LogView>>);

impl ResourceGroup {
    /// The assembled group, for what acts on its resources (the Flux actions' targets).
    pub(super) fn assembled(&self) -> &group::ResourceGroup {
        &self.resources.0
    }
}

impl OutputType for Resources {
    fn type_name() -> Cow<'static, str> {
        Vec::<KubernetesResource>::type_name()
    }

    fn qualified_type_name() -> String {
        Vec::<KubernetesResource>::qualified_type_name()
    }

    fn create_type_info(registry: &mut Registry) -> String {
        Vec::<KubernetesResource>::create_type_info(registry)
    }

    async fn resolve(
        &self,
        ctx: &ContextSelectionSet<'_>,
        field: &Positioned<Field>,
    ) -> ServerResult<Value> {
        let selection = &ctx.item.node;
        let with_causes = causes::selects(selection, "cause");
        if plain::is_plain(selection) && !with_causes {
            let render = || plain::list(&self.0.resources, selection);
            return Ok(spliced(ctx, &self.0, "resources", selection, render).unwrap_or_else(render));
        }
        let mut resources: Vec<KubernetesResource> =
            self.0.resources.iter().cloned().map(Into::into).collect();
        if with_causes {
            for (resource, cause) in resources
                .iter_mut()
                .zip(causes::of_each(&self.0, self.1.as_ref()))
            {
                resource.cause = cause;
            }
        }
        OutputType::resolve(&resources, ctx, field).await
    }
}

/// The placeholder of `field`'s text for a plain `selection` of the shared `group`, rendered
/// once per group and selection (`splice`): only when whoever executes the request splices
/// answers (the HTTP handler puts [`Splices`] in the request's data). The group is the watch
/// cache's, memoised per access decisions, so whoever is handed the same `Arc` may read all of
/// it; the text is the group's alone (no field of it depends on who asks).
fn spliced(
    ctx: &ContextSelectionSet<'_>,
    group: &Arc<group::ResourceGroup>,
    field: &str,
    selection: &SelectionSet,
    render: impl FnOnce() -> Value,
) -> Option<Value> {
    let splices = ctx.data_opt::<Arc<Splices>>()?;
    let rendered = ctx.data_opt::<Arc<Rendered<group::ResourceGroup>>>()?;
    let mut key = String::with_capacity(256);
    key.push_str(field);
    splice::fingerprint(selection, &mut key);
    let json = rendered.of(group).get_or_render(&key, render);
    Some(splices.placeholder(json))
}

/// `edges` of a shared group, as [`Resources`].
pub struct Edges(Arc<group::ResourceGroup>);

impl Edges {
    fn edge(&self, e: &Edge) -> ResourceEdge {
        ResourceEdge {
            from: ID(self.0.resources[e.from as usize].uid.clone()),
            to: ID(self.0.resources[e.to as usize].uid.clone()),
            kind: e.kind.into(),
        }
    }
}

impl OutputType for Edges {
    fn type_name() -> Cow<'static, str> {
        Vec::<ResourceEdge>::type_name()
    }

    fn qualified_type_name() -> String {
        Vec::<ResourceEdge>::qualified_type_name()
    }

    fn create_type_info(registry: &mut Registry) -> String {
        Vec::<ResourceEdge>::create_type_info(registry)
    }

    async fn resolve(
        &self,
        ctx: &ContextSelectionSet<'_>,
        field: &Positioned<Field>,
    ) -> ServerResult<Value> {
        let selection = &ctx.item.node;
        if plain::is_plain(selection) {
            let resources = &self.0.resources;
            let render = || {
                Value::List(
                    self.0
                        .edges
                        .iter()
                        .map(|e| {
                            plain::object(
                                &EdgeOf {
                                    from: &resources[e.from as usize].uid,
                                    to: &resources[e.to as usize].uid,
                                    kind: e.kind,
                                },
                                selection,
                            )
                        })
                        .collect(),
                )
            };
            return Ok(spliced(ctx, &self.0, "edges", selection, render).unwrap_or_else(render));
        }
        let edges: Vec<ResourceEdge> = self.0.edges.iter().map(|e| self.edge(e)).collect();
        OutputType::resolve(&edges, ctx, field).await
    }
}

/// An edge of a shared group, named by the uids of its ends.
struct EdgeOf<'a> {
    from: &'a str,
    to: &'a str,
    kind: EdgeType,
}

impl Plain for EdgeOf<'_> {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "from" => string(self.from),
            "to" => string(self.to),
            "type" => enum_value(ResourceEdgeType::from(self.kind)),
            _ => Value::Null,
        }
    }
}

impl Plain for crate::resources::delta::UidEdge {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "from" => string(&self.from),
            "to" => string(&self.to),
            "type" => enum_value(ResourceEdgeType::from(self.kind)),
            _ => Value::Null,
        }
    }
}

impl Plain for ListError {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "apiVersion" => string(&self.api_version),
            "kind" => string(&self.kind),
            "code" => optional(self.code.as_ref(), |c| Value::from(i32::from(*c))),
            "message" => string(&self.message),
            _ => Value::Null,
        }
    }
}

/// Argo CD's health statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum HealthStatus {
    Healthy,
    Progressing,
    Degraded,
    Suspended,
    Missing,
    Unknown,
}

impl HealthStatus {
    const ALL: [HealthStatus; 6] = [
        HealthStatus::Healthy,
        HealthStatus::Progressing,
        HealthStatus::Degraded,
        HealthStatus::Suspended,
        HealthStatus::Missing,
        HealthStatus::Unknown,
    ];

    /// As GraphQL spells it, and as `environment_health` keeps it.
    pub fn name(self) -> &'static str {
        match self {
            HealthStatus::Healthy => "HEALTHY",
            HealthStatus::Progressing => "PROGRESSING",
            HealthStatus::Degraded => "DEGRADED",
            HealthStatus::Suspended => "SUSPENDED",
            HealthStatus::Missing => "MISSING",
            HealthStatus::Unknown => "UNKNOWN",
        }
    }

    /// The status [`HealthStatus::name`] spells.
    pub fn parse(name: &str) -> Option<HealthStatus> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// SPEC 5.2's order: HEALTHY (0) < SUSPENDED < PROGRESSING < MISSING < DEGRADED < UNKNOWN (5).
    pub fn severity(self) -> u8 {
        let status = match self {
            HealthStatus::Healthy => health::HealthStatus::Healthy,
            HealthStatus::Progressing => health::HealthStatus::Progressing,
            HealthStatus::Degraded => health::HealthStatus::Degraded,
            HealthStatus::Suspended => health::HealthStatus::Suspended,
            HealthStatus::Missing => health::HealthStatus::Missing,
            HealthStatus::Unknown => health::HealthStatus::Unknown,
        };
        status.severity()
    }
}

impl From<health::HealthStatus> for HealthStatus {
    fn from(status: health::HealthStatus) -> Self {
        match status {
            health::HealthStatus::Healthy => HealthStatus::Healthy,
            health::HealthStatus::Progressing => HealthStatus::Progressing,
            health::HealthStatus::Degraded => HealthStatus::Degraded,
            health::HealthStatus::Suspended => HealthStatus::Suspended,
            health::HealthStatus::Missing => HealthStatus::Missing,
            health::HealthStatus::Unknown => HealthStatus::Unknown,
        }
    }
}

#[derive(SimpleObject)]
#[graphql(complex)]
pub struct KubernetesResource {
    uid: ID,
    api_version: String,
    kind: String,
    /// Null for a cluster-scoped resource.
    namespace: Option<String>,
    name: String,
    /// `metadata.labels`, an object.
    labels: Json<serde_json::Value>,
    created_at: Option<Time>,
    /// Null when no health rule applies to the kind (which is not UNKNOWN).
    health: Option<ResourceHealth>,
    /// The resource's recent Events, most recent first.
    events: Vec<KubernetesEvent>,
    /// Why it is not healthy, from it down (SPEC 17); null when nothing at it or below it
    /// explains anything, and in a deployment's history.
    cause: Option<ResourceCause>,
    /// GitLab's sync status of a Flux object (SPEC 15); null for anything else.
    flux_sync_status: Option<FluxSyncStatus>,
    #[graphql(skip)]
    object: Arc<Object>,
}

#[ComplexObject]
impl KubernetesResource {
    /// The object as the cluster answered it, without `metadata.managedFields`.
    async fn manifest(&self) -> Json<serde_json::Value> {
        Json(self.object.manifest())
    }
}

impl From<group::Resource> for KubernetesResource {
    fn from(r: group::Resource) -> Self {
        KubernetesResource {
            uid: ID(r.uid),
            api_version: r.api_version,
            kind: r.kind,
            namespace: r.namespace,
            name: r.name,
            labels: Json(r.labels),
            created_at: r.created_at.map(Time),
            health: r.health.map(Into::into),
            events: r.events.into_iter().map(Into::into).collect(),
            cause: None,
            flux_sync_status: crate::gitops::sync::of(&r.object.view).map(Into::into),
            object: r.object,
        }
    }
}

impl KubernetesResource {
    /// A resource as a deployment's snapshot keeps it (SPEC 10): its stored manifest (the
    /// canonical JSON text; `None` when the query asks for neither `manifest` nor `labels`),
    /// its health then, no events.
    pub(super) fn from_snapshot(
        entry: &crate::history::snapshot::Entry,
        manifest: Option<&str>,
    ) -> Self {
        let text: Box<str> = manifest.unwrap_or("{}").into();
        let object =
            Object::parse_text(text, &entry.api_version, &entry.kind).unwrap_or_else(|_| {
                // A stored manifest is the text of a JSON object, which parses; an empty one does.
                Object::parse_text("{}".into(), &entry.api_version, &entry.kind)
                    .expect("an empty object parses")
            });
        let labels = object
            .view
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .filter(|l| l.is_object())
            .map_or_else(|| serde_json::json!({}), serde_json::Value::from);
        KubernetesResource {
            uid: ID(entry.uid.clone()),
            api_version: entry.api_version.clone(),
            kind: entry.kind.clone(),
            namespace: entry.namespace.clone(),
            name: entry.name.clone(),
            labels: Json(labels),
            created_at: entry.created_at.map(Time),
            health: entry.health.map(|status| ResourceHealth {
                status: status.into(),
                message: entry.health_message.clone(),
            }),
            events: Vec::new(),
            cause: None,
            flux_sync_status: crate::gitops::sync::of(&object.view).map(Into::into),
            object: Arc::new(object),
        }
    }
}

#[derive(SimpleObject)]
pub struct ResourceHealth {
    status: HealthStatus,
    message: Option<String>,
}

impl From<Health> for ResourceHealth {
    fn from(h: Health) -> Self {
        ResourceHealth {
            status: h.status.into(),
            message: h.message,
        }
    }
}

/// Why a parent links to a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum ResourceEdgeType {
    /// The child's `ownerReferences` name the parent.
    Owner,
    /// An EndpointSlice's `kubernetes.io/service-name` label names the Service.
    EndpointSlice,
    /// Endpoints named as their Service.
    Endpoints,
    /// The Service's selector matches the workload's pod template (or the Pod).
    ServiceSelector,
    /// An Ingress backend names the Service.
    IngressBackend,
    /// A Pod's volume uses the claim.
    VolumeClaim,
    /// An autoscaler's scale target.
    ScaleTarget,
    /// A GitOps source (Flux Kustomization or HelmRelease, Argo CD Application) applied it.
    Applies,
}

impl From<EdgeType> for ResourceEdgeType {
    fn from(kind: EdgeType) -> Self {
        match kind {
            EdgeType::Owner => ResourceEdgeType::Owner,
            EdgeType::EndpointSlice => ResourceEdgeType::EndpointSlice,
            EdgeType::Endpoints => ResourceEdgeType::Endpoints,
            EdgeType::ServiceSelector => ResourceEdgeType::ServiceSelector,
            EdgeType::IngressBackend => ResourceEdgeType::IngressBackend,
            EdgeType::VolumeClaim => ResourceEdgeType::VolumeClaim,
            EdgeType::ScaleTarget => ResourceEdgeType::ScaleTarget,
            EdgeType::Applies => ResourceEdgeType::Applies,
        }
    }
}

/// From parent to child, by uid.
#[derive(SimpleObject)]
pub struct ResourceEdge {
    from: ID,
    to: ID,
    #[graphql(name = "type")]
    kind: ResourceEdgeType,
}

impl ResourceEdge {
    pub(super) fn from_uids(e: &crate::resources::delta::UidEdge) -> Self {
        ResourceEdge {
            from: ID(e.from.clone()),
            to: ID(e.to.clone()),
            kind: e.kind.into(),
        }
    }
}

impl Plain for KubernetesResource {
    fn field(&self, name: &str, selection: &SelectionSet) -> Value {
        match name {
            "uid" => string(&self.uid),
            "apiVersion" => string(&self.api_version),
            "kind" => string(&self.kind),
            "namespace" => optional(self.namespace.as_ref(), |ns| string(ns)),
            "name" => string(&self.name),
            "labels" => json(&self.labels.0),
            "createdAt" => optional(self.created_at.as_ref(), Time::to_value),
            "health" => optional(self.health.as_ref(), |h| plain::object(h, selection)),
            "manifest" => json(&self.object.manifest()),
            "events" => plain::list(&self.events, selection),
            "fluxSyncStatus" => optional(self.flux_sync_status.as_ref(), |s| enum_value(*s)),
            _ => Value::Null,
        }
    }
}

impl Plain for group::Resource {
    fn field(&self, name: &str, selection: &SelectionSet) -> Value {
        match name {
            "uid" => string(&self.uid),
            "apiVersion" => string(&self.api_version),
            "kind" => string(&self.kind),
            "namespace" => optional(self.namespace.as_ref(), |ns| string(ns)),
            "name" => string(&self.name),
            "labels" => json(&self.labels),
            "createdAt" => optional(self.created_at.as_ref(), |t| Time(*t).to_value()),
            "health" => optional(self.health.as_ref(), |h| plain::object(h, selection)),
            "manifest" => json(&self.object.manifest()),
            "events" => plain::list(&self.events, selection),
            "fluxSyncStatus" => {
                optional(crate::gitops::sync::of(&self.object.view).as_ref(), |s| {
                    enum_value(FluxSyncStatus::from(*s))
                })
            }
            _ => Value::Null,
        }
    }
}

impl Plain for Health {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "status" => enum_value(HealthStatus::from(self.status)),
            "message" => optional(self.message.as_ref(), |m| string(m)),
            _ => Value::Null,
        }
    }
}

impl Plain for ResourceEvent {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "type" => string(&self.event_type),
            "reason" => string(&self.reason),
            "message" => string(&self.message),
            "count" => Value::from(event_count(self.count)),
            "firstSeen" => optional(self.first_seen.as_ref(), |t| Time(*t).to_value()),
            "lastSeen" => optional(self.last_seen.as_ref(), |t| Time(*t).to_value()),
            "source" => optional(self.source.as_ref(), |s| string(s)),
            _ => Value::Null,
        }
    }
}

/// An Event's count as GraphQL's `Int` holds it.
fn event_count(count: u32) -> i32 {
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// A `JSON` field, as async-graphql's `Json` answers it (`to_value`), converted directly rather
/// than through serde: a group's labels are some ten thousand values per view.
fn json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Boolean(*b),
        serde_json::Value::Number(n) => Value::Number(n.clone()),
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(items) => Value::List(items.iter().map(json).collect()),
        serde_json::Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (async_graphql::Name::new(k), json(v)))
                .collect(),
        ),
    }
}

impl Plain for ResourceHealth {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "status" => enum_value(self.status),
            "message" => optional(self.message.as_ref(), |m| string(m)),
            _ => Value::Null,
        }
    }
}

impl Plain for ResourceEdge {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "from" => string(&self.from),
            "to" => string(&self.to),
            "type" => enum_value(self.kind),
            _ => Value::Null,
        }
    }
}

impl Plain for KubernetesEvent {
    fn field(&self, name: &str, _: &SelectionSet) -> Value {
        match name {
            "type" => string(&self.event_type),
            "reason" => string(&self.reason),
            "message" => string(&self.message),
            "count" => Value::from(self.count),
            "firstSeen" => optional(self.first_seen.as_ref(), Time::to_value),
            "lastSeen" => optional(self.last_seen.as_ref(), Time::to_value),
            "source" => optional(self.source.as_ref(), |s| string(s)),
            _ => Value::Null,
        }
    }
}

#[derive(SimpleObject)]
pub struct ResourceListError {
    api_version: String,
    kind: String,
    /// The cluster's HTTP status; null when it did not answer in time or at all.
    code: Option<i32>,
    message: String,
}

impl From<ListError> for ResourceListError {
    fn from(e: ListError) -> Self {
        ResourceListError {
            api_version: e.api_version,
            kind: e.kind,
            code: e.code.map(i32::from),
            message: e.message,
        }
    }
}

/// A Kubernetes Event about a resource.
#[derive(SimpleObject)]
pub struct KubernetesEvent {
    /// `Normal` or `Warning`.
    #[graphql(name = "type")]
    event_type: String,
    reason: String,
    message: String,
    /// How many times it happened.
    count: i32,
    first_seen: Option<Time>,
    last_seen: Option<Time>,
    /// The component that reported it.
    source: Option<String>,
}

impl From<ResourceEvent> for KubernetesEvent {
    fn from(e: ResourceEvent) -> Self {
        KubernetesEvent {
            event_type: e.event_type,
            reason: e.reason,
            message: e.message,
            count: event_count(e.count),
            first_seen: e.first_seen.map(Time),
            last_seen: e.last_seen.map(Time),
            source: e.source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_convert_as_async_graphql_serializes_them() {
        let values = serde_json::json!([
            null, true, 0, -7, 18446744073709551615u64, 1.5, "text", [],
            {"b": {"nested": [1, "two", null]}, "a": "", "app.kubernetes.io/name": "web"},
        ]);
        for value in values.as_array().unwrap().iter().chain([&values]) {
            assert_eq!(
                json(value),
                async_graphql::to_value(value).unwrap(),
                "{value}"
            );
        }
    }
}
