//! `fluxReconcile`, `fluxSuspend`, `fluxResume` and `Environment.fluxActions` (SPEC 15).
//!
//! An action is checked in this order, each refusal audited (`answerCode` 403) and answered in
//! `errors`: the viewer may read the environment, the input names a Flux object, the
//! environment has an agent, the viewer has `user_access` to it, and the object is one of the
//! environment's sources or a Flux object of its group (read by the group's own code, so every
//! source of the group counts). Then the object is patched as GitLab patches it, as the viewer
//! (`k8s::flux_actions`): the cluster's RBAC decides, and its answer is audited.

use std::sync::Arc;

use async_graphql::connection::Connection;
use async_graphql::{Context, InputObject, Object, SimpleObject, ID};
use chrono::Utc;

use super::mutations::readable_environment;
use super::resource_group::{self, FORBIDDEN_MESSAGE};
use super::types::{conn, gid, loader, page, Environment, Gql, Result, Time, UserCore};
use crate::db::flux_actions::{self as audit, FluxActionRow, NewAction};
use crate::db::read::{AgentDeploymentRow, AgentRow, EnvironmentRow};
use crate::gitlab::validate;
use crate::k8s::clusters::Clusters;
use crate::k8s::flux_actions::{self as flux, FluxAction as Action, Target};
use crate::resources::group::ResourceGroup;

#[derive(InputObject)]
pub struct FluxActionInput {
    /// `gid://gitlab/Environment/<id>`.
    environment_id: ID,
    /// e.g. `kustomize.toolkit.fluxcd.io/v1`.
    api_version: String,
    /// e.g. `Kustomization`.
    kind: String,
    namespace: String,
    name: String,
}

#[derive(SimpleObject)]
pub struct FluxActionPayload {
    /// The audited action; null when the input named no readable environment or no Flux object.
    action: Option<FluxAction>,
    /// Why the action was refused or failed, in words; empty when the cluster took it.
    errors: Vec<String>,
}

impl FluxActionPayload {
    fn refused(message: String) -> Self {
        FluxActionPayload {
            action: None,
            errors: vec![message],
        }
    }
}

/// One audited action.
pub struct FluxAction(pub(super) FluxActionRow);

#[Object]
impl FluxAction {
    async fn id(&self) -> ID {
        gid("FluxAction", self.0.id)
    }

    /// `RECONCILE`, `SUSPEND` or `RESUME`.
    async fn kind(&self) -> &str {
        &self.0.kind
    }

    /// Who asked, as they were named then.
    async fn user(&self) -> UserCore {
        UserCore {
            id: self.0.user_id,
            username: self.0.username.clone(),
        }
    }

    async fn created_at(&self) -> Time {
        Time(self.0.created_at)
    }

    /// The Flux resource path, e.g.
    /// `kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app`.
    async fn resource(&self) -> &str {
        &self.0.resource
    }

    /// The cluster's HTTP status; 403 for a refusal by envlens before the cluster was asked.
    async fn answer_code(&self) -> i32 {
        self.0.answer_code
    }
}

#[derive(Default)]
pub struct FluxMutation;

#[Object]
impl FluxMutation {
    /// Asks Flux to reconcile the object now (its `reconcile.fluxcd.io/requestedAt`).
    async fn flux_reconcile(
        &self,
        ctx: &Context<'_>,
        input: FluxActionInput,
    ) -> Result<FluxActionPayload> {
        act(ctx, input, Action::Reconcile).await
    }

    /// Suspends the object's reconciliation (`spec.suspend: true`).
    async fn flux_suspend(
        &self,
        ctx: &Context<'_>,
        input: FluxActionInput,
    ) -> Result<FluxActionPayload> {
        act(ctx, input, Action::Suspend).await
    }

    /// Resumes the object's reconciliation (`spec.suspend: false`).
    async fn flux_resume(
        &self,
        ctx: &Context<'_>,
        input: FluxActionInput,
    ) -> Result<FluxActionPayload> {
        act(ctx, input, Action::Resume).await
    }
}

/// A Flux object an action names, checked.
struct Named<'a> {
    group: &'a str,
    version: &'a str,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
}

impl<'a> Named<'a> {
    fn of(input: &'a FluxActionInput) -> std::result::Result<Self, String> {
        let (group, version) =
            validate::flux_kind(&input.api_version, &input.kind).map_err(|e| e.to_string())?;
        validate::dns_label("namespace", &input.namespace).map_err(|e| e.to_string())?;
        validate::dns_subdomain("name", &input.name).map_err(|e| e.to_string())?;
        Ok(Named {
            group,
            version,
            kind: &input.kind,
            namespace: &input.namespace,
            name: &input.name,
        })
    }

