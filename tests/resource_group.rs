//! `Environment.resourceGroup` end to end (SPEC 5.2): a deployment recorded through the
//! internal API, the user's `user_access` to its agent, and the environment's resources listed
//! from the test Kubernetes API server as that user.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request};
use envlens::auth::mint_session;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::environment::{self, World, NS, PROJECT, SLUG};
use crate::support::kas::AGENT_SERVICE_ACCOUNT;
use crate::support::kube_api::{Fault, KubeApi, Served};
use crate::support::reach::{both_ways, Reach};
use crate::support::*;

const FORBIDDEN: &str = "You don't have access to an agent that deployed to this environment. \
    Please contact agent administrator if you are allowed in \"user_access\" in agent config file.";
const NO_RESOURCES: &str =
    "There are no resources found for the environment. Do resources have GitLab preserved labels?";

const ROOT: (i64, &str) = (1, "root");
const DEV: (i64, &str) = (2, "dev");
const REP: (i64, &str) = (3, "rep");

async fn cluster() -> (KubeApi, Served, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

const GROUP_FIELDS: &str = "agent { id name kubernetesNamespace project { fullPath } }
    namespace labelSelector health healthMessage
    resources { uid apiVersion kind namespace name labels createdAt health { status message }
                manifest events { type reason message count firstSeen lastSeen source } }
    edges { from to type } warnings errors { apiVersion kind code message }";

/// The whole response to a query of `environment`'s resource group.
async fn resource_group(app: &TestApp, user: (i64, &str), environment: &str) -> Value {
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{environment}") {{
            name resourceGroup {{ {GROUP_FIELDS} }} }} }} }}"#
    );
    app.graphql(user, &query).await
}

/// `resourceGroup` of a response without errors.
fn group_of(body: &Value) -> &Value {
    assert!(body.get("errors").is_none(), "{body}");
    &body["data"]["project"]["environment"]["resourceGroup"]
}

fn resource<'a>(group: &'a Value, kind: &str, name: &str) -> &'a Value {
    group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == kind && r["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {group}"))
}

fn list_requests(api: &KubeApi) -> Vec<crate::support::kube_api::RecordedRequest> {
    api.requests()
        .into_iter()
        .filter(|r| r.path.contains("/namespaces/"))
        .collect()
}

