//! Deployment history end to end (SPEC 10): the success hook queues a snapshot, the worker
//! takes it from the test Kubernetes API server as the agent, GraphQL and `envlens history`
//! read it back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envlens::config::file::Settings;
use envlens::history::worker::{Turn, Worker};
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::environment::{self, gitlab_labels, meta, World, NS, PROJECT, SLUG};
use crate::support::kube_api::{Fault, KubeApi, Served};
use crate::support::reach::{both_ways, Reach};
use crate::support::*;

const DEV: (i64, &str) = (2, "dev");
const REP: (i64, &str) = (3, "rep");
/// The `production` environment of the support's GitLab.
const PRODUCTION: (i64, &str) = (100, SLUG);

const FAST: &str =
    "history:\n  settle_poll: 100ms\n  retry_backoff: 100ms\n  settle_timeout: 30s\n";

/// A Deployment of `image`, `updated` of its 2 replicas rolled out.
fn web(image: &str, updated: u32) -> Value {
    let mut metadata = meta(NS, "web", "uid-web", gitlab_labels(SLUG, "web"));
    metadata["generation"] = json!(2);
    metadata["annotations"] = json!({"deployment.kubernetes.io/revision": "2"});
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "app", "image": image},
                                                      {"name": "proxy", "image": "envoy:1"}]}}},
        "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": updated,
                   "readyReplicas": updated, "availableReplicas": updated}
    })
}

fn config_map(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": meta(NS, name, &format!("uid-{name}"), gitlab_labels(SLUG, "web")),
           "data": {"value": value}})
}

/// production: the Deployment, a ConfigMap, a Secret; nothing else is labelled for it.
async fn cluster() -> (KubeApi, Served, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    api.insert(web("web:1", 2));
    api.insert(config_map("web-config", "one"));
    api.insert(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": meta(NS, "web-secret", "uid-secret", gitlab_labels(SLUG, "web")),
        "data": {"password": "aHVudGVyMg=="}}),
    );
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

/// The support's GitLab (deployments 1 to `production` and 2 to `review` succeeded, 3
/// failed) with `history` settings, reached as `reach` says, and a worker over the same
/// cluster connections.
async fn gitlab(reach: Reach, served: &Served, history: &str) -> (World, Worker) {
    let app = environment::gitlab_via(reach, served, history).await;
    let worker = worker(&app, history).await;
    (app, worker)
}

/// A worker (as `serve` starts it) over the cluster connections of `world`'s envlens.
async fn worker(world: &World, history: &str) -> Worker {
    let yaml = world.reached.config("  response_timeout: 3s\n", history);
    let settings = Settings::parse(&yaml).unwrap();
    let clusters = crate::support::clusters(&settings).await;
    Worker::new(
        world.db.clone(),
        Arc::new(clusters),
        Arc::default(),
        settings.history,
    )
}

