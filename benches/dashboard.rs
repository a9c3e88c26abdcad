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

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "fixtures/stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;
use stats::median;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request};
use envlens::auth::mint_session;
use http_body_util::BodyExt;
use serde_json::{json, Value};
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
