//! The demo's sample GitLab and cluster: groups, projects, users, an agent and deployments over
//! several days, sent through envlens' own API as GitLab sends them; and the workloads they
//! deployed, which then change by themselves (a rollout every few minutes, a Pod that falls into
//! a crash loop and recovers).

use axum::body::Body;
use axum::http::{header, Method, Request};
use axum::Router;
use chrono::{Duration as Days, Utc};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::cluster::{now, DemoCluster};

pub const AGENT: &str = "acme/platform/agents:production";

/// A project's environment and where it runs.
pub struct Env {
    pub id: i64,
    pub project: (i64, &'static str),
    pub name: &'static str,
    pub slug: &'static str,
    pub tier: &'static str,
    /// The namespace its deployments went to; none for an environment deployed without an agent.
    pub namespace: Option<&'static str>,
    /// The Flux object its deployments name (`flux_resource_path`, SPEC 15), if any.
    pub flux: Option<&'static str>,
}

pub const ENVIRONMENTS: &[Env] = &[
    Env {
        id: 11,
        project: (201, "acme/platform/shop"),
        name: "production",
        slug: "production",
        tier: "production",
        namespace: Some("shop-production"),
        flux: None,
    },
    Env {
        id: 12,
        project: (201, "acme/platform/shop"),
        name: "staging",
        slug: "staging",
        tier: "staging",
        namespace: Some("shop-staging"),
        flux: None,
    },
    Env {
        id: 13,
        project: (201, "acme/platform/shop"),
        name: "review/checkout-redesign",
        slug: "review-checkout-8k2j1d",
        tier: "development",
        namespace: None,
        flux: None,
    },
    Env {
        id: 21,
        project: (202, "acme/platform/payments"),
        name: "production",
        slug: "production",
        tier: "production",
        namespace: Some("payments-production"),
        flux: None,
    },
    Env {
        id: 22,
        project: (202, "acme/platform/payments"),
        name: "staging",
        slug: "staging",
        tier: "staging",
        namespace: Some("payments-staging"),
        flux: None,
    },
    Env {
        id: 31,
        project: (203, "acme/web/site"),
        name: "production",
        slug: "production",
        tier: "production",
        namespace: Some("site-production"),
        flux: None,
    },
    // Deployed by Flux (`super::flux`): blue and green in two namespaces.
    Env {
        id: 32,
        project: (203, "acme/web/site"),
        name: "gitops",
        slug: "gitops",
        tier: "production",
        namespace: Some(super::flux::BLUE),
        flux: Some(super::flux::PATH),
    },
];

/// Groups, projects, users and their memberships, in the bulk snapshot's format.
pub fn identity() -> Value {
    json!({
        "groups": [
            {"id": 100, "full_path": "acme"},
            {"id": 101, "full_path": "acme/platform"},
            {"id": 102, "full_path": "acme/web"},
        ],
        "projects": [
            {"id": 200, "full_path": "acme/platform/agents", "visibility": "private"},
            {"id": 201, "full_path": "acme/platform/shop", "visibility": "private"},
            {"id": 202, "full_path": "acme/platform/payments", "visibility": "private"},
            {"id": 203, "full_path": "acme/web/site", "visibility": "internal"},
        ],
        "users": [
            {"id": 1, "username": "root", "admin": true},
            {"id": 2, "username": "alice", "admin": false},
            {"id": 3, "username": "bob", "admin": false},
            {"id": 4, "username": "carol", "admin": false},
        ],
        "members": [
            {"user_id": 2, "source_type": "group", "source_id": 100, "access_level": 40},
            {"user_id": 3, "source_type": "project", "source_id": 201, "access_level": 30},
            {"user_id": 4, "source_type": "group", "source_id": 102, "access_level": 20},
        ],
    })
}

/// Sends one request to envlens' own router; its status and body.
async fn send(
    app: &Router,
    method: Method,
    path: &str,
    headers: &[(&str, String)],
    body: &Value,
) -> anyhow::Result<Value> {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_string()))?)
        .await?;
    let status = res.status();
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await?
        .to_bytes();
    anyhow::ensure!(
        status.is_success(),
        "{path}: {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// A deterministic fake commit sha.
fn sha(seed: i64) -> String {
    let mut x = seed as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut out = String::new();
    while out.len() < 40 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push_str(&format!("{:016x}", x));
    }
    out.truncate(40);
    out
}

