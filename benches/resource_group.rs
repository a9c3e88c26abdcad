//! How long the resource group of an environment takes to list, against the test Kubernetes
//! API server with 5 ms of latency added to every request.
//!
//! `cargo bench --bench resource_group [-- --iterations 40 --kubectl-iterations 10 [--minimal]]`
//!
//! The cluster: 40 namespaced listable kinds (the built-in ones, ControllerRevision and 21 custom
//! kinds), an environment of 1,000 resources (label-selected ones and what they own: ReplicaSets,
//! Pods, EndpointSlices, Endpoints, ControllerRevisions, PVCs, Jobs), the same again for another
//! environment in the namespace, and Events. Measured in the same run, medians over the
//! iterations:
//!
//! - (a) envlens: the GraphQL query of the environment's `resourceGroup` (every field but
//!   `manifest`), through the service's router, as a signed-in developer whose `user_access`
//!   impersonates them: session check, SQL, listing, assembly and the JSON answer. The router is
//!   called in the process, without a socket, like the floor's requests skip none;
//! - (a') the library alone: `list_resource_group` then `group::assemble` through a
//!   `kube::Client`, with a warm discovery cache (as the service has it after its first view);
//! - (b) `kubectl get <every namespaced listable kind> -l <selector> -n <ns> -o json`, which
//!   finds only the labelled objects, not what they own (skipped when kubectl is absent);
//! - (c) the floor: the very list requests (a) sends, all at once, straight to the server over
//!   already open keep-alive connections, bodies read and not parsed.
//!
//! The database is a private PostgreSQL started from the machine's binaries, as the tests do.

/// The service's allocator (src/main.rs), so that the figures are the service's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Request};
use envlens::auth::mint_session;
use envlens::k8s::discovery::DiscoveryCache;
use envlens::k8s::fetch::{list_resource_group, FetchOptions};
use envlens::resources::group;
use fixture::RESOURCES;
use http_body_util::{BodyExt, Empty};
use serde_json::{json, Value};
use support::environment::{self, NS, PROJECT, SLUG};
use support::kube_api::{KubeApi, Served};
use support::TestApp;
use tokio::net::TcpStream;

const LATENCY: Duration = Duration::from_millis(5);

struct Args {
    iterations: usize,
    kubectl_iterations: usize,
    /// `--minimal`: ask for [`MINIMAL_QUERY`], to tell the answer's cost from the rest.
    minimal: bool,
}

fn args() -> Args {
    let mut a = Args {
        iterations: 40,
        kubectl_iterations: 10,
        minimal: false,
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        if flag == "--minimal" {
            a.minimal = true;
            continue;
        }
        let mut value = || -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} takes a number"))
        };
        match flag.as_str() {
            "--iterations" => a.iterations = value(),
            "--kubectl-iterations" => a.kubectl_iterations = value(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

#[path = "fixtures/group.rs"]
mod fixture;

struct Bench {
    /// The service, with GitLab's side recorded: a developer's `user_access` to agent 7, whose
    /// last successful deployment of `production` went to the namespace.
    app: TestApp,
    /// The developer's session.
    token: String,
    api: KubeApi,
    served: Served,
    client: kube::Client,
    discovery: DiscoveryCache,
    selector: String,
    /// `plural.group` of every discovered kind, as kubectl takes them.
    kubectl_kinds: String,
    _dir: tempfile::TempDir,
}

async fn setup() -> (Bench, usize) {
    let api = KubeApi::new();
    api.set_recording(false);
    let selected = fixture::cluster(&api, SLUG);

    let dir = tempfile::tempdir().expect("tempdir");
    let served = api.serve(dir.path()).await;
    let kubeconfig = kube::config::Kubeconfig::read_from(&served.kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("client");
    let discovery = DiscoveryCache::new(client.clone(), Duration::from_secs(300));
    let kinds = discovery.kinds().await.expect("discovery").kinds;
    assert_eq!(kinds.len(), 40, "namespaced listable kinds");
    let kubectl_kinds = kinds
        .iter()
        .map(|k| match k.group.as_str() {
            "" => k.plural.clone(),
            g => format!("{}.{g}", k.plural),
        })
        .collect::<Vec<_>>()
        .join(",");
    let app = environment::gitlab(&served).await;
    let (token, _) = mint_session(support::SESSION_KEY, 2, "dev", Duration::from_secs(3600))
        .expect("session token");
    let bench = Bench {
        app,
        token,
        api,
        served,
        client,
        discovery,
        selector: group::label_selector(PROJECT, SLUG),
        kubectl_kinds,
        _dir: dir,
    };
    (bench, selected)
}

// ---- the measurements ----

/// What a page showing the environment's resources asks for: everything but the manifests.
const QUERY: &str = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
    resourceGroup { namespace labelSelector health healthMessage warnings
      errors { apiVersion kind code message }
      resources { uid apiVersion kind namespace name labels createdAt health { status message }
                  events { type reason message count lastSeen } }
      edges { from to type } } } } }"#;

