//! The pure pipeline behind `Environment.resourceGroup`, over a generated environment held in
//! memory: `owned_closure` (selected: the labelled top-level objects; candidates: everything),
//! `edges` over the group, `health` of every object and their `aggregate`.
//!
//! `cargo bench --bench resources` (N = 1,000, 10,000 and 100,000 objects; a few minutes).
//! `cargo bench --bench resources -- 100000` measures one size (all are still generated).
//!
//! The objects are held as the service holds them: each parsed from its JSON text into a
//! compact tree of the fields the pipeline reads (`kept`, in wall time, and `kept-cpu`, in the
//! process' CPU time, which other processes on a shared machine cannot stretch); the
//! closure's candidates, as `fetch` holds them, only their head (type, names, uid, labels,
//! owner references), since `fetch` parses the rest only of those that belong. From 2,000
//! objects on the pipeline reads each half of the objects on a thread of its own, so `kept` is
//! below `kept-cpu`. `whole-cpu` runs the same pipeline on the whole objects in the same trees,
//! candidates whole too, in the same run.
//!
//! `cold` runs the same pipeline in wall time over copies of the same objects, a different
//! copy each run, so that at every size the objects come from memory rather than the caches:
//! the time per object then shows the work per object, which `kept` shows only for sizes
//! beyond the caches.
//!
//! `PIPELINE_RUNS=N,K` runs the pipeline K times over N objects and exits, without criterion:
//! `benches/resources_work.sh` counts its instructions and cache misses under cachegrind.
//!
//! The environment is what a GitLab-deployed app looks like in its namespace: Deployments with
//! their current and an old ReplicaSet and their Pods, Services with an EndpointSlice and
//! Endpoints, Ingresses, HorizontalPodAutoscalers, ConfigMaps, StatefulSets with their Pods and
//! PersistentVolumeClaims, CronJobs with their Jobs and Pods, and cert-manager Certificates,
//! with full statuses (conditions, container statuses) shaped like a cluster's answers and a
//! few objects in every unhealthy state. Every object belongs to the group, the worst case.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use envlens::resources::graph::owned_closure;
use envlens::resources::group::edges_and_health;
use envlens::resources::health::{aggregate, health_with, Customizations};
use envlens::resources::object;
use envlens::resources::tree::{Tree, TreeBuf};
use serde_json::{json, Value};

/// The service's allocator (src/main.rs), so that the figures are the service's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROJECT_LABEL: &str = "app.gitlab.com/project_id";
const ENVIRONMENT_LABEL: &str = "app.gitlab.com/environment_slug";

/// Deterministic UUID-shaped uids, like the API server's random ones.
struct Uids(std::cell::Cell<u64>);

impl Uids {
    fn next(&self) -> String {
        let mix = || {
            self.0.set(self.0.get().wrapping_add(0x9E37_79B9_7F4A_7C15));
            let mut x = self.0.get();
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        let (a, b) = (mix(), mix());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            (b >> 48) & 0x3fff | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }
}

struct Env {
    namespace: String,
    uids: Uids,
    objects: Vec<Value>,
}

const TIME: &str = "2024-05-01T10:00:00Z";

impl Env {
    fn meta(&self, name: &str, labels: Value) -> Value {
        json!({
            "name": name,
            "namespace": self.namespace,
            "uid": self.uids.next(),
            "resourceVersion": "48213",
            "generation": 1,
            "creationTimestamp": TIME,
            "labels": labels,
        })
    }

    /// The labels GitLab's deployment puts on what it applies, plus the app's own.
    fn labelled(&self, app: &str) -> Value {
        json!({
            "app.kubernetes.io/name": app,
            "app.kubernetes.io/managed-by": "Helm",
            PROJECT_LABEL: "42",
            ENVIRONMENT_LABEL: "production",
        })
    }

    fn owner_ref(owner: &Value) -> Value {
        json!([{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": true, "blockOwnerDeletion": true,
        }])
    }

