//! GraphQL subscriptions (SPEC 8.2) against the test Kubernetes API server, in one process:
//!
//! `cargo bench --bench live [-- --pods 100 --iterations 100 --subscribers 1000]`
//!
//! - change to screen: a Pod patched at the test server, timed until (a) a direct watcher of
//!   the test server (a `watch=true` request on its own connection, the floor) and (b) a
//!   `resourceGroupUpdated` subscriber of envlens over a WebSocket each have it; the same
//!   patches, so both are measured in the same run. Patches are 150 ms apart (past the
//!   coalescing window, as a single change in a quiet spell is).
//! - fan-out: `--subscribers` sockets, one subscription each, on the same environment; one
//!   Pod changes; the time until each has its message, p50/p99/max over all, for a few
//!   changes; and the resident memory of the process per idle subscriber (the sockets of both
//!   ends and the subscriptions, as measured with the clients in the same process: an upper
//!   bound for the server's part).
//! - `--apart 1`: the memory only, with the clients in a child process (this bench run again
//!   as `--client`), so that the resident memory measured is the server's alone (and the test
//!   Kubernetes API server's, which does not change with the subscribers).
//!
//! The group: `support::environment` (15 resources) plus `--pods` labelled Pods.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "fixtures/watcher.rs"]
mod watcher;
#[path = "fixtures/ws.rs"]
mod ws;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envlens::auth::mint_session;
use envlens::config::file::Settings;
use envlens::config::Limits;
use envlens::graphql::SocketLimits;
use envlens::k8s::clusters::Clusters;
use envlens::state::AppState;
use serde_json::{json, Value};
use support::environment::{self, NS};
use support::kube_api::KubeApi;
use support::TestApp;
use tokio::net::TcpListener;
use watcher::Watcher;
use ws::{next_text, subscribe, until, Socket};

const PATCHED: &str = "web-new222-a";
const QUERY: &str = "subscription($id: ID!) { resourceGroupUpdated(environmentId: $id) {
    complete health upserted { name manifest } removed } }";
/// `--light 1`: subscribers ask for names only, so that the first message is small; memory
/// is then measured without the buffers a large first message leaves grown (fan-out latency
/// is not measured: the marker travels in the manifest).
const LIGHT_QUERY: &str = "subscription($id: ID!) { resourceGroupUpdated(environmentId: $id) {
    complete health upserted { name } removed } }";

struct Args {
    pods: usize,
    iterations: usize,
    subscribers: usize,
    light: bool,
    apart: bool,
}

fn args() -> Args {
    let mut a = Args {
        pods: 100,
        iterations: 100,
        subscribers: 1000,
        light: false,
        apart: false,
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        let value: usize = it
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} takes a number"));
        match flag.as_str() {
            "--pods" => a.pods = value,
            "--iterations" => a.iterations = value,
            "--subscribers" => a.subscribers = value,
            "--light" => a.light = value != 0,
            "--apart" => a.apart = value != 0,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--client") {
        return client_process();
    }
    let a = args();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(a));
}

