//! Owner -> owned, for every owner reference whose owner is present.

use super::hashing::{Hashed, IdMap};
use super::{EdgeType, Nodes, RawEdge, NONE};

impl Nodes {
    /// The owner edges, and each object's controller owner (its first `controller: true`
    /// reference to a present object other than itself) in `controller`.
    pub(super) fn owner_edges(
        &self,
        present: &IdMap<Hashed<&str>, u32>,
        raw: &mut Vec<RawEdge>,
        controller: &mut [u32],
    ) {
        let has_uid = |i: u32| self.nodes[i as usize].uid.is_some();
        for owner_ref in self.owners.iter().filter(|o| has_uid(o.child)) {
            let child = owner_ref.child;
            if let Some(&owner) = present.get(&self.hashed(owner_ref.uid)) {
                self.link(raw, owner, child, EdgeType::Owner);
                let self_owned = self.same_uid(owner, child);
                if owner_ref.controller && controller[child as usize] == NONE && !self_owned {
                    controller[child as usize] = owner;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::{json, Value};

    #[test]
    fn deployment_replicaset_pod_chain() {
        let (d, rs, p1, p2) = api_chain();
        let unrelated = pod("web", "other", "p9", json!({"app": "other"}));
        let objects = [
            p2.clone(),
            rs.clone(),
            d.clone(),
            p1.clone(),
            unrelated.clone(),
        ];
        use EdgeType::Owner;
        assert_eq!(
            triples(&edges(&objects)),
            [
                ("d1", "rs1", Owner),
                ("rs1", "p1", Owner),
                ("rs1", "p2", Owner)
            ]
        );
        assert_eq!(owned_closure(&[d], &[p2, rs, unrelated, p1]), [0, 1, 3]);
    }

    #[test]
    fn a_missing_link_breaks_the_ownership_chain() {
        // The ReplicaSet is gone (not listed): its Pods no longer chain to the Deployment.
        let (d, _rs, p1, p2) = api_chain();
        assert!(owned_closure(std::slice::from_ref(&d), &[p1.clone(), p2.clone()]).is_empty());
        assert!(triples(&edges(&[d, p1, p2])).is_empty());
    }

    #[test]
    fn several_owners() {
        // A non-controller owner reference is an ownership link too: either owner brings it in.
        let app = object("example.com/v1", "App", "web", "shop", "app1");
        let team = object("example.com/v1", "Team", "web", "payments", "team1");
        let mut cfg = owned(object("v1", "ConfigMap", "web", "shop-cfg", "cm1"), &app);
        let mut refs = cfg["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        refs.push(json!({"apiVersion": "example.com/v1", "kind": "Team", "name": "payments", "uid": "team1"}));
        cfg["metadata"]["ownerReferences"] = Value::Array(refs);
        use EdgeType::Owner;
        assert_eq!(
            triples(&edges(&[cfg.clone(), app.clone(), team.clone()])),
            [("app1", "cm1", Owner), ("team1", "cm1", Owner)]
        );
        assert_eq!(
            owned_closure(std::slice::from_ref(&team), std::slice::from_ref(&cfg)),
            [0]
        );
        assert_eq!(owned_closure(&[app, team], &[cfg]), [0]);
    }
}
