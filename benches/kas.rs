//! envlens through GitLab's agent server (SPEC 14, issue 32): the KAS-shaped proxy of the tests
//! (`tests/support/kas.rs`, with its GitLab) in front of the test Kubernetes API server, 5 ms
//! added to every request the API server answers, the cluster of `benches/resource_group.rs`
//! (40 namespaced kinds, an environment of 1,000 resources, another beside it, Events) and 20
//! Pods in namespace `apps`.
//!
//! `cargo bench --bench kas [-- --rounds 15 --proxy-rounds 8 --seconds 3 --connections 8 --away-seconds 30]`
//!
//! Agent 7 has no `kubernetes.agents` entry and is reached through KAS as itself
//! (`access_as: agent`); agent 8 is the same cluster through the kubeconfig, the same run's
//! reference. KAS' own hop is in the baseline: a plain client through the same KAS with the same
//! `pat:7:<token>` credential. Alternating within each round (the order turned every round);
//! each figure is the median of the rounds' medians, each ratio the median of the rounds' ratios:
//!
//! - (a) the first view: a fresh `Clusters` as `serve` builds it, discovery warm, the environment's
//!   resource group through its watch cache as `serve` answers it (`WatchCache::resource_group`:
//!   the 41 lists of the namespace, then assembled and kept, the view's watches let go after),
//!   against a plain `kube::Client` listing the same 41 kinds of the namespace (pages of 500,
//!   parsed into `DynamicObject`s, every kind at once); beside them, the same view read as a
//!   listing and assembled after (`list_resource_group`, whose watches go during the assembly);
//! - (b) the warm view: the GraphQL `resourceGroup` query through the router as a developer, from
//!   the synced watch cache, through KAS and through the kubeconfig; the requests KAS received
//!   meanwhile are counted (none are needed);
//! - (c) the proxied pod list: `GET /k8s-proxy/api/v1/namespaces/apps/pods` of envlens served on a
//!   socket, `--connections` keep-alive connections for `--seconds`, against the plain client's
//!   same list through KAS; envlens through the kubeconfig and the list straight to the API
//!   server beside them (`benches/proxy.sh`'s comparison);
//! - (d) a disconnected agent (KAS waiting 20 s for it, as KAS does): the plain client's list
//!   through KAS, the first view that meets it, then for `--away-seconds` one request every 50 ms
//!   (a view of the cached environment, a view of one never listed, the proxied pod list, in
//!   turn; each on a task of its own, so that a slow one holds up no other): p50, p99, the
//!   slowest, while the agent's circuit is open.
//!
//! `valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/deps/kas-* --count 3`
//! counts instructions instead ([`count`]).
//!
//! Throughput is the inverse of a view's time (or requests a second); goal: each of (a), (b),
//! (c) ≥ 90% of its baseline's, (d) p99 < 50 ms.

/// The service's own allocator (`src/main.rs`), so that the process measured allocates as
/// `serve` does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "fixtures/callgrind.rs"]
mod callgrind;
#[path = "fixtures/group.rs"]
mod fixture;
#[path = "fixtures/pods.rs"]
mod pods;
#[path = "fixtures/stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "fixtures/views.rs"]
mod views;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use callgrind::counted;
use envlens::auth::mint_session;
use envlens::k8s::clusters::Cluster;
use envlens::k8s::discovery::ApiKind;
use envlens::k8s::fetch::FetchOptions;
use envlens::resources::group;
use http_body_util::{BodyExt, Empty};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::{json, Value};
use stats::{median, ms, quantile};
use support::environment::{self, NS, PROJECT, SLUG};
use support::kas::{through_kas, ThroughKas, ENVLENS_TOKEN};
use support::kube_api::{KubeApi, Served};
use support::TestApp;
use tokio::net::TcpStream;

const LATENCY: Duration = Duration::from_millis(5);
/// How long KAS waits for a disconnected agent (KAS' own figure).
const KAS_WAIT: Duration = Duration::from_secs(20);
const THROUGH_KAS: i64 = 7;
const THROUGH_KUBECONFIG: i64 = 8;
const PODS_NS: &str = "apps";
const PODS: usize = 20;
const DEV: (i64, &str) = (2, "dev");