/// Turns until `done` says so, at most a minute (settling waits its poll).
async fn run_until(
    worker: &Worker,
    mut done: impl FnMut(&(i64, Turn)) -> bool,
) -> Vec<(i64, Turn)> {
    let start = Instant::now();
    let mut turns = Vec::new();
    loop {
        for turn in worker.run_until_idle().await.unwrap() {
            let finished = done(&turn);
            turns.push(turn);
            if finished {
                return turns;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "turns so far: {turns:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const SNAPSHOT: &str = "snapshot { takenAt settledAt health healthMessage timeToHealthy
    resources { uid apiVersion kind namespace name labels health { status message } manifest } }";
const STATUS: &str = "snapshotStatus { state attempts lastError nextAttemptAt }";
const CHANGES: &str = "since { id } added { kind name } removed { kind name }
    modified { resource { kind name } patch } images { resource { kind name } container before after }";

/// `fields` of deployment `id` (its iid too) as `user`: the deployment, or the whole response
/// when it has errors.
async fn deployment(app: &TestApp, user: (i64, &str), id: i64, fields: &str) -> Value {
    let body = app.graphql(user,
        &format!(
            r#"{{ project(fullPath: "acme/apps/web") {{ deployment(iid: "{id}") {{ id status {fields} }} }} }}"#
        ),
    )
    .await;
    if body.get("errors").is_some() {
        return body;
    }
    body["data"]["project"]["deployment"].clone()
}

fn resource<'a>(snapshot: &'a Value, kind: &str, name: &str) -> &'a Value {
    snapshot["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == kind && r["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {snapshot}"))
}

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&app.db).await.unwrap()
}

fn success_hook(id: i64) -> String {
    json!({"object_kind": "deployment", "deployment_id": id, "status": "success",
        "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": SLUG,
        "project": {"id": PROJECT, "path_with_namespace": "acme/apps/web"}})
    .to_string()
}

both_ways!(a_success_is_snapshotted_once_and_its_changes_read_back);
/// Through GitLab's agent server, agent 7 (`access_as: user`) has no entry: the snapshots are
/// read as envlens' token's user, the history shown by reviews (SPEC 14).
async fn a_success_is_snapshotted_once_and_its_changes_read_back(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let (app, worker) = gitlab(reach, &served, FAST).await;
    snapshotted_once_and_read_back(&api, &app, &worker).await;
    if let Some(through) = &app.reached.kas {
        assert!(
            !through.kas.received().is_empty(),
            "the snapshots went through KAS"
        );
    }
}

async fn snapshotted_once_and_read_back(api: &KubeApi, app: &TestApp, worker: &Worker) {
    let mut turns = worker.run_until_idle().await.unwrap();
    turns.sort_by_key(|t| t.0);
    assert_eq!(
        turns,
        [
            (1, Turn::Taken { settled: true }),
            (2, Turn::Taken { settled: true })
        ],
        "the two successful deployments with an agent, not the failed one"
    );

    // The same success again, with and without a delivery id: nothing more to do.
    for delivery in [None, Some("d-1"), Some("d-1")] {
        let res = app.hook("Deployment Hook", success_hook(1), delivery).await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    assert!(worker.run_until_idle().await.unwrap().is_empty());
    assert_eq!(
        count(app, "SELECT count(*) FROM deployment_snapshots").await,
        2
    );

    let first = deployment(app, DEV, 1, SNAPSHOT).await;
    let snapshot = &first["snapshot"];
    assert_eq!(snapshot["health"], "HEALTHY", "{first}");
    assert!(snapshot["settledAt"].is_string());
    assert!(snapshot["timeToHealthy"].as_f64().unwrap() < 5.0);
    assert_eq!(
        snapshot["resources"].as_array().unwrap().len(),
        3,
        "{snapshot}"
    );
    let deployed = resource(snapshot, "Deployment", "web");
    assert_eq!(deployed["uid"], "uid-web");
    assert_eq!(deployed["health"]["status"], "HEALTHY");
    assert_eq!(deployed["labels"]["app"], "web");
    let manifest = &deployed["manifest"];
    assert_eq!(
        manifest["spec"]["template"]["spec"]["containers"][0]["image"],
        "web:1"
    );
    for absent in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
    ] {
        assert!(
            manifest["metadata"].get(absent).is_none(),
            "{absent}: {manifest}"
        );
    }
    assert!(manifest.get("status").is_none(), "{manifest}");
    let secret = resource(snapshot, "Secret", "web-secret");
    assert_eq!(secret["manifest"]["data"]["password"], "++++++++");
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT body FROM history_manifests")
        .fetch_all(&app.db)
        .await
        .unwrap();
    for body in stored {
        let text = envlens::history::snapshot::decompress(&body).unwrap();
        assert!(
            !String::from_utf8_lossy(&text).contains("aHVudGVyMg"),
            "a Secret's value stored"
        );
    }

    // The next deployment: a new image for one container, a ConfigMap replaced by another.
    api.insert(web("web:2", 2));
    api.remove("configmaps", Some(NS), "web-config");
    api.insert(config_map("web-config-2", "two"));
    environment::deploy(app, 4, PRODUCTION, "success").await;
    let turns = run_until(worker, |t| t.0 == 4).await;
    assert_eq!(turns.last().unwrap().1, Turn::Taken { settled: true });

    let expected_images = json!([{"resource": {"kind": "Deployment", "name": "web"},
        "container": "app", "before": "web:1", "after": "web:2"}]);
    let latest = deployment(app, DEV, 4, &format!("changes {{ {CHANGES} }}")).await;
    let changes = &latest["changes"];
    assert_eq!(
        changes["since"]["id"], "gid://gitlab/Deployment/1",
        "{latest}"
    );
    assert_eq!(
        changes["added"],
        json!([{"kind": "ConfigMap", "name": "web-config-2"}])
    );
    assert_eq!(
        changes["removed"],
        json!([{"kind": "ConfigMap", "name": "web-config"}])
    );
    assert_eq!(
        changes["modified"],
        json!([{"resource": {"kind": "Deployment", "name": "web"},
                "patch": [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "web:2"}]}]),
        "the status and the bumped resourceVersion are not changes"
    );
    assert_eq!(changes["images"], expected_images);

    // `since` names the base; against itself nothing changed; the first one has no base.
    let explicit = deployment(
        app,
        DEV,
        4,
        &format!(r#"changes(since: "gid://gitlab/Deployment/1") {{ {CHANGES} }}"#),
    )
    .await;
    assert_eq!(explicit["changes"], *changes);
    let itself = deployment(
        app,
        DEV,
        4,
        &format!(r#"changes(since: "4") {{ {CHANGES} }}"#),
    )
    .await;
    assert_eq!(itself["changes"]["modified"], json!([]));
    assert_eq!(itself["changes"]["added"], json!([]));
    let base = deployment(app, DEV, 1, &format!("changes {{ {CHANGES} }}")).await;
    assert!(base["changes"]["since"].is_null());
    assert_eq!(base["changes"]["added"].as_array().unwrap().len(), 3);

    // A `since` that cannot be compared is a clear error.
    for since in [
        "gid://gitlab/Deployment/3",
        "gid://gitlab/Deployment/2",
        "banana",
    ] {
        let body = deployment(
            app,
            DEV,
            4,
            &format!(r#"changes(since: "{since}") {{ added {{ name }} }}"#),
        )
        .await;
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("since"), "{since}: {body}");
    }
}

/// A page of 20 deployments with their snapshots' resources and their changes is within the
/// complexity limit (each is read from the database, not asked of the cluster); a page of 100
/// is refused with its figure, as GitLab words it.
#[tokio::test]
async fn a_page_of_deployments_with_their_changes_is_within_the_limit() {
    let (api, served, _dir) = cluster().await;
    let (app, worker) = gitlab(Reach::Kubeconfig, &served, FAST).await;
    run_until(&worker, |t| t.0 == 2).await;
    api.insert(web("web:2", 2));
    environment::deploy(&app, 4, PRODUCTION, "success").await;
    run_until(&worker, |t| t.0 == 4).await;
    let page = |first: u32| {
        format!(
            r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
            deployments(first: {first}) {{ nodes {{ iid snapshot {{ resources {{ kind name }} }}
            changes {{ added {{ kind name }} removed {{ kind name }}
              modified {{ resource {{ kind name }} patch }} images {{ container before after }} }} }} }} }} }} }}"#
        )
    };
    let body = app.graphql(DEV, &page(20)).await;
    assert!(body.get("errors").is_none(), "{body}");
    let nodes = body["data"]["project"]["environment"]["deployments"]["nodes"]
        .as_array()
        .unwrap()
        .clone();
    let four = nodes
        .iter()
        .find(|n| n["iid"] == "4")
        .expect("deployment 4");
    assert_eq!(four["snapshot"]["resources"].as_array().unwrap().len(), 3);
    assert_eq!(
        four["changes"]["images"],
        json!([{"container": "app", "before": "web:1", "after": "web:2"}])
    );
    let body = app.graphql(DEV, &page(100)).await;
    assert_eq!(
        body["errors"][0]["message"],
        "Query has complexity of 10402, which exceeds max complexity of 5000",
        "{body}"
    );
    assert_eq!(
        body["errors"][0]["extensions"]["code"],
        "GRAPHQL_VALIDATION_FAILED"
    );
}

