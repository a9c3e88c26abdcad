//! The deployment history (SPEC 10) over the benchmark's 1,000-resource group
//! (`benches/fixtures/group.rs`), against the test Kubernetes API server.
//!
//! `cargo bench --bench history [-- --iterations 20 --deployments 20]`
//!
//! Measured in the same run, medians over the iterations:
//!
//! - snapshot: one job's turn (claim, the group from the warm watch cache as the agent,
//!   assembly, stripping and hashing every manifest, storing what is new) for a deployment that
//!   changed nothing, against (baseline) the GraphQL `resourceGroup` query of the same group
//!   from the service's warm cache (every field but `manifest`, as `benches/resource_group.rs`
//!   asks), and the same query with every `manifest`;
//! - storage: `pg_total_relation_size` of the history's tables (jobs, snapshots, chunks,
//!   manifests, their indexes and TOAST), after `VACUUM`, before and after `--deployments`
//!   deployments that each change one container image, then as many that change nothing;
//!   bytes per deployment;
//! - `changes` between two snapshots of 1,000 resources (one image changed) through GraphQL,
//!   against reading one snapshot (every resource's identity and health; and with manifests).
//!
//! The database is a private PostgreSQL started from the machine's binaries, as the tests do.

/// The service's allocator (src/main.rs), so that the figures are the service's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "fixtures/stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;
use stats::{median, ms};

#[allow(dead_code)]
#[path = "fixtures/group.rs"]
mod fixture;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request};
use envlens::auth::mint_session;
use envlens::config::file::Settings;
use envlens::history::worker::{Turn, Worker};
use fixture::RESOURCES;
use serde_json::{json, Value};
use support::environment::{self, NS, PROJECT, SLUG};
use support::kube_api::KubeApi;
use support::TestApp;

struct Args {
    iterations: usize,
    deployments: usize,
}

fn args() -> Args {
    let mut a = Args {
        iterations: 20,
        deployments: 20,
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        let value: usize = it
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} takes a number"));
        match flag.as_str() {
            "--iterations" => a.iterations = value,
            "--deployments" => a.deployments = value,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

const GROUP: &str = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
    resourceGroup { namespace labelSelector health healthMessage warnings
      errors { apiVersion kind code message }
      resources { uid apiVersion kind namespace name labels createdAt health { status message }
                  events { type reason message count lastSeen } }
      edges { from to type } } } } }"#;

const GROUP_MANIFESTS: &str = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
    resourceGroup { health resources { uid apiVersion kind namespace name health { status message } manifest } } } } }"#;

fn snapshot_query(iid: i64, manifests: bool) -> String {
    let manifest = if manifests { "manifest" } else { "" };
    format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ deployment(iid: "{iid}") {{
            snapshot {{ takenAt health timeToHealthy
              resources {{ uid apiVersion kind namespace name labels health {{ status message }} {manifest} }} }} }} }} }}"#
    )
}

fn changes_query(iid: i64) -> String {
    format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ deployment(iid: "{iid}") {{
            changes {{ since {{ id }} added {{ uid kind name }} removed {{ uid kind name }}
              modified {{ resource {{ uid kind name }} patch }}
              images {{ resource {{ kind name }} container before after }} }} }} }} }}"#
    )
}

struct Bench {
    app: TestApp,
    api: KubeApi,
    worker: Worker,
    clusters: Arc<envlens::k8s::clusters::Clusters>,
    token: String,
    next_id: i64,
}

impl Bench {
    async fn graphql(&self, query: &str) -> Value {
        let request = Request::post("/api/graphql")
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json!({ "query": query }).to_string()))
            .expect("request");
        let response = self.app.send(request).await;
        assert_eq!(response.status, 200, "{}", response.text());
        let body = response.json();
        assert!(body.get("errors").is_none(), "{body}");
        body
    }

    /// Records a successful deployment of production (not timed); returns its id (= iid).
    async fn deploy(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        environment::deploy(&self.app, id, (100, SLUG), "success").await;
        id
    }

    /// One job's turn, which must take the snapshot of `id`.
    async fn snapshot(&self, id: i64) -> Duration {
        let started = Instant::now();
        let turn = self.worker.run_once().await.expect("turn");
        let elapsed = started.elapsed();
        assert_eq!(turn, Some((id, Turn::Taken { settled: true })));
        elapsed
    }

    /// Changes the image of one Deployment of the group (a new tag each time).
    fn change_one_image(&self, tag: i64) {
        let mut web = self
            .api
            .get("deployments.apps", Some(NS), "production-web7")
            .expect("production-web7");
        web["spec"]["template"]["spec"]["containers"][0]["image"] = json!(format!(
            "registry.example.com/shop/production-web7:2.0.{tag}"
        ));
        web["metadata"]["generation"] = json!(tag + 2);
        web["status"]["observedGeneration"] = json!(tag + 2);
        self.api.insert(web);
    }

    /// Gives the worker's watch cache the change (one watch event away).
    async fn settle_cache(&self) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    async fn history_bytes(&self) -> i64 {
        sqlx::query(
            "VACUUM snapshot_jobs, deployment_snapshots, history_chunks, history_manifests",
        )
        .execute(&self.app.db)
        .await
        .expect("vacuum");
        sqlx::query_scalar(
            "SELECT sum(pg_total_relation_size(t))::bigint FROM unnest(ARRAY['snapshot_jobs',
                 'deployment_snapshots', 'history_chunks', 'history_manifests']::regclass[]) t",
        )
        .fetch_one(&self.app.db)
        .await
        .expect("sizes")
    }
}

