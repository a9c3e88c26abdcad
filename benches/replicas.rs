//! Replicas that share the clusters (SPEC 16, issue 34): `serve` processes (the release
//! binary) on one private PostgreSQL and one in-process Kubernetes API server behind one
//! kubeconfig context per agent, so that every agent is a connection of its own.
//!
//! `cargo bench --bench replicas [-- --agents 100 --replicas 4 --iterations 200 --kills 20]`
//!
//! Each agent deploys one environment of acme/apps/web into its own namespace (a Deployment,
//! two ReplicaSets, three Pods, a Service with its EndpointSlice and Endpoints, a ConfigMap);
//! the health keeper of `serve` keeps every environment, so every connection is watched
//! without a view. Measured, each against its baseline in the same run:
//!
//! - **cost to the clusters**: lists and watches per kind per agent once every health is
//!   known and the watches settle, `--replicas` replicas sharing (`--share-clusters`) against
//!   the same replicas not sharing (each watching everything);
//! - **memory per replica** (resident), sharing against not sharing;
//! - **scale**: the share of connections whose lease moves when one replica is added,
//!   against 1/(N+1);
//! - **a view through a non-owner** against the same view on the owner, interleaved, p50;
//! - **a change to a subscriber on a non-owner** against a subscriber on the owner, both
//!   `resourceGroupUpdated` of the same environment, p50 of each;
//! - **failover**: the owner killed with `kill -9`, to the first view answered by the new
//!   owner (its lease taken), p50 and max over `--kills`.
//!
//! Every watch of every replica is a connection into the test API server, and a process' file
//! limit here is 20,000 (hard), so the server is split over `--servers` processes (default one
//! per 250 agents; `benches/fixtures/shards.rs`), agent `i` served by shard `i % servers`. A
//! replica not sharing holds every agent's watches (19 kinds per namespace) and the idle
//! connections of their first lists: the baseline runs over the first `--baseline-agents`
//! (default 250), what one replica can hold under that limit.
//!
//! `--agents 1000 --replicas 4` is the issue's scale.

#[path = "fixtures/args.rs"]
mod args;
#[path = "fixtures/shards.rs"]
mod shards;
#[path = "fixtures/stats.rs"]
mod stats;
#[allow(dead_code)] // the benchmark uses a part of the tests' support
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "fixtures/ws.rs"]
mod ws;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use args::arg;
use axum::http::Method;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use shards::{Process, Shards};
use stats::{median, ms, quantile};
use support::environment::{self, gitlab_labels, meta, PROJECT};
use support::kube_api::KubeApi;
use support::TestApp;
use ws::{next_text, subscribe, until, Socket};

const AGENTS_PROJECT: i64 = 10;
const FIRST_AGENT: i64 = 1000;
const FIRST_ENVIRONMENT: i64 = 100_000;
const WINDOW: &str = "3s";

struct Args {
    agents: usize,
    /// Agents of the not-sharing baseline: each of its replicas holds every one of their
    /// watches, which a replica's file limit bounds.
    baseline_agents: usize,
    replicas: usize,
    /// Processes the test Kubernetes API server is split over (agent `i` in shard `i % n`).
    servers: usize,
    iterations: usize,
    kills: usize,
}

fn main() {
    let agents = arg("--agents", 100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Some(k) = shards::shard_index() {
        let n = arg("--kube-shards", 1);
        let api = KubeApi::new();
        api.set_recording(false);
        for i in (k..agents).step_by(n) {
            lay_out(&api, i);
        }
        return runtime.block_on(shards::serve_shard(api, false));
    }
    let a = Args {
        agents,
        baseline_agents: arg("--baseline-agents", agents.min(250)).min(agents),
        replicas: arg("--replicas", 4).max(2),
        servers: arg("--servers", agents.div_ceil(250)).max(1),
        iterations: arg("--iterations", 200),
        kills: arg("--kills", 20),
    };
    runtime.block_on(run(a));
}

fn namespace(i: usize) -> String {
    format!("team-{i}")
}

fn slug(i: usize) -> String {
    format!("e{i}")
}

/// The group of agent `i`'s environment, in its namespace.
fn lay_out(api: &KubeApi, i: usize) {
    let (ns, slug) = (namespace(i), slug(i));
    api.insert(environment::deployment(&ns, "web", "uid-web", &slug));
    environment::replica_set(api, &ns, ("web", "uid-web"), "old111", &["a"]);
    environment::replica_set(api, &ns, ("web", "uid-web"), "new222", &["a", "b"]);
    api.insert(environment::service(&ns, "web", "uid-svc-web", &slug));
    environment::service_parts(api, &ns, "web", "uid-svc-web");
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta(&ns, "web-config", "uid-cm-web", gitlab_labels(&slug, "web"))}));
}

