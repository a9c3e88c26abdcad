//! An Argo CD Application's resources: `status.resources[]`, each `group version kind
//! namespace name` (the group empty for the core group, the namespace for a cluster-scoped one).

use super::{at, ObjRef};
use crate::resources::tree::Tree;

/// What `application` says it manages; `None` before Argo CD wrote any status.
pub fn resources(application: &Tree) -> Option<Vec<ObjRef>> {
    let list = at(application, &["status", "resources"])?.as_array()?;
    let field = |r: &Tree, key: &str| r.get(key).and_then(Tree::as_str).unwrap_or("").to_owned();
    Some(
        list.iter()
            .filter(|r| !field(r, "kind").is_empty() && !field(r, "name").is_empty())
            .map(|r| ObjRef {
                group: field(r, "group"),
                version: Some(field(r, "version")).filter(|v| super::is_api_version(v)),
                kind: field(r, "kind"),
                namespace: Some(field(r, "namespace")).filter(|ns| !ns.is_empty()),
                name: field(r, "name"),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gitops::tree;
    use serde_json::json;

    /// Shaped as argo-cd's `ResourceStatus` (pkg/apis/application/v1alpha1/types.go).
    #[test]
    fn status_resources_name_group_version_kind_namespace_name() {
        let app = tree(json!({"status": {"resources": [
            {"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "shop",
             "name": "web", "status": "Synced", "health": {"status": "Healthy"}},
            {"version": "v1", "kind": "Service", "namespace": "shop", "name": "web",
             "status": "Synced"},
            {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole",
             "name": "shop-reader", "status": "OutOfSync"},
            {"kind": "", "name": "nameless"},
            {"version": "v1/nodes/n1/proxy/metrics?", "kind": "Namespace", "name": "x"},
        ]}}));
        let refs = resources(&app).unwrap();
        assert_eq!(refs.len(), 4);
        // A version that is no API version is not taken into a request path.
        assert_eq!(refs[3].version, None);
        assert_eq!(refs[0].api_version().as_deref(), Some("apps/v1"));
        assert_eq!(refs[1].group, "");
        assert_eq!(refs[1].api_version().as_deref(), Some("v1"));
        assert_eq!(refs[2].namespace, None);
        assert!(resources(&tree(json!({"status": {}}))).is_none());
    }
}
