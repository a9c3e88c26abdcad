//! Dependency graph over live Kubernetes objects, Argo CD style.
//!
//! Pure functions over objects as [`Tree`](crate::resources::tree::Tree)s: no I/O, no panics on malformed input, output in a deterministic
//! order whatever the input order, and linear work: everything is hash-indexed (by uid, by
//! `(namespace, name)`, by label pair), never a quadratic scan; only the edges' final sort is `n log n`.
//!
//! On 100k objects the cost is cache misses, not arithmetic, so the code is shaped for that. Each object's
//! tree is read once, in order ([`Nodes`]): its maps walked once rather than probed key by key, and what the
//! graph needs (uids, names, owners, references, labels) copied into a few compact vectors, while the next
//! objects' trees are prefetched ([`super::tree::prefetched`]). The passes that index and link work on those
//! copies, which are a tenth of the size of the trees. Hashes are computed by the pass that needs them, and
//! indexes keep them so that strings are only compared on a full-hash hit. Indexes are chains in one `Vec`,
//! not a `Vec` per key. An earlier straightforward version (SipHash maps of `Vec`s, key lookups per field)
//! was ~2.5x slower; one that read each tree in each pass, half as fast at 100k objects.
//!
//! Core kinds (`Service`, `Endpoints`, `Pod`, `PersistentVolumeClaim`) are recognised only with
//! `apiVersion: v1` (or no apiVersion), so that a CRD reusing the kind name (e.g. a Knative `Service`) is not
//! mistaken for one.
//!
//! One file per concern: `nodes` reads the objects, `closure` follows owners to find a group's
//! members, and one file per kind of edge links them (`owners`, `endpoints`, `selector`,
//! `ingress`, `claims`, `scale_target`); `hashing` holds the indexes they share.

mod claims;
mod closure;
mod endpoints;
mod hashing;
mod ingress;
mod nodes;
mod owners;
mod scale_target;
mod selector;
#[cfg(test)]
mod testing;

use std::cmp::Ordering;

pub use closure::owned_closure;
pub(crate) use endpoints::SERVICE_NAME_LABEL;
use hashing::{Chains, Hashed, IdMap};
pub use nodes::Nodes;
use nodes::Role;

use super::join;

/// Why a parent links to a child. The order matters: when several relations link the same pair, only the
/// first in this order is kept (an owner reference says the most).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum EdgeType {
    Owner,
    EndpointSlice,
    Endpoints,
    ServiceSelector,
    IngressBackend,
    VolumeClaim,
    ScaleTarget,
    /// A GitOps source (Flux Kustomization or HelmRelease, Argo CD Application) and what it
    /// applied (`crate::k8s::gitops`).
    Applies,
}

/// A directed link from parent to child, as indices into the objects the graph was built from.
///
/// Indices, not uids: a group of 100,000 objects has about as many edges, and copying two uids
/// into new strings for each was a third of the graph's time. Whoever shows an edge has the
/// objects, and with them the uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Edge {
    pub from: u32,
    pub to: u32,
    pub kind: EdgeType,
}

/// End of an index chain / no object. Object indices are `u32` to keep the indexes small.
const NONE: u32 = u32::MAX;

/// `(namespace, name)`; cluster-scoped objects have namespace `""`.
type NsName<'a> = (&'a str, &'a str);

/// An edge under construction: node indices plus the uid prefixes that order most pairs without reading the
/// uid strings.
struct RawEdge {
    from_prefix: u64,
    to_prefix: u64,
    from: u32,
    to: u32,
    kind: EdgeType,
}