both_ways!(the_environment_and_what_it_owns_as_the_user_sees_it);
async fn the_environment_and_what_it_owns_as_the_user_sees_it(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, "").await;
    let body = resource_group(&app, DEV, SLUG).await;
    let group = group_of(&body);

    assert_eq!(group["agent"]["id"], "gid://gitlab/Clusters::Agent/7");
    assert_eq!(group["agent"]["name"], "prod");
    assert_eq!(group["agent"]["kubernetesNamespace"], NS);
    assert_eq!(group["agent"]["project"]["fullPath"], "acme/agents");
    assert_eq!(group["namespace"], NS);
    assert_eq!(
        group["labelSelector"],
        format!("app.gitlab.com/project_id={PROJECT},app.gitlab.com/environment_slug={SLUG}")
    );
    assert_eq!(group["warnings"], json!([]));
    assert_eq!(group["errors"], json!([]));

    // The labelled resources and what they own; staging, the unlabelled Pod and the other
    // namespace's look-alike stay out. Ordered by apiVersion, kind, namespace, name.
    let names: Vec<String> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{} {} {}", r["apiVersion"], r["kind"], r["name"]).replace('"', ""))
        .collect();
    assert_eq!(
        names,
        [
            "apps/v1 Deployment web",
            "apps/v1 ReplicaSet web-new222",
            "apps/v1 ReplicaSet web-old111",
            "batch/v1 CronJob nightly",
            "batch/v1 Job nightly-2871",
            "discovery.k8s.io/v1 EndpointSlice web-x7k2p",
            "v1 ConfigMap web-config",
            "v1 Endpoints web",
            "v1 Pod nightly-2871-q9",
            "v1 Pod web-new222-a",
            "v1 Pod web-new222-b",
            "v1 Pod web-old111-a",
            "v1 Service web",
        ]
    );

    let web = resource(group, "Deployment", "web");
    assert_eq!(web["uid"], "uid-web");
    assert_eq!(web["namespace"], NS);
    assert_eq!(web["labels"]["app.gitlab.com/environment_slug"], SLUG);
    assert_eq!(web["manifest"]["spec"]["replicas"], 2);
    assert!(web["manifest"]["metadata"].get("managedFields").is_none());
    assert!(web["manifest"]["metadata"]["creationTimestamp"].is_string());
    assert_eq!(
        web["createdAt"],
        web["manifest"]["metadata"]["creationTimestamp"]
    );
    // Two Events about it, the most recent first; none about anything else.
    let reasons: Vec<(&str, &str)> = web["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap(),
                e["lastSeen"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("ScalingReplicaSet", "2024-06-02T10:00:00Z"),
            ("ScalingReplicaSet", "2024-06-01T10:00:00Z")
        ]
    );
    assert_eq!(web["events"][0]["type"], "Normal");
    assert_eq!(web["events"][0]["count"], 1);
    assert_eq!(web["events"][0]["source"], "test");
    let backoff = &resource(group, "Pod", "web-new222-a")["events"];
    assert_eq!(backoff[0]["type"], "Warning");
    assert_eq!(resource(group, "Service", "web")["events"], json!([]));

    // Health: by Argo CD's rules per kind, null where there is none (a ConfigMap).
    assert_eq!(
        resource(group, "ConfigMap", "web-config")["health"],
        Value::Null
    );
    assert_eq!(
        resource(group, "Job", "nightly-2871")["health"]["status"],
        "HEALTHY"
    );
    assert_eq!(
        resource(group, "Service", "web")["health"]["status"],
        "HEALTHY"
    );
    // The Deployment has no status yet: Progressing, and the worst in the group.
    assert_eq!(web["health"]["status"], "PROGRESSING");
    let worst = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["health"]["status"].as_str())
        .max_by_key(|s| {
            [
                "HEALTHY",
                "SUSPENDED",
                "PROGRESSING",
                "MISSING",
                "DEGRADED",
                "UNKNOWN",
            ]
            .iter()
            .position(|o| o == s)
        })
        .unwrap();
    assert_eq!(group["health"], worst);
    // The message names the first three resources of the worst status, in resource order.
    let causes: Vec<String> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["health"]["status"] == worst)
        .map(|r| format!("{} {}/{}", r["kind"], r["namespace"], r["name"]).replace('"', ""))
        .collect();
    let message = group["healthMessage"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("Caused by {}", causes[0])),
        "{message}"
    );
    for cause in causes.iter().take(3) {
        assert!(message.contains(cause.as_str()), "{cause} in {message}");
    }
    if causes.len() > 3 {
        assert!(
            message.ends_with(&format!("; and {} more", causes.len() - 3)),
            "{message}"
        );
    }

    // Edges, parent to child, between resources of the group.
    let edges: BTreeSet<(String, String, String)> = group["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_owned();
            (s("from"), s("to"), s("type"))
        })
        .collect();
    let edge = |from: &str, to: &str, kind: &str| (from.into(), to.into(), kind.into());
    for expected in [
        edge("uid-web", "uid-rs-web-new222", "OWNER"),
        edge("uid-rs-web-new222", "uid-pod-web-new222-b", "OWNER"),
        edge("uid-svc-web", "uid-slice-web", "OWNER"),
        edge("uid-svc-web", "uid-ep-web", "ENDPOINTS"),
        edge("uid-svc-web", "uid-web", "SERVICE_SELECTOR"),
        edge("uid-cron", "uid-job", "OWNER"),
        edge("uid-job", "uid-job-pod", "OWNER"),
    ] {
        assert!(edges.contains(&expected), "{expected:?} not in {edges:?}");
    }
    let uids: BTreeSet<&str> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uid"].as_str().unwrap())
        .collect();
    for (from, to, _) in &edges {
        assert!(uids.contains(from.as_str()) && uids.contains(to.as_str()));
    }

    // The watch cache lists as the agent; what the user may see is asked of the cluster with a
    // SubjectAccessReview per kind, naming the identity KAS impersonates for `access_as: user`.
    let lists = list_requests(&api);
    assert!(lists.len() > 10, "{}", lists.len());
    for r in &lists {
        assert_eq!(r.impersonate_user, app.own_identity(true), "{}", r.path);
        assert!(r.path.contains(&format!("/namespaces/{NS}/")), "{}", r.path);
    }
    let reviews: Vec<Value> = api
        .requests()
        .into_iter()
        .filter(|r| r.path == "/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert!(reviews.len() > 10, "{}", reviews.len());
    for review in &reviews {
        let spec = &review["spec"];
        assert_eq!(spec["user"], "gitlab:user:dev");
        assert_eq!(
            spec["groups"],
            json!([
                "gitlab:user",
                "gitlab:project_role:42:guest",
                "gitlab:project_role:42:planner",
                "gitlab:project_role:42:reporter",
                "gitlab:project_role:42:developer"
            ])
        );
        assert_eq!(spec["extra"]["agent.gitlab.com/id"], json!(["7"]));
        assert_eq!(
            spec["extra"]["agent.gitlab.com/access_type"],
            json!(["personal_access_token"])
        );
        assert_eq!(spec["resourceAttributes"]["namespace"], NS);
    }
}

