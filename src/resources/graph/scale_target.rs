//! HorizontalPodAutoscaler -> its `spec.scaleTargetRef` (kind and name, same namespace).

use super::hashing::{hash_strs, Chains, Hashed, IdSet};
use super::Nodes;

impl Nodes {
    /// `(autoscaler, target)` for every object with a uid that an autoscaler's `scaleTargetRef`
    /// names (kind and name, same namespace).
    pub(super) fn scale_target_edges(&self, mut link: impl FnMut(u32, u32)) {
        if self.scale_targets.is_empty() {
            return;
        }
        let mut targets: Chains<(&str, &str, &str)> = Chains::new();
        // Kinds that some autoscaler targets, so that other kinds are skipped by their hash.
        let mut kinds: IdSet<u64> = IdSet::default();
        for t in self.scale_targets.iter() {
            if self.nodes[t.autoscaler as usize].uid.is_none() {
                continue;
            }
            let target = self.target(t.autoscaler, t.name);
            let (kind, (ns, name)) = (self.str(t.kind), target.key);
            kinds.insert(hash_strs(&[kind]));
            // Hashed by (namespace, name) like the targets, compared with the kind too.
            let key = (kind, ns, name);
            targets.insert(
                Hashed {
                    hash: target.hash,
                    key,
                },
                t.autoscaler,
            );
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if node.uid.is_none() || !kinds.contains(&node.kind_hash) {
                continue;
            }
            let Some(target) = self.ns_name(i as u32) else {
                continue;
            };
            let (ns, name) = target.key;
            let key = (self.str(node.kind), ns, name);
            for hpa in targets.get(Hashed {
                hash: target.hash,
                key,
            }) {
                link(hpa, i as u32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::json;

    #[test]
    fn hpa_scale_targets() {
        let mut hpa = object(
            "autoscaling/v2",
            "HorizontalPodAutoscaler",
            "web",
            "api",
            "h1",
        );
        hpa["spec"] = json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"}, "maxReplicas": 5});
        let objects = [
            hpa,
            deployment("web", "api", "d1", json!({})),
            workload("apps/v1", "StatefulSet", "web", "api", "sts1", json!({})),
            deployment("prod", "api", "d2", json!({})),
        ];
        assert_eq!(
            triples(&edges(&objects)),
            [("h1", "d1", EdgeType::ScaleTarget)]
        );
    }
}