/// The same group with the least of an answer: each resource's uid.
const MINIMAL_QUERY: &str = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
    resourceGroup { errors { kind } resources { uid } } } } }"#;

/// (a) The service's answer to `query`: its body, checked by the caller after the time is
/// taken.
async fn measure_graphql(b: &Bench, query: &str) -> Vec<u8> {
    let request = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, format!("Bearer {}", b.token))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "query": query }).to_string()))
        .expect("request");
    let response = b.app.send(request).await;
    assert_eq!(response.status, 200, "{}", response.text());
    response.body
}

/// The resources of a [`measure_graphql`] answer, which must have no errors.
fn graphql_resources(body: &[u8]) -> usize {
    let answer: Value = serde_json::from_slice(body).expect("JSON");
    assert!(answer.get("errors").is_none(), "{answer}");
    let group = &answer["data"]["project"]["environment"]["resourceGroup"];
    assert_eq!(group["errors"], json!([]), "{}", group["errors"]);
    group["resources"].as_array().map_or(0, Vec::len)
}

/// (a') One view of the resource group by the library. The view is returned, so that the caller
/// drops it after taking the time: freeing it is not part of answering.
async fn measure_envlens(b: &Bench) -> group::ResourceGroup {
    let listing = list_resource_group(
        &b.client,
        &b.discovery,
        &HeaderMap::new(),
        NS,
        &b.selector,
        &FetchOptions::default(),
    )
    .await
    .expect("list");
    let group = group::assemble(listing, &Default::default());
    assert!(group.errors.is_empty(), "{:?}", group.errors);
    group
}