/// What the sample's deployments left in the cluster (SPEC 10): before each success hook the
/// world is set to what that deployment released, and after it the snapshot worker takes its
/// snapshot, as `serve`'s would.
pub struct History<'a> {
    pub world: &'a World,
    pub worker: &'a crate::history::worker::Worker,
}

/// The sample GitLab, through the internal API, the agent configuration endpoint and deployment
/// hooks, as GitLab sends them: identity, one agent whose `user_access` and `ci_access` name the
/// group `acme`, and eight deployments per environment over the last five days; with `history`,
/// the snapshot of each successful one (then call [`World::start`] for the steady state).
pub async fn seed(
    app: &Router,
    internal_token: impl Fn() -> String,
    webhook_token: &str,
    history: Option<History<'_>>,
) -> anyhow::Result<()> {
    let internal = |t: String| vec![("Gitlab-Envlens-Api-Request", t)];
    send(
        app,
        Method::PUT,
        "/api/v4/internal/identity",
        &internal(internal_token()),
        &identity(),
    )
    .await?;
    send(
        app,
        Method::PUT,
        "/api/v4/internal/kubernetes/agents/300",
        &internal(internal_token()),
        &json!({"project_id": 200, "name": "production"}),
    )
    .await?;
    send(
        app,
        Method::POST,
        "/api/v4/internal/kubernetes/agent_configuration",
        &internal(internal_token()),
        &json!({"agent_id": 300, "agent_config": {
            "ci_access": {"groups": [{"id": "acme"}]},
            "user_access": {"access_as": {"agent": {}}, "groups": [{"id": "acme"}]},
        }}),
    )
    .await?;
    let now = Utc::now();
    for env in ENVIRONMENTS {
        let count = DEPLOYMENTS;
        for k in 0..count {
            let id = env.id * 100 + k;
            let created = now - Days::hours((count - k) * 14 + 1) + Days::minutes(env.id * 7);
            // One failed deployment in the history of each environment; the last one succeeded.
            let status = if k == count - 3 { "failed" } else { "success" };
            if let (Some(h), Some(_), "success") = (&history, env.namespace, status) {
                h.world.release(env, k as usize);
            }
            deploy(
                app,
                internal_token(),
                webhook_token,
                env,
                (id, iid(env, k)),
                created,
                status,
            )
            .await?;
            if let Some(h) = &history {
                h.worker
                    .run_until_idle()
                    .await
                    .map_err(|e| anyhow::anyhow!("the sample's snapshots: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Deployments the sample sends per environment.
pub const DEPLOYMENTS: i64 = 8;

/// The project-wide number (GitLab's `iid`) of `env`'s deployment `k` (from 0): the project's
/// environments take turns of [`DEPLOYMENTS`], in the order of [`ENVIRONMENTS`]; past them
/// (`k` ≥ [`DEPLOYMENTS`]) come the live story's.
pub fn iid(env: &Env, k: i64) -> i64 {
    let before = ENVIRONMENTS
        .iter()
        .take_while(|e| e.id != env.id)
        .filter(|e| e.project.0 == env.project.0)
        .count() as i64;
    if k < DEPLOYMENTS {
        return before * DEPLOYMENTS + k + 1;
    }
    let all = ENVIRONMENTS
        .iter()
        .filter(|e| e.project.0 == env.project.0)
        .count() as i64;
    all * DEPLOYMENTS + (k - DEPLOYMENTS) + 1
}

/// A deployment of `env` (its `id` and `iid`) created at `created`, sent as GitLab sends it:
/// the creation call, then the hook of its `status`.
pub async fn deploy(
    app: &Router,
    internal_token: String,
    webhook_token: &str,
    env: &Env,
    (id, iid): (i64, i64),
    created: chrono::DateTime<Utc>,
    status: &str,
) -> anyhow::Result<()> {
    let mut body = json!({
        "deployment": {"id": id, "iid": iid, "status": "running", "ref": "main", "sha": sha(id), "tag": false,
                       "created_at": created.to_rfc3339()},
        "project": {"id": env.project.0, "full_path": env.project.1},
        "environment": {"id": env.id, "name": env.name, "slug": env.slug, "tier": env.tier},
        "job": {"id": id + 50_000, "name": format!("deploy-{}", env.slug), "protected_ref": true, "user_id": 2},
    });
    if let Some(ns) = env.namespace {
        body["kubernetes"] = json!({"agent": AGENT, "namespace": ns});
        if let Some(path) = env.flux {
            body["kubernetes"]["flux_resource_path"] = json!(path);
        }
    }
    send(
        app,
        Method::POST,
        "/api/v4/internal/deployments",
        &[("Gitlab-Envlens-Api-Request", internal_token)],
        &body,
    )
    .await?;
    let hook = json!({
        "object_kind": "deployment", "deployment_id": id, "status": status,
        "status_changed_at": (created + Days::minutes(4)).format("%Y-%m-%d %H:%M:%S %z").to_string(),
        "environment": env.name, "environment_slug": env.slug, "environment_tier": env.tier,
        "project": {"id": env.project.0, "path_with_namespace": env.project.1, "visibility_level": 0},
        "ref": "main", "short_sha": &sha(id)[..8], "deployable_id": id + 50_000,
    });
    send(
        app,
        Method::POST,
        "/webhooks/gitlab",
        &[
            ("X-Gitlab-Token", webhook_token.to_owned()),
            ("X-Gitlab-Event", "Deployment Hook".to_owned()),
        ],
        &hook,
    )
    .await?;
    Ok(())
}

fn labels(project: i64, slug: &str, app: &str) -> Value {
    json!({"app.gitlab.com/project_id": project.to_string(), "app.gitlab.com/environment_slug": slug, "app": app})
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}])
}

/// A workload of the demo: a Deployment, its current ReplicaSet and Pods, a Service.
pub(super) struct App {
    pub(super) ns: &'static str,
    pub(super) project: i64,
    pub(super) slug: &'static str,
    pub(super) name: &'static str,
    pub(super) replicas: usize,
    pub(super) image: String,
    pub(super) containers: &'static [&'static str],
}

pub(super) fn hash_of(image: &str) -> String {
    sha(image.bytes().map(i64::from).sum::<i64>() * 31 + image.len() as i64)[..9].to_owned()
}

pub(super) fn deployment(app: &App, generation: i64, status: Value) -> Value {
    let containers: Vec<Value> = app
        .containers
        .iter()
        .map(|c| {
            json!({"name": c,
        "image": if *c == "app" { app.image.clone() } else { "envoyproxy/envoy:v1.31".into() },
        "ports": [{"containerPort": 8080}]})
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": app.name, "namespace": app.ns, "labels": labels(app.project, app.slug, app.name), "generation": generation,
                     "annotations": {"deployment.kubernetes.io/revision": generation.to_string()}},
        "spec": {"replicas": app.replicas, "selector": {"matchLabels": {"app": app.name}},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": {"metadata": {"labels": {"app": app.name}}, "spec": {"containers": containers}}},
        "status": status})
}

fn deployment_status(generation: i64, replicas: usize, updated: usize, available: usize) -> Value {
    let done = updated == replicas && available == replicas;
    json!({"observedGeneration": generation, "replicas": replicas.max(available), "updatedReplicas": updated,
           "readyReplicas": available, "availableReplicas": available,
           "conditions": [
             {"type": "Available", "status": if available >= replicas { "True" } else { "False" }, "reason": "MinimumReplicasAvailable"},
             {"type": "Progressing", "status": "True", "reason": if done { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
              "message": if done { "ReplicaSet has successfully progressed.".to_owned() } else { "ReplicaSet is progressing.".to_owned() }}]})
}

pub(super) fn replica_set(app: &App, image: &str, replicas: usize, ready: usize) -> Value {
    let hash = hash_of(image);
    let name = format!("{}-{hash}", app.name);
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": app.ns, "labels": {"app": app.name, "pod-template-hash": hash}, "generation": 1,
                     "ownerReferences": owner("apps/v1", "Deployment", app.name, &format!("demo-deployment-{}-{}", app.ns, app.name))},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app.name, "pod-template-hash": hash}},
                 "template": {"spec": {"containers": [{"name": "app", "image": image}]}}},
        "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready, "availableReplicas": ready}})
}

