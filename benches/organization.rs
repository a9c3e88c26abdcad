//! The organization view at scale (SPEC 18, issue 36), against the test Kubernetes API server
//! (in a child process of its own: see below) and a private PostgreSQL:
//!
//! `cargo bench --bench organization [-- --projects 100 --environments 100 --objects 20 --iterations 200 --round 10]`
//!
//! The layout: `--projects` projects under acme/apps, each deploying its `--environments`
//! environments (half `production`, half `staging`) through its own agent into its own
//! namespace: 10,000 environments in 100 namespaces of 100 agents by default, each group of
//! `--objects` resources (a Deployment, its ReplicaSet and Pods, a Service, its EndpointSlice
//! and Endpoints, ConfigMaps): 200,000 objects. One environment in ten is DEGRADED (a Pod
//! crash-looping), one in ten PROGRESSING (a rollout under way), the rest HEALTHY. The viewer
//! is a Developer of acme/apps, whom every agent's `user_access` admits (`access_as: agent`).
//! Measured in the same run:
//!
//! - health known: from the health keeper's start (every watch cache cold) to a kept health
//!   for every environment (`environment_health` polled every 50 ms);
//! - memory per kept object: the bytes live after (counted by the allocator, the texts packed,
//!   the watches handed over) less before the keeper's start, per object of the clusters,
//!   against the objects' own JSON as the test server sends them; everything the keeper added
//!   in envlens is counted (100 watch caches, 10,000 recorders), not the cache alone. The
//!   test server runs in a child process (`benches/fixtures/shards.rs`, this binary run again
//!   with `--kube-shard 0`), so that its objects, its watches and its connections' buffers
//!   are not counted as envlens' (in one process they were ~260 B per object, BENCHMARKS.md);
//! - the page: `Group.environments(tier: PRODUCTION, health: [unhealthy], sort: HEALTH_DESC,
//!   first: 100)` through the router as the Developer, against its baseline, the SQL the page
//!   runs (the readable projects, the tally, the page) sent straight through sqlx on the same
//!   pool ([`envlens::db::health`]), interleaved;
//!   p50 and p99 of each;
//! - the counts: `Group.environmentHealthCounts(tier: PRODUCTION)` the same way;
//! - a health change to the group page's subscriber: a Pod's crash message changed at the test
//!   server, timed until (a) a direct watcher of the namespace's Pods and (b) an
//!   `environmentsUpdated(groupPath: "acme")` subscriber over a WebSocket each have it; p50 of
//!   each and of the gap; and where the time goes: until the kept health carries it (polled)
//!   and until `envlens_environments` notifies it (what other replicas hear). Changes 100 ms
//!   apart.
//!
//! The health keeper runs its rounds every `--round` seconds (10, `serve`'s), in the measured
//! process. Once every health is known the database is vacuumed and analyzed, as autovacuum
//! would do by its next round, so that the statements are planned on the statistics of the
//! table as laid out rather than of whenever autovacuum last looked, and timed after the fresh
//! database's first vacuum rather than during it. `--memory-only` stops after the memory
//! per kept object (and prints the bytes held by size of allocation, to tell the
//! per-environment structures from the cache's texts). The kept healths' table state (dead
//! rows, pages all-visible, vacuums) is printed before the page and after the counts;
//! `--pause` stops before the page, the database's address printed, until a line on stdin, to
//! explain the statements on the database as the page finds it.

/// The service's allocator (src/main.rs), counted, so that the memory per kept object is read
/// live (resident memory under mimalloc says nothing about one structure).
#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting(mimalloc::MiMalloc);

#[path = "fixtures/args.rs"]
mod args;
#[path = "fixtures/counting.rs"]
mod counting;
#[allow(dead_code)]
#[path = "fixtures/shards.rs"]
mod shards;
#[path = "fixtures/watcher.rs"]
mod watcher;
#[path = "fixtures/ws.rs"]
mod ws;