struct Args {
    /// `--parts abcd`: which of the measurements to run.
    parts: String,
    /// `--count R`: instead, instructions per view and per request under callgrind.
    count: usize,
    rounds: usize,
    proxy_rounds: usize,
    seconds: u64,
    connections: usize,
    away_seconds: u64,
}

fn args() -> Args {
    let mut a = Args {
        parts: "abcd".into(),
        count: 0,
        rounds: 15,
        proxy_rounds: 8,
        seconds: 3,
        connections: 8,
        away_seconds: 30,
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        if flag == "--parts" {
            a.parts = it.next().expect("--parts takes letters");
            continue;
        }
        let value: u64 = it
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} takes a number"));
        match flag.as_str() {
            "--rounds" => a.rounds = value as usize,
            "--proxy-rounds" => a.proxy_rounds = value as usize,
            "--seconds" => a.seconds = value,
            "--connections" => a.connections = value as usize,
            "--away-seconds" => a.away_seconds = value,
            "--count" => a.count = value as usize,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    let a = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(a));
}

struct Bench {
    api: KubeApi,
    served: Served,
    through: ThroughKas,
    /// The cluster connections' part of both apps' configuration: agent 8's kubeconfig entry,
    /// GitLab and KAS for agent 7.
    settings: envlens::config::file::Settings,
    /// envlens with agent 7 through KAS, and with agent 7 through the kubeconfig.
    kas_app: TestApp,
    kube_app: TestApp,
    /// The developer's session.
    token: String,
    /// A plain client through KAS as agent 7, and one straight to the API server.
    plain_kas: kube::Client,
    plain_direct: kube::Client,
    /// What the first view lists: every watchable kind of the namespace, and Events.
    kinds: Vec<ApiKind>,
    _dir: tempfile::TempDir,
}