    /// Its Flux resource path with `plural` (`<group>/<version>/namespaces/<ns>/<plural>/<name>`).
    fn resource(&self, plural: &str) -> String {
        format!(
            "{}/{}/namespaces/{}/{plural}/{}",
            self.group, self.version, self.namespace, self.name
        )
    }

    /// Whether the group holds it (at any version of its API group).
    fn in_group(&self, group: &ResourceGroup) -> bool {
        group.resources.iter().any(|r| {
            r.kind == self.kind
                && r.api_version.split('/').next() == Some(self.group)
                && r.namespace.as_deref() == Some(self.namespace)
                && r.name == self.name
        })
    }

    /// Whether the environment's `fluxResourcePath` names it (at any version).
    fn is_bound(&self, plural: &str, flux_resource_path: Option<&str>) -> bool {
        let Some(path) = flux_resource_path else {
            return false;
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        matches!(parts.as_slice(),
            [group, _version, "namespaces", namespace, resource, name]
                if *group == self.group && *namespace == self.namespace
                    && *resource == plural && *name == self.name)
    }
}

/// The plural Flux's CRDs give a kind (`Kustomization` → `kustomizations`, `ImagePolicy` →
/// `imagepolicies`): the audit's path when the cluster's discovery was not asked.
fn flux_plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    }
}

/// Writes the audit row and answers it; `refusal` is the words of a failure.
async fn record(
    ctx: &Context<'_>,
    environment: &EnvironmentRow,
    action: Action,
    resource: &str,
    code: u16,
    refusal: Option<String>,
) -> Result<FluxActionPayload> {
    let user = loader(ctx).loader().user().await.gql()?;
    let (user_id, username) = (user.id, user.username.clone());
    let row = audit::record(
        &mut **conn(ctx).await?,
        &NewAction {
            environment_id: environment.id,
            user_id,
            username: &username,
            kind: action.as_str(),
            resource,
            answer_code: i32::from(code),
        },
    )
    .await
    .gql()?;
    let errors = match (200..300).contains(&code) {
        true => Vec::new(),
        false => vec![refusal.unwrap_or_else(|| format!("the cluster answered {code}"))],
    };
    Ok(FluxActionPayload {
        action: Some(FluxAction(row)),
        errors,
    })
}

async fn act(
    ctx: &Context<'_>,
    input: FluxActionInput,
    action: Action,
) -> Result<FluxActionPayload> {
    let (environment, _) = match readable_environment(ctx, &input.environment_id).await? {
        Ok(found) => found,
        Err(message) => return Ok(FluxActionPayload::refused(message)),
    };
    let named = match Named::of(&input) {
        Ok(named) => named,
        Err(message) => return Ok(FluxActionPayload::refused(message)),
    };
    let guessed = named.resource(&flux_plural(named.kind));
    let shown = Environment::new(environment.clone());
    let Some((agent, deployment)) = shown.last_agent(ctx).await? else {
        let message = "The environment has no agent: no deployment through one succeeded.";
        return record(
            ctx,
            &environment,
            action,
            &guessed,
            403,
            Some(message.into()),
        )
        .await;
    };
    // `user_access`, failing closed: refused before anything is asked of the cluster.
    let user_id = loader(ctx).loader().user().await.gql()?.id;
    let clusters: &Arc<Clusters> = ctx.data_unchecked();
    let grant = clusters
        .grants
        .authorize(&mut **conn(ctx).await?, agent.id, user_id)
        .await
        .gql()?;
    if grant.is_none() {
        return record(
            ctx,
            &environment,
            action,
            &guessed,
            403,
            Some(FORBIDDEN_MESSAGE.to_owned()),
        )
        .await;
    }
    let namespace = deployment.kubernetes_namespace.clone();
    let assembled = resource_group::assemble(ctx, &environment, &agent, &namespace).await?;
    let Some(cluster) = assembled.cluster else {
        let message = format!("Agent {} has no cluster connection.", agent.name);
        return record(ctx, &environment, action, &guessed, 503, Some(message)).await;
    };
    let plural = match cluster.discovery.kinds().await {
        Ok(discovered) => discovered
            .kinds
            .iter()
            .find(|k| k.group == named.group && k.kind == named.kind)
            .map(|k| k.plural.clone()),
        Err(e) => {
            let message = format!("The cluster's kinds cannot be read: {}", e.message);
            let code = e.code.unwrap_or(502);
            return record(ctx, &environment, action, &guessed, code, Some(message)).await;
        }
    };
    let Some(plural) = plural else {
        let message = format!(
            "The cluster does not serve {} of {}.",
            named.kind, named.group
        );
        return record(ctx, &environment, action, &guessed, 404, Some(message)).await;
    };
    let resource = named.resource(&plural);
    let bound = named.is_bound(&plural, deployment.flux_resource_path.as_deref());
    // The Flux objects of a GitOps group (an inventory's, across its namespaces) count too.
    let in_group = bound
        || named.in_group(&assembled.group)
        || in_gitops_group(ctx, &shown, &environment, (&agent, &deployment), &named).await?;
    if !in_group {
        let message = format!(
            "{resource} is neither the environment's Flux resource nor a Flux object of its group."
        );
        return record(ctx, &environment, action, &resource, 403, Some(message)).await;
    }
    let target = Target {
        client: &cluster.client,
        agent: agent.id,
        headers: &assembled.headers,
        path: &format!("/apis/{resource}"),
        timeout: clusters.response_timeout,
    };
    let answer = flux::send(&target, action, Utc::now()).await;
    record(
        ctx,
        &environment,
        action,
        &resource,
        answer.code,
        answer.message,
    )
    .await
}