    fn push(&mut self, object: Value) -> Value {
        self.objects.push(object.clone());
        object
    }

    fn pod_template(app: &str, labels: &Value) -> Value {
        json!({
            "metadata": {"labels": labels},
            "spec": {
                "containers": [{
                    "name": app, "image": format!("registry.gitlab.com/acme/{app}:1.4.2"),
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "RAILS_ENV", "value": "production"}, {"name": "PORT", "value": "8080"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "256Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/-/readiness", "port": 8080}, "periodSeconds": 10},
                }],
                "restartPolicy": "Always",
                "volumes": [{"name": "config", "configMap": {"name": format!("{app}-config")}}],
            },
        })
    }

    /// A Pod of `owner`, in one of the states a real namespace shows.
    fn pod(&mut self, name: &str, labels: &Value, owner: &Value, state: u32, claim: Option<&str>) {
        let mut meta = self.meta(name, labels.clone());
        meta["ownerReferences"] = Self::owner_ref(owner);
        let app = labels["app.kubernetes.io/name"].as_str().unwrap_or("app");
        let mut spec = Self::pod_template(app, labels)["spec"].clone();
        spec["nodeName"] = json!("node-3");
        spec["serviceAccountName"] = json!("default");
        if let Some(claim) = claim {
            if let Some(volumes) = spec["volumes"].as_array_mut() {
                volumes
                    .push(json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}}));
            }
        }
        let finite = owner["kind"] == "Job";
        if finite {
            spec["restartPolicy"] = json!("OnFailure");
        }
        let ready = |status: &str| {
            json!([
                {"type": "Initialized", "status": "True", "lastTransitionTime": TIME},
                {"type": "Ready", "status": status, "lastTransitionTime": TIME},
                {"type": "ContainersReady", "status": status, "lastTransitionTime": TIME},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": TIME},
            ])
        };
        let container = |state: Value, last: Value, ready: bool, restarts: u32| {
            json!([{
                "name": app, "image": format!("registry.gitlab.com/acme/{app}:1.4.2"),
                "imageID": "registry.gitlab.com/acme/app@sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b",
                "containerID": "containerd://0c6e5d2b1a", "ready": ready, "started": ready,
                "restartCount": restarts, "state": state, "lastState": last,
            }])
        };
        let status = match (finite, state % 50) {
            (true, 0) => json!({"phase": "Failed", "conditions": ready("False"),
                "containerStatuses": container(json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": TIME, "finishedAt": TIME}}), json!({}), false, 0)}),
            (true, _) => json!({"phase": "Succeeded", "conditions": ready("False"),
                "containerStatuses": container(json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": TIME, "finishedAt": TIME}}), json!({}), false, 0)}),
            (false, 1) => json!({"phase": "Running", "conditions": ready("False"),
                "containerStatuses": container(
                    json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off 5m0s restarting failed container={app} pod={name}")}}),
                    json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": TIME, "finishedAt": TIME}}), false, 7)}),
            (false, 2) => json!({"phase": "Running", "conditions": ready("False"),
                "containerStatuses": container(json!({"running": {"startedAt": TIME}}),
                    json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": TIME, "finishedAt": TIME}}), false, 2)}),
            (false, 3) => json!({"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/3 nodes are available: 3 Insufficient memory."}]}),
            _ => {
                json!({"phase": "Running", "hostIP": "10.0.3.7", "podIP": "10.42.3.17", "qosClass": "Burstable",
                "startTime": TIME, "conditions": ready("True"),
                "containerStatuses": container(json!({"running": {"startedAt": TIME}}), json!({}), true, 0)})
            }
        };
        self.push(json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}));
    }

    /// Deployment, its current and previous ReplicaSets, 3 Pods; Service, EndpointSlice,
    /// Endpoints; Ingress; HPA; ConfigMap: 12 objects.
    fn web_app(&mut self, i: u32) {
        let app = format!("web-{i}");
        let labels = self.labelled(&app);
        let selector = json!({"app.kubernetes.io/name": app});
        let mut meta = self.meta(&app, labels.clone());
        meta["generation"] = json!(3);
        let rolling = i % 40 == 7;
        let deployment = self.push(json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 3, "selector": {"matchLabels": selector}, "template": Self::pod_template(&app, &selector),
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                     "progressDeadlineSeconds": 600, "revisionHistoryLimit": 10},
            "status": {"observedGeneration": 3, "replicas": 3, "updatedReplicas": if rolling { 1 } else { 3 },
                       "readyReplicas": 3, "availableReplicas": 3,
                       "conditions": [
                           {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability.", "lastUpdateTime": TIME, "lastTransitionTime": TIME},
                           {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "message": format!("ReplicaSet \"{app}-7d9f8b6c5\" has successfully progressed."), "lastUpdateTime": TIME, "lastTransitionTime": TIME}]},
        }));
        for (hash, replicas) in [("7d9f8b6c5", 3), ("5c8d7f9b4", 0)] {
            let mut rs_labels = selector.clone();
            rs_labels["pod-template-hash"] = json!(hash);
            let mut meta = self.meta(&format!("{app}-{hash}"), rs_labels.clone());
            meta["ownerReferences"] = Self::owner_ref(&deployment);
            meta["annotations"] =
                json!({"deployment.kubernetes.io/revision": if replicas > 0 { "2" } else { "1" }});
            let rs = self.push(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta,
                "spec": {"replicas": replicas, "selector": {"matchLabels": rs_labels}, "template": Self::pod_template(&app, &rs_labels)},
                "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas, "fullyLabeledReplicas": replicas},
            }));
            for p in 0..replicas {
                let name = format!("{app}-{hash}-{}", ["x7k2p", "m4q9z", "c8v3n"][p as usize]);
                self.pod(&name, &rs_labels, &rs, i * 3 + p, None);
            }
        }
        let service = self.push(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": self.meta(&app, labels.clone()),
            "spec": {"type": "ClusterIP", "clusterIP": "10.43.17.201", "selector": selector,
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            "status": {"loadBalancer": {}},
        }));
        let mut slice_meta = self.meta(&format!("{app}-b2x9q"), json!({"kubernetes.io/service-name": app, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}));
        slice_meta["ownerReferences"] = Self::owner_ref(&service);
        self.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": slice_meta, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.42.3.17"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": format!("{app}-7d9f8b6c5-x7k2p")}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }));
        self.push(json!({
            "apiVersion": "v1", "kind": "Endpoints", "metadata": self.meta(&app, selector.clone()),
            "subsets": [{"addresses": [{"ip": "10.42.3.17"}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}],
        }));
        let host = format!("{app}.acme.example");
        self.push(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": self.meta(&app, labels.clone()),
            "spec": {"ingressClassName": "nginx", "tls": [{"hosts": [host], "secretName": format!("{app}-tls")}],
                     "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": app, "port": {"number": 80}}}}]}}]},
            "status": {"loadBalancer": if i % 60 == 11 { json!({}) } else { json!({"ingress": [{"ip": "203.0.113.10"}]}) }},
        }));
        let metrics_fail = i % 30 == 13;
        self.push(json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": self.meta(&app, labels.clone()),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": app},
                     "minReplicas": 3, "maxReplicas": 10,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]},
            "status": {"currentReplicas": 3, "desiredReplicas": 3, "conditions": [
                {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "message": "recommended size matches current size", "lastTransitionTime": TIME},
                if metrics_fail {
                    json!({"type": "ScalingActive", "status": "False", "reason": "FailedGetResourceMetric", "message": "the HPA was unable to compute the replica count: failed to get cpu utilization: unable to get metrics for resource cpu", "lastTransitionTime": TIME})
                } else {
                    json!({"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound", "message": "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)", "lastTransitionTime": TIME})
                },
                {"type": "ScalingLimited", "status": "False", "reason": "DesiredWithinRange", "message": "the desired count is within the acceptable range", "lastTransitionTime": TIME}]},
        }));
        self.push(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(&format!("{app}-config"), labels),
            "data": {"config.yml": "log_level: info\nworkers: 4\n", "FEATURE_FLAGS": "search,exports"},
        }));
    }

    /// StatefulSet, 2 Pods with their claims, headless Service: 6 objects.
    fn database(&mut self, i: u32) {
        let app = format!("db-{i}");
        let labels = self.labelled(&app);
        let selector = json!({"app.kubernetes.io/name": app});
        let mut template = Self::pod_template(&app, &selector);
        template["spec"]["volumes"] = json!([]);
        let sts = self.push(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": self.meta(&app, labels.clone()),
            "spec": {"replicas": 2, "serviceName": app, "selector": {"matchLabels": selector}, "template": template,
                     "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}]},
            "status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2, "currentReplicas": 2, "updatedReplicas": 2,
                       "currentRevision": format!("{app}-6b7c8d9f5"), "updateRevision": format!("{app}-6b7c8d9f5"), "availableReplicas": 2},
        }));
        for p in 0..2 {
            let claim = format!("data-{app}-{p}");
            let mut pod_labels = selector.clone();
            pod_labels["statefulset.kubernetes.io/pod-name"] = json!(format!("{app}-{p}"));
            self.pod(
                &format!("{app}-{p}"),
                &pod_labels,
                &sts,
                10 + p,
                Some(&claim),
            );
            // Claims from a volumeClaimTemplate carry the template's labels, here GitLab's.
            self.push(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": self.meta(&claim, labels.clone()),
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "standard", "volumeName": format!("pvc-{i}-{p}")},
                "status": {"phase": if i % 25 == 3 && p == 1 { "Pending" } else { "Bound" }, "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"}},
            }));
        }
        self.push(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": self.meta(&app, labels),
            "spec": {"clusterIP": "None", "selector": selector, "ports": [{"port": 5432, "targetPort": 5432}]},
            "status": {"loadBalancer": {}},
        }));
    }

    /// CronJob, its last 2 Jobs and their Pods: 5 objects.
    fn cron(&mut self, i: u32) {
        let app = format!("backup-{i}");
        let labels = self.labelled(&app);
        let failed = i % 20 == 9;
        let cron = self.push(json!({
            "apiVersion": "batch/v1", "kind": "CronJob", "metadata": self.meta(&app, labels.clone()),
            "spec": {"schedule": "0 3 * * *", "concurrencyPolicy": "Forbid", "successfulJobsHistoryLimit": 2,
                     "jobTemplate": {"spec": {"backoffLimit": 2, "template": Self::pod_template(&app, &labels)}}},
            "status": {"lastScheduleTime": "2024-05-02T03:00:00Z",
                       "lastSuccessfulTime": if failed { "2024-05-01T03:00:41Z" } else { "2024-05-02T03:00:41Z" }},
        }));
        for (day, ok) in [("01", true), ("02", !failed)] {
            let name = format!("{app}-284{day}");
            let mut meta = self.meta(&name, json!({"job-name": name}));
            meta["ownerReferences"] = Self::owner_ref(&cron);
            let condition = if ok {
                json!({"type": "Complete", "status": "True", "lastTransitionTime": TIME})
            } else {
                json!({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastTransitionTime": TIME})
            };
            let job = self.push(json!({
                "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                "spec": {"backoffLimit": 2, "completions": 1, "parallelism": 1, "template": Self::pod_template(&app, &json!({"job-name": name}))},
                "status": {"startTime": TIME, "completionTime": TIME, "succeeded": u32::from(ok), "failed": u32::from(!ok), "conditions": [condition]},
            }));
            self.pod(
                &format!("{name}-q8w2x"),
                &json!({"job-name": name}),
                &job,
                u32::from(ok),
                None,
            );
        }
    }

    /// A cert-manager Certificate: its conditions carry their own observedGeneration.
    fn certificate(&mut self, i: u32) {
        let app = format!("web-{i}");
        let labels = self.labelled(&app);
        let issuing = i % 50 == 17;
        self.push(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": self.meta(&format!("{app}-tls"), labels),
            "spec": {"secretName": format!("{app}-tls"), "dnsNames": [format!("{app}.acme.example")], "issuerRef": {"kind": "ClusterIssuer", "name": "letsencrypt"}},
            "status": {"notAfter": "2024-08-01T10:00:00Z", "revision": 3, "conditions": [
                {"type": "Ready", "status": if issuing { "False" } else { "True" },
                 "reason": if issuing { "DoesNotExist" } else { "Ready" },
                 "message": if issuing { "Issuing certificate as Secret does not exist" } else { "Certificate is up to date and has not expired" },
                 "observedGeneration": 1, "lastTransitionTime": TIME}]},
        }));
    }
}

