//! Flux's actions and the environment's settings (SPEC 15): `fluxReconcile`, `fluxSuspend` and
//! `fluxResume` refused without `user_access`, refused by the cluster's RBAC, refused for an
//! object that is not the environment's, and otherwise sent as GitLab patches them, each
//! audited; `environmentNamespacesUpdate` and `environmentArgoApplicationUpdate` for project
//! Maintainers, and the labels source applied in the namespaces added.

use axum::http::Method;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::environment::{self, gitlab_labels, meta, NS, PROJECT, SLUG};
use crate::support::gitops::serve_gitops_kinds;
use crate::support::kube_api::{KubeApi, Served};
use crate::support::*;

const ROOT: (i64, &str) = (1, "root");
const DEV: (i64, &str) = (2, "dev");
const REP: (i64, &str) = (3, "rep");

const ENVIRONMENT: &str = "gid://gitlab/Environment/100";
const BOUND: &str = "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app";
const FORBIDDEN: &str = "You don't have access to an agent that deployed to this environment. \
    Please contact agent administrator if you are allowed in \"user_access\" in agent config file.";

fn kustomization(name: &str, annotations: Option<Value>) -> Value {
    let mut metadata =
        json!({"namespace": "flux-system", "name": name, "uid": format!("uid-ks-{name}")});
    if let Some(annotations) = annotations {
        metadata["annotations"] = annotations;
    }
    json!({"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization", "metadata": metadata,
        "spec": {"interval": "10m", "path": "./deploy", "prune": true,
                 "sourceRef": {"kind": "GitRepository", "name": "app"}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded",
                   "message": "Applied revision: main@sha1:abc"}]}})
}

/// The support's environment, Flux's kinds, the bound Kustomization `app` (annotations as
/// given) and another one, `other`, that is nobody's.
async fn cluster(annotations: Option<Value>) -> (KubeApi, Served, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    serve_gitops_kinds(&api);
    api.insert(kustomization("app", annotations));
    api.insert(kustomization("other", None));
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

/// envlens over the support's GitLab, `production`'s last successful deployment bound to
/// [`BOUND`] (GitLab's `flux_resource_path`).
async fn gitlab(served: &Served) -> TestApp {
    let app = environment::gitlab(served).await;
    bind(&app).await;
    app
}

/// A successful deployment of `production` bound to [`BOUND`], through agent 7 into `shop`.
async fn bind(app: &TestApp) {
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": 10, "iid": 10, "status": "created", "ref": "main", "sha": "abc", "tag": false,
                       "created_at": "2026-11-21T11:00:00Z"},
        "project": {"id": PROJECT, "full_path": "acme/apps/web"},
        "environment": {"id": 100, "name": SLUG, "slug": SLUG, "tier": "production"},
        "job": {"id": 10, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": NS, "flux_resource_path": BOUND}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hook = json!({"object_kind": "deployment", "deployment_id": 10, "status": "success",
        "status_changed_at": "2026-11-21 11:05:00 UTC", "environment": SLUG,
        "project": {"id": PROJECT, "path_with_namespace": "acme/apps/web"}});
    let res = app.hook("Deployment Hook", hook.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// `mutation` (`fluxReconcile`, ...) on Kustomization `name` of `production`: its payload.
async fn act(app: &TestApp, user: (i64, &str), mutation: &str, name: &str) -> Value {
    let query = format!(
        r#"mutation {{ {mutation}(input: {{environmentId: "{ENVIRONMENT}",
            apiVersion: "kustomize.toolkit.fluxcd.io/v1", kind: "Kustomization",
            namespace: "flux-system", name: "{name}"}}) {{
            errors action {{ id kind user {{ username }} createdAt resource answerCode }} }} }}"#
    );
    let body = app.graphql(user, &query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"][mutation].clone()
}

/// The audit as stored, oldest first.
async fn audit(app: &TestApp) -> Vec<Value> {
    app.rows(
        "SELECT environment_id, user_id, username, kind, resource, answer_code FROM flux_actions ORDER BY id",
    )
    .await
}

fn patches(api: &KubeApi) -> Vec<crate::support::kube_api::RecordedRequest> {
    api.requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect()
}

fn ks(api: &KubeApi, name: &str) -> Value {
    api.get("kustomizations", Some("flux-system"), name)
        .unwrap()
}