/// One kubeconfig context per agent, agent `i`'s leading to the shard that serves its
/// namespace.
fn kubeconfig(shards: &Shards, agents: usize) -> String {
    let mut yaml = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for k in 0..shards.len() {
        yaml.push_str(&format!(
            "- name: s{k}\n  cluster:\n    server: {}\n",
            shards.url(k)
        ));
    }
    yaml.push_str(
        "users:\n- name: test\n  user:\n    token: test-token\ncurrent-context: c0\ncontexts:\n",
    );
    for i in 0..agents {
        yaml.push_str(&format!(
            "- name: c{i}\n  context:\n    cluster: s{}\n    user: test\n",
            i % shards.len()
        ));
    }
    yaml
}

/// `serve`'s configuration: the first `agents` agents, each its own context.
fn config(dir: &Path, agents: usize) -> String {
    let mut yaml = format!(
        "kubernetes:\n  cache_idle: 60m\n  response_timeout: 30s\n  kubeconfig: {}\n  agents:\n",
        dir.join("kubeconfig").display()
    );
    for i in 0..agents {
        yaml.push_str(&format!(
            "  - agent: \"{}\"\n    context: c{i}\n",
            FIRST_AGENT + i as i64
        ));
    }
    yaml
}

async fn seed(app: &TestApp, agents: usize) {
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"}],
        "projects": [{"id": AGENTS_PROJECT, "full_path": "acme/agents", "visibility": "private"},
                     {"id": PROJECT, "full_path": "acme/apps/web", "visibility": "private"}],
        "users": [{"id": 2, "username": "dev"}],
        "members": [{"user_id": 2, "source_type": "project", "source_id": PROJECT, "access_level": 30}]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let config = json!({"ci_access": {"projects": [{"id": "acme/apps/web"}]},
        "user_access": {"access_as": {"agent": {}}, "projects": [{"id": "acme/apps/web"}]}});
    for i in 0..agents {
        let agent = FIRST_AGENT + i as i64;
        let res = app
            .internal(
                Method::PUT,
                &format!("/api/v4/internal/kubernetes/agents/{agent}"),
                &json!({"project_id": AGENTS_PROJECT, "name": format!("a{i}")}),
            )
            .await;
        assert!(res.status.is_success(), "{}", res.text());
        environment::configure(app, agent, &config).await;
        let id = FIRST_ENVIRONMENT + i as i64;
        let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
            "deployment": {"id": id, "iid": id, "status": "created", "ref": "main", "sha": "abc",
                           "tag": false, "created_at": "2026-11-21T10:00:00Z"},
            "project": {"id": PROJECT, "full_path": "acme/apps/web"},
            "environment": {"id": id, "name": slug(i), "slug": slug(i), "tier": "production"},
            "job": {"id": id, "name": "deploy", "protected_ref": true},
            "kubernetes": {"agent": format!("acme/agents:a{i}"), "namespace": namespace(i)}
        })).await;
        assert_eq!(res.status, 201, "{}", res.text());
        let hook = json!({"object_kind": "deployment", "deployment_id": id, "status": "success",
            "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": slug(i),
            "project": {"id": PROJECT, "path_with_namespace": "acme/apps/web"}});
        let res = app.hook("Deployment Hook", hook.to_string(), None).await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
}

/// One `envlens serve` process; killed when dropped.
struct Replica {
    process: Process,
    addr: SocketAddr,
    id: String,
    _data: tempfile::TempDir,
}

