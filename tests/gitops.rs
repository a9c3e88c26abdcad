//! GitOps environments' resource groups (SPEC 15), end to end: an environment bound to its Flux
//! object by `fluxResourcePath`, the object's inventory listed from the test Kubernetes server
//! (Flux's and Argo CD's kinds served as their CRDs declare them) across the namespaces it
//! names, nested sources expanded, GitLab's sync status on each Flux object.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use envlens::auth::mint_session;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::environment::{self, meta, owner_ref, World, NS};
pub(crate) use crate::support::gitops::deploy_bound;
use crate::support::gitops::serve_gitops_kinds;
use crate::support::kube_api::{KubeApi, Served};
use crate::support::reach::Reach;
use crate::support::*;

pub(crate) const DEV: (i64, &str) = (2, "dev");

pub(crate) const KS: &str = "kustomize.toolkit.fluxcd.io/v1";
pub(crate) const HR: &str = "helm.toolkit.fluxcd.io/v2";

pub(crate) async fn cluster() -> (KubeApi, Served, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    serve_gitops_kinds(&api);
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

/// envlens over `served` (a kubeconfig entry), with each environment `(id, name)` bound to the
/// Flux object at its path by a successful deployment job (id `id - 100`).
pub(crate) async fn bound_world(served: &Served, bound: &[((i64, &str), String)]) -> World {
    let world = environment::gitlab_via(Reach::Kubeconfig, served, "").await;
    for ((id, name), flux) in bound {
        deploy_bound(&world, id - 100, (*id, name), flux).await;
    }
    world
}

pub(crate) fn path(api_version: &str, plural: &str, ns: &str, name: &str) -> String {
    format!("{api_version}/namespaces/{ns}/{plural}/{name}")
}

pub(crate) fn ready(status: &str, reason: &str) -> Value {
    json!([{"type": "Ready", "status": status, "reason": reason, "message": "",
            "lastTransitionTime": "2026-11-27T10:00:00Z"}])
}

/// A Kustomization as kustomize-controller writes its status (`api/v1/kustomization_types.go`:
/// `ResourceInventory{entries: [{id, v}]}`, `lastAppliedRevision`, conditions).
pub(crate) fn kustomization(
    ns: &str,
    name: &str,
    ids: &[(&str, &str)],
    conditions: Value,
) -> Value {
    let entries: Vec<Value> = ids
        .iter()
        .map(|(id, v)| json!({"id": id, "v": v}))
        .collect();
    json!({"apiVersion": KS, "kind": "Kustomization", "metadata": meta(ns, name, &format!("uid-ks-{name}"), json!({})),
        "spec": {"interval": "10m", "path": "./apps", "prune": true,
                 "sourceRef": {"kind": "GitRepository", "name": "flux-system"}},
        "status": {"conditions": conditions, "inventory": {"entries": entries},
                   "lastAppliedRevision": "main@sha1:0123456789abcdef", "observedGeneration": 1}})
}

pub(crate) fn deployment(ns: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(ns, name, uid, json!({})),
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}},
        "status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1, "observedGeneration": 1}})
}

pub(crate) async fn group(app: &TestApp, env: &str) -> Value {
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{env}") {{
            fluxSyncStatus
            resourceGroup {{ namespace namespaces labelSelector warnings
              sources {{ kind apiVersion namespace name fluxSyncStatus }}
              resources {{ uid apiVersion kind namespace name fluxSyncStatus }}
              edges {{ from to type }} errors {{ kind code message }} }} }} }} }}"#
    );
    let body = app.graphql(DEV, &query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["project"]["environment"].clone()
}

pub(crate) fn names(group: &Value) -> Vec<String> {
    group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let ns = r["namespace"].as_str().unwrap_or("-");
            format!(
                "{} {ns}/{}",
                r["kind"].as_str().unwrap(),
                r["name"].as_str().unwrap()
            )
        })
        .collect()
}