#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use args::arg;
use axum::http::Method;
use envlens::auth::mint_session;
use envlens::config::file::Settings;
use envlens::config::Limits;
use envlens::db::health;
use envlens::db::read::Viewer;
use envlens::k8s::clusters::Clusters;
use envlens::state::AppState;
use futures_util::StreamExt;
use serde_json::{json, Value};
use shards::Shards;
use support::kube_api::KubeApi;
use support::TestApp;
use tokio::net::TcpListener;
use watcher::Watcher;
use ws::{subscribe, until, Socket};

const DEV: (i64, &str) = (2, "dev");
const AGENTS_PROJECT: i64 = 10;
const FIRST_PROJECT: i64 = 1000;
const FIRST_AGENT: i64 = 1000;
const FIRST_ENVIRONMENT: i64 = 100_000;
const UNHEALTHY: &str = "[UNKNOWN, DEGRADED, MISSING, PROGRESSING]";

struct Args {
    projects: usize,
    environments: usize,
    objects: usize,
    iterations: usize,
    /// The health keeper's round, in seconds.
    round: usize,
    /// Stop after the memory per kept object.
    memory_only: bool,
    /// The test server over plain HTTP (`--plain-http`), its watches an HTTP/1.1 connection
    /// each, rather than over TLS as an API server is, its watches HTTP/2 streams.
    plain_http: bool,
    /// Wait for a line on stdin before the page, the database's address printed, so that its
    /// statements can be explained on the database as the page finds it.
    pause: bool,
}

fn main() {
    let a = Args {
        projects: arg("--projects", 100),
        environments: arg("--environments", 100),
        objects: arg("--objects", 20).max(8),
        iterations: arg("--iterations", 200),
        round: arg("--round", 10).max(1),
        memory_only: std::env::args().any(|a| a == "--memory-only"),
        plain_http: std::env::args().any(|a| a == "--plain-http"),
        pause: std::env::args().any(|a| a == "--pause"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if shards::shard_index().is_some() {
        // The test server, in a process of its own.
        let api = KubeApi::new();
        api.set_recording(false);
        for p in 0..a.projects {
            for k in 0..a.environments {
                group(&api, p, k, a.objects);
            }
        }
        return runtime.block_on(shards::serve_shard(api, !a.plain_http));
    }
    runtime.block_on(run(a));
}

fn namespace(p: usize) -> String {
    format!("team-{p}")
}

fn labels(p: usize, slug: &str, app: &str) -> Value {
    json!({"app.gitlab.com/project_id": (FIRST_PROJECT + p as i64).to_string(),
           "app.gitlab.com/environment_slug": slug, "app": app})
}

/// An object's metadata; its uid names its kind, since a Deployment, its Service and their
/// Endpoints share a name.
fn meta(kind: &str, ns: &str, name: &str, labels: Value) -> Value {
    support::environment::meta(ns, name, &uid(kind, ns, name), labels)
}

fn uid(kind: &str, ns: &str, name: &str) -> String {
    format!("uid-{kind}-{ns}-{name}")
}

fn owned(mut meta: Value, api_version: &str, kind: &str, owner: &str, ns: &str) -> Value {
    meta["ownerReferences"] =
        support::environment::owner_ref(api_version, kind, owner, &uid(kind, ns, owner));
    meta
}

/// Environment `k`'s health by design: one in ten degraded, one in ten progressing.
fn designed(k: usize) -> &'static str {
    match k % 10 {
        0 => "DEGRADED",
        5 => "PROGRESSING",
        _ => "HEALTHY",
    }
}

fn running_pod(ns: &str, name: &str, app: &str, rs: &str) -> Value {
    let meta = owned(
        meta(
            "Pod",
            ns,
            name,
            json!({"app": app, "pod-template-hash": "h1"}),
        ),
        "apps/v1",
        "ReplicaSet",
        rs,
        ns,
    );
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
           "spec": {"restartPolicy": "Always", "containers": [{"name": "app", "image": "nginx:1.27"}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                      "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}}]}})
}

fn crash(pod: &mut Value, message: &str) {
    pod["status"] = json!({"phase": "Running", "containerStatuses": [{"name": "app", "ready": false, "restartCount": 5,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": message}}}]});
}

/// Environment `k` of project `p`: `objects` resources in the project's namespace.
fn group(api: &KubeApi, p: usize, k: usize, objects: usize) {
    let ns = namespace(p);
    let slug = format!("e{k}");
    let app = format!("{slug}-web");
    let rs = format!("{app}-h1");
    // Deployment, ReplicaSet, Service, EndpointSlice, Endpoints, one ConfigMap: 6; the Pods
    // and further ConfigMaps make up the rest, two thirds Pods.
    let rest = objects - 6;
    let pods = (rest * 2).div_ceil(3);
    let configs = rest - pods + 1;
    let updated = if designed(k) == "PROGRESSING" {
        pods - 1
    } else {
        pods
    };
    let mut dmeta = meta("Deployment", &ns, &app, labels(p, &slug, &app));
    dmeta["generation"] = json!(1);
    api.insert(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": dmeta,
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}}},
        "status": {"observedGeneration": 1, "replicas": pods, "updatedReplicas": updated,
                   "readyReplicas": pods, "availableReplicas": pods}}));
    let rmeta = owned(
        meta(
            "ReplicaSet",
            &ns,
            &rs,
            json!({"app": app, "pod-template-hash": "h1"}),
        ),
        "apps/v1",
        "Deployment",
        &app,
        &ns,
    );
    api.insert(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rmeta,
        "spec": {"replicas": pods}, "status": {"replicas": pods, "readyReplicas": pods, "availableReplicas": pods}}));
    for i in 0..pods {
        let mut pod = running_pod(&ns, &format!("{rs}-{i}"), &app, &rs);
        if i == 0 && designed(k) == "DEGRADED" {
            crash(&mut pod, "back-off 40s restarting failed container");
        }
        api.insert(pod);
    }
    api.insert(json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("Service", &ns, &app, labels(p, &slug, &app)),
        "spec": {"selector": {"app": app}, "ports": [{"port": 80}]}}));
    let smeta = owned(
        meta(
            "EndpointSlice",
            &ns,
            &format!("{app}-x7k2p"),
            json!({"kubernetes.io/service-name": app}),
        ),
        "v1",
        "Service",
        &app,
        &ns,
    );
    api.insert(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": smeta,
        "addressType": "IPv4", "endpoints": []}),
    );
    api.insert(json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta("Endpoints", &ns, &app, json!({})), "subsets": []}));
    for c in 0..configs {
        api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta("ConfigMap", &ns, &format!("{app}-config-{c}"), labels(p, &slug, &app)),
            "data": {"LOG_LEVEL": "info", "FEATURE_FLAGS": "a,b,c"}}));
    }
}

