//! The dashboard's environment page against the GraphQL query of the same data, for an
//! environment of 1,000 resources, in the same run.
//!
//! `cargo bench --bench dashboard [-- --iterations 40]`
//!
//! The fixture is the demo's (`envlens::demo`, on its in-process Kubernetes API server): the
//! environment `acme/platform/shop:production` grows 100 Deployments, each with a ReplicaSet
//! and 8 Pods, beside its own workloads (1,000 and some resources, with events). Measured
//! alternately, medians over the iterations, both through the service's router in process
//! (no socket), both answered from the warm watch cache:
//!
//! - (a) `POST /api/graphql` with the page's own document (`web::data::ENVIRONMENT`: the
//!   environment, its last 20 deployments and the resource group with every field the page
//!   shows), as the same user with a bearer token; body read whole;
//! - (b) `GET /environments?project=...&name=production` with the dashboard's session cookie
//!   and `Accept-Encoding: gzip`: the same reads, then the HTML, gzipped; body read whole.
//!
//! And the bytes over the wire for a first view: the page and its three assets, gzipped.
//!
//! `cargo bench --bench dashboard -- --screen [--iterations 40] [--large]`: change to screen.
//! headless Chromium (the browser tests' DevTools client, `tests/support/browser.rs`) shows the
//! environment page (the demo's 15 resources, or 1,000 and some with `--large`); each
//! iteration patches one Pod at the in-process Kubernetes API server, Degraded and Healthy in
//! turn, and measures on one clock (the page's `performance.timeOrigin + performance.now()`,
//! against the bench's `SystemTime` at the patch; their offset is measured and printed):
//!
//! - the message's arrival: a wrapper of `WebSocket` (installed before the page's script with
//!   `Page.addScriptToEvaluateOnNewDocument`) timestamps every frame; the first after the
//!   patch that carries the Pod's uid and new health;
//! - the DOM update: a `MutationObserver` on the Pod's line in the tree, when its badge reads
//!   the new health; and the next animation frame after it (the screen).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "fixtures/stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;
use stats::{median, quantile};

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request};
use envlens::auth::mint_session;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::browser::Browser;
use support::demo::Demo;
use tower::ServiceExt;

const PAGE: &str = "/environments?project=acme/platform/shop&name=production";
const NS: &str = "shop-production";

async fn send(demo: &Demo, req: Request<Body>) -> (u16, axum::http::HeaderMap, Vec<u8>) {
    let res = demo.app.router.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    (status, headers, body)
}

fn grow(demo: &Demo) {
    for d in 0..100 {
        let name = format!("svc-{d:03}");
        let deploy_uid = format!("bench-deploy-{d}");
        demo.cluster.put(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "uid": deploy_uid, "generation": 1,
                "labels": {"app.gitlab.com/project_id": "201", "app.gitlab.com/environment_slug": "production", "app": name}},
            "spec": {"replicas": 8, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "app", "image": "registry.acme.test/bench:1"}]}}},
            "status": {"observedGeneration": 1, "replicas": 8, "updatedReplicas": 8, "readyReplicas": 8, "availableReplicas": 8}}));
        let rs = format!("{name}-5d8f7c9b4");
        let rs_uid = format!("bench-rs-{d}");
        demo.cluster.put(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": rs, "namespace": NS, "uid": rs_uid, "generation": 1, "labels": {"app": name},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": deploy_uid, "controller": true}]},
            "spec": {"replicas": 8}, "status": {"observedGeneration": 1, "replicas": 8, "readyReplicas": 8, "availableReplicas": 8}}));
        for p in 0..8 {
            let pod = format!("{rs}-p{p:02}");
            demo.cluster.put(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": NS, "labels": {"app": name},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": rs_uid, "controller": true}]},
                "spec": {"containers": [{"name": "app", "image": "registry.acme.test/bench:1"}], "restartPolicy": "Always"},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                           "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}}]}}));
        }
    }
}