/// An environment of about `n` objects (exactly `n`), with the selected (labelled) objects.
fn environment(n: usize) -> (Vec<Value>, Vec<Value>) {
    let mut env = Env {
        namespace: "acme-production".into(),
        uids: Uids(std::cell::Cell::new(n as u64)),
        objects: Vec::with_capacity(n + 32),
    };
    // Per 4 apps: 4 web apps (48), a database (6), a CronJob (5), 4 Certificates: 63 objects.
    let mut i = 0;
    while env.objects.len() < n {
        env.web_app(i);
        env.certificate(i);
        if i % 4 == 0 {
            env.database(i);
        }
        if i % 4 == 2 {
            env.cron(i);
        }
        i += 1;
    }
    env.objects.truncate(n);
    // The service lists each kind with the environment's label selector: the labelled objects.
    let selected: Vec<Value> = env
        .objects
        .iter()
        .filter(|o| o["metadata"]["labels"][ENVIRONMENT_LABEL] == "production")
        .cloned()
        .collect();
    (env.objects, selected)
}

/// What the service computes for the resource group (`fetch` the closure, `group::assemble`
/// the rest); returns the sizes so nothing is skipped.
#[inline(never)]
fn pipeline(input: &Input) -> (usize, usize, usize) {
    pipeline_with(input, &Customizations::default())
}

