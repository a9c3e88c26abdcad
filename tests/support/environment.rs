//! A realistic environment on the test Kubernetes API server: project 42's `production` in
//! namespace `shop`, with what its controllers own, a `staging` environment beside it, a
//! look-alike in another namespace, and Events.

use axum::http::Method;
use serde_json::{json, Value};

use super::kube_api::{KubeApi, Served};
use super::reach::{Reach, Reached};
use super::TestApp;

pub const NS: &str = "shop";
pub const PROJECT: i64 = 42;
pub const SLUG: &str = "production";

pub fn gitlab_labels(slug: &str, app: &str) -> Value {
    json!({"app.gitlab.com/project_id": PROJECT.to_string(), "app.gitlab.com/environment_slug": slug, "app": app})
}

pub fn meta(ns: &str, name: &str, uid: &str, labels: Value) -> Value {
    json!({"name": name, "namespace": ns, "uid": uid, "labels": labels,
           "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]})
}

pub fn owner_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}])
}

pub fn deployment(ns: &str, name: &str, uid: &str, slug: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(ns, name, uid, gitlab_labels(slug, name)),
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "app", "image": "nginx"}]}}},
    })
}

/// A running Pod in [`NS`] labelled for [`PROJECT`]'s [`SLUG`] environment.
pub fn labelled_pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS,
            "labels": {"app.gitlab.com/project_id": PROJECT.to_string(), "app.gitlab.com/environment_slug": SLUG}},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
        "status": {"phase": "Running"}})
}

/// A ReplicaSet and its Pods, labelled like the pod template (not with GitLab's labels), owned
/// through uids as the controllers do it.
pub fn replica_set(api: &KubeApi, ns: &str, deploy: (&str, &str), hash: &str, pods: &[&str]) {
    let (deploy_name, deploy_uid) = deploy;
    let rs_name = format!("{deploy_name}-{hash}");
    let rs_uid = format!("uid-rs-{rs_name}");
    let mut rs_meta = meta(
        ns,
        &rs_name,
        &rs_uid,
        json!({"app": deploy_name, "pod-template-hash": hash}),
    );
    rs_meta["ownerReferences"] = owner_ref("apps/v1", "Deployment", deploy_name, deploy_uid);
    api.insert(
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rs_meta,
                      "spec": {"replicas": pods.len()}, "status": {"replicas": pods.len()}}),
    );
    for pod in pods {
        let pod_name = format!("{rs_name}-{pod}");
        let mut pod_meta = meta(
            ns,
            &pod_name,
            &format!("uid-pod-{pod_name}"),
            json!({"app": deploy_name, "pod-template-hash": hash}),
        );
        pod_meta["ownerReferences"] = owner_ref("apps/v1", "ReplicaSet", &rs_name, &rs_uid);
        api.insert(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
                          "spec": {"containers": [{"name": "app", "image": "nginx"}]}}),
        );
    }
}

pub fn service(ns: &str, name: &str, uid: &str, slug: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": meta(ns, name, uid, gitlab_labels(slug, name)),
           "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}})
}

/// A Service's EndpointSlice (owned, labelled with the service name) and Endpoints (same name).
pub fn service_parts(api: &KubeApi, ns: &str, name: &str, uid: &str) {
    let mut slice_meta = meta(
        ns,
        &format!("{name}-x7k2p"),
        &format!("uid-slice-{name}"),
        json!({"kubernetes.io/service-name": name}),
    );
    slice_meta["ownerReferences"] = owner_ref("v1", "Service", name, uid);
    api.insert(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": slice_meta,
                      "addressType": "IPv4", "endpoints": []}),
    );
    api.insert(json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta(ns, name, &format!("uid-ep-{name}"), json!({})),
                      "subsets": []}));
}

pub fn event(
    name: &str,
    about_kind: &str,
    about_name: &str,
    about_uid: &str,
    reason: &str,
    last: &str,
) -> Value {
    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": NS},
           "involvedObject": {"kind": about_kind, "name": about_name, "namespace": NS, "uid": about_uid},
           "type": if reason == "BackOff" { "Warning" } else { "Normal" }, "reason": reason, "message": format!("{reason} happened"),
           "firstTimestamp": "2024-06-01T00:00:00Z", "lastTimestamp": last, "count": 1, "source": {"component": "test"}})
}