/// RBAC enforced; the group `gitlab:user` (every impersonated user) may read everything, and
/// patch Kustomizations when `patch` says so.
fn rbac(api: &KubeApi, patch: bool) {
    let mut verbs = vec!["get", "list", "watch"];
    if patch {
        verbs.push("patch");
    }
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "read-all"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]}),
    );
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "flux"},
        "rules": [{"apiGroups": ["kustomize.toolkit.fluxcd.io"], "resources": ["kustomizations"], "verbs": verbs}]}));
    for role in ["read-all", "flux"] {
        api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "Group", "name": "gitlab:user"}]}));
    }
    api.enforce_rbac();
}

#[tokio::test]
async fn actions_are_refused_without_user_access_and_audited() {
    let (api, served, _dir) = cluster(None).await;
    let app = gitlab(&served).await;
    api.clear_requests();
    for (mutation, kind) in [
        ("fluxReconcile", "RECONCILE"),
        ("fluxSuspend", "SUSPEND"),
        ("fluxResume", "RESUME"),
    ] {
        // A Reporter reads the project, but `user_access` admits Developers.
        let payload = act(&app, REP, mutation, "app").await;
        assert_eq!(payload["errors"], json!([FORBIDDEN]), "{payload}");
        assert_eq!(payload["action"]["kind"], kind);
        assert_eq!(payload["action"]["answerCode"], 403);
        assert_eq!(payload["action"]["resource"], BOUND);
        assert_eq!(payload["action"]["user"]["username"], "rep");
    }
    assert!(patches(&api).is_empty(), "nothing was sent to the cluster");
    assert!(
        api.requests()
            .iter()
            .all(|r| !r.path.contains("kustomizations")),
        "the object was not even read"
    );
    let rows = audit(&app).await;
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[0],
        json!({"environment_id": 100, "user_id": 3, "username": "rep", "kind": "RECONCILE",
               "resource": BOUND, "answer_code": 403})
    );
    // Nor may they read the audit, on its own or on the timeline.
    let body = app
        .graphql(
            REP,
            r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
                fluxActions { nodes { kind } } } } }"#,
        )
        .await;
    assert!(body.get("errors").is_none(), "{body}");
    let environment = &body["data"]["project"]["environment"];
    assert_eq!(environment["fluxActions"]["nodes"], json!([]), "{body}");
    let timeline = |user| {
        let app = &app;
        async move {
            let body = app
                .graphql(
                    user,
                    r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
                        events(first: 50) { nodes { reason } } } } }"#,
                )
                .await;
            let reasons: Vec<String> = body["data"]["project"]["environment"]["events"]["nodes"]
                .as_array()
                .unwrap_or_else(|| panic!("{body}"))
                .iter()
                .map(|e| e["reason"].as_str().unwrap().to_owned())
                .collect();
            reasons
        }
    };
    assert!(!timeline(REP).await.iter().any(|r| r.starts_with("Flux")));
    // Their environment page is the page without the Flux section; the Developer's has it.
    let path = "/environments?project=acme/apps/web&name=production";
    let page = app.page_as(REP.0, path).await;
    assert!(
        page.contains("<h1>production</h1>") && !page.contains("flux-heading"),
        "{page}"
    );
    let page = app.page_as(DEV.0, path).await;
    assert!(
        page.contains("flux-heading") && page.contains("data-flux-action"),
        "{page}"
    );
    let seen = timeline(DEV).await;
    assert_eq!(
        seen.iter().filter(|r| r.starts_with("Flux")).count(),
        3,
        "{seen:?}"
    );
}

#[tokio::test]
async fn the_clusters_rbac_refuses_the_patch_of_a_user_without_the_verb() {
    let (api, served, _dir) = cluster(None).await;
    rbac(&api, false);
    let app = gitlab(&served).await;
    let payload = act(&app, DEV, "fluxSuspend", "app").await;
    assert_eq!(payload["action"]["answerCode"], 403, "{payload}");
    let error = payload["errors"][0].as_str().unwrap();
    assert!(
        error.contains("gitlab:user:dev") && error.contains("cannot patch"),
        "the cluster's own words: {error}"
    );
    let sent = patches(&api);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].impersonate_user.as_deref(), Some("gitlab:user:dev"));
    assert!(ks(&api, "app")["spec"].get("suspend").is_none());
    assert_eq!(audit(&app).await[0]["answer_code"], 403);
}

