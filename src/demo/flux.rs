//! The demo's Flux-managed environment (SPEC 15): acme/web/site's `gitops`, bound to the
//! Kustomization `flux-system/site`, whose inventory names the site in two namespaces (blue and
//! green) and a nested Kustomization with the site's configuration; written as
//! kustomize-controller writes their status.

use serde_json::{json, Value};

use super::cluster::{now, DemoCluster};

/// The environment's Flux resource path, as GitLab stores it.
pub const PATH: &str = "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/site";
pub const BLUE: &str = "site-blue";
pub const GREEN: &str = "site-green";

fn kustomization(name: &str, path: &str, ids: &[String], ready: (&str, &str, &str)) -> Value {
    let entries: Vec<Value> = ids.iter().map(|id| json!({"id": id, "v": "v1"})).collect();
    json!({"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": name, "namespace": "flux-system", "generation": 1},
        "spec": {"interval": "10m", "path": path, "prune": true,
                 "sourceRef": {"kind": "GitRepository", "name": "flux-system"}},
        "status": {"observedGeneration": 1,
            "lastAppliedRevision": "main@sha1:4f2a9c1e7b3d5a8f6c0e2b4d6f8a1c3e5b7d9f0a",
            "inventory": {"entries": entries},
            "conditions": [{"type": "Ready", "status": ready.0, "reason": ready.1, "message": ready.2,
                            "lastTransitionTime": now()}]}})
}

/// The Kustomizations (the site's Deployments, Services and ConfigMaps are the world's apps).
pub fn objects(cluster: &DemoCluster) {
    let mut site: Vec<String> = Vec::new();
    for ns in [BLUE, GREEN] {
        site.push(format!("{ns}_site_apps_Deployment"));
        site.push(format!("{ns}_site__Service"));
    }
    site.push("flux-system_site-config_kustomize.toolkit.fluxcd.io_Kustomization".into());
    cluster.put(kustomization(
        "site",
        "./deploy/site",
        &site,
        (
            "True",
            "ReconciliationSucceeded",
            "Applied revision: main@sha1:4f2a9c1e",
        ),
    ));
    let config: Vec<String> = [BLUE, GREEN]
        .iter()
        .map(|ns| format!("{ns}_site-config__ConfigMap"))
        .collect();
    cluster.put(kustomization(
        "site-config",
        "./deploy/config",
        &config,
        ("Unknown", "Progressing", "Reconciliation in progress"),
    ));
}