async fn setup() -> (Bench, tempfile::TempDir, support::kube_api::Served) {
    let api = KubeApi::new();
    api.set_recording(false);
    let selected = fixture::cluster(&api, SLUG);
    let dir = tempfile::tempdir().expect("tempdir");
    let served = api.serve(dir.path()).await;
    let history = "history:\n  keep_per_environment: 1000\n";
    let app = environment::gitlab_with(&served, history).await;
    // envlens has no default connection (SPEC 6): agent 7 is led to the test server.
    let settings = Settings::parse(&format!(
        "kubernetes:\n{}{history}",
        served.connections(&["7"])
    ))
    .expect("settings");
    let clusters = envlens::k8s::clusters::Clusters::load(&settings.kubernetes, Default::default())
        .await
        .expect("clusters");
    let clusters = Arc::new(clusters);
    let worker = Worker::new(
        app.db.clone(),
        clusters.clone(),
        Arc::default(),
        settings.history,
    );
    let (token, _) = mint_session(support::SESSION_KEY, 2, "dev", Duration::from_secs(3600))
        .expect("session token");
    // The support's deployments 1 (production) and 2 (review): the first snapshot fills the
    // worker's cache and stores every manifest.
    let turns = worker.run_until_idle().await.expect("first snapshots");
    assert_eq!(turns.len(), 2, "{turns:?}");
    println!(
        "group: {RESOURCES} resources ({selected} label-selected) over 40 kinds, project {PROJECT}, \
         namespace {NS:?}; another environment of {RESOURCES} beside it"
    );
    let bench = Bench {
        app,
        api,
        worker,
        clusters,
        token,
        next_id: 10,
    };
    (bench, dir, served)
}

fn main() {
    let a = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(a));
}

