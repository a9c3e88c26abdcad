//! A GitOps environment's group live (SPEC 15 with 8.1 and 8.2): read through the watch cache,
//! a watch set per namespace it spans and a cluster-wide watch of its cluster-scoped kinds, so
//! that a warm view asks nothing of the cluster yet follows every change; and
//! `resourceGroupUpdated` following its inventory's objects in every namespace and the Flux
//! objects themselves.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::gitops::{cluster, deploy_bound, deployment, kustomization, path, ready, DEV, KS};
use crate::subscriptions::{update_of, Client};
use crate::support::environment::{self, meta};
use crate::support::gitops::bind_through_gitlab;
use crate::support::kube_api::KubeApi;
use crate::support::reach::{both_ways, Reach};

/// A Kustomization in flux-system applying a Namespace, a ClusterRole and objects in two
/// namespaces (blue, green).
fn apps(api: &KubeApi) {
    api.insert(kustomization(
        "flux-system",
        "apps",
        &[
            ("_blue__Namespace", "v1"),
            ("_shop__reader_rbac.authorization.k8s.io_ClusterRole", "v1"),
            ("blue_web_apps_Deployment", "v1"),
            ("green_web_apps_Deployment", "v1"),
            ("green_web__Service", "v1"),
        ],
        ready("True", "ReconciliationSucceeded"),
    ));
    api.insert(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "blue", "uid": "uid-ns-blue"}}));
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "shop:reader", "uid": "uid-cr"}, "rules": []}),
    );
    api.insert(deployment("blue", "web", "uid-blue-web"));
    api.insert(deployment("green", "web", "uid-green-web"));
    api.insert(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": meta("green", "web", "uid-green-svc", json!({})), "spec": {"selector": {"app": "web"}}}));
}

/// How environment `flux` (120) is bound to the Kustomization `apps` (SPEC 15).
#[derive(Debug, Clone, Copy)]
enum Binding {
    /// A successful deployment job with `dashboard: flux_resource_path`.
    DeploymentJob,
    /// No deployment: GitLab's `cluster_agent` and `flux_resource_path`, as the sync reads them.
    ClusterAgent,
}

async fn bind(app: &crate::support::TestApp, how: Binding) {
    let flux = path(KS, "kustomizations", "flux-system", "apps");
    match how {
        Binding::DeploymentJob => deploy_bound(app, 20, (120, "flux"), &flux).await,
        Binding::ClusterAgent => bind_through_gitlab(app, (120, "flux"), &flux).await,
    }
}

/// The three changes both live tests follow: green/web unavailable (an inventory object in a
/// namespace of its own), a label on the Namespace blue (a cluster-scoped entry), the
/// Kustomization failing (the source itself).
fn make_green_web_unavailable(api: &KubeApi) {
    let mut web = api.get("deployments", Some("green"), "web").unwrap();
    web["status"]["readyReplicas"] = json!(0);
    web["status"]["availableReplicas"] = json!(0);
    api.insert(web);
}

fn label_namespace_blue(api: &KubeApi) {
    let mut ns = api.get("namespaces", None, "blue").unwrap();
    ns["metadata"]["labels"] = json!({"team": "blue"});
    api.insert(ns);
}

/// The Kustomization `apps` as kustomize-controller leaves it: `change`d.
fn change_apps(api: &KubeApi, change: impl FnOnce(&mut Value)) {
    let mut ks = api
        .get(
            "kustomizations.kustomize.toolkit.fluxcd.io",
            Some("flux-system"),
            "apps",
        )
        .unwrap();
    change(&mut ks);
    api.insert(ks);
}

fn fail_apps(api: &KubeApi) {
    change_apps(api, |ks| {
        ks["status"]["conditions"] = ready("False", "BuildFailed")
    });
}

/// The environment `flux` with its group: each resource's health and labels, each source's
/// sync status.
async fn group(app: &crate::support::TestApp, env: &str) -> Value {
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{env}") {{
            fluxSyncStatus
            resourceGroup {{ namespaces warnings sources {{ kind name fluxSyncStatus }}
              resources {{ uid kind namespace name labels health {{ status }} fluxSyncStatus }}
              edges {{ from to type }} errors {{ kind code message }} }} }} }} }}"#
    );
    let body = app.graphql(DEV, &query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["project"]["environment"].clone()
}