both_ways!(plain_and_resolved_selections_answer_alike);
/// Resources and edges selected with plain fields are written straight into the answer
/// (`graphql::plain`); a fragment or a directive anywhere in the selection sends them through
/// async-graphql's resolvers. Both must answer alike.
async fn plain_and_resolved_selections_answer_alike(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, "").await;
    let query = |group: &str, fragments: &str| {
        format!(
            r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
                resourceGroup {{ {group} }} }} }} }} {fragments}"#
        )
    };
    let plain = app.graphql(DEV, &query(GROUP_FIELDS, "")).await;
    let resolved_fields = GROUP_FIELDS
        .replace("resources {", "resources { ...Resource ")
        .replace("edges { from", "edges { from @include(if: true)");
    let fragment = "fragment Resource on KubernetesResource { __typename }";
    let resolved = app.graphql(DEV, &query(&resolved_fields, fragment)).await;
    let mut resolved_group = group_of(&resolved).clone();
    for resource in resolved_group["resources"].as_array_mut().unwrap() {
        assert_eq!(
            resource.as_object_mut().unwrap().remove("__typename"),
            Some(json!("KubernetesResource"))
        );
    }
    let plain_group = group_of(&plain);
    assert!(plain_group["resources"].as_array().unwrap().len() > 10);
    assert!(plain_group["edges"].as_array().unwrap().len() > 5);
    assert_eq!(plain_group, &resolved_group);

    // Aliases name the fields; a key given twice is merged, as async-graphql does.
    let aliased = "resources { id: uid kind health { status } health { message } }
        edges { parent: from child: to }";
    let aliased = app.graphql(DEV, &query(aliased, "")).await;
    let first = &group_of(&aliased)["resources"][0];
    let mut keys: Vec<&String> = first.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["health", "id", "kind"]);
    assert_eq!(first["id"], plain_group["resources"][0]["uid"]);
    assert_eq!(first["health"], plain_group["resources"][0]["health"]);
    let edge = &group_of(&aliased)["edges"][0];
    assert_eq!(edge["parent"], plain_group["edges"][0]["from"]);
    assert_eq!(edge["child"], plain_group["edges"][0]["to"]);
}