/// A Pod's state in the demo.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum PodState {
    Pending,
    Running,
    CrashLoop(u32),
}

pub(super) fn pod(app: &App, image: &str, suffix: &str, state: PodState, restarts: u32) -> Value {
    let hash = hash_of(image);
    let rs = format!("{}-{hash}", app.name);
    let name = format!("{rs}-{suffix}");
    let statuses: Vec<Value> = app.containers.iter().map(|c| {
        let (ready, st) = match state {
            PodState::Pending => (false, json!({"waiting": {"reason": "ContainerCreating"}})),
            PodState::Running => (true, json!({"running": {"startedAt": now()}})),
            PodState::CrashLoop(_) if *c == "app" => (false, json!({"waiting": {"reason": "CrashLoopBackOff",
                "message": format!("back-off 40s restarting failed container={c} pod={name}")}})),
            PodState::CrashLoop(_) => (true, json!({"running": {"startedAt": now()}})),
        };
        json!({"name": c, "ready": ready, "restartCount": if *c == "app" { restarts } else { 0 }, "state": st, "image": image})
    }).collect();
    let ready = state == PodState::Running;
    let phase = if state == PodState::Pending {
        "Pending"
    } else {
        "Running"
    };
    let containers: Vec<Value> = app
        .containers
        .iter()
        .map(|c| {
            json!({"name": c,
        "image": if *c == "app" { image.to_owned() } else { "envoyproxy/envoy:v1.31".into() }})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": app.ns, "labels": {"app": app.name, "pod-template-hash": hash},
                     "ownerReferences": owner("apps/v1", "ReplicaSet", &rs, &format!("demo-replicaset-{}-{rs}", app.ns))},
        "spec": {"containers": containers, "nodeName": "demo-node-1", "restartPolicy": "Always"},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }},
                                                   {"type": "ContainersReady", "status": if ready { "True" } else { "False" }}],
                   "containerStatuses": statuses}})
}

