//! `ResourceGroup.causes` and `KubernetesResource.cause` end to end (SPEC 17): a crash loop
//! behind a Service, found through the watch cache as the viewer, with the previous run's last
//! log lines read from the cluster as that viewer, only when asked for, for at most five Pods a
//! view, and kept a while.

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::environment::{self, gitlab_labels, meta, owner_ref, NS, SLUG};
use crate::support::kube_api::{KubeApi, Served};
use crate::support::*;

const ROOT: (i64, &str) = (1, "root");
const DEV: (i64, &str) = (2, "dev");

/// A Pod of `owner` (`(kind, name, uid)`) whose container `web` crash-loops, last exit code 1.
fn crashing_pod(name: &str, owner: Option<(&str, &str, &str)>, labels: Value) -> Value {
    let mut metadata = meta(NS, name, &format!("uid-{name}"), labels);
    if let Some((kind, owner, uid)) = owner {
        metadata["ownerReferences"] = owner_ref("apps/v1", kind, owner, uid);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"restartPolicy": "Always", "containers": [{"name": "web", "image": "registry/api:1.4.2"}]},
        "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "web", "image": "registry/api:1.4.2", "ready": false,
                "restartCount": 6,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off 5m0s restarting failed container=web pod={name}_{NS}(uid-{name})")}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]},
    })
}

/// `api` (a Deployment, its ReplicaSet and crash-looping Pod) behind the Service `api`, whose
/// EndpointSlice lists the Pod not ready; the Pod's previous run printed 30 lines.
async fn cluster() -> (KubeApi, Served, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    api.insert(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(NS, "api", "uid-api", gitlab_labels(SLUG, "api")),
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "api"}},
                 "template": {"metadata": {"labels": {"app": "api"}}}},
        "status": {"replicas": 1, "updatedReplicas": 1, "unavailableReplicas": 1},
    }));
    let mut rs = meta(NS, "api-7f9c4", "uid-rs", json!({"app": "api"}));
    rs["ownerReferences"] = owner_ref("apps/v1", "Deployment", "api", "uid-api");
    api.insert(
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rs,
                      "spec": {"replicas": 1}, "status": {"replicas": 1}}),
    );
    api.insert(crashing_pod(
        "api-7f9c4-x2kq",
        Some(("ReplicaSet", "api-7f9c4", "uid-rs")),
        json!({"app": "api"}),
    ));
    api.insert(environment::service(NS, "api", "uid-svc", SLUG));
    let mut slice = meta(
        NS,
        "api-5xk2p",
        "uid-slice",
        json!({"kubernetes.io/service-name": "api"}),
    );
    slice["ownerReferences"] = owner_ref("v1", "Service", "api", "uid-svc");
    api.insert(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": slice,
                      "addressType": "IPv4",
                      "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": false}}]}),
    );
    let printed: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    api.set_previous_pod_log(NS, "api-7f9c4-x2kq", "web", &printed);
    api.set_pod_log(NS, "api-7f9c4-x2kq", Some("web"), "starting\n");
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

async fn group(app: &TestApp, user: (i64, &str), fields: &str) -> Value {
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
            resourceGroup {{ {fields} }} }} }} }}"#
    );
    let body = app.graphql(user, &query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["project"]["environment"]["resourceGroup"].clone()
}

fn log_reads(api: &KubeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.path.ends_with("/log"))
        .count()
}