impl Nodes {
    /// The dependency graph among the objects, parent to child: owner references first (owner -> owned, only
    /// when both are present), then: Service -> EndpointSlice (label `kubernetes.io/service-name`, same
    /// namespace), Service -> Endpoints (same name and namespace), Service -> workload (Deployment,
    /// StatefulSet, DaemonSet, ReplicaSet, Pod, Job, and any object with `spec.template.metadata.labels`)
    /// when the Service's non-empty `spec.selector` matches the workload's pod template labels (for a Pod: its
    /// own labels), same namespace; Ingress -> Service for every backend service name (v1 and the old
    /// `serviceName` form); Pod -> PersistentVolumeClaim for `spec.volumes[].persistentVolumeClaim.claimName`
    /// (same namespace; only Pods, not StatefulSet claim templates); HorizontalPodAutoscaler -> its
    /// `spec.scaleTargetRef` (kind + name, same namespace).
    ///
    /// Service selectors link only the top-most matching workload of each ownership chain: a matching object
    /// is skipped when its controller owner matches the same Service too. A Deployment, its ReplicaSets and
    /// their Pods usually all match, and Argo CD likewise draws one Service -> Deployment edge rather than a
    /// fan-out to every Pod; the Pods stay reachable through the owner edges. A bare Pod, or a Pod whose owner
    /// is absent or does not match, is still linked directly.
    ///
    /// Edges are sorted (by the uids of from and to, then kind) and at most one edge links a pair: when
    /// several relations hold, the first in [`EdgeType`] order wins, so an EndpointSlice owned by its Service
    /// gets one `Owner` edge. An edge never points from an object to itself. Objects without a uid are not
    /// nodes. Nodes read without `links` give the ownership and Endpoints edges only.
    pub fn edges(&self) -> Vec<Edge> {
        // The selector matches are found beside the references; only picking the top-most
        // needs both. What the other thread fills is allocated here, as in `read_with`.
        let mut matches = Vec::with_capacity(self.workloads.len());
        let mut raw =
            Vec::with_capacity(self.owners.len() + self.names.len() + self.selectors.len());
        let mut controller = vec![NONE; self.nodes.len()];
        join(
            self.nodes.len() >= crate::resources::PARALLEL_FROM,
            || self.service_matches(&mut matches),
            || self.references(&mut raw, &mut controller),
        );
        for (service, workload) in selector::topmost(&matches, &controller) {
            self.link(&mut raw, service, workload, EdgeType::ServiceSelector);
        }

        let cmp_uid = |a: u32, a_prefix: u64, b: u32, b_prefix: u64| {
            if a == b {
                Ordering::Equal
            } else {
                a_prefix
                    .cmp(&b_prefix)
                    .then_with(|| self.uid_str(a).cmp(self.uid_str(b)))
            }
        };
        raw.sort_unstable_by(|a, b| {
            cmp_uid(a.from, a.from_prefix, b.from, b.from_prefix)
                .then_with(|| cmp_uid(a.to, a.to_prefix, b.to, b.to_prefix))
                .then(a.kind.cmp(&b.kind))
        });
        raw.dedup_by(|later, first| {
            cmp_uid(later.from, later.from_prefix, first.from, first.from_prefix).is_eq()
                && cmp_uid(later.to, later.to_prefix, first.to, first.to_prefix).is_eq()
        });
        raw.into_iter()
            .map(|e| Edge {
                from: e.from,
                to: e.to,
                kind: e.kind,
            })
            .collect()
    }

    /// Adds the edge `from` -> `to` unless both are the same object.
    fn link(&self, raw: &mut Vec<RawEdge>, from: u32, to: u32, kind: EdgeType) {
        if !self.same_uid(from, to) {
            raw.push(RawEdge {
                from_prefix: self.nodes[from as usize].prefix,
                to_prefix: self.nodes[to as usize].prefix,
                from,
                to,
                kind,
            });
        }
    }

