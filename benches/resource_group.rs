//! How long the resource group of an environment takes to list, against the test Kubernetes
//! API server with 5 ms of latency added to every request.
//!
//! `cargo bench --bench resource_group [-- --iterations 40 --kubectl-iterations 10 [--minimal]]`
//! `cargo bench --bench resource_group -- --warm [--iterations 40]`
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
//!   called in the process, without a socket, like the floor's requests skip none. Since the
//!   watch cache (SPEC 8.1) every view after the first is answered from memory: (a) is the warm
//!   view, and sends no list at all;
//! - (a-cold) the first view of the namespace, the cold path: a fresh watch cache (as after a
//!   start, or once the namespace idled out) whose 41 watches first list, then the assembly,
//!   through `WatchCache::resource_group` as the service's views call it: the watches the
//!   lists started send their first watch once the group is assembled, not beside the
//!   assembly (until session 21 this entered through `list_resource_group`, which lets them go
//!   as it returns its listing); discovery warm, no impersonation (the access reviews are the
//!   cache's, not a list's);
//! - (a-cold-listed) the same first view entered as until session 21, for comparison in the
//!   same run: `WatchCache::list_resource_group`, whose watches start as it returns, then
//!   `group::assemble` beside them;
//! - (a') the library without the cache: `fetch::list_resource_group` then `group::assemble`
//!   through a `kube::Client`, with a warm discovery cache: the same lists as the floor's, every
//!   view (what a selector the cache cannot evaluate gets);
//! - (b) `kubectl get <every namespaced listable kind> -l <selector> -n <ns> -o json`, which
//!   finds only the labelled objects, not what they own (skipped when kubectl is absent);
//! - (c) the floor: the very list requests (a') sends, all at once, straight to the server over
//!   already open keep-alive connections, bodies read and not parsed;
//! - (c-cold) the cold view's own floor: the very list requests a fresh watch cache's watches
//!   send (each kind of the whole namespace, unselected, and its Events; the watch requests
//!   themselves left out), all at once in the same way. (a-cold) is reported against it, (a')
//!   against (c); each ratio is the median of the rounds' ratios.
//!
//! `cargo bench --bench resource_group -- --viewers 100 [--compress 10]`
//! `cargo bench --bench resource_group -- --memory [--page-size 500]`
//!
//! With `--viewers N`, instead: the cost to the cluster of N viewers of the environment for one
//! minute, each asking for the `resourceGroup` every 5 s, with the watch cache and without it;
//! requests counted per verb at the test server. Time runs `--compress` times faster (the
//! interval and `kubernetes.access_cache` both divided by it), so the counts are a minute's.
//! With `--memory`: the bytes the synced cache holds per cached object (counted by the global
//! allocator), against the size of the objects' JSON as the test server sends them: at the
//! list's end, and at rest (the texts packed, `PACK_AFTER`, and the watches moved off the
//! lists' connections, `HANDOVER`: some 11 s a round).
//!
//! With `--warm`, instead: (w) the same GraphQL query answered from the synced watch cache
//! (SPEC 8.1) against (a) without the cache (`kubernetes.cache_max_objects: 0`), interleaved;
//! times are the router's (server time: no socket), p50 and p90.
//!
//! `cargo bench --bench resource_group -- --causes [--iterations 40]`
//!
//! With `--causes`, instead: the cost of `causes` (SPEC 17) on a warm view. Ten of the fifty
//! Deployments' first Pods crash-loop (ten of the causes, each a path down to the Pod); (w) the
//! query of `--warm` and (wc) the same query with `causes { root path reason message sentence }`,
//! both answered from the synced watch cache, interleaved; p50 and p90 of each, and the p50
//! added (goal < 2 ms).
//!
//! `valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/deps/resource_group-* --count 3`
//!
//! With `--count R`, instead: instructions per view, which do not depend on the machine's
//! speed or load: each of (w) the warm GraphQL view, (a) the GraphQL view without the cache,
//! (a-cold), (a'), (c) and (c-cold) is run R times between callgrind's zero and a dump named
//! after it (`cg.out.1` … `cg.out.6`; `totals:` is the total (the first dump's `summary:` also
//! counts what threads started before the zero did), `callgrind_annotate` the breakdown). The
//! whole process is counted, the test server's serializing included: (c) and (c-cold) are that
//! part alone. The views are freed after the dump: freeing is not answering.
//!
//! The database is a private PostgreSQL started from the machine's binaries, as the tests do.

/// The service's allocator (src/main.rs), so that the figures are the service's; counted, so
/// that `--memory` can read the bytes live (resident memory under mimalloc says nothing about
/// one structure: freed pages are kept and reused).
#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting(mimalloc::MiMalloc);

#[path = "fixtures/counting.rs"]
mod counting;
use counting::{live, live_by_size};

#[path = "fixtures/callgrind.rs"]
mod callgrind;
#[path = "fixtures/floor.rs"]
mod floor;
#[path = "fixtures/stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;
use callgrind::counted;
use floor::{connect, measure_floor, recorded_lists};
use stats::{median, ms};