/// The environment `production` of project 42 in `shop`, another environment beside it, and a
/// look-alike in another namespace.
pub fn environment(api: &KubeApi) {
    // production: a Deployment with an old and a current ReplicaSet, a Service, a ConfigMap,
    // a CronJob with a Job and its Pod.
    api.insert(deployment(NS, "web", "uid-web", SLUG));
    replica_set(api, NS, ("web", "uid-web"), "old111", &["a"]);
    replica_set(api, NS, ("web", "uid-web"), "new222", &["a", "b"]);
    api.insert(service(NS, "web", "uid-svc-web", SLUG));
    service_parts(api, NS, "web", "uid-svc-web");
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(NS, "web-config", "uid-cm-web", gitlab_labels(SLUG, "web"))}));
    let mut cron = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta(NS, "nightly", "uid-cron", gitlab_labels(SLUG, "nightly")),
                          "spec": {"schedule": "0 3 * * *", "jobTemplate": {}}});
    cron["status"] = json!({});
    api.insert(cron);
    let mut job_meta = meta(
        NS,
        "nightly-2871",
        "uid-job",
        json!({"job-name": "nightly-2871"}),
    );
    job_meta["ownerReferences"] = owner_ref("batch/v1", "CronJob", "nightly", "uid-cron");
    api.insert(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": {}, "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}));
    let mut job_pod = meta(
        NS,
        "nightly-2871-q9",
        "uid-job-pod",
        json!({"job-name": "nightly-2871"}),
    );
    job_pod["ownerReferences"] = owner_ref("batch/v1", "Job", "nightly-2871", "uid-job");
    api.insert(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": job_pod, "spec": {"containers": []}}),
    );

    // staging, same namespace: must stay out, its owned objects too.
    api.insert(deployment(NS, "web-staging", "uid-web-staging", "staging"));
    replica_set(
        api,
        NS,
        ("web-staging", "uid-web-staging"),
        "stg333",
        &["a"],
    );
    api.insert(service(NS, "web-staging", "uid-svc-staging", "staging"));
    service_parts(api, NS, "web-staging", "uid-svc-staging");
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(NS, "staging-config", "uid-cm-staging", gitlab_labels("staging", "web"))}));
    // Unlabelled, unowned: out.
    api.insert(json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta(NS, "debug-shell", "uid-debug", json!({})), "spec": {"containers": []}}));

    // Same labels, other namespace: out.
    api.insert(deployment("elsewhere", "web", "uid-web-elsewhere", SLUG));
    replica_set(
        api,
        "elsewhere",
        ("web", "uid-web-elsewhere"),
        "els444",
        &["a"],
    );

    // Events: two about the Deployment, one about a Pod, one about staging, one about nothing.
    api.insert(event(
        "web.1",
        "Deployment",
        "web",
        "uid-web",
        "ScalingReplicaSet",
        "2024-06-01T10:00:00Z",
    ));
    api.insert(event(
        "web.2",
        "Deployment",
        "web",
        "uid-web",
        "ScalingReplicaSet",
        "2024-06-02T10:00:00Z",
    ));
    api.insert(event(
        "pod.1",
        "Pod",
        "web-new222-a",
        "uid-pod-web-new222-a",
        "BackOff",
        "2024-06-02T11:00:00Z",
    ));
    api.insert(event(
        "stg.1",
        "Deployment",
        "web-staging",
        "uid-web-staging",
        "ScalingReplicaSet",
        "2024-06-02T10:00:00Z",
    ));
    api.insert(event(
        "gone.1",
        "Pod",
        "gone",
        "uid-gone",
        "Killing",
        "2024-06-02T10:00:00Z",
    ));
}