pub(crate) fn uid_of(group: &Value, kind: &str, ns: Option<&str>, name: &str) -> String {
    group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == kind && r["name"] == name && r["namespace"].as_str() == ns)
        .unwrap_or_else(|| panic!("no {kind} {ns:?}/{name} in {group}"))["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// [`names`] of `group`, after asserting that each of `expected` is among them.
fn shows(group: &Value, expected: &[&str]) -> Vec<String> {
    let shown = names(group);
    for expected in expected {
        assert!(
            shown.contains(&(*expected).to_owned()),
            "{expected} not in {shown:?}"
        );
    }
    shown
}

fn applies(group: &Value) -> Vec<(String, String)> {
    group["edges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "APPLIES")
        .map(|e| {
            (
                e["from"].as_str().unwrap().to_owned(),
                e["to"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_kustomization_spans_three_namespaces_and_a_cluster_scoped_entry() {
    let (api, served, _dir) = cluster().await;
    // blue/green in two namespaces, a Namespace and an RBAC name with a colon (`__` in the id).
    api.insert(kustomization(
        "flux-system",
        "apps",
        &[
            ("_blue__Namespace", "v1"),
            ("blue_web_apps_Deployment", "v1"),
            ("green_web_apps_Deployment", "v1"),
            ("green_web__Service", "v1"),
            ("_shop__reader_rbac.authorization.k8s.io_ClusterRole", "v1"),
        ],
        ready("True", "ReconciliationSucceeded"),
    ));
    api.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "blue", "uid": "uid-ns-blue"}}));
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "shop:reader", "uid": "uid-cr"}, "rules": []}),
    );
    api.insert(deployment("blue", "web", "uid-blue-web"));
    let mut rs = meta("blue", "web-1a2b", "uid-blue-rs", json!({"app": "web"}));
    rs["ownerReferences"] = owner_ref("apps/v1", "Deployment", "web", "uid-blue-web");
    api.insert(
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rs,
        "spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1}}),
    );
    api.insert(deployment("green", "web", "uid-green-web"));
    api.insert(json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("green", "web", "uid-green-svc", json!({})),
        "spec": {"selector": {"app": "web"}}}));
    // Not in the inventory: stays out.
    api.insert(deployment("green", "other", "uid-green-other"));

    let world = bound_world(
        &served,
        &[(
            (120, "flux"),
            path(KS, "kustomizations", "flux-system", "apps"),
        )],
    )
    .await;
    let env = group(&world, "flux").await;
    let g = &env["resourceGroup"];

    assert_eq!(env["fluxSyncStatus"], "RECONCILED");
    assert_eq!(g["namespace"], NS);
    assert_eq!(g["namespaces"], json!([NS, "flux-system", "blue", "green"]));
    assert!(g["labelSelector"]
        .as_str()
        .unwrap()
        .contains("environment_slug=flux"));
    assert_eq!(
        g["sources"],
        json!([{"kind": "Kustomization", "apiVersion": KS,
        "namespace": "flux-system", "name": "apps", "fluxSyncStatus": "RECONCILED"}])
    );
    let shown = shows(
        g,
        &[
            "Kustomization flux-system/apps",
            "Namespace -/blue",
            "Deployment blue/web",
            "ReplicaSet blue/web-1a2b",
            "Deployment green/web",
            "Service green/web",
            "ClusterRole -/shop:reader",
        ],
    );
    assert!(
        !shown.contains(&"Deployment green/other".to_owned()),
        "{shown:?}"
    );
    assert_eq!(g["warnings"], json!([]), "{g}");
    // The sources' namespaces, kept for the environment's next first view.
    assert_eq!(
        spanned_kept(&world, 120).await,
        ["flux-system", "blue", "green"]
    );

    let ks = uid_of(g, "Kustomization", Some("flux-system"), "apps");
    let mut got = applies(g);
    got.sort();
    let mut want: Vec<(String, String)> = [
        "uid-ns-blue",
        "uid-blue-web",
        "uid-green-web",
        "uid-green-svc",
        "uid-cr",
    ]
    .iter()
    .map(|to| (ks.clone(), to.to_string()))
    .collect();
    want.sort();
    assert_eq!(got, want);
    // What the applied Deployment owns comes along, by ownership as always.
    assert!(g["edges"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["from"] == "uid-blue-web" && e["to"] == "uid-blue-rs" && e["type"] == "OWNER"));
    // Only Flux objects carry a sync status.
    for r in g["resources"].as_array().unwrap() {
        let flux = r["apiVersion"]
            .as_str()
            .unwrap()
            .contains("toolkit.fluxcd.io");
        assert_eq!(r["fluxSyncStatus"].is_null(), !flux, "{r}");
    }
}