async fn run(a: Args) {
    let (mut b, _dir, _served) = setup().await;
    // The service's own cache, warm.
    let group = b.graphql(GROUP).await;
    let listed = group["data"]["project"]["environment"]["resourceGroup"]["resources"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(listed, RESOURCES);
    b.graphql(GROUP_MANIFESTS).await;

    // 1. A snapshot from the warm cache against the resourceGroup query, alternating.
    let (mut snap, mut query, mut query_manifests) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..a.iterations {
        let id = b.deploy().await;
        snap.push(b.snapshot(id).await);
        let started = Instant::now();
        drop(b.graphql(GROUP).await);
        query.push(started.elapsed());
        let started = Instant::now();
        drop(b.graphql(GROUP_MANIFESTS).await);
        query_manifests.push(started.elapsed());
    }
    let (snap, query, query_manifests) = (median(snap), median(query), median(query_manifests));
    println!(
        "snapshot of the group from the warm cache (a job's turn): median {} over {} iterations",
        ms(snap),
        a.iterations
    );
    println!(
        "resourceGroup query, every field but manifest:           median {} ({:.2}x the snapshot)",
        ms(query),
        query.as_secs_f64() / snap.as_secs_f64()
    );
    println!(
        "resourceGroup query with every manifest:                 median {} ({:.2}x the snapshot)",
        ms(query_manifests),
        query_manifests.as_secs_f64() / snap.as_secs_f64()
    );

    // 1b. What the snapshot's consistent read adds: the group as the worker reads it at the
    // hook (metadata lists compared with the cache) against the cache as it is, alternating.
    let target = envlens::db::history::target(&b.app.db, 1)
        .await
        .expect("target")
        .expect("deployment 1 has an agent");
    let cluster = b
        .clusters
        .for_agent(
            target.agent_id,
            &target.agent_project_path,
            &target.agent_name,
        )
        .await
        .expect("the agent's cluster");
    let selector = envlens::resources::group::label_selector(target.project_id, SLUG);
    let options = envlens::k8s::fetch::FetchOptions {
        agent: Some(target.agent_id),
        ..Default::default()
    };
    let headers = axum::http::HeaderMap::new();
    let custom = std::sync::Arc::new(envlens::resources::health::Customizations::default());
    let (mut cached, mut consistent) = (Vec::new(), Vec::new());
    for _ in 0..a.iterations {
        let started = Instant::now();
        let group = cluster
            .watch
            .resource_group(
                &cluster.discovery,
                &headers,
                NS,
                &selector,
                &options,
                &custom,
            )
            .await
            .expect("cached read");
        cached.push(started.elapsed());
        assert!(group.errors.is_empty());
        drop(group);
        let started = Instant::now();
        let group = cluster
            .watch
            .resource_group_consistent(
                &cluster.discovery,
                &headers,
                NS,
                &selector,
                &options,
                &custom,
                Duration::from_secs(2),
            )
            .await
            .expect("consistent read");
        consistent.push(started.elapsed());
        assert!(group.errors.is_empty());
    }
    let (cached, consistent) = (median(cached), median(consistent));
    println!(
        "the group from the cache as it is:                       median {}",
        ms(cached)
    );
    println!(
        "the same as a consistent read (the snapshot's):          median {} ({:.2}x)",
        ms(consistent),
        consistent.as_secs_f64() / cached.as_secs_f64()
    );

    // 2. Storage: deployments that change one image, then deployments that change nothing.
    let before = b.history_bytes().await;
    for _ in 0..a.deployments {
        let id = b.next_id;
        b.change_one_image(id);
        b.settle_cache().await;
        let id = b.deploy().await;
        b.snapshot(id).await;
    }
    let changed = b.history_bytes().await;
    for _ in 0..a.deployments {
        let id = b.deploy().await;
        b.snapshot(id).await;
    }
    let unchanged = b.history_bytes().await;
    let per = |bytes: i64| bytes as f64 / a.deployments as f64;
    let one_image = per(changed - before);
    let nothing = per(unchanged - changed);
    println!(
        "storage per deployment changing one image: {one_image:.0} bytes (goal < 20 KB: {}), \
         {} deployments, {before} -> {changed} bytes",
        if one_image < 20_000.0 {
            "met"
        } else {
            "NOT met"
        },
        a.deployments
    );
    println!(
        "storage per deployment changing nothing:   {nothing:.0} bytes (goal < 2 KB: {}), \
         {} deployments, {changed} -> {unchanged} bytes",
        if nothing < 2_000.0 { "met" } else { "NOT met" },
        a.deployments
    );

    // 3. changes between two 1,000-resource snapshots against reading one.
    b.change_one_image(b.next_id);
    b.settle_cache().await;
    let id = b.deploy().await;
    b.snapshot(id).await;
    let body = b.graphql(&changes_query(id)).await;
    let changes = &body["data"]["project"]["deployment"]["changes"];
    assert_eq!(
        changes["modified"].as_array().map(Vec::len),
        Some(1),
        "{changes}"
    );
    assert_eq!(
        changes["images"].as_array().map(Vec::len),
        Some(1),
        "{changes}"
    );
    let read = b.graphql(&snapshot_query(id, false)).await;
    assert_eq!(
        read["data"]["project"]["deployment"]["snapshot"]["resources"]
            .as_array()
            .map(Vec::len),
        Some(RESOURCES)
    );
    let (mut diff, mut one, mut one_manifests) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..a.iterations {
        let started = Instant::now();
        drop(b.graphql(&changes_query(id)).await);
        diff.push(started.elapsed());
        let started = Instant::now();
        drop(b.graphql(&snapshot_query(id, false)).await);
        one.push(started.elapsed());
        let started = Instant::now();
        drop(b.graphql(&snapshot_query(id, true)).await);
        one_manifests.push(started.elapsed());
    }
    let (diff, one, one_manifests) = (median(diff), median(one), median(one_manifests));
    println!(
        "changes between two snapshots of {RESOURCES} (one image): p50 {} over {} iterations",
        ms(diff),
        a.iterations
    );
    println!(
        "reading one snapshot, without manifests:             p50 {} (changes / read = {:.2})",
        ms(one),
        diff.as_secs_f64() / one.as_secs_f64()
    );
    println!(
        "reading one snapshot, with every manifest:           p50 {} (changes / read = {:.2})",
        ms(one_manifests),
        diff.as_secs_f64() / one_manifests.as_secs_f64()
    );
}