fn environment_id(a: &Args, p: usize, k: usize) -> i64 {
    FIRST_ENVIRONMENT + (p * a.environments + k) as i64
}

/// GitLab's side: acme/apps and its projects, the Developer, one agent per project admitting
/// acme/apps' developers, and a successful deployment of every environment through its agent.
async fn seed(app: &TestApp, a: &Args) {
    let mut projects =
        vec![json!({"id": AGENTS_PROJECT, "full_path": "acme/agents", "visibility": "private"})];
    projects.extend((0..a.projects).map(|p| {
        json!({"id": FIRST_PROJECT + p as i64, "full_path": format!("acme/apps/p{p}"), "visibility": "private"})
    }));
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"}],
        "projects": projects,
        "users": [{"id": 1, "username": "root", "admin": true}, {"id": 2, "username": "dev"}],
        "members": [{"user_id": 2, "source_type": "group", "source_id": 2, "access_level": 30}]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let config = json!({"ci_access": {"groups": [{"id": "acme/apps"}]},
        "user_access": {"access_as": {"agent": {}}, "groups": [{"id": "acme/apps"}]}});
    for p in 0..a.projects {
        let agent = FIRST_AGENT + p as i64;
        let res = app
            .internal(
                Method::PUT,
                &format!("/api/v4/internal/kubernetes/agents/{agent}"),
                &json!({"project_id": AGENTS_PROJECT, "name": format!("a{p}")}),
            )
            .await;
        assert!(res.status.is_success(), "{}", res.text());
        support::environment::configure(app, agent, &config).await;
    }
    let all: Vec<(usize, usize)> = (0..a.projects)
        .flat_map(|p| (0..a.environments).map(move |k| (p, k)))
        .collect();
    futures_util::stream::iter(all)
        .for_each_concurrent(8, |(p, k)| deploy(app, a, p, k))
        .await;
}