/// The namespaces environment `id`'s GitOps sources spanned when last read, as kept in
/// PostgreSQL.
async fn spanned_kept(world: &World, id: i64) -> Vec<String> {
    envlens::db::environment_settings::spanned_namespaces(&world.db, id)
        .await
        .unwrap()
}

/// Kustomization `apps` whose inventory holds a Deployment in `blue` and a Service in `green`,
/// both in the cluster.
fn blue_deployment_green_service(api: &KubeApi) {
    api.insert(kustomization(
        "flux-system",
        "apps",
        &[
            ("blue_web_apps_Deployment", "v1"),
            ("green_web__Service", "v1"),
        ],
        ready("True", "ReconciliationSucceeded"),
    ));
    api.insert(deployment("blue", "web", "uid-blue-web"));
    api.insert(json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("green", "web", "uid-green-svc", json!({})),
        "spec": {"selector": {"app": "web"}}}));
}

/// A first view lists the namespaces its sources spanned when last read (kept in PostgreSQL, so
/// a restart keeps them) at once with its labels' and its source's, instead of reading the
/// Kustomization alone first to learn them. Kept namespaces that went stale (the inventory
/// moved from `gone` to `green` since) cost lists, not the group: it is resolved from the
/// inventory as read, and what it spans now is kept instead.
#[tokio::test]
async fn kept_namespaces_are_listed_first_and_a_stale_list_still_gives_the_group() {
    let (api, served, _dir) = cluster().await;
    blue_deployment_green_service(&api);
    // What the inventory named before; not in it any more.
    api.insert(deployment("gone", "web", "uid-gone-web"));
    let world = bound_world(
        &served,
        &[(
            (120, "flux"),
            path(KS, "kustomizations", "flux-system", "apps"),
        )],
    )
    .await;
    let before: Vec<String> = ["flux-system", "gone", "blue"].map(String::from).to_vec();
    envlens::db::environment_settings::set_spanned_namespaces(&world.db, 120, &before)
        .await
        .unwrap();
    api.clear_requests();

    // The group alone (the environment's `fluxSyncStatus` reads the Kustomization by itself).
    let body = world
        .graphql(
            DEV,
            r#"{ project(fullPath: "acme/apps/web") { environment(name: "flux") {
                resourceGroup { namespaces warnings resources { uid kind namespace name } } } } }"#,
        )
        .await;
    assert!(body.get("errors").is_none(), "{body}");
    let g = &body["data"]["project"]["environment"]["resourceGroup"];
    assert_eq!(g["namespaces"], json!([NS, "flux-system", "blue", "green"]));
    let shown = shows(
        g,
        &[
            "Kustomization flux-system/apps",
            "Deployment blue/web",
            "Service green/web",
        ],
    );
    assert!(
        !shown.iter().any(|s| s.contains(" gone/")),
        "the stale namespace's objects shown: {shown:?}"
    );
    assert_eq!(g["warnings"], json!([]), "{g}");
    let requests = api.requests();
    let lists_in = |ns: &str| {
        requests
            .iter()
            .filter(|r| r.method == "GET" && r.path.contains(&format!("/namespaces/{ns}/")))
            .count()
    };
    // Every kept namespace listed, the stale one too; green, newly named, in a round after.
    for ns in [NS, "flux-system", "gone", "blue", "green"] {
        assert!(lists_in(ns) > 0, "{ns} not listed");
    }
    assert!(
        !requests
            .iter()
            .any(|r| r.path.ends_with("/kustomizations/apps")),
        "the Kustomization was read alone: the kept namespaces were not used"
    );
    assert_eq!(
        spanned_kept(&world, 120).await,
        ["flux-system", "blue", "green"]
    );
}

