//! The dashboard in a real browser (headless Chromium over the DevTools protocol), over the
//! demo's sample GitLab and cluster: signing in with a one-time link, a group, an
//! environment, a Pod changing state without a reload, a Pod's logs followed, and not one
//! request to another host. A failing step leaves a screenshot under `target/browser/`.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use serde_json::json;

use crate::support::browser::{Browser, Page};
use crate::support::demo::Demo;

/// Where failing steps leave their screenshots, and the page screenshots go.
pub(crate) fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser")
}

/// `step`'s result, with a screenshot of the page when it failed.
pub(crate) async fn check(page: &Page<'_>, name: &str, result: Result<(), String>) {
    if let Err(e) = result {
        let path = shots().join(format!("failed-{name}.png"));
        page.screenshot(&path).await;
        panic!(
            "{name}: {e} (screenshot: {}); page text:\n{}",
            path.display(),
            page.text().await
        );
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

    // Signing in with the link (its page, then "Continue as alice") lands on the groups.
    demo.sign_in(&page).await;
    let r = page.wait_for("document.querySelector('h1') && document.querySelector('h1').innerText === 'Your groups'", Duration::from_secs(20)).await;
    check(&page, "groups", r).await;
    let text = page.text().await;
    assert!(text.contains("Signed in as alice"), "{text}");
    assert!(text.contains("acme/platform"), "{text}");

    // A group: its environments, production first.
    page.goto(&format!("{}/groups/acme/platform", demo.url))
        .await;
    let r = page
        .wait_for(
            "document.querySelectorAll('tbody tr').length >= 5",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "group", r).await;
    let first = page
        .eval("document.querySelector('tbody tr td').innerText")
        .await;
    assert!(first.as_str().unwrap().contains("production"), "{first}");

    // Filtered by tier, without script: a plain GET form.
    page.goto(&format!("{}/groups/acme/platform?tier=staging", demo.url))
        .await;
    let rows = page
        .eval("[...document.querySelectorAll('tbody tr')].map(r => r.innerText)")
        .await;
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");

    // An environment: its tree, with the worker's Pods under its ReplicaSet.
    let env_url = format!(
        "{}/environments?project=acme/platform/shop&name=production",
        demo.url
    );
    page.goto(&env_url).await;
    let r = page
        .wait_for(
            "document.querySelectorAll('ul.tree .node').length >= 10",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "environment", r).await;
    let text = page.text().await;
    for expected in [
        "Deployment",
        "ReplicaSet",
        "Pod",
        "Service",
        "Ingress",
        "Secret",
        "Deployments",
    ] {
        assert!(text.contains(expected), "{expected} missing:\n{text}");
    }

    // A Pod falls into a crash loop: the page shows it without a reload, through the
    // subscription: its message arrives over the WebSocket and is applied in place, with no
    // request to the server between the patch and the change on the screen.
    let r = page
        .wait_for(
            "document.getElementById('live').dataset.state === 'live' && document.body.dataset.applied",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "live-connected", r).await;
    page.eval("window.__notReloaded = true").await;
    let pod_name = demo
        .cluster
        .names("Pod", "shop-production")
        .into_iter()
        .find(|n| n.starts_with("worker-"))
        .unwrap();
    let mut pod = demo
        .cluster
        .get("Pod", "shop-production", &pod_name)
        .unwrap();
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    pod["status"]["containerStatuses"][0]["ready"] = json!(false);
    pod["status"]["containerStatuses"][0]["state"] = json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}});
    pod["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    let mark = page.mark();
    demo.cluster.put(pod);
    let r = page
        .wait_for(
            &format!("window.__notReloaded && [...document.querySelectorAll('#resources .node')].some(n => n.innerText.includes('{pod_name}') && n.innerText.includes('Degraded'))"),
            Duration::from_secs(30),
        )
        .await;
    check(&page, "live-change", r).await;
    page.screenshot_screen(&shots().join("environment-live-change-1440-light.png"))
        .await;
    let events = page.events_since(mark);
    let frame = events.iter().any(|e| {
        e["method"] == "Network.webSocketFrameReceived"
            && e["params"]["response"]["payloadData"]
                .as_str()
                .is_some_and(|p| p.contains(&pod_uid) && p.contains("DEGRADED"))
    });
    assert!(
        frame,
        "no WebSocket frame carried the Pod's health: {events:?}"
    );
    let fetched: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["method"] == "Network.requestWillBeSent")
        .map(|e| &e["params"]["request"]["url"])
        .collect();
    assert!(
        fetched.is_empty(),
        "the page asked the server between the patch and the change: {fetched:?}"
    );
    let live = page.eval("document.getElementById('live').innerText").await;
    assert_eq!(live, "Live");

    // The Pod's logs, followed: a new line appears without a reload.
    let web_pod = demo
        .cluster
        .names("Pod", "shop-production")
        .into_iter()
        .find(|n| n.starts_with("web-"))
        .unwrap();
    page.eval(&format!("location.href = [...document.querySelectorAll('a.name')].find(a => a.innerText === '{web_pod}').href")).await;
    let r = page
        .wait_for(
            "document.querySelector('ul.containers a')",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "pod", r).await;
    page.eval("location.href = document.querySelector('ul.containers a').href")
        .await;
    let r = page.wait_for("document.querySelector('pre.logs') && document.getElementById('follow-state').innerText === 'Following'", Duration::from_secs(20)).await;
    check(&page, "logs", r).await;
    demo.cluster.log(
        "shop-production",
        &web_pod,
        "app",
        "a line written after the page was opened".into(),
    );
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
        .filter(|u| {
            !u.starts_with(&demo.url)
                && !u.starts_with(&ws)
                && !u.starts_with("data:")
                && *u != "about:blank"
        })
        .collect();
    assert!(foreign.is_empty(), "requests to other hosts: {foreign:?}");
}