fn resource<'a>(env: &'a Value, kind: &str, name: &str) -> &'a Value {
    env["resourceGroup"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == kind && r["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {env}"))
}

/// Views `env` until `shown` holds (within 10 s), each view a GraphQL request.
async fn until(app: &crate::support::TestApp, what: &str, shown: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let env = group(app, "flux").await;
        if shown(&env) {
            return env;
        }
        assert!(Instant::now() < deadline, "{what}: never shown\n{env}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

both_ways!(a_warm_gitops_view_asks_nothing_of_the_cluster_and_follows_changes);
async fn a_warm_gitops_view_asks_nothing_of_the_cluster_and_follows_changes(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    apps(&api);
    let world = environment::gitlab_via(reach, &served, "").await;
    bind(&world, Binding::DeploymentJob).await;
    let first = group(&world, "flux").await;
    for (kind, name) in [
        ("Namespace", "blue"),
        ("ClusterRole", "shop:reader"),
        ("Deployment", "web"),
        ("Service", "web"),
        ("Kustomization", "apps"),
    ] {
        resource(&first, kind, name);
    }

    // The watches are open; nothing but them from here on.
    api.reset_request_counts();
    let second = group(&world, "flux").await;
    assert_eq!(first, second);
    let asked: Vec<_> = api
        .request_counts()
        .into_iter()
        .filter(|((verb, _), _)| verb != "watch")
        .collect();
    assert_eq!(asked, [], "a warm view of a GitOps group");

    // Yet it follows the cluster: an object of another namespace than the labels', a
    // cluster-scoped entry, and the Kustomization itself.
    make_green_web_unavailable(&api);
    until(&world, "green/web unavailable", |env| {
        env["resourceGroup"]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| {
                r["namespace"] == "green"
                    && r["kind"] == "Deployment"
                    && r["health"]["status"] != "HEALTHY"
            })
    })
    .await;
    label_namespace_blue(&api);
    until(&world, "the Namespace's new label", |env| {
        resource(env, "Namespace", "blue")["labels"]["team"] == "blue"
    })
    .await;
    fail_apps(&api);
    // The environment's own status is read beside the group, maybe a moment before the
    // change arrives: both come to show it.
    until(&world, "the Kustomization failing", |env| {
        env["resourceGroup"]["sources"][0]["fluxSyncStatus"] == "FAILED"
            && env["fluxSyncStatus"] == "FAILED"
    })
    .await;
}

/// The subscription of the environment `flux`, its resources' kind, name, health, labels and
/// sync status.
const SUBSCRIPTION: &str = "subscription($id: ID!) { resourceGroupUpdated(environmentId: $id) {
    complete health upserted { uid kind namespace name labels health { status } fluxSyncStatus }
    removed warnings errors { kind code message } } }";

/// The uids of what `update` upserted.
fn upserted(update: &Value) -> Vec<String> {
    update["upserted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uid"].as_str().unwrap().to_owned())
        .collect()
}

/// The next update of subscription "1" that upserts `uid` (within 10 s): messages about
/// nothing else may come first (a watch starting), never one that misses it.
async fn update_about(client: &mut Client, uid: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no message about {uid}");
        let payload = client.next_payload("1").await;
        let update = update_of(&payload).clone();
        if upserted(&update).iter().any(|u| u == uid) {
            return update;
        }
    }
}

both_ways!(a_gitops_subscriber_hears_of_its_objects_in_every_namespace_and_of_its_flux_object);
async fn a_gitops_subscriber_hears_of_its_objects_in_every_namespace_and_of_its_flux_object(
    reach: Reach,
) {
    subscriber_hears_everything(reach, Binding::DeploymentJob).await;
}