pub(super) fn pod_name(app: &App, image: &str, suffix: &str) -> String {
    format!("{}-{}-{suffix}", app.name, hash_of(image))
}

/// An Event about `[namespace, kind, apiVersion, name, uid]`.
pub(super) fn event(
    about: [&str; 5],
    kind_of_event: &str,
    reason: &str,
    message: &str,
    count: u32,
) -> Value {
    let [ns, kind, api_version, name, uid] = about;
    json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{}", reason.to_ascii_lowercase()), "namespace": ns},
        "involvedObject": {"kind": kind, "apiVersion": api_version, "name": name, "namespace": ns, "uid": uid},
        "type": kind_of_event, "reason": reason, "message": message, "count": count,
        "firstTimestamp": now(), "lastTimestamp": now(), "source": {"component": "kubelet"}})
}

/// Steps (of 2 s) between the starts of two rollouts of the shop's web app, and the step of
/// the period it starts at: right after the worker's crash loop (steps 10 to 25 of every 40)
/// ends, so that the rollout (some 10 steps) settles healthy.
const ROLL_EVERY: u64 = 120;
const ROLL_AT: u64 = 66;

pub(super) const SUFFIXES: [&str; 6] = ["x7k2p", "q9w3e", "m4n8b", "t2v6c", "h5j1l", "r8s0d"];

/// What runs in the cluster, and how it changes.
pub struct World {
    cluster: DemoCluster,
    apps: Vec<App>,
    tick: u64,
    /// The web app's rollout: the image it goes to and how many new Pods are up.
    rollout: Option<(String, usize)>,
    /// A rollout began since [`World::take_release`] last looked: GitLab's deployment of it is
    /// due.
    released: bool,
    restarts: u32,
}