both_ways!(a_reader_without_user_access_is_refused);
async fn a_reader_without_user_access_is_refused(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let (app, worker) = gitlab(reach, &served, FAST).await;
    worker.run_until_idle().await.unwrap();
    for fields in [SNAPSHOT, "changes { added { name } }"] {
        let body = deployment(&app, REP, 1, fields).await;
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "FORBIDDEN",
            "{body}"
        );
        assert!(body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("user_access"));
    }
    // The deployments themselves stay readable; one without an agent has no snapshot.
    let ok = deployment(&app, DEV, 1, "snapshot { health }").await;
    assert_eq!(ok["snapshot"]["health"], "HEALTHY");
}

both_ways!(a_late_success_after_a_newer_one_is_superseded);
async fn a_late_success_after_a_newer_one_is_superseded(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let (app, worker) = gitlab(reach, &served, FAST).await;
    worker.run_until_idle().await.unwrap();
    // 5 starts, 6 starts and succeeds, then 5's success arrives.
    environment::deploy(&app, 5, PRODUCTION, "running").await;
    environment::deploy(&app, 6, PRODUCTION, "success").await;
    assert_eq!(
        run_until(&worker, |t| t.0 == 6).await.last().unwrap().1,
        Turn::Taken { settled: true }
    );
    let res = app.hook("Deployment Hook", success_hook(5), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        worker.run_until_idle().await.unwrap(),
        [(5, Turn::Superseded)]
    );
    let late = deployment(&app, DEV, 5, "snapshot { health }").await;
    assert_eq!(late["status"], "SUCCESS");
    assert!(late["snapshot"].is_null(), "{late}");
    // 6 compares with 1, the last one with a snapshot.
    let six = deployment(&app, DEV, 6, "changes { since { id } }").await;
    assert_eq!(six["changes"]["since"]["id"], "gid://gitlab/Deployment/1");
}

/// A snapshot is due when a successful deployment gets its agent: whether the success hook
/// came before the creation call or the call itself says `success`; a deployment that has not
/// succeeded queues none (the creation call asks the database nothing about it).
#[tokio::test]
async fn a_snapshot_is_queued_when_a_succeeded_deployment_gets_its_agent() {
    let (_api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(Reach::Kubeconfig, &served, FAST).await;
    let queued = |id: i64| {
        let db = app.db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM snapshot_jobs WHERE deployment_id = $1",
            )
            .bind(id)
            .fetch_one(&db)
            .await
            .unwrap()
        }
    };
    let res = app.hook("Deployment Hook", success_hook(20), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(queued(20).await, 0, "no agent yet, no snapshot");
    let create =
        |id, status| environment::create(&app, id, PRODUCTION, status, ("acme/agents:prod", NS));
    create(20, "created").await;
    assert_eq!(queued(20).await, 1, "the hook's success, then the agent");
    create(21, "success").await;
    assert_eq!(queued(21).await, 1, "the call's own success");
    create(22, "running").await;
    assert_eq!(queued(22).await, 0);
}