fn main() {
    let iterations = std::env::args()
        .skip_while(|a| a != "--iterations")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(40usize);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if std::env::args().any(|a| a == "--screen") {
        let large = std::env::args().any(|a| a == "--large");
        runtime.block_on(screen(iterations, large));
        return;
    }
    runtime.block_on(async move {
        let demo = Demo::start().await;
        grow(&demo);
        let cookie = envlens::web::session::begin(&demo.state.db, &demo.state.site, 2)
            .await
            .unwrap();
        let cookie = cookie
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let (token, _) =
            mint_session(support::SESSION_KEY, 2, "alice", Duration::from_secs(3600)).unwrap();
        let query = json!({"query": envlens::web::ENVIRONMENT_DOCUMENT,
                           "variables": {"project": "acme/platform/shop", "name": "production"}})
        .to_string();
        let graphql = || {
            Request::post("/api/graphql")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(query.clone()))
                .unwrap()
        };
        let page = || {
            Request::get(PAGE)
                .header(header::COOKIE, &cookie)
                .header(header::ACCEPT_ENCODING, "gzip")
                .body(Body::empty())
                .unwrap()
        };
        // Warm: the watches start, and the group is whole.
        let mut resources = 0;
        for _ in 0..100 {
            let (_, _, body) = send(&demo, graphql()).await;
            let v: Value = serde_json::from_slice(&body).unwrap();
            resources = v["data"]["project"]["environment"]["resourceGroup"]["resources"]
                .as_array()
                .map_or(0, Vec::len);
            if resources >= 1000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(resources >= 1000, "only {resources} resources");
        let (status, headers, body) = send(&demo, page()).await;
        assert_eq!(status, 200);
        assert_eq!(headers[header::CONTENT_ENCODING], "gzip");
        let html = {
            use std::io::Read;
            let mut s = String::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut s)
                .unwrap();
            s
        };
        assert!(html.matches("class=\"node\"").count() >= 1000);

        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (mut graphql_bytes, mut page_bytes) = (0, 0);
        for _ in 0..iterations {
            let start = Instant::now();
            let (status, _, body) = send(&demo, graphql()).await;
            a.push(start.elapsed());
            assert_eq!(status, 200);
            graphql_bytes = body.len();
            let start = Instant::now();
            let (status, _, body) = send(&demo, page()).await;
            b.push(start.elapsed());
            assert_eq!(status, 200);
            page_bytes = body.len();
        }
        let mut wire = page_bytes;
        for asset in ["dashboard.css", "dashboard.js", "favicon.svg"] {
            let req = Request::get(envlens::web::assets::path(asset))
                .header(header::ACCEPT_ENCODING, "gzip")
                .body(Body::empty())
                .unwrap();
            let (_, _, body) = send(&demo, req).await;
            wire += body.len();
        }
        let (a, b) = (median(a), median(b));
        println!("environment of {resources} resources, {iterations} iterations each, alternating");
        println!(
            "(a) GraphQL, the page's document: median {:.2} ms, {} bytes of JSON",
            a.as_secs_f64() * 1e3,
            graphql_bytes
        );
        println!(
            "(b) the environment page:          median {:.2} ms, {} bytes gzipped ({} of HTML)",
            b.as_secs_f64() * 1e3,
            page_bytes,
            html.len()
        );
        println!(
            "(b)/(a) = {:.2} (goal at most 1.5)",
            b.as_secs_f64() / a.as_secs_f64()
        );
        println!(
            "first view over the wire, page and assets gzipped: {wire} bytes (goal at most 300 KB)"
        );
    });
}

/// Timestamps every WebSocket message the page receives, before the page's own handler.
const FRAME_CLOCK: &str = r#"(() => {
  const Native = window.WebSocket;
  window.__frames = [];
  function Clocked(url, protocols) {
    const ws = new Native(url, protocols);
    ws.addEventListener("message", (e) => {
      window.__frames.push({ t: performance.timeOrigin + performance.now(), data: String(e.data) });
    });
    return ws;
  }
  Clocked.prototype = Native.prototype;
  Object.assign(Clocked, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
  window.WebSocket = Clocked;
})();"#;

/// Milliseconds since the Unix epoch.
fn epoch_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1e3
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1e3)
}