both_ways!(secret_values_are_masked_in_manifests_but_not_through_the_proxy);
/// SPEC 5.2: a Secret's values never leave envlens in a manifest, however the Secret joins the
/// group and whichever path answers (plain or resolved); the Kubernetes proxy is the cluster's
/// own API and answers the Secret as the cluster holds it.
async fn secret_values_are_masked_in_manifests_but_not_through_the_proxy(reach: Reach) {
    use crate::support::environment::{gitlab_labels, meta, owner_ref};
    const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
    let (api, served, _dir) = cluster().await;
    // "hunter2", "admin", "s3cr3t-token", "sealed-value" in base64.
    let secrets = [
        (
            "db",
            json!({"password": "aHVudGVyMg==", "user": "YWRtaW4="}),
        ),
        ("sealed", json!({"value": "c2VhbGVkLXZhbHVl"})),
        ("api-token", json!({"token": "czNjcjN0LXRva2Vu"})),
    ];
    // Labelled, as a chart applies it.
    let mut db = meta(NS, "db", "uid-secret-db", gitlab_labels(SLUG, "db"));
    db["annotations"] = json!({"note": "rotated monthly"});
    api.insert(json!({"apiVersion": "v1", "kind": "Secret", "metadata": db, "type": "Opaque", "data": secrets[0].1}));
    // Owned by a labelled custom resource whose controller copies its labels (a SealedSecret).
    api.add_kind(
        "bitnami.com",
        "v1alpha1",
        "SealedSecret",
        "sealedsecrets",
        true,
    );
    api.insert(
        json!({"apiVersion": "bitnami.com/v1alpha1", "kind": "SealedSecret",
        "metadata": meta(NS, "sealed", "uid-sealed", gitlab_labels(SLUG, "sealed")),
        "spec": {"encryptedData": {"value": "AgBy3i4OJSWK+PiTySYZZA9rO43cGDEq"}}}),
    );
    let mut sealed = meta(
        NS,
        "sealed",
        "uid-secret-sealed",
        gitlab_labels(SLUG, "sealed"),
    );
    sealed["ownerReferences"] = owner_ref(
        "bitnami.com/v1alpha1",
        "SealedSecret",
        "sealed",
        "uid-sealed",
    );
    api.insert(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": sealed, "data": secrets[1].1}),
    );
    // Applied with `stringData` by `kubectl apply`, which keeps it in the annotation.
    let applied = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "api-token", "namespace": NS, "labels": gitlab_labels(SLUG, "api")},
        "stringData": {"token": "s3cr3t-token"}});
    let mut token = meta(
        NS,
        "api-token",
        "uid-secret-token",
        gitlab_labels(SLUG, "api"),
    );
    token["annotations"] = json!({LAST_APPLIED: applied.to_string()});
    api.insert(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": token, "data": secrets[2].1}),
    );
    let app = environment::gitlab_via(reach, &served, "").await;

    let plain = resource_group(&app, DEV, SLUG).await;
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
            resourceGroup {{ resources {{ ...Resource }} }} }} }} }}
           fragment Resource on KubernetesResource {{ kind name manifest }}"#
    );
    let resolved = app.graphql(DEV, &query).await;
    for body in [&plain, &resolved] {
        let group = group_of(body);
        for (name, data) in &secrets {
            let manifest = &resource(group, "Secret", name)["manifest"];
            let keys: Vec<&String> = data.as_object().unwrap().keys().collect();
            let masked: Vec<&String> = manifest["data"].as_object().unwrap().keys().collect();
            assert_eq!(masked, keys, "{name}: the keys stay");
            for (key, value) in manifest["data"].as_object().unwrap() {
                assert_eq!(value, "++++++++", "{name}.{key}");
            }
            assert_eq!(manifest["metadata"]["name"], *name);
        }
        let token = &resource(group, "Secret", "api-token")["manifest"];
        assert_eq!(token["metadata"]["annotations"][LAST_APPLIED], "++++++++");
        let db = &resource(group, "Secret", "db")["manifest"];
        assert_eq!(db["metadata"]["annotations"]["note"], "rotated monthly");
        assert_eq!(db["type"], "Opaque");
        // Nothing of any value, in any form, anywhere in the answer.
        let text = body.to_string();
        for secret in [
            "aHVudGVy", "YWRtaW4", "c2VhbGVk", "czNjcjN0", "s3cr3t", "hunter2",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        // Other kinds keep their data.
        let sealed = &resource(group, "SealedSecret", "sealed")["manifest"];
        assert_eq!(
            sealed["spec"]["encryptedData"]["value"],
            "AgBy3i4OJSWK+PiTySYZZA9rO43cGDEq"
        );
    }
    // The owned Secret hangs under its owner.
    assert!(group_of(&plain)["edges"]
        .as_array()
        .unwrap()
        .contains(&json!({"from": "uid-sealed", "to": "uid-secret-sealed", "type": "OWNER"})));

    let (session, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    let proxied = app
        .send(
            Request::get(format!(
                "/k8s-proxy/api/v1/namespaces/{NS}/secrets/api-token"
            ))
            .header(header::AUTHORIZATION, format!("Bearer {session}"))
            .header("Gitlab-Agent-Id", "7")
            .body(Body::empty())
            .unwrap(),
        )
        .await;
    assert_eq!(proxied.status, 200, "{}", proxied.text());
    let secret = proxied.json();
    assert_eq!(secret["data"], secrets[2].1);
    assert_eq!(
        secret["metadata"]["annotations"][LAST_APPLIED],
        applied.to_string()
    );
}

both_ways!(a_user_without_user_access_is_refused_and_the_cluster_never_asked);
async fn a_user_without_user_access_is_refused_and_the_cluster_never_asked(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, "").await;
    // rep reads the project (reporter) but is not a developer: no user_access.
    let body = resource_group(&app, REP, SLUG).await;
    assert_eq!(body["data"]["project"]["environment"]["name"], SLUG);
    assert_eq!(
        body["data"]["project"]["environment"]["resourceGroup"],
        Value::Null
    );
    assert_eq!(body["errors"][0]["message"], FORBIDDEN);
    assert_eq!(body["errors"][0]["extensions"]["code"], "FORBIDDEN");
    assert_eq!(
        body["errors"][0]["path"],
        json!(["project", "environment", "resourceGroup"])
    );
    assert!(list_requests(&api).is_empty());

    // An administrator counts as owner everywhere.
    let body = resource_group(&app, ROOT, SLUG).await;
    assert_eq!(group_of(&body)["resources"].as_array().unwrap().len(), 13);
}