#[tokio::test]
async fn sources_nest_three_levels_deep_and_a_cycle_is_warned() {
    let (api, served, _dir) = cluster().await;
    api.insert(kustomization(
        "flux-system",
        "root",
        &[(
            "flux-system_infra_kustomize.toolkit.fluxcd.io_Kustomization",
            "v1",
        )],
        ready("True", "ReconciliationSucceeded"),
    ));
    // infra applies a HelmRelease, an Argo CD Application, and root again (a cycle).
    api.insert(kustomization(
        "flux-system",
        "infra",
        &[
            ("apps_podinfo_helm.toolkit.fluxcd.io_HelmRelease", "v2"),
            ("argocd_shop_argoproj.io_Application", "v1alpha1"),
            (
                "flux-system_root_kustomize.toolkit.fluxcd.io_Kustomization",
                "v1",
            ),
        ],
        ready("Unknown", "Progressing"),
    ));
    // helm-controller 1.5's inventory (`api/v2/helmrelease_types.go`: `Inventory *ResourceInventory`).
    api.insert(json!({"apiVersion": HR, "kind": "HelmRelease", "metadata": meta("apps", "podinfo", "uid-hr", json!({})),
        "spec": {"interval": "5m", "chart": {"spec": {"chart": "podinfo", "sourceRef": {"kind": "HelmRepository", "name": "podinfo"}}}, "suspend": true},
        "status": {"conditions": ready("True", "InstallSucceeded"),
                   "inventory": {"entries": [{"id": "apps_podinfo_apps_Deployment", "v": "v1"}]},
                   "history": [{"name": "podinfo", "namespace": "apps", "version": 1, "status": "deployed"}]}}));
    api.insert(deployment("apps", "podinfo", "uid-podinfo"));
    // Argo CD's `ApplicationStatus.resources` (`ResourceStatus`: group version kind namespace name).
    api.insert(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": meta("argocd", "shop", "uid-app", json!({})),
        "spec": {"project": "default", "destination": {"namespace": "shop-argo"}},
        "status": {"resources": [{"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "shop-argo",
                                  "name": "cart", "status": "Synced", "health": {"status": "Healthy"}}],
                   "sync": {"status": "Synced"}, "health": {"status": "Healthy"}}}));
    api.insert(deployment("shop-argo", "cart", "uid-cart"));

    let world = bound_world(
        &served,
        &[(
            (121, "nested"),
            path(KS, "kustomizations", "flux-system", "root"),
        )],
    )
    .await;
    let env = group(&world, "nested").await;
    let g = &env["resourceGroup"];
    shows(
        g,
        &[
            "Kustomization flux-system/root",
            "Kustomization flux-system/infra",
            "HelmRelease apps/podinfo",
            "Deployment apps/podinfo",
            "Application argocd/shop",
            "Deployment shop-argo/cart",
        ],
    );
    let edges = applies(g);
    for (from, to) in [
        ("uid-ks-root", "uid-ks-infra"),
        ("uid-ks-infra", "uid-hr"),
        ("uid-hr", "uid-podinfo"),
        ("uid-ks-infra", "uid-app"),
        ("uid-app", "uid-cart"),
        ("uid-ks-infra", "uid-ks-root"),
    ] {
        assert!(
            edges.contains(&(from.into(), to.into())),
            "{from} → {to} not in {edges:?}"
        );
    }
    let warnings = g["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].as_str().unwrap().contains("cycle"),
        "{warnings:?}"
    );
    let status = |kind: &str, name: &str| {
        g["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == kind && r["name"] == name)
            .unwrap()["fluxSyncStatus"]
            .clone()
    };
    assert_eq!(
        status("Kustomization", "infra"),
        "RECONCILING_WITH_BAD_CONFIG"
    );
    assert_eq!(status("HelmRelease", "podinfo"), "SUSPENDED");
    assert_eq!(status("Application", "shop"), Value::Null);
    assert_eq!(
        g["namespaces"],
        json!([NS, "flux-system", "apps", "argocd", "shop-argo"])
    );
}