impl Replica {
    fn start(database_url: &str, dir: &Path, config: &str, share: bool) -> Replica {
        let data = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_envlens"));
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--database-url", database_url])
            .arg("--data-dir")
            .arg(data.path())
            .arg("--config")
            .arg(dir.join(config))
            .arg("--session-secret-file")
            .arg(dir.join("session"))
            .arg("--internal-secret-file")
            .arg(dir.join("internal"))
            .arg("--webhook-token-file")
            .arg(dir.join("webhook"))
            .args(["--replica-window", WINDOW])
            .env("ENVLENS_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // `REPLICAS_BENCH_LOGS=DIR`: each replica's log (at ENVLENS_LOG, else warn) kept there.
        if let Ok(logs) = std::env::var("REPLICAS_BENCH_LOGS") {
            let file = tempfile::Builder::new()
                .prefix("replica-")
                .suffix(".log")
                .tempfile_in(logs)
                .unwrap()
                .keep()
                .unwrap()
                .0;
            command
                .env(
                    "ENVLENS_LOG",
                    std::env::var("ENVLENS_LOG").unwrap_or("warn".into()),
                )
                .stderr(file);
        }
        if share {
            command.arg("--share-clusters");
        }
        let mut process = Process(command.spawn().expect("envlens serve"));
        let mut stdout = BufReader::new(process.0.stdout.take().unwrap());
        let (mut line, mut addr) = (String::new(), None);
        loop {
            line.clear();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "serve exited");
            if let Some(at) = line.find("listening on http://") {
                let host = line[at + 20..].split(['/', ';']).next().unwrap().trim();
                addr = Some(host.parse::<SocketAddr>().unwrap());
            }
            if let Some(rest) = line.trim().strip_prefix("replica ") {
                let id = rest.split_once(" advertised at ").unwrap().0.to_owned();
                std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
                return Replica {
                    process,
                    addr: addr.expect("the listening line first"),
                    id,
                    _data: data,
                };
            }
        }
    }

    /// `n` replicas started at once, so that none holds every connection before the others
    /// join (at 1,000 agents, more watches than its file limit allows).
    fn start_all(
        n: usize,
        database_url: &str,
        dir: &Path,
        config: &str,
        share: bool,
    ) -> Vec<Replica> {
        std::thread::scope(|scope| {
            let started: Vec<_> = (0..n)
                .map(|_| scope.spawn(|| Replica::start(database_url, dir, config, share)))
                .collect();
            started.into_iter().map(|s| s.join().unwrap()).collect()
        })
    }

    /// Resident memory, from the kernel.
    fn rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.process.0.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        kib * 1024
    }

    /// SIGKILL (the drop's own way of stopping), said out loud.
    fn kill_9(self) {
        drop(self);
    }
}

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

fn http() -> Http {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

fn session() -> String {
    envlens::auth::mint_session(support::SESSION_KEY, 2, "dev", Duration::from_secs(7200))
        .unwrap()
        .0
}

fn view_query(i: usize) -> String {
    format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{}") {{
        resourceGroup {{ health warnings resources {{ uid kind name health {{ status message }} }}
                         edges {{ from to type }} }} }} }} }}"#,
        slug(i)
    )
}

/// Agent `i`'s group through `replica`: the answer's status and body.
async fn view(http: &Http, replica: SocketAddr, i: usize) -> (u16, Bytes) {
    let request = hyper::Request::post(format!("http://{replica}/api/graphql"))
        .header("authorization", format!("Bearer {}", session()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            json!({"query": view_query(i)}).to_string(),
        )))
        .unwrap();
    let response = http.request(request).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// Whether a view's body shows the group (no errors, its resources).
fn shown(body: &[u8]) -> bool {
    let answer: Value = serde_json::from_slice(body).unwrap_or_default();
    answer.get("errors").is_none()
        && answer["data"]["project"]["environment"]["resourceGroup"]["resources"]
            .as_array()
            .is_some_and(|r| r.len() > 3)
}