/// Every element with text of its own whose colour against its background is below WCAG 2.1
/// AA (4.5:1; 3:1 for large text), as "tag.class "text" ratio". The graph's SVG aside.
const LOW_CONTRAST: &str = r#"(() => {
  const parse = (c) => { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(",").map(Number); return { r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1 }; };
  const lum = ({ r, g, b }) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const background = (el) => { for (let e = el; e; e = e.parentElement) {
    const c = parse(getComputedStyle(e).backgroundColor); if (c && c.a > 0.5) return c; }
    return parse(getComputedStyle(document.documentElement).backgroundColor) || { r: 255, g: 255, b: 255 }; };
  const low = [];
  document.querySelectorAll("body *").forEach((el) => {
    if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) return;
    if (el.closest("svg, [hidden], .skip")) return;
    const s = getComputedStyle(el);
    if (s.display === "none" || s.visibility === "hidden") return;
    const a = lum(parse(s.color)), b = lum(background(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(s.fontSize), bold = parseInt(s.fontWeight, 10) >= 700;
    if (ratio < ((size >= 24 || (bold && size >= 18.66)) ? 3 : 4.5))
      low.push(el.tagName.toLowerCase() + "." + el.className + " \"" + el.textContent.trim().slice(0, 30) + "\" " + ratio.toFixed(2));
  });
  return low;
})()"#;

pub(crate) async fn check_contrast(page: &Page<'_>, name: &str) {
    let low = page.eval(LOW_CONTRAST).await;
    let r = match low.as_array().is_some_and(Vec::is_empty) {
        true => Ok(()),
        false => Err(format!("text below WCAG AA contrast: {low}")),
    };
    check(page, &format!("{name}-contrast"), r).await;
}

