//! The environment's timeline (SPEC 17) against the test Kubernetes API server, in one process:
//!
//! `cargo bench --bench timeline [-- --events 10000 --iterations 200]`
//!
//! - first page: `Environment.events(first: 20)` over `--events` Kubernetes Events of the
//!   group (warm: the watch cache holds them), beside the same run's `resourceGroup { health }`
//!   of the same environment, both through the router as the same user; p50 and p99 of each,
//!   and the timeline's p50 over the group's.
//! - Event to subscriber: an Event created at the test server, timed until (a) a direct
//!   watcher of the test server's Events (its own `watch=true` connection, the floor) and (b) an
//!   `environmentEventsUpdated` subscriber over a WebSocket each have it; p50 of each and of the
//!   gap. Events 50 ms apart.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "fixtures/args.rs"]
mod args;
#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "fixtures/watcher.rs"]
mod watcher;
#[path = "fixtures/ws.rs"]
mod ws;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use args::arg;
use envlens::auth::mint_session;
use envlens::config::file::Settings;
use envlens::config::Limits;
use envlens::k8s::clusters::Clusters;
use envlens::state::AppState;
use serde_json::{json, Value};
use support::environment::{self, NS, SLUG};
use support::kube_api::KubeApi;
use support::TestApp;
use tokio::net::TcpListener;
use watcher::Watcher;
use ws::{subscribe, until, Socket};

const DEV: (i64, &str) = (2, "dev");

fn main() {
    let (events, iterations) = (arg("--events", 10_000), arg("--iterations", 200));
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(events, iterations));
}

/// The group's resources the Events are about.
const ABOUT: [(&str, &str, &str); 4] = [
    ("Deployment", "web", "uid-web"),
    ("Pod", "web-new222-a", "uid-pod-web-new222-a"),
    ("Pod", "web-new222-b", "uid-pod-web-new222-b"),
    ("Service", "web", "uid-svc-web"),
];

fn event(name: &str, i: usize, message: &str) -> Value {
    let (kind, about, uid) = ABOUT[i % ABOUT.len()];
    let at = chrono::DateTime::from_timestamp(1_700_000_000 + i as i64, 0)
        .unwrap()
        .to_rfc3339();
    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": NS},
           "involvedObject": {"kind": kind, "name": about, "namespace": NS, "uid": uid},
           "type": if i.is_multiple_of(5) { "Warning" } else { "Normal" }, "reason": "Bench", "message": message,
           "firstTimestamp": at, "lastTimestamp": at, "count": 1 + i % 3, "source": {"component": "bench"}})
}

async fn run(events: usize, iterations: usize) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    api.set_recording(false);
    environment::environment(&api);
    for i in 0..events {
        api.insert(event(
            &format!("bench.{i}"),
            i,
            &format!("event {i} of the bench"),
        ));
    }
    let served = api.serve(dir.path()).await;
    let yaml = format!(
        "kubernetes:\n{}  response_timeout: 10s\n",
        served.connections(&["7"])
    );
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
    let app = TestApp::owning(state, database);
    environment::seed(&app).await;
    println!(
        "{} Events in the namespace, {iterations} iterations",
        events + 5
    );

    first_page(&app, iterations).await;
    event_to_subscriber(&api, served.addr, addr, iterations).await;
}

fn environment_query(field: &str) -> String {
    format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{ {field} }} }} }}"#
    )
}

async fn timed(app: &TestApp, query: &str, iterations: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(iterations);
    for i in 0..iterations + 20 {
        let start = Instant::now();
        let answer = app.graphql(DEV, query).await;
        let took = start.elapsed();
        assert!(answer.get("errors").is_none(), "{answer}");
        if i >= 20 {
            times.push(took);
        }
    }
    times.sort();
    times
}

async fn first_page(app: &TestApp, iterations: usize) {
    let page = environment_query(
        "events(first: 20) { edges { cursor node { id type reason message count firstTime lastTime resourceUid source } } pageInfo { hasNextPage endCursor } }",
    );
    let group = environment_query("resourceGroup { health }");
    // Warm: the watch cache has listed (10,000 Events may take longer than the first view
    // waits), the Events are parsed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = app.graphql(DEV, &page).await;
        let edges = &answer["data"]["project"]["environment"]["events"]["edges"];
        if edges.as_array().map(Vec::len) == Some(20) {
            break;
        }
        if Instant::now() > deadline {
            let group = app
                .graphql(DEV, &environment_query("resourceGroup { errors { apiVersion kind code message } warnings resources { kind uid } }"))
                .await;
            panic!("the timeline never had 20 Events: {answer}\n{group}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Interleaved rounds, so that both see the same machine.
    let (mut timeline, mut baseline) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        baseline.extend(timed(app, &group, iterations / 4).await);
        timeline.extend(timed(app, &page, iterations / 4).await);
    }
    timeline.sort();
    baseline.sort();
    println!("first page of the timeline (warm, through the router):");
    println!(
        "  resourceGroup {{ health }}:  p50 {}  p99 {}",
        ms(percentile(&baseline, 0.5)),
        ms(percentile(&baseline, 0.99))
    );
    println!(
        "  events(first: 20):         p50 {}  p99 {}",
        ms(percentile(&timeline, 0.5)),
        ms(percentile(&timeline, 0.99))
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
    let query = "subscription($id: ID!) { environmentEventsUpdated(environmentId: $id) { id message count lastTime } }";
    let variables = json!({"id": "gid://gitlab/Environment/100"});
    subscribe(addr, &format!("Bearer {token}"), query, variables, None).await
}

async fn event_to_subscriber(
    api: &KubeApi,
    server: SocketAddr,
    envlens: SocketAddr,
    iterations: usize,
) {
    let mut ws = subscriber(envlens).await;
    // Until the subscription follows the group: an Event that reaches it.
    for attempt in 0.. {
        let marker = format!("ready-{attempt}-");
        api.insert(event(&format!("live.ready.{attempt}"), 0, &marker));
        if tokio::time::timeout(Duration::from_secs(1), until(&mut ws, &marker))
            .await
            .is_ok()
        {
            break;
        }
        assert!(attempt < 30, "the subscription never followed the group");
    }
    let mut watcher = Watcher::open(
        server,
        &format!("/api/v1/namespaces/{NS}/events?watch=true&resourceVersion=0"),
    )
    .await;
    let (mut direct, mut subscribed) = (Vec::new(), Vec::new());
    for i in 0..iterations + 5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let marker = format!("step-{i}-");
        let start = Instant::now();
        api.insert(event(&format!("live.{i}"), i, &marker));
        let (watched, sent) = tokio::join!(watcher.until(&marker), until(&mut ws, &marker));
        if i >= 5 {
            direct.push(watched - start);
            subscribed.push(sent - start);
        }
    }
    direct.sort();
    subscribed.sort();
    println!("Event to subscriber ({iterations} Events, 50 ms apart):");
    println!(
        "  direct watcher of the test server: p50 {}  p99 {}",
        ms(percentile(&direct, 0.5)),
        ms(percentile(&direct, 0.99))
    );
    println!(
        "  environmentEventsUpdated:          p50 {}  p99 {}",
        ms(percentile(&subscribed, 0.5)),
        ms(percentile(&subscribed, 0.99))
    );
    println!(
        "  subscriber p50 - watcher p50: {}",
        ms(percentile(&subscribed, 0.5).saturating_sub(percentile(&direct, 0.5)))
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}