/// (b) kubectl over every kind; returns the number of items, or None without kubectl.
async fn measure_kubectl(b: &Bench) -> Option<usize> {
    let mut cmd = b.served.kubectl();
    cmd.args([
        "get",
        &b.kubectl_kinds,
        "-l",
        &b.selector,
        "-n",
        NS,
        "-o",
        "json",
    ]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .ok()?;
    assert!(
        out.status.success(),
        "kubectl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).expect("kubectl JSON");
    Some(list["items"].as_array().map_or(0, Vec::len))
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// (c) The floor: `uris` all at once, one open connection each; returns the bytes read.
async fn measure_floor(authority: &str, conns: &mut Vec<Sender>, uris: &[String]) -> usize {
    let mut tasks = tokio::task::JoinSet::new();
    for (mut sender, uri) in conns.drain(..).zip(uris.iter().cloned()) {
        let authority = authority.to_string();
        tasks.spawn(async move {
            sender.ready().await.expect("connection");
            let req = hyper::Request::get(uri)
                .header("host", authority)
                .header("accept", "application/json")
                .body(Empty::new())
                .expect("request");
            let res = sender.send_request(req).await.expect("send");
            assert!(res.status().is_success());
            let len = res
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes()
                .len();
            (sender, len)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        let (sender, len) = done.expect("join");
        conns.push(sender);
        total += len;
    }
    total
}

async fn connect(authority: &str, n: usize) -> Vec<Sender> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let stream = TcpStream::connect(authority).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        conns.push(sender);
    }
    conns
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
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
    let query = if a.minimal { MINIMAL_QUERY } else { QUERY };
    let (b, selected) = setup().await;
    let authority = b.served.addr.to_string();
    b.api.set_latency(LATENCY);

    // The requests (a) sends, recorded from one view: the floor replays exactly those.
    b.api.clear_requests();
    b.api.set_recording(true);
    let resources = measure_envlens(&b).await.resources.len();
    b.api.set_recording(false);
    let uris: Vec<String> = b
        .api
        .requests()
        .iter()
        .map(|r| match r.query.as_str() {
            "" => r.path.clone(),
            q => format!("{}?{q}", r.path),
        })
        .collect();
    assert_eq!(resources, RESOURCES, "resources in the group");
    let answered = graphql_resources(&measure_graphql(&b, query).await);
    assert_eq!(answered, RESOURCES, "resources in the GraphQL answer");
    let mut conns = connect(&authority, uris.len()).await;
    let floor_bytes = measure_floor(&authority, &mut conns, &uris).await;
    let kubectl_available = measure_kubectl(&b).await.is_some();

    println!(
        "resource group: {resources} resources ({selected} label-selected) over 40 kinds in namespace {NS:?}, \
         another environment of {RESOURCES} beside it, {LATENCY:?} added per request"
    );
    println!(
        "envlens sends {} list requests per view ({} KiB of JSON); discovery cached",
        uris.len(),
        floor_bytes / 1024
    );

    let (mut envlens, mut library, mut floor, mut kubectl) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..a.iterations {
        let started = Instant::now();
        let body = measure_graphql(&b, query).await;
        envlens.push(started.elapsed());
        drop(body);

        let started = Instant::now();
        let view = measure_envlens(&b).await;
        library.push(started.elapsed());
        drop(view);

        let started = Instant::now();
        measure_floor(&authority, &mut conns, &uris).await;
        floor.push(started.elapsed());

        if kubectl_available && i < a.kubectl_iterations {
            let started = Instant::now();
            let items = measure_kubectl(&b).await.expect("kubectl");
            kubectl.push(started.elapsed());
            assert_eq!(items, selected, "kubectl finds the label-selected objects");
        }
    }

    let (envlens, library, floor) = (median(envlens), median(library), median(floor));
    println!(
        "(a) envlens, the GraphQL resourceGroup query:  median {} over {} iterations",
        ms(envlens),
        a.iterations
    );
    println!(
        "(a') list_resource_group + assemble alone:     median {} over {} iterations",
        ms(library),
        a.iterations
    );
    println!(
        "(c) floor, the same {} requests at once:      median {} over {} iterations",
        uris.len(),
        ms(floor),
        a.iterations
    );
    let over_floor = envlens.as_secs_f64() / floor.as_secs_f64();
    println!(
        "envlens / floor = {over_floor:.2} (goal <= 2: {})",
        if over_floor <= 2.0 { "met" } else { "NOT met" }
    );
    if !kubectl_available {
        println!("(b) kubectl: skipped, no kubectl on PATH");
    } else if !kubectl.is_empty() {
        let n = kubectl.len();
        let kubectl = median(kubectl);
        println!(
            "(b) kubectl get <40 kinds> -l <selector> -o json: median {} over {n} iterations \
             (label-selected objects only)",
            ms(kubectl)
        );
        let ratio = kubectl.as_secs_f64() / envlens.as_secs_f64();
        println!(
            "kubectl / envlens = {ratio:.1} (goal >= 5: {})",
            if ratio >= 5.0 { "met" } else { "NOT met" }
        );
    }
}