/// The pages at a phone's width and a desktop's, light and dark, for a person to look at
/// (`target/browser/`); each checked for content wider than the screen and for contrast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_fit_a_phone_and_a_desktop_in_light_and_dark() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::start().await;
    let page = browser.page().await;
    // The page of a sign-in link, before it is used.
    let link = demo.sign_in_link().await;
    for width in [390, 1440] {
        for dark in [false, true] {
            page.screen(width, dark).await;
            page.goto(&link).await;
            let scheme = if dark { "dark" } else { "light" };
            page.screenshot(&shots().join(format!("sign-in-link-{width}-{scheme}.png")))
                .await;
            check_contrast(&page, &format!("sign-in-link-{width}-{scheme}")).await;
            page.goto(&format!("{}/-/sign-in", demo.url)).await;
            page.screenshot(&shots().join(format!("sign-in-{width}-{scheme}.png")))
                .await;
            check_contrast(&page, &format!("sign-in-{width}-{scheme}")).await;
        }
    }
    demo.sign_in(&page).await;
    let pages = [
        ("groups", "/".to_owned()),
        ("group", "/groups/acme".to_owned()),
        (
            "environment",
            "/environments?project=acme/platform/shop&name=production".to_owned(),
        ),
        (
            "graph",
            "/environments?project=acme/platform/shop&name=production&view=graph".to_owned(),
        ),
    ];
    for (name, path) in &pages {
        for width in [390, 1440] {
            for dark in [false, true] {
                page.screen(width, dark).await;
                page.goto(&format!("{}{path}", demo.url)).await;
                let shot = shots().join(format!(
                    "{name}-{width}-{}.png",
                    if dark { "dark" } else { "light" }
                ));
                page.screenshot(&shot).await;
                page.screenshot_screen(&shot.with_extension("screen.png"))
                    .await;
                // Nothing but the scrollable graph and tables is wider than the screen.
                let r = page
                    .wait_for(
                        "document.documentElement.scrollWidth <= window.innerWidth + 1",
                        Duration::from_secs(2),
                    )
                    .await;
                check(&page, &format!("{name}-{width}-width"), r).await;
                check_contrast(&page, &format!("{name}-{width}-{dark}")).await;
            }
        }
    }
    // Without a session, a page leads to signing in.
    let res = demo
        .app
        .send(
            Request::get("/groups/acme")
                .header(header::ACCEPT, "text/html")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 303);
    assert!(res.headers[header::LOCATION]
        .to_str()
        .unwrap()
        .starts_with("/-/sign-in"));
}