async fn deploy(app: &TestApp, a: &Args, p: usize, k: usize) {
    let id = environment_id(a, p, k);
    let slug = format!("e{k}");
    let project = FIRST_PROJECT + p as i64;
    let path = format!("acme/apps/p{p}");
    let tier = if k < a.environments / 2 {
        "production"
    } else {
        "staging"
    };
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": id, "iid": 1, "status": "created", "ref": "main", "sha": "abc", "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": project, "full_path": path},
        "environment": {"id": id, "name": slug, "slug": slug, "tier": tier},
        "job": {"id": id, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": format!("acme/agents:a{p}"), "namespace": namespace(p)}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hook = json!({"object_kind": "deployment", "deployment_id": id, "status": "success",
        "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": slug,
        "project": {"id": project, "path_with_namespace": path}});
    let res = app.hook("Deployment Hook", hook.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A kubeconfig leading to the test server at `url`, and `serve`'s `kubernetes` section
/// leading every agent to it.
fn kubernetes(dir: &std::path::Path, url: &str, a: &Args) -> String {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n{}\
             users:\n- name: test\n  user:\n    token: test-token\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
            support::kube_api::cluster_yaml(url, !a.plain_http)
        ),
    )
    .unwrap();
    let mut yaml = format!(
        "kubernetes:\n  response_timeout: 30s\n  kubeconfig: {}\n  agents:\n",
        kubeconfig.display()
    );
    for p in 0..a.projects {
        yaml.push_str(&format!(
            "  - agent: \"{}\"\n    context: test\n",
            FIRST_AGENT + p as i64
        ));
    }
    yaml
}

/// The arguments this run was given, for the test server's process.
fn forwarded() -> Vec<String> {
    std::env::args().skip(1).collect()
}