both_ways!(an_environment_bound_by_gitlabs_cluster_agent_alone_has_its_subscription);
/// No deployment job, no `agent_deployments` row: the subscription finds the agent as the view
/// does, and follows the same group.
async fn an_environment_bound_by_gitlabs_cluster_agent_alone_has_its_subscription(reach: Reach) {
    subscriber_hears_everything(reach, Binding::ClusterAgent).await;
}

/// The whole group first, the same as a view's; then a message about a changed object of
/// another namespace than the labels', about a cluster-scoped entry, about the Kustomization.
async fn subscriber_hears_everything(reach: Reach, how: Binding) {
    let (api, served, _dir) = cluster().await;
    apps(&api);
    let server = crate::subscriptions::start(reach, &served).await;
    bind(&server.app, how).await;
    let viewed = group(&server.app, "flux").await;
    let mut viewed: Vec<String> = viewed["resourceGroup"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uid"].as_str().unwrap().to_owned())
        .collect();
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe(
            "1",
            SUBSCRIPTION,
            json!({"id": "gid://gitlab/Environment/120"}),
        )
        .await;
    let whole = update_of(&client.next_payload("1").await).clone();
    assert_eq!(whole["complete"], true, "{whole}");
    let mut uids = upserted(&whole);
    uids.sort();
    viewed.sort();
    assert_eq!(
        uids, viewed,
        "{how:?}: the subscription's group is the view's"
    );
    for uid in [
        "uid-ks-apps",
        "uid-ns-blue",
        "uid-cr",
        "uid-blue-web",
        "uid-green-web",
        "uid-green-svc",
    ] {
        assert!(uids.contains(&uid.to_owned()), "{uid} not in {whole}");
    }

    // An inventory object in a namespace of its own: a message about it alone.
    make_green_web_unavailable(&api);
    let update = update_about(&mut client, "uid-green-web").await;
    assert_eq!(upserted(&update), ["uid-green-web"], "{update}");
    assert_eq!(update["complete"], false);
    assert_ne!(update["upserted"][0]["health"]["status"], "HEALTHY");

    // A cluster-scoped entry.
    label_namespace_blue(&api);
    let update = update_about(&mut client, "uid-ns-blue").await;
    assert_eq!(upserted(&update), ["uid-ns-blue"], "{update}");
    assert_eq!(update["upserted"][0]["labels"]["team"], "blue");

    // The Kustomization itself: its Ready condition.
    fail_apps(&api);
    let update = update_about(&mut client, "uid-ks-apps").await;
    assert_eq!(upserted(&update), ["uid-ks-apps"], "{update}");
    assert_eq!(update["upserted"][0]["fluxSyncStatus"], "FAILED");
}

/// The environment `flux`'s own sync status, nothing else asked.
async fn sync_status(app: &crate::support::TestApp) -> Value {
    let query = r#"{ project(fullPath: "acme/apps/web") { environment(name: "flux") { fluxSyncStatus } } }"#;
    let body = app.graphql(DEV, query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["project"]["environment"]["fluxSyncStatus"].clone()
}

#[tokio::test]
async fn the_environments_sync_status_reads_its_flux_object_alone() {
    let (api, served, _dir) = cluster().await;
    apps(&api);
    let world = environment::gitlab_via(Reach::Kubeconfig, &served, "").await;
    bind(&world, Binding::DeploymentJob).await;
    api.reset_request_counts();
    assert_eq!(sync_status(&world).await, "RECONCILED");
    // Neither the inventory's objects nor the other kinds of flux-system were read.
    let read: Vec<_> = api
        .request_counts()
        .into_iter()
        .filter(|((verb, _), _)| ["get", "list", "watch"].contains(&verb.as_str()))
        .map(|((_, resource), _)| resource)
        .collect();
    assert!(!read.is_empty());
    assert!(
        read.iter()
            .all(|r| r == "kustomizations.kustomize.toolkit.fluxcd.io"),
        "{read:?}"
    );

    // And it follows the object.
    change_apps(&api, |ks| ks["spec"]["suspend"] = json!(true));
    let deadline = Instant::now() + Duration::from_secs(10);
    while sync_status(&world).await != "SUSPENDED" {
        assert!(Instant::now() < deadline, "the suspension never shown");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