impl World {
    pub fn new(cluster: DemoCluster) -> Self {
        let app = |ns, project, slug, name, replicas, image: &str, containers| App {
            ns,
            project,
            slug,
            name,
            replicas,
            image: image.to_owned(),
            containers,
        };
        let apps = vec![
            app(
                "shop-production",
                201,
                "production",
                "web",
                3,
                "registry.acme.test/shop/web:1.4.2",
                &["app", "proxy"],
            ),
            app(
                "shop-production",
                201,
                "production",
                "worker",
                2,
                "registry.acme.test/shop/worker:1.4.2",
                &["app"],
            ),
            app(
                "shop-staging",
                201,
                "staging",
                "web",
                1,
                "registry.acme.test/shop/web:1.5.0-rc.1",
                &["app", "proxy"],
            ),
            app(
                "shop-staging",
                201,
                "staging",
                "worker",
                1,
                "registry.acme.test/shop/worker:1.5.0-rc.1",
                &["app"],
            ),
            app(
                "payments-production",
                202,
                "production",
                "api",
                3,
                "registry.acme.test/payments/api:3.2.0",
                &["app"],
            ),
            app(
                "payments-staging",
                202,
                "staging",
                "api",
                1,
                "registry.acme.test/payments/api:3.3.0-rc.2",
                &["app"],
            ),
            app(
                "site-production",
                203,
                "production",
                "site",
                2,
                "registry.acme.test/web/site:2026.11.20",
                &["app"],
            ),
            app(
                super::flux::BLUE,
                203,
                "gitops",
                "site",
                2,
                "registry.acme.test/web/site:2026.11.20",
                &["app"],
            ),
            app(
                super::flux::GREEN,
                203,
                "gitops",
                "site",
                1,
                "registry.acme.test/web/site:2026.11.20",
                &["app"],
            ),
        ];
        World {
            cluster,
            apps,
            tick: 0,
            rollout: None,
            released: false,
            restarts: 0,
        }
    }

    /// Everything in its steady state, with logs to read.
    pub fn start(&mut self) {
        for app in &self.apps {
            self.cluster.put(deployment(
                app,
                1,
                deployment_status(1, app.replicas, app.replicas, app.replicas),
            ));
            self.cluster
                .put(replica_set(app, &app.image, app.replicas, app.replicas));
            for s in &SUFFIXES[..app.replicas] {
                self.cluster
                    .put(pod(app, &app.image, s, PodState::Running, 0));
                let name = pod_name(app, &app.image, s);
                let uid = format!("demo-pod-{}-{name}", app.ns);
                self.cluster.put(event(
                    [app.ns, "Pod", "v1", &name, &uid],
                    "Normal",
                    "Pulled",
                    &format!(
                        "Container image \"{}\" already present on machine",
                        app.image
                    ),
                    1,
                ));
            }
            self.cluster.put(event(
                [
                    app.ns,
                    "Deployment",
                    "apps/v1",
                    app.name,
                    &format!("demo-deployment-{}-{}", app.ns, app.name),
                ],
                "Normal",
                "ScalingReplicaSet",
                &format!(
                    "Scaled up replica set {}-{} to {}",
                    app.name,
                    hash_of(&app.image),
                    app.replicas
                ),
                1,
            ));
            self.cluster.put(service(app));
            self.cluster.put(config_map(app, "checkout-v2,fast-search"));
        }
        for env in ENVIRONMENTS {
            if let Some(ns) = env.namespace {
                self.shared(ns);
            }
        }
        super::flux::objects(&self.cluster);
        self.broken_rollouts(None);
        for _ in 0..20 {
            self.logs();
        }
    }