#[tokio::test]
async fn allowed_actions_are_patched_as_gitlab_patches_them_and_audited() {
    let (api, served, _dir) = cluster(None).await;
    rbac(&api, true);
    let app = gitlab(&served).await;

    // No annotations: `replace` would be refused, so the annotations are added.
    let payload = act(&app, DEV, "fluxReconcile", "app").await;
    assert_eq!(payload["errors"], json!([]), "{payload}");
    assert_eq!(payload["action"]["answerCode"], 200);
    assert_eq!(payload["action"]["kind"], "RECONCILE");
    let sent = patches(&api);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].path, format!("/apis/{BOUND}"));
    assert_eq!(sent[0].impersonate_user.as_deref(), Some("gitlab:user:dev"));
    let content_type = sent[0].headers.iter().find(|(n, _)| n == "content-type");
    assert_eq!(content_type.unwrap().1, "application/json-patch+json");
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    let first = body[0]["value"]["reconcile.fluxcd.io/requestedAt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        body,
        json!([{"op": "add", "path": "/metadata/annotations",
                             "value": {"reconcile.fluxcd.io/requestedAt": first}}])
    );
    chrono::DateTime::parse_from_rfc3339(&first).expect("RFC 3339");
    assert_eq!(
        ks(&api, "app")["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"],
        first
    );

    // Now it has annotations: GitLab's `replace`.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    act(&app, DEV, "fluxReconcile", "app").await;
    let body: Value = serde_json::from_slice(&patches(&api)[1].body).unwrap();
    assert_eq!(body[0]["op"], "replace");
    assert_eq!(
        body[0]["path"],
        "/metadata/annotations/reconcile.fluxcd.io~1requestedAt"
    );
    let second =
        ks(&api, "app")["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"].clone();
    assert_eq!(body[0]["value"], second);
    assert_ne!(second, json!(first));

    for (mutation, suspended) in [("fluxSuspend", true), ("fluxResume", false)] {
        let payload = act(&app, DEV, mutation, "app").await;
        assert_eq!(payload["errors"], json!([]), "{payload}");
        let sent = patches(&api);
        let body: Value = serde_json::from_slice(&sent.last().unwrap().body).unwrap();
        assert_eq!(
            body,
            json!([{"op": "replace", "path": "/spec/suspend", "value": suspended}])
        );
        assert_eq!(ks(&api, "app")["spec"]["suspend"], suspended);
    }

    let rows = audit(&app).await;
    let kinds: Vec<&Value> = rows.iter().map(|r| &r["kind"]).collect();
    assert_eq!(
        kinds,
        [
            &json!("RECONCILE"),
            &json!("RECONCILE"),
            &json!("SUSPEND"),
            &json!("RESUME")
        ]
    );
    assert!(rows
        .iter()
        .all(|r| r["answer_code"] == 200 && r["username"] == "dev" && r["resource"] == BOUND));

    // Read back newest first, a page at a time, and on the timeline.
    let read = |after: Option<&str>| {
        let after = after
            .map(|a| format!(r#", after: "{a}""#))
            .unwrap_or_default();
        format!(
            r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "production") {{
                fluxActions(first: 3{after}) {{ pageInfo {{ hasNextPage endCursor }}
                  nodes {{ kind answerCode resource user {{ username }} createdAt }} }}
                events(first: 20) {{ nodes {{ type reason message source }} }} }} }} }}"#
        )
    };
    let body = app.graphql(DEV, &read(None)).await;
    assert!(body.get("errors").is_none(), "{body}");
    let environment = &body["data"]["project"]["environment"];
    let page = &environment["fluxActions"];
    let kinds: Vec<&Value> = page["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| &n["kind"])
        .collect();
    assert_eq!(
        kinds,
        [&json!("RESUME"), &json!("SUSPEND"), &json!("RECONCILE")]
    );
    assert_eq!(page["pageInfo"]["hasNextPage"], true);
    let cursor = page["pageInfo"]["endCursor"].as_str().unwrap();
    let rest = app.graphql(DEV, &read(Some(cursor))).await;
    let rest = &rest["data"]["project"]["environment"]["fluxActions"];
    assert_eq!(rest["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(rest["pageInfo"]["hasNextPage"], false);
    let events = environment["events"]["nodes"].as_array().unwrap();
    let suspended = events
        .iter()
        .find(|e| e["reason"] == "FluxSuspend")
        .expect("on the timeline");
    assert_eq!(suspended["type"], "Normal");
    assert_eq!(suspended["source"], "ENVLENS");
    assert_eq!(
        suspended["message"],
        format!("dev asked to suspend {BOUND}: done")
    );
}

#[tokio::test]
async fn an_object_with_annotations_has_its_annotation_replaced() {
    let (api, served, _dir) =
        cluster(Some(json!({"kustomize.toolkit.fluxcd.io/ssa": "merge"}))).await;
    let app = gitlab(&served).await;
    let payload = act(&app, DEV, "fluxReconcile", "app").await;
    assert_eq!(payload["errors"], json!([]), "{payload}");
    let body: Value = serde_json::from_slice(&patches(&api)[0].body).unwrap();
    assert_eq!(body[0]["op"], "replace");
    let annotations = &ks(&api, "app")["metadata"]["annotations"];
    assert_eq!(annotations["kustomize.toolkit.fluxcd.io/ssa"], "merge");
    assert_eq!(
        annotations["reconcile.fluxcd.io/requestedAt"],
        body[0]["value"]
    );
}

#[tokio::test]
async fn only_the_environments_flux_objects_are_acted_on() {
    let (api, served, _dir) = cluster(None).await;
    let app = gitlab(&served).await;
    let payload = act(&app, DEV, "fluxSuspend", "other").await;
    let other = "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/other";
    assert_eq!(payload["action"]["answerCode"], 403, "{payload}");
    assert_eq!(payload["action"]["resource"], other);
    assert!(
        payload["errors"][0].as_str().unwrap().contains("neither"),
        "{payload}"
    );
    assert!(patches(&api).is_empty());
    assert!(ks(&api, "other")["spec"].get("suspend").is_none());

    // A Flux object that the group holds (labelled for the environment) may be.
    let mut labelled = kustomization("other", None);
    labelled["metadata"] = meta(
        "flux-system",
        "other",
        "uid-ks-other",
        gitlab_labels(SLUG, "other"),
    );
    api.insert(labelled);
    app.graphql(ROOT, r#"mutation { environmentNamespacesUpdate(input: {environmentId: "gid://gitlab/Environment/100",
        namespaces: ["flux-system"]}) { errors } }"#).await;
    // Acted on once the page shows it in the group, as a person would.
    let query = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
        resourceGroup { resources { kind namespace name } } } } }"#;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let body = app.graphql(DEV, query).await;
        let resources = &body["data"]["project"]["environment"]["resourceGroup"]["resources"];
        let shown = resources.as_array().is_some_and(|all| {
            all.iter().any(|r| {
                r["kind"] == "Kustomization"
                    && r["namespace"] == "flux-system"
                    && r["name"] == "other"
            })
        });
        if shown {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never in the group: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let payload = act(&app, DEV, "fluxSuspend", "other").await;
    assert_eq!(payload["errors"], json!([]), "{payload}");
    assert_eq!(ks(&api, "other")["spec"]["suspend"], true);

    // Input that names no Flux object is refused in words, with nothing audited.
    let body = app
        .graphql(
            DEV,
            r#"mutation { fluxResume(input: {environmentId: "gid://gitlab/Environment/100",
                apiVersion: "apps/v1", kind: "Deployment", namespace: "shop", name: "web"}) { errors action { id } } }"#,
        )
        .await;
    let payload = &body["data"]["fluxResume"];
    assert!(
        payload["errors"][0]
            .as_str()
            .unwrap()
            .contains("not a Flux API version"),
        "{body}"
    );
    assert!(payload["action"].is_null());
    let body = app
        .graphql(
            DEV,
            r#"mutation { fluxResume(input: {environmentId: "gid://gitlab/Environment/999",
                apiVersion: "kustomize.toolkit.fluxcd.io/v1", kind: "Kustomization", namespace: "flux-system", name: "app"}) { errors } }"#,
        )
        .await;
    assert_eq!(
        body["data"]["fluxResume"]["errors"],
        json!(["The environment does not exist, or you may not see it."])
    );
    assert_eq!(audit(&app).await.len(), 2);
}

