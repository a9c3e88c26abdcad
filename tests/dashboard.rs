//! The dashboard in a real browser (headless Chromium over the DevTools protocol), over the
//! demo's sample GitLab and cluster: signing in with a one-time link, a group, an
//! environment, a Pod changing state without a reload, a Pod's logs followed, and not one
//! request to another host. A failing step leaves a screenshot under `target/browser/`.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use envlens::config::Limits;
use envlens::demo::cluster::DemoCluster;
use envlens::demo::world::{self, World};
use envlens::state::AppState;
use serde_json::json;

use crate::support::browser::{Browser, Page};
use crate::support::*;

/// envlens over the demo's sample, served on a socket.
pub struct Demo {
    pub url: String,
    pub cluster: DemoCluster,
    pub state: AppState,
    pub app: TestApp,
    _dir: tempfile::TempDir,
}

impl Demo {
    pub async fn start() -> Demo {
        let cluster = DemoCluster::default();
        World::new(cluster.clone()).start();
        let addr = cluster.serve().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, DemoCluster::kubeconfig(addr)).unwrap();
        let settings = envlens::config::file::Settings::parse(&format!(
            "kubernetes:\n  kubeconfig: {}\n",
            kubeconfig.display()
        ))
        .unwrap();
        let clusters =
            envlens::k8s::clusters::Clusters::load(&settings.kubernetes, Default::default())
                .await
                .unwrap();
        let database = postgres::fresh_database().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let site = envlens::web::Site::new(&url, envlens::web::DEFAULT_SESSION_LIFETIME).unwrap();
        let state = AppState::new((*database).clone(), keys(), Limits::default())
            .with_clusters(clusters, Default::default())
            .with_site(site);
        let app = TestApp::owning(state.clone(), database);
        world::seed(&app.router, internal_token, WEBHOOK_TOKEN)
            .await
            .unwrap();
        let served = state.clone();
        tokio::spawn(async move {
            envlens::run(served, listener, std::future::pending(), Duration::from_secs(1)).await
        });
        Demo {
            url,
            cluster,
            state,
            app,
            _dir: dir,
        }
    }

    /// A one-time sign-in link for alice (maintainer of `acme`).
    pub async fn sign_in_link(&self) -> String {
        envlens::web::sign_in::create_link(&self.state.db, &self.url, 2)
            .await
            .unwrap()
    }
}

/// Where failing steps leave their screenshots, and the page screenshots go.
fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser")
}