/// [`pipeline`] with the user's health scripts loaded.
#[inline(never)]
fn pipeline_with(input: &Input, custom: &Customizations) -> (usize, usize, usize) {
    let Input {
        objects,
        selected,
        candidates,
    } = input;
    let closure = owned_closure(selected, candidates);
    // Every object here is in the group: the closure plus the selected ones.
    let (graph, healths) = edges_and_health(objects, custom, |t: &TreeBuf| Some(Value::from(t)));
    // The group's health, naming its causes as the service does.
    let group = aggregate(healths.iter().map(Option::as_ref), |i| {
        fn text(v: Option<&Tree>) -> Option<&str> {
            v.and_then(Tree::as_str)
        }
        let (o, meta) = (&objects[i], objects[i].get("metadata"));
        (
            text(o.get("kind")).unwrap_or(""),
            text(meta.and_then(|m| m.get("namespace"))),
            text(meta.and_then(|m| m.get("name"))).unwrap_or(""),
        )
    });
    black_box(&group);
    (closure.len(), graph.len(), healths.len())
}

/// Objects in the copies `cold` cycles through: 200,000 objects' trees are some ten times
/// this machine's 32 MB last-level cache.
const COLD_OBJECTS: usize = 200_000;

/// What the pipeline reads: the group's objects, the selected ones among them, and the
/// candidates for the ownership closure (here every object).
#[derive(Clone)]
struct Input {
    objects: Vec<TreeBuf>,
    selected: Vec<TreeBuf>,
    candidates: Vec<TreeBuf>,
}