/// Waits until every environment's health is kept and the server's open watches stay the
/// same for 15 s, longer than the health keeper's round (10 s) after which a connection's new
/// owner starts its watches: the replicas' steady state.
async fn settled(app: &TestApp, api: &Shards, agents: usize) {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let known: i64 = sqlx::query_scalar("SELECT count(*) FROM environment_health")
            .fetch_one(&app.db)
            .await
            .unwrap();
        if known as usize >= agents {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{known} of {agents} healths known"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (mut last, mut since) = (api.open_streams(), Instant::now());
    while since.elapsed() < Duration::from_secs(15) {
        assert!(Instant::now() < deadline, "the watches never settle");
        tokio::time::sleep(Duration::from_millis(200)).await;
        if api.open_streams() != last {
            (last, since) = (api.open_streams(), Instant::now());
        }
    }
}

/// Lists and watches per kind per agent since the counts were reset.
fn per_agent(api: &Shards, agents: usize) -> (f64, f64, usize) {
    let counts = api.request_counts();
    let (mut lists, mut watches) = (0u64, 0u64);
    let mut kinds = std::collections::BTreeSet::new();
    for ((verb, resource), n) in &counts {
        match verb.as_str() {
            "list" => {
                lists += n;
                kinds.insert(resource.clone());
            }
            "watch" => watches += n,
            _ => {}
        }
    }
    let per = (kinds.len() * agents).max(1) as f64;
    (lists as f64 / per, watches as f64 / per, kinds.len())
}

/// Watches open now per kind per agent: what the clusters carry at rest.
fn open_per_agent(api: &Shards, agents: usize, kinds: usize) -> f64 {
    api.open_streams() as f64 / (kinds * agents).max(1) as f64
}

/// Who holds each connection's lease now.
async fn holders(app: &TestApp) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT connection, replica FROM connection_leases WHERE expires_at > now()",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// Waits until each of the `agents` connections is held by its rendezvous owner among `ids`
/// (the live replicas): ownership has settled.
async fn all_held(
    app: &TestApp,
    dir: &Path,
    agents: usize,
    ids: &[String],
) -> BTreeMap<String, String> {
    let owners: BTreeMap<String, String> = (0..agents)
        .map(|i| {
            let key = connection(dir, i);
            let owner = envlens::replicas::rendezvous::owner(&key, ids)
                .unwrap()
                .to_owned();
            (key, owner)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let held = holders(app).await;
        if held == owners {
            return held;
        }
        assert!(
            Instant::now() < deadline,
            "ownership never settles: held {held:?}, owners {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn connection(dir: &Path, i: usize) -> String {
    format!("context \"c{i}\" of {}", dir.join("kubeconfig").display())
}

async fn run(a: Args) {
    let dir = tempfile::tempdir().unwrap();
    let api = Shards::start(a.servers, &["--agents".into(), a.agents.to_string()]);
    std::fs::write(dir.path().join("kubeconfig"), kubeconfig(&api, a.agents)).unwrap();
    std::fs::write(
        dir.path().join("envlens.yaml"),
        config(dir.path(), a.agents),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("baseline.yaml"),
        config(dir.path(), a.baseline_agents),
    )
    .unwrap();
    use base64::Engine;
    let b64 = |k: &[u8]| base64::engine::general_purpose::STANDARD.encode(k);
    std::fs::write(dir.path().join("session"), b64(support::SESSION_KEY)).unwrap();
    std::fs::write(dir.path().join("internal"), b64(support::INTERNAL_KEY)).unwrap();
    std::fs::write(dir.path().join("webhook"), support::WEBHOOK_TOKEN).unwrap();
    let database = support::postgres::fresh_database().await;
    let url = database.url();
    let state = envlens::state::AppState::new(
        (*database).clone(),
        support::keys(),
        envlens::config::Limits::default(),
    );
    let app = TestApp::owning(state, database);
    seed(&app, a.agents).await;
    println!(
        "{} agents, each a kubeconfig context of its own and a namespace of 11 objects, over {} test API server processes; {} replicas (not sharing: the first {} agents)",
        a.agents, a.servers, a.replicas, a.baseline_agents
    );

    // Not sharing: every replica watches every connection.
    api.reset_request_counts();
    let started = Instant::now();
    let solo = Replica::start_all(a.replicas, &url, dir.path(), "baseline.yaml", false);
    settled(&app, &api, a.baseline_agents).await;
    let (solo_lists, solo_watches, kinds) = per_agent(&api, a.baseline_agents);
    let solo_open = open_per_agent(&api, a.baseline_agents, kinds);
    let solo_rss: Vec<u64> = solo.iter().map(Replica::rss).collect();
    println!(
        "not sharing: settled in {:.1} s; per kind ({kinds}) per agent: {solo_open:.2} watches open at rest; since the start {solo_lists:.2} lists, {solo_watches:.2} watches; resident {} MiB per replica (median)",
        started.elapsed().as_secs_f64(),
        mib(median_u64(&solo_rss))
    );
    drop(solo);
    sqlx::query("TRUNCATE environment_health, connection_leases, replicas")
        .execute(&app.db)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.open_streams() > 0 {
        assert!(
            Instant::now() < deadline,
            "the stopped replicas' watches stay open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Sharing.
    api.reset_request_counts();
    let started = Instant::now();
    let mut replicas = Replica::start_all(a.replicas, &url, dir.path(), "envlens.yaml", true);
    let ids: Vec<String> = replicas.iter().map(|r| r.id.clone()).collect();
    let before = all_held(&app, dir.path(), a.agents, &ids).await;
    settled(&app, &api, a.agents).await;
    let (lists, watches, _) = per_agent(&api, a.agents);
    let open = open_per_agent(&api, a.agents, kinds);
    let rss: Vec<u64> = replicas.iter().map(Replica::rss).collect();
    let mut spread: BTreeMap<&str, usize> = BTreeMap::new();
    for r in before.values() {
        *spread.entry(r).or_default() += 1;
    }
    println!(
        "sharing: settled in {:.1} s; per kind per agent: {open:.2} watches open at rest (not sharing: {solo_open:.2}); \
         since the start (the replicas started at once, connections handed over as they join) \
         {lists:.2} lists, {watches:.2} watches (not sharing: {solo_lists:.2}, {solo_watches:.2}); connections per replica {:?}",
        started.elapsed().as_secs_f64(),
        spread.values().collect::<Vec<_>>()
    );
    println!(
        "resident memory per replica (median): {} MiB sharing {} agents, {} MiB each holding all {} baseline agents: {:.2}x",
        mib(median_u64(&rss)),
        a.agents,
        mib(median_u64(&solo_rss)),
        a.baseline_agents,
        median_u64(&rss) as f64 / median_u64(&solo_rss) as f64
    );

    // Scale: one replica more moves about 1/(N+1) of the connections.
    let added = Replica::start(&url, dir.path(), "envlens.yaml", true);
    let mut ids_after = ids.clone();
    ids_after.push(added.id.clone());
    let after = all_held(&app, dir.path(), a.agents, &ids_after).await;
    let moved = before
        .iter()
        .filter(|(c, r)| after.get(*c) != Some(*r))
        .count();
    println!(
        "one replica added: {moved} of {} connections moved ({:.1}%; 1/{} is {:.1}%)",
        a.agents,
        100.0 * moved as f64 / a.agents as f64,
        a.replicas + 1,
        100.0 / (a.replicas + 1) as f64
    );
    replicas.push(added);
    settled(&app, &api, a.agents).await;

    // A view through a non-owner against the same view on its owner.
    let http = http();
    let target = 0;
    let key = connection(dir.path(), target);
    let held = holders(&app).await;
    let owner = replicas
        .iter()
        .find(|r| Some(&r.id) == held.get(&key))
        .unwrap();
    let other = replicas.iter().find(|r| r.id != owner.id).unwrap();
    for replica in [owner, other] {
        for _ in 0..10 {
            let (status, body) = view(&http, replica.addr, target).await;
            assert!(
                status == 200 && shown(&body),
                "{}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    let (mut on_owner, mut through) = (Vec::new(), Vec::new());
    let (mut first_owner, mut first_other) = (None, None);
    for _ in 0..a.iterations {
        for (replica, times, first) in [
            (owner, &mut on_owner, &mut first_owner),
            (other, &mut through, &mut first_other),
        ] {
            let start = Instant::now();
            let (status, body) = view(&http, replica.addr, target).await;
            times.push(start.elapsed());
            assert_eq!(status, 200);
            first.get_or_insert(body);
        }
    }
    assert_eq!(first_owner, first_other, "the answers differ");
    let (o, t) = (median(on_owner.clone()), median(through.clone()));
    println!(
        "a view of {} ({} iterations): on the owner p50 {} p99 {}; through a non-owner p50 {} p99 {}: {:.2}x",
        slug(target),
        a.iterations,
        ms(o),
        ms(quantile(&on_owner, 0.99)),
        ms(t),
        ms(quantile(&through, 0.99)),
        t.as_secs_f64() / o.as_secs_f64()
    );

    // A change to subscribers on the owner and on a non-owner.
    change_to_subscribers(&api, owner.addr, other.addr, target, a.iterations.min(100)).await;

    // Failover: the owner of the target's connection killed, to a view answered by the new
    // owner.
    let mut failovers = Vec::new();
    for _ in 0..a.kills {
        let live: Vec<String> = replicas.iter().map(|r| r.id.clone()).collect();
        let held = all_held(&app, dir.path(), a.agents, &live).await;
        let at = replicas
            .iter()
            .position(|r| Some(&r.id) == held.get(&key))
            .unwrap();
        let killed = replicas.remove(at);
        let killed_id = killed.id.clone();
        let start = Instant::now();
        killed.kill_9();
        let deadline = start + Duration::from_secs(60);
        let new_owner = loop {
            let held = holders(&app).await;
            match held.get(&key) {
                Some(r) if *r != killed_id => break r.clone(),
                _ => {}
            }
            assert!(Instant::now() < deadline, "nobody took the connection");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let new_owner = replicas.iter().find(|r| r.id == new_owner).unwrap();
        loop {
            let (status, body) = view(&http, new_owner.addr, target).await;
            if status == 200 && shown(&body) {
                break;
            }
            assert!(Instant::now() < deadline, "the new owner never answers");
        }
        failovers.push(start.elapsed());
        replicas.push(Replica::start(&url, dir.path(), "envlens.yaml", true));
    }
    if !failovers.is_empty() {
        println!(
            "failover ({} kills, --replica-window {WINDOW}): p50 {}, max {}",
            failovers.len(),
            ms(median(failovers.clone())),
            ms(*failovers.iter().max().unwrap())
        );
    }
}

fn median_u64(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

/// A `resourceGroupUpdated` subscriber of agent `i`'s environment through `replica`, past its
/// first (complete) message.
async fn subscriber(replica: SocketAddr, i: usize) -> Socket {
    let id = format!("gid://gitlab/Environment/{}", FIRST_ENVIRONMENT + i as i64);
    let query = "subscription($id: ID!) { resourceGroupUpdated(environmentId: $id) { complete upserted { name labels } } }";
    let authorization = format!("Bearer {}", session());
    let mut ws = subscribe(replica, &authorization, query, json!({"id": id}), None).await;
    let first = next_text(&mut ws).await;
    assert!(first.contains("\"complete\":true"), "{first}");
    ws
}

/// A Pod's label changed `n` times, 100 ms apart, timed to a subscriber on each.
async fn change_to_subscribers(
    api: &Shards,
    owner: SocketAddr,
    other: SocketAddr,
    i: usize,
    n: usize,
) {
    let ns = namespace(i);
    let pod = "web-new222-a";
    let change = |marker: &str| {
        let mut object = api.get(i, "pods", &ns, pod).unwrap();
        object["metadata"]["labels"]["step"] = json!(marker);
        api.insert(i, &object);
    };
    let (mut a, mut b) = (subscriber(owner, i).await, subscriber(other, i).await);
    // Until both follow: a change that reaches each.
    for attempt in 0.. {
        let marker = format!("ready-{attempt}-x");
        change(&marker);
        let both = async { tokio::join!(until(&mut a, &marker), until(&mut b, &marker)) };
        if tokio::time::timeout(Duration::from_secs(3), both)
            .await
            .is_ok()
        {
            break;
        }
        assert!(attempt < 30, "the subscriptions never carried a change");
    }
    let (mut on_owner, mut on_other) = (Vec::new(), Vec::new());
    for k in 0..n {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let marker = format!("step-{k}-x");
        let start = Instant::now();
        change(&marker);
        let (x, y) = tokio::join!(until(&mut a, &marker), until(&mut b, &marker));
        on_owner.push(x - start);
        on_other.push(y - start);
    }
    let (x, y) = (median(on_owner.clone()), median(on_other.clone()));
    println!(
        "a change to a subscriber ({n} changes, 100 ms apart): on the owner p50 {} p99 {}; on a non-owner p50 {} p99 {}: +{}",
        ms(x),
        ms(quantile(&on_owner, 0.99)),
        ms(y),
        ms(quantile(&on_other, 0.99)),
        ms(y.saturating_sub(x))
    );
}
