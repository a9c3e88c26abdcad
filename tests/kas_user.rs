//! `access_as: {user: {}}` through GitLab's agent server (SPEC 14): KAS presents envlens'
//! token's user to the cluster and cannot impersonate a viewer, so every request a viewer's
//! identity would impersonate is first a `SubjectAccessReview` for that identity, and is sent
//! (as envlens) only when the cluster allows it; what cannot be decided is refused.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::environment::{self, NS, PROJECT};
use crate::support::kas::{through_kas, TestKas, ThroughKas, ENVLENS_USER};
use crate::support::kube_api::KubeApi;
use crate::support::*;

const AGENT: i64 = 7;
const DEV: (i64, &str) = (2, "dev");

/// What the cluster's administrator granted: envlens' token's user reads everything and may
/// review access (or, with `reviews` false, may not); developers of the project read the
/// workloads (Deployments, ReplicaSets, Pods) and Events, nothing else.
fn rbac(api: &KubeApi, reviews: bool) {
    let mut rules =
        vec![json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]})];
    if reviews {
        rules.push(json!({"apiGroups": ["authorization.k8s.io"],
            "resources": ["subjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]}));
    }
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "envlens"}, "rules": rules}),
    );
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "envlens"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "envlens"},
        "subjects": [{"kind": "User", "name": format!("gitlab:user:{}", ENVLENS_USER.1)}]}));
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "workloads", "namespace": NS},
        "rules": [{"apiGroups": ["", "apps"], "resources": ["pods", "deployments", "replicasets", "events"],
                   "verbs": ["get", "list", "watch"]}]}));
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "developers", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workloads"},
        "subjects": [{"kind": "Group", "name": format!("gitlab:project_role:{PROJECT}:developer")}]}));
}

/// The cluster with the environment and [`rbac`], GitLab and KAS, and envlens reaching agent 7
/// (`access_as: user`, developers of acme/apps/web) through KAS only.
async fn world(reviews: bool) -> World {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    rbac(&api, reviews);
    api.enforce_rbac();
    let served = api.serve(dir.path()).await;
    let ThroughKas {
        gitlab, kas, yaml, ..
    } = through_kas(&served, &[(AGENT, 10)], dir.path()).await;
    // The agent's `user_access` impersonates: KAS presents envlens' token's user.
    gitlab.kas.allow(AGENT, 10, true, ENVLENS_USER.0, 10);
    let app = TestApp::with_config(&format!("kubernetes:\n  response_timeout: 5s\n{yaml}")).await;
    environment::seed(&app).await;
    let config =
        json!({"user_access": {"access_as": {"user": {}}, "projects": [{"id": "acme/apps/web"}]}});
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": AGENT, "agent_config": config}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    World {
        api,
        app,
        _kas: kas,
        _gitlab: gitlab,
        _served: served,
        _dir: dir,
    }
}

/// What [`world`] set up; the servers stop when it is dropped.
struct World {
    api: KubeApi,
    app: TestApp,
    _kas: TestKas,
    _gitlab: crate::support::gitlab::TestGitLab,
    _served: crate::support::kube_api::Served,
    _dir: tempfile::TempDir,
}

async fn proxy(app: &TestApp, path: &str) -> TestResponse {
    app.send(
        crate::proxy::bearer(DEV.0, AGENT, Method::GET, &format!("/k8s-proxy{path}"))
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn a_viewer_is_judged_by_reviews_and_the_request_goes_as_envlens() {
    let World { api, app, .. } = &world(true).await;

    // Pods: the developers may list them; the list goes as envlens, answered.
    let res = proxy(app, &format!("/api/v1/namespaces/{NS}/pods")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(!res.json()["items"].as_array().unwrap().is_empty());
    // ConfigMaps: refused in the API server's words, and never listed.
    let res = proxy(app, &format!("/api/v1/namespaces/{NS}/configmaps")).await;
    assert_eq!(res.status, 403, "{}", res.text());
    assert_eq!(
        res.json()["message"],
        format!(
            "configmaps is forbidden: User \"gitlab:user:dev\" cannot list resource \"configmaps\" \
             in API group \"\" in the namespace \"{NS}\""
        )
    );
    let requests = api.requests();
    assert!(
        !requests.iter().any(|r| r.path.ends_with("/configmaps")),
        "a refused list reached the cluster"
    );
    // Every review named the viewer, never envlens' own user.
    let reviews: Vec<_> = requests
        .iter()
        .filter(|r| r.path.ends_with("/subjectaccessreviews"))
        .collect();
    assert!(reviews.len() >= 2, "{reviews:?}");

    // The environment's group, as the viewer: the workloads, and no ConfigMap.
    let body = app
        .graphql(
            DEV,
            r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
            resourceGroup { resources { kind name } errors { kind code } } } } }"#,
        )
        .await;
    let group = &body["data"]["project"]["environment"]["resourceGroup"];
    let kinds: Vec<&str> = group["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .filter_map(|r| r["kind"].as_str())
        .collect();
    for kind in ["Deployment", "ReplicaSet", "Pod"] {
        assert!(kinds.contains(&kind), "{kind}: {body}");
    }
    assert!(!kinds.contains(&"ConfigMap"), "{body}");
    let refused: Vec<&Value> = group["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "ConfigMap")
        .collect();
    assert_eq!(
        refused,
        [&json!({"kind": "ConfigMap", "code": 403})],
        "{body}"
    );
}

#[tokio::test]
async fn without_reviews_nothing_is_shown_to_a_viewer() {
    // envlens' user may read everything, but not ask whose access is what.
    let World { api, app, .. } = &world(false).await;
    let res = proxy(app, &format!("/api/v1/namespaces/{NS}/pods")).await;
    assert_eq!(res.status, 403, "{}", res.text());
    assert!(
        res.json()["message"]
            .as_str()
            .unwrap()
            .contains("cannot be decided"),
        "{}",
        res.text()
    );
    assert!(
        !api.requests().iter().any(|r| r.path.ends_with("/pods")),
        "an undecided request reached the cluster"
    );
    // The group: nothing shown, every kind an error.
    let body = app
        .graphql(
            DEV,
            r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
            resourceGroup { resources { kind name } errors { kind } } } } }"#,
        )
        .await;
    let group = &body["data"]["project"]["environment"]["resourceGroup"];
    assert_eq!(group["resources"], json!([]), "{body}");
    let errors = group["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"));
    assert!(errors.iter().any(|e| e["kind"] == "Pod"), "{body}");
}