async fn run(a: Args) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    api.set_recording(false);
    environment::environment(&api);
    for i in 0..a.pods {
        api.insert(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("extra-{i}"), "namespace": NS, "uid": format!("uid-extra-{i}"),
                "labels": environment::gitlab_labels(environment::SLUG, "extra")},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]},
            "status": {"phase": "Running"}}));
    }
    let served = api.serve(dir.path()).await;
    // envlens has no default connection (SPEC 6): agent 7 is led to the test server.
    let yaml = format!(
        "kubernetes:\n{}  response_timeout: 10s\n",
        served.connections(&["7"])
    );
    let settings = Settings::parse(&yaml).unwrap();
    let clusters = Clusters::load(&settings.kubernetes, Default::default())
        .await
        .unwrap();
    let database = support::postgres::fresh_database().await;
    let mut limits = Limits::default();
    limits.connections.max_connections = 4 * a.subscribers + 100;
    let state = AppState::new((*database).clone(), support::keys(), limits)
        .with_clusters(clusters, settings.cors)
        .with_socket_limits(SocketLimits {
            max_connections: 2 * a.subscribers + 10,
            ..SocketLimits::default()
        });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(envlens::run(
        state.clone(),
        listener,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    let app = TestApp::owning(state, database);
    environment::seed(&app).await;
    let (token, _) =
        mint_session(support::SESSION_KEY, 2, "dev", Duration::from_secs(3600)).unwrap();
    let token = format!("Bearer {token}");

    println!(
        "group: {} resources; {} iterations; {} subscribers",
        15 + a.pods,
        a.iterations,
        a.subscribers
    );
    let query = if a.light { LIGHT_QUERY } else { QUERY };
    if a.apart {
        memory_apart(addr, &token, a.subscribers, query).await;
    } else if a.light {
        fan_out(&api, addr, &token, a.subscribers, LIGHT_QUERY).await;
    } else {
        change_to_screen(&api, served.addr, addr, &token, a.iterations).await;
        fan_out(&api, addr, &token, a.subscribers, QUERY).await;
    }
}

/// A subscriber past its first (whole) message.
async fn subscriber(addr: SocketAddr, token: &str, query: &str) -> Socket {
    // Small buffers on the client's side too, so that the process's memory per subscriber is
    // mostly the server's (tungstenite reads in 128 KiB by default).
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let variables = json!({"id": "gid://gitlab/Environment/100"});
    let mut ws = subscribe(addr, token, query, variables, Some(config)).await;
    let first: Value = serde_json::from_str(&next_text(&mut ws).await).unwrap();
    assert_eq!(
        first["payload"]["data"]["resourceGroupUpdated"]["complete"], true,
        "{first}"
    );
    ws
}

fn patch(api: &KubeApi, marker: &str) {
    let mut pod = api.get("pods", Some(NS), PATCHED).unwrap();
    pod["metadata"]["annotations"] = json!({ "bench": marker });
    api.insert(pod);
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

async fn change_to_screen(
    api: &KubeApi,
    server: SocketAddr,
    envlens: SocketAddr,
    token: &str,
    iterations: usize,
) {
    let mut ws = subscriber(envlens, token, QUERY).await;
    let mut watcher =
        Watcher::open(server, &format!("/api/v1/namespaces/{NS}/pods?watch=true")).await;
    let (mut direct, mut subscribed) = (Vec::new(), Vec::new());
    for i in 0..iterations + 5 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let marker = format!("step-{i}-");
        let start = Instant::now();
        patch(api, &marker);
        let (watched, screened) = tokio::join!(watcher.until(&marker), until(&mut ws, &marker));
        // The first few warm up.
        if i >= 5 {
            direct.push(watched - start);
            subscribed.push(screened - start);
        }
    }
    direct.sort();
    subscribed.sort();
    let mut gap: Vec<Duration> = subscribed
        .iter()
        .zip(&direct)
        .map(|(s, d)| s.saturating_sub(*d))
        .collect();
    gap.sort();
    println!("change to screen ({iterations} patches, 150 ms apart):");
    println!(
        "  direct watcher of the test server: p50 {}  p99 {}",
        ms(percentile(&direct, 0.5)),
        ms(percentile(&direct, 0.99))
    );
    println!(
        "  resourceGroupUpdated subscriber:   p50 {}  p99 {}",
        ms(percentile(&subscribed, 0.5)),
        ms(percentile(&subscribed, 0.99))
    );
    println!(
        "  subscriber p50 - watcher p50: {}",
        ms(percentile(&subscribed, 0.5).saturating_sub(percentile(&direct, 0.5)))
    );
}

// mimalloc's own (see src/main.rs).
extern "C" {
    fn mi_collect(force: bool);
}

/// Resident memory of the process, after mimalloc gave back what is free.
async fn rss() -> u64 {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // SAFETY: takes no pointer.
    unsafe { mi_collect(true) };
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

async fn fan_out(api: &KubeApi, envlens: SocketAddr, token: &str, n: usize, query: &str) {
    // One subscriber first, so that the feed and the cache are warm before the baseline.
    let warm = subscriber(envlens, token, query).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss().await;
    let mut sockets = Vec::with_capacity(n);
    let opened = Instant::now();
    for chunk in 0..n.div_ceil(50) {
        let batch =
            (chunk * 50..((chunk + 1) * 50).min(n)).map(|_| subscriber(envlens, token, query));
        sockets.extend(futures_util::future::join_all(batch).await);
    }
    let opening = opened.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss().await;
    println!("fan-out ({n} subscribers on one environment, opened in {opening:.1?}):");
    println!(
        "  resident memory: {:.1} MiB before, {:.1} MiB with them idle: {:.1} KiB per subscriber (both ends)",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        (after.saturating_sub(before)) as f64 / 1024.0 / n as f64
    );
    if query == LIGHT_QUERY {
        return;
    }
    let mut all = Vec::new();
    let mut rounds = Vec::new();
    for round in 0..5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let marker = format!("fan-{round}-");
        let start = Instant::now();
        patch(api, &marker);
        let waits = sockets.iter_mut().map(|ws| {
            let marker = marker.clone();
            async move { until(ws, &marker).await - start }
        });
        let mut arrived: Vec<Duration> = futures_util::future::join_all(waits).await;
        arrived.sort();
        rounds.push((
            percentile(&arrived, 0.5),
            percentile(&arrived, 0.99),
            *arrived.last().unwrap(),
        ));
        all.extend(arrived);
    }
    all.sort();
    for (i, (p50, p99, max)) in rounds.iter().enumerate() {
        println!(
            "  change {i}: p50 {}  p99 {}  last {}",
            ms(*p50),
            ms(*p99),
            ms(*max)
        );
    }
    println!(
        "  all changes: p50 {}  p99 {}",
        ms(percentile(&all, 0.5)),
        ms(percentile(&all, 0.99))
    );
    drop(warm);
}

/// `--client ADDR TOKEN N light|full`: opens N subscribers, says `ready`, and keeps them until
/// its standard input closes.
fn client_process() {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let addr: SocketAddr = args[0].parse().unwrap();
    let token = args[1].clone();
    let n: usize = args[2].parse().unwrap();
    let query = if args[3] == "light" {
        LIGHT_QUERY
    } else {
        QUERY
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let mut sockets = Vec::with_capacity(n);
            for chunk in 0..n.div_ceil(50) {
                let batch = (chunk * 50..((chunk + 1) * 50).min(n))
                    .map(|_| subscriber(addr, &token, query));
                sockets.extend(futures_util::future::join_all(batch).await);
            }
            println!("ready");
            tokio::task::spawn_blocking(|| {
                let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            })
            .await
            .unwrap();
            drop(sockets);
        });
}

/// The server's resident memory per idle subscriber, the clients in a child process.
async fn memory_apart(envlens: SocketAddr, token: &str, n: usize, query: &str) {
    use std::io::BufRead;
    let kind = if query == LIGHT_QUERY {
        "light"
    } else {
        "full"
    };
    let clients = |count: usize| {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--client",
                &envlens.to_string(),
                token,
                &count.to_string(),
                kind,
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        child
    };
    // One subscriber first, so that the feed and the cache are warm before the baseline.
    // (Waiting for `ready` blocks this thread; the server runs on the runtime's others.)
    let warm = tokio::task::block_in_place(|| clients(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss().await;
    let opened = Instant::now();
    let mut many = tokio::task::block_in_place(|| clients(n));
    let opening = opened.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss().await;
    println!("memory, clients in another process ({n} subscribers, {kind} first message, opened in {opening:.1?}):");
    println!(
        "  server's resident memory: {:.1} MiB before, {:.1} MiB with them idle: {:.1} KiB per subscriber",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        (after.saturating_sub(before)) as f64 / 1024.0 / n as f64
    );
    drop(many.stdin.take());
    let _ = many.wait();
    let mut warm = warm;
    drop(warm.stdin.take());
    let _ = warm.wait();
}