/// A GET of `path` with `user_id`'s dashboard session.
async fn get_as(demo: &Demo, user_id: i64, path: &str) -> crate::support::TestResponse {
    let cookie = envlens::web::session::begin(&demo.state.db, &demo.state.site, user_id)
        .await
        .unwrap();
    let cookie = cookie
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    demo.app
        .send(
            Request::get(path)
                .header(header::COOKIE, cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await
}

/// The pages apply the API's rules: a reporter reads the environments but not the agent's
/// resources, a project one may not read does not exist, and bad input is a 400 page.
#[tokio::test]
async fn pages_show_what_the_api_would_answer_the_viewer() {
    let demo = Demo::start().await;
    const ALICE: i64 = 2;
    const BOB: i64 = 3;
    const CAROL: i64 = 4;
    let env = "/environments?project=acme/web/site&name=production";

    // alice (maintainer of acme): the resource group, every kind healthy or without a rule.
    let res = get_as(&demo, ALICE, env).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.headers[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    assert!(res.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    let html = res.text();
    assert!(
        html.contains("PersistentVolumeClaim") && html.contains("uploads"),
        "{html}"
    );

    // carol (reporter of acme/web): the environment and its deployments, but the agent's
    // user_access refuses her the resources, in GitLab's words.
    let res = get_as(&demo, CAROL, env).await;
    assert_eq!(res.status, 200);
    let html = res.text();
    assert!(
        html.contains("have access to an agent that deployed to this environment"),
        "{html}"
    );
    assert!(!html.contains("uploads"), "{html}");
    assert!(html.contains("Deployments"));

    // bob (developer of acme/platform/shop only): acme/web/site is private to him... it is
    // internal, so he reads it; payments is private and does not exist for him.
    let res = get_as(
        &demo,
        BOB,
        "/environments?project=acme/platform/payments&name=production",
    )
    .await;
    assert_eq!(res.status, 404, "{}", res.text());
    let res = get_as(&demo, BOB, "/groups/acme/platform").await;
    assert_eq!(res.status, 200);
    let html = res.text();
    assert!(
        html.contains("acme/platform/shop") && !html.contains("acme/platform/payments"),
        "{html}"
    );

    // A resource's manifest, Secrets masked.
    let res = get_as(
        &demo,
        ALICE,
        "/environments?project=acme/platform/shop&name=production",
    )
    .await;
    let html = res.text();
    let uid = "demo-secret-shop-production-database-credentials";
    assert!(html.contains(uid), "{html}");
    let res = get_as(
        &demo,
        ALICE,
        &format!("/resources?project=acme/platform/shop&environment=production&uid={uid}"),
    )
    .await;
    assert_eq!(res.status, 200);
    let html = res.text();
    assert!(
        html.contains("password: &quot;++++++++&quot;") || html.contains("password: ++++++++"),
        "{html}"
    );
    assert!(!html.contains("aHVudGVyMg=="), "a Secret's value leaked");

    // Bad input: a clear 400, never a 5xx.
    for path in [
        "/environments?project=acme/platform/shop",
        "/environments?project=acme/platform/shop&name=production&view=table",
        "/groups/acme?tier=moon",
        "/resources?project=acme/platform/shop&environment=production",
        "/logs?project=acme/platform/shop&environment=production&uid=demo-secret-shop-production-database-credentials",
    ] {
        let res = get_as(&demo, ALICE, path).await;
        assert_eq!(res.status, 400, "{path}: {}", res.text());
    }
    let res = get_as(&demo, ALICE, "/groups/nope").await;
    assert_eq!(res.status, 404);

    // Assets: hashed names, cached for a year, nothing else under the prefix.
    let css = envlens::web::assets::path("dashboard.css");
    let res = demo
        .app
        .send(Request::get(&css).body(Body::empty()).unwrap())
        .await;
    assert_eq!(res.status, 200);
    assert_eq!(
        res.headers[header::CACHE_CONTROL],
        "public, max-age=31536000, immutable"
    );
    let res = demo
        .app
        .send(
            Request::get("/-/assets/dashboard.css")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 404);
}

/// A lost connection shows as such, the page keeps refreshing meanwhile, and the subscription
/// comes back by itself: the relay between the browser and envlens cuts every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_live_connection_shows_and_comes_back_by_itself() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::behind_relay().await;
    let relay = demo.relay.as_ref().unwrap();
    let page = browser.page().await;
    page.screen(1440, false).await;
    demo.sign_in(&page).await;
    page.goto(&format!(
        "{}/environments?project=acme/platform/shop&name=production",
        demo.url
    ))
    .await;
    let live = "document.getElementById('live').dataset.state === 'live'";
    let r = page.wait_for(live, Duration::from_secs(20)).await;
    check(&page, "lost-connected", r).await;
    page.eval("window.__notReloaded = true").await;

    relay.cut();
    let r = page
        .wait_for(
            "document.getElementById('live').dataset.state === 'down' && document.getElementById('live').innerText.includes('Connection lost')",
            Duration::from_secs(10),
        )
        .await;
    check(&page, "lost-shown", r).await;
    page.screenshot(&shots().join("environment-connection-lost-1440-light.png"))
        .await;

    // Back within the first retry's second or so, without a reload.
    let r = page
        .wait_for(
            &format!("window.__notReloaded && {live} && document.getElementById('live').innerText === 'Live again'"),
            Duration::from_secs(15),
        )
        .await;
    check(&page, "lost-reconnected", r).await;
    let sockets = page
        .requests()
        .iter()
        .filter(|u| u.ends_with("/api/graphql") && u.starts_with("ws://"))
        .count();
    assert!(sockets >= 2, "{sockets} WebSockets opened");

    // The new subscription carries changes as the first did.
    let pod_name = demo
        .cluster
        .names("Pod", "shop-production")
        .into_iter()
        .find(|n| n.starts_with("worker-"))
        .unwrap();
    let mut pod = demo
        .cluster
        .get("Pod", "shop-production", &pod_name)
        .unwrap();
    pod["status"]["containerStatuses"][0]["ready"] = json!(false);
    pod["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    pod["status"]["containerStatuses"][0]["state"] =
        json!({"waiting": {"reason": "CrashLoopBackOff"}});
    demo.cluster.put(pod);
    let r = page
        .wait_for(
            &format!("window.__notReloaded && [...document.querySelectorAll('#resources .node')].some(n => n.innerText.includes('{pod_name}') && n.innerText.includes('Degraded'))"),
            Duration::from_secs(30),
        )
        .await;
    check(&page, "lost-then-live-change", r).await;
}

/// Without script the pages read the same (server-rendered); with the keyboard the first Tab
/// reaches "Skip to content", which leads to the page's content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_read_without_script_and_by_keyboard() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::start().await;
    let page = browser.page().await;
    page.screen(1440, false).await;
    demo.sign_in(&page).await;
    let env = format!(
        "{}/environments?project=acme/platform/shop&name=production",
        demo.url
    );

    // The keyboard: Tab, Enter on the skip link, and the focus is on the content.
    page.goto(&env).await;
    let key = |kind: &'static str, key: &'static str, code: u32| {
        let mut event =
            json!({"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": code});
        if kind == "keyDown" && key == "Enter" {
            event["text"] = json!("\r");
        }
        event
    };
    page.call("Input.dispatchKeyEvent", key("keyDown", "Tab", 9))
        .await;
    page.call("Input.dispatchKeyEvent", key("keyUp", "Tab", 9))
        .await;
    let focused = page.eval("document.activeElement.innerText").await;
    assert_eq!(focused, "Skip to content");
    page.call("Input.dispatchKeyEvent", key("keyDown", "Enter", 13))
        .await;
    page.call("Input.dispatchKeyEvent", key("keyUp", "Enter", 13))
        .await;
    let r = page
        .wait_for(
            "document.activeElement.id === 'main'",
            Duration::from_secs(5),
        )
        .await;
    check(&page, "keyboard-skip", r).await;
    // Every link, button and form field has a name a screen reader can say.
    let unnamed = page
        .eval("[...document.querySelectorAll('a, button, input:not([type=hidden]), select, summary')].filter(e => !(e.innerText || '').trim() && !e.getAttribute('aria-label') && !(e.labels && e.labels.length) && !e.querySelector('title')).map(e => e.outerHTML.slice(0, 80))")
        .await;
    assert_eq!(unnamed, json!([]), "controls without a name");

    // Without script: the tree, its health and the tier filter (a plain GET form) all work.
    page.call(
        "Emulation.setScriptExecutionDisabled",
        json!({"value": true}),
    )
    .await;
    page.goto(&env).await;
    let nodes = page
        .eval("document.querySelectorAll('ul.tree .node .badge').length")
        .await;
    assert!(nodes.as_u64().unwrap() >= 10, "{nodes}");
    let live = page.eval("document.getElementById('live').innerText").await;
    assert_eq!(live, "", "the live status is the script's to fill");
    page.goto(&format!("{}/groups/acme/platform", demo.url))
        .await;
    page.eval("document.querySelector('select[name=tier]').value = 'staging'; document.querySelector('form[method=get] button, form:not([method]) button').click()")
        .await;
    let r = page
        .wait_for(
            "location.search.includes('tier=staging') && document.readyState === 'complete' && document.querySelectorAll('tbody tr').length === 2",
            Duration::from_secs(10),
        )
        .await;
    check(&page, "no-script-filter", r).await;
    page.screenshot_screen(&shots().join("group-filtered-no-script-1440-light.png"))
        .await;
}