both_ways!(two_claimers_take_each_snapshot_once);
async fn two_claimers_take_each_snapshot_once(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let app = environment::gitlab_via(reach, &served, FAST).await;
    let (one, two) = (worker(&app, FAST).await, worker(&app, FAST).await);
    for id in 10..16 {
        environment::deploy(&app, id, (200 + id, &format!("env-{id}")), "success").await;
    }
    let (a, b) = tokio::join!(one.run_until_idle(), two.run_until_idle());
    let mut ids: Vec<i64> = a
        .unwrap()
        .into_iter()
        .chain(b.unwrap())
        .map(|t| t.0)
        .collect();
    ids.sort();
    assert_eq!(ids, [1, 2, 10, 11, 12, 13, 14, 15], "each job claimed once");
    assert_eq!(
        count(&app, "SELECT count(*) FROM deployment_snapshots").await,
        8
    );

    // A claimer whose lease ran out after it wrote: the job runs again, the snapshot stays.
    let before: Value = sqlx::query_scalar(
        "SELECT to_jsonb(s) FROM deployment_snapshots s WHERE deployment_id = 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    sqlx::query("UPDATE snapshot_jobs SET phase = 'taken', due_at = now() WHERE deployment_id = 1")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(one.run_until_idle().await.unwrap().len(), 1);
    let after: Value = sqlx::query_scalar(
        "SELECT to_jsonb(s) FROM deployment_snapshots s WHERE deployment_id = 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(before, after);

    // A claimer that dies holding a job (its process restarted): the job waits out the lease,
    // then another claimer takes it. Nothing acknowledged is lost.
    environment::deploy(&app, 20, (220, "env-20"), "success").await;
    let held = envlens::db::history::claim(&app.db, 2.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.deployment_id, 20);
    assert!(two.run_until_idle().await.unwrap().is_empty(), "claimed");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        two.run_until_idle().await.unwrap(),
        [(20, Turn::Taken { settled: true })]
    );
}

both_ways!(an_unreadable_cluster_is_retried_until_it_answers);
async fn an_unreadable_cluster_is_retried_until_it_answers(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let down = Arc::new(AtomicBool::new(true));
    let flag = down.clone();
    api.fault(move |_| {
        flag.load(Ordering::SeqCst)
            .then(|| Fault::Status(503, "etcd is unavailable".into()))
    });
    // A retry long enough that no job comes due again within the first round, however slow
    // the machine.
    let history = "history:\n  retry_backoff: 3s\n";
    let (app, worker) = gitlab(reach, &served, history).await;
    let turns = worker.run_until_idle().await.unwrap();
    assert_eq!(turns.len(), 2, "{turns:?}");
    for (_, turn) in &turns {
        assert!(
            matches!(turn, Turn::Failed { gave_up: false, .. }),
            "{turns:?}"
        );
    }
    let job: (String, i32, Option<String>) = sqlx::query_as(
        "SELECT phase, attempts, last_error FROM snapshot_jobs WHERE deployment_id = 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((job.0.as_str(), job.1), ("taken", 1));
    let error = job.2.unwrap();
    assert!(error.contains("etcd is unavailable"), "{error}");
    assert!(
        error.contains(" more)"),
        "a few kinds named, not all: {error}"
    );
    // The deployment itself is untouched, and has no snapshot yet: its status says why.
    let one = deployment(&app, DEV, 1, &format!("snapshot {{ health }} {STATUS}")).await;
    assert_eq!(one["status"], "SUCCESS");
    assert!(one["snapshot"].is_null());
    let status = &one["snapshotStatus"];
    assert_eq!(status["state"], "RETRYING", "{one}");
    assert_eq!(status["attempts"], 1);
    assert!(
        status["lastError"]
            .as_str()
            .unwrap()
            .contains("etcd is unavailable"),
        "{one}"
    );
    assert!(status["nextAttemptAt"].is_string(), "{one}");

    down.store(false, Ordering::SeqCst);
    let turns = run_until(&worker, |t| t.0 == 1 && matches!(t.1, Turn::Taken { .. })).await;
    let of_one: Vec<&Turn> = turns.iter().filter(|t| t.0 == 1).map(|t| &t.1).collect();
    assert!(
        of_one[..of_one.len() - 1]
            .iter()
            .all(|t| matches!(t, Turn::Failed { gave_up: false, .. })),
        "retried until the cluster answered: {turns:?}"
    );
    let one = deployment(
        &app,
        DEV,
        1,
        &format!("snapshot {{ health resources {{ name }} errors {{ kind }} }} {STATUS}"),
    )
    .await;
    assert_eq!(
        one["snapshot"]["resources"].as_array().unwrap().len(),
        3,
        "{one}"
    );
    assert_eq!(one["snapshot"]["errors"], json!([]));
    assert_eq!(one["snapshotStatus"]["state"], "DONE", "{one}");
    assert!(one["snapshotStatus"]["nextAttemptAt"].is_null(), "{one}");
}

both_ways!(a_kind_the_cluster_refuses_is_named_in_the_snapshot);
async fn a_kind_the_cluster_refuses_is_named_in_the_snapshot(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    api.deny(|i| i.resource == "secrets");
    let app = environment::gitlab_via(reach, &served, FAST).await;
    // Queued, not yet taken.
    let pending = deployment(&app, DEV, 1, STATUS).await;
    assert_eq!(pending["snapshotStatus"]["state"], "PENDING", "{pending}");
    assert_eq!(pending["snapshotStatus"]["attempts"], 0);
    let worker = worker(&app, FAST).await;
    let turns = worker.run_until_idle().await.unwrap();
    assert!(
        turns.contains(&(1, Turn::Taken { settled: true })),
        "a refused kind does not stop the snapshot: {turns:?}"
    );
    let one = deployment(
        &app,
        DEV,
        1,
        "snapshot { resources { kind } errors { apiVersion kind code message } }",
    )
    .await;
    let snapshot = &one["snapshot"];
    let kinds: Vec<&str> = snapshot["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert!(!kinds.contains(&"Secret"), "{kinds:?}");
    let errors = snapshot["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{snapshot}");
    assert_eq!(errors[0]["apiVersion"], "v1");
    assert_eq!(errors[0]["kind"], "Secret");
    assert_eq!(errors[0]["code"], 403);
    assert!(
        errors[0]["message"].as_str().unwrap().contains("forbidden"),
        "{snapshot}"
    );
    // The status needs user_access like the snapshot.
    let refused = deployment(&app, REP, 1, STATUS).await;
    assert_eq!(refused["errors"][0]["extensions"]["code"], "FORBIDDEN");
}

both_ways!(retention_keeps_the_newest_snapshots_and_their_manifests);
async fn retention_keeps_the_newest_snapshots_and_their_manifests(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let history = format!("{FAST}  keep_per_environment: 2\n");
    let (app, worker) = gitlab(reach, &served, &history).await;
    worker.run_until_idle().await.unwrap();
    for (id, value) in [(4, "four"), (5, "five"), (6, "six")] {
        api.insert(config_map("web-config", value));
        environment::deploy(&app, id, PRODUCTION, "success").await;
        run_until(&worker, |t| t.0 == id).await;
    }
    let kept: Vec<i64> = sqlx::query_scalar(
        "SELECT deployment_id FROM deployment_snapshots WHERE environment_id = 100 ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(kept, [5, 6]);
    let jobs: Vec<i64> = sqlx::query_scalar(
        "SELECT j.deployment_id FROM snapshot_jobs j JOIN deployments d ON d.id = j.deployment_id
         WHERE d.environment_id = 100 ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(jobs, [5, 6], "the jobs of pruned snapshots go with them");
    // The manifests left are exactly those the kept snapshots name: the ConfigMaps of five
    // and six, and the unchanged Deployment and Secret.
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM history_manifests WHERE environment_id = 100"
        )
        .await,
        4
    );
    let mut conn = app.db.acquire().await.unwrap();
    let mut named = std::collections::BTreeSet::new();
    for id in kept {
        let row = envlens::db::history::snapshot(&mut conn, id)
            .await
            .unwrap()
            .unwrap();
        for e in envlens::history::store::entries(&mut conn, &row)
            .await
            .unwrap()
        {
            named.insert(e.manifest);
        }
    }
    assert_eq!(named.len(), 4);
    let four = deployment(&app, DEV, 4, "snapshot { health }").await;
    assert!(four["snapshot"].is_null());
    let six = deployment(&app, DEV, 6, "changes { since { id } modified { patch } }").await;
    assert_eq!(six["changes"]["since"]["id"], "gid://gitlab/Deployment/5");
    assert_eq!(
        six["changes"]["modified"][0]["patch"],
        json!([{"op": "replace", "path": "/data/value", "value": "six"}])
    );
}

both_ways!(a_rollout_settles_when_it_leaves_progressing);
async fn a_rollout_settles_when_it_leaves_progressing(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    api.insert(web("web:1", 1));
    let (app, worker) = gitlab(reach, &served, FAST).await;
    let turns = worker.run_until_idle().await.unwrap();
    assert!(
        turns.contains(&(1, Turn::Taken { settled: false })),
        "{turns:?}"
    );
    let first = deployment(&app, DEV, 1, SNAPSHOT).await;
    assert_eq!(first["snapshot"]["health"], "PROGRESSING", "{first}");
    assert!(first["snapshot"]["settledAt"].is_null());
    assert!(first["snapshot"]["timeToHealthy"].is_null());

    tokio::time::sleep(Duration::from_millis(300)).await;
    api.insert(web("web:1", 2));
    let turns = run_until(&worker, |t| t.0 == 1 && t.1 == Turn::Settled).await;
    assert!(turns
        .iter()
        .all(|t| t.1 == Turn::Settling || t.1 == Turn::Settled));
    let settled = deployment(&app, DEV, 1, SNAPSHOT).await;
    let snapshot = &settled["snapshot"];
    assert_eq!(snapshot["health"], "HEALTHY", "{settled}");
    assert_eq!(
        resource(snapshot, "Deployment", "web")["health"]["status"],
        "HEALTHY"
    );
    let seconds = snapshot["timeToHealthy"].as_f64().unwrap();
    assert!((0.3..20.0).contains(&seconds), "{seconds}");
    assert!(snapshot["settledAt"].as_str().unwrap() >= snapshot["takenAt"].as_str().unwrap());
}

both_ways!(a_rollout_that_never_settles_ends_at_the_timeout);
async fn a_rollout_that_never_settles_ends_at_the_timeout(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    api.insert(web("web:1", 1));
    let history = "history:\n  settle_poll: 100ms\n  settle_timeout: 600ms\n";
    let (app, worker) = gitlab(reach, &served, history).await;
    let started = Instant::now();
    run_until(&worker, |t| t.0 == 1 && t.1 == Turn::Settled).await;
    assert!(started.elapsed() >= Duration::from_millis(600));
    let snapshot = deployment(&app, DEV, 1, SNAPSHOT).await["snapshot"].clone();
    assert_eq!(snapshot["health"], "PROGRESSING");
    assert!(snapshot["settledAt"].is_string());
    assert!(snapshot["timeToHealthy"].is_null(), "{snapshot}");
    let phase: String =
        sqlx::query_scalar("SELECT phase FROM snapshot_jobs WHERE deployment_id = 1")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(phase, "done");
}

/// The URL of `pool`'s database, for a process of its own.
fn url_of(pool: &sqlx::PgPool) -> String {
    let options = pool.connect_options();
    let database = options.get_database().expect("a database name").to_owned();
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let (base, query) = url.split_once('?').unwrap_or((&url, ""));
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        return format!("{server}/{database}?{query}");
    }
    let socket = options
        .get_socket()
        .expect("the private server's socket folder");
    format!(
        "postgresql://{}@localhost:{}/{database}?host={}",
        options.get_username(),
        options.get_port(),
        socket.display()
    )
}

/// `envlens history <args>` over `app`'s database: its exit status, stdout and stderr.
async fn envlens_history(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let url = url_of(&app.db);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_envlens"))
            .arg("history")
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DATABASE_URL", url)
            .env("ENVLENS_DATA_DIR", "/proc/envlens-data")
            .output()
            .expect("envlens history")
    })
    .await
    .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

both_ways!(envlens_history_prints_the_changes);
async fn envlens_history_prints_the_changes(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let (app, worker) = gitlab(reach, &served, FAST).await;
    worker.run_until_idle().await.unwrap();
    api.insert(web("web:2", 2));
    environment::deploy(&app, 4, PRODUCTION, "success").await;
    run_until(&worker, |t| t.0 == 4).await;

    let (ok, out, err) = envlens_history(&app, &["--deployment", "4", "--output", "json"]).await;
    assert!(ok, "{err}");
    let changes: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(changes["deployment"], 4);
    assert_eq!(changes["since"], 1);
    assert_eq!(changes["health"], "HEALTHY");
    assert_eq!(
        changes["images"],
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "namespace": NS, "name": "web",
                "container": "app", "before": "web:1", "after": "web:2"}])
    );
    assert_eq!(
        changes["modified"][0]["patch"][0]["path"],
        "/spec/template/spec/containers/0/image"
    );
    assert_eq!(changes["added"], json!([]));

    // By project and environment: the newest successful deployment, as text.
    let (ok, text, err) =
        envlens_history(&app, &["--project", "acme/apps/web", "--environment", SLUG]).await;
    assert!(ok, "{err}");
    assert!(text.starts_with("deployment 4\n"), "{text}");
    assert!(text.contains("compared with deployment 1\n"), "{text}");
    assert!(
        text.contains("apps/v1 Deployment shop/web app: web:1 -> web:2\n"),
        "{text}"
    );
    let (ok, text, _) = envlens_history(
        &app,
        &[
            "--project",
            "acme/apps/web",
            "--environment",
            SLUG,
            "--iid",
            "4",
            "--since",
            "4",
        ],
    )
    .await;
    assert!(ok);
    assert!(text.ends_with("no changes\n"), "{text}");

    // A deployment without a snapshot, and one that does not exist: exit 1, saying why.
    let (ok, _, err) = envlens_history(&app, &["--deployment", "3"]).await;
    assert!(!ok);
    assert!(err.contains("deployment 3 has no snapshot"), "{err}");
    let (ok, _, err) = envlens_history(
        &app,
        &["--project", "acme/apps/web", "--environment", "nowhere"],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("no successful deployment of acme/apps/web to nowhere"),
        "{err}"
    );
}