    /// Sets the apps of `env` to what its deployment `k` (of the eight [`seed`] sends, from 0)
    /// released: an older image for the first ones, other feature flags for the first half;
    /// the last is the steady state [`World::start`] shows.
    pub fn release(&self, env: &Env, k: usize) {
        let flags = if k < 4 {
            "checkout-v2"
        } else {
            "checkout-v2,fast-search"
        };
        for app in self.apps.iter().filter(|a| Some(a.ns) == env.namespace) {
            let images = releases(&app.image);
            let image = &images[match k {
                0..=2 => 0,
                3 | 4 => 1,
                _ => 2,
            }];
            for other in images.iter().filter(|i| *i != image) {
                self.cluster.delete(
                    "ReplicaSet",
                    app.ns,
                    &format!("{}-{}", app.name, hash_of(other)),
                );
                for s in &SUFFIXES[..app.replicas] {
                    self.cluster.delete("Pod", app.ns, &pod_name(app, other, s));
                }
            }
            let released = App {
                image: image.clone(),
                ..clone_app(app)
            };
            let r = app.replicas;
            self.cluster
                .put(deployment(&released, 1, deployment_status(1, r, r, r)));
            self.cluster.put(replica_set(app, image, r, r));
            for s in &SUFFIXES[..r] {
                self.cluster.put(pod(app, image, s, PodState::Running, 0));
            }
            self.cluster.put(service(app));
            self.cluster.put(config_map(app, flags));
        }
        if let Some(ns) = env.namespace {
            self.shared(ns);
        }
        if k as i64 == DEPLOYMENTS - 1 {
            self.broken_rollouts(env.namespace);
        }
    }

    /// The rollouts that stay broken (`super::broken`), of `namespace` or of every namespace.
    fn broken_rollouts(&self, namespace: Option<&str>) {
        for app in &self.apps {
            if super::broken::BROKEN.contains(&(app.ns, app.name))
                && namespace.is_none_or(|ns| ns == app.ns)
            {
                super::broken::rollout(&self.cluster, app);
            }
        }
    }

    /// Whether a rollout began since the last call: the live story's deployments.
    pub fn take_release(&mut self) -> bool {
        std::mem::take(&mut self.released)
    }

