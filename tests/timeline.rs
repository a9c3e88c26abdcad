//! The environment's timeline (SPEC 17): `Environment.events` over the test cluster's Events
//! (the group's only, a series once, the `events.k8s.io` shape read alike), envlens' own
//! events (deployments, health changes written once whichever replica saw them), paging with
//! cursors, the `types` and `since` filters, the viewer's access, and
//! `environmentEventsUpdated` over the GraphQL WebSocket.

use std::time::Duration;

use serde_json::{json, Value};

use crate::subscriptions::Client;
use crate::support::environment::{self, deploy, NS, SLUG};
use crate::support::kube_api::{KubeApi, Served};
use crate::support::*;

const DEV: (i64, &str) = (2, "dev");
const REP: (i64, &str) = (3, "rep");
const PRODUCTION: &str = "gid://gitlab/Environment/100";
const FIELDS: &str = "id type reason message count firstTime lastTime resourceUid source";

async fn cluster() -> (KubeApi, Served, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

fn query(args: &str) -> String {
    format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
            events({args}) {{ edges {{ cursor node {{ {FIELDS} }} }} pageInfo {{ hasNextPage endCursor }} }} }} }} }}"#
    )
}

/// The page's nodes, or the answer's errors.
async fn events(
    app: &TestApp,
    user: (i64, &str),
    args: &str,
) -> Result<(Vec<Value>, Value), Value> {
    let answer = app.graphql(user, &query(args)).await;
    if answer.get("errors").is_some() {
        return Err(answer["errors"].clone());
    }
    let connection = &answer["data"]["project"]["environment"]["events"];
    let nodes = connection["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"].clone())
        .collect();
    Ok((nodes, connection["pageInfo"].clone()))
}

fn of_source<'a>(nodes: &'a [Value], source: &str) -> Vec<&'a Value> {
    nodes.iter().filter(|n| n["source"] == source).collect()
}

/// An Event as `events.k8s.io/v1` creates it (`eventTime`, `series`, `reportingController`),
/// stored as the apiserver stores every Event: one object, which `/api/v1` serves with the
/// core names (its conversion: regarding → involvedObject, note → message, reportingController
/// → reportingComponent).
fn new_style_event(name: &str, about_uid: &str, count: u64, last: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": NS},
           "involvedObject": {"kind": "Deployment", "name": "web", "namespace": NS, "uid": about_uid},
           "type": "Normal", "reason": "ScalingReplicaSet", "message": "Scaled up replica set web-new222 to 2",
           "eventTime": "2024-06-03T08:00:00.000000Z", "series": {"count": count, "lastObservedTime": last},
           "reportingComponent": "deployment-controller", "reportingInstance": "kcm-1", "action": "Scaling"})
}