both_ways!(a_change_still_in_flight_at_the_hook_is_in_the_snapshot);
/// The deploy job's last write lands at the API server just before GitLab's success, and its
/// watch event is slow to follow: the snapshot at the hook still holds it (a consistent read),
/// and a write that never reaches the cache in time is read fresh.
async fn a_change_still_in_flight_at_the_hook_is_in_the_snapshot(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let (app, worker) = gitlab(reach, &served, FAST).await;
    worker.run_until_idle().await.unwrap();
    let lists_of_deployments = || api.request_count("list", "deployments.apps");

    // The watch event follows the write half a second later: the cache is behind at the hook.
    api.delay_watch_events(Duration::from_millis(500));
    api.insert(web("web:2", 2));
    api.remove("configmaps", Some(NS), "web-config");
    environment::deploy(&app, 4, PRODUCTION, "success").await;
    let before = lists_of_deployments();
    let turns = run_until(&worker, |t| t.0 == 4).await;
    assert_eq!(turns.last().unwrap().1, Turn::Taken { settled: true });
    let four = deployment(&app, DEV, 4, &format!("changes {{ {CHANGES} }}")).await;
    assert_eq!(
        four["changes"]["images"],
        json!([{"resource": {"kind": "Deployment", "name": "web"},
            "container": "app", "before": "web:1", "after": "web:2"}]),
        "{four}"
    );
    assert_eq!(
        four["changes"]["removed"],
        json!([{"kind": "ConfigMap", "name": "web-config"}]),
        "a deletion in flight too: {four}"
    );
    // Waited for the cache (well within its bound): the objects came from it, not a fresh list.
    assert_eq!(
        lists_of_deployments() - before,
        1,
        "one metadata list of Deployments, no fresh one"
    );

    // A watch slower than the bound: the kinds still behind are listed fresh.
    api.delay_watch_events(Duration::from_secs(5));
    api.insert(web("web:3", 2));
    environment::deploy(&app, 5, PRODUCTION, "success").await;
    let before = lists_of_deployments();
    run_until(&worker, |t| t.0 == 5).await;
    let five = deployment(&app, DEV, 5, &format!("changes {{ {CHANGES} }}")).await;
    assert_eq!(five["changes"]["images"][0]["after"], "web:3", "{five}");
    assert_eq!(
        lists_of_deployments() - before,
        2,
        "a metadata list, then a fresh one"
    );
    api.delay_watch_events(Duration::ZERO);
}