both_ways!(a_refused_kind_is_reported_and_the_rest_still_answers);
async fn a_refused_kind_is_reported_and_the_rest_still_answers(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    api.deny(|r| r.resource == "configmaps" && r.user == "gitlab:user:dev");
    let app = environment::gitlab_via(reach, &served, "").await;
    let body = resource_group(&app, DEV, SLUG).await;
    let group = group_of(&body);
    assert_eq!(group["errors"].as_array().unwrap().len(), 1, "{group}");
    let error = &group["errors"][0];
    assert_eq!(error["apiVersion"], "v1");
    assert_eq!(error["kind"], "ConfigMap");
    assert_eq!(error["code"], 403);
    assert!(
        error["message"].as_str().unwrap().contains("forbidden"),
        "{error}"
    );
    let kinds: BTreeSet<&str> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert!(!kinds.contains("ConfigMap"));
    assert!(
        kinds.contains("Deployment") && kinds.contains("Pod"),
        "{kinds:?}"
    );
}

both_ways!(empty_groups_warn_and_environments_without_an_agent_deployment_have_none);
async fn empty_groups_warn_and_environments_without_an_agent_deployment_have_none(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, "").await;
    let body = resource_group(&app, DEV, "review").await;
    let group = group_of(&body);
    assert_eq!(group["resources"], json!([]));
    assert_eq!(group["edges"], json!([]));
    assert_eq!(group["warnings"], json!([NO_RESOURCES]));
    assert_eq!(group["health"], "HEALTHY");
    assert_eq!(group["healthMessage"], Value::Null);
    assert_eq!(
        group["labelSelector"],
        format!("app.gitlab.com/project_id={PROJECT},app.gitlab.com/environment_slug=review")
    );

    // canary's only deployment failed: there is no successful deployment to show.
    let body = resource_group(&app, DEV, "canary").await;
    assert_eq!(group_of(&body), &Value::Null);
}

both_ways!(an_unreachable_cluster_is_a_bad_gateway_error);
async fn an_unreachable_cluster_is_a_bad_gateway_error(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, "").await;
    served.shutdown().await;
    let body = resource_group(&app, DEV, SLUG).await;
    assert_eq!(
        body["data"]["project"]["environment"]["resourceGroup"],
        Value::Null
    );
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_GATEWAY",
        "{body}"
    );
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot reach the cluster"),
        "{body}"
    );
}

both_ways!(the_database_connection_is_released_while_the_cluster_answers);
/// A slow cluster must not hold the request's database connection: while the lists wait, the
/// pool has every connection back.
async fn the_database_connection_is_released_while_the_cluster_answers(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, "").await;
    // Discovery first, so that the delay below falls on the lists only.
    let _ = resource_group(&app, DEV, SLUG).await;
    api.fault(|r| (r.verb == "list").then_some(Fault::Delay(Duration::from_millis(800))));
    let idle_before = app.db.num_idle();
    let (body, in_use) = tokio::join!(resource_group(&app, DEV, SLUG), async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        app.db.size() as usize - app.db.num_idle()
    });
    assert_eq!(group_of(&body)["resources"].as_array().unwrap().len(), 13);
    assert_eq!(
        in_use, 0,
        "connections in use while listing (idle before: {idle_before})"
    );
}

both_ways!(resource_groups_count_against_the_complexity_limit);
async fn resource_groups_count_against_the_complexity_limit(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, "").await;
    let (token, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    let query = r#"{ group(fullPath: "acme") { environments(first: 20) {
        nodes { resourceGroup { namespace } } } } }"#;
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "query": query }).to_string()))
        .unwrap();
    let res = app.send(req).await;
    // 20 environments, each a group (500) with its namespace.
    assert_eq!(
        res.json()["errors"][0]["message"],
        "Query has complexity of 10041, which exceeds max complexity of 5000"
    );
    assert!(list_requests(&api).is_empty());
}

