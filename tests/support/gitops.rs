#![allow(dead_code)] // its users are the GitOps tests of issue 33
//! Flux's and Argo CD's kinds, served by the in-process Kubernetes server as their published CRDs
//! declare them (group, storage version, plural, scope; all with a `status` subresource).
//!
//! Facts from fluxcd/kustomize-controller, helm-controller and source-controller's `config/crd/bases`
//! (Flux 2.6: `Kustomization` v1, `HelmRelease` v2, `GitRepository`/`HelmRepository`/`OCIRepository`/
//! `Bucket`/`HelmChart` v1) and argoproj/argo-cd's `manifests/crds` (`Application`, `AppProject`
//! v1alpha1). Tests register them with [`serve_gitops_kinds`], then insert objects shaped as the
//! controllers write them.

use super::kube_api::KubeApi;

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