#[tokio::test]
async fn a_crash_behind_a_service_with_the_previous_runs_last_lines() {
    let (api, served, _dir) = cluster().await;
    let app = environment::gitlab(&served).await;

    let fields = "causes { root path reason message sentence logLines }";
    let group_as_dev = group(&app, DEV, fields).await;
    let lines: Vec<String> = (11..=30).map(|i| format!("line {i}")).collect();
    assert_eq!(
        group_as_dev["causes"],
        json!([{
            "root": "uid-svc",
            "path": ["uid-svc", "uid-api", "uid-rs", "uid-api-7f9c4-x2kq"],
            "reason": "CrashLoopBackOff",
            "message": "back-off 5m0s restarting failed container=web pod=api-7f9c4-x2kq_shop(uid-api-7f9c4-x2kq)",
            "sentence": "Service api: container web of Pod api-7f9c4-x2kq keeps crashing, last exit code 1 (CrashLoopBackOff)",
            "logLines": lines,
        }])
    );
    // Read as the viewer, the previous run's, its last 20 lines.
    let reads: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/log"))
        .collect();
    assert_eq!(reads.len(), 1);
    assert_eq!(
        reads[0].path,
        "/api/v1/namespaces/shop/pods/api-7f9c4-x2kq/log"
    );
    assert!(reads[0].query.contains("previous=true"), "{:?}", reads[0]);
    assert!(reads[0].query.contains("tailLines=20"), "{:?}", reads[0]);
    assert!(reads[0].query.contains("container=web"), "{:?}", reads[0]);

    // Kept: the same viewer again reads nothing more.
    group(&app, DEV, fields).await;
    assert_eq!(log_reads(&api), 1);

    // A viewer the cluster does not let read Pods' logs gets the cause without the lines.
    api.deny(|i| i.subresource.as_deref() == Some("log") && i.user == "gitlab:user:root");
    let group_as_root = group(&app, ROOT, fields).await;
    assert_eq!(
        group_as_root["causes"][0]["sentence"],
        group_as_dev["causes"][0]["sentence"]
    );
    assert_eq!(group_as_root["causes"][0]["logLines"], Value::Null);
    assert_eq!(log_reads(&api), 2);
}

#[tokio::test]
async fn each_resource_names_its_own_cause_and_logs_are_read_only_when_asked_for() {
    let (api, served, _dir) = cluster().await;
    let app = environment::gitlab(&served).await;
    let group = group(
        &app,
        DEV,
        "health resources { uid kind name cause { root path reason sentence } }
         causes { root sentence }",
    )
    .await;
    assert_eq!(log_reads(&api), 0);
    let cause_of = |uid: &str| {
        group["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["uid"] == uid)
            .unwrap_or_else(|| panic!("no {uid} in {group}"))["cause"]
            .clone()
    };
    assert_eq!(
        cause_of("uid-api"),
        json!({"root": "uid-api", "path": ["uid-api", "uid-rs", "uid-api-7f9c4-x2kq"],
               "reason": "CrashLoopBackOff",
               "sentence": "Deployment api: container web of Pod api-7f9c4-x2kq keeps crashing, last exit code 1 (CrashLoopBackOff)"})
    );
    assert_eq!(
        cause_of("uid-api-7f9c4-x2kq")["sentence"],
        "Pod api-7f9c4-x2kq: container web keeps crashing, last exit code 1 (CrashLoopBackOff)"
    );
    // An EndpointSlice has no health and explains nothing.
    assert_eq!(cause_of("uid-slice"), Value::Null);
    assert_eq!(group["causes"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn at_most_five_pods_logs_a_view() {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    for i in 0..7 {
        let name = format!("worker-{i}");
        api.insert(crashing_pod(&name, None, gitlab_labels(SLUG, &name)));
        api.set_previous_pod_log(NS, &name, "web", &format!("worker {i} died\n"));
    }
    let served = api.serve(dir.path()).await;
    let app = environment::gitlab(&served).await;
    let group = group(&app, DEV, "causes { root logLines }").await;
    let causes = group["causes"].as_array().unwrap();
    assert_eq!(causes.len(), 7, "{group}");
    let with_lines = causes.iter().filter(|c| c["logLines"].is_array()).count();
    assert_eq!(with_lines, 5, "{group}");
    assert_eq!(log_reads(&api), 5);
    for cause in causes.iter().filter(|c| c["logLines"].is_array()) {
        let worker = cause["root"].as_str().unwrap().trim_start_matches("uid-");
        assert_eq!(
            cause["logLines"],
            json!([format!("worker {} died", &worker["worker-".len()..])])
        );
    }
}

#[tokio::test]
async fn a_healthy_environment_has_no_causes() {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    api.insert(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(NS, "api", "uid-api", gitlab_labels(SLUG, "api")),
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "api"}}},
        "status": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1},
    }));
    let served = api.serve(dir.path()).await;
    let app = environment::gitlab(&served).await;
    let group = group(&app, DEV, "health causes { root }").await;
    assert_eq!(group, json!({"health": "HEALTHY", "causes": []}));
}