async fn run(a: Args) {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let server = tokio::task::spawn_blocking(|| Shards::start(1, &forwarded()))
        .await
        .unwrap();
    let (objects, json_bytes) = json_of(&server, &a);
    println!(
        "{} environments over {} agents and namespaces, {objects} objects ({:.0} B of JSON each) in the test server (a process of its own), laid out in {:.1} s",
        a.projects * a.environments,
        a.projects,
        json_bytes as f64 / objects as f64,
        started.elapsed().as_secs_f64()
    );
    let url = server.url(0).to_owned();
    let server_addr: SocketAddr = url
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let yaml = kubernetes(dir.path(), &url, &a);
    let settings = Settings::parse(&yaml).unwrap();
    let clusters = Clusters::load(&settings.kubernetes, Default::default())
        .await
        .unwrap();
    let database = support::postgres::fresh_database().await;
    let state = AppState::new((*database).clone(), support::keys(), Limits::default())
        .with_clusters(clusters, settings.cors);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(envlens::run(
        state.clone(),
        listener,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    let app = TestApp::owning(state.clone(), database);
    let seeding = Instant::now();
    seed(&app, &a).await;
    println!(
        "seeded through the internal API in {:.1} s",
        seeding.elapsed().as_secs_f64()
    );

    // Health known: the keeper starts with every watch cache cold.
    let before = counting::live();
    let before_by_size = counting::live_by_size();
    let before_by_exact = counting::live_by_exact();
    let start = Instant::now();
    tokio::spawn(
        envlens::graphql::HealthKeeper::new(
            &state.db,
            state.clusters.clone(),
            state.health.clone(),
            &state.live,
            objects * 2,
            // `serve`'s round is 10 s (src/cli's KEEPER_ROUND).
            Duration::from_secs(a.round as u64),
        )
        .run(),
    );
    let total = (a.projects * a.environments) as i64;
    let mut half = None;
    loop {
        let known: i64 = sqlx::query_scalar("SELECT count(*) FROM environment_health")
            .fetch_one(&app.db)
            .await
            .unwrap();
        if half.is_none() && known * 2 >= total {
            half = Some(start.elapsed());
        }
        if known == total {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "only {known} of {total} healths known after 15 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let known = start.elapsed();
    let by_status: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status, count(*) FROM environment_health GROUP BY status ORDER BY status",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    println!(
        "health known: half the environments {:.2} s, every one {:.2} s after the keeper's start ({by_status:?})",
        half.unwrap().as_secs_f64(),
        known.as_secs_f64()
    );
    check_designed(&app, &a).await;
    // The statistics autovacuum would have by its next round (its naptime is a minute): the
    // 10,000 kept healths were written within the last seconds into an empty table, so
    // without this the page is planned on whatever autovacuum last saw, if it saw the table
    // at all (estimates of 1 row, or of a half-filled table), which varied between runs. And
    // vacuumed: the 140,000 health marks, 10,000 deployments and kept healths were all
    // inserted since the database was made, which is what autovacuum's first pass over it
    // vacuums; in a run where that pass fell during the page's timing, the page's statements
    // took 9.7 ms p50 against 5.6 ms in one where it was over (BENCHMARKS.md, session 21).
    sqlx::query("VACUUM ANALYZE")
        .execute(&app.db)
        .await
        .unwrap();

    // At rest: the texts packed, the watches handed over, the first rounds' garbage freed.
    use envlens::k8s::watch::{HANDOVER, PACK_AFTER};
    tokio::time::sleep(PACK_AFTER.max(HANDOVER) + Duration::from_secs(3)).await;
    let held = counting::live() - before;
    println!(
        "memory per kept object: {:.0} B live per object against {:.0} B of JSON: {:.2}x (everything the keeper added, {} objects)",
        held as f64 / objects as f64,
        json_bytes as f64 / objects as f64,
        held as f64 / json_bytes as f64,
        objects
    );
    if a.memory_only {
        let by_size = counting::live_by_size();
        let environments = (a.projects * a.environments) as f64;
        println!("  held by size of allocation, per environment:");
        for (i, (now, was)) in by_size.iter().zip(before_by_size).enumerate() {
            let held = (now - was) as f64 / environments;
            if held.abs() >= 100.0 {
                let low = if i == 0 { 0 } else { 1usize << (i - 1) };
                println!(
                    "    {low:>8} B to {:>8} B: {held:>8.0} B",
                    (1usize << i) - 1
                );
            }
        }
        let mut exact: Vec<(usize, f64)> = counting::live_by_exact()
            .into_iter()
            .zip(before_by_exact)
            .map(|((size, now), (_, was))| (size, (now - was) as f64 / environments))
            .collect();
        exact.sort_by(|a, b| (b.1 * b.0 as f64).total_cmp(&(a.1 * a.0 as f64)));
        println!("  the largest of 256 B to 64 KiB by size (16 B steps), per environment:");
        for (size, n) in exact.into_iter().take(16) {
            println!("    {size:>6} B x {n:>6.2} = {:>6.0} B", n * size as f64);
        }
        // Nothing torn down: a heap profiler's leaks at exit are what the keeper holds.
        std::process::exit(0);
    }

    table_state(&app, "before the page").await;
    if a.pause {
        pause(&app).await;
        table_state(&app, "after the pause").await;
    }
    page(&app, &a).await;
    counts(&app, &a).await;
    table_state(&app, "after the counts").await;
    change_to_subscriber(&app, &server, server_addr, addr, &a).await;
}

/// What the page's and the counts' plans depend on beyond the statistics: the kept healths'
/// dead rows, how many of their pages are all-visible (an index-only scan fetches the rows of
/// the others from the heap), how many updates were HOT, when autovacuum last came, and the
/// size of each index.
async fn table_state(app: &TestApp, when: &str) {
    let (live, dead, inserted, updated, hot, vacuums, analyzes): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd,
                    autovacuum_count + vacuum_count, autoanalyze_count + analyze_count
             FROM pg_stat_user_tables WHERE relname = 'environment_health'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    let (pages, visible): (i32, i32) = sqlx::query_as(
        "SELECT relpages, relallvisible FROM pg_class WHERE relname = 'environment_health'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    let indexes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT indexrelname::text, pg_relation_size(indexrelid) / 8192
         FROM pg_stat_user_indexes WHERE relname = 'environment_health' ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    println!(
        "environment_health {when}: {live} live, {dead} dead rows; {inserted} inserted, {updated} updated ({hot} HOT); \
         {visible} of {pages} pages all-visible (as of the last vacuum or analyze); vacuumed {vacuums}, analyzed {analyzes} times; \
         index pages {indexes:?}"
    );
}

/// Prints how to reach the bench's database and waits for a line on stdin.
async fn pause(app: &TestApp) {
    let o = app.db.connect_options();
    println!(
        "paused before the page: psql -h {} -p {} -U {} {}   (press Enter to go on)",
        o.get_socket()
            .map(|s| s.display().to_string())
            .unwrap_or_else(|| o.get_host().to_owned()),
        o.get_port(),
        o.get_username(),
        o.get_database().unwrap_or("")
    );
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).ok();
    })
    .await
    .unwrap();
}

/// How many objects the test server holds, and their JSON's bytes as it sends them.
fn json_of(server: &Shards, a: &Args) -> (usize, usize) {
    let (mut n, mut bytes) = (0, 0);
    for p in 0..a.projects {
        let ns = namespace(p);
        for resource in [
            "deployments",
            "replicasets",
            "pods",
            "services",
            "endpointslices",
            "endpoints",
            "configmaps",
        ] {
            let (listed, json) = server.sizes(p, resource, &ns);
            n += listed;
            bytes += json;
        }
    }
    (n, bytes)
}

/// Every environment's kept health is the one laid out.
async fn check_designed(app: &TestApp, a: &Args) {
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT environment_id, status FROM environment_health")
            .fetch_all(&app.db)
            .await
            .unwrap();
    let wrong: Vec<_> = rows
        .iter()
        .filter(|(id, status)| {
            let k = ((id - FIRST_ENVIRONMENT) as usize) % a.environments;
            status != designed(k)
        })
        .take(5)
        .collect();
    assert!(wrong.is_empty(), "kept healths not as laid out: {wrong:?}");
}

async fn timed(app: &TestApp, query: &str, n: usize, check: impl Fn(&Value)) -> Vec<Duration> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let answer = app.graphql(DEV, query).await;
        times.push(start.elapsed());
        assert!(answer.get("errors").is_none(), "{answer}");
        check(&answer);
    }
    times
}