#[tokio::test]
async fn helm_releases_without_an_inventory_fall_back_to_labels_then_to_their_release_secret() {
    let (api, served, _dir) = cluster().await;
    let helm_release = |name: &str, uid: &str, status: Value| {
        json!({"apiVersion": HR, "kind": "HelmRelease",
        "metadata": meta("flux-system", name, uid, json!({})),
        "spec": {"interval": "5m", "targetNamespace": "apps", "chart": {"spec": {"chart": name}}},
        "status": status})
    };
    // Labelled by helm-controller's post-renderer.
    api.insert(helm_release(
        "web",
        "uid-hr-web",
        json!({"conditions": ready("False", "UpgradeFailed")}),
    ));
    let mut labelled = deployment("apps", "web", "uid-apps-web");
    labelled["metadata"]["labels"] = json!({"helm.toolkit.fluxcd.io/name": "web", "helm.toolkit.fluxcd.io/namespace": "flux-system"});
    api.insert(labelled);
    // Neither: the release Secret (a real Helm v3 payload, tests/fixtures/helm) names the objects.
    api.insert(helm_release(
        "podinfo",
        "uid-hr-podinfo",
        json!({"conditions": ready("True", "UpgradeSucceeded")}),
    ));
    let secret: Value =
        serde_json::from_str(include_str!("fixtures/helm/release-secret.json")).unwrap();
    api.insert(secret);
    api.insert(deployment("apps", "podinfo", "uid-apps-podinfo"));
    api.insert(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("apps", "podinfo", "uid-sa", json!({}))}));
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "podinfo:reader", "uid": "uid-cr-podinfo"}, "rules": []}),
    );

    let world = bound_world(
        &served,
        &[
            (
                (122, "labelled"),
                path(HR, "helmreleases", "flux-system", "web"),
            ),
            (
                (123, "stored"),
                path(HR, "helmreleases", "flux-system", "podinfo"),
            ),
        ],
    )
    .await;

    let env = group(&world, "labelled").await;
    assert_eq!(env["fluxSyncStatus"], "FAILED");
    let g = &env["resourceGroup"];
    assert!(names(g).contains(&"Deployment apps/web".to_owned()), "{g}");
    assert!(applies(g).contains(&("uid-hr-web".into(), "uid-apps-web".into())));

    let env = group(&world, "stored").await;
    let g = &env["resourceGroup"];
    let shown = shows(
        g,
        &[
            "ServiceAccount apps/podinfo",
            "Deployment apps/podinfo",
            "ClusterRole -/podinfo:reader",
        ],
    );
    // The manifest's Service is not in the cluster: said, not fatal.
    let warnings = g["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("Service apps/podinfo")
                && w.as_str().unwrap().contains("not found")),
        "{warnings:?}"
    );
    assert!(applies(g).contains(&("uid-hr-podinfo".into(), "uid-cr-podinfo".into())));
    // The Secret itself is not part of the group.
    assert!(!shown.iter().any(|s| s.starts_with("Secret")), "{shown:?}");
}

#[tokio::test]
async fn an_environment_without_a_flux_path_keeps_its_labels_group() {
    let (_api, served, _dir) = cluster().await;
    let world = environment::gitlab_via(Reach::Kubeconfig, &served, "").await;
    let env = group(&world, environment::SLUG).await;
    assert_eq!(env["fluxSyncStatus"], Value::Null);
    assert_eq!(env["resourceGroup"]["namespaces"], json!([NS]));
    assert_eq!(env["resourceGroup"]["sources"], json!([]));
}

/// GitLab's `getEnvironmentClusterAgentWithFluxResource`, as its frontend sends it, answers as
/// before on an environment whose Flux object is live.
#[tokio::test]
async fn gitlabs_flux_resource_query_runs_unchanged() {
    let (api, served, _dir) = cluster().await;
    api.insert(kustomization(
        "flux-system",
        "apps",
        &[],
        ready("True", "ReconciliationSucceeded"),
    ));
    let flux = path(KS, "kustomizations", "flux-system", "apps");
    let world = bound_world(&served, &[((124, "flux"), flux.clone())]).await;
    let query = include_str!(
        "fixtures/frontend_queries/environment_cluster_agent_with_flux_resource.query.graphql"
    );
    let (token, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    let variables = json!({"projectFullPath": "acme/apps/web", "environmentName": "flux"});
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            json!({"query": query, "variables": variables}).to_string(),
        ))
        .unwrap();
    let res = world.send(req).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    assert!(body.get("errors").is_none(), "{body}");
    let env = &body["data"]["project"]["environment"];
    assert_eq!(env["fluxResourcePath"], flux);
    assert_eq!(env["kubernetesNamespace"], NS);
    assert_eq!(env["clusterAgent"]["name"], "prod");
}