    /// What `namespace` holds beside the apps: credentials, an Ingress, a volume, a CronJob.
    fn shared(&self, namespace: &str) {
        for (ns, project, slug) in [
            ("shop-production", 201, "production"),
            ("payments-production", 202, "production"),
        ] {
            if ns != namespace {
                continue;
            }
            self.cluster.put(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "database-credentials", "namespace": ns, "labels": labels(project, slug, "database")},
                "data": {"username": "c2hvcA==", "password": "aHVudGVyMg=="}}));
            self.cluster.put(json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": "public", "namespace": ns, "labels": labels(project, slug, "public")},
                "spec": {"rules": [{"host": format!("{ns}.acme.test"), "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": if project == 201 { "web" } else { "api" }, "port": {"number": 80}}}}]}}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}));
        }
        if namespace == "site-production" {
            self.cluster.put(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "uploads", "namespace": "site-production", "labels": labels(203, "production", "site")},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
            "status": {"phase": "Bound"}}));
        }
        if namespace == "payments-production" {
            self.cluster.put(json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly-report", "namespace": "payments-production", "labels": labels(202, "production", "report")},
            "spec": {"schedule": "0 2 * * *", "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "report", "image": "registry.acme.test/payments/report:1.0"}]}}}}},
            "status": {"lastScheduleTime": now(), "lastSuccessfulTime": now()}}));
        }
    }

    /// Every two seconds: logs, and the next step of the story.
    pub fn step(&mut self) {
        self.tick += 1;
        self.logs();
        self.crash_loop();
        self.roll();
    }

    fn logs(&self) {
        let paths = [
            "/api/cart",
            "/api/products?page=2",
            "/healthz",
            "/api/checkout",
            "/api/search?q=lamp",
        ];
        for app in &self.apps {
            for name in self.cluster.names("Pod", app.ns) {
                if !name.starts_with(&format!("{}-", app.name)) {
                    continue;
                }
                for c in app.containers {
                    let n = self.tick as usize + name.len();
                    let line = match *c {
                        "proxy" => format!(
                            "{} [proxy] upstream=127.0.0.1:8080 status=200 duration={}ms",
                            now(),
                            1 + n % 7
                        ),
                        _ if app.name == "worker"
                            && matches!(self.crash_phase(), Some(true))
                            && name.ends_with(SUFFIXES[1]) =>
                        {
                            format!("{} ERROR cannot reach payments-api.payments-production: connection refused; exiting", now())
                        }
                        _ => format!(
                            "{} INFO {} GET {} 200 {}ms",
                            now(),
                            app.name,
                            paths[n % paths.len()],
                            3 + n % 40
                        ),
                    };
                    self.cluster.log(app.ns, &name, c, line);
                }
            }
        }
    }

    /// Whether the worker's second Pod is crash-looping now: 30 s of every 80 s.
    fn crash_phase(&self) -> Option<bool> {
        Some((self.tick % 40) >= 10 && (self.tick % 40) < 25)
    }

    fn crash_loop(&mut self) {
        let app = &self.apps[1];
        let phase = self.tick % 40;
        let suffix = SUFFIXES[1];
        let uid = format!("demo-pod-{}-{}", app.ns, pod_name(app, &app.image, suffix));
        if phase == 10 {
            self.restarts += 1;
            self.cluster.put(pod(
                app,
                &app.image,
                suffix,
                PodState::CrashLoop(self.restarts),
                self.restarts,
            ));
            self.cluster.put(event(
                [
                    app.ns,
                    "Pod",
                    "v1",
                    &pod_name(app, &app.image, suffix),
                    &uid,
                ],
                "Warning",
                "BackOff",
                "Back-off restarting failed container app in pod",
                self.restarts,
            ));
            self.cluster
                .put(replica_set(app, &app.image, app.replicas, app.replicas - 1));
            self.cluster.put(deployment(
                app,
                1,
                deployment_status(1, app.replicas, app.replicas, app.replicas - 1),
            ));
        } else if phase == 25 {
            self.cluster.put(pod(
                app,
                &app.image,
                suffix,
                PodState::Running,
                self.restarts,
            ));
            self.cluster.put(event(
                [
                    app.ns,
                    "Pod",
                    "v1",
                    &pod_name(app, &app.image, suffix),
                    &uid,
                ],
                "Normal",
                "Started",
                "Started container app",
                self.restarts,
            ));
            self.cluster
                .put(replica_set(app, &app.image, app.replicas, app.replicas));
            self.cluster.put(deployment(
                app,
                1,
                deployment_status(1, app.replicas, app.replicas, app.replicas),
            ));
        }
    }

    /// Every 4 minutes the production web app rolls to the other image, one Pod at a time.
    fn roll(&mut self) {
        let phase = self.tick % ROLL_EVERY;
        let app_index = 0;
        if phase == ROLL_AT && self.rollout.is_none() {
            let app = &self.apps[app_index];
            let next = if app.image.ends_with("1.4.2") {
                "registry.acme.test/shop/web:1.5.0"
            } else {
                "registry.acme.test/shop/web:1.4.2"
            };
            self.rollout = Some((next.to_owned(), 0));
            self.released = true;
            let generation = 2 + (self.tick / ROLL_EVERY) as i64;
            self.cluster.put(deployment(
                &App {
                    image: next.to_owned(),
                    ..clone_app(app)
                },
                generation,
                deployment_status(generation, app.replicas, 0, app.replicas),
            ));
            self.cluster.put(replica_set(app, next, 0, 0));
            self.cluster.put(event(
                [
                    app.ns,
                    "Deployment",
                    "apps/v1",
                    app.name,
                    &format!("demo-deployment-{}-{}", app.ns, app.name),
                ],
                "Normal",
                "ScalingReplicaSet",
                &format!("Scaled up replica set {}-{} to 1", app.name, hash_of(next)),
                1,
            ));
            return;
        }
        let Some((next, up)) = self.rollout.clone() else {
            return;
        };
        let app = &self.apps[app_index];
        let generation = 2 + (self.tick / ROLL_EVERY) as i64;
        let new_app = App {
            image: next.clone(),
            ..clone_app(app)
        };
        if phase.is_multiple_of(3) {
            // A new Pod starts, Pending.
            if up < app.replicas {
                self.cluster
                    .put(pod(app, &next, SUFFIXES[up], PodState::Pending, 0));
                self.cluster.put(replica_set(app, &next, up + 1, up));
                self.cluster.put(deployment(
                    &new_app,
                    generation,
                    deployment_status(generation, app.replicas, up + 1, app.replicas),
                ));
            }
        } else if phase % 3 == 1 && up < app.replicas {
            // It becomes ready; an old Pod goes.
            self.cluster
                .put(pod(app, &next, SUFFIXES[up], PodState::Running, 0));
            self.cluster.delete(
                "Pod",
                app.ns,
                &pod_name(app, &app.image, SUFFIXES[app.replicas - 1 - up]),
            );
            let up = up + 1;
            self.cluster.put(replica_set(app, &next, up, up));
            self.cluster.put(replica_set(
                app,
                &app.image,
                app.replicas - up,
                app.replicas - up,
            ));
            self.cluster.put(deployment(
                &new_app,
                generation,
                deployment_status(generation, app.replicas, up, app.replicas),
            ));
            self.rollout = Some((next.clone(), up));
            if up == app.replicas {
                let old_rs = format!("{}-{}", app.name, hash_of(&app.image));
                self.cluster.delete("ReplicaSet", app.ns, &old_rs);
                self.apps[app_index].image = next;
                self.rollout = None;
            }
        }
    }
}

