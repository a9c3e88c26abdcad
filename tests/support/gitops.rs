#![allow(dead_code)] // its users are the GitOps tests of issue 33
//! Flux's and Argo CD's kinds, served by the in-process Kubernetes server as their published CRDs
//! declare them (group, storage version, plural, scope; all with a `status` subresource).
//!
//! Facts from fluxcd/kustomize-controller, helm-controller and source-controller's `config/crd/bases`
//! (Flux 2.6: `Kustomization` v1, `HelmRelease` v2, `GitRepository`/`HelmRepository`/`OCIRepository`/
//! `Bucket`/`HelmChart` v1) and argoproj/argo-cd's `manifests/crds` (`Application`, `AppProject`
//! v1alpha1). Tests register them with [`serve_gitops_kinds`], then insert objects shaped as the
//! controllers write them.

use axum::http::Method;
use serde_json::json;

use super::environment::{NS, PROJECT};
use super::kube_api::KubeApi;
use super::TestApp;

/// (group, version, kind, plural), every one namespaced.
pub const GITOPS_KINDS: &[(&str, &str, &str, &str)] = &[
    (
        "kustomize.toolkit.fluxcd.io",
        "v1",
        "Kustomization",
        "kustomizations",
    ),
    (
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    ),
    (
        "source.toolkit.fluxcd.io",
        "v1",
        "GitRepository",
        "gitrepositories",
    ),
    (
        "source.toolkit.fluxcd.io",
        "v1",
        "HelmRepository",
        "helmrepositories",
    ),
    (
        "source.toolkit.fluxcd.io",
        "v1",
        "OCIRepository",
        "ocirepositories",
    ),
    ("source.toolkit.fluxcd.io", "v1", "Bucket", "buckets"),
    ("source.toolkit.fluxcd.io", "v1", "HelmChart", "helmcharts"),
    ("argoproj.io", "v1alpha1", "Application", "applications"),
    ("argoproj.io", "v1alpha1", "AppProject", "appprojects"),
];

/// Registers Flux's and Argo CD's kinds, as installing their CRDs would.
pub fn serve_gitops_kinds(api: &KubeApi) {
    for &(group, version, kind, plural) in GITOPS_KINDS {
        api.add_kind(group, version, kind, plural, true);
    }
}

/// A deployment of acme/apps/web to `env` through agent 7 into `shop`, with GitLab's Flux
/// resource path (none when empty), successful.
pub async fn deploy_bound(app: &TestApp, id: i64, env: (i64, &str), flux: &str) {
    deploy_bound_at(app, id, env, flux, "2026-11-21T10:00:00Z").await;
}

/// [`deploy_bound`], created by GitLab at `created_at`.
pub async fn deploy_bound_at(
    app: &TestApp,
    id: i64,
    env: (i64, &str),
    flux: &str,
    created_at: &str,
) {
    let mut dashboard = json!({"namespace": NS, "flux_resource_path": flux});
    if flux.is_empty() {
        dashboard = json!({"namespace": NS});
    }
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": id, "iid": id, "status": "created", "ref": "main", "sha": "abc", "tag": false,
                       "created_at": created_at},
        "project": {"id": PROJECT, "full_path": "acme/apps/web"},
        "environment": {"id": env.0, "name": env.1, "slug": env.1, "tier": "production"},
        "job": {"id": id, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "dashboard": dashboard}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    deployment_hook(app, id, env.1, "success").await;
}

/// GitLab's Deployment Hook for deployment `id` of acme/apps/web's environment `env`.
pub async fn deployment_hook(app: &TestApp, id: i64, env: &str, status: &str) {
    let hook = json!({"object_kind": "deployment", "deployment_id": id, "status": status,
        "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": env,
        "project": {"id": PROJECT, "path_with_namespace": "acme/apps/web"}});
    let res = app.hook("Deployment Hook", hook.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// Environment `env` of acme/apps/web with no deployment at all, bound as the sync binds it
/// from GitLab's environments API (SPEC 15): agent 7 as its `cluster_agent`, `ci_access`
/// allowing it into `shop`, and `flux` its `flux_resource_path`. Written by the sync's own
/// statements (`gitlab_sync` and `pull_deployments` test the sync's decision).
pub async fn bind_through_gitlab(app: &TestApp, env: (i64, &str), flux: &str) {
    use envlens::db::{deployments, pull};
    let mut conn = app.db.acquire().await.unwrap();
    deployments::put_environment(
        &mut conn,
        &deployments::Environment {
            id: env.0,
            project_id: PROJECT,
            name: env.1,
            slug: env.1,
            tier: Some("production"),
        },
    )
    .await
    .unwrap();
    pull::put_environment_agent(
        &mut conn,
        &pull::EnvironmentAgent {
            environment_id: env.0,
            reference: "acme/agents:prod",
            decision: Ok((7, NS)),
            flux_resource_path: Some(flux),
        },
    )
    .await
    .unwrap();
}