use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, Request};
use envlens::auth::mint_session;
use envlens::k8s::discovery::{ApiKind, DiscoveryCache};
use envlens::k8s::fetch::{list_resource_group, FetchOptions};
use envlens::k8s::watch::{WatchCache, WatchSettings};
use envlens::resources::group;
use fixture::RESOURCES;
use serde_json::{json, Value};
use support::environment::{self, NS, PROJECT, SLUG};
use support::kube_api::{KubeApi, Served};
use support::TestApp;

const LATENCY: Duration = Duration::from_millis(5);

struct Args {
    iterations: usize,
    kubectl_iterations: usize,
    /// `--minimal`: ask for [`MINIMAL_QUERY`], to tell the answer's cost from the rest.
    minimal: bool,
    /// `--warm`: the watch cache's answer against the cold path.
    warm: bool,
    /// `--causes`: a warm view with `causes` against one without.
    causes: bool,
    /// `--viewers N`: the cost to the cluster of N viewers for a minute.
    viewers: usize,
    /// `--compress K`: the viewers' minute in 60/K seconds.
    compress: u32,
    /// `--memory`: bytes held per cached object.
    memory: bool,
    /// `--page-size N`: the lists' page size for `--memory` (default the service's, 500).
    page_size: usize,
    /// `--count R`: each view R times between callgrind's zero and dump.
    count: usize,
}

fn args() -> Args {
    let mut a = Args {
        iterations: 40,
        kubectl_iterations: 10,
        minimal: false,
        warm: false,
        causes: false,
        viewers: 0,
        compress: 10,
        memory: false,
        page_size: FetchOptions::default().page_size,
        count: 0,
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        if flag == "--minimal" {
            a.minimal = true;
            continue;
        }
        if flag == "--warm" {
            a.warm = true;
            continue;
        }
        if flag == "--causes" {
            a.causes = true;
            continue;
        }
        if flag == "--memory" {
            a.memory = true;
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
            "--viewers" => a.viewers = value(),
            "--compress" => a.compress = value() as u32,
            "--page-size" => a.page_size = value(),
            "--count" => a.count = value(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

#[path = "fixtures/group.rs"]
mod fixture;
#[allow(dead_code)] // `group` is for benches that read errors
#[path = "fixtures/views.rs"]
mod views;
use views::QUERY;

struct Bench {
    /// The service, with GitLab's side recorded: a developer's `user_access` to agent 7, whose
    /// last successful deployment of `production` went to the namespace.
    app: TestApp,
    /// The developer's session.
    token: String,
    api: KubeApi,
    served: Served,
    client: kube::Client,
    /// The watch cache's streams' client (`WatchCache::new`).
    streams: kube::Client,
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
    // Over the service's bounded connection pools, as `serve` builds a cluster's clients.
    let build = || {
        envlens::k8s::connection::client_builder(&config)
            .expect("client")
            .build()
    };
    let (client, streams) = (build(), build());
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
        streams,
        discovery,
        selector: group::label_selector(PROJECT, SLUG),
        kubectl_kinds,
        _dir: dir,
    };
    (bench, selected)
}

// ---- the measurements ----

/// The same group with the least of an answer: each resource's uid.
const MINIMAL_QUERY: &str = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
    resourceGroup { errors { kind } resources { uid } } } } }"#;