/// RBAC on in the test cluster: developers of the project may list and watch workloads
/// (Deployments, Pods, ReplicaSets, Events), nothing else; envlens' own identity anything.
fn workloads_only(api: &KubeApi) {
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "workloads", "namespace": NS},
        "rules": [{"apiGroups": ["", "apps"], "resources": ["pods", "deployments", "replicasets", "events"],
                   "verbs": ["list", "watch"]}]}));
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "devs", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workloads"},
        "subjects": [{"kind": "Group", "name": format!("gitlab:project_role:{PROJECT}:developer")}]}));
    api.enforce_rbac();
}

fn kinds_of(resources: &Value) -> Vec<String> {
    let mut kinds: Vec<String> = resources
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {resources}"))
        .iter()
        .map(|r| r["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

both_ways!(history_shows_only_the_kinds_the_viewer_may_list_now);
async fn history_shows_only_the_kinds_the_viewer_may_list_now(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    workloads_only(&api);
    let (app, worker) = gitlab(reach, &served, FAST).await;
    app.reached.admit_own_identity(&api);
    worker.run_until_idle().await.unwrap();
    // The live group, for comparison: the same viewer sees the Deployment and a 403 for
    // ConfigMaps and Secrets.
    let live = app
        .graphql(
            DEV,
            r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
            resourceGroup { resources { kind } errors { kind code } } } } }"#,
        )
        .await;
    let group = &live["data"]["project"]["environment"]["resourceGroup"];
    assert_eq!(kinds_of(&group["resources"]), ["Deployment"], "{live}");

    // The snapshot was taken as the agent (every kind); the viewer sees what they may list.
    let first = deployment(
        &app,
        DEV,
        1,
        "snapshot { health healthMessage resources { kind name manifest } errors { apiVersion kind code message } }",
    )
    .await;
    let snapshot = &first["snapshot"];
    assert_eq!(kinds_of(&snapshot["resources"]), ["Deployment"], "{first}");
    let errors = snapshot["errors"].as_array().unwrap();
    for kind in ["ConfigMap", "Secret"] {
        let error = errors
            .iter()
            .find(|e| e["kind"] == kind)
            .unwrap_or_else(|| panic!("no error for {kind}: {snapshot}"));
        assert_eq!(error["code"], 403, "{snapshot}");
        assert!(
            error["message"].as_str().unwrap().contains("forbidden"),
            "{snapshot}"
        );
    }
    assert!(!first.to_string().contains("web-config"), "{first}");

    // The next deployment replaces the ConfigMap and changes the image: the viewer's change
    // set has the image and nothing of the ConfigMaps.
    api.insert(web("web:2", 2));
    api.remove("configmaps", Some(NS), "web-config");
    api.insert(config_map("web-config-2", "two"));
    environment::deploy(&app, 4, PRODUCTION, "success").await;
    run_until(&worker, |t| t.0 == 4).await;
    for since in ["", r#"(since: "gid://gitlab/Deployment/1")"#] {
        let latest = deployment(&app, DEV, 4, &format!("changes{since} {{ {CHANGES} }}")).await;
        let changes = &latest["changes"];
        assert_eq!(
            changes["since"]["id"], "gid://gitlab/Deployment/1",
            "{latest}"
        );
        assert_eq!(changes["added"], json!([]), "{latest}");
        assert_eq!(changes["removed"], json!([]), "{latest}");
        let modified: Vec<Value> = changes["modified"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["resource"].clone())
            .collect();
        assert_eq!(
            kinds_of(&Value::Array(modified)),
            ["Deployment"],
            "{latest}"
        );
        assert_eq!(changes["images"][0]["after"], "web:2", "{latest}");
        assert!(!latest.to_string().contains("web-config"), "{latest}");
    }

    // The dashboard's deployment page, as the same viewer: the image, not the ConfigMaps.
    let html = app
        .page_as(DEV.0, "/deployments?project=acme/apps/web&iid=4")
        .await;
    assert!(html.contains("web:2"), "{html}");
    assert!(!html.contains("web-config"), "{html}");

    // A binding for ConfigMaps too: the viewer sees them from the next decision on.
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "config", "namespace": NS},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]}),
    );
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "devs-config", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "config"},
        "subjects": [{"kind": "Group", "name": format!("gitlab:project_role:{PROJECT}:developer")}]}));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let latest = deployment(&app, DEV, 4, &format!("changes {{ {CHANGES} }}")).await;
        if latest["changes"]["added"] == json!([{"kind": "ConfigMap", "name": "web-config-2"}]) {
            assert_eq!(
                latest["changes"]["removed"],
                json!([{"kind": "ConfigMap", "name": "web-config"}])
            );
            break;
        }
        assert!(Instant::now() < deadline, "still hidden: {latest}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Agent 8 (`acme/agents:other`): CI access for acme/apps, no `user_access` for anyone.
async fn other_agent(app: &TestApp) {
    let res = app
        .internal(
            axum::http::Method::PUT,
            "/api/v4/internal/kubernetes/agents/8",
            &json!({"project_id": 10, "name": "other"}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    let res = app
        .internal(
            axum::http::Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": 8, "agent_config": {"ci_access": {"groups": [{"id": "acme/apps"}]}}}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// Deployment `id` of acme/apps/web to `env` through agent 8, succeeded.
async fn deploy_through_other(app: &TestApp, id: i64, env: (i64, &str)) {
    environment::deploy_through(app, id, env, "success", ("acme/agents:other", NS)).await;
}

both_ways!(changes_need_user_access_on_every_agent_they_read);
async fn changes_need_user_access_on_every_agent_they_read(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let (app, worker) = gitlab(reach, &served, FAST).await;
    worker.run_until_idle().await.unwrap();
    other_agent(&app).await;
    // Through the agent the viewer may not use: a deployment of another environment, then
    // one of production itself (the base of the next deployment through agent 7).
    deploy_through_other(&app, 8, (103, "staging")).await;
    deploy_through_other(&app, 9, PRODUCTION).await;
    run_until(&worker, |t| t.0 == 9).await;
    environment::deploy(&app, 10, PRODUCTION, "success").await;
    run_until(&worker, |t| t.0 == 10).await;
    for id in [8, 9] {
        let snapshot = deployment(&app, DEV, id, "snapshot { health }").await;
        assert_eq!(
            snapshot["errors"][0]["extensions"]["code"], "FORBIDDEN",
            "{snapshot}"
        );
    }
    for (id, since) in [
        (1, r#"(since: "gid://gitlab/Deployment/8")"#),
        (1, r#"(since: "gid://gitlab/Deployment/9")"#),
        (10, r#"(since: "gid://gitlab/Deployment/9")"#),
        // The base found for it is 9's snapshot.
        (10, ""),
    ] {
        let body = deployment(
            &app,
            DEV,
            id,
            &format!("changes{since} {{ added {{ name }} }}"),
        )
        .await;
        let error = &body["errors"][0];
        assert_eq!(
            error["extensions"]["code"], "FORBIDDEN",
            "{id} {since}: {body}"
        );
        assert!(
            error["message"].as_str().unwrap().contains("user_access"),
            "{body}"
        );
        assert_eq!(body["errors"].as_array().unwrap().len(), 1, "{body}");
    }
    // Against its own agent's snapshots it is read as before.
    let own = deployment(
        &app,
        DEV,
        10,
        r#"changes(since: "1") { since { id } modified { resource { kind } } }"#,
    )
    .await;
    assert_eq!(
        own["changes"]["since"]["id"], "gid://gitlab/Deployment/1",
        "{own}"
    );
}