/// The demo's Flux-managed environment in Chromium: its Kustomization holds what it applied in
/// two namespaces, the nested Kustomization under it, each with its sync badge and every
/// resource with its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_page_shows_the_flux_tree_in_chromium() {
    use crate::dashboard::{check, check_contrast, shots};
    let Some(browser) = crate::support::browser::Browser::launch().await else {
        return;
    };
    let demo = crate::support::demo::Demo::start().await;
    let page = browser.page().await;
    page.screen(1440, false).await;
    demo.sign_in(&page).await;
    page.goto(&format!(
        "{}/environments?project=acme/web/site&name=gitops",
        demo.url
    ))
    .await;
    let r = page
        .wait_for(
            "document.querySelectorAll('ul.tree .node').length >= 8",
            Duration::from_secs(30),
        )
        .await;
    check(&page, "gitops-environment", r).await;
    page.screenshot(&shots().join("gitops-environment-1440-light.png"))
        .await;
    check_contrast(&page, "gitops-environment").await;
    let text = page.text().await;
    for expected in [
        "Namespaces",
        "site-blue, flux-system, site-green",
        "Kustomization",
        "flux-system/site",
        "Reconciled",
        "Reconciling with bad config",
        "site-green/",
        "site-blue/",
    ] {
        assert!(text.contains(expected), "{expected} missing:\n{text}");
    }
    // The Kustomization is a root; the blue Deployment sits below it, the green one too.
    let nested = page
        .eval(
            "[...document.querySelectorAll('ul.tree > li > details')].filter(d => \
               d.querySelector(':scope > summary .kind').innerText === 'Kustomization' && \
               d.querySelector(':scope > summary .name').innerText === 'site').map(d => \
               [...d.querySelectorAll(':scope > ul > li .node')].map(n => n.innerText.replace(/\\s+/g, ' ')).join(' | '))",
        )
        .await;
    let nested = nested[0]
        .as_str()
        .unwrap_or_else(|| panic!("no Kustomization root: {nested}"));
    for expected in ["site-blue/", "site-green/", "Kustomization", "site-config"] {
        assert!(
            nested.contains(expected),
            "{expected} not under the Kustomization: {nested}"
        );
    }
}