async fn timed_sql<F, Fut>(n: usize, mut f: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let rows = f().await;
        times.push(start.elapsed());
        assert!(rows > 0);
    }
    times
}

fn report(name: &str, mut times: Vec<Duration>) -> Duration {
    times.sort();
    println!(
        "  {name:<44} p50 {}  p99 {}",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99))
    );
    percentile(&times, 0.5)
}

async fn page(app: &TestApp, a: &Args) {
    let query = format!(
        r#"{{ group(fullPath: "acme") {{ environments(tier: PRODUCTION, health: {UNHEALTHY}, sort: HEALTH_DESC, first: 100) {{
            nodes {{ name tier health {{ status message since }} }} pageInfo {{ hasNextPage endCursor }} }} }} }}"#
    );
    let unhealthy_production = a.projects * (a.environments / 2).div_ceil(5);
    let want = unhealthy_production.min(100);
    let check = |answer: &Value| {
        let nodes = &answer["data"]["group"]["environments"]["nodes"];
        let nodes = nodes.as_array().unwrap();
        assert_eq!(nodes.len(), want, "{answer}");
        assert_eq!(nodes[0]["health"]["status"], "DEGRADED", "{answer}");
    };
    let rounds = 4;
    let per = a.iterations / rounds;
    // Warm both.
    timed(app, &query, 10, check).await;
    let (mut graphql, mut sql) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        sql.extend(timed_sql(per, || async { page_sql(app).await }).await);
        graphql.extend(timed(app, &query, per, check).await);
    }
    println!("the page of 100 unhealthy production environments, HEALTH_DESC ({unhealthy_production} match; {} iterations):", per * rounds);
    report(
        "reference: every production env + health",
        timed_sql(per, || async { every_row(app).await }).await,
    );
    let base = report("baseline: the page's 3 statements via sqlx", sql);
    let got = report("Group.environments through the router", graphql);
    println!(
        "  ratio p50: {:.2}x",
        got.as_secs_f64() / base.as_secs_f64()
    );
}

