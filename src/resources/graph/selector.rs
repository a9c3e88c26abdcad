//! Service -> workload: a Service's selector matching a workload's pod template labels (a
//! Pod's own labels), linked to the top-most match of each ownership chain.

use super::hashing::{hash_strs, Hashed, IdMap, IdSet};
use super::nodes::{Labels, Pair};
use super::{Nodes, NONE};

impl Nodes {
    /// `(service, workload)` for every Service whose selector matches a workload's labels, in
    /// `matches`, sorted.
    ///
    /// Each Service is indexed under one pair of its selector, the one fewest selectors share (a per-app label
    /// rather than `tier: web`); each workload then looks up its own labels in that small index and fully
    /// checks only the Services found. Cost: one pass over workload labels plus the checks, instead of
    /// services x workloads.
    pub(super) fn service_matches(&self, matches: &mut Vec<(u32, u32)>) {
        let has_uid = |l: &&Labels| self.nodes[l.object as usize].uid.is_some();
        let selectors: Vec<Labels> = self.selectors.iter().filter(has_uid).copied().collect();
        if selectors.is_empty() {
            return;
        }
        let namespace = |i: u32| self.str(self.nodes[i as usize].namespace);
        let pair_hash = |object: u32, pair: &Pair| {
            hash_strs(&[namespace(object), self.str(pair.key), self.str(pair.value)])
        };
        // Collisions only blur this heuristic, so counting by hash alone is fine.
        let mut pair_use: IdMap<u64, u32> = IdMap::default();
        for &s in &selectors {
            for pair in self.pairs_of(s) {
                *pair_use.entry(pair_hash(s.object, pair)).or_default() += 1;
            }
        }
        let mut index: IdMap<u64, Vec<u32>> = IdMap::default();
        let mut keys: IdSet<Hashed<&str>> = IdSet::default();
        for (s, &service) in selectors.iter().enumerate() {
            let rarest = self
                .pairs_of(service)
                .iter()
                .map(|pair| (pair, pair_hash(service.object, pair)))
                .min_by_key(|(_, hash)| pair_use.get(hash).copied().unwrap_or(0));
            if let Some((pair, hash)) = rarest {
                index.entry(hash).or_default().push(s as u32);
                keys.insert(self.hashed(pair.key));
            }
        }

        for &workload in self.workloads.iter().filter(has_uid) {
            let (w, labels) = (workload.object, self.pairs_of(workload));
            for label in labels {
                if !keys.contains(&self.hashed(label.key)) {
                    continue;
                }
                for &s in index.get(&pair_hash(w, label)).into_iter().flatten() {
                    let service = selectors[s as usize];
                    if namespace(service.object) == namespace(w)
                        && self.selector_matches(self.pairs_of(service), labels)
                    {
                        matches.push((service.object, w));
                    }
                }
            }
        }
        matches.sort_unstable();
        matches.dedup();
    }

    fn pairs_of(&self, labels: Labels) -> &[Pair] {
        &self.pairs[labels.start as usize..labels.end as usize]
    }

    /// Whether every pair of `selector` is among `labels`.
    fn selector_matches(&self, selector: &[Pair], labels: &[Pair]) -> bool {
        selector.iter().all(|wanted| {
            labels
                .iter()
                .find(|label| self.str(label.key) == self.str(wanted.key))
                .is_some_and(|label| self.str(label.value) == self.str(wanted.value))
        })
    }
}

