//! `environmentNamespacesUpdate` and `environmentArgoApplicationUpdate` (SPEC 15): what project
//! Maintainers set on an environment, kept in PostgreSQL (`db::environment_settings`). The
//! namespaces join the environment's group (its labels source applies there too); the Argo CD
//! Application is read by the grouping code through `db::environment_settings::argo_application`.

use async_graphql::{Context, InputObject, Object, SimpleObject, ID};

use super::mutations::readable_environment;
use super::types::{conn, loader, Environment, Gql, Project, Result};
use crate::db::environment_settings as settings;
use crate::db::read::EnvironmentRow;
use crate::gitlab::{access, validate};

/// At most this many namespaces are added to one environment: each costs a watch set.
pub const MAX_NAMESPACES: usize = 20;

#[derive(InputObject)]
pub struct EnvironmentNamespacesInput {
    /// `gid://gitlab/Environment/<id>`.
    environment_id: ID,
    /// The namespaces beyond the deployment's, replacing those added before; `[]` removes them.
    namespaces: Vec<String>,
}

#[derive(InputObject)]
pub struct EnvironmentArgoApplicationInput {
    /// `gid://gitlab/Environment/<id>`.
    environment_id: ID,
    /// `<namespace>/<name>` of an Argo CD Application in the cluster of the environment's agent;
    /// null unbinds.
    application: Option<String>,
}

#[derive(SimpleObject)]
pub struct EnvironmentNamespacesPayload {
    /// The environment as changed; null when nothing was changed.
    environment: Option<Environment>,
    /// Why nothing was changed, in words.
    errors: Vec<String>,
}

impl EnvironmentNamespacesPayload {
    fn refused(message: String) -> Self {
        EnvironmentNamespacesPayload {
            environment: None,
            errors: vec![message],
        }
    }
}

#[derive(Default)]
pub struct EnvironmentSettingsMutation;

#[Object]
impl EnvironmentSettingsMutation {
    /// Sets the namespaces added to an environment (project Maintainers).
    async fn environment_namespaces_update(
        &self,
        ctx: &Context<'_>,
        input: EnvironmentNamespacesInput,
    ) -> Result<EnvironmentNamespacesPayload> {
        let (environment, _) = match maintained_environment(ctx, &input.environment_id).await? {
            Ok(found) => found,
            Err(message) => return Ok(EnvironmentNamespacesPayload::refused(message)),
        };
        let namespaces = match checked_namespaces(input.namespaces) {
            Ok(namespaces) => namespaces,
            Err(message) => return Ok(EnvironmentNamespacesPayload::refused(message)),
        };
        settings::set_namespaces(&mut **conn(ctx).await?, environment.id, &namespaces)
            .await
            .gql()?;
        Ok(EnvironmentNamespacesPayload {
            environment: Some(Environment::new(environment)),
            errors: Vec::new(),
        })
    }

    /// Binds an environment to an Argo CD Application, or unbinds it (project Maintainers).
    async fn environment_argo_application_update(
        &self,
        ctx: &Context<'_>,
        input: EnvironmentArgoApplicationInput,
    ) -> Result<EnvironmentNamespacesPayload> {
        let (environment, _) = match maintained_environment(ctx, &input.environment_id).await? {
            Ok(found) => found,
            Err(message) => return Ok(EnvironmentNamespacesPayload::refused(message)),
        };
        let application = match input.application.as_deref().map(application) {
            None => None,
            Some(Ok(parsed)) => Some(parsed),
            Some(Err(message)) => return Ok(EnvironmentNamespacesPayload::refused(message)),
        };
        settings::set_argo_application(&mut **conn(ctx).await?, environment.id, application)
            .await
            .gql()?;
        Ok(EnvironmentNamespacesPayload {
            environment: Some(Environment::new(environment)),
            errors: Vec::new(),
        })
    }
}

/// The environment `id` names, when the viewer maintains its project (GitLab's Maintainer or
/// Owner through the project or a group above it, or an admin); else the words to answer.
async fn maintained_environment(
    ctx: &Context<'_>,
    id: &ID,
) -> Result<std::result::Result<(EnvironmentRow, Project), String>> {
    let (environment, project) = match readable_environment(ctx, id).await? {
        Ok(found) => found,
        Err(message) => return Ok(Err(message)),
    };
    let user = loader(ctx).loader().user().await.gql()?;
    let (user_id, admin) = (user.id, user.admin);
    let level = settings::project_access_level(&mut **conn(ctx).await?, user_id, project.0.id)
        .await
        .gql()?;
    if !access::maintains_project(admin, level) {
        return Ok(Err(format!(
            "Only Maintainers of {} may change its environments' settings.",
            project.0.full_path
        )));
    }
    Ok(Ok((environment, project)))
}

/// Namespaces as given, each a DNS-1123 label, each once, at most [`MAX_NAMESPACES`].
fn checked_namespaces(namespaces: Vec<String>) -> std::result::Result<Vec<String>, String> {
    let mut kept: Vec<String> = Vec::with_capacity(namespaces.len().min(MAX_NAMESPACES));
    for (i, namespace) in namespaces.into_iter().enumerate() {
        validate::dns_label(&format!("namespaces[{i}]"), &namespace).map_err(|e| e.to_string())?;
        if !kept.contains(&namespace) {
            kept.push(namespace);
        }
        if kept.len() > MAX_NAMESPACES {
            return Err(format!(
                "namespaces: at most {MAX_NAMESPACES} namespaces may be added to an environment"
            ));
        }
    }
    Ok(kept)
}

/// `<namespace>/<name>`: a namespace (DNS-1123 label) and an Application's name (a DNS-1123
/// subdomain).
fn application(text: &str) -> std::result::Result<(&str, &str), String> {
    let Some((namespace, name)) = text.split_once('/') else {
        return Err(format!(
            "application: `{text}` must be `<namespace>/<name>` of an Argo CD Application"
        ));
    };
    validate::dns_label("application", namespace).map_err(|e| e.to_string())?;
    validate::dns_subdomain("application", name).map_err(|e| e.to_string())?;
    Ok((namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_each_once_labels_bounded() {
        let given = vec!["green".to_owned(), "blue".to_owned(), "green".to_owned()];
        assert_eq!(checked_namespaces(given).unwrap(), ["green", "blue"]);
        assert!(checked_namespaces(vec!["Green".into()])
            .unwrap_err()
            .contains("namespaces[0]"));
        let many: Vec<String> = (0..=MAX_NAMESPACES).map(|i| format!("ns-{i}")).collect();
        assert!(checked_namespaces(many).unwrap_err().contains("at most 20"));
        assert!(checked_namespaces(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn applications_are_namespace_slash_name() {
        assert_eq!(application("argocd/web").unwrap(), ("argocd", "web"));
        assert!(application("web").is_err());
        assert!(application("argocd/web/x").is_err());
        assert!(application("/web").is_err());
        assert!(application("argocd/").is_err());
    }
}