const VIEWER: Viewer = Viewer {
    user_id: DEV.0,
    admin: false,
};

/// The scope of acme's production environments as the router builds it: the readable
/// projects read first (a statement of their own, as in the router).
async fn projects(app: &TestApp) -> Vec<i64> {
    health::projects(&app.db, VIEWER, 1).await.unwrap()
}

fn scope(projects: &[i64]) -> health::Scope<'_> {
    health::Scope {
        viewer: VIEWER,
        group_id: 1,
        projects,
        tier: Some("production"),
        search: None,
    }
}

/// The scope's healths counted by agent and status, and what the Developer sees of them, as
/// the router decides it: every agent, none impersonating, none down.
async fn seen(app: &TestApp, projects: &[i64]) -> (Vec<health::Tally>, health::Seen) {
    let tallies = health::tally(&app.db, scope(projects), None).await.unwrap();
    let mut agents: Vec<i64> = tallies.iter().map(|t| t.agent_id).collect();
    agents.sort_unstable();
    agents.dedup();
    let seen = health::Seen {
        agents,
        ..health::Seen::default()
    };
    (tallies, seen)
}

/// What the page read before PostgreSQL filtered and sorted it (issue 36's first version):
/// every production environment the viewer may read, with its kept health, to filter, sort
/// and cut in Rust; its statement alone, for reference.
async fn every_row(app: &TestApp) -> usize {
    sqlx::query(
        "SELECT e.id, e.project_id, e.name, e.slug, e.tier, e.state, e.updated_at,
                h.environment_id, h.agent_id, a.name, ap.full_path, h.namespace, h.status,
                h.message, h.since, h.kinds, h.unkept_since
         FROM environments e
         JOIN projects p ON p.id = e.project_id JOIN namespaces n ON n.id = p.namespace_id
         LEFT JOIN (environment_health h JOIN cluster_agents a ON a.id = h.agent_id
                    JOIN projects ap ON ap.id = a.project_id) ON h.environment_id = e.id
         WHERE n.traversal_ids @> ARRAY[1::bigint] AND e.tier = 'production'
           AND EXISTS (SELECT 1 FROM members m WHERE m.user_id = $1 AND m.access_level >= 20
                       AND ((m.source_type = 'project' AND m.source_id = p.id)
                         OR (m.source_type = 'group' AND m.source_id = ANY (n.traversal_ids))))
         ORDER BY e.id",
    )
    .bind(DEV.0)
    .fetch_all(&app.db)
    .await
    .unwrap()
    .len()
}

/// The statements the page sends to PostgreSQL, straight through sqlx; the rows read.
async fn page_sql(app: &TestApp) -> usize {
    let projects = projects(app).await;
    let (_, seen) = seen(app, &projects).await;
    let unhealthy = ["UNKNOWN", "DEGRADED", "MISSING", "PROGRESSING"];
    health::page(
        &app.db,
        scope(&projects),
        &seen,
        Some(&unhealthy),
        health::Order::WorstFirst,
        0,
        101,
    )
    .await
    .unwrap()
    .len()
}

/// The statements the counts send to PostgreSQL, straight through sqlx; the rows read.
async fn counts_sql(app: &TestApp) -> usize {
    seen(app, &projects(app).await).await.0.len()
}

async fn counts(app: &TestApp, a: &Args) {
    let query = r#"{ group(fullPath: "acme") { environmentHealthCounts(tier: PRODUCTION) { status count } } }"#;
    let production = (a.projects * (a.environments / 2)) as i64;
    let check = |answer: &Value| {
        let total: i64 = answer["data"]["group"]["environmentHealthCounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["count"].as_i64().unwrap())
            .sum();
        assert_eq!(total, production, "{answer}");
    };
    let rounds = 4;
    let per = a.iterations / rounds;
    timed(app, query, 10, check).await;
    let (mut graphql, mut sql) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        sql.extend(timed_sql(per, || async { counts_sql(app).await }).await);
        graphql.extend(timed(app, query, per, check).await);
    }
    println!(
        "environmentHealthCounts(tier: PRODUCTION) ({production} environments; {} iterations):",
        per * rounds
    );
    let base = report("baseline: the counts' 2 statements via sqlx", sql);
    let got = report("environmentHealthCounts through the router", graphql);
    println!(
        "  ratio p50: {:.2}x",
        got.as_secs_f64() / base.as_secs_f64()
    );
}