impl Input {
    /// As the service holds them: objects parsed from their text by [`object::parse`], which
    /// keeps only the fields the graph, the health rules and the assembly read; candidates as
    /// `fetch` reads them before it knows which belong, only their [`object::HEAD`] (type,
    /// name, uid, labels, owner references).
    fn kept(all: &[Value], selected: &[Value]) -> Input {
        let kept = |objects: &[Value]| -> Vec<TreeBuf> {
            objects
                .iter()
                .map(|o| object::parse(&o.to_string()).expect("parse"))
                .collect()
        };
        let head = |o: &Value| {
            let (api_version, kind) = (o["apiVersion"].as_str(), o["kind"].as_str());
            let (api_version, kind) = (api_version.unwrap_or(""), kind.unwrap_or(""));
            object::parse_typed(object::HEAD, &o.to_string(), api_version, kind).expect("parse")
        };
        Input {
            objects: kept(all),
            selected: kept(selected),
            candidates: all.iter().map(head).collect(),
        }
    }

    /// The whole objects in the same compact trees, candidates too: what keeping only some
    /// fields saves.
    fn whole(all: &[Value], selected: &[Value]) -> Input {
        let objects: Vec<TreeBuf> = all.iter().map(TreeBuf::from).collect();
        Input {
            candidates: objects.clone(),
            objects,
            selected: selected.iter().map(TreeBuf::from).collect(),
        }
    }
}