#[tokio::test]
async fn the_groups_events_newest_first_each_once_with_the_deployments() {
    let (api, served, _dir) = cluster().await;
    api.insert(new_style_event(
        "web.series",
        "uid-web",
        3,
        "2024-06-03T09:00:00.000000Z",
    ));
    let app = environment::gitlab(&served).await;

    let (nodes, page) = events(&app, DEV, "first: 50").await.unwrap();
    assert_eq!(page["hasNextPage"], false);
    let kube: Vec<(&str, &str, i64)> = of_source(&nodes, "KUBERNETES")
        .iter()
        .map(|n| {
            (
                n["reason"].as_str().unwrap(),
                n["resourceUid"].as_str().unwrap(),
                n["count"].as_i64().unwrap(),
            )
        })
        .collect();
    // Staging's Event and the one about no resource of the group are not shown.
    assert_eq!(
        kube,
        [
            ("ScalingReplicaSet", "uid-web", 3),
            ("BackOff", "uid-pod-web-new222-a", 1),
            ("ScalingReplicaSet", "uid-web", 1),
            ("ScalingReplicaSet", "uid-web", 1)
        ]
    );
    let series = of_source(&nodes, "KUBERNETES")[0];
    assert_eq!(series["firstTime"], "2024-06-03T08:00:00Z");
    assert_eq!(series["lastTime"], "2024-06-03T09:00:00Z");
    let ids: std::collections::HashSet<&str> =
        nodes.iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), nodes.len(), "each event once");

    // The series goes on: still one entry, counted, moved to its new last time.
    api.insert(new_style_event(
        "web.series",
        "uid-web",
        4,
        "2024-06-04T09:00:00.000000Z",
    ));
    let entry = wait_for(&app, DEV, "first: 50", |nodes| {
        of_source(nodes, "KUBERNETES")
            .iter()
            .find(|n| n["count"] == 4)
            .map(|n| (*n).clone())
    })
    .await;
    assert_eq!(entry["id"], series["id"]);
    let (nodes, _) = events(&app, DEV, "first: 50").await.unwrap();
    assert_eq!(nodes.iter().filter(|n| n["id"] == series["id"]).count(), 1);

    // The successful deployment is envlens' own, newest (2026), about no resource.
    assert_eq!(nodes[0]["source"], "ENVLENS");
    assert_eq!(nodes[0]["reason"], "DeploymentFinished");
    assert_eq!(nodes[0]["type"], "Normal");
    assert_eq!(nodes[0]["message"], "Deployment #1 success: main (abc)");
    assert_eq!(nodes[0]["resourceUid"], Value::Null);
    // A deployment that starts, then fails: two more, the failure a Warning.
    deploy(&app, 4, (100, SLUG), "running").await;
    let hook = json!({"object_kind": "deployment", "deployment_id": 4, "status": "failed",
        "status_changed_at": "2026-11-21 10:09:00 UTC", "environment": SLUG,
        "project": {"id": environment::PROJECT, "path_with_namespace": "acme/apps/web"}});
    assert_eq!(
        app.hook("Deployment Hook", hook.to_string(), None)
            .await
            .status,
        200
    );
    // Written again, the same status is not another event.
    assert_eq!(
        app.hook("Deployment Hook", hook.to_string(), None)
            .await
            .status,
        200
    );
    let (nodes, _) = events(&app, DEV, "first: 3").await.unwrap();
    let own: Vec<(&str, &str)> = nodes
        .iter()
        .map(|n| (n["reason"].as_str().unwrap(), n["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        own,
        [
            ("DeploymentFinished", "Warning"),
            ("DeploymentStarted", "Normal"),
            ("DeploymentFinished", "Normal")
        ]
    );
}

/// Polls the timeline until `found` finds something in it (at most 20 s).
async fn wait_for<T>(
    app: &TestApp,
    user: (i64, &str),
    args: &str,
    found: impl Fn(&[Value]) -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (nodes, _) = events(app, user, args).await.unwrap();
        if let Some(t) = found(&nodes) {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not in the timeline: {nodes:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn pages_follow_their_cursors_and_filters_keep_what_they_name() {
    let (api, served, _dir) = cluster().await;
    // 45 more, on 15 distinct times: ties are ordered too.
    for i in 0..45 {
        let mut e = environment::event(
            &format!("many.{i:02}"),
            "Pod",
            "web-new222-b",
            "uid-pod-web-new222-b",
            if i % 3 == 0 { "BackOff" } else { "Pulled" },
            &format!("2024-07-{:02}T00:00:00Z", 1 + i / 3),
        );
        e["message"] = json!(format!("event {i}"));
        api.insert(e);
    }
    let app = environment::gitlab(&served).await;
    let (all, _) = events(&app, DEV, "first: 100").await.unwrap();
    assert_eq!(all.len(), 45 + 3 + 1);

    let mut seen = Vec::new();
    let mut args = "first: 20".to_owned();
    loop {
        let (nodes, page) = events(&app, DEV, &args).await.unwrap();
        assert!(nodes.len() <= 20);
        seen.extend(nodes.iter().map(|n| n["id"].clone()));
        if page["hasNextPage"] == false {
            break;
        }
        args = format!("first: 20, after: {}", page["endCursor"]);
    }
    let expected: Vec<Value> = all.iter().map(|n| n["id"].clone()).collect();
    assert_eq!(
        seen, expected,
        "the pages are the whole list, in order, once"
    );
    let times: Vec<&str> = all
        .iter()
        .map(|n| n["lastTime"].as_str().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {times:?}"
    );

    let (warnings, _) = events(&app, DEV, r#"first: 100, types: ["Warning"]"#)
        .await
        .unwrap();
    assert_eq!(warnings.len(), 15 + 1);
    assert!(warnings.iter().all(|n| n["type"] == "Warning"));
    let (recent, _) = events(&app, DEV, r#"first: 100, since: "2024-07-14T00:00:00Z""#)
        .await
        .unwrap();
    let reasons: Vec<&str> = recent
        .iter()
        .map(|n| n["message"].as_str().unwrap())
        .collect();
    // July 14 and 15 (events 39 to 44), and the deployment of 2026.
    assert_eq!(recent.len(), 7, "{reasons:?}");

    for (args, field) in [
        ("after: \"garbage\"", "after"),
        ("first: 101", "first"),
        ("first: -1", "first"),
        (r#"types: ["Error"]"#, "types"),
    ] {
        let errors = events(&app, DEV, args).await.unwrap_err();
        let message = errors[0]["message"].as_str().unwrap();
        assert!(message.contains(field), "{args}: {errors}");
    }
}

#[tokio::test]
async fn a_viewer_without_user_access_sees_no_event_of_the_cluster() {
    let (_api, served, _dir) = cluster().await;
    let app = environment::gitlab(&served).await;
    // rep reads the project but has no `user_access` to agent 7.
    let (nodes, _) = events(&app, REP, "first: 50").await.unwrap();
    assert!(of_source(&nodes, "KUBERNETES").is_empty(), "{nodes:#?}");
    assert!(
        nodes.iter().all(|n| n["reason"] == "DeploymentFinished"),
        "{nodes:#?}"
    );
    let (nodes, _) = events(&app, DEV, "first: 50").await.unwrap();
    assert_eq!(of_source(&nodes, "KUBERNETES").len(), 3);
}

/// A second envlens on the database of `app`, over the same cluster.
async fn replica(app: &TestApp, served: &Served) -> TestApp {
    let settings = envlens::config::file::Settings::parse(&format!(
        "kubernetes:\n{}  response_timeout: 3s\n",
        served.connections(&["7", "8"])
    ))
    .unwrap();
    let state =
        envlens::state::AppState::new(app.db.clone(), keys(), envlens::config::Limits::default())
            .with_clusters(clusters(&settings).await, settings.cors);
    TestApp::serving(state, app.db.clone())
}

fn crashing(pod: &mut Value) {
    pod["spec"]["restartPolicy"] = json!("Always");
    pod["status"] = json!({"phase": "Running", "containerStatuses": [{"name": "app", "ready": false, "restartCount": 5,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}}]});
}

#[tokio::test]
async fn a_health_change_is_recorded_once_by_every_replica_that_sees_it() {
    let (api, served, _dir) = cluster().await;
    let mut pod = api.get("pods", Some(NS), "web-new222-a").unwrap();
    let app = environment::gitlab(&served).await;
    let other = replica(&app, &served).await;
    // Both replicas view the group: both record its health from now on. Its first sight is
    // where it stands, not a change.
    events(&app, DEV, "first: 1").await.unwrap();
    events(&other, DEV, "first: 1").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while app
        .rows("SELECT health FROM environment_health_marks WHERE resource_key = 'uid-pod-web-new222-a'")
        .await
        .is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "the pod's health is never marked: {:?}",
            app.rows("SELECT resource_key, health FROM environment_health_marks").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_sight = app
        .rows("SELECT id FROM environment_events WHERE reason LIKE '%HealthChanged'")
        .await;
    assert!(first_sight.is_empty(), "{first_sight:?}");

    crashing(&mut pod);
    api.insert(pod);
    let changed = wait_for(&app, DEV, r#"first: 20, types: ["Warning"]"#, |nodes| {
        let own: Vec<Value> = nodes
            .iter()
            .filter(|n| n["source"] == "ENVLENS" && n["reason"] == "HealthChanged")
            .cloned()
            .collect();
        (!own.is_empty()).then_some(own)
    })
    .await;
    assert_eq!(changed[0]["resourceUid"], "uid-pod-web-new222-a");
    let message = changed[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Pod web-new222-a is Degraded"),
        "{message}"
    );
    assert!(message.ends_with("(was Unknown)"), "{message}");
    // Both replicas saw it; give the slower one time to try, then count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = app
        .rows("SELECT reason, resource_uid FROM environment_events WHERE reason IN ('HealthChanged', 'GroupHealthChanged') ORDER BY id")
        .await;
    let pod_changes = rows
        .iter()
        .filter(|r| r["resource_uid"] == "uid-pod-web-new222-a")
        .count();
    assert_eq!(pod_changes, 1, "{rows:#?}");
    assert!(
        rows.iter()
            .filter(|r| r["reason"] == "GroupHealthChanged")
            .count()
            <= 1,
        "{rows:#?}"
    );
    // Viewing again records nothing more.
    for _ in 0..3 {
        events(&app, DEV, "first: 1").await.unwrap();
        events(&other, DEV, "first: 1").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = app
        .rows("SELECT id FROM environment_events WHERE reason IN ('HealthChanged', 'GroupHealthChanged')")
        .await;
    assert_eq!(again.len(), rows.len());
}

/// A replica whose first sight lags behind another's recorded change does not record the change
/// backwards (and then again): a first sight replaces only marks written before it started.
#[tokio::test]
async fn a_first_sight_older_than_a_recorded_change_is_no_change() {
    use envlens::db::events::record_health;
    use envlens::resources::health::HealthStatus;
    use envlens::resources::timeline::HealthMark;
    let (_api, served, _dir) = cluster().await;
    let app = environment::gitlab(&served).await;
    let db = &app.db;
    let mark = |health| HealthMark {
        key: "uid-pod".into(),
        health,
        message: format!("Pod p is {health:?}"),
    };
    let t = |s: i64| chrono::DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
    let recorded = || async {
        app.rows(
            "SELECT message FROM environment_events WHERE reason = 'HealthChanged' ORDER BY id",
        )
        .await
    };
    // A: first sight at 0 (only marked), then the crash at 10.
    let first = [mark(HealthStatus::Healthy)];
    assert_eq!(
        record_health(db, 100, &first, t(0), Some(t(0)))
            .await
            .unwrap(),
        0
    );
    let crash = [mark(HealthStatus::Degraded)];
    assert_eq!(
        record_health(db, 100, &crash, t(10), None).await.unwrap(),
        1
    );
    // B started following at 5 and its first sight, written at 12, still shows Healthy.
    assert_eq!(
        record_health(db, 100, &first, t(12), Some(t(5)))
            .await
            .unwrap(),
        0
    );
    // Then B sees the crash: the same change, already recorded.
    assert_eq!(
        record_health(db, 100, &crash, t(13), None).await.unwrap(),
        0
    );
    assert_eq!(
        recorded().await,
        vec![json!({"message": "Pod p is Degraded (was Healthy)"})]
    );
    // A replica that starts after the last mark catches up with what changed meanwhile.
    assert_eq!(
        record_health(db, 100, &first, t(30), Some(t(20)))
            .await
            .unwrap(),
        1
    );
    assert_eq!(recorded().await.len(), 2);
}

fn subscription() -> String {
    format!(
        "subscription($id: ID!) {{ environmentEventsUpdated(environmentId: $id) {{ {FIELDS} }} }}"
    )
}

#[tokio::test]
async fn new_events_reach_the_subscriber_over_the_websocket() {
    let (api, served, _dir) = cluster().await;
    let server =
        crate::subscriptions::start(crate::support::reach::Reach::Kubeconfig, &served).await;
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("1", &subscription(), json!({"id": PRODUCTION}))
        .await;
    // Subscribed once the group has been read (its first view starts the watches).
    wait_until_listening(&api).await;

    api.insert(environment::event(
        "live.1",
        "Deployment",
        "web",
        "uid-web",
        "ScalingReplicaSet",
        "2024-08-01T00:00:00Z",
    ));
    let first = client.next_payload("1").await;
    let event = &first["data"]["environmentEventsUpdated"];
    assert_eq!(
        (
            event["source"].as_str(),
            event["resourceUid"].as_str(),
            event["count"].as_i64()
        ),
        (Some("KUBERNETES"), Some("uid-web"), Some(1))
    );
    // Staging's is not sent; the series going on is, as the same entry.
    api.insert(environment::event(
        "live.stg",
        "Deployment",
        "web-staging",
        "uid-web-staging",
        "ScalingReplicaSet",
        "2024-08-01T00:00:00Z",
    ));
    let mut again = environment::event(
        "live.1",
        "Deployment",
        "web",
        "uid-web",
        "ScalingReplicaSet",
        "2024-08-02T00:00:00Z",
    );
    again["count"] = json!(2);
    api.insert(again);
    let second = client.next_payload("1").await;
    let event2 = &second["data"]["environmentEventsUpdated"];
    assert_eq!(event2["id"], event["id"]);
    assert_eq!(event2["count"], 2);
    assert_eq!(event2["lastTime"], "2024-08-02T00:00:00Z");

    // envlens' own, through the database's notifications.
    deploy(&server.app, 5, (100, SLUG), "running").await;
    let third = client.next_payload("1").await;
    let own = &third["data"]["environmentEventsUpdated"];
    assert_eq!(
        (own["source"].as_str(), own["reason"].as_str()),
        (Some("ENVLENS"), Some("DeploymentStarted"))
    );

    // A viewer without `user_access` is refused.
    let mut rep = Client::connect(server.addr, "graphql-transport-ws", REP).await;
    rep.subscribe("2", &subscription(), json!({"id": PRODUCTION}))
        .await;
    let m = rep.message().await;
    let error = if m["type"] == "error" {
        &m["payload"][0]
    } else {
        &m["payload"]["errors"][0]
    };
    assert_eq!(error["extensions"]["code"], "FORBIDDEN", "{m}");
}

/// Waits until envlens watches the namespace's Events (the subscription's first read).
async fn wait_until_listening(api: &KubeApi) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while api.request_count("watch", "events") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the Events are never watched"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The feed's first assembly, which the subscriber's Events wait for.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The timeline on the environment page, in headless Chromium: beside the resources at 1440
/// px, below them at 390 px without overflowing, linked to its resources, and a new Event shown
/// without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_page_shows_the_timeline_beside_the_resources_in_chromium() {
    use crate::support::browser::Browser;
    use crate::support::demo::Demo;
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let shots = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser");
    let demo = Demo::start().await;
    let page = browser.page().await;
    page.screen(1440, false).await;
    demo.sign_in(&page).await;
    page.wait_for(
        "document.querySelector('h1') && document.querySelector('h1').innerText === 'Your groups'",
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    let env_url = format!(
        "{}/environments?project=acme/platform/shop&name=production",
        demo.url
    );
    page.goto(&env_url).await;
    let ready = page
        .wait_for(
            "document.querySelectorAll('ol.timeline li').length >= 2",
            Duration::from_secs(20),
        )
        .await;
    if let Err(e) = ready {
        page.screenshot(&shots.join("failed-timeline.png")).await;
        panic!("{e}: {}", page.text().await);
    }
    // Beside: the timeline's left edge is right of the resources' right edge, their tops level.
    let beside = page
        .eval(
            "(() => { const r = document.getElementById('resources').getBoundingClientRect(); \
               const t = document.querySelector('section.timeline').getBoundingClientRect(); \
               return t.left >= r.right && Math.abs(t.top - r.top) < 80; })()",
        )
        .await;
    assert_eq!(beside, json!(true));
    // Newest first, each with its type, reason, time; Kubernetes ones linked to their resource.
    let times = page
        .eval("[...document.querySelectorAll('ol.timeline li time')].map(t => t.getAttribute('datetime'))")
        .await;
    let times: Vec<&str> = times
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    let linked = page
        .eval("[...document.querySelectorAll('ol.timeline li .about a')].every(a => a.href.includes('/resources?'))")
        .await;
    assert_eq!(linked, json!(true));

    // The live status first, then a new Event about a worker Pod: put in place from the
    // subscription's message, without a reload.
    page.wait_for(
        "document.getElementById('live').dataset.state === 'live'",
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    page.eval("window.__notReloaded = true").await;
    let pod_name = demo
        .cluster
        .names("Pod", "shop-production")
        .into_iter()
        .find(|n| n.starts_with("worker-"))
        .unwrap();
    let pod = demo
        .cluster
        .get("Pod", "shop-production", &pod_name)
        .unwrap();
    // The series goes on until the page's subscription (started with the page) shows it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for count in 1.. {
        let now = chrono::Utc::now().to_rfc3339();
        demo.cluster.put(json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{pod_name}.oom"), "namespace": "shop-production"},
            "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": "shop-production", "uid": pod["metadata"]["uid"]},
            "type": "Warning", "reason": "OOMKilling", "message": "Memory cgroup out of memory: Killed process 4242 (worker)",
            "firstTimestamp": now, "lastTimestamp": now, "count": count, "source": {"component": "kernel-monitor"}}));
        let shown = page
            .wait_for(
                &format!(
                    "window.__notReloaded && document.body.dataset.timeline \
                 && document.querySelector('ol.timeline li').innerText.includes('OOMKilling') \
                 && document.querySelector('ol.timeline li').innerText.includes('×{count}')"
                ),
                Duration::from_secs(2),
            )
            .await;
        if shown.is_ok() && count > 1 {
            break;
        }
        if std::time::Instant::now() > deadline {
            page.screenshot(&shots.join("failed-timeline-live.png"))
                .await;
            panic!(
                "the timeline never showed the Event in place: {}",
                page.text().await
            );
        }
    }
    page.screenshot(&shots.join("environment-timeline-1440-light.png"))
        .await;
    page.screenshot_screen(&shots.join("environment-timeline-1440-light.screen.png"))
        .await;

    // A phone: the timeline below the resources, nothing wider than the screen.
    page.screen(390, true).await;
    page.goto(&env_url).await;
    page.wait_for(
        "document.querySelectorAll('ol.timeline li').length >= 2",
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    let below = page
        .eval(
            "(() => { const r = document.getElementById('resources').getBoundingClientRect(); \
               const t = document.querySelector('section.timeline').getBoundingClientRect(); \
               return t.top >= r.bottom && document.documentElement.scrollWidth <= 390; })()",
        )
        .await;
    assert_eq!(below, json!(true));
    page.screenshot(&shots.join("environment-timeline-390-dark.png"))
        .await;
}