/// (a) The service's answer to `query`: its body, checked by the caller after the time is
/// taken.
async fn measure_graphql(b: &Bench, query: &str) -> Vec<u8> {
    views::graphql(&b.app, &b.token, query).await
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

/// A fresh watch cache over the bench's clients, nothing in it expiring during a run.
fn fresh_cache(b: &Bench) -> WatchCache {
    let settings = WatchSettings {
        idle: Duration::from_secs(600),
        max_objects: 1_000_000,
        access_ttl: Duration::from_secs(60),
    };
    WatchCache::new(
        b.client.clone(),
        b.streams.clone(),
        settings,
        Default::default(),
    )
}

/// (a-cold) The first view through a fresh watch cache, as the service's views ask it
/// (`WatchCache::resource_group`); the cache is returned with the view so that the caller
/// stops its watches after taking the time.
async fn measure_cold(b: &Bench) -> (std::sync::Arc<group::ResourceGroup>, WatchCache) {
    let cache = fresh_cache(b);
    let group = cache
        .resource_group(
            &b.discovery,
            &HeaderMap::new(),
            NS,
            &b.selector,
            &FetchOptions::default(),
            &Default::default(),
        )
        .await
        .expect("list");
    assert!(group.errors.is_empty(), "{:?}", group.errors);
    (group, cache)
}

/// (a-cold-listed) The first view through a fresh watch cache, entered as (a-cold) was until
/// session 21: the listing (its watches let go as it returns), then the assembly.
async fn measure_cold_listed(b: &Bench) -> (group::ResourceGroup, WatchCache) {
    let cache = fresh_cache(b);
    let listing = cache
        .list_resource_group(
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
    (group, cache)
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
    if a.warm {
        return run_warm(&a, &b, query).await;
    }
    if a.causes {
        return run_causes(&a, &b).await;
    }
    if a.viewers > 0 {
        return run_viewers(&a, &b, query).await;
    }
    if a.memory {
        return run_memory(&b, a.page_size).await;
    }
    if a.count > 0 {
        return run_count(&a, &b, query).await;
    }

    // The requests (a') sends, recorded from one view: the floor replays exactly those; and
    // the lists a fresh watch cache's watches send, the cold view's floor (c-cold).
    let (view, uris) = recorded_lists(&b.api, measure_envlens(&b)).await;
    let resources = view.resources.len();
    drop(view);
    assert_eq!(resources, RESOURCES, "resources in the group");
    let ((cold_view, cache), cold_uris) = recorded_lists(&b.api, measure_cold(&b)).await;
    assert_eq!(
        cold_view.resources.len(),
        RESOURCES,
        "resources of a cold view"
    );
    drop((cold_view, cache));
    let answered = views::resources(&measure_graphql(&b, query).await);
    assert_eq!(answered, RESOURCES, "resources in the GraphQL answer");
    let mut conns = connect(&authority, uris.len()).await;
    let floor_bytes = measure_floor(&authority, &mut conns, &uris).await;
    let mut cold_conns = connect(&authority, cold_uris.len()).await;
    let cold_floor_bytes = measure_floor(&authority, &mut cold_conns, &cold_uris).await;
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

    println!(
        "a fresh watch cache's watches send {} list requests ({} KiB of JSON: the namespace's every object)",
        cold_uris.len(),
        cold_floor_bytes / 1024
    );

    let (mut envlens, mut cold, mut library, mut floor, mut cold_floor, mut kubectl) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let mut cold_listed = Vec::new();
    for i in 0..a.iterations {
        let started = Instant::now();
        let body = measure_graphql(&b, query).await;
        envlens.push(started.elapsed());
        drop(body);

        let started = Instant::now();
        let view = measure_cold(&b).await;
        cold.push(started.elapsed());
        drop(view);

        let started = Instant::now();
        let view = measure_cold_listed(&b).await;
        cold_listed.push(started.elapsed());
        drop(view);

        let started = Instant::now();
        let view = measure_envlens(&b).await;
        library.push(started.elapsed());
        drop(view);

        let started = Instant::now();
        measure_floor(&authority, &mut conns, &uris).await;
        floor.push(started.elapsed());

        let started = Instant::now();
        measure_floor(&authority, &mut cold_conns, &cold_uris).await;
        cold_floor.push(started.elapsed());

        if kubectl_available && i < a.kubectl_iterations {
            let started = Instant::now();
            let items = measure_kubectl(&b).await.expect("kubectl");
            kubectl.push(started.elapsed());
            assert_eq!(items, selected, "kubectl finds the label-selected objects");
        }
    }

    let cold_ratios: Vec<f64> = cold
        .iter()
        .zip(&cold_floor)
        .map(|(a, c)| a.as_secs_f64() / c.as_secs_f64())
        .collect();
    let cold_listed_ratios: Vec<f64> = cold_listed
        .iter()
        .zip(&cold_floor)
        .map(|(a, c)| a.as_secs_f64() / c.as_secs_f64())
        .collect();
    let cold_listed = median(cold_listed);
    let library_ratios: Vec<f64> = library
        .iter()
        .zip(&floor)
        .map(|(a, c)| a.as_secs_f64() / c.as_secs_f64())
        .collect();
    let (envlens, cold, library, floor, cold_floor) = (
        median(envlens),
        median(cold),
        median(library),
        median(floor),
        median(cold_floor),
    );
    println!(
        "(a) envlens, the GraphQL resourceGroup query (watch cache warm): median {} over {} iterations",
        ms(envlens),
        a.iterations
    );
    println!(
        "(a-cold) first view, a fresh watch cache + assemble: median {} over {} iterations",
        ms(cold),
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
    println!(
        "(c-cold) the watches' {} lists at once:       median {} over {} iterations",
        cold_uris.len(),
        ms(cold_floor),
        a.iterations
    );
    let verdict = |ratio: f64| if ratio <= 1.8 { "met" } else { "NOT met" };
    let over_floor = envlens.as_secs_f64() / floor.as_secs_f64();
    println!(
        "(a) warm / floor = {over_floor:.2} (goal <= 1.8: {})",
        verdict(over_floor)
    );
    let cold_over_floor = median_ratio(cold_ratios);
    println!(
        "(a-cold) cold / its floor (c-cold) = {cold_over_floor:.2}, median of the rounds' ratios (goal <= 1.8: {}); / (c) {:.2}",
        verdict(cold_over_floor),
        cold.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "(a-cold-listed) entered as until session 21: median {}; / (c-cold) = {:.2}, median of the rounds' ratios",
        ms(cold_listed),
        median_ratio(cold_listed_ratios)
    );
    let library_over_floor = median_ratio(library_ratios);
    println!(
        "(a') uncached / floor = {library_over_floor:.2}, median of the rounds' ratios (goal <= 1.8: {})",
        verdict(library_over_floor)
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

fn median_ratio(mut ratios: Vec<f64>) -> f64 {
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

/// `--count R`: instructions per view under callgrind (see the module's documentation).
async fn run_count(a: &Args, b: &Bench, query: &str) {
    let cold_app = environment::gitlab_with(&b.served, "  cache_max_objects: 0\n").await;
    assert_eq!(
        views::resources(&measure_graphql(b, query).await),
        RESOURCES
    );
    assert_eq!(
        views::resources(&views::graphql(&cold_app, &b.token, query).await),
        RESOURCES
    );
    let (view, uris) = recorded_lists(&b.api, measure_envlens(b)).await;
    drop(view);
    let (view, cold_uris) = recorded_lists(&b.api, measure_cold(b)).await;
    drop(view);
    let authority = b.served.addr.to_string();
    let mut conns = connect(&authority, uris.len()).await;
    measure_floor(&authority, &mut conns, &uris).await;
    let mut cold_conns = connect(&authority, cold_uris.len()).await;
    measure_floor(&authority, &mut cold_conns, &cold_uris).await;
    let r = a.count;
    counted("w-warm-graphql", r * 10, || measure_graphql(b, query)).await;
    counted("a-uncached-graphql", r, || {
        views::graphql(&cold_app, &b.token, query)
    })
    .await;
    counted("a-cold-through-cache", r, || measure_cold(b)).await;
    counted("a-prime-uncached-library", r, || measure_envlens(b)).await;
    let conns = std::sync::Arc::new(tokio::sync::Mutex::new(conns));
    counted("c-floor", r, || {
        let (conns, authority, uris) = (conns.clone(), authority.clone(), uris.clone());
        async move { measure_floor(&authority, &mut *conns.lock().await, &uris).await }
    })
    .await;
    let cold_conns = std::sync::Arc::new(tokio::sync::Mutex::new(cold_conns));
    counted("c-cold-floor", r, || {
        let (conns, authority, uris) = (cold_conns.clone(), authority.clone(), cold_uris.clone());
        async move { measure_floor(&authority, &mut *conns.lock().await, &uris).await }
    })
    .await;
}

fn percentile(mut samples: Vec<Duration>, p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// `--warm`: (w) from the synced cache against (a) without it, interleaved.
async fn run_warm(a: &Args, b: &Bench, query: &str) {
    let cold_app = environment::gitlab_with(&b.served, "  cache_max_objects: 0\n").await;
    let cold = |query| views::graphql(&cold_app, &b.token, query);
    // The first view starts the watches and waits for their lists.
    let first = measure_graphql(b, query).await;
    assert_eq!(views::resources(&first), RESOURCES);
    assert_eq!(views::resources(&cold(query).await), RESOURCES);
    assert_eq!(
        measure_graphql(b, query).await,
        cold(query).await,
        "the cached answer is the fresh one"
    );
    b.api.reset_request_counts();
    let warm_runs = a.iterations * 10;
    let (mut warm, mut fresh) = (Vec::new(), Vec::new());
    for i in 0..warm_runs {
        let started = Instant::now();
        let body = measure_graphql(b, query).await;
        warm.push(started.elapsed());
        drop(body);
        if i % 10 == 0 {
            let started = Instant::now();
            let body = cold(query).await;
            fresh.push(started.elapsed());
            drop(body);
        }
    }
    let per_view = b.api.resource_requests() as f64 / fresh.len() as f64;
    println!(
        "resource group: {RESOURCES} resources over 40 kinds, {LATENCY:?} added per request to the test server"
    );
    println!(
        "(w) from the synced watch cache: p50 {} p90 {} over {warm_runs} views",
        us(percentile(warm.clone(), 0.5)),
        us(percentile(warm.clone(), 0.9))
    );
    println!(
        "(a) without the cache:           p50 {} p90 {} over {} views ({per_view:.0} requests to the cluster per view)",
        us(percentile(fresh.clone(), 0.5)),
        us(percentile(fresh.clone(), 0.9)),
        fresh.len()
    );
    let ratio = percentile(fresh, 0.5).as_secs_f64() / percentile(warm.clone(), 0.5).as_secs_f64();
    let p50 = percentile(warm, 0.5);
    println!(
        "(a) / (w) = {ratio:.1} (moonshot >= 30: {}); (w) p50 < 1 ms: {}",
        if ratio >= 30.0 { "met" } else { "NOT met" },
        if p50 < Duration::from_millis(1) {
            "met"
        } else {
            "NOT met"
        }
    );
}

/// [`QUERY`] with the group's causes.
const CAUSES_QUERY: &str = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
    resourceGroup { namespace labelSelector health healthMessage warnings
      errors { apiVersion kind code message }
      resources { uid apiVersion kind namespace name labels createdAt health { status message }
                  events { type reason message count lastSeen } }
      edges { from to type }
      causes { root path reason message sentence } } } } }"#;

/// How many causes an answer to [`CAUSES_QUERY`] names, and how many of them are crash loops.
fn graphql_causes(body: &[u8]) -> (usize, usize) {
    let v: Value = serde_json::from_slice(body).expect("json");
    let causes = v["data"]["project"]["environment"]["resourceGroup"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let crashes = causes
        .iter()
        .filter(|c| c["reason"] == "CrashLoopBackOff")
        .count();
    (causes.len(), crashes)
}

/// `--causes`: (wc) a warm view with `causes` against (w) the same without, interleaved.
async fn run_causes(a: &Args, b: &Bench) {
    const CRASHING: usize = 10;
    for i in 0..CRASHING {
        let name = format!("{SLUG}-web{i}-5d8f-0");
        let mut pod = b
            .api
            .get("pods", Some(NS), &name)
            .expect("the fixture's Pod");
        let app = format!("{SLUG}-web{i}");
        pod["status"] = json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "False"}],
            "containerStatuses": [{"name": app, "ready": false, "restartCount": 7, "image": "registry.example.com/shop/app:1.4.2",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off 5m0s restarting failed container={app} pod={name}_{NS}(uid-{name})")}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]});
        b.api.insert(pod);
    }
    // The first view starts the watches; then until the cache has seen every change.
    let started = Instant::now();
    let causes = loop {
        let body = measure_graphql(b, CAUSES_QUERY).await;
        let (causes, crashes) = graphql_causes(&body);
        if crashes == CRASHING {
            assert_eq!(views::resources(&body), RESOURCES);
            break causes;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the crash loops never showed: {causes} causes, {crashes} crash loops"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let runs = a.iterations * 10;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let started = Instant::now();
        drop(measure_graphql(b, QUERY).await);
        without.push(started.elapsed());
        let started = Instant::now();
        drop(measure_graphql(b, CAUSES_QUERY).await);
        with.push(started.elapsed());
    }
    println!("resource group: {RESOURCES} resources over 40 kinds, {CRASHING} of them crash-looping Pods; {causes} causes");
    println!(
        "(w)  warm, without causes: p50 {} p90 {} over {runs} views",
        us(percentile(without.clone(), 0.5)),
        us(percentile(without.clone(), 0.9))
    );
    println!(
        "(wc) warm, with causes:    p50 {} p90 {} over {runs} views",
        us(percentile(with.clone(), 0.5)),
        us(percentile(with.clone(), 0.9))
    );
    let added = percentile(with, 0.5).as_secs_f64() - percentile(without, 0.5).as_secs_f64();
    println!(
        "(wc) - (w) at p50 = {:.0} µs (goal < 2 ms: {})",
        added * 1e6,
        if added < 0.002 { "met" } else { "NOT met" }
    );
}

/// Requests counted at the test server, summed by verb.
fn by_verb(api: &KubeApi) -> std::collections::BTreeMap<String, u64> {
    let mut verbs = std::collections::BTreeMap::new();
    for ((verb, _), n) in api.request_counts() {
        *verbs.entry(verb).or_insert(0) += n;
    }
    verbs
}

/// `--viewers N`: N viewers asking every 5 s for a minute (compressed), with and without the
/// cache, each through an app of its own.
async fn run_viewers(a: &Args, b: &Bench, query: &str) {
    let k = a.compress.max(1);
    let interval = Duration::from_secs(5) / k;
    let minute = Duration::from_secs(60) / k;
    let access = format!("  access_cache: {}ms\n", interval.as_millis());
    println!(
        "{} viewers of one environment ({RESOURCES} resources, 40 kinds), each asking every 5 s for a minute; \
         time compressed {k}x (every {interval:?} for {minute:?}, access_cache {interval:?})",
        a.viewers
    );
    for (name, extra) in [
        ("with the watch cache", access.clone()),
        (
            "without (cache_max_objects: 0)",
            format!("{access}  cache_max_objects: 0\n"),
        ),
    ] {
        let app = std::sync::Arc::new(environment::gitlab_with(&b.served, &extra).await);
        b.api.reset_request_counts();
        let started = Instant::now();
        let mut viewers = tokio::task::JoinSet::new();
        for v in 0..a.viewers {
            let (app, token, query) = (app.clone(), b.token.clone(), query.to_owned());
            let n = a.viewers as u32;
            viewers.spawn(async move {
                // Viewers arrive spread over the first interval.
                tokio::time::sleep(interval * v as u32 / n).await;
                let mut ticks = tokio::time::interval(interval);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut views = 0;
                while started.elapsed() < minute {
                    ticks.tick().await;
                    let body = views::graphql(&app, &token, &query).await;
                    assert_eq!(views::resources(&body), RESOURCES);
                    views += 1;
                }
                views
            });
        }
        let mut views = 0;
        while let Some(n) = viewers.join_next().await {
            views += n.expect("viewer");
        }
        let took = started.elapsed();
        let verbs = by_verb(&b.api);
        let total: u64 = verbs.values().sum();
        println!("{name}: {views} views in {took:.1?}; {total} requests to the cluster: {verbs:?}");
    }
}

/// The JSON text of every object of `resources` in `namespace`, each as the server sends it
/// in a list (one item's bytes).
async fn items(b: &Bench, resources: &[ApiKind], namespace: &str) -> Vec<(usize, Box<str>)> {
    #[derive(serde::Deserialize)]
    struct List<'a> {
        #[serde(borrow)]
        items: Vec<&'a serde_json::value::RawValue>,
    }
    let mut out = Vec::new();
    for (i, kind) in resources.iter().enumerate() {
        let uri = format!(
            "{}/namespaces/{namespace}/{}",
            kind.group_version_path(),
            kind.plural
        );
        let request = Request::get(uri)
            .header(header::ACCEPT, "application/json")
            .body(kube::client::Body::empty())
            .expect("request");
        let response = b.client.send(request).await.expect("list");
        assert!(response.status().is_success());
        let body = response.into_body().collect_bytes().await.expect("body");
        let list: List = serde_json::from_slice(&body).expect("a list");
        out.extend(
            list.items
                .iter()
                .map(|item| (i, Box::<str>::from(item.get()))),
        );
    }
    out
}

/// The live bytes a fresh watch cache holds once it has synced `namespace`, the listing it
/// answered dropped; with the objects it holds.
async fn synced_cache_bytes(
    b: &Bench,
    namespace: &str,
    page_size: usize,
) -> (isize, isize, [isize; 40], usize, WatchCache) {
    let cache = WatchCache::new(
        b.client.clone(),
        b.streams.clone(),
        WatchSettings {
            idle: Duration::from_secs(600),
            max_objects: 1_000_000,
            access_ttl: Duration::from_secs(5),
        },
        Default::default(),
    );
    let before = live();
    let before_by_size = live_by_size();
    let listing = cache
        .list_resource_group(
            &b.discovery,
            &HeaderMap::new(),
            namespace,
            &b.selector,
            &FetchOptions {
                page_size,
                ..FetchOptions::default()
            },
        )
        .await
        .expect("cached listing");
    drop(listing);
    // The watch streams are open and idle; what a list page or a request left behind is freed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_sync = live() - before;
    // At rest: the texts packed a moment after the list (`PACK_AFTER`), the watches moved off
    // the lists' connections (`HANDOVER`).
    use envlens::k8s::watch::{HANDOVER, PACK_AFTER};
    tokio::time::sleep(PACK_AFTER.max(HANDOVER) + Duration::from_millis(500)).await;
    let held = cache.objects();
    let by_size = live_by_size();
    (
        at_sync,
        live() - before,
        std::array::from_fn(|i| by_size[i] - before_by_size[i]),
        held,
        cache,
    )
}

/// `--memory`: the bytes the synced cache holds per cached object, against the size of the
/// objects' JSON as the cluster sends them. Measured with the counting allocator ([`counting::live`]):
/// the cache of an empty namespace (41 open watches, no object) is subtracted from that of the
/// benchmark's namespace, so that what is left is the objects' own cost (their text, their tree,
/// the maps and counts that hold them). Then the same objects parsed alone ([`Object::parse`],
/// no cache) split that cost into the text kept and the tree.
async fn run_memory(b: &Bench, page_size: usize) {
    use envlens::resources::object::Object;
    let kinds = b.discovery.kinds().await.expect("discovery").kinds;
    let mut resources: Vec<ApiKind> = kinds.iter().filter(|k| k.watchable).cloned().collect();
    let events = ApiKind {
        group: String::new(),
        version: "v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
        namespaced: true,
        watchable: true,
    };
    if !resources.contains(&events) {
        resources.push(events);
    }
    let sent = items(b, &resources, NS).await;
    let json_bytes: usize = sent.iter().map(|(_, t)| t.len()).sum();
    let with_managed = sent
        .iter()
        .filter(|(_, t)| t.contains("\"managedFields\""))
        .count();

    // Rounds, alternating the empty namespace and the full one; the median of each.
    let (mut empty, mut full, mut freed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut empty_at_sync, mut full_at_sync) = (Vec::new(), Vec::new());
    let mut by_size = [0isize; 40];
    let mut held = 0;
    for _ in 0..5 {
        let (at_sync, bytes, empty_by_size, n, cache) =
            synced_cache_bytes(b, "nothing-here", page_size).await;
        assert_eq!(n, 0);
        drop(cache);
        tokio::time::sleep(Duration::from_millis(200)).await;
        empty.push(bytes);
        empty_at_sync.push(at_sync);
        let (at_sync, bytes, full_by_size, n, cache) = synced_cache_bytes(b, NS, page_size).await;
        full_at_sync.push(at_sync);
        // The last round's, by size of allocation.
        by_size = std::array::from_fn(|i| full_by_size[i] - empty_by_size[i]);
        held = n;
        let before_drop = live();
        drop(cache);
        tokio::time::sleep(Duration::from_millis(200)).await;
        freed.push(before_drop - live());
        full.push(bytes);
    }
    assert_eq!(
        held,
        sent.len(),
        "the cache holds every object of the namespace"
    );
    let median_of = |mut v: Vec<isize>| {
        v.sort();
        v[v.len() / 2]
    };
    let (empty, full, freed) = (median_of(empty), median_of(full), median_of(freed));
    let per_object = (full - empty) as f64 / held as f64;
    let per_object_at_sync =
        (median_of(full_at_sync) - median_of(empty_at_sync)) as f64 / held as f64;
    let json_per_object = json_bytes as f64 / held as f64;

    // The same objects parsed alone: their text and tree, without the cache's maps.
    let before = live();
    let parsed: Vec<Object> = sent
        .iter()
        .map(|(i, text)| {
            let kind = &resources[*i];
            let raw: &serde_json::value::RawValue = serde_json::from_str(text).expect("raw");
            Object::parse(raw, &kind.api_version(), &kind.kind).expect("object")
        })
        .collect();
    let objects_bytes =
        (live() - before) as f64 - (parsed.capacity() * std::mem::size_of::<Object>()) as f64;
    let text_bytes: usize = parsed.iter().map(|o| o.kept_text_bytes()).sum();
    let tree_bytes = objects_bytes - text_bytes as f64;
    // Packed as the cache packs them, each kind against its first object.
    let mut dictionaries = std::collections::HashMap::new();
    for ((i, _), object) in sent.iter().zip(&parsed) {
        let dictionary = dictionaries
            .entry(*i)
            .or_insert_with(|| object.dictionary());
        object.pack(dictionary);
    }
    let packed_bytes: usize = parsed.iter().map(|o| o.kept_text_bytes()).sum();
    let dictionary_bytes: usize = dictionaries.values().map(|d| d.len()).sum();
    let shape = Shape::of(parsed.iter().map(|o| &*o.view));

    // The same objects held as the cache holds them: an `Arc` each, in a set per kind ordered
    // by the name each object holds (`k8s::watch::kind::Named`).
    struct ByName(std::sync::Arc<Object>);
    impl ByName {
        fn name(&self) -> &str {
            self.0
                .view
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(|n| n.as_str())
                .unwrap_or_default()
        }
    }
    impl PartialEq for ByName {
        fn eq(&self, other: &Self) -> bool {
            self.name() == other.name()
        }
    }
    impl Eq for ByName {}
    impl PartialOrd for ByName {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for ByName {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.name().cmp(other.name())
        }
    }
    // The parsed objects move into their `Arc`s: their vector's buffer is freed on the way.
    let moved = (parsed.capacity() * std::mem::size_of::<Object>()) as f64;
    let before = live();
    let mut held_as_cache: Vec<std::collections::BTreeSet<ByName>> =
        (0..resources.len()).map(|_| Default::default()).collect();
    for ((i, _), object) in sent.iter().zip(parsed) {
        held_as_cache[*i].replace(ByName(std::sync::Arc::new(object)));
    }
    let index_bytes = (live() - before) as f64 + moved;
    drop(held_as_cache);
    // Allocations of 8 KiB and more: no object's; the open connections' buffers.
    let large: isize = by_size[14..].iter().sum();

    println!(
        "the namespace: {held} objects over {} kinds, {:.2} MiB of JSON as the test server sends them ({json_per_object:.0} B each; {with_managed} with managedFields)",
        resources.len(),
        json_bytes as f64 / 1048576.0
    );
    println!(
        "a fresh cache synced (lists of {page_size} a page): {:.2} MiB live, an empty namespace's {:.2} MiB subtracted (medians of 5 rounds)",
        full as f64 / 1048576.0,
        empty as f64 / 1048576.0
    );
    println!(
        "dropping the synced cache frees {:.2} MiB",
        freed as f64 / 1048576.0
    );
    println!(
        "per cached object at the list's end, before its texts are packed: {per_object_at_sync:.0} B = {:.2}x its JSON",
        per_object_at_sync / json_per_object
    );
    println!(
        "per cached object at rest: {per_object:.0} B = {:.2}x its JSON (goal <= 1x: {})",
        per_object / json_per_object,
        if per_object <= json_per_object {
            "met"
        } else {
            "NOT met"
        }
    );
    let n = held as f64;
    let arc = 2 * std::mem::size_of::<usize>() + std::mem::size_of::<Object>();
    // The objects as the cache holds them at rest: texts packed, one dictionary a kind.
    let packed_objects_bytes =
        objects_bytes - text_bytes as f64 + packed_bytes as f64 + dictionary_bytes as f64;
    println!(
        "of which, parsed alone: text kept {:.0} B ({:.0} B packed, and the {} kinds' dictionaries {:.0} B an object), compact tree {:.0} B; held as the cache holds them (an Arc<Object> each, {arc} B, in a set by name): {:.0} B more (the set's nodes {:.0} B); the rest, outside the objects and their index, {:.0} B, of which {:.0} B in allocations of 8 KiB and more (open connections' buffers)",
        text_bytes as f64 / n,
        packed_bytes as f64 / n,
        dictionaries.len(),
        dictionary_bytes as f64 / n,
        tree_bytes / n,
        index_bytes / n,
        index_bytes / n - arc as f64,
        per_object - packed_objects_bytes / n - index_bytes / n,
        large as f64 / n,
    );
    println!(
        "the objects and their index alone, texts packed: {:.0} B = {:.2}x their JSON",
        (packed_objects_bytes + index_bytes) / n,
        (packed_objects_bytes + index_bytes) / n / json_per_object
    );
    shape.print(n);
    let sizes: Vec<String> = by_size
        .iter()
        .enumerate()
        .filter(|(_, bytes)| bytes.abs() as f64 / n >= 1.0)
        .map(|(i, bytes)| {
            let low = if i == 0 { 0 } else { 1usize << (i - 1) };
            format!("{low}..{} B: {:.0}", (1usize << i) - 1, *bytes as f64 / n)
        })
        .collect();
    println!(
        "per object, by size of allocation (full minus empty, last round): {}",
        sizes.join(", ")
    );
    if std::env::var_os("MEMORY_KEYS").is_some() {
        // The keys of the whole texts, for the table of interned names.
        let mut keys = std::collections::HashMap::<String, usize>::new();
        fn walk(value: &Value, keys: &mut std::collections::HashMap<String, usize>) {
            match value {
                Value::Object(map) => {
                    for (k, v) in map {
                        *keys.entry(k.clone()).or_default() += k.len() + 3;
                        walk(v, keys);
                    }
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, keys)),
                _ => {}
            }
        }
        for (_, text) in &sent {
            walk(&serde_json::from_str(text).expect("JSON"), &mut keys);
        }
        let mut keys: Vec<_> = keys.into_iter().collect();
        keys.sort_by_key(|k| std::cmp::Reverse(k.1));
        for (key, bytes) in keys {
            println!("text key {bytes} {key:?}");
        }
    }
}

/// What the compact trees are made of, counted by walking them: their bytes, maps and their
/// entries, arrays and their items, strings, and which keys recur.
#[derive(Default)]
struct Shape {
    /// The trees' bytes (one allocation each).
    bytes: usize,
    maps: usize,
    entries: usize,
    arrays: usize,
    items: usize,
    /// Bytes of every string value.
    string_bytes: usize,
    strings: usize,
    keys: std::collections::HashMap<String, usize>,
}

impl Shape {
    fn of<'a>(trees: impl Iterator<Item = &'a envlens::resources::tree::Tree>) -> Shape {
        let mut shape = Shape::default();
        for tree in trees {
            shape.bytes += tree.bytes();
            shape.walk(tree);
        }
        shape
    }

    fn walk(&mut self, tree: &envlens::resources::tree::Tree) {
        if let Some(s) = tree.as_str() {
            self.strings += 1;
            self.string_bytes += s.len();
        } else if let Some(items) = tree.as_array() {
            self.arrays += 1;
            self.items += items.len();
            items.for_each(|item| self.walk(item));
        } else if let Some(map) = tree.as_object() {
            self.maps += 1;
            self.entries += map.len();
            for (key, value) in map {
                *self.keys.entry(key.to_owned()).or_default() += 1;
                self.walk(value);
            }
        }
    }

    fn print(&self, n: f64) {
        println!(
            "the trees, per object: {:.0} B in one allocation; {:.1} maps of {:.1} entries, {:.1} arrays of {:.1} items, {:.1} string values of {:.0} B in all",
            self.bytes as f64 / n,
            self.maps as f64 / n,
            self.entries as f64 / self.maps.max(1) as f64,
            self.arrays as f64 / n,
            self.items as f64 / self.arrays.max(1) as f64,
            self.strings as f64 / n,
            self.string_bytes as f64 / n,
        );
        let mut keys: Vec<(&String, &usize)> = self.keys.iter().collect();
        keys.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let top = |k: usize| keys.iter().take(k).map(|(_, c)| **c).sum::<usize>();
        println!(
            "keys: {} distinct over {} entries; the 64 most used are {:.1}% of entries, the 128 most used {:.1}%, the 255 most used {:.1}%",
            keys.len(),
            self.entries,
            100.0 * top(64) as f64 / self.entries as f64,
            100.0 * top(128) as f64 / self.entries as f64,
            100.0 * top(255) as f64 / self.entries as f64,
        );
        if std::env::var_os("MEMORY_KEYS").is_some() {
            for (key, count) in &keys {
                println!("key {count} {key:?}");
            }
        }
    }
}