/// This process' CPU time, every thread's: unlike the wall clock, not stretched when other
/// processes take the cores (these machines are shared).
fn process_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0;
    assert!(ok, "clock_gettime");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `iterations` runs of the pipeline, timed in the process' CPU time.
fn cpu_timed(iterations: u64, input: &Input) -> Duration {
    cpu_timed_with(iterations, input, &Customizations::default())
}

fn cpu_timed_with(iterations: u64, input: &Input, custom: &Customizations) -> Duration {
    let start = process_cpu_time();
    for _ in 0..iterations {
        black_box(pipeline_with(black_box(input), custom));
    }
    process_cpu_time() - start
}

/// A folder of health scripts for 50 kinds, none of them in the environment: what a user's
/// `resource_customizations` costs the objects it does not apply to.
fn fifty_kinds() -> (tempfile::TempDir, Customizations) {
    let dir = tempfile::tempdir().expect("temporary folder");
    for i in 0..50 {
        let folder = dir.path().join(format!("kind{i}.example.com/Kind{i}"));
        std::fs::create_dir_all(&folder).expect("folder");
        let script = format!("return {{status = 'Healthy', message = 'kind {i}'}}");
        std::fs::write(folder.join("health.lua"), script).expect("script");
    }
    let custom = Customizations::load(Some(dir.path()), &Default::default()).expect("scripts");
    assert_eq!(custom.len(), 50);
    (dir, custom)
}

/// Argo CD's Deployment rule in Lua, as a user would write it: the built-in rule's shape, for
/// the cost of a script against the rule.
const DEPLOYMENT_LUA: &str = r#"
local spec, status, meta = obj.spec or {}, obj.status or {}, obj.metadata or {}
if spec.paused then
  return {status = "Suspended", message = "Deployment is paused"}
end
if (meta.generation or 0) > (status.observedGeneration or 0) then
  return {status = "Progressing", message = "Waiting for rollout to finish: observed deployment generation less than desired generation"}
end
for _, c in ipairs(status.conditions or {}) do
  if c.type == "Progressing" then
    if c.reason == "ProgressDeadlineExceeded" then
      return {status = "Degraded", message = string.format('Deployment "%s" exceeded its progress deadline', meta.name)}
    end
    break
  end
end
local updated, replicas, available = status.updatedReplicas or 0, status.replicas or 0, status.availableReplicas or 0
if spec.replicas ~= nil and updated < spec.replicas then
  return {status = "Progressing", message = string.format("Waiting for rollout to finish: %d out of %d new replicas have been updated...", updated, spec.replicas)}