/// `step`'s result, with a screenshot of the page when it failed.
async fn check(page: &Page<'_>, name: &str, result: Result<(), String>) {
    if let Err(e) = result {
        let path = shots().join(format!("failed-{name}.png"));
        page.screenshot(&path).await;
        panic!("{name}: {e} (screenshot: {}); page text:\n{}", path.display(), page.text().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_a_group_an_environment_a_live_change_and_logs_in_chromium() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::start().await;
    let page = browser.page().await;
    page.screen(1440, false).await;

    // Signing in with the link lands on the groups.
    page.goto(&demo.sign_in_link().await).await;
    let r = page.wait_for("document.querySelector('h1') && document.querySelector('h1').innerText === 'Your groups'", Duration::from_secs(20)).await;
    check(&page, "groups", r).await;
    let text = page.text().await;
    assert!(text.contains("Signed in as alice"), "{text}");
    assert!(text.contains("acme/platform"), "{text}");

    // A group: its environments, production first.
    page.goto(&format!("{}/groups/acme/platform", demo.url)).await;
    let r = page.wait_for("document.querySelectorAll('tbody tr').length >= 5", Duration::from_secs(20)).await;
    check(&page, "group", r).await;
    let first = page.eval("document.querySelector('tbody tr td').innerText").await;
    assert!(first.as_str().unwrap().contains("production"), "{first}");

    // Filtered by tier, without script: a plain GET form.
    page.goto(&format!("{}/groups/acme/platform?tier=staging", demo.url)).await;
    let rows = page.eval("[...document.querySelectorAll('tbody tr')].map(r => r.innerText)").await;
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");

    // An environment: its tree, with the worker's Pods under its ReplicaSet.
    let env_url = format!("{}/environments?project=acme/platform/shop&name=production", demo.url);
    page.goto(&env_url).await;
    let r = page.wait_for("document.querySelectorAll('ul.tree .node').length >= 10", Duration::from_secs(20)).await;
    check(&page, "environment", r).await;
    let text = page.text().await;
    for expected in ["Deployment", "ReplicaSet", "Pod", "Service", "Ingress", "Secret", "Deployments"] {
        assert!(text.contains(expected), "{expected} missing:\n{text}");
    }

    // A Pod falls into a crash loop: the page shows it without a reload, through the
    // subscription or, while that is unavailable, the script's refresh.
    page.eval("window.__notReloaded = true").await;
    let pod_name = demo
        .cluster
        .names("Pod", "shop-production")
        .into_iter()
        .find(|n| n.starts_with("worker-"))
        .unwrap();
    let mut pod = demo.cluster.get("Pod", "shop-production", &pod_name).unwrap();
    pod["status"]["containerStatuses"][0]["ready"] = json!(false);
    pod["status"]["containerStatuses"][0]["state"] = json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}});
    pod["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    demo.cluster.put(pod);
    let r = page
        .wait_for(
            &format!("window.__notReloaded && [...document.querySelectorAll('#resources .node')].some(n => n.innerText.includes('{pod_name}') && n.innerText.includes('Degraded'))"),
            Duration::from_secs(30),
        )
        .await;
    check(&page, "live-change", r).await;
    let live = page.eval("document.getElementById('live').innerText").await;
    assert!(!live.as_str().unwrap().is_empty(), "the live status says nothing");

    // The Pod's logs, followed: a new line appears without a reload.
    let web_pod = demo
        .cluster
        .names("Pod", "shop-production")
        .into_iter()
        .find(|n| n.starts_with("web-"))
        .unwrap();
    page.eval(&format!("location.href = [...document.querySelectorAll('a.name')].find(a => a.innerText === '{web_pod}').href")).await;
    let r = page.wait_for("document.querySelector('ul.containers a')", Duration::from_secs(20)).await;
    check(&page, "pod", r).await;
    page.eval("location.href = document.querySelector('ul.containers a').href").await;
    let r = page.wait_for("document.querySelector('pre.logs') && document.getElementById('follow-state').innerText === 'Following'", Duration::from_secs(20)).await;
    check(&page, "logs", r).await;
    demo.cluster.log("shop-production", &web_pod, "app", "a line written after the page was opened".into());
    let r = page
        .wait_for("document.querySelector('pre.logs').innerText.includes('a line written after the page was opened')", Duration::from_secs(20))
        .await;
    check(&page, "logs-follow", r).await;

    // Not one request left the page's origin.
    let requests = page.requests();
    assert!(!requests.is_empty());
    let ws = demo.url.replacen("http://", "ws://", 1);
    let foreign: Vec<&String> = requests
        .iter()
        .filter(|u| !u.starts_with(&demo.url) && !u.starts_with(&ws) && !u.starts_with("data:") && *u != "about:blank")
        .collect();
    assert!(foreign.is_empty(), "requests to other hosts: {foreign:?}");
}

/// The pages at a phone's width and a desktop's, light and dark, for a person to look at
/// (`target/browser/`); each checked for content wider than the screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_fit_a_phone_and_a_desktop_in_light_and_dark() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::start().await;
    let page = browser.page().await;
    page.goto(&demo.sign_in_link().await).await;
    let pages = [
        ("groups", "/".to_owned()),
        ("group", "/groups/acme".to_owned()),
        ("environment", "/environments?project=acme/platform/shop&name=production".to_owned()),
        ("graph", "/environments?project=acme/platform/shop&name=production&view=graph".to_owned()),
    ];
    for (name, path) in &pages {
        for width in [390, 1440] {
            for dark in [false, true] {
                page.screen(width, dark).await;
                page.goto(&format!("{}{path}", demo.url)).await;
                let shot = shots().join(format!("{name}-{width}-{}.png", if dark { "dark" } else { "light" }));
                page.screenshot(&shot).await;
                // Nothing but the scrollable graph and tables is wider than the screen.
                let r = page.wait_for("document.documentElement.scrollWidth <= window.innerWidth + 1", Duration::from_secs(2)).await;
                check(&page, &format!("{name}-{width}-width"), r).await;
            }
        }
    }
    // Without a session, a page leads to signing in.
    let res = demo
        .app
        .send(Request::get("/groups/acme").header(header::ACCEPT, "text/html").body(Body::empty()).unwrap())
        .await;
    assert_eq!(res.status, 303);
    assert!(res.headers[header::LOCATION].to_str().unwrap().starts_with("/-/sign-in"));
}
