//! Which listed objects belong to a group through their owners: [`owned_closure`].

use std::borrow::Borrow;

use super::hashing::{id_set, Chains, Hashed, IdSet};
use super::{EdgeType, Nodes, NsName};
use crate::resources::tree::Tree;

/// Which of `candidates` belong to the group rooted at `selected` (the label-selected objects): every
/// candidate whose ownerReferences chain (transitively, through other candidates) leads to a selected object,
/// plus Endpoints named like a selected Service in the same namespace, plus EndpointSlices whose label
/// `kubernetes.io/service-name` names a selected Service in the same namespace. Returns the indices into
/// `candidates` in ascending order. Ownership cycles must not loop forever. Candidates already in `selected`
/// (same uid) are not returned.
///
/// A Service that joins the group through ownership (e.g. created by a selected custom resource) brings its
/// Endpoints and EndpointSlices along too, exactly as a selected one does: they are part of it either way.
///
/// Linear: one pass indexes candidates by owner uid and by Service, then a walk from the selected objects
/// expands each uid and each Service at most once, which is also what stops ownership cycles.
pub fn owned_closure(
    selected: &[impl Borrow<Tree> + Sync],
    candidates: &[impl Borrow<Tree> + Sync],
) -> Vec<usize> {
    let nodes = Nodes::read(candidates, false);
    // A candidate joins only through an owner reference or as a Service's Endpoints or
    // EndpointSlice: without any, nothing does, and the selected objects (often thousands,
    // where what is left over are a few) need not be read at all.
    let links =
        |r: &super::nodes::NameRef| matches!(r.kind, EdgeType::Endpoints | EdgeType::EndpointSlice);
    if nodes.owners.is_empty() && !nodes.names.iter().any(links) {
        return Vec::new();
    }
    let roots = Nodes::read(selected, false);
    // What to expand: a uid and a Service's key, of a root or of a reached candidate.
    type Expand<'a> = (Option<Hashed<&'a str>>, Option<Hashed<NsName<'a>>>);
    let mut stack: Vec<Expand> = (0..roots.len() as u32)
        .map(|i| (roots.uid(i), roots.service_key(i)))
        .collect();
    // Tables are sized up front: growing one rehashes it, at random places in memory.
    let mut selected_uids: IdSet<Hashed<&str>> = id_set(stack.len());
    selected_uids.extend(stack.iter().filter_map(|(uid, _)| *uid));
    let mut children: Chains<&str> = Chains::with_capacity(nodes.owners.len());
    for owner in &nodes.owners {
        children.insert(nodes.hashed(owner.uid), owner.child);
    }
    let mut service_parts: Chains<NsName> = Chains::new();
    for r in &nodes.names {
        if matches!(r.kind, EdgeType::Endpoints | EdgeType::EndpointSlice) {
            service_parts.insert(nodes.target(r.object, r.target), r.object);
        }
    }

    // 0 = not reached, 1 = included, 2 = reached but selected itself (same uid), so not returned.
    let mut reached = vec![0u8; nodes.len()];
    let mut expanded_uids: IdSet<Hashed<&str>> = id_set(roots.len() + nodes.len());
    let mut expanded_services: IdSet<Hashed<NsName>> = IdSet::default();
    while let Some((uid, service)) = stack.pop() {
        let owned = uid
            .filter(|u| expanded_uids.insert(*u))
            .into_iter()
            .flat_map(|u| children.get(u));
        let parts = service
            .filter(|key| expanded_services.insert(*key))
            .into_iter()
            .flat_map(|key| service_parts.get(key));
        for i in owned.chain(parts) {
            if reached[i as usize] != 0 {
                continue;
            }
            let uid = nodes.uid(i);
            if uid.is_some_and(|u| selected_uids.contains(&u)) {
                reached[i as usize] = 2;
            } else {
                reached[i as usize] = 1;
                stack.push((uid, nodes.service_key(i)));
            }
        }
    }
    (0..nodes.len()).filter(|&i| reached[i] == 1).collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::json;

    #[test]
    fn owner_outside_the_group() {
        let (d, rs, p1, _) = api_chain();
        let gone = deployment("web", "gone", "d-gone", json!({}));
        let orphan_rs = replicaset(&gone, "gone-1", "rs-gone", json!({}));
        let orphan_pod = owned(pod("web", "gone-1-a", "p-gone", json!({})), &orphan_rs);
        // The missing owner gets no edge; the present pair still does.
        assert_eq!(
            triples(&edges(&[orphan_rs.clone(), orphan_pod.clone()])),
            [("rs-gone", "p-gone", EdgeType::Owner)]
        );

        let other = deployment("web", "other", "d2", json!({}));
        let foreign_rs = replicaset(&other, "other-1", "rs2", json!({}));
        let foreign_pod = owned(pod("web", "other-1-a", "p2x", json!({})), &foreign_rs);
        let candidates = [orphan_pod, rs, p1, foreign_rs, foreign_pod];
        // Only what chains (through candidates) to the selected Deployment.
        assert_eq!(owned_closure(&[d], &candidates), [1, 2]);
        assert!(owned_closure(&[], &candidates).is_empty());
    }

    #[test]
    fn cronjob_job_pod_transitive() {
        let cron = object("batch/v1", "CronJob", "ops", "backup", "cj1");
        let job = owned(
            object("batch/v1", "Job", "ops", "backup-123", "job1"),
            &cron,
        );
        let run = owned(pod("ops", "backup-123-x", "pod1", json!({})), &job);
        let stranger = object("batch/v1", "Job", "ops", "manual", "job2");
        // Pod listed before its Job: order of candidates must not matter.
        assert_eq!(
            owned_closure(
                std::slice::from_ref(&cron),
                &[run.clone(), stranger.clone(), job.clone()]
            ),
            [0, 2]
        );
        assert_eq!(
            triples(&edges(&[run, job, cron, stranger])),
            [
                ("cj1", "job1", EdgeType::Owner),
                ("job1", "pod1", EdgeType::Owner)
            ]
        );
    }

    #[test]
    fn endpoints_and_slices_of_selected_service() {
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        let candidates = [
            object("v1", "Endpoints", "web", "api", "e1"),
            object("v1", "Endpoints", "prod", "api", "e2"),
            object("v1", "Endpoints", "web", "db", "e3"),
            slice("web", "api-abc", "es1", "api"),
            slice("prod", "api-abc", "es2", "api"),
            object(
                "discovery.k8s.io/v1",
                "EndpointSlice",
                "web",
                "api-x",
                "es3",
            ),
            svc.clone(),
        ];
        assert_eq!(
            owned_closure(std::slice::from_ref(&svc), &candidates),
            [0, 3]
        );

        // A CRD named "Service" (Knative) does not claim the core Endpoints.
        let knative = object("serving.knative.dev/v1", "Service", "web", "api", "k1");
        assert!(owned_closure(&[knative], &candidates).is_empty());

        // A Service that joins through ownership brings its Endpoints along.
        let app = object("example.com/v1", "App", "web", "shop", "cr1");
        let owned_svc = owned(service("web", "shop", "s2", json!({"app": "shop"})), &app);
        let shop_eps = object("v1", "Endpoints", "web", "shop", "e4");
        let shop_slice = owned(slice("web", "shop-1", "es4", "shop"), &owned_svc);
        assert_eq!(
            owned_closure(&[app], &[shop_eps, shop_slice, owned_svc]),
            [0, 1, 2]
        );
    }

    #[test]
    fn ownership_cycles() {
        let a = object("example.com/v1", "Thing", "ns", "a", "a");
        let b = object("example.com/v1", "Thing", "ns", "b", "b");
        let c = object("example.com/v1", "Thing", "ns", "c", "c");
        let a = owned(a, &b);
        let b = owned(b, &a);
        let c = owned(owned(c.clone(), &c), &a);
        use EdgeType::Owner;
        assert_eq!(
            triples(&edges(&[a.clone(), b.clone(), c.clone()])),
            [("a", "b", Owner), ("a", "c", Owner), ("b", "a", Owner)]
        );
        assert_eq!(
            owned_closure(std::slice::from_ref(&a), &[b.clone(), c.clone(), a.clone()]),
            [0, 1]
        );
        // A cycle not reachable from the selection stays out.
        let x = object("v1", "ConfigMap", "ns", "x", "x");
        assert!(owned_closure(&[x], &[a.clone(), b.clone()]).is_empty());
        // Entering the cycle from one member reaches the rest, then stops.
        assert_eq!(owned_closure(&[b], &[a, c]), [0, 1]);
    }

    #[test]
    fn closure_of_a_realistic_environment() {
        // Labelled: Deployment, Service, StatefulSet, CronJob; everything else joins by owner
        // references or by Service name. Objects of another environment stay out.
        let (d, rs, p1, p2) = api_chain();
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        let eps = object("v1", "Endpoints", "web", "api", "e1");
        let es = owned(slice("web", "api-x", "es1", "api"), &svc);
        let db = workload(
            "apps/v1",
            "StatefulSet",
            "web",
            "db",
            "sts1",
            json!({"app": "db"}),
        );
        let db0 = owned(pod("web", "db-0", "db0", json!({"app": "db"})), &db);
        let pvc = object("v1", "PersistentVolumeClaim", "web", "data-db-0", "pvc1");
        let cron = object("batch/v1", "CronJob", "web", "backup", "cj1");
        let job = owned(object("batch/v1", "Job", "web", "backup-1", "job1"), &cron);
        let run = owned(pod("web", "backup-1-x", "jp1", json!({})), &job);
        let (other_d, other_rs, other_p, _) = {
            let d = deployment("web", "other", "d9", json!({"app": "other"}));
            let rs = replicaset(&d, "other-1", "rs9", json!({"app": "other"}));
            let p = owned(pod("web", "other-1-a", "p9", json!({"app": "other"})), &rs);
            (d, rs, p, ())
        };
        let selected = [d, svc, db, cron];
        let candidates = [
            p1, rs, p2, eps, es, db0, pvc, job, run, other_d, other_rs, other_p,
        ];
        // The claim of a StatefulSet has no owner reference (unless its retention policy
        // adds one): it joins the group only if labelled.
        assert_eq!(
            owned_closure(&selected, &candidates),
            [0, 1, 2, 3, 4, 5, 7, 8]
        );
    }
}