end
if replicas > updated then
  return {status = "Progressing", message = string.format("Waiting for rollout to finish: %d old replicas are pending termination...", replicas - updated)}
end
if available < updated then
  return {status = "Progressing", message = string.format("Waiting for rollout to finish: %d of %d updated replicas are available...", available, updated)}
end
return {status = "Healthy"}
"#;

/// The health of one kind by a script against the built-in rule of the same shape, per object:
/// `builtin` (the rule on the kept tree), `script` (the whole object turned into Lua and the
/// script run), `script-from-text` (as the service does it: the object's text parsed first).
fn bench_script(c: &mut Criterion) {
    let (all, _) = environment(20_000);
    let deployments: Vec<Value> = all
        .into_iter()
        .filter(|o| o["kind"] == "Deployment")
        .collect();
    let texts: Vec<String> = deployments.iter().map(Value::to_string).collect();
    let trees: Vec<TreeBuf> = texts
        .iter()
        .map(|t| object::parse(t).expect("parse"))
        .collect();
    let scripts = [("apps_Deployment".to_string(), DEPLOYMENT_LUA.to_string())].into();
    let custom = Customizations::load(None, &scripts).expect("script");
    let none = Customizations::default();
    for (tree, value) in trees.iter().zip(&deployments) {
        assert_eq!(
            health_with(tree, || Some(value.clone()), &custom),
            health_with(tree, || None, &none),
            "the script says what the rule says"
        );
    }
    let mut group = c.benchmark_group("health_script");
    group.throughput(Throughput::Elements(deployments.len() as u64));
    group.bench_function(BenchmarkId::new("builtin", deployments.len()), |b| {
        b.iter(|| {
            trees
                .iter()
                .filter_map(|t| health_with(t, || None, &none))
                .count()
        })
    });
    group.bench_function(BenchmarkId::new("script", deployments.len()), |b| {
        b.iter(|| {
            trees
                .iter()
                .zip(&deployments)
                .filter_map(|(t, v)| health_with(t, || Some(v.clone()), &custom))
                .count()
        })
    });
    group.bench_function(
        BenchmarkId::new("script-from-text", deployments.len()),
        |b| {
            b.iter(|| {
                trees
                    .iter()
                    .zip(&texts)
                    .filter_map(|(t, text)| {
                        health_with(t, || serde_json::from_str(text).ok(), &custom)
                    })
                    .count()
            })
        },
    );
    group.finish();
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("resource_group");
    for n in [1_000usize, 10_000, 100_000] {
        let (all, all_selected) = environment(n);
        let (kept, whole) = (
            Input::kept(&all, &all_selected),
            Input::whole(&all, &all_selected),
        );
        drop((all, all_selected));
        assert_eq!(
            pipeline(&kept),
            pipeline(&whole),
            "the kept fields give the same group"
        );
        let (closure, graph, _) = pipeline(&kept);
        assert_eq!(
            closure + kept.selected.len(),
            n,
            "every object belongs to the group"
        );
        assert!(graph > n / 2, "{graph} edges for {n} objects");
        group.throughput(Throughput::Elements(n as u64));
        group.sample_size(if n >= 100_000 { 10 } else { 20 });
        group.warm_up_time(Duration::from_secs(if n >= 100_000 { 3 } else { 1 }));
        group.measurement_time(Duration::from_secs(if n >= 100_000 { 8 } else { 4 }));
        group.bench_with_input(BenchmarkId::new("kept", n), &n, |b, _| {
            b.iter(|| black_box(pipeline(black_box(&kept))))
        });
        // The same objects, copied until the copies hold COLD_OBJECTS, one copy per run in
        // turn: each run reads objects that the runs since have pushed out of the caches, at
        // every size, as `kept` does only at 100,000.
        let copies: Vec<Input> = (0..COLD_OBJECTS.div_ceil(n))
            .map(|_| kept.clone())
            .collect();
        // The next copy, kept across criterion's samples so that none starts on a warm one.
        let next = std::cell::Cell::new(0);
        group.bench_with_input(BenchmarkId::new("cold", n), &n, |b, _| {
            b.iter_custom(|iterations| {
                let start = std::time::Instant::now();
                for _ in 0..iterations {
                    let i = next.replace((next.get() + 1) % copies.len());
                    black_box(pipeline(black_box(&copies[i])));
                }
                start.elapsed()
            })
        });
        drop(copies);
        group.bench_with_input(BenchmarkId::new("kept-cpu", n), &n, |b, _| {
            b.iter_custom(|iterations| cpu_timed(iterations, &kept))
        });
        // Health scripts for 50 other kinds loaded, same run: what they cost where none applies.
        let (_folder, fifty) = fifty_kinds();
        assert_eq!(pipeline_with(&kept, &fifty), pipeline(&kept));
        group.bench_with_input(BenchmarkId::new("kept-cpu-50-scripts", n), &n, |b, _| {
            b.iter_custom(|iterations| cpu_timed_with(iterations, &kept, &fifty))
        });
        // The same objects whole, same run.
        group.bench_with_input(BenchmarkId::new("whole-cpu", n), &n, |b, _| {
            b.iter_custom(|iterations| cpu_timed(iterations, &whole))
        });
    }
    group.finish();
}