both_ways!(health_scripts_judge_the_resource_group);
/// The user's health scripts (SPEC 11) judge the resource group too: a folder laid out as Argo
/// CD's `resource_customizations` and an inline script, each over the whole object (fields that
/// the group does not otherwise keep), overriding the built-in rule of its kind.
async fn health_scripts_judge_the_resource_group(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    environment::widgets(&api);
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lua");
    let config = format!(
        "health:\n  customizations: {folder}\n  scripts:\n    apps_Deployment: |\n      \
         local c = obj.spec.template.spec.containers[1]\n      \
         return {{status = \"Degraded\", message = c.name .. \" runs \" .. c.image}}\n"
    );
    let app = environment::gitlab_via(reach, &served, &config).await;
    let body = resource_group(&app, DEV, SLUG).await;
    let group = group_of(&body);
    let health = |kind: &str, name: &str| resource(group, kind, name)["health"].clone();
    assert_eq!(
        health("Deployment", "web"),
        json!({"status": "DEGRADED", "message": "app runs nginx"})
    );
    // tests/fixtures/lua/example.com/Widget/health.lua, instead of the Ready condition.
    assert_eq!(
        health("Widget", "banner"),
        json!({"status": "PROGRESSING", "message": "0% ready"})
    );
    // ConfigMap/health.lua returns nil without data: no health, as without a script.
    assert_eq!(health("ConfigMap", "web-config"), Value::Null);
    // Kinds without a script keep their rules.
    assert_eq!(health("Service", "web")["status"], "HEALTHY");
}

/// A health script that does not compile costs only its own kind: envlens starts, that kind
/// is Unknown with the reason, the other scripts and rules judge theirs, and `/metrics` counts
/// it.
#[tokio::test]
async fn a_health_script_that_does_not_compile_costs_only_its_kind() {
    let (api, served, _dir) = cluster().await;
    environment::widgets(&api);
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lua");
    let config =
        format!("health:\n  customizations: {folder}\n  scripts:\n    ConfigMap: 'return {{'\n");
    let app = environment::gitlab_with(&served, &config).await;
    let body = resource_group(&app, DEV, SLUG).await;
    let group = group_of(&body);
    let health = |kind: &str, name: &str| resource(group, kind, name)["health"].clone();
    let config_map = health("ConfigMap", "web-config");
    assert_eq!(config_map["status"], "UNKNOWN", "{config_map}");
    let message = config_map["message"].as_str().unwrap();
    assert!(
        message.starts_with("does not compile: health.scripts.ConfigMap:1:"),
        "{message}"
    );
    assert_eq!(
        health("Widget", "banner"),
        json!({"status": "PROGRESSING", "message": "0% ready"})
    );
    assert_eq!(health("Service", "web")["status"], "HEALTHY");
    let metrics = app
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .text();
    assert!(
        metrics.contains("\nenvlens_health_scripts_not_compiled 1\n"),
        "{metrics}"
    );
    // Unknown keys of the configuration are still refused.
    let err = envlens::config::file::Settings::parse("health:\n  script: {}\n").unwrap_err();
    assert!(format!("{err:#}").contains("script"), "{err:#}");
}

/// The raw answer to `query`, sent as `user`.
async fn graphql_text(app: &TestApp, user: (i64, &str), query: &str) -> String {
    let (token, _) = mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(600)).unwrap();
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "query": query }).to_string()))
        .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.headers[header::CONTENT_TYPE], "application/json");
    let text = res.text();
    assert!(
        !text.contains("envlens.splice."),
        "a placeholder leaked: {text}"
    );
    text
}