/// The demo's broken rollout (payments' staging API, behind its Service, on an image tag never
/// pushed) in Chromium,
/// at a phone's width and a desktop's: the environment page leads with the cause's sentence and
/// marks the resources on its path in the tree and the graph; the deployment that did not
/// become healthy names it on its page, an older one does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_lead_with_the_cause_and_mark_its_path_in_chromium() {
    use crate::dashboard::{check, check_contrast, shots};
    use crate::support::browser::Browser;
    use crate::support::demo::Demo;
    use std::time::Duration;

    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::start().await;
    let page = browser.page().await;
    page.screen(1440, false).await;
    demo.sign_in(&page).await;
    let environment = format!(
        "{}/environments?project=acme/platform/payments&name=staging",
        demo.url
    );
    let sentence = "document.getElementById('cause-sentence') ? document.getElementById('cause-sentence').innerText : ''";
    for width in [390, 1440] {
        page.screen(width, false).await;
        page.goto(&environment).await;
        let r = page
            .wait_for(&format!("({sentence}).length > 0"), Duration::from_secs(20))
            .await;
        check(&page, &format!("cause-{width}"), r).await;
        let said = page.eval(sentence).await;
        let said = said.as_str().unwrap_or_default();
        assert!(
            said.starts_with("Service api: container app of Pod api-")
                && said.ends_with(
                    "cannot pull image registry.acme.test/payments/api:3.3.0-rc.3 (ImagePullBackOff)"
                ),
            "{said}"
        );
        // It leads: nothing of the summary comes before it.
        let first = page
            .eval("document.querySelector('#summary').firstElementChild.id")
            .await;
        assert_eq!(first, "cause");
        // The tree marks the Service, the Deployment it selects, its new ReplicaSet and the
        // Pod that cannot pull.
        let marked = page
            .eval("[...document.querySelectorAll('.node.on-path')].map(n => n.querySelector('.kind').innerText).sort()")
            .await;
        assert_eq!(
            marked,
            json!(["Deployment", "Pod", "ReplicaSet", "Service"])
        );
        let shot = shots().join(format!("cause-environment-{width}-light.png"));
        page.screenshot(&shot).await;
        let r = page
            .wait_for(
                "document.documentElement.scrollWidth <= window.innerWidth + 1",
                Duration::from_secs(2),
            )
            .await;
        check(&page, &format!("cause-{width}-width"), r).await;
        check_contrast(&page, &format!("cause-{width}")).await;

        page.goto(&format!("{environment}&view=graph")).await;
        let r = page
            .wait_for(
                "document.querySelectorAll('.graph rect.n.cause').length === 4",
                Duration::from_secs(20),
            )
            .await;
        check(&page, &format!("cause-graph-{width}"), r).await;
        let lines = page
            .eval("document.querySelectorAll('.graph path.e.cause').length")
            .await;
        assert_eq!(lines, 3);
        page.screenshot(&shots().join(format!("cause-graph-{width}-light.png")))
            .await;
    }

    // The last deployment of payments' staging (iid 16) did not become healthy: its page names
    // the cause; the one before it, whose resources are no longer those shown, does not.
    let deployment = |iid: u32| {
        format!(
            "{}/deployments?project=acme/platform/payments&iid={iid}",
            demo.url
        )
    };
    page.goto(&deployment(16)).await;
    let r = page
        .wait_for(
            "document.getElementById('cause') && document.getElementById('cause').innerText.includes('(ImagePullBackOff)')",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "cause-deployment", r).await;
    page.screenshot(&shots().join("cause-deployment-1440-light.png"))
        .await;
    page.goto(&deployment(15)).await;
    let r = page
        .wait_for(
            "document.querySelector('h1') && document.querySelector('h1').innerText === 'Deployment #15'",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "older-deployment", r).await;
    assert_eq!(
        page.eval("document.getElementById('cause') === null").await,
        true
    );
}
