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
    let mut dashboard = json!({"namespace": NS, "flux_resource_path": flux});
    if flux.is_empty() {
        dashboard = json!({"namespace": NS});
    }
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": id, "iid": id, "status": "created", "ref": "main", "sha": "abc", "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": PROJECT, "full_path": "acme/apps/web"},
        "environment": {"id": env.0, "name": env.1, "slug": env.1, "tier": "production"},
        "job": {"id": id, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "dashboard": dashboard}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hook = json!({"object_kind": "deployment", "deployment_id": id, "status": "success",
        "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": env.1,
        "project": {"id": PROJECT, "path_with_namespace": "acme/apps/web"}});
    let res = app.hook("Deployment Hook", hook.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
}