both_ways!(memoised_answers_are_the_resolved_ones_byte_for_byte);
/// `POST /api/graphql` writes the text of a plain `resources` or `edges` selection rendered
/// once per shared group and selection (`graphql::splice`). Byte for byte, that answer is the
/// one async-graphql resolves (the same selection inside an inline fragment, which no memo
/// serves), the first view and the memoised ones alike, whatever the selection, aliases
/// included, with `errors` entries of the group and of the answer; and one identity's text is
/// never another's.
async fn memoised_answers_are_the_resolved_ones_byte_for_byte(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    api.deny(|r| r.resource == "configmaps" && r.user == "gitlab:user:dev");
    let app = environment::gitlab_via(reach, &served, "").await;
    let query = |group: &str, resolved: bool| {
        let group = if resolved {
            group
                .replace("resources {", "resources { ... on KubernetesResource {")
                .replace("edges {", "edges { ... on ResourceEdge {")
                .replace('$', "} }")
        } else {
            group.replace('$', "}")
        };
        format!(
            r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
                name resourceGroup {{ {group} }} }} }} }}"#
        )
    };
    // `$` ends each of `resources` and `edges`, so that the resolved form can close its
    // fragment there.
    let selections = [
        "namespace errors { apiVersion kind code message }
         resources { uid apiVersion kind namespace name labels createdAt health { status message }
                     events { type reason message count firstSeen lastSeen source } $
         edges { from to type $ warnings",
        "resources { uid $ errors { kind }",
        "resources { id: uid k: kind health { s: status } manifest $ edges { a: from b: to $",
        "edges { type from $ resources { name labels $ health",
        "r: resources { uid $ resources { kind $ e: edges { to $",
    ];
    for selection in selections {
        let resolved = graphql_text(&app, DEV, &query(selection, true)).await;
        let first = graphql_text(&app, DEV, &query(selection, false)).await;
        let again = graphql_text(&app, DEV, &query(selection, false)).await;
        assert_eq!(first, resolved, "{selection}");
        assert_eq!(again, resolved, "{selection}");
        let body: Value = serde_json::from_str(&first).unwrap();
        let group = group_of(&body);
        if group.get("errors").is_some() {
            assert_eq!(group["errors"][0]["kind"], "ConfigMap", "{group}");
        }
        let resources = group["resources"].as_array().or(group["r"].as_array());
        assert!(resources.unwrap().len() > 10, "{group}");
    }

    // The same group twice in one answer, and an error beside it: each placeholder is its own.
    let twice = format!(
        r#"{{ a: project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
              resourceGroup {{ resources {{ uid }} edges {{ from }} }} }} }}
            b: project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
              resourceGroup {{ resources {{ kind }} }} }} }}
            c: project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
              deployments(first: -1) {{ nodes {{ id }} }} }} }} }}"#
    );
    let text = graphql_text(&app, DEV, &twice).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert!(
        body["errors"].as_array().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    let a = &body["data"]["a"]["environment"]["resourceGroup"];
    let b = &body["data"]["b"]["environment"]["resourceGroup"];
    assert_eq!(
        a["resources"].as_array().unwrap().len(),
        b["resources"].as_array().unwrap().len()
    );
    assert!(a["resources"][0]["uid"].is_string() && b["resources"][0]["kind"].is_string());
    assert!(a["edges"][0]["from"].is_string());

    // Another identity is allowed ConfigMaps: its group (and text) is its own.
    let root = graphql_text(&app, ROOT, &query(selections[0], false)).await;
    let dev = graphql_text(&app, DEV, &query(selections[0], false)).await;
    let (root, dev): (Value, Value) = (
        serde_json::from_str(&root).unwrap(),
        serde_json::from_str(&dev).unwrap(),
    );
    let has_config_maps = |body: &Value| {
        group_of(body)["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "ConfigMap")
    };
    assert!(has_config_maps(&root), "{root}");
    assert!(!has_config_maps(&dev));
    assert_eq!(group_of(&root)["errors"], json!([]));
}

/// The chart's service account (SPEC 13), as the test cluster authenticates envlens' token.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:gitlab:envlens";

/// envlens' own identity narrowed, as the chart installs its service account (or, through KAS,
/// as an agent's ServiceAccount may be bound): RBAC enforced, and a ClusterRole that names what
/// it reads, Secrets left out. Returns that identity.
fn narrowed_service_account(api: &KubeApi, reach: Reach) -> &'static str {
    let (user, namespace, name) = match reach {
        Reach::Kubeconfig => {
            api.add_token(
                "test-token",
                SERVICE_ACCOUNT,
                &["system:serviceaccounts", "system:serviceaccounts:gitlab"],
            );
            (SERVICE_ACCOUNT, "gitlab", "envlens")
        }
        Reach::Kas => (AGENT_SERVICE_ACCOUNT, "gitlab-agent", "gitlab-agent"),
    };
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "envlens"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "endpoints", "events", "persistentvolumeclaims",
                "pods", "serviceaccounts", "services"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps", "autoscaling", "batch", "discovery.k8s.io", "networking.k8s.io",
                "rbac.authorization.k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]}));
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "envlens"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "envlens"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}));
    api.enforce_rbac();
    user
}

/// Agent 7 with `access_as: {agent: {}}`: its users read with envlens' own identity.
pub async fn as_the_agent(world: &World) {
    world
        .configure(7, &environment::agent_config("agent"))
        .await;
}

fn labelled_secret(api: &KubeApi) {
    use crate::support::environment::{gitlab_labels, meta};
    api.insert(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": {"password": "aHVudGVyMg=="},
        "metadata": meta(NS, "db", "uid-secret-db", gitlab_labels(SLUG, "db"))}));
}

