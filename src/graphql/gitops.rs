//! GitOps as GraphQL shows it (SPEC 15): a group's sources, GitLab's sync status of Flux
//! objects, and the binding of an environment to its Flux object.

use async_graphql::{Enum, SimpleObject};

use crate::gitops::path::FluxPath;
use crate::gitops::sync;
use crate::gitops::ObjRef;
use crate::k8s::gitops::GroupSource;

/// GitLab's sync status of a Flux object, in the order it is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum FluxSyncStatus {
    Suspended,
    Failed,
    Stalled,
    ReconcilingWithBadConfig,
    Reconciling,
    Reconciled,
    Unknown,
}

impl From<sync::FluxSyncStatus> for FluxSyncStatus {
    fn from(s: sync::FluxSyncStatus) -> Self {
        use sync::FluxSyncStatus as S;
        match s {
            S::Suspended => FluxSyncStatus::Suspended,
            S::Failed => FluxSyncStatus::Failed,
            S::Stalled => FluxSyncStatus::Stalled,
            S::ReconcilingWithBadConfig => FluxSyncStatus::ReconcilingWithBadConfig,
            S::Reconciling => FluxSyncStatus::Reconciling,
            S::Reconciled => FluxSyncStatus::Reconciled,
            S::Unknown => FluxSyncStatus::Unknown,
        }
    }
}

/// A GitOps source of a resource group: a Flux Kustomization or HelmRelease, an Argo CD
/// Application.
#[derive(Debug, Clone, SimpleObject)]
pub struct ResourceGroupSource {
    pub kind: String,
    pub api_version: String,
    pub namespace: Option<String>,
    pub name: String,
    /// Null unless a Flux object that was found.
    pub flux_sync_status: Option<FluxSyncStatus>,
}

impl From<GroupSource> for ResourceGroupSource {
    fn from(s: GroupSource) -> Self {
        ResourceGroupSource {
            kind: s.kind,
            api_version: s.api_version,
            namespace: s.namespace,
            name: s.name,
            flux_sync_status: s.flux_sync_status.map(Into::into),
        }
    }
}

/// The source an environment's Flux resource path names, its kind found by its plural among
/// Flux's kinds (GitLab binds Kustomizations and HelmReleases).
pub fn bound_source(path: &FluxPath) -> Option<ObjRef> {
    let kind = match (path.group.as_str(), path.plural.as_str()) {
        (crate::gitops::KUSTOMIZE_GROUP, "kustomizations") => "Kustomization",
        (crate::gitops::HELM_GROUP, "helmreleases") => "HelmRelease",
        _ => return None,
    };
    Some(ObjRef {
        group: path.group.clone(),
        version: Some(path.version.clone()),
        kind: kind.to_owned(),
        namespace: Some(path.namespace.clone()),
        name: path.name.clone(),
    })
}

/// The GitOps sources an environment is bound to (SPEC 15): the Flux object the
/// `fluxResourcePath` of `row` (its agent's deployment) names, and the Argo CD Application
/// Maintainers bound it to. None: a group of labels only.
pub async fn bound_sources(
    db: impl sqlx::PgExecutor<'_>,
    environment_id: i64,
    row: &crate::db::read::AgentDeploymentRow,
) -> crate::error::Result<Vec<ObjRef>> {
    let mut sources: Vec<ObjRef> = row
        .flux_resource_path
        .as_deref()
        .and_then(crate::gitops::path::parse)
        .and_then(|path| bound_source(&path))
        .into_iter()
        .collect();
    let argo = crate::db::environment_settings::argo_application(db, environment_id).await?;
    if let Some((namespace, name)) = argo {
        sources.push(ObjRef {
            group: "argoproj.io".into(),
            version: Some("v1alpha1".into()),
            kind: "Application".into(),
            namespace: Some(namespace),
            name,
        });
    }
    Ok(sources)
}

/// GitLab's sync status of `source` alone (`Environment.fluxSyncStatus`): its kind's objects
/// in its namespace from the watch cache, as the viewer may see them, not its group. `None`
/// when it is not there, its kind is not served or the viewer may not list it; a viewer
/// without `user_access` to the agent is refused as for the group.
pub async fn source_status(
    ctx: &async_graphql::Context<'_>,
    environment: &crate::db::read::EnvironmentRow,
    agent: &crate::db::read::AgentRow,
    source: &ObjRef,
) -> async_graphql::Result<Option<FluxSyncStatus>> {
    let Some(namespace) = source.namespace.as_deref() else {
        return Ok(None);
    };
    let (cluster, headers, options) =
        match super::resource_group::connect(ctx, environment, agent).await? {
            Ok(connected) => connected,
            Err(_) => return Ok(None),
        };
    let Ok(discovered) = cluster.discovery.kinds().await else {
        return Ok(None);
    };
    let same = |k: &&crate::k8s::discovery::ApiKind| {
        k.group == source.group && k.kind == source.kind && k.namespaced
    };
    let kind = discovered
        .kinds
        .iter()
        .filter(same)
        .find(|k| source.version.as_deref().is_none_or(|v| k.version == v))
        .or_else(|| discovered.kinds.iter().find(same));
    let Some(kind) = kind else {
        return Ok(None);
    };
    let view = cluster
        .watch
        .view_kind(
            &cluster.discovery,
            &headers,
            namespace,
            kind,
            options.page_size,
            options.request_timeout,
        )
        .await;
    let Ok(view) = view else {
        return Ok(None);
    };
    view.synced(options.request_timeout).await;
    let object = view.object(&source.name).ok().flatten();
    Ok(object.and_then(|o| sync::of(&o.view)).map(Into::into))
}