/// Change to screen (the module's doc).
async fn screen(iterations: usize, large: bool) {
    let Some(browser) = Browser::launch().await else {
        eprintln!("--screen needs chromium");
        return;
    };
    let demo = Demo::start().await;
    if large {
        grow(&demo);
    }
    let page = browser.page().await;
    page.screen(1440, false).await;
    page.on_new_document(FRAME_CLOCK).await;
    demo.sign_in(&page).await;
    page.goto(&format!("{}{PAGE}", demo.url)).await;
    let want = if large { 1000 } else { 10 };
    page.wait_for(
        &format!("document.querySelectorAll('#resources [data-uid]').length >= {want} && document.getElementById('live').dataset.state === 'live' && document.body.dataset.applied"),
        Duration::from_secs(120),
    )
    .await
    .unwrap();
    let resources = page
        .eval("document.querySelectorAll('#resources [data-uid]').length")
        .await;

    // The two clocks: the page's against the bench's, around one DevTools round trip.
    let mut offsets = Vec::new();
    for _ in 0..5 {
        let before = epoch_ms();
        let there = page
            .eval("performance.timeOrigin + performance.now()")
            .await
            .as_f64()
            .unwrap();
        let after = epoch_ms();
        offsets.push((there - (before + after) / 2.0, after - before));
    }
    offsets.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (offset, round_trip) = offsets[0];

    let pod_name = demo
        .cluster
        .names("Pod", NS)
        .into_iter()
        .find(|n| n.starts_with("worker-"))
        .unwrap();
    let base = demo.cluster.get("Pod", NS, &pod_name).unwrap();
    let uid = base["metadata"]["uid"].as_str().unwrap().to_owned();
    page.eval(&format!(
        r#"(() => {{
  window.__dom = []; window.__paint = [];
  const line = document.querySelector('#resources [data-uid="{uid}"]');
  const badge = () => line.querySelector('.badge').textContent;
  new MutationObserver(() => {{
    const t = performance.timeOrigin + performance.now(), text = badge();
    window.__dom.push({{ t, text }});
    requestAnimationFrame(() => window.__paint.push({{ t: performance.timeOrigin + performance.now(), text }}));
  }}).observe(line, {{ subtree: true, childList: true, characterData: true, attributes: true }});
  return true;
}})()"#
    ))
    .await;

    let (mut arrival, mut dom, mut paint, mut work) = (vec![], vec![], vec![], vec![]);
    for i in 0..iterations {
        let degraded = i % 2 == 0;
        let (word, status) = match degraded {
            true => ("Degraded", "DEGRADED"),
            false => ("Healthy", "HEALTHY"),
        };
        let mut pod = base.clone();
        if degraded {
            pod["status"]["containerStatuses"][0]["ready"] = json!(false);
            pod["status"]["containerStatuses"][0]["state"] =
                json!({"waiting": {"reason": "CrashLoopBackOff"}});
            pod["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
        }
        let patched = epoch_ms() + offset;
        demo.cluster.put(pod);
        let seen = format!("window.__paint.some(p => p.t >= {patched} && p.text === '{word}')");
        page.wait_for(&seen, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("iteration {i}: {e}"));
        let v = page
            .eval(&format!(
                r#"({{
  frame: (window.__frames.find(f => f.t >= {patched} && f.data.includes('{uid}') && f.data.includes('{status}')) || {{}}).t,
  dom: window.__dom.find(d => d.t >= {patched} && d.text === '{word}').t,
  paint: window.__paint.find(p => p.t >= {patched} && p.text === '{word}').t,
}})"#
            ))
            .await;
        let frame = v["frame"].as_f64().expect("the message's frame");
        let (d, p) = (v["dom"].as_f64().unwrap(), v["paint"].as_f64().unwrap());
        arrival.push(ms(frame - patched));
        dom.push(ms(d - patched));
        paint.push(ms(p - patched));
        work.push(ms(d - frame));
        // Past the feed's 100 ms coalescing window, so that each patch is its own message.
        tokio::time::sleep(Duration::from_millis(250)).await;
        page.eval("window.__frames.length = 0").await;
    }
    let f = |v: &[Duration]| {
        format!(
            "p50 {:>7.1} ms  p90 {:>7.1} ms",
            quantile(v, 0.5).as_secs_f64() * 1e3,
            quantile(v, 0.9).as_secs_f64() * 1e3
        )
    };
    println!(
        "change to screen: environment page of {resources} resources, {iterations} patches (Degraded and Healthy in turn)"
    );
    println!(
        "clocks: page - bench = {offset:.2} ms (corrected), measured within a {round_trip:.2} ms round trip"
    );
    println!("patch -> message arrives in the page:   {}", f(&arrival));
    println!("patch -> DOM updated (MutationObserver): {}", f(&dom));
    println!("patch -> next animation frame:          {}", f(&paint));
    println!("message -> DOM (the page's own work):   {}", f(&work));
    println!("goal: patch -> DOM p50 under 200 ms");
}