both_ways!(as_itself_envlens_lists_only_what_it_may_and_names_the_rest);
/// SPEC 13: read as envlens' own identity, a resource group shows only the kinds that identity
/// may list in the namespace (one SelfSubjectRulesReview, reused) and names the others once in
/// `warnings`. A kubeconfig's or the agent's identity is not the chart's: the first view's lists
/// go beside the review, so a refused kind is listed once (the 403 dropped unseen), never
/// watched, and never listed again once the rules are known.
async fn as_itself_envlens_lists_only_what_it_may_and_names_the_rest(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    labelled_secret(&api);
    narrowed_service_account(&api, reach);
    let app = environment::gitlab_via(reach, &served, "").await;
    as_the_agent(&app).await;
    for _ in 0..2 {
        let body = resource_group(&app, DEV, SLUG).await;
        let group = group_of(&body);
        assert_eq!(group["errors"], json!([]), "{group}");
        assert_eq!(
            group["warnings"],
            json!(["envlens may not list secrets in namespace shop: not shown"]),
            "{group}"
        );
        let kinds: BTreeSet<&str> = group["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["kind"].as_str().unwrap())
            .collect();
        assert!(!kinds.contains("Secret"), "{kinds:?}");
        assert!(
            kinds.contains("Deployment") && kinds.contains("Pod"),
            "{kinds:?}"
        );
    }
    assert_eq!(
        api.request_count("list", "secrets"),
        1,
        "the first view's list"
    );
    for verb in ["watch", "get"] {
        assert_eq!(api.request_count(verb, "secrets"), 0, "{verb} of secrets");
    }
    // Asked once for the namespace, whoever read it (the views, the history's snapshot).
    assert_eq!(
        api.request_count("create", "selfsubjectrulesreviews.authorization.k8s.io"),
        1
    );
}

both_ways!(a_first_views_lists_do_not_wait_for_the_rules_review);
/// The first view of a namespace sends its lists beside the identity's SelfSubjectRulesReview,
/// not after its answer (through KAS it is one more round trip before any list), and still
/// shows nothing of a kind the rules refuse.
async fn a_first_views_lists_do_not_wait_for_the_rules_review(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    labelled_secret(&api);
    narrowed_service_account(&api, reach);
    // Each review is answered only this long after it arrives, when its arrival is noted:
    // under the 3 s that envlens waits for a review here (`response_timeout`).
    let held = Duration::from_secs(2);
    let reviewed = Arc::new(Mutex::new(None::<Instant>));
    let noted = reviewed.clone();
    api.fault(move |request| {
        (request.resource == "selfsubjectrulesreviews").then(|| {
            noted.lock().unwrap().get_or_insert_with(Instant::now);
            Fault::Delay(held)
        })
    });
    let app = environment::gitlab_via(reach, &served, "").await;
    as_the_agent(&app).await;
    let (body, listed) = tokio::join!(resource_group(&app, DEV, SLUG), async {
        while api.request_count("list", "deployments.apps") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Instant::now()
    });
    let done = Instant::now();
    let reviewed = reviewed.lock().unwrap().expect("the rules were asked");
    // The lists went before the review could answer, and the view waited for it.
    assert!(
        listed < reviewed + held,
        "the lists waited {:?} after the review arrived",
        listed.saturating_duration_since(reviewed)
    );
    assert!(
        done >= reviewed + held,
        "the view did not wait for the review"
    );
    let group = group_of(&body);
    assert_eq!(group["errors"], json!([]), "{group}");
    assert_eq!(
        group["warnings"],
        json!(["envlens may not list secrets in namespace shop: not shown"]),
        "{group}"
    );
    let kinds: BTreeSet<&str> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert!(
        !kinds.contains("Secret") && kinds.contains("Deployment"),
        "{kinds:?}"
    );
    assert_eq!(api.request_count("watch", "secrets"), 0);
}

both_ways!(without_rules_reviews_every_kind_is_tried_and_refusals_reported);
/// A cluster that does not serve SelfSubjectRulesReview: every kind is tried, and the refusal
/// is reported for its kind, as before.
async fn without_rules_reviews_every_kind_is_tried_and_refusals_reported(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    labelled_secret(&api);
    let identity = narrowed_service_account(&api, reach);
    api.remove_kind("authorization.k8s.io", "v1", "selfsubjectrulesreviews");
    let app = environment::gitlab_via(reach, &served, "").await;
    as_the_agent(&app).await;
    let body = resource_group(&app, DEV, SLUG).await;
    let group = group_of(&body);
    let errors = group["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{group}");
    assert_eq!(
        (&errors[0]["kind"], &errors[0]["code"]),
        (&json!("Secret"), &json!(403))
    );
    assert!(
        errors[0]["message"].as_str().unwrap().contains(identity),
        "{group}"
    );
    assert!(
        !group["warnings"].to_string().contains("may not list"),
        "{group}"
    );
}