const SETTINGS: &str = "addedNamespaces argoApplication";

async fn set_namespaces(app: &TestApp, user: (i64, &str), namespaces: &str) -> Value {
    let query = format!(
        r#"mutation {{ environmentNamespacesUpdate(input: {{environmentId: "{ENVIRONMENT}", namespaces: {namespaces}}}) {{
            errors environment {{ name {SETTINGS} }} }} }}"#
    );
    let body = app.graphql(user, &query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["environmentNamespacesUpdate"].clone()
}

async fn set_application(app: &TestApp, user: (i64, &str), application: &str) -> Value {
    let query = format!(
        r#"mutation {{ environmentArgoApplicationUpdate(input: {{environmentId: "{ENVIRONMENT}", application: {application}}}) {{
            errors environment {{ name {SETTINGS} }} }} }}"#
    );
    let body = app.graphql(user, &query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["environmentArgoApplicationUpdate"].clone()
}

#[tokio::test]
async fn project_maintainers_set_the_namespaces_and_the_argo_application() {
    let (_api, served, _dir) = cluster(None).await;
    let app = gitlab(&served).await;
    let refusal =
        json!(["Only Maintainers of acme/apps/web may change its environments' settings."]);
    // A Developer may not.
    let payload = set_namespaces(&app, DEV, r#"["green"]"#).await;
    assert_eq!(payload["errors"], refusal, "{payload}");
    assert!(payload["environment"].is_null());
    assert_eq!(
        set_application(&app, DEV, r#""argocd/web""#).await["errors"],
        refusal
    );

    // A Maintainer of a group above the project may (GitLab's roles are inherited).
    let res = app
        .system_hook(&json!({"event_name": "user_add_to_group", "group_id": 2, "group_name": "apps",
            "group_path": "apps", "user_email": "rep@example.com", "user_name": "Rep", "user_username": "rep",
            "user_id": 3, "group_access": "Maintainer"}))
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let payload = set_namespaces(&app, REP, r#"["green", "blue", "green"]"#).await;
    assert_eq!(payload["errors"], json!([]), "{payload}");
    assert_eq!(
        payload["environment"]["addedNamespaces"],
        json!(["green", "blue"])
    );
    let payload = set_application(&app, REP, r#""argocd/web""#).await;
    assert_eq!(payload["environment"]["argoApplication"], "argocd/web");
    assert_eq!(
        payload["environment"]["addedNamespaces"],
        json!(["green", "blue"])
    );
    let stored = app
        .rows("SELECT namespaces, argo_application_namespace, argo_application_name FROM environment_settings")
        .await;
    assert_eq!(
        stored,
        [
            json!({"namespaces": ["green", "blue"], "argo_application_namespace": "argocd", "argo_application_name": "web"})
        ]
    );

    // Bad input in words, nothing changed; never a server error.
    for (namespaces, said) in [
        (r#"["Green"]"#, "namespaces[0]"),
        (
            &format!(
                "[{}]",
                (0..21)
                    .map(|i| format!("\"ns-{i}\""))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "at most 20",
        ),
    ] {
        let payload = set_namespaces(&app, ROOT, namespaces).await;
        assert!(
            payload["errors"][0].as_str().unwrap().contains(said),
            "{payload}"
        );
    }
    for bad in [r#""web""#, r#""argocd/Web""#, r#""a/b/c""#] {
        let payload = set_application(&app, ROOT, bad).await;
        assert!(
            payload["errors"][0]
                .as_str()
                .unwrap()
                .starts_with("application"),
            "{payload}"
        );
    }
    // An admin may; null unbinds, [] removes the namespaces.
    assert!(set_application(&app, ROOT, "null").await["environment"]["argoApplication"].is_null());
    let payload = set_namespaces(&app, ROOT, "[]").await;
    assert_eq!(payload["environment"]["addedNamespaces"], json!([]));
}

#[tokio::test]
async fn the_labels_source_applies_in_the_namespaces_added() {
    let (api, served, _dir) = cluster(None).await;
    // Blue/green: the same app labelled for `production` in a second namespace.
    api.insert(environment::deployment(
        "green",
        "web",
        "uid-green-web",
        SLUG,
    ));
    api.insert(environment::service("green", "web", "uid-green-svc", SLUG));
    let app = gitlab(&served).await;
    let names = |body: &Value| -> Vec<String> {
        let group = &body["data"]["project"]["environment"]["resourceGroup"];
        group["resources"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"))
            .iter()
            .map(|r| {
                format!(
                    "{} {}/{}",
                    r["kind"].as_str().unwrap(),
                    r["namespace"].as_str().unwrap(),
                    r["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let query = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
        addedNamespaces resourceGroup { namespace resources { kind namespace name } edges { from to type } warnings } } } }"#;
    let before = app.graphql(DEV, query).await;
    assert!(
        !names(&before).iter().any(|n| n.contains("green/")),
        "{before}"
    );

    let payload = set_namespaces(&app, ROOT, r#"["green"]"#).await;
    assert_eq!(payload["errors"], json!([]));
    let after = app.graphql(DEV, query).await;
    let shown = names(&after);
    assert!(
        shown.contains(&"Deployment green/web".to_owned()),
        "{shown:?}"
    );
    assert!(shown.contains(&"Service green/web".to_owned()), "{shown:?}");
    assert!(shown.contains(&format!("Deployment {NS}/web")), "{shown:?}");
    let group = &after["data"]["project"]["environment"]["resourceGroup"];
    assert_eq!(
        group["namespace"], NS,
        "the deployment's namespace comes first"
    );
    assert_eq!(group["warnings"], json!([]));
    // In the group's order, by apiVersion, kind, namespace, name.
    let deployments: Vec<&String> = shown
        .iter()
        .filter(|n| n.starts_with("Deployment "))
        .collect();
    assert_eq!(
        deployments,
        [
            &"Deployment green/web".to_owned(),
            &format!("Deployment {NS}/web")
        ]
    );
}

/// The environment page in Chromium: the Flux resource with its buttons, a click on
/// "Reconcile" that patches the object as the viewer and comes back to the page, whose audit
/// then shows the action; the added namespaces in the summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_page_acts_and_shows_the_audit_in_chromium() {
    use crate::dashboard::{check, shots};
    use crate::support::browser::Browser;
    use crate::support::reach::{Reach, Reached};
    use std::time::Duration;

    let Some(browser) = Browser::launch().await else {
        return;
    };
    let (api, served, _dir) = cluster(None).await;
    api.insert(environment::deployment(
        "green",
        "web",
        "uid-green-web",
        SLUG,
    ));
    let reached = Reached::new(
        Reach::Kubeconfig,
        &served,
        &[("7", 7), ("8", 8)],
        environment::AGENTS_PROJECT,
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let site = envlens::web::Site::new(&url, envlens::web::DEFAULT_SESSION_LIFETIME).unwrap();
    let mut kept = None;
    let app = TestApp::with_config_then(&reached.config("  response_timeout: 3s\n", ""), |state| {
        let state = state.with_site(site);
        kept = Some(state.clone());
        state
    })
    .await;
    let state = kept.unwrap();
    environment::seed(&app).await;
    bind(&app).await;
    set_namespaces(&app, ROOT, r#"["green"]"#).await;
    let served_state = state.clone();
    tokio::spawn(async move {
        envlens::run(
            served_state,
            listener,
            std::future::pending(),
            Duration::from_secs(1),
        )
        .await
    });

    let page = browser.page().await;
    page.screen(1440, false).await;
    let link = envlens::web::sign_in::create_link(&state.db, &url, 2)
        .await
        .unwrap();
    page.goto(&link).await;
    let r = page
        .wait_for("[...document.querySelectorAll('form button')].some(b => b.innerText.startsWith('Continue as'))", Duration::from_secs(20))
        .await;
    check(&page, "flux-sign-in", r).await;
    page.eval("document.querySelector('form button').click()")
        .await;
    let r = page
        .wait_for(
            "location.pathname === '/' && document.readyState === 'complete'",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "flux-signed-in", r).await;

    page.goto(&format!(
        "{url}/environments?project=acme/apps/web&name=production"
    ))
    .await;
    let r = page
        .wait_for(
            "!!document.querySelector('section.flux button')",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "flux-section", r).await;
    let text = page.text().await;
    assert!(text.contains("No Flux action was asked for yet."), "{text}");
    assert!(text.contains(BOUND), "{text}");
    let added = page
        .eval("document.getElementById('added-namespaces').innerText")
        .await;
    assert_eq!(added, "green");
    page.eval("[...document.querySelectorAll('section.flux button')].find(b => b.getAttribute('aria-label') === 'Reconcile Kustomization flux-system/app').click()").await;
    let r = page
        .wait_for(
            "location.pathname === '/environments' && document.querySelectorAll('tr[data-flux-action]').length === 1",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "flux-reconciled", r).await;
    let row = page
        .eval("document.querySelector('tr[data-flux-action]').innerText")
        .await;
    let row = row.as_str().unwrap();
    assert!(
        row.contains("dev") && row.contains("Reconcile") && row.contains("200"),
        "{row}"
    );
    assert!(
        ks(&api, "app")["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"].is_string()
    );
    let r = page
        .wait_for(
            "!!document.querySelector('section.flux')",
            Duration::from_secs(5),
        )
        .await;
    check(&page, "flux-after", r).await;
    page.eval("document.querySelector('section.flux').scrollIntoView()")
        .await;
    page.screenshot_screen(&shots().join("environment-flux-actions-1440-light.png"))
        .await;
}
