//! Pod -> PersistentVolumeClaim, for each of the Pod's `spec.volumes[].persistentVolumeClaim`
//! (same namespace; only Pods, not a StatefulSet's claim templates).

use super::hashing::Chains;
use super::nodes::{array_at, str_at};
use super::{EdgeType, Nodes, NsName, RawEdge};
use crate::resources::tree::Tree;

/// The claims a Pod's `spec` mounts: `spec.volumes[].persistentVolumeClaim.claimName`.
pub(super) fn claim_names(spec: &Tree) -> impl Iterator<Item = &str> {
    array_at(spec, &["volumes"])
        .filter_map(|volume| str_at(volume, &["persistentVolumeClaim", "claimName"]))
}

impl Nodes {
    /// Pod -> PersistentVolumeClaim, from the names [`claim_names`] found, to `claims`.
    pub(super) fn claim_edges(&self, claims: &Chains<NsName>, raw: &mut Vec<RawEdge>) {
        let kind = EdgeType::VolumeClaim;
        for (pod, claim) in self.resolve_names(kind, claims) {
            self.link(raw, pod, claim, kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::json;

    #[test]
    fn pvc_claims() {
        let mut p = pod("web", "db-0", "p1", json!({}));
        p["spec"] = json!({"volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "gone", "persistentVolumeClaim": {"claimName": "missing"}},
        ]});
        let mut sts = workload("apps/v1", "StatefulSet", "web", "db", "sts1", json!({}));
        sts["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "data"}}]);
        sts["spec"]["template"]["spec"] =
            json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]});
        let objects = [
            p,
            sts,
            object("v1", "PersistentVolumeClaim", "web", "data", "pvc1"),
            object("v1", "PersistentVolumeClaim", "prod", "data", "pvc2"),
        ];
        assert_eq!(
            triples(&edges(&objects)),
            [("p1", "pvc1", EdgeType::VolumeClaim)]
        );
    }
}