/// `Environment.fluxActions`: a page of the audit, newest first, for viewers with `user_access`
/// to the environment's agent. Others read no action, as the timeline leaves out what they may
/// not see (an error would null the whole environment: the field is non-null).
pub(super) async fn page_of(
    ctx: &Context<'_>,
    environment: &Environment,
    first: Option<i32>,
    after: Option<String>,
) -> Result<Connection<String, FluxAction>> {
    let readable = match environment.last_agent(ctx).await? {
        Some((agent, _)) => {
            let user_id = loader(ctx).loader().user().await.gql()?.id;
            let clusters: &Arc<Clusters> = ctx.data_unchecked();
            clusters
                .grants
                .authorize(&mut **conn(ctx).await?, agent.id, user_id)
                .await
                .gql()?
                .is_some()
        }
        None => false,
    };
    let id = environment.row.id;
    page(first, after, |before, limit| async move {
        if !readable {
            return Ok(Vec::new());
        }
        let rows = audit::page(&mut **conn(ctx).await?, id, before, limit)
            .await
            .gql()?;
        Ok(rows.into_iter().map(|r| (r.id, FluxAction(r))).collect())
    })
    .await
}

/// Whether `named` is in the environment's GitOps group (SPEC 15): its bound sources' objects,
/// as the viewer reads them.
async fn in_gitops_group(
    ctx: &Context<'_>,
    shown: &Environment,
    environment: &EnvironmentRow,
    (agent, deployment): (&AgentRow, &AgentDeploymentRow),
    named: &Named<'_>,
) -> Result<bool> {
    let sources = shown.gitops_sources(ctx, deployment).await?;
    if sources.is_empty() {
        return Ok(false);
    }
    let group = resource_group::load_gitops(ctx, environment, agent.clone(), None, sources).await?;
    Ok(named.in_group(group.assembled()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(api_version: &str, kind: &str, namespace: &str, name: &str) -> FluxActionInput {
        FluxActionInput {
            environment_id: ID("gid://gitlab/Environment/1".into()),
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn plurals_as_flux_names_its_kinds() {
        assert_eq!(flux_plural("Kustomization"), "kustomizations");
        assert_eq!(flux_plural("HelmRelease"), "helmreleases");
        assert_eq!(flux_plural("ImagePolicy"), "imagepolicies");
        assert_eq!(flux_plural("OCIRepository"), "ocirepositories");
    }

    #[test]
    fn the_bound_path_names_the_object_at_any_version() {
        let input = input(
            "kustomize.toolkit.fluxcd.io/v1",
            "Kustomization",
            "flux-system",
            "app",
        );
        let named = Named::of(&input).unwrap();
        let path = "kustomize.toolkit.fluxcd.io/v1beta2/namespaces/flux-system/kustomizations/app";
        assert!(named.is_bound("kustomizations", Some(path)));
        assert!(!named.is_bound(
            "kustomizations",
            Some("kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/other")
        ));
        assert!(!named.is_bound("kustomizations", Some("path/to/flux/resource")));
        assert!(!named.is_bound("kustomizations", None));
        assert_eq!(
            named.resource("kustomizations"),
            "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app"
        );
    }

    #[test]
    fn only_flux_objects_with_kubernetes_names_are_named() {
        assert!(Named::of(&input("apps/v1", "Deployment", "shop", "web")).is_err());
        assert!(Named::of(&input(
            "kustomize.toolkit.fluxcd.io/v1",
            "Kustomization",
            "Shop",
            "web"
        ))
        .is_err());
        assert!(Named::of(&input(
            "kustomize.toolkit.fluxcd.io/v1",
            "Kustomization",
            "shop",
            "../x"
        ))
        .is_err());
    }
}