    /// The edges of owner references, of names (Endpoints, EndpointSlices, Ingress backends,
    /// claims) and of scale targets; each object's controller owner, for [`selector::topmost`].
    fn references(&self, raw: &mut Vec<RawEdge>, controller: &mut [u32]) {
        let nodes = &self.nodes;
        let mut present: IdMap<Hashed<&str>, u32> = IdMap::default();
        present.reserve(nodes.len());
        let mut services: Chains<NsName> = Chains::new();
        let mut claims: Chains<NsName> = Chains::new();
        for i in 0..nodes.len() as u32 {
            let Some(uid) = self.uid(i) else { continue };
            present.entry(uid).or_insert(i);
            match nodes[i as usize].role {
                Role::Service => services.insert_some(self.ns_name(i), i),
                Role::Claim => claims.insert_some(self.ns_name(i), i),
                _ => {}
            }
        }
        self.owner_edges(&present, raw, controller);
        self.service_part_edges(&services, raw);
        self.backend_edges(&services, raw);
        self.claim_edges(&claims, raw);
        self.scale_target_edges(|hpa, target| self.link(raw, hpa, target, EdgeType::ScaleTarget));
    }

    /// `(object, target)` for each reference by name of `kind` (see [`nodes::NameRef`]) from an
    /// object with a uid to one of `targets` in the object's namespace.
    fn resolve_names<'a>(
        &'a self,
        kind: EdgeType,
        targets: &'a Chains<NsName<'a>>,
    ) -> impl Iterator<Item = (u32, u32)> + 'a {
        self.names
            .iter()
            .filter(move |r| r.kind == kind && self.nodes[r.object as usize].uid.is_some())
            .flat_map(move |r| {
                let object = r.object;
                targets
                    .get(self.target(object, r.target))
                    .map(move |target| (object, target))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::endpoints::SERVICE_NAME_LABEL;
    use super::testing::*;
    use super::{EdgeType, Nodes};
    use crate::resources::tree::{Tree, TreeBuf};
    use serde_json::{json, Value};
    use std::time::{Duration, Instant};

    /// Deterministic shuffle (xorshift + Fisher-Yates), so the test needs no rand crate.
    fn shuffle<T>(items: &mut [T], mut seed: u64) {
        for i in (1..items.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            items.swap(i, (seed % (i as u64 + 1)) as usize);
        }
    }

    #[test]
    fn deterministic_order() {
        let (d, rs, p1, p2) = api_chain();
        let mut hpa = object(
            "autoscaling/v2",
            "HorizontalPodAutoscaler",
            "web",
            "api",
            "h1",
        );
        hpa["spec"] = json!({"scaleTargetRef": {"kind": "Deployment", "name": "api"}});
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        let objects = vec![
            d.clone(),
            rs,
            p1,
            p2,
            hpa,
            svc.clone(),
            owned(slice("web", "api-1", "es1", "api"), &svc),
            object("v1", "Endpoints", "web", "api", "e1"),
            pod("web", "bare", "bare", json!({"app": "api"})),
            json!({"kind": "Ingress", "metadata": {"namespace": "web", "uid": "i1"},
                   "spec": {"defaultBackend": {"service": {"name": "api"}}}}),
        ];
        let expected = edges(&objects);
        assert_eq!(expected.len(), 9);
        let selected = [d, svc];
        let closure_uids = |objs: &[Value]| {
            let idx = owned_closure(&selected, objs);
            assert!(idx.windows(2).all(|w| w[0] < w[1]));
            let mut uids: Vec<String> = idx
                .iter()
                .map(|&i| objs[i]["metadata"]["uid"].as_str().unwrap().to_owned())
                .collect();
            uids.sort();
            uids
        };
        let expected_closure = closure_uids(&objects);
        assert_eq!(expected_closure, ["e1", "es1", "p1", "p2", "rs1"]);
        for seed in 1..=8u64 {
            let mut shuffled = objects.clone();
            shuffle(&mut shuffled, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            assert_eq!(edges(&shuffled), expected, "seed {seed}");
            assert_eq!(closure_uids(&shuffled), expected_closure, "seed {seed}");
        }
    }

    #[test]
    fn malformed_objects_do_not_panic() {
        let objects = vec![
            Value::Null,
            json!(42),
            json!("pod"),
            json!([]),
            json!({}),
            json!({"metadata": 5}),
            json!({"kind": 7, "metadata": {"uid": 5, "name": ["x"], "namespace": {}}}),
            json!({"kind": "Pod", "metadata": {"uid": "m1", "ownerReferences": "nope", "labels": "x"},
                   "spec": {"volumes": "x"}}),
            json!({"kind": "Pod", "metadata": {"uid": "m2", "name": "m2",
                   "ownerReferences": [null, 3, {"uid": 7}, {"name": "x"}, {"uid": ""}, {"uid": "m1", "controller": "yes"}]},
                   "spec": {"volumes": [null, {"persistentVolumeClaim": 3}, {"persistentVolumeClaim": {"claimName": 4}}]}}),
            json!({"kind": "Pod", "metadata": {"uid": "m2b", "ownerReferences": {"uid": "m1"}}}),
            json!({"kind": "Service", "metadata": {"uid": "m3", "name": "s"}, "spec": {"selector": "app=x"}}),
            json!({"kind": "Service", "metadata": {"uid": "m4", "name": "s"}, "spec": {"selector": {"app": 1}}}),
            json!({"kind": "Service", "metadata": {"uid": "m5"}, "spec": {"selector": {"app": "x"}}}),
            json!({"kind": "Deployment", "metadata": {"uid": "m6"}, "spec": {"template": "x"}}),
            json!({"kind": "Deployment", "metadata": {"uid": "m7"}, "spec": {"template": {"metadata": {"labels": {"app": ["x"]}}}}}),
            json!({"kind": "Ingress", "metadata": {"uid": "m8"}, "spec": {"rules": "x", "defaultBackend": 3}}),
            json!({"kind": "Ingress", "metadata": {"uid": "m9"},
                   "spec": {"backend": {"service": 1}, "rules": [null, {"http": 3}, {"http": {"paths": [null, {"backend": 5}]}}]}}),
            json!({"kind": "HorizontalPodAutoscaler", "metadata": {"uid": "m10"}, "spec": {"scaleTargetRef": "x"}}),
            json!({"kind": "HorizontalPodAutoscaler", "metadata": {"uid": "m11"}}),
            json!({"kind": "EndpointSlice", "metadata": {"uid": "m12", "labels": {SERVICE_NAME_LABEL: 5}}}),
            json!({"kind": "Endpoints", "metadata": {"uid": "m13"}}),
            json!({"kind": "Endpoints", "metadata": {"uid": "m14", "name": "s"}}),
        ];
        // m14 is named like Service m3/m4 (same namespace ""), the only other valid link is m1 -> m2.
        assert_eq!(
            triples(&edges(&objects)),
            [
                ("m1", "m2", EdgeType::Owner),
                ("m3", "m14", EdgeType::Endpoints),
                ("m4", "m14", EdgeType::Endpoints),
            ]
        );
        assert!(owned_closure(&objects, &objects).is_empty());
        assert_eq!(owned_closure(&objects[7..8], &objects), [8]);
        assert_eq!(owned_closure(&objects[10..11], &objects), [21]);
        assert!(owned_closure(&objects[..7], &objects).is_empty());
        assert!(edges(&[]).is_empty());
        assert!(owned_closure(&[], &[]).is_empty());
    }

    /// A UUID-shaped uid like the API server's (random v4), derived from `n` so runs are repeatable.
    fn uuid(n: u64) -> String {
        let mut x = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut next = || {
            x ^= x >> 30;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 27;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        let (a, b) = (next(), next());
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            b >> 52,
            b & 0xffff_ffff_ffff
        )
    }

    /// 10,000 apps x 10 objects = 100,000 objects spread over 100 namespaces: Deployment, ReplicaSet,
    /// 3 Pods, Service (selector on a per-app and a shared label), EndpointSlice owned by the Service,
    /// Endpoints, HPA and Ingress.
    fn large_cluster() -> Vec<Value> {
        let mut objects = Vec::with_capacity(100_000);
        let mut ids = (0..).map(uuid);
        let mut uid = move || ids.next().unwrap_or_default();
        for a in 0..10_000 {
            let ns = format!("ns-{}", a % 100);
            let app = format!("app-{a}");
            let labels = json!({"app": app, "tier": "web"});
            let pod_labels = json!({"app": app, "tier": "web", "pod-template-hash": "abc"});
            let d = deployment(&ns, &app, &uid(), labels.clone());
            let rs = replicaset(&d, &format!("{app}-abc"), &uid(), pod_labels.clone());
            for p in 0..3 {
                let name = format!("{app}-abc-{p}");
                objects.push(owned(pod(&ns, &name, &uid(), pod_labels.clone()), &rs));
            }
            let svc = service(&ns, &app, &uid(), labels);
            objects.push(owned(slice(&ns, &format!("{app}-x"), &uid(), &app), &svc));
            objects.push(object("v1", "Endpoints", &ns, &app, &uid()));
            let mut hpa = object(
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                &ns,
                &app,
                &uid(),
            );
            hpa["spec"] = json!({"scaleTargetRef": {"kind": "Deployment", "name": app}});
            objects.push(hpa);
            let mut ingress = object("networking.k8s.io/v1", "Ingress", &ns, &app, &uid());
            ingress["spec"] =
                json!({"rules": [{"http": {"paths": [{"backend": {"service": {"name": app}}}]}}]});
            objects.push(ingress);
            objects.extend([d, rs, svc]);
        }
        objects
    }

    /// Prints timings with `--nocapture` (meaningful in release); `GRAPH_BENCH_RUNS=N` adds the best of N runs.
    #[test]
    fn hundred_thousand_objects() {
        let objects = trees(&large_cluster());
        assert_eq!(objects.len(), 100_000);
        let selected: Vec<TreeBuf> = objects
            .iter()
            .filter(|o| {
                matches!(
                    o.get("kind").and_then(Tree::as_str),
                    Some("Deployment" | "Service")
                )
            })
            .cloned()
            .collect();

        let runs: usize = std::env::var("GRAPH_BENCH_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let (mut best_closure, mut best_edges) = (Duration::MAX, Duration::MAX);
        for _ in 0..runs {
            let start = Instant::now();
            let closure = std::hint::black_box(super::owned_closure(&selected, &objects));
            best_closure = best_closure.min(start.elapsed());
            let start = Instant::now();
            let graph = std::hint::black_box(Nodes::read(&objects, true).edges());
            best_edges = best_edges.min(start.elapsed());
            drop((closure, graph));
        }
        if runs > 0 {
            println!("best of {runs}: owned_closure {best_closure:?}, edges {best_edges:?}");
        }
        let start = Instant::now();
        let closure = super::owned_closure(&selected, &objects);
        let closure_time = start.elapsed();
        let start = Instant::now();
        let graph = Nodes::read(&objects, true).edges();
        let edges_time = start.elapsed();
        println!(
            "100k objects: owned_closure {closure_time:?}, edges {edges_time:?}, total {:?}",
            closure_time + edges_time
        );

        // ReplicaSet, 3 Pods, EndpointSlice, Endpoints per app; selected objects are not returned.
        assert_eq!(closure.len(), 60_000);
        let count = |kind: EdgeType| graph.iter().filter(|e| e.kind == kind).count();
        // D->RS, RS->3 Pods, Service->EndpointSlice (owner wins over the label).
        assert_eq!(count(EdgeType::Owner), 50_000);
        assert_eq!(count(EdgeType::EndpointSlice), 0);
        assert_eq!(count(EdgeType::Endpoints), 10_000);
        // Only Service -> Deployment: ReplicaSets and Pods sit under a matching controller.
        assert_eq!(count(EdgeType::ServiceSelector), 10_000);
        assert_eq!(count(EdgeType::IngressBackend), 10_000);
        assert_eq!(count(EdgeType::ScaleTarget), 10_000);
        assert_eq!(graph.len(), 90_000);
    }
}