criterion_group!(benches, bench, bench_script);

/// `PIPELINE_RUNS=N,K`: the objects of [`environment`]`(N)`, then K runs of the pipeline.
fn runs_only(spec: &str) {
    let parse = |part: Option<&str>| part.and_then(|p| p.trim().parse::<usize>().ok());
    let mut parts = spec.split(',');
    let (Some(n), Some(runs)) = (parse(parts.next()), parse(parts.next())) else {
        panic!("PIPELINE_RUNS is N,K (objects, runs), not {spec:?}");
    };
    let (all, all_selected) = environment(n);
    let input = Input::kept(&all, &all_selected);
    drop((all, all_selected));
    for _ in 0..runs {
        black_box(pipeline(black_box(&input)));
    }
}

/// `SCRIPTS_AB=N,K`: K rounds over the objects of [`environment`]`(N)`, each round one run
/// without health scripts and one with [`fifty_kinds`] loaded, in alternating order, each in
/// the process' CPU time; prints both medians and their ratio.
fn scripts_ab(spec: &str) {
    let parse = |part: Option<&str>| part.and_then(|p| p.trim().parse::<usize>().ok());
    let mut parts = spec.split(',');
    let (Some(n), Some(rounds)) = (parse(parts.next()), parse(parts.next())) else {
        panic!("SCRIPTS_AB is N,K (objects, rounds), not {spec:?}");
    };
    let (all, all_selected) = environment(n);
    let input = Input::kept(&all, &all_selected);
    drop((all, all_selected));
    let (_folder, fifty) = fifty_kinds();
    let none = Customizations::default();
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [&none, &fifty]
        } else {
            [&fifty, &none]
        };
        for custom in order {
            let time = cpu_timed_with(1, &input, custom);
            if std::ptr::eq(custom, &none) {
                &mut without
            } else {
                &mut with
            }
            .push(time);
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let (a, b) = (median(&mut without), median(&mut with));
    println!(
        "{n} objects, {rounds} rounds: without scripts {a:?}, with 50 kinds of scripts {b:?}: {:.1}%",
        (b.as_secs_f64() / a.as_secs_f64() - 1.0) * 100.0
    );
}

fn main() {
    if let Ok(spec) = std::env::var("PIPELINE_RUNS") {
        return runs_only(&spec);
    }
    if let Ok(spec) = std::env::var("SCRIPTS_AB") {
        return scripts_ab(&spec);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