/// The `(service, workload)` matches to link: the top-most per ownership chain, a workload
/// being left out when its controller matches the same Service.
pub(super) fn topmost(matches: &[(u32, u32)], controller: &[u32]) -> Vec<(u32, u32)> {
    // matched_by[w] == s marks workload w as matched by Service s: O(1) "does my controller match too".
    let mut matched_by = vec![NONE; controller.len()];
    let mut topmost = Vec::with_capacity(matches.len());
    for group in matches.chunk_by(|a, b| a.0 == b.0) {
        for &(s, w) in group {
            matched_by[w as usize] = s;
        }
        for &(s, w) in group {
            let owner = controller[w as usize];
            if owner == NONE || matched_by[owner as usize] != s {
                topmost.push((s, w));
            }
        }
    }
    topmost
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::json;

    #[test]
    fn service_selectors() {
        let (d, rs, p1, p2) = api_chain();
        let bare = pod("web", "debug", "bare", json!({"app": "api"}));
        let db = workload(
            "apps/v1",
            "StatefulSet",
            "web",
            "db",
            "sts1",
            json!({"app": "db"}),
        );
        let db_pod = owned(
            pod(
                "web",
                "db-0",
                "db0",
                json!({"app": "db", "statefulset.kubernetes.io/pod-name": "db-0"}),
            ),
            &db,
        );
        let rollout = workload(
            "argoproj.io/v1alpha1",
            "Rollout",
            "web",
            "canary",
            "ro1",
            json!({"app": "canary"}),
        );
        let cron = object("batch/v1", "CronJob", "web", "api-cron", "cj1");
        let mut prod = deployment("prod", "api", "d-prod", json!({"app": "api"}));
        prod["metadata"]["labels"] = json!({"app": "api"});
        let services = [
            service("web", "api", "s-api", json!({"app": "api"})),
            service("web", "none", "s-none", json!({"app": "nothing"})),
            service("web", "empty", "s-empty", json!({})),
            object("v1", "Service", "web", "headless", "s-nospec"),
            service("other", "api", "s-other", json!({"app": "api"})),
            service(
                "web",
                "hash",
                "s-hash",
                json!({"app": "api", "pod-template-hash": "7f"}),
            ),
            service(
                "web",
                "db-0",
                "s-db0",
                json!({"statefulset.kubernetes.io/pod-name": "db-0"}),
            ),
            service("web", "db", "s-db", json!({"app": "db"})),
            service("web", "canary", "s-canary", json!({"app": "canary"})),
        ];
        let mut objects = vec![d, rs, p1, p2, bare, db, db_pod, rollout, cron, prod];
        objects.extend(services);
        let graph = edges(&objects);
        let selector_edges: Vec<_> = triples(&graph)
            .into_iter()
            .filter(|e| e.2 == EdgeType::ServiceSelector)
            .map(|(from, to, _)| (from, to))
            .collect();
        assert_eq!(
            selector_edges,
            [
                // Top-most only: not rs1, p1, p2 (their controllers match too), but the bare Pod.
                ("s-api", "bare"),
                ("s-api", "d1"),
                ("s-canary", "ro1"),
                ("s-db", "sts1"),
                // The StatefulSet template lacks the per-pod label: the Pod itself is the top-most match.
                ("s-db0", "db0"),
                // The Deployment template lacks the hash: the ReplicaSet is top-most.
                ("s-hash", "rs1"),
            ]
        );
    }

    #[test]
    fn selector_links_the_topmost_present_workload() {
        // Without its Deployment in the group, the ReplicaSet is the top-most match; its Pods
        // stay under it.
        let (_d, rs, p1, p2) = api_chain();
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        use EdgeType::{Owner, ServiceSelector};
        assert_eq!(
            triples(&edges(&[p1, p2, rs, svc])),
            [
                ("rs1", "p1", Owner),
                ("rs1", "p2", Owner),
                ("s1", "rs1", ServiceSelector)
            ]
        );
    }

    #[test]
    fn selector_skips_only_pods_whose_controller_matches() {
        // A Job (controller: a CronJob, which has no pod template of its own) is top-most; a
        // Pod whose controller's template does not match is linked directly.
        let cron = object("batch/v1", "CronJob", "ops", "report", "cj1");
        let job = owned(
            workload(
                "batch/v1",
                "Job",
                "ops",
                "report-1",
                "job1",
                json!({"app": "report"}),
            ),
            &cron,
        );
        let run = owned(
            pod("ops", "report-1-x", "pod1", json!({"app": "report"})),
            &job,
        );
        let other = workload(
            "apps/v1",
            "ReplicaSet",
            "ops",
            "other",
            "rs9",
            json!({"app": "other"}),
        );
        let adopted = owned(
            pod("ops", "adopted", "pod2", json!({"app": "report"})),
            &other,
        );
        let svc = service("ops", "report", "s1", json!({"app": "report"}));
        let graph = edges(&[cron, job, run, other, adopted, svc]);
        let selector_edges: Vec<_> = triples(&graph)
            .into_iter()
            .filter(|e| e.2 == EdgeType::ServiceSelector)
            .collect();
        assert_eq!(
            selector_edges,
            [
                ("s1", "job1", EdgeType::ServiceSelector),
                ("s1", "pod2", EdgeType::ServiceSelector)
            ]
        );
    }

    #[test]
    fn self_controlled_and_duplicated_objects() {
        // A workload naming itself as controller is still linked by its Service, and gets no self edge.
        let d = deployment("web", "api", "d1", json!({"app": "api"}));
        let d = owned(d.clone(), &d);
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        // The same objects twice (e.g. listed by two watches) still give each edge once.
        let objects = [d.clone(), svc.clone(), d, svc];
        assert_eq!(
            triples(&edges(&objects)),
            [("s1", "d1", EdgeType::ServiceSelector)]
        );
    }
}