async fn subscriber(addr: SocketAddr) -> Socket {
    let (token, _) = mint_session(
        support::SESSION_KEY,
        DEV.0,
        DEV.1,
        Duration::from_secs(3600),
    )
    .unwrap();
    let query = "subscription { environmentsUpdated(groupPath: \"acme\") { name health { status message since } } }";
    subscribe(addr, &format!("Bearer {token}"), query, Value::Null, None).await
}

/// When the kept health of `environment` first carries `marker`, polled every millisecond.
async fn recorded(db: &sqlx::PgPool, environment: i64, marker: &str) -> Instant {
    loop {
        let message: Option<String> =
            sqlx::query_scalar("SELECT message FROM environment_health WHERE environment_id = $1")
                .bind(environment)
                .fetch_one(db)
                .await
                .unwrap();
        if message.is_some_and(|m| m.contains(marker)) {
            return Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// When `envlens_environments` next notifies `environment` (what other replicas hear).
async fn notified(listener: &mut sqlx::postgres::PgListener, environment: i64) -> Instant {
    let id = environment.to_string();
    loop {
        let n = listener.recv().await.unwrap();
        if n.payload() == id {
            return Instant::now();
        }
    }
}

/// Environment e1 of project 3 (healthy, production): its first Pod's crash message changed.
/// Timed until the direct watcher has it, until its kept health carries it (the recorder's
/// write, polled), until the relay notifies it, and until the subscriber has it.
async fn change_to_subscriber(
    app: &TestApp,
    api: &Shards,
    server: SocketAddr,
    envlens: SocketAddr,
    a: &Args,
) {
    let p = 3.min(a.projects - 1);
    let environment = environment_id(a, p, 1);
    let ns = namespace(p);
    let pod_name = "e1-web-h1-0";
    let change = |marker: &str| {
        let mut pod = api.get(p, "pods", &ns, pod_name).unwrap();
        crash(&mut pod, marker);
        api.insert(p, &pod);
    };
    let mut ws = subscriber(envlens).await;
    // Until the subscription follows: a change that reaches it.
    for attempt in 0.. {
        let marker = format!("ready-{attempt}-");
        change(&marker);
        if tokio::time::timeout(Duration::from_secs(2), until(&mut ws, &marker))
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            attempt < 30,
            "the subscription never carried a health change"
        );
    }
    let path = format!("/api/v1/namespaces/{ns}/pods?watch=true&resourceVersion=0");
    let mut watcher = match a.plain_http {
        true => Watcher::open(server, &path).await,
        false => Watcher::open_tls(server, &path).await,
    };
    // The initial events of every Pod in the namespace.
    watcher.until("\"ADDED\"").await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&app.db)
        .await
        .unwrap();
    listener.listen(envlens::db::live::CHANNEL).await.unwrap();
    let (mut direct, mut kept, mut relayed, mut subscribed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let n = a.iterations.min(100);
    for i in 0..n + 5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // What the previous change's notices left.
        while listener.next_buffered().is_some() {}
        let marker = format!("step-{i}-");
        let start = Instant::now();
        change(&marker);
        let (watched, written, notice, sent) = tokio::join!(
            watcher.until(&marker),
            recorded(&app.db, environment, &marker),
            notified(&mut listener, environment),
            until(&mut ws, &marker)
        );
        if i >= 5 {
            direct.push(watched - start);
            kept.push(written - start);
            relayed.push(notice - start);
            subscribed.push(sent - start);
        }
    }
    println!("a health change to the group page's subscriber ({n} changes, 100 ms apart):");
    let d = report("direct watcher of the namespace's Pods", direct);
    report("written to environment_health (polled 1 ms)", kept);
    report("NOTIFY envlens_environments heard", relayed);
    let s = report("environmentsUpdated(groupPath: \"acme\")", subscribed);
    println!(
        "  subscriber p50 - watcher p50: {}",
        ms(s.saturating_sub(d))
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}