/// The custom resources of the environment, registered while the server runs.
pub fn widgets(api: &KubeApi) {
    api.add_kind("example.com", "v1", "Widget", "widgets", true);
    api.insert(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta(NS, "banner", "uid-widget", gitlab_labels(SLUG, "banner")),
                      "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    api.insert(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta(NS, "banner-staging", "uid-widget-stg", gitlab_labels("staging", "banner"))}));
}

// ---- GitLab's side ----

/// acme (1) > acme/apps (2); acme/agents (10, agent 7 `prod`), acme/apps/web (42).
/// Agent 7 lets acme/apps deploy, and grants `user_access` to developers of acme/apps/web,
/// impersonated. Users: 1 root (admin), 2 dev (developer of 42), 3 rep (reporter of 42).
/// Deployments: `production` and `review` to `shop` through agent 7, successful; `canary`
/// only failed.
pub async fn gitlab(served: &Served) -> TestApp {
    gitlab_with(served, "").await
}

/// [`gitlab`], with more of the configuration file (`extra`, YAML at the top level). Agents 7
/// and 8 reach the test cluster (the history tests register 8, `acme/agents:other`).
pub async fn gitlab_with(served: &Served, extra: &str) -> TestApp {
    gitlab_via(Reach::Kubeconfig, served, extra).await.app
}

/// [`gitlab_with`], envlens reaching agents 7 and 8 as `reach` says.
pub async fn gitlab_via(reach: Reach, served: &Served, extra: &str) -> World {
    let reached = Reached::new(reach, served, &[("7", 7), ("8", 8)], AGENTS_PROJECT).await;
    let app = TestApp::with_config(&reached.config("  response_timeout: 3s\n", extra)).await;
    seed(&app).await;
    reached.access_as_user(7, AGENTS_PROJECT, impersonates(&agent_config("user")));
    World { app, reached }
}

/// envlens over the support's GitLab ([`gitlab_via`]), and how it reaches the cluster; it
/// dereferences to its [`TestApp`].
pub struct World {
    pub app: TestApp,
    pub reached: Reached,
}

impl std::ops::Deref for World {
    type Target = TestApp;

    fn deref(&self) -> &TestApp {
        &self.app
    }
}

impl World {
    /// A new configuration file of `agent`, as GitLab's side learns it: envlens' mirror, and
    /// KAS' GitLab (whether `access_as` is `user`).
    pub async fn configure(&self, agent: i64, config: &Value) {
        self.reached
            .access_as_user(agent, AGENTS_PROJECT, impersonates(config));
        configure(&self.app, agent, config).await;
    }

    /// Whom the cluster sees on envlens' own requests for agent 7 (see
    /// [`Reached::own_identity`]), its `access_as` as configured now (`user`: `as_user`).
    pub fn own_identity(&self, as_user: bool) -> Option<String> {
        self.reached.own_identity(as_user)
    }
}

/// acme/agents, the agents' configuration project.
pub const AGENTS_PROJECT: i64 = 10;

/// Agent 7's configuration: acme/apps deploys through it; developers of acme/apps/web use it,
/// `access_as` `user` or `agent`.
pub fn agent_config(access_as: &str) -> Value {
    json!({"ci_access": {"groups": [{"id": "acme/apps"}]},
        "user_access": {"access_as": {access_as: {}}, "projects": [{"id": "acme/apps/web"}]}})
}

fn impersonates(config: &Value) -> bool {
    config["user_access"]["access_as"].get("user").is_some()
}

/// `agent`'s configuration file, recorded through `app` as GitLab sends it.
pub async fn configure(app: &TestApp, agent: i64, config: &Value) {
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": agent, "agent_config": config}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// GitLab's side of [`gitlab`] (identity, agent 7 and its configuration, the deployments),
/// recorded through `app`.
pub async fn seed(app: &TestApp) {
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"}],
        "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"},
                     {"id": PROJECT, "full_path": "acme/apps/web", "visibility": "private"}],
        "users": [{"id": 1, "username": "root", "admin": true}, {"id": 2, "username": "dev"},
                  {"id": 3, "username": "rep"}],
        "members": [
            {"user_id": 2, "source_type": "project", "source_id": PROJECT, "access_level": 30},
            {"user_id": 3, "source_type": "project", "source_id": PROJECT, "access_level": 20}
        ]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/7",
            &json!({"project_id": AGENTS_PROJECT, "name": "prod"}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    configure(app, 7, &agent_config("user")).await;
    deploy(app, 1, (100, SLUG), "success").await;
    deploy(app, 2, (101, "review"), "success").await;
    deploy(app, 3, (102, "canary"), "failed").await;
}

/// Deployment `id` of acme/apps/web to environment `env` (id, name = slug), through agent 7
/// into `shop`, finished `status`.
pub async fn deploy(app: &TestApp, id: i64, env: (i64, &str), status: &str) {
    deploy_through(app, id, env, status, ("acme/agents:prod", NS)).await;
}

/// GitLab's creation call of deployment `id` (its job `id`) to `env`, with `status`, through
/// `agent` (`<project path>:<name>`) into `namespace`: answered 201.
pub async fn create(
    app: &TestApp,
    id: i64,
    env: (i64, &str),
    status: &str,
    (agent, namespace): (&str, &str),
) {
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": id, "iid": id, "status": status, "ref": "main", "sha": "abc", "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": PROJECT, "full_path": "acme/apps/web"},
        "environment": {"id": env.0, "name": env.1, "slug": env.1, "tier": "production"},
        "job": {"id": id, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": agent, "namespace": namespace}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
}

/// [`deploy`] through another agent (`<project path>:<name>`) into another namespace.
pub async fn deploy_through(
    app: &TestApp,
    id: i64,
    env: (i64, &str),
    status: &str,
    through: (&str, &str),
) {
    create(app, id, env, "created", through).await;
    let hook = json!({"object_kind": "deployment", "deployment_id": id, "status": status,
        "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": env.1,
        "project": {"id": PROJECT, "path_with_namespace": "acme/apps/web"}});
    let res = app.hook("Deployment Hook", hook.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
}
