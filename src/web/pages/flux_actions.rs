//! The environment page's Flux actions (SPEC 15): reconcile, suspend and resume buttons for the
//! environment's Flux resource and the Flux objects of its group, each a form that posts to
//! [`ACTION_PATH`] with the session's CSRF token (no script needed), and the actions' audit.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use crate::web::data::{Environment, FluxActionRecord};
use crate::web::order::{ago, title};

/// Where the buttons post.
pub const ACTION_PATH: &str = "/environments/flux-actions";

/// A Flux object the buttons act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxObject {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// The kinds of Flux's controllers by their plural, as their CRDs name them.
const KINDS: [(&str, &str); 14] = [
    ("kustomizations", "Kustomization"),
    ("helmreleases", "HelmRelease"),
    ("gitrepositories", "GitRepository"),
    ("helmrepositories", "HelmRepository"),
    ("ocirepositories", "OCIRepository"),
    ("buckets", "Bucket"),
    ("helmcharts", "HelmChart"),
    ("externalartifacts", "ExternalArtifact"),
    ("alerts", "Alert"),
    ("providers", "Provider"),
    ("receivers", "Receiver"),
    ("imagerepositories", "ImageRepository"),
    ("imagepolicies", "ImagePolicy"),
    ("imageupdateautomations", "ImageUpdateAutomation"),
];

/// The object a Flux resource path names (`<group>/<version>/namespaces/<ns>/<plural>/<name>`),
/// when its group is Flux's and its plural a known kind.
pub fn bound(path: &str) -> Option<FluxObject> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let [group, version, "namespaces", namespace, plural, name] = parts.as_slice() else {
        return None;
    };
    if !group.ends_with(crate::gitlab::validate::FLUX_GROUP_SUFFIX) {
        return None;
    }
    let kind = KINDS.iter().find(|(p, _)| p == plural)?.1;
    Some(FluxObject {
        api_version: format!("{group}/{version}"),
        kind: kind.to_owned(),
        namespace: (*namespace).to_owned(),
        name: (*name).to_owned(),
    })
}

/// The objects the buttons act on: the bound one first, then the group's Flux objects.
pub fn targets(env: &Environment) -> Vec<FluxObject> {
    let mut objects: Vec<FluxObject> = env
        .flux_resource_path
        .as_deref()
        .and_then(bound)
        .into_iter()
        .collect();
    let in_group = env.resource_group.iter().flat_map(|g| &g.resources);
    for r in in_group {
        let group = r.api_version.split('/').next().unwrap_or_default();
        let (Some(namespace), true) = (
            &r.namespace,
            group.ends_with(crate::gitlab::validate::FLUX_GROUP_SUFFIX),
        ) else {
            continue;
        };
        let object = FluxObject {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: namespace.clone(),
            name: r.name.clone(),
        };
        if !objects.iter().any(|o| {
            o.kind == object.kind && o.namespace == object.namespace && o.name == object.name
        }) {
            objects.push(object);
        }
    }
    objects
}

/// The section: nothing when the viewer may not use the agent (`refused`: the resource group
/// was refused them), or the audit could not be read.
pub fn section(
    env: &Environment,
    project: &str,
    csrf: Option<&str>,
    refused: bool,
    now: DateTime<Utc>,
) -> Markup {
    let (Some(actions), false) = (&env.flux_actions, refused) else {
        return html! {};
    };
    let objects = targets(env);
    if objects.is_empty() && actions.nodes.is_empty() {
        return html! {};
    }
    html! {
        section.flux aria-labelledby="flux-heading" {
            h2 #flux-heading { "Flux" }
            @if !objects.is_empty() {
                ul.flux-objects {
                    @for o in &objects {
                        li {
                            span.kind { (o.kind) } " "
                            span.mono { (o.namespace) "/" (o.name) }
                            span.actions {
                                @for action in ["reconcile", "suspend", "resume"] {
                                    (button(env, project, csrf, o, action))
                                }
                            }
                        }
                    }
                }
            }
            h3 { "Actions" }
            @if actions.nodes.is_empty() {
                p.empty { "No Flux action was asked for yet." }
            } @else {
                table.flux-audit aria-label="Flux actions, newest first" {
                    thead { tr { th { "When" } th { "Who" } th { "Action" } th { "Resource" } th { "Answer" } } }
                    tbody { @for a in &actions.nodes { (audit_row(a, now)) } }
                }
            }
        }
    }
}

fn button(
    env: &Environment,
    project: &str,
    csrf: Option<&str>,
    o: &FluxObject,
    action: &str,
) -> Markup {
    html! {
        form.inline method="post" action=(ACTION_PATH) {
            @if let Some(csrf) = csrf { input type="hidden" name="csrf" value=(csrf); }
            input type="hidden" name="project" value=(project);
            input type="hidden" name="environment" value=(env.name);
            input type="hidden" name="environment_id" value=(env.id);
            input type="hidden" name="api_version" value=(o.api_version);
            input type="hidden" name="kind" value=(o.kind);
            input type="hidden" name="namespace" value=(o.namespace);
            input type="hidden" name="name" value=(o.name);
            button type="submit" name="action" value=(action)
                aria-label={(title(action)) " " (o.kind) " " (o.namespace) "/" (o.name)} { (title(action)) }
        }
    }
}

fn audit_row(a: &FluxActionRecord, now: DateTime<Utc>) -> Markup {
    let done = (200..300).contains(&a.answer_code);
    html! {
        tr data-flux-action {
            td { time datetime=(a.created_at) { (ago(&a.created_at, now)) } }
            td { (a.user.username) }
            td { (title(&a.kind.to_ascii_lowercase())) }
            td.mono { (a.resource) }
            td { span class={"badge " (if done { "h-healthy" } else { "h-degraded" })} { (a.answer_code) } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flux_resource_path_names_its_object() {
        assert_eq!(
            bound("kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app"),
            Some(FluxObject {
                api_version: "kustomize.toolkit.fluxcd.io/v1".into(),
                kind: "Kustomization".into(),
                namespace: "flux-system".into(),
                name: "app".into(),
            })
        );
        assert_eq!(
            bound("helm.toolkit.fluxcd.io/v2/namespaces/apps/helmreleases/web")
                .unwrap()
                .kind,
            "HelmRelease"
        );
        assert_eq!(bound("path/to/flux/resource"), None);
        assert_eq!(bound("apps/v1/namespaces/shop/deployments/web"), None);
    }
}