/// An inventory is outside input: 600 cluster-scoped entries cost one list of their kind (its
/// cluster-wide watch in the cache), never a request each; at most 500 are looked up a view,
/// and the warnings about what is missing stay a readable few.
#[tokio::test]
async fn a_huge_inventory_is_read_within_bounds() {
    let (api, served, _dir) = cluster().await;
    let ids: Vec<String> = (0..600)
        .map(|i| format!("_role-{i}_rbac.authorization.k8s.io_ClusterRole"))
        .collect();
    let ids: Vec<(&str, &str)> = ids.iter().map(|id| (id.as_str(), "v1")).collect();
    api.insert(kustomization(
        "flux-system",
        "huge",
        &ids,
        ready("True", "ReconciliationSucceeded"),
    ));
    let world = bound_world(
        &served,
        &[(
            (125, "huge"),
            path(KS, "kustomizations", "flux-system", "huge"),
        )],
    )
    .await;
    let env = group(&world, "huge").await;
    let g = &env["resourceGroup"];
    let requests = api.requests();
    let gets = requests
        .iter()
        .filter(|r| r.path.contains("/clusterroles/role-"))
        .count();
    assert_eq!(gets, 0);
    let lists = requests
        .iter()
        .filter(|r| r.path.ends_with("/clusterroles") && !r.query.contains("watch=true"))
        .count();
    assert_eq!(lists, 1);
    let warnings = g["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 51, "{warnings:?}");
    assert!(warnings[50].as_str().unwrap().contains("more warnings"));
    assert_eq!(env["fluxSyncStatus"], "RECONCILED");
}

/// Each API group an inventory names that discovery does not know costs a discovery request:
/// 40 made-up ones are asked at most 16 times a view, and their objects warned of.
#[tokio::test]
async fn made_up_api_groups_in_an_inventory_are_asked_within_bounds() {
    let (api, served, _dir) = cluster().await;
    let ids: Vec<String> = (0..40)
        .map(|i| format!("shop_thing_made{i}.example.com_Thing"))
        .collect();
    let ids: Vec<(&str, &str)> = ids.iter().map(|id| (id.as_str(), "v1")).collect();
    api.insert(kustomization(
        "flux-system",
        "madeup",
        &ids,
        ready("True", "ReconciliationSucceeded"),
    ));
    let world = bound_world(
        &served,
        &[(
            (126, "madeup"),
            path(KS, "kustomizations", "flux-system", "madeup"),
        )],
    )
    .await;
    let env = group(&world, "madeup").await;
    let asked = api
        .requests()
        .iter()
        .filter(|r| r.path.contains(".example.com/"))
        .count();
    assert_eq!(asked, 16);
    let warnings = env["resourceGroup"]["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .filter(|w| w.as_str().unwrap().contains("made3"))
            .count()
            >= 1,
        "{warnings:?}"
    );
}

/// An environment bound to an Argo CD Application by a Maintainer
/// (`environmentArgoApplicationUpdate`) has the Application's `status.resources` as its group,
/// across namespaces; and a Flux object found in a bound Kustomization's inventory (not the
/// bound one) is a target of the Flux actions (SPEC 15: "the group's sources and the Flux
/// objects in it").
#[tokio::test]
async fn an_argo_application_bound_by_a_maintainer_and_a_nested_kustomization_acted_on() {
    let (api, served, _dir) = cluster().await;
    api.insert(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": meta("argocd", "shop", "uid-app", json!({})),
        "spec": {"project": "default", "destination": {"namespace": "shop-argo"}},
        "status": {"resources": [{"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "shop-argo",
                                  "name": "cart", "status": "Synced", "health": {"status": "Healthy"}}],
                   "sync": {"status": "Synced"}, "health": {"status": "Healthy"}}}));
    api.insert(deployment("shop-argo", "cart", "uid-cart"));
    api.insert(kustomization(
        "flux-system",
        "root",
        &[(
            "flux-system_child_kustomize.toolkit.fluxcd.io_Kustomization",
            "v1",
        )],
        ready("True", "ReconciliationSucceeded"),
    ));
    api.insert(kustomization(
        "flux-system",
        "child",
        &[("apps_podinfo_apps_Deployment", "v1")],
        ready("True", "ReconciliationSucceeded"),
    ));
    api.insert(deployment("apps", "podinfo", "uid-podinfo"));
    // Argo CD: bound by an administrator (a Maintainer of every project).
    let world = bound_world(&served, &[((131, "argo"), String::new())]).await;
    let before = group(&world, "argo").await;
    assert!(
        !names(&before["resourceGroup"]).contains(&"Deployment shop-argo/cart".to_owned()),
        "{before}"
    );
    let bind = r#"mutation { environmentArgoApplicationUpdate(input: {environmentId: "gid://gitlab/Environment/131", application: "argocd/shop"}) { errors } }"#;
    let body = world.graphql((1, "root"), bind).await;
    assert_eq!(
        body["data"]["environmentArgoApplicationUpdate"]["errors"],
        json!([]),
        "{body}"
    );
    let env = group(&world, "argo").await;
    let g = &env["resourceGroup"];
    let shown = names(g);
    assert!(shown.contains(&"Application argocd/shop".to_owned()), "{g}");
    assert!(
        shown.contains(&"Deployment shop-argo/cart".to_owned()),
        "{g}"
    );
    let app = uid_of(g, "Application", Some("argocd"), "shop");
    let cart = uid_of(g, "Deployment", Some("shop-argo"), "cart");
    assert!(applies(g).contains(&(app, cart)), "{g}");
    assert!(
        g["namespaces"]
            .as_array()
            .unwrap()
            .contains(&json!("shop-argo")),
        "{g}"
    );

    // Flux: the child Kustomization is in root's inventory, so it may be reconciled.
    deploy_bound(
        &world,
        32,
        (132, "flux"),
        &path(KS, "kustomizations", "flux-system", "root"),
    )
    .await;
    let reconcile = r#"mutation { fluxReconcile(input: {environmentId: "gid://gitlab/Environment/132",
        apiVersion: "kustomize.toolkit.fluxcd.io/v1", kind: "Kustomization",
        namespace: "flux-system", name: "child"}) { errors action { answerCode } } }"#;
    let body = world.graphql(DEV, reconcile).await;
    let payload = &body["data"]["fluxReconcile"];
    assert_eq!(payload["errors"], json!([]), "{body}");
    assert_eq!(payload["action"]["answerCode"], 200, "{body}");
    let child = api
        .get("kustomizations", Some("flux-system"), "child")
        .unwrap();
    assert!(
        child["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"].is_string(),
        "{child}"
    );
}