fn service(app: &App) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": app.name, "namespace": app.ns, "labels": labels(app.project, app.slug, app.name)},
        "spec": {"selector": {"app": app.name}, "ports": [{"port": 80, "targetPort": 8080}], "type": "ClusterIP"},
        "status": {"loadBalancer": {}}})
}

fn config_map(app: &App, flags: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{}-config", app.name), "namespace": app.ns, "labels": labels(app.project, app.slug, app.name)},
        "data": {"LOG_LEVEL": "info", "FEATURE_FLAGS": flags}})
}

/// The images an app's history went through, oldest first; the last is `image`.
fn releases(image: &str) -> [String; 3] {
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
    let [a, b] = match tag {
        "1.4.2" => ["1.4.0", "1.4.1"],
        "1.5.0-rc.1" => ["1.4.1", "1.4.2"],
        "3.2.0" => ["3.1.4", "3.1.5"],
        "3.3.0-rc.2" => ["3.2.0", "3.3.0-rc.1"],
        "2026.11.20" => ["2026.11.13", "2026.11.17"],
        other => [other, other],
    };
    [
        format!("{repository}:{a}"),
        format!("{repository}:{b}"),
        image.to_owned(),
    ]
}

fn clone_app(app: &App) -> App {
    App {
        ns: app.ns,
        project: app.project,
        slug: app.slug,
        name: app.name,
        replicas: app.replicas,
        image: app.image.clone(),
        containers: app.containers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_replaces_every_pod_and_ends_healthy() {
        let cluster = DemoCluster::default();
        let mut world = World::new(cluster.clone());
        world.start();
        let before = cluster.names("Pod", "shop-production");
        for _ in 0..90 {
            world.step();
        }
        let after = cluster.names("Pod", "shop-production");
        let web_before: Vec<_> = before.iter().filter(|n| n.starts_with("web-")).collect();
        let web_after: Vec<_> = after.iter().filter(|n| n.starts_with("web-")).collect();
        assert_eq!(web_after.len(), 3, "{after:?}");
        assert!(
            web_after.iter().all(|n| !web_before.contains(n)),
            "{web_before:?} -> {web_after:?}"
        );
        let d = cluster.get("Deployment", "shop-production", "web").unwrap();
        assert_eq!(d["status"]["updatedReplicas"], 3);
        assert!(d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .ends_with("1.5.0"));
    }

    #[test]
    fn the_worker_crash_loops_then_recovers() {
        let cluster = DemoCluster::default();
        let mut world = World::new(cluster.clone());
        world.start();
        let name = pod_name(&world.apps[1], &world.apps[1].image, SUFFIXES[1]);
        let reason = |c: &DemoCluster| {
            c.get("Pod", "shop-production", &name).unwrap()["status"]["containerStatuses"][0]
                ["state"]["waiting"]["reason"]
                .clone()
        };
        for _ in 0..12 {
            world.step();
        }
        assert_eq!(reason(&cluster), "CrashLoopBackOff");
        for _ in 0..15 {
            world.step();
        }
        assert_eq!(reason(&cluster), Value::Null);
    }
}