/// Agent 7's `user_access` with the agent's own identity: what KAS presents for it.
async fn as_agent(app: &TestApp) {
    let config = json!({"ci_access": {"groups": [{"id": "acme/apps"}]},
        "user_access": {"access_as": {"agent": {}}, "projects": [{"id": "acme/apps/web"}]}});
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": THROUGH_KAS, "agent_config": config}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

async fn setup() -> Bench {
    let api = KubeApi::new();
    api.set_recording(false);
    fixture::cluster(&api, SLUG);
    for i in 0..PODS {
        api.insert(pods::pod(PODS_NS, i));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let served = api.serve(dir.path()).await;
    let through = through_kas(&served, &[(THROUGH_KAS, 10)], dir.path()).await;
    through.kas.set_wait(KAS_WAIT);

    let settings = envlens::config::file::Settings::parse(&format!(
        "kubernetes:\n{}{}",
        served.connections(&[&THROUGH_KUBECONFIG.to_string()]),
        through.yaml
    ))
    .expect("settings");
    let kas_app = TestApp::with_config(&through.yaml).await;
    environment::seed(&kas_app).await;
    as_agent(&kas_app).await;
    // An environment in a namespace never listed, for (d).
    environment::deploy_through(
        &kas_app,
        9,
        (103, "elsewhere"),
        "success",
        ("acme/agents:prod", "other-ns"),
    )
    .await;
    let kube_app = environment::gitlab(&served).await;
    as_agent(&kube_app).await;
    let (token, _) = mint_session(
        support::SESSION_KEY,
        DEV.0,
        DEV.1,
        Duration::from_secs(7200),
    )
    .expect("session token");

    let mut kas_config = kube::Config::new(through.kas.proxy_url().parse().expect("KAS URL"));
    kas_config.default_retry = false;
    kas_config.headers.push((
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer pat:{THROUGH_KAS}:{ENVLENS_TOKEN}"))
            .expect("credential"),
    ));
    let plain_kas = kube::Client::try_from(kas_config).expect("client");
    let kubeconfig = kube::config::Kubeconfig::read_from(&served.kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    config.default_retry = false;
    let plain_direct = kube::Client::try_from(config).expect("client");

    let discovery =
        envlens::k8s::discovery::DiscoveryCache::new(plain_direct.clone(), Duration::from_secs(60));
    let mut kinds: Vec<ApiKind> = discovery
        .kinds()
        .await
        .expect("discovery")
        .kinds
        .iter()
        .filter(|k| k.watchable)
        .cloned()
        .collect();
    let events = ApiKind {
        group: String::new(),
        version: "v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
        namespaced: true,
        watchable: true,
    };
    if !kinds.contains(&events) {
        kinds.push(events);
    }
    Bench {
        api,
        served,
        through,
        settings,
        kas_app,
        kube_app,
        token,
        plain_kas,
        plain_direct,
        kinds,
        _dir: dir,
    }
}

async fn run(a: Args) {
    let b = setup().await;
    b.api.set_latency(LATENCY);
    println!(
        "cluster: {} resources in the environment over 40 kinds in {NS:?} (and as many beside), \
         {PODS} Pods in {PODS_NS:?}; {LATENCY:?} added per request; KAS waits {KAS_WAIT:?} for a \
         disconnected agent",
        fixture::RESOURCES
    );
    if a.count > 0 {
        return count(a.count, &a.parts, &b).await;
    }
    let part = |p: char| a.parts.contains(p);
    if part('a') {
        first_view(&a, &b).await;
    }
    if part('b') {
        warm_view(&a, &b).await;
    }
    if part('c') {
        proxied_list(&a, &b).await;
    }
    if part('d') {
        disconnected(&a, &b).await;
    }
}

// ---- (a) the first view ----

/// A fresh `Clusters` of [`Bench::settings`] (as `serve` builds it), and the agent's cluster in
/// it with its discovery done: a watch cache that has listed nothing.
async fn fresh_cluster(b: &Bench, agent: i64) -> (envlens::k8s::clusters::Clusters, Cluster) {
    let clusters = support::clusters(&b.settings).await;
    let name = if agent == THROUGH_KAS {
        "prod"
    } else {
        "other"
    };
    let cluster = clusters
        .for_agent(agent, "acme/agents", name)
        .await
        .expect("a connection");
    cluster.discovery.kinds().await.expect("discovery");
    (clusters, cluster)
}

/// One first view through `cluster`'s fresh watch cache as `serve` answers it
/// ([`envlens::k8s::watch::WatchCache::resource_group`]): the namespace's lists, then the group
/// assembled and kept, and only then the view's watches let go. The view is returned so that
/// the caller drops it after taking the time.
async fn first_view_of(cluster: &Cluster) -> std::sync::Arc<group::ResourceGroup> {
    let view = cluster
        .watch
        .resource_group(
            &cluster.discovery,
            &HeaderMap::new(),
            NS,
            &group::label_selector(PROJECT, SLUG),
            &FetchOptions::default(),
            &Default::default(),
        )
        .await
        .expect("view");
    assert!(view.errors.is_empty(), "{:?}", view.errors);
    assert_eq!(view.resources.len(), fixture::RESOURCES);
    view
}

/// The same first view read as a listing and assembled here, as the measurement did until
/// session 17: the view's watches are let go when the listing is done, during the assembly.
async fn listed_view_of(cluster: &Cluster) -> group::ResourceGroup {
    let listing = cluster
        .watch
        .list_resource_group(
            &cluster.discovery,
            &HeaderMap::new(),
            NS,
            &group::label_selector(PROJECT, SLUG),
            &FetchOptions::default(),
        )
        .await
        .expect("list");
    let view = group::assemble(listing, &Default::default());
    assert!(view.errors.is_empty(), "{:?}", view.errors);
    assert_eq!(view.resources.len(), fixture::RESOURCES);
    view
}

/// The plain client's view: every kind of the namespace listed at once, each in pages of 500
/// parsed into `DynamicObject`s; the pages, for the caller to drop after taking the time.
async fn plain_lists(
    client: &kube::Client,
    kinds: &[ApiKind],
) -> Vec<kube::core::ObjectList<DynamicObject>> {
    let mut tasks = tokio::task::JoinSet::new();
    for kind in kinds {
        let resource = ApiResource {
            group: kind.group.clone(),
            version: kind.version.clone(),
            api_version: kind.api_version(),
            kind: kind.kind.clone(),
            plural: kind.plural.clone(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &resource);
        tasks.spawn(async move {
            let mut params = ListParams::default().limit(500);
            let mut pages = Vec::new();
            loop {
                let page = api.list(&params).await.expect("list");
                let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
                pages.push(page);
                match next {
                    Some(next) => params = params.continue_token(&next),
                    None => return pages,
                }
            }
        });
    }
    let mut pages = Vec::new();
    while let Some(done) = tasks.join_next().await {
        pages.extend(done.expect("join"));
    }
    pages
}

/// The objects of [`plain_lists`]' pages.
fn objects(pages: &[kube::core::ObjectList<DynamicObject>]) -> usize {
    pages.iter().map(|p| p.items.len()).sum()
}

/// The median of the rounds' ratios `numerator[i] / denominator[i]`.
fn ratio_of_rounds(numerator: &[Duration], denominator: &[Duration]) -> f64 {
    let mut ratios: Vec<f64> = numerator
        .iter()
        .zip(denominator)
        .map(|(n, d)| n.as_secs_f64() / d.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

async fn first_view(a: &Args, b: &Bench) {
    // What each side sends, counted at KAS once.
    let before = b.through.kas.received().len();
    let (clusters, cluster) = fresh_cluster(b, THROUGH_KAS).await;
    let discovered = b.through.kas.received().len();
    drop(first_view_of(&cluster).await);
    let listed = b.through.kas.received().len();
    drop((cluster, clusters));
    let objects_listed = objects(&plain_lists(&b.plain_kas, &b.kinds).await);
    let plain_sent = b.through.kas.received().len() - listed;
    println!(
        "(a) a first view sends KAS {} requests (its discovery {} more, done before); the plain \
         client {plain_sent}, {objects_listed} objects over {} kinds",
        listed - discovered,
        discovered - before,
        b.kinds.len()
    );

    let mut samples: [Vec<Duration>; 5] = Default::default();
    for round in 0..a.rounds {
        for step in 0..5 {
            // Each round starts one further along, so that no side always goes first.
            let which = (step + round) % 5;
            // Each alone: a fresh cluster built before, its watches stopped after, and what a
            // view holds dropped after the time is taken.
            let fresh = match which {
                0 | 4 => Some(fresh_cluster(b, THROUGH_KAS).await),
                2 => Some(fresh_cluster(b, THROUGH_KUBECONFIG).await),
                _ => None,
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            let started = Instant::now();
            match (which, &fresh) {
                (0 | 2, Some((_, cluster))) => {
                    let view = first_view_of(cluster).await;
                    samples[which].push(started.elapsed());
                    drop(view);
                }
                (4, Some((_, cluster))) => {
                    let view = listed_view_of(cluster).await;
                    samples[which].push(started.elapsed());
                    drop(view);
                }
                _ => {
                    let client = if which == 1 {
                        &b.plain_kas
                    } else {
                        &b.plain_direct
                    };
                    let pages = plain_lists(client, &b.kinds).await;
                    samples[which].push(started.elapsed());
                    assert_eq!(objects(&pages), objects_listed);
                }
            }
            drop(fresh);
        }
    }
    let [envlens_kas, plain_kas, envlens_kube, plain_direct, listed_kas] = samples;
    let rounds: Vec<String> = plain_kas
        .iter()
        .zip(&envlens_kas)
        .map(|(p, e)| format!("{:.2}", p.as_secs_f64() / e.as_secs_f64()))
        .collect();
    println!("(a) the rounds' ratios through KAS: {}", rounds.join(" "));
    let throughput = ratio_of_rounds(&plain_kas, &envlens_kas);
    let hop_envlens = ratio_of_rounds(&envlens_kas, &envlens_kube);
    let hop_plain = ratio_of_rounds(&plain_kas, &plain_direct);
    let kube_ratio = ratio_of_rounds(&plain_direct, &envlens_kube);
    let listed_ratio = ratio_of_rounds(&plain_kas, &listed_kas);
    println!(
        "(a) first view through KAS: envlens median {}, the plain client {} over {} rounds; \
         envlens' throughput / the plain client's = {throughput:.2} (goal >= 0.90: {})",
        ms(median(envlens_kas)),
        ms(median(plain_kas)),
        a.rounds,
        verdict(throughput >= 0.9)
    );
    println!(
        "(a) the same view as a listing assembled after (its watches let go during the \
         assembly): envlens median {}, its throughput / the plain client's = {listed_ratio:.2}",
        ms(median(listed_kas)),
    );
    println!(
        "(a) through the kubeconfig, same rounds: envlens {}, the plain client {} ({kube_ratio:.2}); \
         KAS' hop costs envlens x{hop_envlens:.2}, the plain client x{hop_plain:.2}",
        ms(median(envlens_kube)),
        ms(median(plain_direct)),
    );
}

// ---- (b) the warm view ----

async fn warm_view(a: &Args, b: &Bench) {
    for app in [&b.kas_app, &b.kube_app] {
        // The first view starts the watches and waits for their lists.
        let body = views::graphql(app, &b.token, views::QUERY).await;
        assert_eq!(views::resources(&body), fixture::RESOURCES);
    }
    assert_eq!(
        views::graphql(&b.kas_app, &b.token, views::QUERY).await,
        views::graphql(&b.kube_app, &b.token, views::QUERY).await,
        "the same answer either way"
    );
    let mut sent = 0;
    let views_per_round = 20;
    let (mut kas, mut kube, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..a.rounds {
        let (mut kas_round, mut kube_round) = (Vec::new(), Vec::new());
        let asked = b.through.kas.received().len();
        for i in 0..views_per_round {
            for app in if (i + round) % 2 == 0 { [0, 1] } else { [1, 0] } {
                let (app, into) = match app {
                    0 => (&b.kas_app, &mut kas_round),
                    _ => (&b.kube_app, &mut kube_round),
                };
                let started = Instant::now();
                let body = views::graphql(app, &b.token, views::QUERY).await;
                into.push(started.elapsed());
                drop(body);
            }
        }
        sent += b.through.kas.received().len() - asked;
        kas.push(median(kas_round));
        kube.push(median(kube_round));
        let started = Instant::now();
        let pages = plain_lists(&b.plain_kas, &b.kinds).await;
        plain.push(started.elapsed());
        drop(pages);
    }
    let over_baseline = ratio_of_rounds(&plain, &kas);
    let over_kubeconfig = ratio_of_rounds(&kube, &kas);
    println!(
        "(b) warm view (GraphQL, from the watch cache): through KAS median {}, through the \
         kubeconfig {} ({over_kubeconfig:.2} of its throughput), {views_per_round} views a round \
         over {} rounds; KAS received {sent} requests during them",
        ms(median(kas)),
        ms(median(kube)),
        a.rounds
    );
    println!(
        "(b) warm view throughput / the plain client's lists through KAS ({}) = {over_baseline:.1} \
         (goal >= 0.90: {})",
        ms(median(plain)),
        verdict(over_baseline >= 0.9)
    );
}

// ---- (c) the proxied pod list ----

/// Where a load goes: an address, a path, the headers of each request.
struct Target {
    name: &'static str,
    addr: SocketAddr,
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> Sender {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// One GET of `target` on `sender`: its body's length.
async fn get(sender: &mut Sender, target: &Target) -> usize {
    sender.ready().await.expect("connection");
    let mut request = hyper::Request::get(target.path.as_str())
        .header(header::HOST, target.addr.to_string())
        .header(header::ACCEPT, "application/json")
        .body(Empty::new())
        .expect("request");
    for (name, value) in &target.headers {
        request.headers_mut().append(name, value.clone());
    }
    let response = sender.send_request(request).await.expect("send");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(
        status,
        200,
        "{}: {}",
        target.name,
        String::from_utf8_lossy(&body)
    );
    body.len()
}

/// `connections` connections asking `target` one request after another for `seconds`: the
/// requests answered a second, and their p50.
async fn load(target: &Target, connections: usize, seconds: Duration) -> (f64, Duration) {
    let mut senders = Vec::with_capacity(connections);
    for _ in 0..connections {
        senders.push(connect(target.addr).await);
    }
    let started = Instant::now();
    let until = started + seconds;
    let mut tasks = tokio::task::JoinSet::new();
    for mut sender in senders {
        let target = Target {
            name: target.name,
            addr: target.addr,
            path: target.path.clone(),
            headers: target.headers.clone(),
        };
        tasks.spawn(async move {
            let mut took = Vec::new();
            while Instant::now() < until {
                let at = Instant::now();
                get(&mut sender, &target).await;
                took.push(at.elapsed());
            }
            took
        });
    }
    let mut took = Vec::new();
    while let Some(done) = tasks.join_next().await {
        took.extend(done.expect("join"));
    }
    let rate = took.len() as f64 / started.elapsed().as_secs_f64();
    (rate, quantile(&took, 0.5))
}

/// `app`'s router on a socket of its own, as `serve` would answer.
async fn serve(app: &TestApp) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let router = app.router.clone();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    addr
}

/// The proxied pod list four ways: envlens through KAS, the plain client through KAS, envlens
/// through the kubeconfig, straight to the API server.
async fn proxy_targets(b: &Bench) -> [Target; 4] {
    let path = format!("/api/v1/namespaces/{PODS_NS}/pods");
    let session = |agent: i64| {
        vec![
            (
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {}", b.token)).expect("session"),
            ),
            (
                HeaderName::from_static("gitlab-agent-id"),
                HeaderValue::from_str(&agent.to_string()).expect("agent"),
            ),
        ]
    };
    [
        Target {
            name: "envlens through KAS",
            addr: serve(&b.kas_app).await,
            path: format!("/k8s-proxy{path}"),
            headers: session(THROUGH_KAS),
        },
        Target {
            name: "the plain client through KAS",
            addr: b.through.kas.addr,
            path: format!("/k8s-proxy{path}"),
            headers: vec![(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer pat:{THROUGH_KAS}:{ENVLENS_TOKEN}"))
                    .expect("credential"),
            )],
        },
        Target {
            name: "envlens through the kubeconfig",
            addr: serve(&b.kube_app).await,
            path: format!("/k8s-proxy{path}"),
            headers: session(THROUGH_KAS),
        },
        Target {
            name: "straight to the API server",
            addr: b.served.addr,
            path,
            headers: Vec::new(),
        },
    ]
}

async fn proxied_list(a: &Args, b: &Bench) {
    let targets = proxy_targets(b).await;
    // The same list every way before anything is timed.
    let mut items = Vec::new();
    for target in &targets {
        let mut sender = connect(target.addr).await;
        sender.ready().await.expect("ready");
        let mut request = hyper::Request::get(target.path.as_str())
            .header(header::HOST, target.addr.to_string())
            .body(Empty::new())
            .expect("request");
        for (name, value) in &target.headers {
            request.headers_mut().append(name, value.clone());
        }
        let response = sender.send_request(request).await.expect("send");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let list: Value = serde_json::from_slice(&body).expect("a list");
        items.push(list["items"].clone());
    }
    assert_eq!(
        items[0].as_array().map(Vec::len),
        Some(PODS),
        "{}",
        items[0]
    );
    assert!(
        items.iter().all(|i| *i == items[0]),
        "the same pods every way"
    );

    let seconds = Duration::from_secs(a.seconds);
    let mut rates: [Vec<f64>; 4] = Default::default();
    let mut p50s: [Vec<Duration>; 4] = Default::default();
    for round in 0..a.proxy_rounds {
        for step in 0..4 {
            let which = (step + round) % 4;
            let (rate, p50) = load(&targets[which], a.connections, seconds).await;
            rates[which].push(rate);
            p50s[which].push(p50);
        }
    }
    let median_f = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratio = |n: usize, d: usize| {
        median_f(
            &rates[n]
                .iter()
                .zip(&rates[d])
                .map(|(n, d)| n / d)
                .collect::<Vec<_>>(),
        )
    };
    println!(
        "(c) the proxied list of {PODS} Pods, {} connections, {} s a run, {} rounds:",
        a.connections, a.seconds, a.proxy_rounds
    );
    for (i, target) in targets.iter().enumerate() {
        println!(
            "(c)   {:<32} {:>7.0} requests/s, p50 {}",
            target.name,
            median_f(&rates[i]),
            ms(median(p50s[i].clone()))
        );
    }
    let through_kas = ratio(0, 1);
    println!(
        "(c) envlens through KAS / the plain client through KAS = {through_kas:.2} (goal >= 0.90: {}); \
         through the kubeconfig, envlens / straight = {:.2}",
        verdict(through_kas >= 0.9),
        ratio(2, 3)
    );
}

// ---- (d) a disconnected agent ----

/// A view of `environment` through the KAS app: its resource group.
async fn view(b: &Bench, environment: &str) -> Value {
    let query = views::QUERY.replace("\"production\"", &format!("\"{environment}\""));
    views::group(&views::graphql(&b.kas_app, &b.token, &query).await)
}

/// Whether every kind of `group` is a 503 saying that agent 7 is not connected.
fn says_not_connected(group: &Value) -> bool {
    let errors = group["errors"].as_array().cloned().unwrap_or_default();
    !errors.is_empty()
        && errors.iter().all(|e| {
            e["code"] == 503
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("is not connected"))
        })
}

async fn disconnected(a: &Args, b: &Bench) {
    // Viewed while connected (as (b) does): discovery known, the namespace cached.
    assert_eq!(view(b, SLUG).await["errors"], json!([]));
    b.through.kas.disconnect(THROUGH_KAS);
    let started = Instant::now();
    // The plain client meets KAS' wait; so does envlens' first view of a namespace it never
    // listed, which then opens the circuit.
    let plain = {
        let client = b.plain_kas.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let resource = ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "Pod".into(),
                plural: "pods".into(),
            };
            let pods: Api<DynamicObject> = Api::namespaced_with(client, PODS_NS, &resource);
            let answer = pods.list(&ListParams::default()).await;
            (
                started.elapsed(),
                answer.map(|_| ()).map_err(|e| e.to_string()),
            )
        })
    };
    let first = view(b, "elsewhere").await;
    let first_took = started.elapsed();
    assert!(says_not_connected(&first), "{first}");
    let (plain_took, plain_answer) = plain.await.expect("join");
    let said = plain_answer.expect_err("the agent is away");
    println!(
        "(d) agent disconnected: the plain client's list through KAS failed after {} ({said}); \
         envlens' first view of a namespace never listed answered after {}",
        ms(plain_took),
        ms(first_took)
    );

    // While the circuit is open: one request every 50 ms, each on a task of its own.
    let kinds = [
        "the cached environment",
        "a namespace never listed",
        "the proxied pod list",
    ];
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let away = Instant::now();
    let mut i = 0;
    while away.elapsed() < Duration::from_secs(a.away_seconds) {
        tick.tick().await;
        let which = i % kinds.len();
        i += 1;
        let app = b.kas_app.router.clone();
        let token = b.token.clone();
        tasks.spawn(async move {
            let started = Instant::now();
            let ok = match which {
                0 | 1 => {
                    let environment = if which == 0 { SLUG } else { "elsewhere" };
                    let query =
                        views::QUERY.replace("\"production\"", &format!("\"{environment}\""));
                    let request = axum::http::Request::post("/api/graphql")
                        .header(header::AUTHORIZATION, format!("Bearer {token}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(axum::body::Body::from(
                            json!({ "query": query }).to_string(),
                        ))
                        .expect("request");
                    let body = answer(app, request).await;
                    says_not_connected(&views::group(&body))
                }
                _ => {
                    let request = axum::http::Request::get(format!(
                        "/k8s-proxy/api/v1/namespaces/{PODS_NS}/pods"
                    ))
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header("gitlab-agent-id", THROUGH_KAS.to_string())
                    .body(axum::body::Body::empty())
                    .expect("request");
                    let body = answer(app, request).await;
                    let status: Value = serde_json::from_slice(&body).expect("a Status");
                    status["code"] == 503
                }
            };
            (which, started.elapsed(), ok)
        });
    }
    let mut took: [Vec<Duration>; 3] = Default::default();
    let mut wrong = 0;
    while let Some(done) = tasks.join_next().await {
        let (which, elapsed, ok) = done.expect("join");
        took[which].push(elapsed);
        wrong += usize::from(!ok);
    }
    let all: Vec<Duration> = took.iter().flatten().copied().collect();
    let p99 = quantile(&all, 0.99);
    println!(
        "(d) for {} s after: {} requests, {wrong} not answered as the circuit says",
        a.away_seconds,
        all.len()
    );
    for (name, samples) in kinds.iter().zip(&took) {
        println!(
            "(d)   {name:<26} p50 {} p99 {} slowest {} ({} requests)",
            ms(quantile(samples, 0.5)),
            ms(quantile(samples, 0.99)),
            ms(*samples.iter().max().expect("samples")),
            samples.len()
        );
    }
    println!(
        "(d) all: p50 {} p99 {} (goal < 50 ms: {}), slowest {}, {} over 1 s",
        ms(quantile(&all, 0.5)),
        ms(p99),
        verdict(p99 < Duration::from_millis(50)),
        ms(*all.iter().max().expect("samples")),
        all.iter().filter(|d| **d > Duration::from_secs(1)).count()
    );
}

/// The body of the router's answer to `request`.
async fn answer(router: axum::Router, request: axum::http::Request<axum::body::Body>) -> Bytes {
    use tower::ServiceExt;
    let response = router.oneshot(request).await.expect("infallible");
    response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
}

// ---- --count: instructions ----

/// `--count R`: the measured pieces of the `--parts` asked for, each R times (the warm views,
/// the proxied requests and the away views 10 R times) between callgrind's zero and a dump
/// named after it, one after the other: `a-envlens-kas`, `a-plain-kas`,
/// `a-envlens-kubeconfig`, `a-plain-direct`; `b-warm-kas`, `b-warm-kubeconfig`;
/// `c-envlens-kas`, `c-plain-kas`, `c-envlens-kubeconfig`, `c-straight`; then with the agent
/// away (its circuit open after KAS' wait) `d-away-cached`, views of the cached environment
/// (`cg.out.1` … `cg.out.11` with every part). The whole process is counted: the test API
/// server, KAS and the load's own client included, the same on each side of a comparison.
async fn count(r: usize, parts: &str, b: &Bench) {
    if parts.contains('a') {
        // Each first view needs a fresh cache: R of each, built before the zero.
        let mut fresh = Vec::new();
        for _ in 0..r {
            fresh.push((
                fresh_cluster(b, THROUGH_KAS).await,
                fresh_cluster(b, THROUGH_KUBECONFIG).await,
            ));
        }
        let mut kas_fresh = fresh.iter().map(|((_, kas), _)| kas);
        counted("a-envlens-kas", r, || {
            first_view_of(kas_fresh.next().expect("fresh"))
        })
        .await;
        counted("a-plain-kas", r, || plain_lists(&b.plain_kas, &b.kinds)).await;
        let mut kube_fresh = fresh.iter().map(|(_, (_, kube))| kube);
        counted("a-envlens-kubeconfig", r, || {
            first_view_of(kube_fresh.next().expect("fresh"))
        })
        .await;
        counted("a-plain-direct", r, || {
            plain_lists(&b.plain_direct, &b.kinds)
        })
        .await;
    }
    for app in [&b.kas_app, &b.kube_app] {
        assert_eq!(
            views::resources(&views::graphql(app, &b.token, views::QUERY).await),
            fixture::RESOURCES
        );
    }
    if parts.contains('b') {
        counted("b-warm-kas", r * 10, || {
            views::graphql(&b.kas_app, &b.token, views::QUERY)
        })
        .await;
        counted("b-warm-kubeconfig", r * 10, || {
            views::graphql(&b.kube_app, &b.token, views::QUERY)
        })
        .await;
    }
    if parts.contains('c') {
        let targets = proxy_targets(b).await;
        let names = [
            "c-envlens-kas",
            "c-plain-kas",
            "c-envlens-kubeconfig",
            "c-straight",
        ];
        for (target, name) in targets.iter().zip(names) {
            let sender = std::sync::Arc::new(tokio::sync::Mutex::new(connect(target.addr).await));
            // The connection's first request (and envlens' first use of the agent) left out.
            get(&mut *sender.lock().await, target).await;
            counted(name, r * 10, || {
                let sender = sender.clone();
                async move { get(&mut *sender.lock().await, target).await }
            })
            .await;
        }
    }
    if parts.contains('d') {
        // The agent away, its circuit open (after KAS' wait), the cached environment's watches
        // failing as the circuit says (some first fail with the cut tunnel's own error).
        b.through.kas.disconnect(THROUGH_KAS);
        assert!(says_not_connected(&view(b, "elsewhere").await));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !says_not_connected(&view(b, SLUG).await) {
            assert!(Instant::now() < deadline, "the watches never failed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        counted("d-away-cached", r * 10, || {
            views::graphql(&b.kas_app, &b.token, views::QUERY)
        })
        .await;
    }
}