/// A first GitOps view lists every namespace of its group before any of their watches goes:
/// none is sent while its slowest list (green's Services, held [`HELD`]) is still coming, the
/// other namespaces long listed, and then every namespace's is.
#[tokio::test]
async fn a_first_gitops_views_watches_wait_for_the_whole_view() {
    use std::sync::Arc;

    use axum::http::HeaderMap;
    use envlens::gitops::ObjRef;
    use envlens::k8s::fetch::FetchOptions;
    use envlens::k8s::gitops::{self, LabelsSource, Reader};

    use crate::support::kube_api::Fault;
    use crate::support::reach::Reached;

    const HELD: Duration = Duration::from_secs(5);
    let (api, served, _dir) = cluster().await;
    blue_deployment_green_service(&api);
    let reached = Reached::new(
        Reach::Kubeconfig,
        &served,
        &[("7", 7)],
        environment::AGENTS_PROJECT,
    )
    .await;
    let settings = envlens::config::file::Settings::parse(&reached.config("", "")).unwrap();
    let cluster = crate::support::clusters(&settings)
        .await
        .for_agent(7, "acme/agents", "prod")
        .await
        .unwrap();
    cluster.discovery.kinds().await.unwrap();
    api.fault(|r| {
        (r.verb == "list" && r.resource == "services" && r.namespace.as_deref() == Some("green"))
            .then_some(Fault::Delay(HELD))
    });
    let view = tokio::spawn(async move {
        let (headers, options) = (HeaderMap::new(), FetchOptions::default());
        let reader = Reader {
            watch: &cluster.watch,
            memo: &cluster.gitops,
            client: &cluster.client,
            discovery: &cluster.discovery,
            headers: &headers,
            options: &options,
        };
        let source = ObjRef {
            group: "kustomize.toolkit.fluxcd.io".into(),
            version: Some("v1".into()),
            kind: "Kustomization".into(),
            namespace: Some("flux-system".into()),
            name: "apps".into(),
        };
        let labels = LabelsSource {
            namespaces: vec![NS.to_owned()],
            selector: "app=none".into(),
        };
        let grouped =
            gitops::resource_group(&reader, &[source], Some(&labels), &[], &Arc::default())
                .await
                .unwrap();
        (grouped.group.resources.len(), cluster)
    });
    let lists_in = |ns: &str| {
        api.requests()
            .iter()
            .filter(|r| r.path.contains(&format!("/namespaces/{ns}/")))
            .filter(|r| r.query_param("watch").is_none())
            .count()
    };
    let watches = || {
        api.requests()
            .iter()
            .filter(|r| r.query_param("watch").is_some())
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    };
    // Green's Services are held; blue's, flux-system's and the labels' namespace's every kind
    // listed meanwhile, and a moment more: a watch of theirs sent early would be in by now.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lists_in("green") < 10
        || [NS, "flux-system", "blue"]
            .iter()
            .any(|ns| lists_in(ns) < lists_in("green"))
    {
        assert!(std::time::Instant::now() < deadline, "never listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let early = watches();
    assert!(!view.is_finished(), "the view waits for green's Services");
    assert_eq!(
        early,
        Vec::<String>::new(),
        "watches sent before the view's answer"
    );
    let (resources, _cluster) = view.await.unwrap();
    assert!(resources >= 3, "{resources} resources");
    // Then every namespace's watches go.
    while [NS, "flux-system", "blue", "green"].iter().any(|ns| {
        !watches()
            .iter()
            .any(|p| p.contains(&format!("/namespaces/{ns}/")))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "never watched: {:?}",
            watches()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
